//! Admission webhooks for the multigres.com kinds, with their own TLS.
//!
//! * [`admission`]: the HTTPS endpoints (AdmissionReview in, AdmissionReview out);
//! * [`rules`]: the validation rules, pure functions of the request's objects;
//! * [`defaults`]: the defaulting of MultigresCluster;
//! * [`lookup`]: reads of templates and clusters the rules need;
//! * [`placement`]: the warning that no Node matches a cell's zone, zone ID or region;
//! * [`tls`]: the swappable serving certificate and its lifecycle (self-managed in a Secret, or
//!   files mounted by cert-manager);
//! * [`server`]: all of it started together, as the binary and the tests run it.

pub mod admission;
pub mod defaults;
pub mod lookup;
pub mod placement;
pub mod rules;
pub mod server;
pub mod tls;
pub mod violation;
