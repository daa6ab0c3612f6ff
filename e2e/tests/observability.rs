//! What a platform team's Prometheus sees, on real nodes: a real Prometheus
//! (`multigres_e2e::prometheus`) scraping the four handlers as the chart's ServiceMonitor says,
//! evaluating the chart's alerts, and receiving the data plane's OpenTelemetry metrics from the
//! minimal sample pointed at its OTLP endpoint through `spec.observability`. The story:
//! every handler is scraped and its series carry the watched object's namespace; the data plane's
//! series arrive; every panel query of every shipped dashboard returns series at some point of
//! the story; the primary-lost and pool-degraded alerts fire while the primary's multipooler
//! and the shard's multiorch are frozen (SIGSTOP: no answer, no failover) and resolve once they
//! run again; the backup-stale alert fires once the bootstrap backup is older than the test's
//! threshold and resolves after a scheduled backup.
//!
//! One cluster, one story; each step's failure is collected and the story goes on, so one
//! broken panel or alert does not hide the others.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use multigres_api::labels;
use multigres_api::v1alpha1::MultigresCluster;
use multigres_e2e::harness::{fresh_namespace, repo_path};
use multigres_e2e::prometheus::{self, Prometheus};
use multigres_e2e::real::{Endpoint, OPERATOR_NAMESPACE, operator_installed};
use multigres_e2e::sample::{NAME, apply_sample, pool_pods, settled_roles, wait_serving};
use serde_json::{Value, json};

/// How long a series or an alert may take to show: a scrape and an evaluation every 5 s, a
/// data-plane export every 5 s, the shortened `for` windows, and a 2-core machine.
const SEEN_WITHIN: Duration = Duration::from_secs(180);
/// The dashboards the chart ships (deploy/dashboards/).
const DASHBOARDS: &[&str] = &["operator.json", "clusters.json", "data-plane.json"];

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

/// The story's record of which panel queries have returned series so far.
struct Panels {
    pending: BTreeMap<String, String>,
}

impl Panels {
    fn new(namespace: &str) -> Panels {
        Panels {
            pending: panel_queries(namespace).into_iter().collect(),
        }
    }

    /// Asks Prometheus every query that has not returned series yet.
    async fn sample(&mut self, prometheus: &Prometheus) {
        let mut drawn = Vec::new();
        for (id, expr) in &self.pending {
            match prometheus.query(expr).await {
                Ok(series) if !series.is_empty() => drawn.push(id.clone()),
                Ok(_) => {}
                Err(e) => println!("{id}: {e}"),
            }
        }
        for id in drawn {
            self.pending.remove(&id);
        }
    }
}

/// Polls `check` every 2 s until it returns `Ok`, sampling the panels meanwhile; the error of
/// the last attempt after `timeout`.
async fn within<T, F, Fut>(
    prometheus: &Prometheus,
    panels: &mut Panels,
    timeout: Duration,
    mut check: F,
) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        panels.sample(prometheus).await;
        match check().await {
            Ok(value) => return Ok(value),
            Err(last) if Instant::now() >= deadline => {
                return Err(format!("not within {timeout:?}: {last}"));
            }
            Err(_) => tokio::time::sleep(Duration::from_secs(2)).await,
        }
    }
}

/// The state (`pending`, `firing`) of `alert` for this namespace, if Prometheus has it.
async fn alert_state(
    prometheus: &Prometheus,
    alert: &str,
    namespace: &str,
) -> Result<Option<String>, String> {
    Ok(prometheus
        .alerts()
        .await?
        .into_iter()
        .find(|a| a["labels"]["alertname"] == alert && a["labels"]["namespace"] == namespace)
        .and_then(|a| a["state"].as_str().map(str::to_owned)))
}

/// Sends `signal` to every process named `command` in the containers of `pod` (found by the
/// pod's UID in their cgroup path: the test runs in the nodes' PID namespace); how many.
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
    let sent = apply_sample(&client, &namespace, |doc| {
        doc["spec"]["observability"] = json!({
            "otlpEndpoint": endpoint,
            "otlpProtocol": "http/protobuf",
            "metricsExporter": "otlp",
            "metricExportInterval": "5000",
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
    let mut failures: Vec<String> = Vec::new();
    let mut panels = Panels::new(&namespace);

    // 1. Every handler is a scraped target through its metrics Service, and up.
    let handlers = [
        "cluster-handler",
        "resource-handler",
        "data-handler",
        "webhook-server",
    ];
    let up = within(prometheus, &mut panels, SEEN_WITHIN, || async {
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
            Ok(healthy)
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
    match up {
        Ok(jobs) => println!("scraped jobs: {jobs:?}"),
        Err(e) => failures.push(format!("handlers scraped: {e}")),
    }

    // 2. A handler's per-object series keep the object's namespace (the ServiceMonitor honours
    // the handlers' labels), so the alerts name the cluster's namespace, not the operator's.
    let pool_series =
        format!("multigres_operator_shard_pool_replicas{{namespace=\"{namespace}\"}}");
    let honoured = within(prometheus, &mut panels, SEEN_WITHIN, || async {
        match prometheus.query(&pool_series).await?.len() {
            0 => Err(format!("no series {pool_series}")),
            _ => Ok(()),
        }
    })
    .await;
    if let Err(e) = honoured {
        failures.push(format!("the handlers' namespace label: {e}"));
    }

    // 3. The data plane's own series arrive over OTLP, labelled with the cluster and the
    // process the operator put in their resource attributes.
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
        let arrived = within(prometheus, &mut panels, SEEN_WITHIN, || async {
            if process == "multigateway" {
                gateway.query("SELECT count(*) FROM seen").await?;
            }
            match prometheus.query(&expr).await?.len() {
                0 => Err(format!("no series {expr}")),
                _ => Ok(()),
            }
        })
        .await;
        if let Err(e) = arrived {
            failures.push(format!("{process} over OTLP: {e}"));
        }
    }

    // 4. The primary lost: its multipooler frozen, and every multiorch so none fails over.
    let (primary, _) = settled_roles(&client, &namespace, &password, 2).await;
    let primary_pod = pool_pods(&client, &namespace)
        .await
        .into_iter()
        .find(|p| p.name_any() == primary)
        .expect("the primary's pod");
    let frozen = Instant::now();
    freeze(&client, &namespace, &primary_pod, libc::SIGSTOP).await;
    let no_primary =
        format!("max(multigres_operator_shard_primaries{{namespace=\"{namespace}\"}}) == 0");
    let seen = within(prometheus, &mut panels, SEEN_WITHIN, || async {
        match prometheus.query(&no_primary).await?.len() {
            0 => Err(format!("no series {no_primary}")),
            _ => Ok(()),
        }
    })
    .await;
    match seen {
        Ok(()) => println!(
            "[figure] primary froze -> 0 serving primaries scraped (s): {:.1}",
            frozen.elapsed().as_secs_f64()
        ),
        Err(e) => failures.push(format!("0 serving primaries: {e}")),
    }
    for alert in ["MultigresShardPrimaryLost", "MultigresShardPoolDegraded"] {
        let fired = within(prometheus, &mut panels, SEEN_WITHIN, || async {
            match alert_state(prometheus, alert, &namespace).await? {
                Some(state) if state == "firing" => Ok(()),
                other => Err(format!("{alert} is {other:?}")),
            }
        })
        .await;
        match fired {
            Ok(()) => println!(
                "[figure] {alert} firing after the primary froze (s): {:.1}",
                frozen.elapsed().as_secs_f64()
            ),
            Err(e) => failures.push(format!("{alert} fires: {e}")),
        }
    }
    freeze(&client, &namespace, &primary_pod, libc::SIGCONT).await;
    let thawed = Instant::now();
    for alert in ["MultigresShardPrimaryLost", "MultigresShardPoolDegraded"] {
        let resolved = within(prometheus, &mut panels, SEEN_WITHIN, || async {
            match alert_state(prometheus, alert, &namespace).await? {
                None => Ok(()),
                Some(state) => Err(format!("{alert} is still {state}")),
            }
        })
        .await;
        match resolved {
            Ok(()) => println!(
                "[figure] {alert} resolved after the primary ran again (s): {:.1}",
                thawed.elapsed().as_secs_f64()
            ),
            Err(e) => failures.push(format!("{alert} resolves: {e}")),
        }
    }
    let gateway = Endpoint::gateway(&client, &namespace, NAME).await.unwrap();
    let rows = within(prometheus, &mut panels, SEEN_WITHIN, || async {
        gateway.query("SELECT count(*) FROM seen").await
    })
    .await;
    assert_eq!(
        rows,
        Ok(vec![vec![Some("20".to_owned())]]),
        "every acknowledged row after the freeze"
    );

    // 5. The newest backup older than the test's threshold (90 s): backup-stale fires; a
    // schedule's next backup resolves it.
    let fired = within(prometheus, &mut panels, SEEN_WITHIN, || async {
        match alert_state(prometheus, "MultigresBackupStale", &namespace).await? {
            Some(state) if state == "firing" => Ok(()),
            other => Err(format!("MultigresBackupStale is {other:?}")),
        }
    })
    .await;
    match fired {
        Ok(()) => println!(
            "[figure] MultigresBackupStale firing after the cluster was applied (s): {:.1}",
            sent.elapsed().as_secs_f64()
        ),
        Err(e) => failures.push(format!("MultigresBackupStale fires: {e}")),
    }
    let clusters: Api<MultigresCluster> = Api::namespaced(client.clone(), &namespace);
    let schedule = json!({"spec": {"backup": {"type": "filesystem", "filesystem": {},
        "schedule": {"cron": "* * * * *", "retainFull": 2}}}});
    clusters
        .patch(NAME, &PatchParams::default(), &Patch::Merge(&schedule))
        .await
        .unwrap_or_else(|e| panic!("setting a backup schedule: {e}"));
    let scheduled = Instant::now();
    let resolved = within(prometheus, &mut panels, SEEN_WITHIN, || async {
        match alert_state(prometheus, "MultigresBackupStale", &namespace).await? {
            None => Ok(()),
            Some(state) => Err(format!("MultigresBackupStale is still {state}")),
        }
    })
    .await;
    match resolved {
        Ok(()) => println!(
            "[figure] MultigresBackupStale resolved after a schedule was set (s): {:.1}",
            scheduled.elapsed().as_secs_f64()
        ),
        Err(e) => failures.push(format!("MultigresBackupStale resolves: {e}")),
    }

    // 6. Every panel of every dashboard has drawn something by now.
    panels.sample(prometheus).await;
    if !panels.pending.is_empty() {
        let empty: Vec<String> = panels
            .pending
            .iter()
            .map(|(id, expr)| format!("{id}: {expr}"))
            .collect();
        failures.push(format!(
            "panels that never returned series:\n  {}",
            empty.join("\n  ")
        ));
    }
    assert!(
        failures.is_empty(),
        "{} failed steps:\n{}\nPrometheus log:\n{}",
        failures.len(),
        failures.join("\n"),
        prometheus.log_tail(20)
    );
}
