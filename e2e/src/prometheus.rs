//! A real Prometheus for the real-node tier, built by `e2e/toolchain/build.sh` from its Go
//! module: it scrapes the handlers as the chart's ServiceMonitor tells the Prometheus Operator
//! to (Kubernetes service discovery of the metrics Services, the same relabelling), evaluates the
//! chart's PrometheusRule, and receives the data plane's OpenTelemetry metrics on its OTLP
//! endpoint (Multigres has no `/metrics`; it pushes OTLP).
//!
//! PostgreSQL's own metrics come from the postgres_exporter of each pool pod, scraped over TLS as
//! the PodMonitor users apply (`deploy/monitoring/postgres-exporter-podmonitor.yaml`) tells the
//! Prometheus Operator to: [`Prometheus::scrape_pod_monitor`] adds it once a cluster's CA exists.
//!
//! It listens on the control plane's address, which pods reach as they reach the API server.
//! The rules are rendered by `helm template` with [`RULE_VALUES`]: the expressions as shipped,
//! shorter `for` windows so a test sees them fire within minutes (the shipped windows are
//! unit-tested by promtool in `chart.rs`).

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::cluster::LocalCluster;
use crate::harness;
use crate::http::{encode, get};
use crate::nodes::CONTROL_PLANE_IP;
use crate::process::Supervised;
use crate::real::{OPERATOR_NAMESPACE, RELEASE, operator_installed};
use crate::toolchain;

/// Prometheus's default port, below the range `crate::ports` hands out.
pub const PORT: u16 = 9090;
/// Scrape and rule evaluation interval: short, so a test waits seconds, not minutes.
pub const INTERVAL: &str = "5s";
/// The chart values the rules and the ServiceMonitor are rendered with: the scrape interval,
/// and `for` windows and a backup age short enough for a test (the chart's options a user with
/// other needs would set too).
pub const RULE_VALUES: &[&str] = &[
    "metrics.serviceMonitor.enabled=true",
    "metrics.serviceMonitor.interval=5s",
    "metrics.serviceMonitor.scrapeTimeout=4s",
    "metrics.prometheusRule.enabled=true",
    "metrics.prometheusRule.alerts.MultigresShardPrimaryLost.for=10s",
    "metrics.prometheusRule.alerts.MultigresShardPoolDegraded.for=10s",
    "metrics.prometheusRule.alerts.MultigresBackupStale.for=10s",
    "metrics.prometheusRule.backupStaleAfterSeconds=90",
    "metrics.prometheusRule.alerts.MultigresVolumeFillingUp.for=10s",
    "metrics.prometheusRule.longTransactionSeconds=20",
    "metrics.prometheusRule.alerts.MultigresPostgresLongTransaction.for=10s",
];
/// The chart values that render the ServiceMonitor and the PrometheusRule with the chart's own
/// intervals, windows and thresholds (the Prometheus `just demo` runs).
pub const CHART_DEFAULT_VALUES: &[&str] = &[
    "metrics.serviceMonitor.enabled=true",
    "metrics.prometheusRule.enabled=true",
];
/// The OTLP resource attributes kept as labels on every data-plane series (the operator sets
/// them in each container's `OTEL_RESOURCE_ATTRIBUTES`).
pub const PROMOTED_ATTRIBUTES: &[&str] = &[
    "multigres.cluster",
    "multigres.component",
    "multigres.project",
];
/// How long startup (the TSDB, the first service discovery) may take on 2 shared cores.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The running server.
#[derive(Debug)]
pub struct Prometheus {
    process: Supervised,
    /// Its configuration file, and the configuration written there.
    config_file: PathBuf,
    config: Mutex<Value>,
    /// Where CA files of PodMonitors are written.
    dir: PathBuf,
}

/// The Prometheus of this test process, started on first use (after the operator's release,
/// whose ServiceMonitor it follows) and stopped when the process exits.
#[allow(unsafe_code)] // libc calls, each under a SAFETY comment
pub async fn server() -> &'static Prometheus {
    static SERVER: tokio::sync::OnceCell<Prometheus> = tokio::sync::OnceCell::const_new();
    extern "C" fn stop() {
        if let Some(server) = SERVER.get() {
            server.process.stop(Duration::from_secs(10));
        }
    }
    SERVER
        .get_or_init(|| async {
            let cluster = operator_installed().await;
            let server = Prometheus::start(cluster, RULE_VALUES)
                .await
                .unwrap_or_else(|e| panic!("starting Prometheus: {e}"));
            // SAFETY: registers a plain `extern "C" fn()` with the C runtime; it only touches
            // a static that is initialised by then.
            unsafe {
                libc::atexit(stop);
            }
            server
        })
        .await
}

/// The chart's ServiceMonitor and PrometheusRule as `helm template` renders them with `values`.
async fn rendered_monitoring(values: &[&str]) -> (Value, Value) {
    let documents = harness::helm_template(RELEASE, OPERATOR_NAMESPACE, values).await;
    let of_kind = |kind: &str| {
        documents
            .iter()
            .find(|d| d["kind"] == kind)
            .cloned()
            .unwrap_or_else(|| panic!("the chart renders no {kind}"))
    };
    (of_kind("ServiceMonitor"), of_kind("PrometheusRule"))
}

/// The scrape configuration the Prometheus Operator generates for `monitor` (the subset of the
/// ServiceMonitor API the chart uses): endpoint slices of Services matching its selector in its
/// namespaces, the named port only, `job` from the Service's name and the target labels the
/// operator adds (`namespace`, `service`, `pod`, `container`, `endpoint`).
pub fn scrape_configs(monitor: &Value, kubeconfig: &Path) -> Vec<Value> {
    let namespace = monitor["metadata"]["namespace"]
        .as_str()
        .unwrap_or_default();
    let name = monitor["metadata"]["name"].as_str().unwrap_or_default();
    let spec = &monitor["spec"];
    let namespaces: Vec<Value> = spec["namespaceSelector"]["matchNames"]
        .as_array()
        .cloned()
        .unwrap_or_else(|| vec![json!(namespace)]);
    let mut selector: Vec<Value> = Vec::new();
    for (key, value) in spec["selector"]["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
    {
        let label = sanitize(key);
        selector.push(json!({
            "action": "keep",
            "source_labels": [format!("__meta_kubernetes_service_label_{label}"),
                              format!("__meta_kubernetes_service_labelpresent_{label}")],
            "regex": format!("({});true", regex_escape(value.as_str().unwrap_or_default())),
        }));
    }
    spec["endpoints"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(i, endpoint)| {
            let port = endpoint["port"].as_str().unwrap_or_default();
            let mut relabel = selector.clone();
            relabel.extend([
                json!({"action": "keep",
                       "source_labels": ["__meta_kubernetes_endpointslice_port_name"],
                       "regex": regex_escape(port)}),
                json!({"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"}),
                json!({"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"}),
                json!({"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"}),
                json!({"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"}),
                json!({"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job"}),
                json!({"target_label": "endpoint", "replacement": port}),
            ]);
            let mut config = json!({
                "job_name": format!("serviceMonitor/{namespace}/{name}/{i}"),
                "honor_labels": endpoint["honorLabels"].as_bool().unwrap_or(false),
                "metrics_path": endpoint["path"].as_str().unwrap_or("/metrics"),
                "kubernetes_sd_configs": [{
                    "role": "endpointslice",
                    "kubeconfig_file": kubeconfig.display().to_string(),
                    "namespaces": {"names": namespaces},
                }],
                "relabel_configs": relabel,
            });
            for (from, to) in [("interval", "scrape_interval"), ("scrapeTimeout", "scrape_timeout")] {
                if let Some(value) = endpoint[from].as_str() {
                    config[to] = json!(value);
                }
            }
            config
        })
        .collect()
}

/// The scrape configuration the Prometheus Operator generates for a PodMonitor (the subset of
/// the API `deploy/monitoring/postgres-exporter-podmonitor.yaml` uses): pods matching its
/// selector in its namespace, running (not Failed or Succeeded), the named container port only,
/// `job` `<namespace>/<name>`, the target labels the operator adds (`namespace`, `container`,
/// `pod`, `endpoint`) and then the endpoint's relabelings; TLS verified with `ca_file` (the
/// file the operator would write from the PodMonitor's CA reference).
pub fn pod_monitor_scrape_configs(
    monitor: &Value,
    kubeconfig: &Path,
    ca_file: &Path,
) -> Vec<Value> {
    let namespace = monitor["metadata"]["namespace"]
        .as_str()
        .unwrap_or_default();
    let name = monitor["metadata"]["name"].as_str().unwrap_or_default();
    let spec = &monitor["spec"];
    let mut selector: Vec<Value> = vec![json!({
        "action": "drop",
        "source_labels": ["__meta_kubernetes_pod_phase"],
        "regex": "(Failed|Succeeded)",
    })];
    for (key, value) in spec["selector"]["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
    {
        let label = sanitize(key);
        selector.push(json!({
            "action": "keep",
            "source_labels": [format!("__meta_kubernetes_pod_label_{label}"),
                              format!("__meta_kubernetes_pod_labelpresent_{label}")],
            "regex": format!("({});true", regex_escape(value.as_str().unwrap_or_default())),
        }));
    }
    spec["podMetricsEndpoints"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(i, endpoint)| {
            let port = endpoint["port"].as_str().unwrap_or_default();
            let mut relabel = selector.clone();
            relabel.extend([
                json!({"action": "keep",
                       "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                       "regex": regex_escape(port)}),
                json!({"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"}),
                json!({"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"}),
                json!({"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"}),
                json!({"target_label": "job", "replacement": format!("{namespace}/{name}")}),
                json!({"target_label": "endpoint", "replacement": port}),
            ]);
            for r in endpoint["relabelings"].as_array().into_iter().flatten() {
                let mut rule = json!({});
                for (from, to) in [
                    ("sourceLabels", "source_labels"),
                    ("targetLabel", "target_label"),
                    ("regex", "regex"),
                    ("replacement", "replacement"),
                    ("action", "action"),
                    ("separator", "separator"),
                ] {
                    if !r[from].is_null() {
                        rule[to] = r[from].clone();
                    }
                }
                relabel.push(rule);
            }
            let tls = &endpoint["tlsConfig"];
            let mut config = json!({
                "job_name": format!("podMonitor/{namespace}/{name}/{i}"),
                "honor_labels": endpoint["honorLabels"].as_bool().unwrap_or(false),
                "metrics_path": endpoint["path"].as_str().unwrap_or("/metrics"),
                "scheme": endpoint["scheme"].as_str().unwrap_or("http"),
                "kubernetes_sd_configs": [{
                    "role": "pod",
                    "kubeconfig_file": kubeconfig.display().to_string(),
                    "namespaces": {"names": [namespace]},
                }],
                "relabel_configs": relabel,
            });
            if tls.is_object() {
                config["tls_config"] = json!({"ca_file": ca_file.display().to_string()});
                if let Some(server) = tls["serverName"].as_str() {
                    config["tls_config"]["server_name"] = json!(server);
                }
            }
            for (from, to) in [("interval", "scrape_interval"), ("scrapeTimeout", "scrape_timeout")] {
                if let Some(value) = endpoint[from].as_str() {
                    config[to] = json!(value);
                }
            }
            config
        })
        .collect()
}

/// A Kubernetes label name as Prometheus's service discovery spells it in a meta label.
fn sanitize(label: &str) -> String {
    label
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// `text` with the characters RE2 treats specially escaped.
fn regex_escape(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

impl Prometheus {
    /// Starts Prometheus for `cluster`, with the chart's monitoring rendered with `values`, its
    /// data under `<state>/prometheus` and its log under `<state>/logs`; returns once it
    /// reports ready. It stops when dropped.
    pub async fn start(cluster: &LocalCluster, values: &[&str]) -> Result<Prometheus, String> {
        let dir = cluster.dir().join("prometheus");
        let logs = cluster.dir().join("logs");
        for d in [&dir, &logs] {
            std::fs::create_dir_all(d).map_err(|e| format!("creating {}: {e}", d.display()))?;
        }
        let (monitor, rule) = rendered_monitoring(values).await;
        let rules = dir.join("rules.yaml");
        write_yaml(&rules, &json!({"groups": rule["spec"]["groups"]}))?;
        let config_file = dir.join("prometheus.yaml");
        let config = json!({
            "global": {"scrape_interval": INTERVAL, "evaluation_interval": INTERVAL},
            "rule_files": [rules.display().to_string()],
            "otlp": {"promote_resource_attributes": PROMOTED_ATTRIBUTES},
            "scrape_configs": scrape_configs(&monitor, cluster.kubeconfig()),
        });
        write_yaml(&config_file, &config)?;
        let path = |p: &Path| p.display().to_string();
        let args: Vec<String> = vec![
            format!("--config.file={}", path(&config_file)),
            format!("--storage.tsdb.path={}", path(&dir.join("data"))),
            format!("--web.listen-address={CONTROL_PLANE_IP}:{PORT}"),
            "--web.enable-otlp-receiver".into(),
            "--storage.tsdb.retention.time=1d".into(),
        ];
        let program = toolchain::binary("prometheus").map_err(|e| e.to_string())?;
        let process = Supervised::spawn(
            "prometheus",
            &program,
            &args,
            &[],
            &logs.join("prometheus.log"),
        )
        .map_err(|e| e.to_string())?;
        let server = Prometheus {
            process,
            config_file,
            config: Mutex::new(config),
            dir,
        };
        let started = Instant::now();
        loop {
            let error = match get(CONTROL_PLANE_IP, PORT, "/-/ready").await {
                Ok((200, _)) => break,
                Ok((status, body)) => format!("HTTP {status}: {body}"),
                Err(e) => e,
            };
            if !server.process.is_running() || started.elapsed() > START_TIMEOUT {
                return Err(format!(
                    "not ready ({error}); log:\n{}",
                    server.process.log_tail(40)
                ));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        tracing::info!(took = ?started.elapsed(), "Prometheus ready");
        Ok(server)
    }

    /// Scrapes what PodMonitor `monitor` (as a user applies it) selects, verifying TLS with
    /// `ca_pem` (the CA its `tlsConfig` references): the Prometheus Operator's scrape
    /// configuration is added to the file and Prometheus reloads it (SIGHUP). Returns once the
    /// new configuration is in force.
    #[allow(unsafe_code)] // kill(2), under a SAFETY comment
    pub async fn scrape_pod_monitor(
        &self,
        monitor: &Value,
        ca_pem: &str,
        kubeconfig: &Path,
    ) -> Result<(), String> {
        let name = monitor["metadata"]["name"].as_str().unwrap_or("monitor");
        let namespace = monitor["metadata"]["namespace"].as_str().unwrap_or("ns");
        let ca_file = self.dir.join(format!("ca-{namespace}-{name}.crt"));
        std::fs::write(&ca_file, ca_pem)
            .map_err(|e| format!("writing {}: {e}", ca_file.display()))?;
        let jobs = pod_monitor_scrape_configs(monitor, kubeconfig, &ca_file);
        let job_names: Vec<Value> = jobs.iter().map(|j| j["job_name"].clone()).collect();
        {
            let mut config = self.config.lock().unwrap_or_else(|e| e.into_inner());
            let scrape = config["scrape_configs"]
                .as_array_mut()
                .ok_or("no scrape_configs")?;
            scrape.retain(|j| !job_names.contains(&j["job_name"]));
            scrape.extend(jobs);
            write_yaml(&self.config_file, &config)?;
        }
        let pid = libc::pid_t::try_from(self.process.pid()).map_err(|e| e.to_string())?;
        // SAFETY: kill(2) with a pid this process spawned and a plain signal number.
        if unsafe { libc::kill(pid, libc::SIGHUP) } != 0 {
            return Err(format!(
                "SIGHUP to Prometheus: {}",
                std::io::Error::last_os_error()
            ));
        }
        let started = Instant::now();
        loop {
            let pools = self
                .api("/api/v1/targets?state=active")
                .await
                .map(|d| d["activeTargets"].clone())
                .unwrap_or_default();
            let loaded = self
                .api("/api/v1/status/config")
                .await
                .ok()
                .and_then(|d| d["yaml"].as_str().map(str::to_owned))
                .unwrap_or_default();
            if job_names
                .iter()
                .all(|j| loaded.contains(j.as_str().unwrap_or_default()))
            {
                tracing::info!(targets = %pools.as_array().map_or(0, Vec::len), "Prometheus reloaded");
                return Ok(());
            }
            if started.elapsed() > START_TIMEOUT {
                return Err(format!(
                    "the reloaded configuration has no {job_names:?}; log:\n{}",
                    self.process.log_tail(20)
                ));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// The URL a data-plane pod exports OTLP metrics to (`spec.observability.otlpEndpoint`,
    /// protocol `http/protobuf`: the SDK appends `/v1/metrics`).
    pub fn otlp_endpoint(&self) -> String {
        format!("http://{CONTROL_PLANE_IP}:{PORT}/api/v1/otlp")
    }

    /// `data` of a successful answer of the HTTP API at `target`.
    async fn api(&self, target: &str) -> Result<Value, String> {
        let (status, body) = get(CONTROL_PLANE_IP, PORT, target).await?;
        let answer: Value =
            serde_json::from_str(&body).map_err(|e| format!("{target}: HTTP {status}: {e}"))?;
        match answer["status"].as_str() {
            Some("success") => Ok(answer["data"].clone()),
            _ => Err(format!("{target}: HTTP {status}: {body}")),
        }
    }

    /// The series of an instant query (its `result`).
    pub async fn query(&self, expr: &str) -> Result<Vec<Value>, String> {
        let data = self
            .api(&format!("/api/v1/query?query={}", encode(expr)))
            .await?;
        Ok(data["result"].as_array().cloned().unwrap_or_default())
    }

    /// The alerts pending or firing now (`/api/v1/alerts`).
    pub async fn alerts(&self) -> Result<Vec<Value>, String> {
        let data = self.api("/api/v1/alerts").await?;
        Ok(data["alerts"].as_array().cloned().unwrap_or_default())
    }

    /// The active scrape targets (`/api/v1/targets`).
    pub async fn targets(&self) -> Result<Vec<Value>, String> {
        let data = self.api("/api/v1/targets?state=active").await?;
        Ok(data["activeTargets"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    }

    /// The last lines of its log, for a failure message.
    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }
}

fn write_yaml(path: &Path, value: &Value) -> Result<(), String> {
    let text = serde_yaml::to_string(value).map_err(|e| format!("{}: {e}", path.display()))?;
    std::fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_service_monitor_becomes_the_scrape_config_the_prometheus_operator_writes() {
        let monitor: Value = serde_yaml::from_str(
            r#"
metadata: {name: op, namespace: system}
spec:
  selector: {matchLabels: {app.kubernetes.io/instance: op, multigres.com/metrics: "true"}}
  namespaceSelector: {matchNames: [system]}
  endpoints:
    - {port: metrics, path: /metrics, interval: 5s, scrapeTimeout: 4s, honorLabels: true}
"#,
        )
        .unwrap();
        let configs = scrape_configs(&monitor, Path::new("/k"));
        assert_eq!(configs.len(), 1);
        let config = &configs[0];
        assert_eq!(config["job_name"], "serviceMonitor/system/op/0");
        assert_eq!(config["honor_labels"], true);
        assert_eq!(config["scrape_interval"], "5s");
        assert_eq!(config["scrape_timeout"], "4s");
        assert_eq!(
            config["kubernetes_sd_configs"][0]["namespaces"]["names"],
            json!(["system"])
        );
        let relabel = config["relabel_configs"].as_array().unwrap();
        assert_eq!(
            relabel[0]["source_labels"][0],
            "__meta_kubernetes_service_label_app_kubernetes_io_instance"
        );
        assert_eq!(relabel[0]["regex"], "(op);true");
        assert_eq!(relabel[1]["regex"], "(true);true");
        assert_eq!(relabel[2]["regex"], "metrics");
        assert!(relabel.iter().any(|r| r["target_label"] == "job"
            && r["source_labels"][0] == "__meta_kubernetes_service_name"));
    }

    #[test]
    fn without_honor_labels_a_target_label_wins() {
        let monitor = json!({"metadata": {"name": "m", "namespace": "n"},
            "spec": {"endpoints": [{"port": "metrics"}]}});
        let config = &scrape_configs(&monitor, Path::new("/k"))[0];
        assert_eq!(config["honor_labels"], false);
        assert_eq!(
            config["kubernetes_sd_configs"][0]["namespaces"]["names"],
            json!(["n"])
        );
    }

    #[test]
    fn the_shipped_pod_monitor_becomes_a_tls_scrape_of_the_pool_pods() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../deploy/monitoring/postgres-exporter-podmonitor.yaml"
        ))
        .unwrap()
        .replace("CLUSTER", "shop")
        .replace("NAMESPACE", "prod");
        let monitor: Value = serde_yaml::from_str(&text).unwrap();
        let configs = pod_monitor_scrape_configs(&monitor, Path::new("/k"), Path::new("/ca"));
        assert_eq!(configs.len(), 1);
        let config = &configs[0];
        assert_eq!(
            config["job_name"],
            "podMonitor/prod/shop-postgres-exporter/0"
        );
        assert_eq!(config["scheme"], "https");
        assert_eq!(config["scrape_interval"], "30s");
        assert_eq!(
            config["tls_config"],
            json!({"ca_file": "/ca", "server_name": "postgres-exporter.shop.prod.multigres.internal"})
        );
        assert_eq!(config["kubernetes_sd_configs"][0]["role"], "pod");
        let relabel = config["relabel_configs"].as_array().unwrap();
        assert_eq!(relabel[0]["action"], "drop");
        assert!(relabel.iter().any(|r| r["source_labels"][0]
            == "__meta_kubernetes_pod_label_multigres_com_cluster"
            && r["regex"] == "(shop);true"));
        assert!(relabel.iter().any(|r| r["source_labels"][0]
            == "__meta_kubernetes_pod_container_port_name"
            && r["regex"] == "pg-metrics"));
        assert!(relabel.iter().any(
            |r| r["target_label"] == "job" && r["replacement"] == "prod/shop-postgres-exporter"
        ));
        let last = relabel.last().unwrap();
        assert_eq!(last["target_label"], "role");
        assert_eq!(
            last["source_labels"][0],
            "__meta_kubernetes_pod_label_multigres_com_role"
        );
    }

    #[test]
    fn regex_metacharacters_are_escaped() {
        assert_eq!(regex_escape("a.b+c"), r"a\.b\+c");
    }
}
