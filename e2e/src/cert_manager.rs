//! cert-manager beside a local control plane: its CRDs and its real controller
//! (`e2e/toolchain/cert-manager`), and a CA ClusterIssuer made the way its documentation makes
//! one (a self-signed issuer signs a CA Certificate, whose Secret backs a CA issuer).

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;

use crate::cluster::LocalCluster;
use crate::manifest::{self, Mode};
use crate::process::Supervised;

/// The namespace of the ClusterIssuers' Secrets (cert-manager's `--cluster-resource-namespace`).
pub const NAMESPACE: &str = "cert-manager";

/// How long cert-manager gets to issue a certificate (about a second when idle).
pub const ISSUE_WAIT: Duration = Duration::from_secs(90);

/// A running cert-manager controller; stopped when dropped.
pub struct CertManager {
    _process: Supervised,
}

/// The CRDs beside the controller binary (copied there by the toolchain build).
fn crd_dir() -> Result<PathBuf, String> {
    let binary = crate::toolchain::binary("cert-manager").map_err(|e| e.to_string())?;
    let binary = std::fs::canonicalize(&binary).map_err(|e| format!("{binary:?}: {e}"))?;
    Ok(binary.with_file_name("crds"))
}

/// Applies `yaml` (several documents), retrying while the API server does not yet serve a
/// kind a CRD just added.
pub async fn apply_all(cluster: &LocalCluster, yaml: &str, what: &Path) -> Result<(), String> {
    let client = cluster.client().map_err(|e| e.to_string())?;
    let docs = manifest::parse_documents(yaml, what).map_err(|e| e.to_string())?;
    for doc in docs {
        let mut last = String::new();
        let mut applied = false;
        for _ in 0..60 {
            match manifest::apply(&client, &doc, None, Mode::Apply).await {
                Ok(_) => {
                    applied = true;
                    break;
                }
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        if !applied {
            return Err(format!(
                "applying {:?} from {what:?}: {last}",
                doc.metadata.name
            ));
        }
    }
    Ok(())
}

impl CertManager {
    /// Installs cert-manager's CRDs (idempotent) and starts its controller as cluster admin.
    pub async fn start(cluster: &LocalCluster) -> Result<CertManager, String> {
        let dir = crd_dir()?;
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map_err(|e| format!("{dir:?}: {e}"))?
            .filter_map(|entry| entry.ok().map(|e| e.path()))
            .filter(|path| path.extension().is_some_and(|x| x == "yaml"))
            .collect();
        files.sort();
        for file in &files {
            let yaml = std::fs::read_to_string(file).map_err(|e| format!("{file:?}: {e}"))?;
            apply_all(cluster, &yaml, file).await?;
        }
        cluster
            .create_namespace(NAMESPACE)
            .await
            .map_err(|e| e.to_string())?;
        let binary = crate::toolchain::binary("cert-manager").map_err(|e| e.to_string())?;
        let process = Supervised::spawn(
            "cert-manager",
            &binary,
            &[
                format!("--kubeconfig={}", cluster.kubeconfig().display()),
                format!("--cluster-resource-namespace={NAMESPACE}"),
            ],
            &[],
            &cluster.dir().join("cert-manager.log"),
        )
        .map_err(|e| e.to_string())?;
        Ok(CertManager { _process: process })
    }

    /// Makes CA ClusterIssuer `name` and returns its CA certificate (PEM) once issued.
    pub async fn ca_issuer(&self, cluster: &LocalCluster, name: &str) -> Result<String, String> {
        let yaml = format!(
            "apiVersion: cert-manager.io/v1
kind: ClusterIssuer
metadata: {{name: {name}-self-signed}}
spec: {{selfSigned: {{}}}}
---
apiVersion: cert-manager.io/v1
kind: Certificate
metadata: {{name: {name}, namespace: {NAMESPACE}}}
spec:
  isCA: true
  commonName: {name}
  secretName: {name}
  privateKey: {{algorithm: ECDSA, size: 256}}
  issuerRef: {{name: {name}-self-signed, kind: ClusterIssuer, group: cert-manager.io}}
---
apiVersion: cert-manager.io/v1
kind: ClusterIssuer
metadata: {{name: {name}}}
spec: {{ca: {{secretName: {name}}}}}
"
        );
        apply_all(cluster, &yaml, Path::new("ca-issuer.yaml")).await?;
        let client = cluster.client().map_err(|e| e.to_string())?;
        let secrets: Api<Secret> = Api::namespaced(client, NAMESPACE);
        Ok(tls_secret_key(&secrets, name, "ca.crt", ISSUE_WAIT).await)
    }
}

/// Key `key` of Secret `name`, waiting up to `wait` for cert-manager to write it (panics
/// after that, as [`crate::harness::eventually`] does).
pub async fn tls_secret_key(
    secrets: &Api<Secret>,
    name: &str,
    key: &str,
    wait: Duration,
) -> String {
    crate::harness::eventually(&format!("Secret {name} with {key}"), wait, || async {
        let secret = secrets
            .get_opt(name)
            .await
            .map_err(|e| e.to_string())?
            .ok_or("no Secret yet")?;
        let value = secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .ok_or(format!("no {key} yet"))?;
        let text = String::from_utf8(value.0.clone()).map_err(|e| e.to_string())?;
        if text.is_empty() {
            return Err(format!("{key} is empty"));
        }
        Ok(text)
    })
    .await
}
