//! The running webhook: the HTTPS admission server and the certificate lifecycle behind it.

use std::net::SocketAddr;
use std::sync::Arc;

use kube::Client;
use multigres_common::shutdown::Shutdown;
use multigres_common::state::HandlerState;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::admission::{self, AdmissionState};
use crate::lookup::{CacheWatches, Lookups};
use crate::rules::children::Operators;
use crate::tls::manager::{self, CertificateSource};
use crate::tls::{self, CertStore, TlsListener};

/// How to run the webhook.
#[derive(Debug, Clone)]
pub struct WebhookOptions {
    /// Address of the HTTPS server (port 0 picks a free one).
    pub bind_address: SocketAddr,
    /// Where the serving certificate comes from.
    pub certificates: CertificateSource,
    /// Identities allowed to write operator-managed children.
    pub operators: Operators,
}

/// Why the webhook could not start or stopped badly.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    /// The listen address could not be bound.
    #[error("cannot listen on {address}: {source}")]
    Bind {
        /// The address.
        address: SocketAddr,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The TLS configuration could not be built.
    #[error("cannot configure TLS: {0}")]
    Tls(#[from] rustls::Error),
    /// The HTTPS server failed.
    #[error("the admission server failed: {0}")]
    Serve(#[source] std::io::Error),
    /// A task panicked.
    #[error("a webhook task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// A started webhook: listening, with its certificate lifecycle running.
pub struct RunningWebhook {
    local_addr: SocketAddr,
    store: Arc<CertStore>,
    shutdown: Shutdown,
    server: JoinHandle<std::io::Result<()>>,
    certificates: JoinHandle<()>,
    cache_watches: CacheWatches,
}

impl RunningWebhook {
    /// Binds the HTTPS listener and starts serving. Handshakes fail, and `state` reports
    /// NOT_SERVING, until the first certificate is loaded.
    pub async fn start(
        options: WebhookOptions,
        client: Client,
        state: HandlerState,
    ) -> Result<Self, WebhookError> {
        admission::describe_metrics();
        let store = Arc::new(CertStore::new());
        let tcp = TcpListener::bind(options.bind_address)
            .await
            .map_err(|source| WebhookError::Bind {
                address: options.bind_address,
                source,
            })?;
        let listener =
            TlsListener::new(tcp, tls::server_config(store.clone())?).map_err(|source| {
                WebhookError::Bind {
                    address: options.bind_address,
                    source,
                }
            })?;
        let local_addr =
            axum::serve::Listener::local_addr(&listener).map_err(|source| WebhookError::Bind {
                address: options.bind_address,
                source,
            })?;
        let shutdown = Shutdown::new();
        let certificates = tokio::spawn(manager::run(
            options.certificates,
            client.clone(),
            store.clone(),
            state,
            shutdown.clone(),
        ));
        let (lookups, cache_watches) = Lookups::cached(client);
        let router = admission::router(AdmissionState::new(lookups, options.operators));
        let server = tokio::spawn(
            axum::serve(listener, router)
                .with_graceful_shutdown(shutdown.wait())
                .into_future(),
        );
        tracing::info!(address = %local_addr, "admission server listening");
        Ok(Self {
            local_addr,
            store,
            shutdown,
            server,
            certificates,
            cache_watches,
        })
    }

    /// The address the HTTPS server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The certificate being served.
    pub fn certificates(&self) -> &Arc<CertStore> {
        &self.store
    }

    /// Stops accepting, lets requests in flight finish, and stops the certificate lifecycle and
    /// the template watches.
    pub async fn stop(self) -> Result<(), WebhookError> {
        self.shutdown.trigger();
        self.certificates.await?;
        let served = self.server.await?.map_err(WebhookError::Serve);
        drop(self.cache_watches);
        served
    }
}
