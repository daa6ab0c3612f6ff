//! Shared by the webhook's integration tests and its benchmark: the local control plane, the
//! AdmissionReview fixtures, and a small HTTPS client that trusts only the webhook's CA.

#![allow(dead_code)] // Each test binary uses a different part.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::body::Body;
use http::Request;
use kube::Client;
use multigres_e2e::cluster::LocalCluster;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tower::ServiceExt;
use webhook_server::admission::{self, AdmissionState};
use webhook_server::lookup::Lookups;
use webhook_server::rules::children::{Operators, ServiceAccount};

/// The operator identity the tests configure.
pub const OPERATOR: &str = "multigres-system:multigres-operator-cluster-handler";

/// The local control plane shared by the tests of one binary.
pub async fn control_plane() -> &'static LocalCluster {
    LocalCluster::shared()
        .await
        .unwrap_or_else(|e| panic!("starting the local control plane: {e}"))
}

/// A namespace no other test uses.
pub async fn namespace(cluster: &LocalCluster, prefix: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let name = format!(
        "{prefix}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    cluster
        .create_namespace(&name)
        .await
        .unwrap_or_else(|e| panic!("creating namespace {name}: {e}"));
    name
}

/// A client for rules that read nothing: it points at a loopback port nobody listens on, so a
/// rule that unexpectedly reads another object fails the test instead of passing unnoticed.
pub fn unused_client() -> Client {
    multigres_common::telemetry::install_crypto_provider();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = kube::Config::new(format!("http://127.0.0.1:{port}").parse().unwrap());
    Client::try_from(config).unwrap()
}

/// The operator identities used by the tests.
pub fn operators() -> Operators {
    Operators::new(&[ServiceAccount::parse(OPERATOR, "unused").unwrap()])
}

/// The admission router reading through `client`.
pub fn router(client: Client) -> Router {
    admission::router(AdmissionState::new(Lookups::new(client), operators()))
}

/// Path of a fixture file.
pub fn fixture_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(format!("{name}.json"))
}

/// A fixture AdmissionReview, moved into `namespace`.
pub fn fixture(name: &str, namespace: &str) -> String {
    std::fs::read_to_string(fixture_path(name))
        .unwrap_or_else(|e| panic!("reading fixture {name}: {e}"))
        .replace("NAMESPACE", namespace)
}

/// Posts `body` to `path` of the router; returns the `response` of the AdmissionReview, after
/// checking the envelope.
pub async fn post(router: &Router, path: &str, body: String) -> Value {
    let request = Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body))
        .unwrap();
    let response = router.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), 200, "admission answers are always 200");
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    let review: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(review["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(review["kind"], "AdmissionReview");
    review["response"].clone()
}

/// The JSON patch of an admission response, decoded. kube serializes the bytes as a JSON array
/// (which the API server's decoder accepts as well as base64).
pub fn patch_of(response: &Value) -> Option<Value> {
    let bytes: Vec<u8> = serde_json::from_value(response.get("patch")?.clone()).unwrap();
    Some(serde_json::from_slice(&bytes).unwrap())
}

/// An HTTP/1.1 keep-alive connection over TLS, verifying the server against `ca_pem` only.
pub struct HttpsConnection {
    stream: TlsStream<TcpStream>,
    host: String,
}

impl HttpsConnection {
    /// Connects to `addr`, expecting a certificate for `server_name` signed by a CA of `ca_pem`.
    pub async fn connect(
        addr: SocketAddr,
        ca_pem: &str,
        server_name: &str,
    ) -> std::io::Result<Self> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
            roots.add(cert.unwrap()).unwrap();
        }
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let name = ServerName::try_from(server_name.to_owned()).unwrap();
        let stream = TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await?;
        Ok(Self {
            stream,
            host: server_name.to_owned(),
        })
    }

    /// The DER certificate the server presented on this connection.
    pub fn peer_certificate(&self) -> Vec<u8> {
        self.stream.get_ref().1.peer_certificates().unwrap()[0].to_vec()
    }

    /// Sends a POST on this connection and reads the answer: status and body.
    pub async fn post(&mut self, path: &str, body: &[u8]) -> std::io::Result<(u16, Vec<u8>)> {
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            self.host,
            body.len()
        );
        self.stream.write_all(head.as_bytes()).await?;
        self.stream.write_all(body).await?;
        self.stream.flush().await?;
        let mut buffer = Vec::new();
        let header_end = loop {
            if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                break end + 4;
            }
            let mut chunk = [0u8; 8192];
            let read = self.stream.read(&mut chunk).await?;
            if read == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            buffer.extend_from_slice(&chunk[..read]);
        };
        let head = String::from_utf8_lossy(&buffer[..header_end]).to_string();
        let status: u16 = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("bad status line in {head:?}")))?;
        let length: usize = head
            .lines()
            .find_map(|l| {
                let (name, value) = l.split_once(':')?;
                name.eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse().ok())
                    .flatten()
            })
            .ok_or_else(|| std::io::Error::other(format!("no content-length in {head:?}")))?;
        let mut body = buffer[header_end..].to_vec();
        while body.len() < length {
            let mut chunk = vec![0u8; length - body.len()];
            let read = self.stream.read(&mut chunk).await?;
            if read == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            body.extend_from_slice(&chunk[..read]);
        }
        Ok((status, body))
    }
}
