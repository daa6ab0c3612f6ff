//! [`HandlerRuntime`]: everything a handler binary does besides its controllers, so `main.rs`
//! stays a few lines.
//!
//! Order at start: logging, trace export (when configured) and crypto provider, signal
//! handlers, metrics recorder, gRPC and metrics listeners (health answers NOT_SERVING from here
//! on), Kubernetes client (checked against the API server). [`HandlerRuntime::run`] then
//! campaigns for the Lease when asked, runs the binary's work while acting, and on
//! SIGTERM/SIGINT stops the work, releases the Lease, stops the servers and sends the buffered
//! spans, in that order.

use std::convert::Infallible;
use std::error::Error as StdError;
use std::time::Duration;

use kube::Client;
use tokio::sync::watch;

use crate::apply::FIELD_MANAGER_PREFIX;
use crate::cli::{CommonArgs, ControllerArgs, HandlerSpec, LeaderElectionArgs};
use crate::client::ClientError;
use crate::leader::{LeaderElector, LeaderError, LeaseConfig};
use crate::servers::{ServerError, Servers};
use crate::shutdown::Shutdown;
use crate::state::{HandlerState, LeaderState};
use crate::telemetry::{ErrorChain, ServiceInfo, Telemetry, TelemetryError};
use crate::watch::Scope;

/// How long `work` may take to stop once shutdown begins before it is dropped. kube's
/// controllers never finish a graceful shutdown that starts before their caches are filled
/// (the runner waits for a store that can no longer fill), and every reconcile is idempotent,
/// so abandoning in-flight ones is safe; a handler must exit on SIGTERM either way.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// Runs `work` to completion, or until [`STOP_GRACE`] after `shutdown` fires.
async fn until_stopped<E>(
    shutdown: Shutdown,
    work: impl Future<Output = Result<(), E>>,
) -> Result<(), E> {
    until_stopped_within(STOP_GRACE, shutdown, work).await
}

/// Runs `work` to completion, or until `grace` after `shutdown` fires.
async fn until_stopped_within<E>(
    grace: Duration,
    shutdown: Shutdown,
    work: impl Future<Output = Result<(), E>>,
) -> Result<(), E> {
    tokio::pin!(work);
    tokio::select! {
        result = &mut work => result,
        () = async {
            shutdown.wait().await;
            tokio::time::sleep(grace).await;
        } => {
            tracing::warn!(?grace, "controllers did not stop in time; abandoning them");
            Ok(())
        }
    }
}

/// The whole `main` of a controller binary, so the three read alike: one thread
/// ([`Threads::One`](crate::process::Threads)), the flags [`ControllerArgs`] with `spec`'s
/// defaults and the binary's own (`Own`), the [`HandlerRuntime`] started, then `controllers`
/// run under leader election, given the namespaces to serve and the binary's own flags.
pub fn controller_main<Own, F, Fut>(spec: HandlerSpec, controllers: F) -> Result<(), RuntimeError>
where
    Own: clap::Args,
    F: FnOnce(HandlerContext, Scope, Own) -> Fut,
    Fut: Future<Output = ()>,
{
    crate::process::run(crate::process::Threads::One, async move {
        let cli: ControllerArgs<Own> = crate::cli::parse(&spec);
        let scope = cli.scope.scope();
        let runtime = HandlerRuntime::start(spec, &cli.common).await?;
        let own = cli.own;
        runtime
            .run_controllers(&cli.leader, |ctx| controllers(ctx, scope, own))
            .await
    })
}

/// Why a handler could not start or did not end cleanly.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// Logging could not be set up.
    #[error(transparent)]
    Telemetry(#[from] TelemetryError),
    /// The metrics recorder could not be installed.
    #[error("cannot install the metrics recorder")]
    Metrics(#[from] metrics_exporter_prometheus::BuildError),
    /// Signal handlers could not be installed.
    #[error("cannot install signal handlers")]
    Signals(#[source] std::io::Error),
    /// A server could not start or failed.
    #[error(transparent)]
    Server(#[from] ServerError),
    /// No usable Kubernetes client.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The leader-election flags are inconsistent.
    #[error("invalid leader election flags: {0}")]
    LeaderElectionFlags(String),
    /// Leadership was lost while acting; the process must restart as a standby.
    #[error(transparent)]
    Leadership(#[from] LeaderError),
    /// The leader-election task panicked.
    #[error("leader election task failed")]
    LeaderTask(#[source] tokio::task::JoinError),
    /// The binary's own work failed.
    #[error(transparent)]
    Work(Box<dyn StdError + Send + Sync>),
}

/// What the binary's work gets: the client, the shared state to report progress in, and the
/// shutdown latch to stop on (SIGTERM, SIGINT, or lost leadership).
#[derive(Clone)]
pub struct HandlerContext {
    /// Client checked against the API server.
    pub client: Client,
    /// Readiness, synced kinds, reconcile counts.
    pub state: HandlerState,
    /// Fires when the work must stop.
    pub shutdown: Shutdown,
}

/// A started handler: servers listening, client connected.
pub struct HandlerRuntime {
    spec: HandlerSpec,
    client: Client,
    state: HandlerState,
    servers: Servers,
    shutdown: Shutdown,
    telemetry: Telemetry,
}

impl HandlerRuntime {
    /// Sets up logging, signals, metrics and gRPC servers, and the client.
    pub async fn start(spec: HandlerSpec, args: &CommonArgs) -> Result<Self, RuntimeError> {
        let service = ServiceInfo {
            name: spec.name,
            version: spec.version,
        };
        let telemetry =
            crate::telemetry::init(service, args.log_format, args.log_level.as_deref())?;
        tracing::info!(handler = spec.name, version = spec.version, "starting");
        let shutdown = Shutdown::new();
        crate::shutdown::trigger_on_signal(shutdown.clone()).map_err(RuntimeError::Signals)?;
        let metrics = match args.metrics_bind_address.addr() {
            Some(addr) => Some((addr, crate::metrics::install()?)),
            None => None,
        };
        let state = HandlerState::new(spec.name, spec.version).await;
        let servers = Servers::start(args.grpc_bind_address, metrics, state.clone()).await?;
        let client = match crate::client::connect(args.kubeconfig.as_deref()).await {
            Ok(client) => client,
            Err(error) => {
                tracing::error!(error = %ErrorChain(&error), "cannot connect to Kubernetes");
                if let Err(stop_error) = servers.stop().await {
                    tracing::warn!(error = %ErrorChain(&stop_error), "servers did not stop cleanly");
                }
                telemetry.shutdown().await;
                return Err(error.into());
            }
        };
        Ok(Self {
            spec,
            client,
            state,
            servers,
            shutdown,
            telemetry,
        })
    }

    /// The connected client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Runs `work` until it returns, then stops the servers.
    ///
    /// With `leader` given and `--leader-elect` on, the replica first campaigns for the Lease
    /// (SERVING while it stands by and can reach the Lease: ready to take over), runs `work`
    /// only once it leads (NOT_SERVING until `work` reports ready), and returns
    /// [`RuntimeError::Leadership`] if it loses the Lease, after `work` has stopped. Otherwise
    /// `work` starts at once (`LEADER_STATE_NOT_ELECTED`). See `HandlerState::is_serving`.
    ///
    /// `work` must return soon after `HandlerContext::shutdown` fires, and report readiness
    /// itself with `state.set_ready(true)` once its caches are synced.
    pub async fn run<F, Fut, E>(
        self,
        leader: Option<&LeaderElectionArgs>,
        work: F,
    ) -> Result<(), RuntimeError>
    where
        F: FnOnce(HandlerContext) -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: Into<Box<dyn StdError + Send + Sync>>,
    {
        let context = HandlerContext {
            client: self.client.clone(),
            state: self.state.clone(),
            shutdown: self.shutdown.clone(),
        };
        let result = match leader.filter(|args| args.leader_elect) {
            Some(args) => self.run_elected(args, context, work).await,
            None => {
                self.state.set_leader_state(LeaderState::NotElected).await;
                until_stopped(self.shutdown.clone(), work(context))
                    .await
                    .map_err(|e| RuntimeError::Work(e.into()))
            }
        };
        self.state.stop().await;
        let stopped = self.servers.stop().await;
        match &result {
            Ok(()) => tracing::info!(handler = self.spec.name, "stopped"),
            Err(error) => {
                tracing::error!(handler = self.spec.name, error = %ErrorChain(error), "stopped with an error");
            }
        }
        self.telemetry.shutdown().await;
        result.and(stopped.map_err(RuntimeError::from))
    }

    /// Runs a controller binary's `controllers` (see [`HandlerRuntime::run`]) under leader
    /// election by `leader`: they report no error of their own, each reconcile's is handled
    /// inside, so they return only once `HandlerContext::shutdown` fires.
    pub async fn run_controllers<F, Fut>(
        self,
        leader: &LeaderElectionArgs,
        controllers: F,
    ) -> Result<(), RuntimeError>
    where
        F: FnOnce(HandlerContext) -> Fut,
        Fut: Future<Output = ()>,
    {
        self.run(Some(leader), |ctx| async move {
            controllers(ctx).await;
            Ok::<(), Infallible>(())
        })
        .await
    }

    async fn run_elected<F, Fut, E>(
        &self,
        args: &LeaderElectionArgs,
        context: HandlerContext,
        work: F,
    ) -> Result<(), RuntimeError>
    where
        F: FnOnce(HandlerContext) -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: Into<Box<dyn StdError + Send + Sync>>,
    {
        args.validate().map_err(RuntimeError::LeaderElectionFlags)?;
        let config = LeaseConfig {
            namespace: args
                .leader_election_namespace
                .clone()
                .filter(|ns| !ns.is_empty())
                .unwrap_or_else(|| self.client.default_namespace().to_owned()),
            name: args.leader_election_id.clone(),
            identity: crate::leader::default_identity(),
            lease_duration: args.leader_election_lease_duration,
            renew_deadline: args.leader_election_renew_deadline,
            retry_period: args.leader_election_retry_period,
            field_manager: format!("{FIELD_MANAGER_PREFIX}{}", self.spec.name),
        };
        let (leading_tx, mut leading) = watch::channel(false);
        let elector_stop = Shutdown::new();
        let mut elector = tokio::spawn(LeaderElector::new(self.client.clone(), config).run(
            self.state.clone(),
            leading_tx,
            elector_stop.clone(),
        ));

        let join = |joined: Result<Result<(), LeaderError>, tokio::task::JoinError>| {
            joined
                .map_err(RuntimeError::LeaderTask)?
                .map_err(RuntimeError::from)
        };

        tokio::select! {
            () = self.shutdown.wait() => {
                elector_stop.trigger();
                return join(elector.await);
            }
            joined = &mut elector => return join(joined),
            Ok(_) = leading.wait_for(|leads| *leads) => {}
        }

        let work = until_stopped(self.shutdown.clone(), work(context));
        tokio::pin!(work);
        let (work_result, lost) = tokio::select! {
            result = &mut work => (result, None),
            joined = &mut elector => {
                // Leadership ended while acting: make the work stop before anything else.
                self.shutdown.trigger();
                (work.await, Some(joined))
            }
        };
        let elector_result = match lost {
            Some(joined) => join(joined),
            None => {
                elector_stop.trigger();
                join(elector.await)
            }
        };
        elector_result?;
        work_result.map_err(|e| RuntimeError::Work(e.into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A grace short enough for a test, long enough to tell from no wait at all.
    const GRACE: Duration = Duration::from_millis(200);

    #[tokio::test]
    async fn work_that_ignores_shutdown_is_abandoned_after_the_grace_period() {
        let shutdown = Shutdown::new();
        let stuck = until_stopped_within(
            GRACE,
            shutdown.clone(),
            std::future::pending::<Result<(), ()>>(),
        );
        tokio::pin!(stuck);
        assert!(
            tokio::time::timeout(GRACE * 2, &mut stuck).await.is_err(),
            "no shutdown yet: work keeps running"
        );
        shutdown.trigger();
        let started = tokio::time::Instant::now();
        assert_eq!(stuck.await, Ok(()));
        let waited = started.elapsed();
        assert!(
            waited >= GRACE && waited < STOP_GRACE / 2,
            "abandoned after {waited:?}, the grace being {GRACE:?}"
        );
    }

    #[tokio::test]
    async fn work_that_stops_returns_its_own_result() {
        let shutdown = Shutdown::new();
        let waiting = shutdown.wait();
        let work = until_stopped_within(GRACE, shutdown.clone(), async move {
            waiting.await;
            Err::<(), _>("stopped with an error")
        });
        shutdown.trigger();
        assert_eq!(work.await, Err("stopped with an error"));
    }
}
