//! TLS for the admission server: a certificate store that can be swapped at any time (new
//! connections get the new certificate, established ones keep theirs), the rustls server
//! configuration around it, and a listener that completes handshakes off the accept loop.

pub mod manager;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use multigres_common::pki::{self, PkiError};
use rustls::ServerConfig;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// Expiry of the certificate being served, as a Unix timestamp.
pub const CERTIFICATE_EXPIRY: &str =
    "multigres_operator_webhook_certificate_expiry_timestamp_seconds";

/// Longest a client may take to complete the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshaken connections waiting for the HTTP server.
const ACCEPT_QUEUE: usize = 64;

#[derive(Debug)]
struct Loaded {
    key: Arc<CertifiedKey>,
    cert_pem: String,
}

/// The certificate being served, replaceable without a restart.
#[derive(Debug, Default)]
pub struct CertStore {
    current: ArcSwapOption<Loaded>,
}

impl CertStore {
    /// An empty store: handshakes fail until a certificate is installed.
    pub fn new() -> Self {
        Self::default()
    }

    /// Serves `cert_pem` (with `key_pem`) from now on. Returns whether it differs from the one
    /// served before; a pair that does not parse or match leaves the current one in place.
    pub fn install(&self, cert_pem: &str, key_pem: &str) -> Result<bool, PkiError> {
        if self
            .current
            .load()
            .as_ref()
            .is_some_and(|l| l.cert_pem == cert_pem)
        {
            return Ok(false);
        }
        let key = pki::certified_key(cert_pem, key_pem)?;
        let expiry = pki::inspect(cert_pem)?.not_after;
        self.current.store(Some(Arc::new(Loaded {
            key: Arc::new(key),
            cert_pem: cert_pem.to_owned(),
        })));
        metrics::gauge!(CERTIFICATE_EXPIRY).set(expiry as f64);
        Ok(true)
    }

    /// Whether a certificate is being served.
    pub fn is_loaded(&self) -> bool {
        self.current.load().is_some()
    }

    /// The PEM of the certificate being served.
    pub fn cert_pem(&self) -> Option<String> {
        self.current.load().as_ref().map(|l| l.cert_pem.clone())
    }
}

impl ResolvesServerCert for CertStore {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current.load().as_ref().map(|l| l.key.clone())
    }
}

/// The server configuration: TLS 1.2 and 1.3 with ring, certificates from `store`, HTTP/2 and
/// HTTP/1.1 offered through ALPN.
pub fn server_config(store: Arc<CertStore>) -> Result<Arc<ServerConfig>, rustls::Error> {
    let mut config =
        ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_cert_resolver(store);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A listener yielding connections whose TLS handshake is done. Handshakes run in their own
/// tasks, so a slow or silent client never holds up the others.
pub struct TlsListener {
    incoming: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local_addr: SocketAddr,
    accept_loop: JoinHandle<()>,
}

impl TlsListener {
    /// Accepts on `tcp`, handshaking with `config`.
    pub fn new(tcp: TcpListener, config: Arc<ServerConfig>) -> std::io::Result<Self> {
        let local_addr = tcp.local_addr()?;
        let (tx, incoming) = mpsc::channel(ACCEPT_QUEUE);
        let acceptor = TlsAcceptor::from(config);
        let accept_loop = tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    accepted = tcp.accept() => accepted,
                    () = tx.closed() => return,
                };
                let (stream, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        // Usually out of file descriptors: back off instead of spinning.
                        tracing::warn!(%error, "accepting a connection failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let acceptor = acceptor.clone();
                let tx = tx.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, peer)).await;
                        }
                        Ok(Err(error)) => tracing::debug!(%peer, %error, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(Self {
            incoming,
            local_addr,
            accept_loop,
        })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.accept_loop.abort();
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.incoming.recv().await {
            Some(connection) => connection,
            // The accept loop only ends when this listener is dropped.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local_addr)
    }
}
