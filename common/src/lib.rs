//! Runtime plumbing shared by the four handler binaries: flags, logging, metrics, the gRPC
//! health and HandlerInfo server, the Kubernetes client, leader election, graceful shutdown,
//! and the small helpers every controller needs (server-side apply, conditions, backoff).
//!
//! A binary's `main` runs on [`process::run`] (the allocator's settings, then the runtime),
//! parses its flags with [`cli::parse`], starts a [`HandlerRuntime`] and hands it the work to
//! run. What the handlers do to stay small is listed, with a figure for each piece, in
//! [`memory`].

pub mod apply;
pub mod backoff;
pub mod cli;
pub mod client;
pub mod conditions;
pub mod controller;
pub mod events;
pub mod grpc;
pub mod guard;
pub mod leader;
pub mod memory;
pub mod metrics;
pub mod pki;
pub mod process;
pub mod runtime;
pub mod servers;
pub mod shared_watch;
pub mod shutdown;
pub mod state;
pub mod status_metrics;
pub mod status_pacer;
pub mod telemetry;
pub mod templates;
pub mod watch;

pub use runtime::{HandlerContext, HandlerRuntime, RuntimeError};
