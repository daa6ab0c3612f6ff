//! Starts and stops a handler's two listeners: gRPC (health + HandlerInfo) and `/metrics`.

use std::net::SocketAddr;

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::shutdown::Shutdown;
use crate::state::HandlerState;

/// Why a server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The listen address could not be bound (in use, not local, no permission).
    #[error("cannot listen for {server} on {addr}")]
    Bind {
        /// Which server.
        server: &'static str,
        /// The address asked for.
        addr: SocketAddr,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// The gRPC server failed while serving.
    #[error("gRPC server failed")]
    Grpc(#[from] tonic::transport::Error),
    /// The metrics server failed while serving.
    #[error("metrics server failed")]
    Metrics(#[source] std::io::Error),
    /// A server task panicked.
    #[error("{server} server task failed")]
    Task {
        /// Which server.
        server: &'static str,
        /// The join error.
        #[source]
        source: tokio::task::JoinError,
    },
}

/// The running servers. Stop them with [`Servers::stop`].
#[derive(Debug)]
pub struct Servers {
    grpc_addr: SocketAddr,
    metrics_addr: Option<SocketAddr>,
    stop: Shutdown,
    grpc: JoinHandle<Result<(), tonic::transport::Error>>,
    metrics: Option<JoinHandle<std::io::Result<()>>>,
}

/// Binds `addr` and returns the listener with the address it actually got (port 0 resolved).
async fn bind(
    server: &'static str,
    addr: SocketAddr,
) -> Result<(TcpListener, SocketAddr), ServerError> {
    let error = |source| ServerError::Bind {
        server,
        addr,
        source,
    };
    let listener = TcpListener::bind(addr).await.map_err(error)?;
    let local = listener.local_addr().map_err(error)?;
    Ok((listener, local))
}

impl Servers {
    /// Binds and starts the gRPC server on `grpc_addr` and, when given, the metrics server.
    /// Port 0 picks a free port; the bound addresses are available afterwards.
    pub async fn start(
        grpc_addr: SocketAddr,
        metrics: Option<(SocketAddr, PrometheusHandle)>,
        state: HandlerState,
    ) -> Result<Self, ServerError> {
        let stop = Shutdown::new();
        let (grpc_listener, grpc_addr) = bind("gRPC", grpc_addr).await?;
        let (metrics_addr, metrics) = match metrics {
            Some((addr, handle)) => {
                let (listener, local) = bind("metrics", addr).await?;
                let task = tokio::spawn(crate::metrics::serve(listener, handle, stop.wait()));
                (Some(local), Some(task))
            }
            None => (None, None),
        };
        let grpc = tokio::spawn(crate::grpc::serve(grpc_listener, state, stop.wait()));
        tracing::info!(
            %grpc_addr,
            metrics_addr = %metrics_addr.map_or_else(|| "disabled".to_owned(), |a| a.to_string()),
            "servers listening"
        );
        Ok(Self {
            grpc_addr,
            metrics_addr,
            stop,
            grpc,
            metrics,
        })
    }

    /// Where the gRPC server listens.
    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc_addr
    }

    /// Where the metrics server listens, if enabled.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// Stops accepting, lets in-flight requests finish, and waits for both servers to end.
    pub async fn stop(self) -> Result<(), ServerError> {
        self.stop.trigger();
        let grpc = self.grpc.await.map_err(|source| ServerError::Task {
            server: "gRPC",
            source,
        })?;
        let metrics = match self.metrics {
            Some(task) => task.await.map_err(|source| ServerError::Task {
                server: "metrics",
                source,
            })?,
            None => Ok(()),
        };
        grpc?;
        metrics.map_err(ServerError::Metrics)
    }
}
