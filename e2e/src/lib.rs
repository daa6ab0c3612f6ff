//! Local control plane harness.
