//! `bench`: how fast and how cheaply the operator converges, measured against the real local
//! control plane, printed as markdown tables (docs/performance.md quotes them).
//!
//! For each cluster count N (`--clusters 1,10,100`), `--runs` times, with the handlers started
//! afresh (release builds, as ServiceAccounts bound cluster-wide to their shipped roles, so the
//! audit log tells them apart) and the webhook-server registered for the benchmark namespaces:
//!
//! - applies N MultigresClusters (two cells, one shard pool, external topology in a loopback
//!   etcd, so the data-handler registers them for real) into a fresh namespace and times, from
//!   the first apply: every child (Cell, TableGroup, Shard) created, every workload (StatefulSet,
//!   Deployment, Service, PodDisruptionBudget) created, every cluster `Available`. A shard is
//!   Available only once it has a primary; on the fake nodes no multipooler runs, so the
//!   harness writes the pool pods' pooler records into the topology in its place
//!   ([`StandInPoolers`]: ordinal 0 the primary, as soon as a pod is Ready) and the
//!   data-handler publishes the roles from them as it does from real ones (within its
//!   `--roles-poll-period`, or at the Shard's next change);
//! - counts the API requests of each handler during convergence (from the API server's audit
//!   log, level Metadata), and the distinct objects each wrote;
//! - then server-side applies as many objects as the handlers wrote, with `--write-concurrency`
//!   requests in flight: a Service (with or without a cluster IP, as theirs were) for each
//!   Service they wrote, since a Service costs the API server far more than other objects (its
//!   cluster IP is allocated, an IPAddress object written), and a ConfigMap of similar size for
//!   everything else: the time the API server needs to accept
//!   that many writes in bulk, the physical limit the convergence time is compared with;
//! - and again for as many writes as every client made during convergence (the handlers, and
//!   the controller manager, scheduler and kwok acting on the workloads), cycling over the same
//!   names with a changed payload: the limit for all the work converging really takes;
//! - reads each handler's RSS when started (0 clusters) and its peak after convergence.
//!
//! After the last run of the largest N, with its clusters still in place, it counts the
//! handlers' requests for `--idle-minutes`; before the first run it measures admission latency
//! at a steady rate against the running webhook-server over HTTPS (the body is an AdmissionReview
//! of the benchmark's own MultigresCluster), in `--webhook-windows` windows reported one by one
//! and as their median. Figures are medians over the runs; nothing here
//! asserts a timing, the targets are judged in docs/performance.md.
//!
//! `just bench` (or `cargo build --release -p cluster-handler -p resource-handler -p
//! data-handler -p webhook-server -p multigres-e2e --bins && target/release/bench`). The handler
//! binaries are taken from the directory of this executable unless `MULTIGRES_HANDLER_DIR` says
//! otherwise.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::io::{Read, Seek, SeekFrom};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Namespace, Node, Secret, Service};
use k8s_openapi::api::events::v1::Event as KubeEvent;
use kube::api::{ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};
use multigres_e2e::cluster::{ClusterOptions, LocalCluster, REGION, REGION_LABEL};
use multigres_e2e::cluster::{ZONE_ID_LABEL, ZONE_LABEL};
use multigres_e2e::etcd::{EtcdConfig, EtcdProcess};
use multigres_e2e::harness::{
    HANDLER_DIR_ENV, HandlerProcess, WEBHOOK, WebhookServer, multigres_clusters, repo_path,
    webhook_registrations,
};
use multigres_e2e::manifest::{self, Mode};
use multigres_e2e::poolers::StandInPoolers;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};

/// Namespace of the handlers' ServiceAccounts and the webhook's certificate Secret.
const SYSTEM: &str = "multigres-system";
/// The controllers, each started afresh for every run.
const CONTROLLERS: [&str; 3] = ["cluster-handler", "resource-handler", "data-handler"];
/// Label selecting the namespaces the webhooks are registered for.
const BENCH_LABEL: &str = "multigres-bench";
/// Field manager of the benchmark's own writes (the user's `kubectl apply --server-side`).
const MANAGER: &str = "multigres-bench";
/// Extra fake Nodes per zone (250 pods each) beyond the harness's one (110 pods), so a hundred
/// clusters' pods are all scheduled.
const EXTRA_NODES_PER_ZONE: usize = 4;
/// How long the handlers' write counters must hold still after the last cluster turned
/// Available before convergence counts as finished.
const SETTLE: Duration = Duration::from_secs(5);
/// How often convergence is checked against what the watches saw.
const POLL: Duration = Duration::from_millis(50);
/// Size of each ConfigMap of the bulk-write baseline: about that of a rendered StatefulSet.
const BASELINE_OBJECT_BYTES: usize = 2048;
/// Requests sent to the webhook before the measured ones (connections, caches, allocator).
const WEBHOOK_WARM_UP: u32 = 50;
/// Keep-alive connections to the webhook, as the API server keeps a small pool.
const WEBHOOK_CONNECTIONS: usize = 8;

#[derive(Parser)]
#[command(about = "Benchmark the operator against the real local control plane")]
struct Cli {
    /// Cluster counts to measure, smallest first.
    #[arg(long, value_delimiter = ',', default_value = "1,10,100")]
    clusters: Vec<usize>,
    /// Runs per cluster count; figures are medians over them.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Length of the idle window (after the largest count converged).
    #[arg(long, default_value_t = 10)]
    idle_minutes: u64,
    /// Writes in flight for the bulk-write baseline and for applying the clusters: the
    /// controllers reconcile 4 objects at a time each, and two of them write at once.
    #[arg(long, default_value_t = 8)]
    write_concurrency: usize,
    /// Give up on a run that has not converged after this long.
    #[arg(long, default_value_t = 20)]
    timeout_minutes: u64,
    /// Admission requests per second of the webhook latency measurement.
    #[arg(long, default_value_t = 50)]
    webhook_rate: u32,
    /// Length of each window of the webhook latency measurement.
    #[arg(long, default_value_t = 30)]
    webhook_seconds: u64,
    /// Windows of the webhook latency measurement, back to back; the figures are reported per
    /// window and as their median, so one stall of the machine shows as one odd window.
    #[arg(long, default_value_t = 3)]
    webhook_windows: usize,
}

#[allow(unsafe_code)] // libc calls, each under a SAFETY comment
fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if std::env::var_os(HANDLER_DIR_ENV).is_none() {
        let exe = std::env::current_exe().context("locating the bench executable")?;
        let dir = exe.parent().context("directory of the bench executable")?;
        // SAFETY: no other thread exists yet (the runtime is built below).
        unsafe { std::env::set_var(HANDLER_DIR_ENV, dir) };
    }
    let dir = PathBuf::from(std::env::var_os(HANDLER_DIR_ENV).unwrap_or_default());
    for handler in CONTROLLERS.iter().chain([&WEBHOOK]) {
        if !dir.join(handler).is_file() {
            bail!(
                "{handler} is not built in {}: cargo build --release -p {handler}",
                dir.display()
            );
        }
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,kube_client::client::builder=off".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run(cli))
}

/// Progress lines go to stderr; the tables to stdout.
macro_rules! progress {
    ($($arg:tt)*) => { eprintln!("[{}] {}", load(), format!($($arg)*)) };
}

/// The 1-minute load average, printed next to every figure (2 shared cores make it matter).
fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(|s| format!("load {s}")))
        .unwrap_or_else(|| "load ?".to_owned())
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let began = Instant::now();
    let cluster = LocalCluster::start(ClusterOptions {
        audit: true,
        ..ClusterOptions::default()
    })
    .await
    .context("starting the local control plane")?;
    let audit = Audit::new(cluster.audit_log().context("audit log")?.to_path_buf());
    progress!(
        "control plane up in {:.1}s ({})",
        cluster.startup_time().as_secs_f64(),
        cluster.dir().display()
    );
    let admin = cluster.client()?;
    add_nodes(&admin).await?;
    let topo = EtcdProcess::start(EtcdConfig::default())
        .await
        .context("starting the topology etcd")?;
    cluster.create_namespace(SYSTEM).await?;
    let mut kubeconfigs = BTreeMap::new();
    for handler in CONTROLLERS.iter().chain([&WEBHOOK]) {
        kubeconfigs.insert(*handler, grant_cluster_wide(&cluster, handler).await?);
    }
    let webhook = start_webhook(&admin, &kubeconfigs[WEBHOOK]).await?;
    let webhook_addr = webhook.address;
    let webhook_rss_0 = webhook.process.memory().map(|m| m.0).unwrap_or(0);
    progress!("webhook-server serving on {webhook_addr}");

    let latency = admission_latency(&cluster, &admin, webhook_addr, &topo, &cli).await?;
    for (window, l) in latency.iter().enumerate() {
        progress!(
            "admission, window {}: p50 {:.2} ms, p99 {:.2} ms",
            window + 1,
            l.p50 * 1e3,
            l.p99 * 1e3
        );
    }

    let mut results: Vec<RunResult> = Vec::new();
    let mut idle = None;
    let largest = cli.clusters.iter().copied().max().unwrap_or(0);
    for &n in &cli.clusters {
        for r in 0..cli.runs {
            let last = n == largest && r + 1 == cli.runs;
            let result = converge(
                &cluster,
                &admin,
                &audit,
                &kubeconfigs,
                &topo,
                &cli,
                n,
                r,
                last,
            )
            .await
            .with_context(|| format!("{n} clusters, run {}", r + 1))?;
            if let Some(window) = result.1 {
                idle = Some(window);
            }
            results.push(result.0);
        }
    }
    let webhook_peak = webhook.process.memory().map(|m| m.1).unwrap_or(0);
    drop(webhook);

    print_report(
        &cli,
        &results,
        idle.as_ref(),
        &latency,
        webhook_rss_0,
        webhook_peak,
    );
    progress!("benchmark took {:.0}s", began.elapsed().as_secs_f64());
    drop(topo);
    cluster.stop();
    Ok(())
}

/// Adds `EXTRA_NODES_PER_ZONE` kwok Nodes to each zone and waits until they are Ready.
async fn add_nodes(admin: &Client) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(admin.clone());
    let mut names = Vec::new();
    for zone in ["zone-a", "zone-b", "zone-c"] {
        for i in 0..EXTRA_NODES_PER_ZONE {
            let name = format!("kwok-bench-{zone}-{i}");
            let node = json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {
                    "name": name,
                    "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
                    "labels": {
                        "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                        "kubernetes.io/arch": "amd64", "type": "kwok",
                        ZONE_LABEL: zone, ZONE_ID_LABEL: zone, REGION_LABEL: REGION,
                    },
                },
                "status": {
                    "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "250"},
                    "capacity": {"cpu": "64", "memory": "512Gi", "pods": "250"},
                    "addresses": [{"type": "InternalIP", "address": format!("192.0.2.{}", 10 + names.len())}],
                },
            });
            nodes
                .patch(&name, &PatchParams::apply(MANAGER), &Patch::Apply(&node))
                .await
                .with_context(|| format!("creating Node {name}"))?;
            names.push(name);
        }
    }
    poll(
        "the extra Nodes to be Ready",
        Duration::from_secs(120),
        || async {
            let list = nodes.list(&ListParams::default()).await?;
            let ready = list
                .items
                .iter()
                .filter(|n| names.contains(n.metadata.name.as_ref().unwrap_or(&String::new())))
                .filter(|n| {
                    let ready = n
                        .status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|cs| {
                            cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                        });
                    let tainted =
                        n.spec
                            .as_ref()
                            .and_then(|s| s.taints.as_ref())
                            .is_some_and(|ts| {
                                ts.iter().any(|t| t.key.starts_with("node.kubernetes.io/"))
                            });
                    ready && !tainted
                })
                .count();
            Ok((ready == names.len()).then_some(()))
        },
    )
    .await
}

/// Retries `check` every 200 ms until it yields `Some`, for at most `timeout`.
async fn poll<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Option<T>>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        match check().await {
            Ok(Some(value)) => return Ok(value),
            Ok(None) | Err(_) if Instant::now() < deadline => {}
            Ok(None) => bail!("{what}: not reached within {timeout:?}"),
            Err(e) => return Err(e.context(format!("{what}: not reached within {timeout:?}"))),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Applies `object` as the benchmark's user (server-side apply).
async fn apply(admin: &Client, namespace: Option<&str>, object: Value) -> anyhow::Result<()> {
    let object: DynamicObject = serde_json::from_value(object)?;
    manifest::apply(admin, &object, namespace, Mode::Apply)
        .await
        .with_context(|| format!("applying {:?}", object.metadata.name))?;
    Ok(())
}

/// ServiceAccount `<handler>` in `SYSTEM`, bound cluster-wide to every ClusterRole its shipped
/// RBAC file defines; returns a kubeconfig with its token. Each handler thus runs as its own
/// user, which is how the audit log attributes requests.
async fn grant_cluster_wide(cluster: &LocalCluster, handler: &str) -> anyhow::Result<PathBuf> {
    let admin = cluster.client()?;
    let file = if handler == WEBHOOK {
        "deploy/webhook/rbac.yaml".to_owned()
    } else {
        format!("deploy/rbac/{handler}.yaml")
    };
    let text = std::fs::read_to_string(repo_path(&file)).with_context(|| file.clone())?;
    for doc in manifest::parse_documents(&text, Path::new(&file))? {
        let is_role = doc.types.as_ref().is_some_and(|t| t.kind == "ClusterRole");
        let role = doc.metadata.name.clone().unwrap_or_default();
        manifest::apply(&admin, &doc, None, Mode::Apply).await?;
        if is_role {
            apply(
                &admin,
                None,
                json!({
                    "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                    "metadata": {"name": format!("bench-{role}")},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                    "subjects": [{"kind": "ServiceAccount", "name": handler, "namespace": SYSTEM}],
                }),
            )
            .await?;
        }
    }
    Ok(cluster
        .service_account_kubeconfig(SYSTEM, handler, Duration::from_secs(24 * 3600))
        .await?)
}

/// Starts the webhook-server (self-managed certificate, serving 127.0.0.1), registers the
/// shipped webhook configurations by URL for the benchmark namespaces, and waits until the
/// webhook has written its caBundle into them.
async fn start_webhook(admin: &Client, kubeconfig: &Path) -> anyhow::Result<WebhookServer> {
    let operators = CONTROLLERS
        .iter()
        .map(|h| format!("{SYSTEM}:{h}"))
        .collect::<Vec<_>>()
        .join(",");
    // The shipped certificate check interval: the tests' once a second is not production.
    let webhook = WebhookServer::spawn_with(kubeconfig, SYSTEM, &operators, None, None).await;
    let selector = json!({"matchLabels": {BENCH_LABEL: "true"}});
    for registration in webhook_registrations(webhook.address, selector, None) {
        manifest::apply(admin, &registration, None, Mode::Apply).await?;
    }
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(admin.clone());
    poll(
        "the webhook's caBundle",
        Duration::from_secs(60),
        || async {
            let config = mutating
                .get("multigres-operator-mutating-webhook-configuration")
                .await?;
            let set = config.webhooks.unwrap_or_default().iter().all(|w| {
                w.client_config
                    .ca_bundle
                    .as_ref()
                    .is_some_and(|b| !b.0.is_empty())
            });
            Ok(set.then_some(()))
        },
    )
    .await?;
    Ok(webhook)
}

/// The benchmark's MultigresCluster `name`, registering in the topology etcd at `topo` under
/// its own root path.
fn cluster_object(name: &str, namespace: &str, topo: &EtcdProcess) -> Value {
    json!({
        "apiVersion": "multigres.com/v1alpha1", "kind": "MultigresCluster",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "postgresPasswordSecretRef": {"name": "bench-postgres-password", "key": "password"},
            "globalTopoServer": {"external": {
                "endpoints": [topo.client_url()],
                "implementation": "etcd",
                "rootPath": format!("/multigres/{namespace}/{name}"),
            }},
            "cells": [{"name": "zone-a", "zoneId": "zone-a"}, {"name": "zone-b", "zoneId": "zone-b"}],
        },
    })
}

/// Creates namespace `name`, labelled for the webhooks.
async fn bench_namespace(cluster: &LocalCluster, admin: &Client, name: &str) -> anyhow::Result<()> {
    cluster.create_namespace(name).await?;
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    let labelled = json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": name, "labels": {BENCH_LABEL: "true"}},
    });
    namespaces
        .patch(name, &PatchParams::apply(MANAGER), &Patch::Apply(&labelled))
        .await?;
    Ok(())
}

/// The Events in `namespace`, grouped by reporting controller and reason, most published
/// first: how many Events and how many publications (an Event repeated within kube's series
/// window is one Event patched once per repeat, a write each). Tells which announcements make
/// a handler's Event writes.
async fn events_by_reason(admin: &Client, namespace: &str) -> anyhow::Result<String> {
    let events: Api<KubeEvent> = Api::namespaced(admin.clone(), namespace);
    let mut groups: BTreeMap<(String, String), (u32, u32)> = BTreeMap::new();
    for event in events.list(&ListParams::default()).await? {
        let key = (
            event.reporting_controller.unwrap_or_default(),
            event.reason.unwrap_or_default(),
        );
        let published = event.series.map_or(1, |series| series.count.max(1) as u32);
        let entry = groups.entry(key).or_default();
        entry.0 += 1;
        entry.1 += published;
    }
    let mut groups: Vec<_> = groups.into_iter().collect();
    groups.sort_by_key(|group| std::cmp::Reverse(group.1.1));
    Ok(groups
        .iter()
        .map(|((reporter, reason), (events, published))| {
            format!("{reporter} {reason} ({events}, {published})")
        })
        .collect::<Vec<_>>()
        .join(", "))
}

/// Deletes namespace `name` and waits until it is gone (its clusters' finalizers need the
/// handlers, so they must still run).
///
/// The webhook label goes first: the harness's controller manager authenticates as the admin
/// certificate, not as the `namespace-controller` and `generic-garbage-collector` accounts a
/// real cluster's uses, so the webhook would (rightly) refuse its deletion of the children.
async fn delete_namespace(admin: &Client, name: &str) -> anyhow::Result<()> {
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    let unlabelled = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
    namespaces
        .patch(
            name,
            &PatchParams::apply(MANAGER),
            &Patch::Apply(&unlabelled),
        )
        .await?;
    namespaces.delete(name, &DeleteParams::default()).await?;
    poll(
        &format!("namespace {name} deleted"),
        Duration::from_secs(600),
        || async { Ok(namespaces.get_opt(name).await?.is_none().then_some(())) },
    )
    .await
}

/// Latency percentiles of the webhook.
struct Latency {
    rate: u32,
    requests: usize,
    achieved: f64,
    p50: f64,
    p90: f64,
    p99: f64,
    max: f64,
    allowed: bool,
}

/// Sends AdmissionReviews of a benchmark cluster to the validating MultigresCluster webhook at
/// a steady rate, open loop (a request never waits for the previous answer, only for a free
/// connection, which counts as latency): a warm-up, then `--webhook-windows` measured windows
/// back to back. Returns each window's percentiles.
async fn admission_latency(
    cluster: &LocalCluster,
    admin: &Client,
    address: SocketAddr,
    topo: &EtcdProcess,
    cli: &Cli,
) -> anyhow::Result<Vec<Latency>> {
    let namespace = "bench-admission";
    bench_namespace(cluster, admin, namespace).await?;
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), SYSTEM);
    let secret = secrets.get("multigres-webhook-certs").await?;
    let ca = secret
        .data
        .as_ref()
        .and_then(|d| d.get("ca.crt"))
        .context("ca.crt in the webhook's Secret")?
        .0
        .clone();
    let object = cluster_object("b0", namespace, topo);
    let review = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "00000000-0000-4000-8000-000000000001",
            "kind": {"group": "multigres.com", "version": "v1alpha1", "kind": "MultigresCluster"},
            "resource": {"group": "multigres.com", "version": "v1alpha1", "resource": "multigresclusters"},
            "requestKind": {"group": "multigres.com", "version": "v1alpha1", "kind": "MultigresCluster"},
            "requestResource": {"group": "multigres.com", "version": "v1alpha1", "resource": "multigresclusters"},
            "name": "b0", "namespace": namespace, "operation": "CREATE",
            "userInfo": {"username": "system:admin", "groups": ["system:masters", "system:authenticated"]},
            "object": object, "oldObject": null, "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions", "fieldManager": MANAGER},
        },
    });
    let body = Arc::new(serde_json::to_vec(&review)?);
    let path = "/validate-multigres-com-v1alpha1-multigrescluster";
    let mut pool = Vec::new();
    for _ in 0..WEBHOOK_CONNECTIONS {
        pool.push(HttpsConnection::connect(address, &ca).await?);
    }
    let pool = Arc::new(tokio::sync::Mutex::new(pool));
    let permits = Arc::new(tokio::sync::Semaphore::new(WEBHOOK_CONNECTIONS));
    let count = cli.webhook_rate * u32::try_from(cli.webhook_seconds)?;
    let interval = Duration::from_secs(1) / cli.webhook_rate;
    let mut windows = Vec::with_capacity(cli.webhook_windows);
    let phases = std::iter::once((false, WEBHOOK_WARM_UP))
        .chain(std::iter::repeat_n((true, count), cli.webhook_windows));
    for (measured, n) in phases {
        let start = tokio::time::Instant::now() + Duration::from_millis(10);
        let began = Instant::now();
        let mut tasks = Vec::with_capacity(n as usize);
        for i in 0..n {
            tokio::time::sleep_until(start + interval * i).await;
            let (pool, permits, body) = (pool.clone(), permits.clone(), body.clone());
            let due = Instant::now();
            tasks.push(tokio::spawn(async move {
                let _permit = permits.acquire().await?;
                let mut connection = pool.lock().await.pop().context("a pooled connection")?;
                let (status, response) = connection.post(path, &body).await?;
                pool.lock().await.push(connection);
                let latency = due.elapsed();
                if status != 200 {
                    bail!(
                        "webhook answered {status}: {}",
                        String::from_utf8_lossy(&response)
                    );
                }
                let review: Value = serde_json::from_slice(&response)?;
                anyhow::Ok((latency, review["response"]["allowed"] == true))
            }));
        }
        let mut latencies = Vec::with_capacity(n as usize);
        let mut allowed = true;
        for task in tasks {
            let (latency, ok) = task.await??;
            allowed &= ok;
            latencies.push(latency.as_secs_f64());
        }
        if measured {
            let elapsed = began.elapsed();
            latencies.sort_by(f64::total_cmp);
            windows.push(Latency {
                rate: cli.webhook_rate,
                requests: latencies.len(),
                achieved: latencies.len() as f64 / elapsed.as_secs_f64(),
                p50: percentile(&latencies, 0.50),
                p90: percentile(&latencies, 0.90),
                p99: percentile(&latencies, 0.99),
                max: latencies.last().copied().unwrap_or(0.0),
                allowed,
            });
        }
    }
    Ok(windows)
}

/// One keep-alive HTTPS connection speaking just enough HTTP/1.1 for AdmissionReview POSTs.
struct HttpsConnection {
    stream: TlsStream<TcpStream>,
}

impl HttpsConnection {
    async fn connect(address: SocketAddr, ca_pem: &[u8]) -> anyhow::Result<Self> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ca_pem) {
            roots.add(cert?)?;
        }
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
        let tcp = TcpStream::connect(address).await?;
        tcp.set_nodelay(true)?;
        let name = ServerName::try_from(address.ip().to_string())?;
        let stream = TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await?;
        Ok(Self { stream })
    }

    /// POSTs `body` to `path`; returns the status and the body of the answer.
    async fn post(&mut self, path: &str, body: &[u8]) -> anyhow::Result<(u16, Vec<u8>)> {
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
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
                bail!("the webhook closed the connection");
            }
            buffer.extend_from_slice(&chunk[..read]);
        };
        let head = String::from_utf8_lossy(&buffer[..header_end]).to_string();
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .with_context(|| format!("status line of {head:?}"))?;
        let length: usize = head
            .lines()
            .find_map(|l| {
                let (name, value) = l.split_once(':')?;
                name.eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse().ok())
                    .flatten()
            })
            .with_context(|| format!("content-length of {head:?}"))?;
        let mut body = buffer[header_end..].to_vec();
        while body.len() < length {
            let mut chunk = vec![0u8; length - body.len()];
            let read = self.stream.read(&mut chunk).await?;
            if read == 0 {
                bail!("the webhook closed the connection mid-answer");
            }
            body.extend_from_slice(&chunk[..read]);
        }
        Ok((status, body))
    }
}

/// The `p` quantile of sorted `values` (nearest rank).
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn median(values: impl IntoIterator<Item = f64>) -> f64 {
    let mut values: Vec<f64> = values.into_iter().collect();
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => 0.0,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// The API server's audit log, read incrementally by byte offset.
struct Audit {
    path: PathBuf,
}

/// Requests of one user (a handler, or the rest by user agent) within a window.
#[derive(Default, Clone)]
struct Requests {
    by_verb: BTreeMap<String, u64>,
    /// Distinct objects written (group, resource, namespace, name; subresources fold into
    /// their object).
    objects: BTreeSet<(String, String, String, String)>,
    /// Distinct objects written other than through a subresource, Events aside.
    object_targets: BTreeSet<(String, String, String, String)>,
    /// Distinct write targets: an object and each of its subresources count apart (a status
    /// can only be written through `/status`, never together with the object), every Event
    /// is one. The least number of writes that could have produced what the handler wrote.
    write_targets: BTreeSet<(String, String, String, String, String)>,
    /// Writes by `resource[/subresource] verb`, to show where they go.
    writes_by_resource: BTreeMap<String, u64>,
    /// Requests answered with an error status (409 conflicts and the like).
    failed: u64,
}

impl Requests {
    fn writes(&self) -> u64 {
        self.by_verb
            .iter()
            .filter(|(verb, _)| is_write(verb))
            .map(|(_, n)| n)
            .sum()
    }

    fn total(&self) -> u64 {
        self.by_verb.values().sum()
    }

    /// Writes of objects themselves: neither `/status` nor Events. Each object the handler owns
    /// should need exactly one while converging.
    fn object_writes(&self) -> u64 {
        self.writes_by_resource
            .iter()
            .filter(|(what, _)| !what.contains("/status ") && !what.starts_with("events "))
            .map(|(_, n)| n)
            .sum()
    }

    fn reads(&self) -> u64 {
        self.total() - self.writes()
    }
}

fn is_write(verb: &str) -> bool {
    matches!(
        verb,
        "create" | "update" | "patch" | "delete" | "deletecollection"
    )
}

impl Audit {
    fn new(path: PathBuf) -> Audit {
        Audit { path }
    }

    /// Current end of the log: the start of a window.
    fn offset(&self) -> u64 {
        std::fs::metadata(&self.path).map(|m| m.len()).unwrap_or(0)
    }

    /// Requests logged since `offset`, by handler (`cluster-handler`, ...) or, for everyone
    /// else, by user agent (`kube-controller-manager`, `kwok`, `bench`, ...). Each request counts
    /// once although a watch logs two stages.
    fn since(&self, offset: u64) -> anyhow::Result<BTreeMap<String, Requests>> {
        let mut file = std::fs::File::open(&self.path)?;
        file.seek(SeekFrom::Start(offset))?;
        let mut text = String::new();
        file.read_to_string(&mut text)?;
        let mut seen = HashSet::new();
        let mut users: BTreeMap<String, Requests> = BTreeMap::new();
        let prefix = format!("system:serviceaccount:{SYSTEM}:");
        for line in text.lines() {
            let Ok(event) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            let id = event["auditID"].as_str().unwrap_or_default().to_owned();
            if !seen.insert(id) {
                continue;
            }
            let user = event["user"]["username"].as_str().unwrap_or_default();
            let who = match user.strip_prefix(&prefix) {
                Some(handler) => handler.to_owned(),
                None => {
                    let agent = event["userAgent"].as_str().unwrap_or("?");
                    let agent = agent.split('/').next().unwrap_or(agent);
                    if agent == "?" || agent.starts_with("kube-rs") || agent.is_empty() {
                        "benchmark client".to_owned()
                    } else {
                        agent.to_owned()
                    }
                }
            };
            let verb = event["verb"].as_str().unwrap_or("?").to_owned();
            let entry = users.entry(who).or_default();
            *entry.by_verb.entry(verb.clone()).or_default() += 1;
            if event["responseStatus"]["code"].as_u64().unwrap_or(200) >= 400 {
                entry.failed += 1;
            }
            if is_write(&verb) {
                let object = &event["objectRef"];
                let field = |k: &str| object[k].as_str().unwrap_or_default().to_owned();
                entry.objects.insert((
                    field("apiGroup"),
                    field("resource"),
                    field("namespace"),
                    field("name"),
                ));
                let subresource = field("subresource");
                entry.write_targets.insert((
                    field("apiGroup"),
                    field("resource"),
                    subresource.clone(),
                    field("namespace"),
                    field("name"),
                ));
                if subresource.is_empty() && field("resource") != "events" {
                    entry.object_targets.insert((
                        field("apiGroup"),
                        field("resource"),
                        field("namespace"),
                        field("name"),
                    ));
                }
                let what = if subresource.is_empty() {
                    format!("{} {verb}", field("resource"))
                } else {
                    format!("{}/{subresource} {verb}", field("resource"))
                };
                *entry.writes_by_resource.entry(what).or_default() += 1;
            }
        }
        Ok(users)
    }
}

/// The figures of one run.
struct RunResult {
    clusters: usize,
    children_s: f64,
    workloads_s: f64,
    available_s: f64,
    /// When the handlers last wrote (measured to within the 250 ms poll of their counters).
    quiet_s: f64,
    children: usize,
    workloads: usize,
    baseline_s: f64,
    baseline_objects: usize,
    /// Writes of every client (handlers, controller manager, scheduler, kwok, the benchmark
    /// itself) from the first apply to the handlers' last write: what converging really cost.
    all_writes: usize,
    /// Seconds the API server needs for `all_writes` writes in bulk.
    all_writes_s: f64,
    requests: BTreeMap<String, Requests>,
    rss_start: BTreeMap<String, u64>,
    rss_peak: BTreeMap<String, u64>,
}

/// The idle window's figures.
struct IdleWindow {
    minutes: u64,
    clusters: usize,
    requests: BTreeMap<String, Requests>,
}

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: group.to_owned(),
        version: version.to_owned(),
        api_version: if group.is_empty() {
            version.to_owned()
        } else {
            format!("{group}/{version}")
        },
        kind: kind.to_owned(),
        plural: plural.to_owned(),
    }
}

/// The cluster-handler's children of a MultigresCluster.
fn children_kinds() -> Vec<ApiResource> {
    [
        ("Cell", "cells"),
        ("TableGroup", "tablegroups"),
        ("Shard", "shards"),
        ("TopoServer", "toposervers"),
    ]
    .into_iter()
    .map(|(kind, plural)| resource("multigres.com", "v1alpha1", kind, plural))
    .collect()
}

/// The resource-handler's workloads.
fn workload_kinds() -> Vec<ApiResource> {
    vec![
        resource("apps", "v1", "StatefulSet", "statefulsets"),
        resource("apps", "v1", "Deployment", "deployments"),
        resource("", "v1", "Service", "services"),
        resource(
            "policy",
            "v1",
            "PodDisruptionBudget",
            "poddisruptionbudgets",
        ),
    ]
}

/// What the watches of a run saw: when each object first appeared, and when each cluster first
/// reported `Available=True`. Watches rather than polling, so a 1-cluster run that converges in
/// a second is timed to the event, not to a poll period.
#[derive(Default)]
struct Seen {
    children: HashMap<String, Instant>,
    workloads: HashMap<String, Instant>,
    available: HashMap<String, Instant>,
}

/// Which map of [`Seen`] a watched kind feeds.
#[derive(Clone, Copy)]
enum Class {
    Child,
    Workload,
    Cluster,
}

/// Watches every kind of interest in `namespace` into `seen`; `synced` counts the watches whose
/// initial list is done. Returns the tasks (aborted by the caller) and how many there are.
fn watch_namespace(
    admin: &Client,
    namespace: &str,
    seen: &Arc<Mutex<Seen>>,
    synced: &Arc<AtomicUsize>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let kinds = children_kinds()
        .into_iter()
        .map(|k| (k, Class::Child))
        .chain(workload_kinds().into_iter().map(|k| (k, Class::Workload)))
        .chain([(multigres_clusters(), Class::Cluster)]);
    kinds
        .map(|(kind, class)| {
            let api: Api<DynamicObject> = Api::namespaced_with(admin.clone(), namespace, &kind);
            let (seen, synced) = (seen.clone(), synced.clone());
            tokio::spawn(async move {
                let mut events = watcher::watcher(api, watcher::Config::default())
                    .default_backoff()
                    .boxed();
                while let Some(event) = events.next().await {
                    let object = match event {
                        Ok(Event::InitDone) => {
                            synced.fetch_add(1, Ordering::SeqCst);
                            continue;
                        }
                        Ok(Event::Apply(object) | Event::InitApply(object)) => object,
                        _ => continue,
                    };
                    let now = Instant::now();
                    let key = format!("{}/{}", kind.kind, object.name_any());
                    let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
                    match class {
                        Class::Child => {
                            seen.children.entry(key).or_insert(now);
                        }
                        Class::Workload => {
                            seen.workloads.entry(key).or_insert(now);
                        }
                        Class::Cluster => {
                            let available = object.data["status"]["conditions"]
                                .as_array()
                                .is_some_and(|cs| {
                                    cs.iter()
                                        .any(|c| c["type"] == "Available" && c["status"] == "True")
                                });
                            if available {
                                seen.available.entry(key).or_insert(now);
                            }
                        }
                    }
                }
            })
        })
        .collect()
}

/// One run: fresh handlers, N clusters applied, timed to children, workloads and Available;
/// requests counted; the bulk-write baseline; the idle window when `idle_after`; cleanup.
#[allow(clippy::too_many_arguments)]
async fn converge(
    cluster: &LocalCluster,
    admin: &Client,
    audit: &Audit,
    kubeconfigs: &BTreeMap<&str, PathBuf>,
    topo: &EtcdProcess,
    cli: &Cli,
    n: usize,
    run: usize,
    idle_after: bool,
) -> anyhow::Result<(RunResult, Option<IdleWindow>)> {
    let namespace = format!("bench-{n}-{run}");
    bench_namespace(cluster, admin, &namespace).await?;
    apply(
        admin,
        Some(&namespace),
        json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "bench-postgres-password"},
            "stringData": {"password": "bench"},
        }),
    )
    .await?;
    let mut handlers = Vec::new();
    for handler in CONTROLLERS {
        let process = HandlerProcess::spawn(handler, &kubeconfigs[handler], &[]).await;
        process.wait_ready().await;
        handlers.push(process);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_start: BTreeMap<String, u64> = handlers
        .iter()
        .map(|h| (h.name().to_owned(), h.memory().map(|m| m.0).unwrap_or(0)))
        .collect();

    let poolers = StandInPoolers::start(admin.clone(), &namespace);
    let seen = Arc::new(Mutex::new(Seen::default()));
    let synced = Arc::new(AtomicUsize::new(0));
    let watches = watch_namespace(admin, &namespace, &seen, &synced);
    poll(
        "the watches' initial lists",
        Duration::from_secs(60),
        || async { Ok((synced.load(Ordering::SeqCst) == watches.len()).then_some(())) },
    )
    .await?;

    progress!("{n} clusters, run {}: applying", run + 1);
    let offset = audit.offset();
    let began = Instant::now();
    let objects: Vec<Value> = (0..n)
        .map(|i| cluster_object(&format!("b{i}"), &namespace, topo))
        .collect();
    stream::iter(objects)
        .map(|object| apply(admin, Some(&namespace), object))
        .buffer_unordered(cli.write_concurrency)
        .try_collect::<Vec<()>>()
        .await?;
    let deadline = began + Duration::from_secs(cli.timeout_minutes * 60);
    loop {
        let (ready, children, workloads) = {
            let seen = seen.lock().unwrap_or_else(|p| p.into_inner());
            (
                seen.available.len(),
                seen.children.len(),
                seen.workloads.len(),
            )
        };
        if ready == n {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "only {ready} of {n} clusters Available after {} minutes ({children} children, {workloads} workloads)",
                cli.timeout_minutes
            );
        }
        tokio::time::sleep(POLL).await;
    }
    let quiet_s = settle(&handlers, deadline)
        .await?
        .duration_since(began)
        .as_secs_f64();
    let requests = audit.since(offset)?;
    let rss_peak: BTreeMap<String, u64> = handlers
        .iter()
        .map(|h| (h.name().to_owned(), h.memory().map(|m| m.1).unwrap_or(0)))
        .collect();
    for watch in &watches {
        watch.abort();
    }
    let (children, workloads, children_s, workloads_s, available_s) = {
        let seen = seen.lock().unwrap_or_else(|p| p.into_inner());
        let last = |times: &HashMap<String, Instant>| {
            times
                .values()
                .max()
                .map_or(0.0, |t| t.saturating_duration_since(began).as_secs_f64())
        };
        (
            seen.children.len(),
            seen.workloads.len(),
            last(&seen.children),
            last(&seen.workloads),
            last(&seen.available),
        )
    };
    let by_kind = {
        let seen = seen.lock().unwrap_or_else(|p| p.into_inner());
        let mut last: BTreeMap<String, f64> = BTreeMap::new();
        for (key, at) in seen.children.iter().chain(&seen.workloads) {
            let kind = key.split('/').next().unwrap_or_default().to_owned();
            let at = at.saturating_duration_since(began).as_secs_f64();
            let entry = last.entry(kind).or_default();
            *entry = entry.max(at);
        }
        last.iter()
            .map(|(kind, at)| format!("{kind} {at:.2}s"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    progress!(
        "{n} clusters, run {}: children {children_s:.2}s, workloads {workloads_s:.2}s, Available {available_s:.2}s, last write {quiet_s:.2}s (last created per kind: {by_kind})",
        run + 1
    );

    progress!(
        "{n} clusters, run {}: Events by reporter and reason, as (Events, publications): {}",
        run + 1,
        events_by_reason(admin, &namespace).await?
    );

    let baseline_objects: usize = CONTROLLERS
        .iter()
        .filter_map(|h| requests.get(*h))
        .map(|r| r.objects.len())
        .sum();
    let services = ServiceMix::of(admin, &namespace).await?;
    let baseline_s = bulk_writes(
        cluster,
        admin,
        &format!("{namespace}-bulk"),
        baseline_objects,
        baseline_objects,
        services,
        cli,
    )
    .await?;
    progress!(
        "{n} clusters, run {}: baseline {baseline_objects} writes ({} Services with a cluster IP, {} headless) in {baseline_s:.2}s",
        run + 1,
        services.cluster_ip,
        services.headless
    );
    let all_writes = requests.values().map(Requests::writes).sum::<u64>() as usize;
    let all_writes_s = bulk_writes(
        cluster,
        admin,
        &format!("{namespace}-bulk-all"),
        baseline_objects,
        all_writes,
        services,
        cli,
    )
    .await?;
    progress!(
        "{n} clusters, run {}: every client's writes: {all_writes}, in bulk {all_writes_s:.2}s",
        run + 1
    );

    let idle = if idle_after {
        progress!(
            "idle window: {} minutes with {n} clusters",
            cli.idle_minutes
        );
        let offset = audit.offset();
        tokio::time::sleep(Duration::from_secs(cli.idle_minutes * 60)).await;
        Some(IdleWindow {
            minutes: cli.idle_minutes,
            clusters: n,
            requests: audit.since(offset)?,
        })
    } else {
        None
    };

    drop(poolers);
    let cleanup = Instant::now();
    delete_namespace(admin, &namespace).await?;
    progress!(
        "{n} clusters, run {}: namespace deleted in {:.1}s",
        run + 1,
        cleanup.elapsed().as_secs_f64()
    );
    // Dropping a handler stops it (SIGTERM, then SIGKILL after a grace period).
    drop(handlers);
    Ok((
        RunResult {
            clusters: n,
            children_s,
            workloads_s,
            available_s,
            quiet_s,
            children,
            workloads,
            baseline_s,
            baseline_objects,
            all_writes,
            all_writes_s,
            requests,
            rss_start,
            rss_peak,
        },
        idle,
    ))
}

/// Waits until no handler's write counters have moved for `SETTLE`; returns when they last
/// moved (the end of convergence: the last write the clusters caused).
async fn settle(handlers: &[HandlerProcess], deadline: Instant) -> anyhow::Result<Instant> {
    let mut last = Vec::new();
    let mut moved = Instant::now();
    loop {
        let mut now = Vec::with_capacity(handlers.len());
        for handler in handlers {
            now.push(handler.writes().await);
        }
        if now != last {
            last = now;
            moved = Instant::now();
        } else if moved.elapsed() >= SETTLE {
            return Ok(moved);
        }
        if Instant::now() > deadline {
            bail!("the handlers' writes never settled: {last:?}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The Services the handlers created, by whether the API server allocated them a cluster IP.
#[derive(Debug, Clone, Copy)]
struct ServiceMix {
    cluster_ip: usize,
    headless: usize,
}

impl ServiceMix {
    async fn of(admin: &Client, namespace: &str) -> anyhow::Result<Self> {
        let services = Api::<Service>::namespaced(admin.clone(), namespace)
            .list(&ListParams::default())
            .await
            .context("listing the benchmark's Services")?;
        let headless = services
            .items
            .iter()
            .filter(|s| s.spec.as_ref().and_then(|spec| spec.cluster_ip.as_deref()) == Some("None"))
            .count();
        Ok(Self {
            cluster_ip: services.items.len() - headless,
            headless,
        })
    }
}

/// Server-side applies `writes` writes into a fresh namespace, `--write-concurrency` at a time,
/// over `objects` names. The first round creates them: the first `services` as Services like
/// the handlers' (one port, a selector matching nothing), the others as ConfigMaps of
/// `BASELINE_OBJECT_BYTES`. Each further round writes a ConfigMap of every name with a changed
/// payload (creating those named like a Service), so every write is a real one and Services are
/// created as often as the handlers created them. Returns the seconds taken, and deletes the
/// namespace.
async fn bulk_writes(
    cluster: &LocalCluster,
    admin: &Client,
    namespace: &str,
    objects: usize,
    writes: usize,
    services: ServiceMix,
    cli: &Cli,
) -> anyhow::Result<f64> {
    cluster.create_namespace(namespace).await?;
    let objects = objects.max(services.cluster_ip + services.headless).max(1);
    let payload = "x".repeat(BASELINE_OBJECT_BYTES);
    let object = |i: usize| {
        let (index, round) = (i % objects, i / objects);
        let name = format!("bulk-{index}");
        if round == 0 && index < services.cluster_ip + services.headless {
            let mut spec = json!({
                "ports": [{"name": "grpc", "port": 15991}],
                "selector": {BENCH_LABEL: "none"},
            });
            if index >= services.cluster_ip {
                spec["clusterIP"] = json!("None");
            }
            json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": name, "labels": {BENCH_LABEL: "bulk"}},
                "spec": spec,
            })
        } else {
            json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "labels": {BENCH_LABEL: "bulk"}},
                "data": {"payload": payload, "round": round.to_string()},
            })
        }
    };
    let began = Instant::now();
    stream::iter(0..writes)
        .map(|i| apply(admin, Some(namespace), object(i)))
        .buffer_unordered(cli.write_concurrency)
        .try_collect::<Vec<()>>()
        .await?;
    let took = began.elapsed().as_secs_f64();
    delete_namespace(admin, namespace).await?;
    Ok(took)
}

fn mib(bytes: f64) -> String {
    format!("{:.1}", bytes / (1024.0 * 1024.0))
}

/// Prints every table (markdown) to stdout.
fn print_report(
    cli: &Cli,
    results: &[RunResult],
    idle: Option<&IdleWindow>,
    latency: &[Latency],
    webhook_rss_0: u64,
    webhook_peak: u64,
) {
    let counts: Vec<usize> = cli.clusters.clone();
    let of = |n: usize| results.iter().filter(move |r| r.clusters == n);
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "\n## Benchmark ({cpus} CPUs, {}, {} run(s) per count, write concurrency {})\n",
        load(),
        cli.runs,
        cli.write_concurrency
    );

    println!("### Convergence time (medians, seconds from the first apply)\n");
    println!(
        "| clusters | children created | workloads created | all Available | handlers' last write | objects written by handlers | bulk-write baseline | workloads / baseline | Available / baseline |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for &n in &counts {
        let children = median(of(n).map(|r| r.children_s));
        let workloads = median(of(n).map(|r| r.workloads_s));
        let avail = median(of(n).map(|r| r.available_s));
        let quiet = median(of(n).map(|r| r.quiet_s));
        let objects = median(of(n).map(|r| r.baseline_objects as f64));
        let baseline = median(of(n).map(|r| r.baseline_s));
        println!(
            "| {n} | {children:.2} | {workloads:.2} | {avail:.2} | {quiet:.2} | {objects:.0} ({:.0} children, {:.0} workloads) | {baseline:.2} | {:.2}× | {:.2}× |",
            median(of(n).map(|r| r.children as f64)),
            median(of(n).map(|r| r.workloads as f64)),
            workloads / baseline,
            avail / baseline,
        );
    }

    println!(
        "\n### Convergence against every write it took (medians; writes of every client from the audit log)\n"
    );
    println!(
        "| clusters | writes by handlers | writes by every client | bulk time for every client's writes (s) | workloads / that | Available / that | handlers' last write / that |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for &n in &counts {
        let handlers = median(of(n).map(|r| {
            CONTROLLERS
                .iter()
                .filter_map(|h| r.requests.get(*h))
                .map(Requests::writes)
                .sum::<u64>() as f64
        }));
        let all = median(of(n).map(|r| r.all_writes as f64));
        let bulk = median(of(n).map(|r| r.all_writes_s));
        let workloads = median(of(n).map(|r| r.workloads_s));
        let avail = median(of(n).map(|r| r.available_s));
        let quiet = median(of(n).map(|r| r.quiet_s));
        println!(
            "| {n} | {handlers:.0} | {all:.0} | {bulk:.2} | {:.2}× | {:.2}× | {:.2}× |",
            workloads / bulk,
            avail / bulk,
            quiet / bulk,
        );
    }

    println!("\n### API requests per handler during convergence (medians)\n");
    println!(
        "| clusters | handler | reads (get/list/watch) | writes | writes by verb | failed | objects written | writes / object | object writes (no status, no Events) / object | write targets (object, its status, each Event) | writes / target |"
    );
    println!("|---:|---|---:|---:|---|---:|---:|---:|---:|---:|---:|");
    for &n in &counts {
        for handler in CONTROLLERS {
            let pick = |f: &dyn Fn(&Requests) -> f64| {
                median(of(n).map(|r| r.requests.get(handler).map_or(0.0, f)))
            };
            let verbs: BTreeSet<String> = of(n)
                .filter_map(|r| r.requests.get(handler))
                .flat_map(|q| q.by_verb.keys().filter(|v| is_write(v)).cloned())
                .collect();
            let by_verb = verbs
                .iter()
                .map(|v| {
                    format!(
                        "{v} {:.0}",
                        pick(&|q| *q.by_verb.get(v).unwrap_or(&0) as f64)
                    )
                })
                .collect::<Vec<_>>()
                .join(", ");
            let writes = pick(&|q| q.writes() as f64);
            let objects = pick(&|q| q.objects.len() as f64);
            let targets = pick(&|q| q.write_targets.len() as f64);
            let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
            println!(
                "| {n} | {handler} | {:.0} | {writes:.0} | {by_verb} | {:.0} | {objects:.0} | {:.2} | {:.2} | {targets:.0} | {:.2} |",
                pick(&|q| q.reads() as f64),
                pick(&|q| q.failed as f64),
                ratio(writes, objects),
                ratio(
                    pick(&|q| q.object_writes() as f64),
                    pick(&|q| q.object_targets.len() as f64)
                ),
                ratio(writes, targets),
            );
        }
    }
    if let Some(last) = results.last() {
        println!(
            "\nWrites by resource in the last run ({} clusters):\n",
            last.clusters
        );
        println!("| handler | writes by resource and verb |");
        println!("|---|---|");
        for handler in CONTROLLERS {
            let q = last.requests.get(handler).cloned().unwrap_or_default();
            let list = q
                .writes_by_resource
                .iter()
                .map(|(what, n)| format!("{what} {n}"))
                .collect::<Vec<_>>()
                .join(", ");
            println!("| {handler} | {list} |");
        }
        let others: Vec<String> = last
            .requests
            .iter()
            .filter(|(who, _)| !CONTROLLERS.contains(&who.as_str()))
            .map(|(who, q)| format!("{who} {} ({} writes)", q.total(), q.writes()))
            .collect();
        println!(
            "\nOther clients in the last run ({} clusters): {}",
            last.clusters,
            others.join(", ")
        );
    }

    if let Some(idle) = idle {
        println!(
            "\n### Idle: {} minutes with {} clusters in place\n",
            idle.minutes, idle.clusters
        );
        println!("| handler | requests | writes | by verb |");
        println!("|---|---:|---:|---|");
        for handler in CONTROLLERS.iter().chain([&WEBHOOK]) {
            let q = idle.requests.get(*handler).cloned().unwrap_or_default();
            let by_verb = q
                .by_verb
                .iter()
                .map(|(v, c)| format!("{v} {c}"))
                .collect::<Vec<_>>()
                .join(", ");
            println!("| {handler} | {} | {} | {by_verb} |", q.total(), q.writes());
        }
    }

    println!("\n### Peak RSS per handler (MiB, medians; fresh processes per run)\n");
    print!("| handler | at start (0 clusters) |");
    for n in &counts {
        print!(" peak at {n} |");
    }
    println!();
    println!("|---|---:|{}", "---:|".repeat(counts.len()));
    for handler in CONTROLLERS {
        print!(
            "| {handler} | {} |",
            mib(median(results.iter().map(|r| r.rss_start[handler] as f64)))
        );
        for &n in &counts {
            print!(
                " {} |",
                mib(median(of(n).map(|r| r.rss_peak[handler] as f64)))
            );
        }
        println!();
    }
    println!(
        "| webhook-server (one process throughout) | {} | {} after all runs |",
        mib(webhook_rss_0 as f64),
        mib(webhook_peak as f64)
    );

    if let (Some(&small), Some(&large)) = (counts.iter().rev().nth(1), counts.last()) {
        println!(
            "\n### Growth from {small} to {large} clusters (per-cluster cost at {large} ÷ per-cluster cost at {small}: 1 is linear, {:.0} would be quadratic)\n",
            large as f64 / small as f64
        );
        println!("| figure | at {small} | at {large} | ratio per cluster |");
        println!("|---|---:|---:|---:|");
        let row = |name: &str, f: &dyn Fn(&RunResult) -> f64| {
            let a = median(of(small).map(f));
            let b = median(of(large).map(f));
            let ratio = (b / large as f64) / (a / small as f64);
            println!("| {name} | {a:.2} | {b:.2} | {ratio:.2} |");
        };
        row("all Available (s)", &|r| r.available_s);
        row("handlers' last write (s)", &|r| r.quiet_s);
        row("workloads created (s)", &|r| r.workloads_s);
        row("bulk-write baseline (s)", &|r| r.baseline_s);
        row("writes by every client", &|r| r.all_writes as f64);
        row("bulk time for every client's writes (s)", &|r| {
            r.all_writes_s
        });
        for handler in CONTROLLERS {
            row(&format!("{handler} requests"), &|r| {
                r.requests.get(handler).map_or(0.0, |q| q.total() as f64)
            });
        }
        for handler in CONTROLLERS {
            // Growth of memory above the empty process.
            row(&format!("{handler} RSS above start (MiB)"), &|r| {
                (r.rss_peak[handler].saturating_sub(r.rss_start[handler])) as f64 / 1048576.0
            });
        }
    }

    println!(
        "\n### Admission latency at the webhook (validate MultigresCluster, HTTPS, {} keep-alive connections, open loop)\n",
        WEBHOOK_CONNECTIONS
    );
    println!("| window | rate | requests | achieved | p50 | p90 | p99 | max | allowed |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---|");
    for (window, l) in latency.iter().enumerate() {
        println!(
            "| {} | {} req/s | {} | {:.1} req/s | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms | {} |",
            window + 1,
            l.rate,
            l.requests,
            l.achieved,
            l.p50 * 1e3,
            l.p90 * 1e3,
            l.p99 * 1e3,
            l.max * 1e3,
            l.allowed
        );
    }
    let window_median = |f: fn(&Latency) -> f64| median(latency.iter().map(f)) * 1e3;
    println!(
        "| median of {} | | | | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms | {} |",
        latency.len(),
        window_median(|l| l.p50),
        window_median(|l| l.p90),
        window_median(|l| l.p99),
        window_median(|l| l.max),
        latency.iter().all(|l| l.allowed)
    );
}
