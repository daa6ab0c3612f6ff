//! Runtime plumbing shared by the four handler binaries: flags, logging, metrics, the gRPC
//! health and HandlerInfo server, the Kubernetes client, leader election, graceful shutdown,
//! and the small helpers every controller needs (server-side apply, conditions, backoff).
//!
//! A controller binary's `main` is one call of [`controller_main`]: the allocator's settings
//! and the async runtime ([`process::run`]), its flags ([`cli::ControllerArgs`]), a started
//! [`HandlerRuntime`], then its controllers. The webhook-server does the same steps itself, as
//! its replicas are all active. What the handlers do to stay small is listed, with a figure for each piece, in
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

pub use runtime::{HandlerContext, HandlerRuntime, RuntimeError, controller_main};
