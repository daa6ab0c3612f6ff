//! The `multigres.com/v1alpha1` API.
