//! The data handler: keeps the Multigres topology in etcd in line with the cluster's resources.

pub mod conditions;
pub mod deletion;
pub mod desired;
pub mod finalizer;
pub mod roles;
pub mod sync;
pub mod target;
pub mod topo;
pub mod watch;
pub mod writes;
