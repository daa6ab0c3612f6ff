//! The data handler: keeps the Multigres topology in etcd in line with the cluster's resources.

pub mod topo;
