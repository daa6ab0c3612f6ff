//! Standalone etcd on loopback.
