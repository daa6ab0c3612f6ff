//! A real local Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager,
//! kube-scheduler, kwok) on loopback, for end-to-end tests and `just demo`; plus a standalone etcd
//! launcher used as the Multigres topology server in component tests.

pub mod browser;
pub mod cert_manager;
pub mod cluster;
pub mod etcd;
pub mod harness;
pub mod http;
pub mod labels;
pub mod load;
pub mod manifest;
pub mod node_images;
pub mod nodes;
pub mod pki;
pub mod poolers;
pub mod ports;
pub mod process;
pub mod prometheus;
pub mod reach;
pub mod real;
pub mod s3;
pub mod sample;
pub mod toolchain;
