//! `multigres.com/v1alpha1`: every kind of the API, with the same JSON field names and shapes as
//! the upstream Go operator so manifests move between the two unchanged.

pub mod cell;
pub mod cluster;
pub mod common;
pub mod roles;
mod rules;
pub mod shard;
pub mod tablegroup;
pub mod templates;
pub mod toposerver;

pub use cell::*;
pub use cluster::*;
pub use common::*;
pub use roles::*;
pub use shard::*;
pub use tablegroup::*;
pub use templates::*;
pub use toposerver::*;
