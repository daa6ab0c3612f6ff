//! What a platform team's Prometheus sees, on real nodes: a real Prometheus
//! (`multigres_e2e::prometheus`) scraping the four handlers as the chart's ServiceMonitor says,
//! evaluating the chart's alerts, and receiving the data plane's OpenTelemetry metrics from the
//! minimal sample pointed at its OTLP endpoint through `spec.observability`. The story:
//! every handler is scraped and its series carry the watched object's namespace; the data plane's
//! series arrive; every panel query of every shipped dashboard returns series at some point of
//! the story; the primary-lost and pool-degraded alerts fire while the primary's multipooler
//! and the shard's multiorch are frozen (SIGSTOP: no answer, no failover) and resolve once they
//! run again; the postgres_exporter of every pool pod is scraped over TLS (verified with the CA
//! the operator publishes) as the shipped PodMonitor says, PostgreSQL's own series and a user's
//! query arrive, and a transaction held open on the primary fires the long-transaction alert,
//! which resolves once it commits; the backup-stale alert fires once the bootstrap backup is
//! older than the test's threshold and resolves after a scheduled backup.
//!
//! One cluster, one story; each step's failure is collected and the story goes on, so one
//! broken panel or alert does not hide the others.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use multigres_api::labels;
use multigres_api::v1alpha1::MultigresCluster;
use multigres_e2e::harness::{fresh_namespace, repo_path};
use multigres_e2e::prometheus::{self, Prometheus};
use multigres_e2e::real::{Endpoint, OPERATOR_NAMESPACE, operator_installed, run};
use multigres_e2e::sample::{NAME, apply_sample, pool_pods, settled_roles, wait_serving};
use serde_json::{Value, json};

/// How long a series or an alert may take to show: a scrape and an evaluation every 5 s, a
/// data-plane export every 5 s, the shortened `for` windows, and a 2-core machine.
const SEEN_WITHIN: Duration = Duration::from_secs(180);
/// The dashboards the chart ships (deploy/dashboards/).
const DASHBOARDS: &[&str] = &[
    "operator.json",
    "clusters.json",
    "data-plane.json",
    "postgresql.json",
];
/// A user-defined exporter query (postgres_exporter's queries format), as
/// docs/images-and-observability.md shows it.
const CUSTOM_QUERIES: &str = "\
pg_database_age:
  query: SELECT datname, age(datfrozenxid) AS xid_age FROM pg_database
  metrics:
    - datname:
        usage: LABEL
        description: Database
    - xid_age:
        usage: GAUGE
        description: Age of the oldest unfrozen transaction ID
";
/// The PodMonitor users apply for a cluster's exporters (CLUSTER and NAMESPACE replaced).
const POD_MONITOR: &str = "deploy/monitoring/postgres-exporter-podmonitor.yaml";

/// Every panel query of the shipped dashboards, as (dashboard/panel, expression) with the
/// template variables a user would pick: this namespace and cluster, every handler, a 1-minute
/// rate window.
fn panel_queries(namespace: &str) -> Vec<(String, String)> {
    let mut queries = Vec::new();
    for file in DASHBOARDS {
        let path = repo_path(&format!("deploy/dashboards/{file}"));
        let dashboard: Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        for panel in dashboard["panels"].as_array().unwrap() {
            for target in panel["targets"].as_array().into_iter().flatten() {
                let expr = target["expr"]
                    .as_str()
                    .unwrap()
                    .replace("$namespace", namespace)
                    .replace("$cluster", NAME)
                    .replace("$job", ".*")
                    .replace("$__rate_interval", "1m");
                let id = format!(
                    "{file}/{} ({})",
                    panel["title"].as_str().unwrap(),
                    target["refId"].as_str().unwrap_or("A")
                );
                queries.push((id, expr));
            }
        }
    }
    queries
}

/// The story so far: the Prometheus it asks, the panel queries that have not returned series
/// yet, and the steps that failed.
struct Story {
    prometheus: &'static Prometheus,
    namespace: String,
    pending_panels: BTreeMap<String, String>,
    failures: Vec<String>,
}

impl Story {
    fn new(prometheus: &'static Prometheus, namespace: &str) -> Story {
        Story {
            prometheus,
            namespace: namespace.to_owned(),
            pending_panels: panel_queries(namespace).into_iter().collect(),
            failures: Vec::new(),
        }
    }

    /// Asks Prometheus every panel query that has not returned series yet.
    async fn sample_panels(&mut self) {
        let mut drawn = Vec::new();
        for (id, expr) in &self.pending_panels {
            match self.prometheus.query(expr).await {
                Ok(series) if !series.is_empty() => drawn.push(id.clone()),
                Ok(_) => {}
                Err(e) => println!("{id}: {e}"),
            }
        }
        for id in drawn {
            self.pending_panels.remove(&id);
        }
    }

    /// Polls `check` every 2 s until it returns `Ok`, sampling the panels meanwhile; the error
    /// of the last attempt after [`SEEN_WITHIN`].
    async fn within<T, F, Fut>(&mut self, mut check: F) -> Result<T, String>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, String>>,
    {
        let deadline = Instant::now() + SEEN_WITHIN;
        loop {
            self.sample_panels().await;
            match check().await {
                Ok(value) => return Ok(value),
                Err(last) if Instant::now() >= deadline => {
                    return Err(format!("not within {SEEN_WITHIN:?}: {last}"));
                }
                Err(_) => tokio::time::sleep(Duration::from_secs(2)).await,
            }
        }
    }

    /// Records how `step` ended: a figure of the seconds since `since`, or a failure.
    fn record(&mut self, step: &str, since: Instant, outcome: Result<(), String>) {
        match outcome {
            Ok(()) => println!("[figure] {step} (s): {:.1}", since.elapsed().as_secs_f64()),
            Err(e) => self.failures.push(format!("{step}: {e}")),
        }
    }

    /// Waits until `expr` returns series; records it as `step`.
    async fn series(&mut self, step: &str, since: Instant, expr: &str) {
        let prometheus = self.prometheus;
        let outcome = self
            .within(|| async {
                match prometheus.query(expr).await?.len() {
                    0 => Err(format!("no series {expr}")),
                    _ => Ok(()),
                }
            })
            .await;
        self.record(step, since, outcome);
    }

    /// Waits until `alert` of this namespace is firing (`firing`) or gone (not `firing`);
    /// records it as `step`.
    async fn alert(&mut self, step: &str, since: Instant, alert: &str, firing: bool) {
        let (prometheus, namespace) = (self.prometheus, self.namespace.clone());
        let outcome = self
            .within(|| async {
                let state = prometheus
                    .alerts()
                    .await?
                    .into_iter()
                    .find(|a| {
                        a["labels"]["alertname"] == alert && a["labels"]["namespace"] == *namespace
                    })
                    .and_then(|a| a["state"].as_str().map(str::to_owned));
                match (state.as_deref(), firing) {
                    (Some("firing"), true) | (None, false) => Ok(()),
                    (state, _) => Err(format!("{alert} is {state:?}")),
                }
            })
            .await;
        self.record(step, since, outcome);
    }
}

/// Sends `signal` to every process named `command` in the containers of `pod` (found by the
/// pod's UID in their cgroup path: the test runs in the nodes' PID namespace); how many.
#[allow(unsafe_code)] // libc calls, each under a SAFETY comment
fn signal_pod_processes(pod: &Pod, command: &str, signal: libc::c_int) -> usize {
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let systemd_uid = uid.replace('-', "_");
    let mut signalled = 0;
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        if comm.trim() == command && (cgroup.contains(&uid) || cgroup.contains(&systemd_uid)) {
            // SAFETY: kill(2) with a pid read from /proc and a valid signal number.
            if unsafe { libc::kill(pid, signal) } == 0 {
                signalled += 1;
            }
        }
    }
    signalled
}

/// The shard's multiorch pods.
async fn multiorch_pods(client: &Client, namespace: &str) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let selector = format!("{}=multiorch,{}={NAME}", labels::COMPONENT, labels::CLUSTER);
    pods.list(&ListParams::default().labels(&selector))
        .await
        .unwrap()
        .items
}

/// Freezes (SIGSTOP) or thaws (SIGCONT) the primary's multipooler and every multiorch of the
/// shard: the primary stops answering, and nothing can fail over meanwhile.
async fn freeze(client: &Client, namespace: &str, primary: &Pod, signal: libc::c_int) {
    let poolers = signal_pod_processes(primary, "multipooler", signal);
    assert!(
        poolers > 0,
        "no multipooler process of {}",
        primary.name_any()
    );
    for pod in multiorch_pods(client, namespace).await {
        let orchs = signal_pod_processes(&pod, "multiorch", signal);
        assert!(orchs > 0, "no multiorch process of {}", pod.name_any());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_scrapes_every_handler_draws_every_panel_and_sees_alerts_fire_and_resolve()
 {
    let cluster = operator_installed().await;
    let prometheus = prometheus::server().await;
    let client = cluster.client().unwrap();
    let namespace = fresh_namespace(cluster, "observability").await;
    let endpoint = prometheus.otlp_endpoint();
    // A user's query for the exporters, beside their default collectors.
    let queries: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "postgres-queries"},
        "data": {"custom.yaml": CUSTOM_QUERIES},
    }))
    .unwrap();
    Api::<ConfigMap>::namespaced(client.clone(), &namespace)
        .create(&Default::default(), &queries)
        .await
        .expect("the queries ConfigMap");
    let sent = apply_sample(&client, &namespace, |doc| {
        doc["spec"]["observability"] = json!({
            "otlpEndpoint": endpoint,
            "otlpProtocol": "http/protobuf",
            "metricsExporter": "otlp",
            "metricExportInterval": "5000",
            "postgresExporter": {"customQueries": {"name": "postgres-queries", "key": "custom.yaml"}},
        });
    })
    .await;
    wait_serving(&client, &namespace, sent).await;
    let gateway = Endpoint::gateway(&client, &namespace, NAME).await.unwrap();
    let password = gateway.password.clone();
    gateway
        .query("CREATE TABLE IF NOT EXISTS seen (id int PRIMARY KEY)")
        .await
        .unwrap();
    for id in 0..20 {
        gateway
            .query(&format!("INSERT INTO seen VALUES ({id})"))
            .await
            .unwrap();
    }
    let mut story = Story::new(prometheus, &namespace);

    // 1. Every handler is a scraped target through its metrics Service, and up.
    let handlers = [
        "cluster-handler",
        "resource-handler",
        "data-handler",
        "webhook-server",
    ];
    let scraped = Instant::now();
    let up = story
        .within(|| async {
            let targets = prometheus.targets().await?;
            let healthy: BTreeSet<String> = targets
                .iter()
                .filter(|t| t["health"] == "up" && t["labels"]["namespace"] == OPERATOR_NAMESPACE)
                .filter_map(|t| t["labels"]["job"].as_str().map(str::to_owned))
                .collect();
            let missing: Vec<&str> = handlers
                .iter()
                .copied()
                .filter(|h| !healthy.iter().any(|job| job.contains(h)))
                .collect();
            if missing.is_empty() {
                println!("scraped jobs: {healthy:?}");
                Ok(())
            } else {
                let seen: Vec<String> = targets
                    .iter()
                    .map(|t| format!("{} {} {}", t["labels"]["job"], t["health"], t["lastError"]))
                    .collect();
                Err(format!(
                    "no healthy target of {missing:?}; targets {seen:?}"
                ))
            }
        })
        .await;
    story.record("every handler scraped and up", scraped, up);

    // 2. A handler's per-object series keep the object's namespace (the ServiceMonitor honours
    // the handlers' labels), so the alerts name the cluster's namespace, not the operator's.
    let pool_series =
        format!("multigres_operator_shard_pool_replicas{{namespace=\"{namespace}\"}}");
    story
        .series(
            "pool replicas under the cluster's namespace",
            scraped,
            &pool_series,
        )
        .await;

    // 3. The data plane's own series arrive over OTLP, labelled with the cluster and the
    // process the operator put in their resource attributes.
    gateway.query("SELECT count(*) FROM seen").await.unwrap();
    for (process, series) in [
        ("multigateway", "mg_gateway_query_duration_seconds_count"),
        ("multipooler", "mg_pooler_serving_transitions_total"),
        (
            "multiorch",
            "multiorch_recovery_action_duration_milliseconds_count",
        ),
    ] {
        let expr =
            format!("{series}{{multigres_cluster=\"{NAME}\", multigres_component=\"{process}\"}}");
        story
            .series(
                &format!("{process} series over OTLP since apply"),
                sent,
                &expr,
            )
            .await;
    }

    // 4. The primary lost: its multipooler frozen, and every multiorch so none fails over.
    let (primary, _) = settled_roles(&client, &namespace, &password, 3).await;
    let primary_pod = pool_pods(&client, &namespace)
        .await
        .into_iter()
        .find(|p| p.name_any() == primary)
        .expect("the primary's pod");
    let frozen = Instant::now();
    freeze(&client, &namespace, &primary_pod, libc::SIGSTOP).await;
    let no_primary =
        format!("max(multigres_operator_shard_primaries{{namespace=\"{namespace}\"}}) == 0");
    story
        .series(
            "primary froze -> 0 serving primaries scraped",
            frozen,
            &no_primary,
        )
        .await;
    for alert in ["MultigresShardPrimaryLost", "MultigresShardPoolDegraded"] {
        let step = format!("{alert} firing after the primary froze");
        story.alert(&step, frozen, alert, true).await;
    }
    freeze(&client, &namespace, &primary_pod, libc::SIGCONT).await;
    let thawed = Instant::now();
    for alert in ["MultigresShardPrimaryLost", "MultigresShardPoolDegraded"] {
        let step = format!("{alert} resolved after the primary ran again");
        story.alert(&step, thawed, alert, false).await;
    }
    let gateway = Endpoint::gateway(&client, &namespace, NAME).await.unwrap();
    let rows = story
        .within(|| async { gateway.query("SELECT count(*) FROM seen").await })
        .await;
    assert_eq!(
        rows,
        Ok(vec![vec![Some("20".to_owned())]]),
        "every acknowledged row after the freeze"
    );

    // 5. PostgreSQL's own metrics: the shipped PodMonitor, with the test's scrape interval, and
    // the CA the operator publishes for it. A session on the primary holds a temporary
    // replication slot (Multigres streams without slots, and the slot panel would stay empty).
    let (serving, _) = settled_roles(&client, &namespace, &password, 3).await;
    let session_pod = pool_pods(&client, &namespace)
        .await
        .into_iter()
        .find(|p| p.name_any() == serving)
        .expect("the primary's pod");
    let exporters = Instant::now();
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let published = format!("{NAME}-postgres-exporter");
    let ca = story
        .within(|| async {
            let map = maps.get_opt(&published).await.map_err(|e| e.to_string())?;
            map.and_then(|m| m.data?.get("ca.crt").cloned())
                .ok_or_else(|| format!("no ca.crt in ConfigMap {published}"))
        })
        .await
        .expect("the exporters' CA is published");
    let text = std::fs::read_to_string(repo_path(POD_MONITOR))
        .unwrap()
        .replace("CLUSTER", NAME)
        .replace("NAMESPACE", &namespace);
    let mut monitor: Value = serde_yaml::from_str(&text).unwrap();
    monitor["spec"]["podMetricsEndpoints"][0]["interval"] = json!(prometheus::INTERVAL);
    monitor["spec"]["podMetricsEndpoints"][0]["scrapeTimeout"] = json!("4s");
    prometheus
        .scrape_pod_monitor(&monitor, &ca, cluster.kubeconfig())
        .await
        .unwrap_or_else(|e| panic!("adding the PodMonitor: {e}"));
    let session = Endpoint::pod(&session_pod, &password)
        .expect("the primary's address")
        .connect()
        .await
        .expect("a session on the primary");
    run(
        &session,
        "SELECT pg_create_physical_replication_slot('observability', true, true)",
    )
    .await
    .expect("a temporary slot");
    let job = format!("{namespace}/{NAME}-postgres-exporter");
    let pods = pool_pods(&client, &namespace).await.len();
    let up = story
        .within(|| async {
            let targets = prometheus.targets().await?;
            let ours: Vec<&Value> = targets
                .iter()
                .filter(|t| t["labels"]["job"] == *job)
                .collect();
            let healthy = ours.iter().filter(|t| t["health"] == "up").count();
            let connected = prometheus
                .query(&format!("pg_up{{job=\"{job}\"}} == 1"))
                .await?
                .len();
            if healthy == pods && connected == pods {
                Ok(())
            } else {
                let seen: Vec<String> = ours
                    .iter()
                    .map(|t| format!("{} {} {}", t["labels"]["pod"], t["health"], t["lastError"]))
                    .collect();
                Err(format!(
                    "{healthy} of {pods} exporters scraped, {connected} connected: {seen:?}"
                ))
            }
        })
        .await;
    story.record(
        "every pool pod's exporter scraped over TLS and connected",
        exporters,
        up,
    );
    for series in [
        "pg_settings_max_connections",
        "pg_stat_database_numbackends",
        "pg_stat_replication_pg_wal_lsn_diff",
        "pg_wal_size_bytes",
        "pg_database_size_bytes",
        "pg_long_running_transactions_oldest_timestamp_seconds",
        "pg_replication_slots_pg_wal_lsn_diff",
        "pg_database_age_xid_age",
    ] {
        let expr = format!("{series}{{job=\"{job}\", multigres_cluster=\"{NAME}\"}}");
        story
            .series(&format!("{series} from the exporters"), exporters, &expr)
            .await;
    }
    run(&session, "BEGIN; SELECT txid_current()")
        .await
        .expect("a transaction left open");
    let opened = Instant::now();
    story
        .alert(
            "MultigresPostgresLongTransaction firing while a transaction stays open",
            opened,
            "MultigresPostgresLongTransaction",
            true,
        )
        .await;
    run(&session, "COMMIT").await.expect("the commit");
    story
        .alert(
            "MultigresPostgresLongTransaction resolved after the commit",
            Instant::now(),
            "MultigresPostgresLongTransaction",
            false,
        )
        .await;

    // 6. The newest backup older than the test's threshold (90 s): backup-stale fires; a
    // schedule's next backup resolves it.
    story
        .alert(
            "MultigresBackupStale firing after the cluster was applied",
            sent,
            "MultigresBackupStale",
            true,
        )
        .await;
    let clusters: Api<MultigresCluster> = Api::namespaced(client.clone(), &namespace);
    let schedule = json!({"spec": {"backup": {"type": "filesystem", "filesystem": {},
        "schedule": {"cron": "* * * * *", "retainFull": 2}}}});
    clusters
        .patch(NAME, &PatchParams::default(), &Patch::Merge(&schedule))
        .await
        .unwrap_or_else(|e| panic!("setting a backup schedule: {e}"));
    story
        .alert(
            "MultigresBackupStale resolved after a schedule was set",
            Instant::now(),
            "MultigresBackupStale",
            false,
        )
        .await;

    // 7. Every panel of every dashboard has drawn something by now. The slot goes with the
    // primary's session.
    story.sample_panels().await;
    drop(session);
    if !story.pending_panels.is_empty() {
        let empty: Vec<String> = story
            .pending_panels
            .iter()
            .map(|(id, expr)| format!("{id}: {expr}"))
            .collect();
        story.failures.push(format!(
            "panels that never returned series:\n  {}",
            empty.join("\n  ")
        ));
    }
    assert!(
        story.failures.is_empty(),
        "{} failed steps:\n{}\nPrometheus log:\n{}",
        story.failures.len(),
        story.failures.join("\n"),
        prometheus.log_tail(20)
    );
}
