//! Admission webhooks for the multigres.com kinds.

pub mod duration;
pub mod quantity;
pub mod violation;
