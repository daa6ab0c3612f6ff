//! The Kubernetes client: from `--kubeconfig`, KUBECONFIG, ~/.kube/config or the in-cluster
//! service account, checked against the API server before the handler reports anything.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::retry::RetryPolicy;
use kube::client::{Body, ClientBuilder, ConfigExt};
use kube::config::{InferConfigError, KubeConfigOptions, Kubeconfig, KubeconfigError};
use kube::{Client, Config};
use tower::ServiceBuilder;
use tower::retry::RetryLayer;
use tower::util::MapRequestLayer;

use crate::metrics::KUBE_WRITE_REQUESTS_TOTAL;

/// Why no working client could be made.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// `--kubeconfig` names a file that cannot be read or used.
    #[error("kubeconfig {path} is not usable")]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        #[source]
        source: KubeconfigError,
    },
    /// Neither a kubeconfig nor an in-cluster service account was found.
    #[error(
        "no Kubernetes configuration found: set KUBECONFIG, pass --kubeconfig, or run in a pod with a service account"
    )]
    NoConfig(#[source] InferConfigError),
    /// The configuration could not be turned into a client (bad TLS material, bad proxy).
    #[error("cannot build a Kubernetes client")]
    Build(#[source] kube::Error),
    /// The API server did not answer `/version`.
    #[error("cannot reach the Kubernetes API server at {url}")]
    Unreachable {
        /// The server URL from the configuration.
        url: String,
        /// What went wrong.
        #[source]
        source: kube::Error,
    },
}

/// Loads the configuration: the explicit file when given, otherwise kube's usual inference.
pub async fn load_config(kubeconfig: Option<&Path>) -> Result<Config, ClientError> {
    match kubeconfig {
        Some(path) => {
            let error = |source| ClientError::Kubeconfig {
                path: path.to_owned(),
                source,
            };
            let kubeconfig = Kubeconfig::read_from(path).map_err(error)?;
            Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(error)
        }
        None => Config::infer().await.map_err(ClientError::NoConfig),
    }
}

/// Builds a client and checks that the API server answers.
pub async fn connect(kubeconfig: Option<&Path>) -> Result<Client, ClientError> {
    let config = load_config(kubeconfig).await?;
    let url = config.cluster_url.to_string();
    let client = counting_client(config)?;
    let version = client
        .apiserver_version()
        .await
        .map_err(|source| ClientError::Unreachable {
            url: url.clone(),
            source,
        })?;
    tracing::info!(%url, version = %version.git_version, "connected to the Kubernetes API server");
    Ok(client)
}

/// How often an idle HTTP/2 connection is pinged, and how long an answer may take before the
/// connection counts as dead (client-go's `ReadIdleTimeout` and `PingTimeout`): with every
/// watch on one connection, a silently dropped one must be noticed.
const PING_INTERVAL: Duration = Duration::from_secs(30);
const PING_TIMEOUT: Duration = Duration::from_secs(15);

/// The error every layer of kube's client stack passes on.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A client that counts every mutating request it sends in
/// [`KUBE_WRITE_REQUESTS_TOTAL`], whichever code path sent it.
///
/// It speaks HTTP/2 to the API server when the server offers it, as client-go does: every
/// watch and request shares one connection. kube's own stack speaks HTTP/1.1 only, which costs
/// a TLS connection, with its buffers, per watch and per request in flight (70 sockets in the
/// resource-handler while 10 clusters converge; most of its memory above start). kube's stack
/// is kept where ours would not reproduce it: a proxy, or credentials from an exec plugin
/// (whose certificates expire). This stack can go once kube speaks HTTP/2 (kube-rs pull
/// request 1823); [`crate::memory`] lists it with the other memory work.
pub fn counting_client(config: Config) -> Result<Client, ClientError> {
    let count = MapRequestLayer::new(count_write);
    if config.proxy_url.is_some() || config.auth_info.exec.is_some() {
        let builder = ClientBuilder::try_from(config).map_err(ClientError::Build)?;
        return Ok(builder.with_layer(&count).build());
    }
    let tls = config.rustls_client_config().map_err(ClientError::Build)?;
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    let https = match &config.tls_server_name {
        Some(name) => {
            let name = name.clone().try_into().map_err(|_| {
                ClientError::Build(kube::Error::Service(
                    format!("tls-server-name {name:?} is not a valid server name").into(),
                ))
            })?;
            https.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name))
        }
        None => https,
    };
    let mut connector =
        hyper_timeout::TimeoutConnector::new(https.enable_all_versions().wrap_connector(http));
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    let http = HttpClient::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .http2_keep_alive_interval(PING_INTERVAL)
        .http2_keep_alive_timeout(PING_TIMEOUT)
        .build(connector);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(
            config
                .default_retry
                .then(|| RetryLayer::new(RetryPolicy::server_retry())),
        )
        .option_layer(config.auth_layer().map_err(ClientError::Build)?)
        .layer(config.extra_headers_layer().map_err(ClientError::Build)?)
        .layer(count)
        .map_err(BoxError::from)
        .service(http);
    Ok(ClientBuilder::new(service, config.default_namespace).build())
}

fn count_write(request: http::Request<Body>) -> http::Request<Body> {
    if let Some(verb) = write_verb(request.method()) {
        let (resource, subresource) = resource_of(request.uri().path());
        metrics::counter!(
            KUBE_WRITE_REQUESTS_TOTAL,
            "verb" => verb,
            "resource" => resource.to_owned(),
            "subresource" => subresource.to_owned()
        )
        .increment(1);
    }
    request
}

/// The Kubernetes verb of a mutating HTTP method; `None` for reads (and watches).
fn write_verb(method: &http::Method) -> Option<&'static str> {
    match *method {
        http::Method::POST => Some("create"),
        http::Method::PUT => Some("update"),
        http::Method::PATCH => Some("patch"),
        http::Method::DELETE => Some("delete"),
        _ => None,
    }
}

/// The resource (plural) and subresource (empty for none) an API path addresses:
/// `/api/v1/namespaces/ns/pods/p/status` → (`pods`, `status`).
fn resource_of(path: &str) -> (&str, &str) {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let rest = match segments.as_slice() {
        ["api", _, rest @ ..] | ["apis", _, _, rest @ ..] => rest,
        _ => return ("", ""),
    };
    let rest = match rest {
        ["namespaces", _namespace, inside @ ..] if !inside.is_empty() => inside,
        rest => rest,
    };
    match rest {
        [resource, more @ ..] => (resource, more.get(1).copied().unwrap_or_default()),
        [] => ("", ""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_is_labelled_with_its_resource_and_subresource() {
        let cases = [
            ("/api/v1/namespaces/ns/pods/p-0", ("pods", "")),
            (
                "/api/v1/namespaces/ns/pods/p-0/eviction",
                ("pods", "eviction"),
            ),
            ("/api/v1/namespaces/ns/events", ("events", "")),
            (
                "/apis/multigres.com/v1alpha1/namespaces/ns/shards/s/status",
                ("shards", "status"),
            ),
            (
                "/apis/apps/v1/namespaces/ns/statefulsets",
                ("statefulsets", ""),
            ),
            ("/api/v1/namespaces/ns", ("namespaces", "")),
            (
                "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/v",
                ("validatingwebhookconfigurations", ""),
            ),
            ("/version", ("", "")),
        ];
        for (path, expected) in cases {
            assert_eq!(resource_of(path), expected, "{path}");
        }
        assert_eq!(write_verb(&http::Method::PATCH), Some("patch"));
        assert_eq!(write_verb(&http::Method::GET), None);
    }

    #[test]
    fn every_mutating_request_through_the_client_stack_is_counted() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            let request = |method, uri: &str| {
                let request = http::Request::builder().method(method).uri(uri);
                count_write(request.body(Body::empty()).unwrap());
            };
            request(http::Method::PATCH, "/api/v1/namespaces/ns/pods/p");
            request(http::Method::PATCH, "/api/v1/namespaces/ns/pods/q");
            request(http::Method::GET, "/api/v1/namespaces/ns/pods?watch=true");
            request(http::Method::DELETE, "/api/v1/namespaces/ns/pods/p");
        });
        let text = handle.render();
        let line = |verb: &str| {
            format!(
                r#"{KUBE_WRITE_REQUESTS_TOTAL}{{verb="{verb}",resource="pods",subresource=""}}"#
            )
        };
        assert!(text.contains(&format!("{} 2", line("patch"))), "{text}");
        assert!(text.contains(&format!("{} 1", line("delete"))), "{text}");
        let series = text
            .lines()
            .filter(|l| l.starts_with(KUBE_WRITE_REQUESTS_TOTAL));
        assert_eq!(series.count(), 2, "the watch is not a write: {text}");
    }

    #[tokio::test]
    async fn missing_kubeconfig_file_names_the_path() {
        let path = Path::new("/nonexistent/multigres/kubeconfig");
        let err = load_config(Some(path)).await.unwrap_err();
        assert!(matches!(err, ClientError::Kubeconfig { .. }), "{err:?}");
        assert!(
            err.to_string()
                .contains("/nonexistent/multigres/kubeconfig"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn unreachable_server_is_reported_with_its_url() {
        crate::telemetry::install_crypto_provider();
        // A port nothing listens on: bind one, note it, close it.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubeconfig");
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\ncurrent-context: c\n\
                 clusters: [{{name: c, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n\
                 users: [{{name: u, user: {{token: t}}}}]\n\
                 contexts: [{{name: c, context: {{cluster: c, user: u}}}}]\n"
            ),
        )
        .unwrap();
        let Err(err) = connect(Some(&path)).await else {
            panic!("connected to a closed port");
        };
        assert!(matches!(err, ClientError::Unreachable { .. }), "{err:?}");
        assert!(
            err.to_string().contains(&format!("127.0.0.1:{port}")),
            "{err}"
        );
    }
}
