//! The Kubernetes client: from `--kubeconfig`, KUBECONFIG, ~/.kube/config or the in-cluster
//! service account, checked against the API server before the handler reports anything.

use std::path::{Path, PathBuf};

use kube::config::{InferConfigError, KubeConfigOptions, Kubeconfig, KubeconfigError};
use kube::{Client, Config};

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
    let client = Client::try_from(config).map_err(ClientError::Build)?;
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

#[cfg(test)]
mod tests {
    use super::*;

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
