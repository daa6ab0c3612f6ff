//! `psql`: a psql session through the cluster's multigateway, as `just demo` tells users to
//! connect from their machine: `kubectl port-forward` to the gateway Service, then the local
//! psql with the superuser password from the cluster's Secret (passed in the environment, never
//! on a command line). When the gateways serve TLS, psql verifies them as an application in
//! the cluster would: `sslmode=verify-full` against the CA the operator publishes, for the
//! gateway Service's DNS name (libpq checks `host` and dials `hostaddr`, the forwarded port).

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};
use multigres_api::labels;
use multigres_api::names::{self, cluster_multigateway};
use multigres_api::v1alpha1::{Cell, GatewayTlsConfig, MultigresCluster};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use crate::view;

/// Port multigateway serves PostgreSQL on.
const GATEWAY_PORT: u16 = 5432;

/// The multigateway Service to reach: the cluster-wide one, or that of cell `cell`.
pub fn gateway_service(
    cluster: &MultigresCluster,
    cells: &[Cell],
    cell: Option<&str>,
) -> Result<String> {
    let Some(wanted) = cell else {
        return Ok(cluster_multigateway(&cluster.name_any()));
    };
    let found = cells.iter().find(|c| c.spec.name.as_str() == wanted);
    let Some(found) = found else {
        let names: Vec<&str> = cells.iter().map(|c| c.spec.name.as_str()).collect();
        bail!(
            "MultigresCluster {} has no cell {wanted}; its cells: {}",
            cluster.name_any(),
            names.join(", ")
        );
    };
    found
        .status
        .as_ref()
        .and_then(|s| s.gateway_service_name.clone())
        .ok_or_else(|| anyhow!("cell {wanted} publishes no multigateway Service yet"))
}

/// The superuser psql logs in as.
pub fn user(cluster: &MultigresCluster) -> &str {
    cluster
        .spec
        .postgres_superuser
        .as_deref()
        .unwrap_or("postgres")
}

/// Forwards a local port to the gateway Service and runs psql through it with `args`; returns
/// psql's exit code.
pub async fn run(
    client: &Client,
    namespace: &str,
    name: &str,
    cell: Option<&str>,
    args: &[String],
) -> Result<i32> {
    let cluster = view::cluster(client, namespace, name).await?;
    let of_cluster = ListParams::default().labels(&format!("{}={name}", labels::CLUSTER));
    let cells: Vec<Cell> = view::list(client, namespace, &of_cluster).await?;
    let service = gateway_service(&cluster, &cells, cell)?;
    let password = view::password(client, namespace, &cluster).await?;
    let reference = &cluster.spec.postgres_password_secret_ref;

    let forward_args = [
        "-n".to_owned(),
        namespace.to_owned(),
        "port-forward".to_owned(),
        format!("svc/{service}"),
        format!(":{GATEWAY_PORT}"),
    ];
    eprintln!("$ kubectl {}", forward_args.join(" "));
    let mut forward = Command::new("kubectl")
        .args(&forward_args)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("running kubectl (is it on PATH?)")?;
    let stdout = forward.stdout.take().context("kubectl's output")?;
    let mut lines = BufReader::new(stdout).lines();
    // kubectl prints `Forwarding from 127.0.0.1:<port> -> 5432` once it listens.
    let port = loop {
        match lines.next_line().await? {
            Some(line) => {
                if let Some(port) = forwarded_port(&line) {
                    break port;
                }
            }
            None => bail!(
                "kubectl port-forward to svc/{service} ended: {}",
                forward.wait().await?
            ),
        }
    };
    let db = multigres_api::DEFAULT_DATABASE;
    let user = user(&cluster);
    let tls = cluster.spec.gateway_tls.as_ref();
    let ca = match GatewayTlsConfig::is_enabled(tls) {
        true => Some(published_ca(client, namespace, &cluster).await?),
        false => None,
    };
    let mut psql = Command::new("psql");
    let shown = match &ca {
        // The user's own certificate or issuer, whose CA the operator was not given: encrypted,
        // and the server is the one port-forward reaches; verify it with your own CA.
        Some(None) => {
            psql.args(["-h", "127.0.0.1"]).env("PGSSLMODE", "require");
            "PGSSLMODE=require psql -h 127.0.0.1".to_owned()
        }
        Some(Some(ca)) => {
            let host = format!("{service}.{namespace}.svc");
            psql.args(["-h", &host])
                .env("PGHOSTADDR", "127.0.0.1")
                .env("PGSSLMODE", "verify-full")
                .env("PGSSLROOTCERT", ca.path());
            format!(
                "PGSSLMODE=verify-full PGSSLROOTCERT=<ConfigMap {}, key ca.crt> \
                 PGHOSTADDR=127.0.0.1 psql -h {host}",
                names::gateway_ca(name)
            )
        }
        None => {
            psql.args(["-h", "127.0.0.1"]);
            "psql -h 127.0.0.1".to_owned()
        }
    };
    eprintln!(
        "$ PGPASSWORD=<Secret {}, key {}> {shown} -p {port} -U {user} {db} {}",
        reference.name,
        reference.key,
        args.join(" ")
    );
    let status = psql
        .args(["-p", &port.to_string(), "-U", user, db])
        .args(args)
        .env("PGPASSWORD", password)
        .status()
        .await
        .context(
            "running psql: install the PostgreSQL client (e.g. apt install postgresql-client)",
        )?;
    forward.kill().await.ok();
    drop(ca);
    Ok(status.code().unwrap_or(1))
}

/// The gateway CA certificate the operator publishes for `cluster`, in a file only this user
/// can read, removed when dropped. None when the certificate is the user's (their own Secret
/// or issuer) and its CA was not published: that Secret had no `ca.crt`.
async fn published_ca(
    client: &Client,
    namespace: &str,
    cluster: &MultigresCluster,
) -> Result<Option<CaFile>> {
    let name = names::gateway_ca(&cluster.name_any());
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let users_own = cluster.spec.issuer_name.is_some()
        || cluster
            .spec
            .gateway_tls
            .as_ref()
            .is_some_and(|t| t.secret_name.is_some());
    let map = maps
        .get_opt(&name)
        .await
        .with_context(|| format!("reading ConfigMap {namespace}/{name}, the gateway CA"))?;
    let Some(map) = map else {
        if users_own {
            return Ok(None);
        }
        bail!(
            "ConfigMap {namespace}/{name}, the gateway CA, does not exist yet (spec.gatewayTLS \
             is on; the operator publishes it once the gateway certificate is issued)"
        );
    };
    let pem = map
        .data
        .as_ref()
        .and_then(|d| d.get("ca.crt"))
        .ok_or_else(|| anyhow!("ConfigMap {namespace}/{name} has no key ca.crt"))?;
    CaFile::write(pem).map(Some)
}

/// A temporary file holding a CA certificate.
struct CaFile(PathBuf);

impl CaFile {
    fn write(pem: &str) -> Result<Self> {
        let dir = std::env::temp_dir().join(format!("kubectl-multigres-{}", std::process::id()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join("gateway-ca.crt");
        std::fs::write(&path, pem).with_context(|| format!("writing {}", path.display()))?;
        Ok(Self(path))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for CaFile {
    fn drop(&mut self) {
        if let Some(dir) = self.0.parent() {
            std::fs::remove_dir_all(dir).ok();
        }
    }
}

/// The local port of a `Forwarding from 127.0.0.1:<port> -> <remote>` line.
fn forwarded_port(line: &str) -> Option<u16> {
    let rest = line.strip_prefix("Forwarding from 127.0.0.1:")?;
    rest.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::tests::fixture;

    #[test]
    fn the_gateway_is_the_clusters_or_the_cells() {
        let view = fixture(include_str!("../fixtures/degraded.yaml"));
        let gateway = |cell| gateway_service(&view.cluster, &view.cells, cell);
        assert_eq!(gateway(None).unwrap(), "prod-multigateway");
        assert_eq!(gateway(Some("zone-b")).unwrap(), "prod-zone-b-multigateway");
        let error = gateway(Some("zone-c")).unwrap_err().to_string();
        assert_eq!(
            error,
            "MultigresCluster prod has no cell zone-c; its cells: zone-a, zone-b"
        );
        assert_eq!(user(&view.cluster), "postgres");
    }

    #[test]
    fn the_forwarded_port_is_read_from_kubectl_output() {
        assert_eq!(
            forwarded_port("Forwarding from 127.0.0.1:40123 -> 5432"),
            Some(40123)
        );
        assert_eq!(forwarded_port("Forwarding from [::1]:40123 -> 5432"), None);
        assert_eq!(forwarded_port("Handling connection for 40123"), None);
    }
}
