//! `psql`: a psql session through the cluster's multigateway, as `just demo` tells users to
//! connect from their machine: `kubectl port-forward` to the gateway Service, then the local
//! psql with the superuser password from the cluster's Secret (passed in the environment, never
//! on a command line).

use std::process::Stdio;

use anyhow::{Context, Result, anyhow, bail};
use kube::api::ListParams;
use kube::{Client, ResourceExt};
use multigres_api::labels;
use multigres_api::names::cluster_multigateway;
use multigres_api::v1alpha1::{Cell, MultigresCluster};
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
    let connect = format!("psql -h 127.0.0.1 -p {port} -U {user} {db}");
    eprintln!(
        "$ PGPASSWORD=<Secret {}, key {}> {connect} {}",
        reference.name,
        reference.key,
        args.join(" ")
    );
    let status = Command::new("psql")
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-U", user, db])
        .args(args)
        .env("PGPASSWORD", password)
        .status()
        .await
        .context(
            "running psql: install the PostgreSQL client (e.g. apt install postgresql-client)",
        )?;
    forward.kill().await.ok();
    Ok(status.code().unwrap_or(1))
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
