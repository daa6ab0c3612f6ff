//! The multi-cell sample on real pods (`minimal.yaml` is the other real-node files' cluster,
//! grown to three cells by `zones.rs`): `external-topo.yaml`, applied as a user would (with the
//! locally built images), with the etcd it expects at `topo-etcd:2379` run from the same etcd
//! image and `gatewayTLS.required: true`, until the MultigresCluster is Available and
//! `SELECT 1` is answered through every cell's own gateway with `sslmode=verify-full` against
//! the CA the operator publishes, while plaintext is refused. Of the multi-cell samples it is the
//! one that differs in what runs (an external topology, client TLS required).
//!
//! `templated.yaml`, `inline.yaml` and `overrides.yaml` differ in how the spec is written, not
//! in what runs: the resolver decides that before any pod exists. `cluster_handler.rs`
//! (`every_sample_produces_exactly_its_children`) checks the children of all five samples on the
//! kwok tier, `resource-handler/tests/samples.rs` the workloads they are built into, and
//! `api.rs` dry-runs every sample document.
//!
//! The sample's multiadmin web UI is then loaded in a real browser (headless Chromium) through
//! its Service: its pooler table must list the shard's poolers in every cell, one primary.
//!
//! The figures (`[figure] …`) are printed, not asserted.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use kube::Client;
use kube::api::{Api, DynamicObject};
use multigres_api::v1alpha1::MultigresCluster;
use multigres_e2e::browser::{rendered_document, table_rows};
use multigres_e2e::harness::{eventually, fresh_namespace};
use multigres_e2e::http;
use multigres_e2e::load::figure;
use multigres_e2e::manifest::{self, Mode};
use multigres_e2e::real::{
    ETCD_IMAGE_PREFIX, Endpoint, cell_gateway_service, image, operator_installed,
    verified_tls_query,
};
use multigres_e2e::sample::apply_sample_file;
use serde_json::json;

/// The multi-cell sample on real pods, by file name under `deploy/samples`.
const SAMPLE: &str = "external-topo";
/// A cluster of 16 pods (4 of them PostgreSQL: the default 2 per cell in two cells) starts on 2
/// shared cores beside another real-node file.
const WAIT: Duration = Duration::from_secs(600);

/// The etcd `external-topo.yaml` names (`http://topo-etcd:2379`): one member, no volume.
async fn run_external_etcd(client: &Client, namespace: &str) {
    let labels = json!({"app": "topo-etcd"});
    let docs = [
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "topo-etcd", "labels": labels},
            "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels}, "spec": {
                    "containers": [{"name": "etcd", "image": image(ETCD_IMAGE_PREFIX),
                        "imagePullPolicy": "Never",
                        "command": ["/usr/local/bin/etcd"],
                        "args": ["--data-dir=/var/lib/etcd",
                            "--listen-client-urls=http://0.0.0.0:2379",
                            "--advertise-client-urls=http://topo-etcd:2379"],
                        "volumeMounts": [{"name": "data", "mountPath": "/var/lib/etcd"}]}],
                    "volumes": [{"name": "data", "emptyDir": {}}]}}}}),
        json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "topo-etcd"},
            "spec": {"selector": labels, "ports": [{"name": "client", "port": 2379}]}}),
    ];
    for doc in docs {
        let doc: DynamicObject = serde_json::from_value(doc).unwrap();
        manifest::apply(client, &doc, Some(namespace), Mode::Apply)
            .await
            .unwrap_or_else(|e| panic!("applying topo-etcd: {e}"));
    }
}

/// Waits until the cluster is Available and every cell's gateway answers `SELECT 1` with
/// `sslmode=verify-full` while it refuses plaintext; the time since `sent`.
async fn wait_served(client: &Client, namespace: &str, name: &str, sent: Instant) -> Duration {
    let clusters: Api<MultigresCluster> = Api::namespaced(client.clone(), namespace);
    eventually(
        &format!("{namespace}/{name} Available, every cell's gateway answering"),
        WAIT.saturating_sub(sent.elapsed()),
        || async {
            let cluster = clusters.get(name).await.map_err(|e| e.to_string())?;
            let status = cluster.status.clone().unwrap_or_default();
            let available = status
                .conditions
                .iter()
                .find(|c| c.type_ == "Available")
                .map(|c| (c.status.clone(), c.message.clone()));
            if available.as_ref().map(|a| a.0.as_str()) != Some("True") {
                return Err(format!("Available {available:?}, phase {:?}", status.phase));
            }
            for cell in &cluster.spec.cells {
                let service = cell_gateway_service(client, namespace, name, &cell.name).await?;
                let verified = (service.0.as_str(), service.1.as_str());
                let answer = verified_tls_query(client, namespace, name, verified, "SELECT 1")
                    .await
                    .map_err(|e| format!("SELECT 1 through {}'s gateway: {e}", cell.name))?;
                if answer != "1" {
                    return Err(format!(
                        "{}'s gateway answered {answer:?} over TLS",
                        cell.name
                    ));
                }
                let gateway = Endpoint::cell_gateway(client, namespace, name, &cell.name).await?;
                let plain = tokio::time::timeout(Duration::from_secs(5), gateway.query("SELECT 1"))
                    .await
                    .unwrap_or_else(|_| Err("no answer within 5 s".to_owned()));
                match plain {
                    Err(refusal) => {
                        println!(
                            "{namespace}/{name} {}: plaintext refused: {refusal}",
                            cell.name
                        )
                    }
                    Ok(rows) => {
                        return Err(format!(
                            "{}'s gateway answered {rows:?} in plaintext, with TLS required",
                            cell.name
                        ));
                    }
                }
            }
            Ok(sent.elapsed())
        },
    )
    .await
}

/// The multiadmin web UI's port (the image's `PORT`).
const WEB_UI_PORT: u16 = 18100;

/// Waits until the cluster's web UI, loaded in Chromium through its Service, lists the poolers
/// of shard `0-inf` in every cell of the cluster, exactly one of them PRIMARY (columns: cell,
/// name, database, table group, shard, type, ...); the time since `sent`.
async fn web_ui_lists_every_cell(
    client: &Client,
    namespace: &str,
    name: &str,
    sent: Instant,
) -> Duration {
    let clusters: Api<MultigresCluster> = Api::namespaced(client.clone(), namespace);
    let cells: BTreeSet<String> = clusters
        .get(name)
        .await
        .unwrap_or_else(|e| panic!("reading {namespace}/{name}: {e}"))
        .spec
        .cells
        .iter()
        .map(|cell| cell.name.to_string())
        .collect();
    let services: Api<Service> = Api::namespaced(client.clone(), namespace);
    let service = format!("{name}-multiadmin-web");
    eventually(
        &format!("{namespace}/{service} listing the poolers of every cell in Chromium"),
        WAIT.saturating_sub(sent.elapsed()),
        || async {
            let ip = services
                .get(&service)
                .await
                .map_err(|e| e.to_string())?
                .spec
                .and_then(|spec| spec.cluster_ip)
                .ok_or("no ClusterIP yet")?;
            // The server answers first (a plain GET says why it does not, where a browser
            // would only wait), then the browser renders the page.
            let page = "/dashboard/multipoolers";
            let address: Ipv4Addr = ip.parse().map_err(|e| format!("ClusterIP {ip}: {e}"))?;
            match http::get(address, WEB_UI_PORT, page).await? {
                (200, _) => {}
                (status, body) => return Err(format!("GET {page}: HTTP {status}: {body:.200}")),
            }
            let url = format!("http://{ip}:{WEB_UI_PORT}{page}");
            let rows = table_rows(&rendered_document(&url).await?);
            let listed: BTreeSet<String> = rows
                .iter()
                .filter(|row| row.get(4).map(String::as_str) == Some("0-inf"))
                .filter_map(|row| row.first().cloned())
                .collect();
            let primaries = rows
                .iter()
                .filter(|row| row.get(5).map(String::as_str) == Some("PRIMARY"))
                .count();
            match listed == cells && primaries == 1 {
                true => {
                    println!("{url}: {rows:?}");
                    Ok(sent.elapsed())
                }
                false => Err(format!(
                    "cells {cells:?} wanted, {listed:?} listed, {primaries} primaries: {rows:?}"
                )),
            }
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_multi_cell_sample_answers_sql_through_each_cells_gateway() {
    let cluster = operator_installed().await;
    let client = cluster.client().unwrap();
    let sent = Instant::now();
    let namespace = fresh_namespace(cluster, SAMPLE).await;
    run_external_etcd(&client, &namespace).await;
    let require_tls = |doc: &mut serde_json::Value| {
        doc["spec"]["gatewayTLS"] = json!({"required": true});
    };
    let name = apply_sample_file(&client, &namespace, SAMPLE, require_tls).await;
    let took = wait_served(&client, &namespace, &name, sent).await;
    figure(
        &format!("{SAMPLE}.yaml applied -> every cell's gateway answers (s)"),
        format!("{:.1}", took.as_secs_f64()),
    );
    let took = web_ui_lists_every_cell(&client, &namespace, &name, sent).await;
    figure(
        &format!("{SAMPLE}.yaml applied -> web UI lists every cell's poolers (s)"),
        format!("{:.1}", took.as_secs_f64()),
    );
    // The UI logs in as its own read-only role, never as the superuser. The gateways require
    // TLS, which its plaintext PostgreSQL client could never use with a password: it holds
    // none, and its topology pages (above) still work.
    let web: Deployment = Api::namespaced(client.clone(), &namespace)
        .get(&format!("{name}-multiadmin-web"))
        .await
        .unwrap();
    let env: Vec<_> = web
        .spec
        .and_then(|s| s.template.spec)
        .into_iter()
        .flat_map(|pod| pod.containers)
        .flat_map(|c| c.env.unwrap_or_default())
        .collect();
    let user = env.iter().find(|e| e.name == "POSTGRES_USER");
    assert_eq!(
        user.and_then(|e| e.value.as_deref()),
        Some("multiadmin_web"),
        "the web UI logs in as its own role"
    );
    assert!(
        env.iter().all(|e| e.name != "POSTGRES_PASSWORD"),
        "with TLS required the web UI holds no password: {env:?}"
    );
}
