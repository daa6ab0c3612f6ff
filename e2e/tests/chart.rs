//! The Helm chart `deploy/helm/multigres-operator`, for real.
//!
//! Without a cluster: `helm lint` passes, `helm template` renders every option, the rendered
//! RBAC is exactly the handlers' own role files, the webhooks are the webhook-server's
//! registrations, every alert has a runbook, and alerts and dashboards use only documented
//! metrics. promtool (Prometheus's own) checks the rendered alerts and runs their unit tests
//! (`tests/alerts_test.yaml`), which make every alert fire and stay quiet.
//!
//! Against the real local control plane: `helm install` (which creates the CRDs from the
//! chart) and `helm upgrade` succeed. kwok runs the chart's pods as fakes, so each handler runs
//! as a local process with the container arguments of its Deployment and a token of the chart's
//! ServiceAccount: every handler becomes ready and reconciles under the chart's RBAC, also
//! through volume growth, a scale-down, a restart-class rollout and the cluster's deletion, a rule
//! removed from it makes its handler fail (and `helm upgrade` puts it back), killing the leader
//! of two replicas hands over and reconciling continues, and each handler's `/metrics` exposes
//! the names `docs/observability.md` documents.
//!
//! The chart registers its webhooks by URL on loopback (`webhook.url`), served by a
//! webhook-server process started with the release, so every multigres.com write in these
//! tests goes through the chart's admission webhooks.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Secret};
use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, DynamicObject, ListParams, PostParams, WatchParams};
use kube::{Api, Client};
use multigres_api::v1alpha1::{Cell, MultigresCluster, Shard, TableGroup};
use multigres_e2e::cluster::LocalCluster;
use multigres_e2e::harness::{
    self, HANDLERS, eventually, fresh_namespace, repo_path, yaml_documents,
};
use multigres_e2e::manifest::{self, Mode};
use multigres_e2e::process::Supervised;
use multigres_proto::operator::v1::handler_info_client::HandlerInfoClient;
use multigres_proto::operator::v1::{GetInfoRequest, GetInfoResponse, LeaderState};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

const RELEASE: &str = "multigres-operator";
const NAMESPACE: &str = "multigres-system";
const CONTROLLERS: [&str; 3] = ["cluster-handler", "resource-handler", "data-handler"];
/// Bound for anything that normally takes a few seconds.
const WAIT: Duration = Duration::from_secs(60);
/// Leader election of the installed release: a killed leader is replaced within seconds.
const LEASE_VALUES: [&str; 3] = [
    "leaderElection.leaseDuration=4s",
    "leaderElection.renewDeadline=3s",
    "leaderElection.retryPeriod=500ms",
];

fn chart_dir() -> PathBuf {
    repo_path("deploy/helm/multigres-operator")
}

// ---------------------------------------------------------------------------------------------
// helm

/// Values that switch every optional part of the chart on.
const ALL_OPTIONS: [&str; 10] = [
    "webhook.certificate.mode=cert-manager",
    "webhook.url=https://127.0.0.1:9443",
    "metrics.serviceMonitor.enabled=true",
    "metrics.prometheusRule.enabled=true",
    "metrics.prometheusRule.runbookBaseUrl=https://runbooks.example/multigres",
    "metrics.grafanaDashboards.enabled=true",
    "tracing.otlpEndpoint=http://otel-collector.observability:4317",
    "tracing.sampler=parentbased_traceidratio",
    "tracing.samplerArg=0.25",
    "clusterHandler.replicas=1",
];

/// `helm template` of the chart with `sets`, as parsed documents.
async fn render(sets: &[&str]) -> Vec<Value> {
    harness::helm_template(RELEASE, NAMESPACE, sets).await
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

fn named<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} rendered"))
}

#[tokio::test]
async fn the_chart_lints_and_renders_every_option() {
    let chart = chart_dir();
    let chart = chart.to_str().expect("utf-8 path");
    let lint = harness::helm(&["lint", "--strict", chart], None).await;
    assert!(lint.contains("0 chart(s) failed"), "{lint}");
    let mut all = vec!["lint", "--strict", chart];
    for set in ALL_OPTIONS {
        all.extend(["--set", set]);
    }
    let lint = harness::helm(&all, None).await;
    assert!(lint.contains("0 chart(s) failed"), "{lint}");

    let docs = render(&[]).await;
    let deployments = of_kind(&docs, "Deployment");
    assert_eq!(deployments.len(), 4);
    for (handler, (grpc, metrics)) in
        HANDLERS
            .iter()
            .zip([(9441, 8081), (9442, 8082), (9443, 8083), (9444, 8084)])
    {
        let name = format!("{RELEASE}-{handler}");
        let deployment = named(&docs, "Deployment", &name);
        let pod = &deployment["spec"]["template"]["spec"];
        assert_eq!(pod["serviceAccountName"], name.as_str());
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
        assert_eq!(
            pod["securityContext"]["seccompProfile"]["type"],
            "RuntimeDefault"
        );
        let container = &pod["containers"][0];
        assert_eq!(
            container["command"][0],
            format!("/usr/local/bin/{handler}").as_str()
        );
        let security = &container["securityContext"];
        assert_eq!(security["readOnlyRootFilesystem"], true, "{handler}");
        assert_eq!(security["allowPrivilegeEscalation"], false, "{handler}");
        assert_eq!(security["capabilities"]["drop"][0], "ALL", "{handler}");
        for probe in ["startupProbe", "livenessProbe", "readinessProbe"] {
            assert_eq!(container[probe]["grpc"]["port"], grpc, "{handler} {probe}");
        }
        let args: Vec<&str> = container["args"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert!(args.contains(&format!("--grpc-bind-address=:{grpc}").as_str()));
        assert!(args.contains(&format!("--metrics-bind-address=:{metrics}").as_str()));
        let ports: BTreeMap<&str, i64> = container["ports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                (
                    p["name"].as_str().unwrap(),
                    p["containerPort"].as_i64().unwrap(),
                )
            })
            .collect();
        assert_eq!(ports["grpc"], grpc);
        assert_eq!(ports["metrics"], metrics);
        named(&docs, "ServiceAccount", &name);
        named(&docs, "PodDisruptionBudget", &name);
        named(&docs, "Service", &format!("{name}-metrics"));
        if CONTROLLERS.contains(handler) {
            assert!(args.contains(&"--leader-elect=true"), "{args:?}");
            assert!(args.contains(&format!("--leader-election-id={name}").as_str()));
        }
    }
    named(&docs, "Service", &format!("{RELEASE}-webhook-service"));
    for kind in [
        "ServiceMonitor",
        "PrometheusRule",
        "Certificate",
        "Issuer",
        "ConfigMap",
    ] {
        assert!(
            of_kind(&docs, kind).is_empty(),
            "{kind} rendered by default"
        );
    }
    let crds = harness::helm(
        &[
            "template",
            RELEASE,
            chart,
            "--include-crds",
            "--kube-version",
            "1.36.0",
        ],
        None,
    )
    .await;
    let crds = of_kind(&yaml_documents(&crds), "CustomResourceDefinition").len();
    assert_eq!(crds, 8, "CRDs shipped in crds/");

    let docs = render(&ALL_OPTIONS).await;
    assert_eq!(of_kind(&docs, "ServiceMonitor").len(), 1);
    let rule = &of_kind(&docs, "PrometheusRule")[0];
    let rules: Vec<&Value> = rule["spec"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .collect();
    assert_eq!(rules.len(), alerts().len());
    for rule in rules {
        let alert = rule["alert"].as_str().unwrap();
        assert_eq!(
            rule["annotations"]["runbook_url"],
            format!("https://runbooks.example/multigres/{alert}.md").as_str()
        );
    }
    let dashboards = &of_kind(&docs, "ConfigMap")[0]["data"];
    for file in [
        "operator.json",
        "clusters.json",
        "data-plane.json",
        "postgresql.json",
    ] {
        let json: Value = serde_json::from_str(dashboards[file].as_str().unwrap()).unwrap();
        assert!(json["uid"].is_string(), "{file}");
    }
    let certificate = &of_kind(&docs, "Certificate")[0];
    let webhook = named(&docs, "Deployment", &format!("{RELEASE}-webhook-server"));
    let pod = &webhook["spec"]["template"]["spec"];
    assert_eq!(
        pod["volumes"][0]["secret"]["secretName"],
        certificate["spec"]["secretName"]
    );
    assert_eq!(
        pod["containers"][0]["volumeMounts"][0]["mountPath"],
        "/var/run/secrets/webhook"
    );
    let validating = &of_kind(&docs, "ValidatingWebhookConfiguration")[0];
    assert_eq!(
        validating["webhooks"][0]["clientConfig"]["url"],
        "https://127.0.0.1:9443/validate-multigres-com-v1alpha1-multigrescluster"
    );
    assert!(validating["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].is_string());
    let env = pod["containers"][0]["env"].as_array().unwrap();
    assert!(
        env.iter()
            .any(|e| e["name"] == "OTEL_EXPORTER_OTLP_ENDPOINT"
                && e["value"] == "http://otel-collector.observability:4317"),
        "{env:?}"
    );
    assert!(
        of_kind(&docs, "PodDisruptionBudget")
            .iter()
            .all(|pdb| pdb["metadata"]["name"] != format!("{RELEASE}-cluster-handler").as_str())
    );
}

#[tokio::test]
async fn values_the_schema_refuses_fail_before_rendering() {
    let chart = chart_dir();
    let chart = chart.to_str().expect("utf-8 path");
    for (set, complaint) in [
        (
            "webhook.failurPolicy=Fail",
            "additional properties 'failurPolicy' not allowed",
        ),
        ("webhook.failurePolicy=Sometimes", "/webhook/failurePolicy"),
        (
            "webhook.certificate.mode=vault",
            "/webhook/certificate/mode",
        ),
        ("logFormat=xml", "/logFormat"),
        (
            "leaderElection.leaseDuration=15",
            "/leaderElection/leaseDuration",
        ),
        ("webhook.url=http://127.0.0.1:9443", "/webhook/url"),
        ("clusterHandler.grpcPort=70000", "/clusterHandler"),
    ] {
        let (ok, _, stderr) = harness::run_helm(
            &[
                "template",
                RELEASE,
                chart,
                "--kube-version",
                "1.36.0",
                "--set",
                set,
            ],
            None,
        )
        .await;
        assert!(!ok, "{set} was accepted");
        assert!(stderr.contains(complaint), "{set}: {stderr}");
    }
}

/// The role documents of a handler's own RBAC file.
fn source_roles(handler: &str) -> Vec<Value> {
    let path = if handler == "webhook-server" {
        repo_path("deploy/webhook/rbac.yaml")
    } else {
        repo_path(&format!("deploy/rbac/{handler}.yaml"))
    };
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    yaml_documents(&text)
}

#[tokio::test]
async fn the_chart_rbac_is_exactly_the_handlers_own_role_files() {
    let docs = render(&[]).await;
    for handler in HANDLERS {
        let account = format!("{RELEASE}-{handler}");
        let roles = source_roles(handler);
        assert!(!roles.is_empty(), "{handler} has no roles");
        for role in &roles {
            let name = role["metadata"]["name"].as_str().unwrap();
            let kind = role["kind"].as_str().unwrap();
            let rendered = named(&docs, kind, name);
            assert_eq!(rendered["rules"], role["rules"], "{handler}: {name}");
            let cluster_wide = name == account;
            let binding_kind = if cluster_wide {
                "ClusterRoleBinding"
            } else {
                "RoleBinding"
            };
            let binding = named(&docs, binding_kind, name);
            assert_eq!(binding["roleRef"]["name"], name);
            assert_eq!(binding["roleRef"]["kind"], kind);
            assert_eq!(binding["subjects"][0]["name"], account.as_str());
            assert_eq!(binding["subjects"][0]["namespace"], NAMESPACE);
            if !cluster_wide {
                assert_eq!(binding["metadata"]["namespace"], NAMESPACE, "{name}");
            }
        }
        assert!(
            roles
                .iter()
                .any(|r| r["metadata"]["name"] == account.as_str()),
            "{handler}: no role named {account}"
        );
    }
    let bound: BTreeSet<&str> = of_kind(&docs, "ClusterRoleBinding")
        .into_iter()
        .chain(of_kind(&docs, "RoleBinding"))
        .map(|b| b["roleRef"]["name"].as_str().unwrap())
        .collect();
    let rendered: BTreeSet<&str> = of_kind(&docs, "ClusterRole")
        .into_iter()
        .chain(of_kind(&docs, "Role"))
        .map(|r| r["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        bound, rendered,
        "every rendered role is bound, and only those"
    );
}

/// The parts of a webhook that decide what is called and how.
fn webhook_summary(webhook: &Value) -> Value {
    let path = webhook["clientConfig"]["service"]["path"].clone();
    let mut rules = webhook["rules"].clone();
    for rule in rules.as_array_mut().unwrap() {
        rule.as_object_mut().unwrap().remove("scope");
    }
    serde_json::json!({
        "name": webhook["name"],
        "path": path,
        "rules": rules,
        "failurePolicy": webhook["failurePolicy"],
        "sideEffects": webhook["sideEffects"],
        "admissionReviewVersions": webhook["admissionReviewVersions"],
        "reinvocationPolicy": webhook["reinvocationPolicy"],
    })
}

#[tokio::test]
async fn the_chart_registers_the_webhook_servers_own_webhooks() {
    let docs = render(&[]).await;
    let shipped = std::fs::read_to_string(repo_path("deploy/webhook/webhook-configurations.yaml"))
        .expect("the webhook-server's registrations");
    let shipped = yaml_documents(&shipped);
    for kind in [
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ] {
        let expected = of_kind(&shipped, kind)[0];
        let rendered = of_kind(&docs, kind)[0];
        assert_eq!(rendered["metadata"]["name"], expected["metadata"]["name"]);
        let summarize = |config: &Value| -> Vec<Value> {
            config["webhooks"]
                .as_array()
                .unwrap()
                .iter()
                .map(webhook_summary)
                .collect()
        };
        assert_eq!(summarize(rendered), summarize(expected), "{kind}");
        for webhook in rendered["webhooks"].as_array().unwrap() {
            assert_eq!(
                webhook["clientConfig"]["service"]["name"],
                format!("{RELEASE}-webhook-service").as_str()
            );
            assert_eq!(webhook["clientConfig"]["service"]["namespace"], NAMESPACE);
            assert!(webhook["clientConfig"].get("caBundle").is_none());
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Alerts, runbooks, dashboards, documented metrics

/// A row of the metrics table in docs/observability.md.
#[derive(Debug)]
struct DocumentedMetric {
    name: String,
    handlers: Vec<String>,
    /// Appears only once something happened (a first error).
    on_first_event: bool,
}

fn documented_metrics() -> Vec<DocumentedMetric> {
    let text = std::fs::read_to_string(repo_path("docs/observability.md")).unwrap();
    let rows: Vec<DocumentedMetric> = text
        .lines()
        .filter(|line| line.starts_with("| `multigres_operator_"))
        .map(|line| {
            let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
            let handlers = match cells[3] {
                "every handler" => HANDLERS.iter().map(|h| (*h).to_owned()).collect(),
                list => list.split(',').map(|h| h.trim().to_owned()).collect(),
            };
            DocumentedMetric {
                name: cells[0].trim_matches('`').to_owned(),
                handlers,
                on_first_event: cells[1].contains("on first event"),
            }
        })
        .collect();
    assert!(rows.len() >= 13, "metrics table not found: {rows:?}");
    for row in &rows {
        for handler in &row.handlers {
            assert!(HANDLERS.contains(&handler.as_str()), "{row:?}");
        }
    }
    rows
}

/// Metric names a PromQL expression uses, histogram series mapped to their family.
fn metric_names(expr: &str) -> BTreeSet<String> {
    names_with_prefix(expr, "multigres_operator_")
        .into_iter()
        .map(|name| {
            ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix))
                .filter(|family| family.ends_with("_seconds"))
                .map_or_else(|| name.clone(), str::to_owned)
        })
        .collect()
}

/// The identifiers of `expr` that start with `prefix` (not in the middle of another name).
fn names_with_prefix(expr: &str, prefix: &str) -> BTreeSet<String> {
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut names = BTreeSet::new();
    let mut at = 0;
    while let Some(found) = expr[at..].find(prefix) {
        let start = at + found;
        let tail = &expr[start..];
        let end = tail.find(|c: char| !is_name(c)).unwrap_or(tail.len());
        if !expr[..start].ends_with(is_name) {
            names.insert(tail[..end].to_owned());
        }
        at = start + end.max(1);
    }
    names
}

/// postgres_exporter's metric names an expression uses (PostgreSQL's own statistics).
fn exporter_metric_names(expr: &str) -> BTreeSet<String> {
    names_with_prefix(expr, "pg_")
}

/// postgres_exporter's metrics the dashboards and alerts may use: the rows of the table in
/// docs/images-and-observability.md (whether they arrive is checked against a live Prometheus
/// in observability.rs).
fn documented_exporter_metrics() -> BTreeSet<String> {
    let text = std::fs::read_to_string(repo_path("docs/images-and-observability.md")).unwrap();
    let rows: BTreeSet<String> = text
        .lines()
        .filter(|line| line.starts_with("| `pg_"))
        .filter_map(|line| line.split('`').nth(1).map(str::to_owned))
        .collect();
    assert!(
        rows.len() >= 10,
        "exporter metrics table not found: {rows:?}"
    );
    rows
}

/// (alert name, expression) of files/alerts.yaml.
fn alerts() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(chart_dir().join("files/alerts.yaml")).unwrap();
    let doc: Value = serde_yaml::from_str(&text).unwrap();
    doc["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .map(|r| {
            (
                r["alert"].as_str().unwrap().to_owned(),
                r["expr"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[test]
fn every_alert_has_a_runbook_and_uses_documented_metrics() {
    let documented: BTreeSet<String> = documented_metrics().into_iter().map(|m| m.name).collect();
    let exporter = documented_exporter_metrics();
    let index = std::fs::read_to_string(repo_path("docs/runbooks/README.md")).unwrap();
    let alerts = alerts();
    assert!(alerts.len() >= 7, "{alerts:?}");
    for (alert, expr) in &alerts {
        let path = repo_path(&format!("docs/runbooks/{alert}.md"));
        let runbook = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{alert} has no runbook at {}: {e}", path.display()));
        assert!(runbook.starts_with(&format!("# {alert}\n")), "{alert}");
        for section in ["## Meaning", "## Impact", "## Diagnosis", "## Mitigation"] {
            assert!(runbook.contains(section), "{alert} runbook lacks {section}");
        }
        assert!(
            index.contains(&format!("[{alert}]({alert}.md)")),
            "{alert} not indexed"
        );
        let used = metric_names(expr);
        let from_exporter = exporter_metric_names(expr);
        assert!(
            !used.is_empty() || !from_exporter.is_empty(),
            "{alert}: {expr}"
        );
        for name in used {
            assert!(
                documented.contains(&name),
                "{alert} uses undocumented {name}"
            );
        }
        for name in from_exporter {
            assert!(
                exporter.contains(&name),
                "{alert} uses {name}, not in the exporter metrics of docs/images-and-observability.md"
            );
        }
    }
}

/// The promtool unit tests of the alerts, beside the chart (not packaged: `.helmignore`).
const ALERT_TESTS: &str = "deploy/helm/multigres-operator/tests/alerts_test.yaml";

/// Runs the toolchain's promtool with `args` in `dir`: whether it succeeded, and what it printed.
async fn promtool(dir: &std::path::Path, args: &[&str]) -> (bool, String) {
    let program = multigres_e2e::toolchain::binary("promtool").unwrap_or_else(|e| panic!("{e}"));
    let out = tokio::process::Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .await
        .expect("run promtool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Prometheus checks the rules as the chart renders them (the PrometheusRule's `spec.groups` as a
/// rule file), and every unit test of tests/alerts_test.yaml passes against them.
#[tokio::test]
async fn promtool_accepts_the_rendered_rules_and_their_unit_tests_pass() {
    let docs = render(&["metrics.prometheusRule.enabled=true"]).await;
    let rule = *of_kind(&docs, "PrometheusRule")
        .first()
        .expect("metrics.prometheusRule.enabled=true renders a PrometheusRule");
    let rules = serde_yaml::to_string(&serde_json::json!({ "groups": rule["spec"]["groups"] }))
        .expect("rule file");
    let dir = tempfile::Builder::new()
        .prefix("multigres-promtool-")
        .tempdir()
        .expect("temporary directory");
    std::fs::write(dir.path().join("alerts.rules.yaml"), rules).expect("write the rule file");
    std::fs::copy(repo_path(ALERT_TESTS), dir.path().join("alerts_test.yaml"))
        .expect("copy the alert tests");

    let (ok, out) = promtool(
        dir.path(),
        &[
            "check",
            "rules",
            "--lint=all",
            "--lint-fatal",
            "alerts.rules.yaml",
        ],
    )
    .await;
    assert!(
        ok,
        "promtool check rules rejects the rendered alerts:\n{out}"
    );
    let found = format!("SUCCESS: {} rules found", alerts().len());
    assert!(out.contains(&found), "expected {found:?}:\n{out}");

    let (ok, out) = promtool(dir.path(), &["test", "rules", "alerts_test.yaml"]).await;
    assert!(
        ok,
        "promtool test rules: a unit test in {ALERT_TESTS} fails:\n{out}"
    );
    assert!(out.contains("SUCCESS"), "{out}");
}

/// Every alert is unit-tested both ways: an evaluation where it fires and one where it must not
/// (`exp_alerts` empty), so a rule that always or never fires cannot pass.
#[test]
fn every_alert_has_a_firing_and_a_quiet_unit_test() {
    let text = std::fs::read_to_string(repo_path(ALERT_TESTS)).unwrap();
    let doc: Value = serde_yaml::from_str(&text).unwrap();
    let mut firing = BTreeSet::new();
    let mut quiet = BTreeSet::new();
    for test in doc["tests"].as_array().expect("tests") {
        for case in test["alert_rule_test"].as_array().into_iter().flatten() {
            let alert = case["alertname"].as_str().expect("alertname").to_owned();
            match case["exp_alerts"].as_array() {
                Some(expected) if !expected.is_empty() => firing.insert(alert),
                _ => quiet.insert(alert),
            };
        }
    }
    for (alert, _) in alerts() {
        assert!(
            firing.contains(&alert),
            "{alert}: no unit test where it fires in {ALERT_TESTS}; add one"
        );
        assert!(
            quiet.contains(&alert),
            "{alert}: no unit test where it must not fire in {ALERT_TESTS}; add one"
        );
    }
}

#[test]
fn dashboards_use_only_documented_metrics() {
    let documented: BTreeSet<String> = documented_metrics().into_iter().map(|m| m.name).collect();
    let exporter = documented_exporter_metrics();
    let mut uids = BTreeSet::new();
    for file in [
        "operator.json",
        "clusters.json",
        "data-plane.json",
        "postgresql.json",
    ] {
        let path = repo_path(&format!("deploy/dashboards/{file}"));
        let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(uids.insert(dashboard["uid"].as_str().unwrap().to_owned()));
        let mut exprs = 0;
        for panel in dashboard["panels"].as_array().unwrap() {
            for target in panel["targets"].as_array().into_iter().flatten() {
                let expr = target["expr"].as_str().unwrap();
                exprs += 1;
                let used = metric_names(expr);
                let from_exporter = exporter_metric_names(expr);
                // The data plane's own series (OTLP from the Multigres processes) are checked
                // against a live Prometheus in observability.rs.
                assert!(
                    !used.is_empty() || !from_exporter.is_empty() || file == "data-plane.json",
                    "{file}: {expr}"
                );
                for name in from_exporter {
                    assert!(
                        exporter.contains(&name),
                        "{file} uses {name}, not in docs/images-and-observability.md"
                    );
                }
                for name in used {
                    assert!(
                        documented.contains(&name),
                        "{file} uses undocumented {name}"
                    );
                }
            }
        }
        assert!(exprs >= 8, "{file} has {exprs} queries");
    }
}

// ---------------------------------------------------------------------------------------------
// The installed release

/// A handler process started from its Deployment, as its ServiceAccount.
struct Handler {
    name: &'static str,
    /// Declared before the log directory so the process stops before its log is removed.
    process: Supervised,
    _log_dir: tempfile::TempDir,
    grpc: SocketAddr,
    metrics: SocketAddr,
}

/// The release, installed once per test process, and the webhook-server serving its webhooks.
struct Release {
    cluster: &'static LocalCluster,
    webhook_port: u16,
    webhook: Handler,
}

/// Tests that use the release run one at a time: they share its ServiceAccounts, Leases and
/// roles, and some change them.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn release() -> &'static Release {
    static RELEASE_ONCE: tokio::sync::OnceCell<Release> = tokio::sync::OnceCell::const_new();
    RELEASE_ONCE.get_or_init(install).await
}

/// `helm install` with the webhooks on loopback and short Leases, then the webhook-server.
async fn install() -> Release {
    // A control plane without the harness's CRDs: `helm install` creates them from the chart.
    let cluster = LocalCluster::shared_without_crds()
        .await
        .unwrap_or_else(|e| panic!("starting the local control plane: {e}"));
    let webhook_port = multigres_e2e::ports::free_loopback_port().expect("a free loopback port");
    let url = format!("webhook.url=https://127.0.0.1:{webhook_port}");
    let chart = chart_dir();
    let mut args = vec![
        "install",
        RELEASE,
        chart.to_str().unwrap(),
        "--namespace",
        NAMESPACE,
        "--create-namespace",
        "--wait",
        "--timeout",
        "5m",
        "--set",
        &url,
        "--set-json",
        r#"webhookServer.extraArgs=["--webhook-extra-sans=127.0.0.1"]"#,
    ];
    for set in LEASE_VALUES {
        args.extend(["--set", set]);
    }
    let out = harness::helm(&args, Some(cluster.kubeconfig())).await;
    assert!(out.contains("STATUS: deployed"), "{out}");
    let webhook = Handler::start(cluster, "webhook-server", webhook_port, &[]).await;
    webhook.wait_info("certificate loaded", |i| i.serving).await;
    Release {
        cluster,
        webhook_port,
        webhook,
    }
}

/// Reads the JSON log until the "servers listening" line and returns the bound addresses.
fn listening_addrs(log: &str) -> Option<(SocketAddr, SocketAddr)> {
    log.lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|entry| entry["message"] == "servers listening")
        .map(|entry| {
            let addr = |field: &str| {
                entry[field]
                    .as_str()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or_else(|| panic!("bad {field} in {entry}"))
            };
            (addr("grpc_addr"), addr("metrics_addr"))
        })
}

/// The container arguments of the release's Deployment for `handler`, with its listen
/// addresses moved to loopback (`webhook_port` for the admission server).
async fn deployment_args(client: &Client, handler: &str, webhook_port: u16) -> Vec<String> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NAMESPACE);
    let deployment = deployments
        .get(&format!("{RELEASE}-{handler}"))
        .await
        .unwrap_or_else(|e| panic!("reading the {handler} Deployment: {e}"));
    let container = deployment
        .spec
        .and_then(|s| s.template.spec)
        .map(|s| s.containers)
        .and_then(|c| c.into_iter().next())
        .expect("a container");
    assert_eq!(
        container.command.as_deref(),
        Some(&[format!("/usr/local/bin/{handler}")][..])
    );
    container
        .args
        .unwrap_or_default()
        .into_iter()
        .map(|arg| {
            let flag = arg.split('=').next().unwrap_or_default();
            match flag {
                "--grpc-bind-address" | "--metrics-bind-address" => {
                    format!("{flag}=127.0.0.1:0")
                }
                "--webhook-bind-address" => format!("{flag}=127.0.0.1:{webhook_port}"),
                _ => arg,
            }
        })
        .collect()
}

impl Handler {
    /// Starts `name` with its Deployment's arguments and a token of its ServiceAccount.
    async fn start(
        cluster: &LocalCluster,
        name: &'static str,
        webhook_port: u16,
        extra_env: &[(&str, &str)],
    ) -> Handler {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let admin = cluster.client().unwrap();
        let kubeconfig = cluster
            .service_account_kubeconfig(
                NAMESPACE,
                &format!("{RELEASE}-{name}"),
                Duration::from_secs(3600),
            )
            .await
            .unwrap_or_else(|e| panic!("a token for {name}: {e}"));
        let mut args = deployment_args(&admin, name, webhook_port).await;
        args.push(format!("--kubeconfig={}", kubeconfig.display()));
        let log_dir = tempfile::Builder::new()
            .prefix(&format!("multigres-chart-{name}-"))
            .tempdir()
            .unwrap();
        let log = log_dir.path().join(format!("{name}.log"));
        let pod = format!("{name}-local-{}", NEXT.fetch_add(1, Ordering::Relaxed));
        let mut env = vec![("POD_NAMESPACE", NAMESPACE), ("POD_NAME", pod.as_str())];
        env.extend_from_slice(extra_env);
        let process = Supervised::spawn(name, &harness::handler_binary(name), &args, &env, &log)
            .unwrap_or_else(|e| panic!("starting {name}: {e}"));
        let (grpc, metrics) = eventually(&format!("{name} listens"), WAIT, || async {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if let Some(status) = process.exit_status() {
                panic!("{name} exited early ({status}):\n{text}");
            }
            listening_addrs(&text).ok_or(text)
        })
        .await;
        Handler {
            name,
            process,
            _log_dir: log_dir,
            grpc,
            metrics,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.process.log_path()).unwrap_or_default()
    }

    async fn channel(&self) -> Channel {
        Channel::from_shared(format!("http://{}", self.grpc))
            .expect("endpoint")
            .connect()
            .await
            .unwrap_or_else(|e| panic!("{} gRPC at {}: {e}\n{}", self.name, self.grpc, self.log()))
    }

    async fn health(&self) -> ServingStatus {
        HealthClient::new(self.channel().await)
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .unwrap_or_else(|e| panic!("{} health: {e}", self.name))
            .into_inner()
            .status()
    }

    async fn info(&self) -> GetInfoResponse {
        HandlerInfoClient::new(self.channel().await)
            .get_info(GetInfoRequest {})
            .await
            .unwrap_or_else(|e| panic!("{} HandlerInfo: {e}", self.name))
            .into_inner()
    }

    /// Polls HandlerInfo until `done` holds.
    async fn wait_info(
        &self,
        what: &str,
        done: impl Fn(&GetInfoResponse) -> bool,
    ) -> GetInfoResponse {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = self.process.exit_status() {
                panic!(
                    "{} exited ({status}) waiting for {what}:\n{}",
                    self.name,
                    self.log()
                );
            }
            let info = self.info().await;
            if done(&info) {
                return info;
            }
            assert!(
                Instant::now() < deadline,
                "{}: {what} not reached; last HandlerInfo {info:?}\n{}",
                self.name,
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn metrics(&self) -> String {
        let mut stream = TcpStream::connect(self.metrics)
            .await
            .expect("metrics connect");
        let request = format!(
            "GET /metrics HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            self.metrics
        );
        stream
            .write_all(request.as_bytes())
            .await
            .expect("metrics request");
        let mut response = String::new();
        stream
            .read_to_string(&mut response)
            .await
            .expect("metrics response");
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        response
    }

    #[allow(unsafe_code)] // libc calls, each under a SAFETY comment
    fn kill(&self) {
        let pid = libc::pid_t::try_from(self.process.pid()).expect("pid fits pid_t");
        // SAFETY: kill(2) only sends a signal to our own child; no memory is involved.
        let rc = unsafe { libc::kill(pid, libc::SIGKILL) };
        assert_eq!(rc, 0, "killing {}", self.name);
    }

    /// SIGTERM (releasing a held Lease), then waits for the exit.
    fn stop(&self) {
        self.process.stop(Duration::from_secs(20));
    }

    /// Whether the log reports an authorization failure from the API server.
    fn forbidden(&self) -> bool {
        self.log().to_lowercase().contains("forbidden")
    }
}

impl Drop for Handler {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Applies `deploy/samples/minimal.yaml` into `namespace`, its cluster named `name`; every
/// document goes through the chart's webhooks.
async fn apply_minimal(client: &Client, namespace: &str, name: &str) {
    let path = repo_path("deploy/samples/minimal.yaml");
    for mut doc in manifest::read_documents(&path).unwrap() {
        if doc
            .types
            .as_ref()
            .is_some_and(|t| t.kind == "MultigresCluster")
        {
            doc.metadata.name = Some(name.to_owned());
        }
        manifest::apply(client, &doc, Some(namespace), Mode::Apply)
            .await
            .unwrap_or_else(|e| panic!("applying {}: {e}", path.display()));
    }
}

/// Names of the objects of kind `K` in `namespace`.
async fn names<K>(client: &Client, namespace: &str) -> Vec<String>
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    api.list(&ListParams::default())
        .await
        .map(|list| {
            list.items
                .iter()
                .filter_map(|o| o.meta().name.clone())
                .collect()
        })
        .unwrap_or_default()
}

/// Starts the three controllers from the release and waits until each leads and serves.
async fn start_controllers(release: &Release) -> Vec<Handler> {
    let mut controllers = Vec::new();
    for name in CONTROLLERS {
        let handler = Handler::start(release.cluster, name, release.webhook_port, &[]).await;
        handler
            .wait_info("leading and serving", |i| {
                i.leader_state() == LeaderState::Leader && i.serving
            })
            .await;
        controllers.push(handler);
    }
    controllers
}

#[tokio::test]
async fn helm_install_and_upgrade_succeed() {
    let release = release().await;
    let _serial = SERIAL.lock().await;
    let client = release.cluster.client().unwrap();
    let kubeconfig = release.cluster.kubeconfig();

    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for file in manifest::yaml_files(&repo_path("deploy/crds")).unwrap() {
        let name = file.file_stem().unwrap().to_str().unwrap().to_owned();
        let crd = crds
            .get(&name)
            .await
            .unwrap_or_else(|e| panic!("CRD {name}: {e}"));
        let labels = crd.metadata.labels.unwrap_or_default();
        assert!(
            !labels.contains_key("app.kubernetes.io/managed-by"),
            "{name}: CRDs come from crds/, outside the release, so uninstall keeps them"
        );
    }
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NAMESPACE);
    for handler in HANDLERS {
        let deployment = deployments
            .get(&format!("{RELEASE}-{handler}"))
            .await
            .unwrap();
        let status = deployment.status.unwrap_or_default();
        assert_eq!(status.ready_replicas, Some(2), "{handler}: {status:?}");
    }
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let ca_bundle = |config: MutatingWebhookConfiguration| {
        config.webhooks.unwrap_or_default()[0]
            .client_config
            .ca_bundle
            .clone()
    };
    let before = ca_bundle(
        mutating
            .get("multigres-operator-mutating-webhook-configuration")
            .await
            .unwrap(),
    );
    assert!(before.is_some(), "the webhook-server set the caBundle");

    let chart = chart_dir();
    let out = harness::helm(
        &[
            "upgrade",
            RELEASE,
            chart.to_str().unwrap(),
            "--namespace",
            NAMESPACE,
            "--reuse-values",
            "--set",
            "dataHandler.replicas=3",
            "--wait",
            "--timeout",
            "5m",
        ],
        Some(kubeconfig),
    )
    .await;
    assert!(out.contains("STATUS: deployed"), "{out}");
    let history = harness::helm(
        &["history", RELEASE, "--namespace", NAMESPACE, "-o", "json"],
        Some(kubeconfig),
    )
    .await;
    let history: Vec<Value> = serde_json::from_str(&history).unwrap();
    assert_eq!(history.last().unwrap()["status"], "deployed");
    assert!(history.len() >= 2, "{history:?}");
    let data = deployments
        .get(&format!("{RELEASE}-data-handler"))
        .await
        .unwrap();
    assert_eq!(data.spec.unwrap().replicas, Some(3));
    eventually("the third data-handler replica is ready", WAIT, || async {
        let status = deployments
            .get(&format!("{RELEASE}-data-handler"))
            .await
            .map_err(|e| e.to_string())?
            .status
            .unwrap_or_default();
        (status.ready_replicas == Some(3))
            .then_some(())
            .ok_or_else(|| format!("{status:?}"))
    })
    .await;
    let after = ca_bundle(
        mutating
            .get("multigres-operator-mutating-webhook-configuration")
            .await
            .unwrap(),
    );
    assert_eq!(
        after, before,
        "helm upgrade keeps the caBundle the webhook-server set"
    );
}

#[tokio::test]
async fn every_handler_runs_and_reconciles_under_the_chart_rbac() {
    let release = release().await;
    let _serial = SERIAL.lock().await;
    let client = release.cluster.client().unwrap();
    let namespace = fresh_namespace(release.cluster, "chart-rbac").await;
    let controllers = start_controllers(release).await;
    apply_minimal(&client, &namespace, "minimal").await;

    for handler in &controllers {
        let info = handler
            .wait_info("reconciles", |i| {
                i.controllers.iter().any(|c| c.reconciles > 0)
            })
            .await;
        assert!(info.serving, "{info:?}");
    }
    eventually("the cluster-handler creates the children", WAIT, || async {
        let cells = names::<Cell>(&client, &namespace).await;
        let groups = names::<TableGroup>(&client, &namespace).await;
        let shards = names::<Shard>(&client, &namespace).await;
        if cells.is_empty() || groups.is_empty() || shards.is_empty() {
            Err(format!(
                "cells {cells:?} tablegroups {groups:?} shards {shards:?}; log:\n{}",
                controllers[0].log()
            ))
        } else {
            Ok(())
        }
    })
    .await;
    eventually(
        "the resource-handler creates the workloads",
        WAIT,
        || async {
            let sets = names::<StatefulSet>(&client, &namespace).await;
            let deployments = names::<Deployment>(&client, &namespace).await;
            if sets.is_empty() || deployments.is_empty() {
                Err(format!(
                    "statefulsets {sets:?} deployments {deployments:?}; log:\n{}",
                    controllers[1].log()
                ))
            } else {
                Ok(())
            }
        },
    )
    .await;

    // The webhook-server admitted the sample as its ServiceAccount: it created its certificate
    // Secret and set the caBundle of both configurations.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    secrets.get("multigres-webhook-certs").await.unwrap();
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let config = validating
        .get("multigres-operator-validating-webhook-configuration")
        .await
        .unwrap();
    assert!(
        config
            .webhooks
            .unwrap_or_default()
            .iter()
            .all(|w| w.client_config.ca_bundle.is_some())
    );
    let clusters: Api<MultigresCluster> = Api::namespaced(client.clone(), &namespace);
    clusters.get("minimal").await.unwrap();

    for handler in controllers.iter().chain([&release.webhook]) {
        assert!(
            !handler.forbidden(),
            "{} was refused:\n{}",
            handler.name,
            handler.log()
        );
        assert_eq!(
            handler.health().await,
            ServingStatus::Serving,
            "{}",
            handler.name
        );
    }
}

/// A one-cell cluster whose volumes go with a scale-down and with the cluster, for
/// [`the_chart_rbac_lets_the_handlers_grow_scale_down_restart_and_delete`]: `{replicas}` pool
/// pods with `{size}` volumes and `{config}` as postgresConfig.
const DAY_TWO_CLUSTER: &str = r#"
apiVersion: v1
kind: Secret
metadata: {name: day2-postgres-password}
stringData: {password: change-me-please}
---
apiVersion: multigres.com/v1alpha1
kind: MultigresCluster
metadata: {name: day2}
spec:
  postgresPasswordSecretRef: {name: day2-postgres-password, key: password}
  pvcDeletionPolicy: {whenDeleted: Delete, whenScaled: Delete}
  cells:
    - {name: zone-a, zoneId: zone-a}
  databases:
    - name: postgres
      default: true
      tablegroups:
        - name: default
          default: true
          shards:
            - name: "0-inf"
              spec:
                pools:
                  main:
                    type: readWrite
                    cells: [zone-a]
                    replicasPerCell: {replicas}
                    storage: {size: {size}}
                postgresConfig: {config}
"#;

/// Applies [`DAY_TWO_CLUSTER`] into `namespace` through the chart's webhooks.
async fn apply_day_two(client: &Client, namespace: &str, replicas: u8, size: &str, config: &str) {
    let text = DAY_TWO_CLUSTER
        .replace("{replicas}", &replicas.to_string())
        .replace("{size}", size)
        .replace("{config}", config);
    for doc in manifest::parse_documents(&text, std::path::Path::new("day2.yaml")).unwrap() {
        manifest::apply(client, &doc, Some(namespace), Mode::Apply)
            .await
            .unwrap_or_else(|e| panic!("applying the day2 cluster: {e}"));
    }
}

/// The pool volumes of the day2 cluster: name → requested size.
async fn day_two_volumes(client: &Client, namespace: &str) -> BTreeMap<String, String> {
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
    pvcs.list(
        &ListParams::default()
            .labels("app.kubernetes.io/component=shard-pool,multigres.com/cluster=day2"),
    )
    .await
    .map(|list| list.items)
    .unwrap_or_default()
    .into_iter()
    .filter(|p| p.metadata.deletion_timestamp.is_none())
    .map(|p| {
        let size = p
            .spec
            .and_then(|s| s.resources?.requests?.remove("storage"))
            .map(|q| q.0)
            .unwrap_or_default();
        (p.metadata.name.unwrap_or_default(), size)
    })
    .collect()
}

/// Fails naming the handler whose request the chart's roles refused.
fn assert_none_forbidden(handlers: &[Handler], step: &str) {
    for handler in handlers {
        assert!(
            !handler.forbidden(),
            "{step}: {} was refused:\n{}",
            handler.name,
            handler.log()
        );
    }
}

#[tokio::test]
async fn the_chart_rbac_lets_the_handlers_grow_scale_down_restart_and_delete() {
    let release = release().await;
    let _serial = SERIAL.lock().await;
    let client = release.cluster.client().unwrap();
    let namespace = fresh_namespace(release.cluster, "chart-day2").await;
    let controllers = start_controllers(release).await;
    harness::allow_volume_expansion(&client).await;
    let set = "day2-postgres-default-0-inf-pool-main-zone-a";
    let volume = |ordinal: u8| format!("data-{set}-{ordinal}");

    apply_day_two(&client, &namespace, 3, "1Gi", "{}").await;
    eventually("three ready pool pods with a primary", WAIT, || async {
        harness::elect_primaries(&client, &namespace).await?;
        let pods = harness::pool_pods(&client, &namespace, "day2").await;
        if pods.len() == 3 && pods.values().all(|(_, ready)| *ready) {
            Ok(())
        } else {
            Err(format!("{pods:?}"))
        }
    })
    .await;
    assert_none_forbidden(&controllers, "creation");

    // Growth: the resource-handler patches every pool volume.
    apply_day_two(&client, &namespace, 3, "2Gi", "{}").await;
    eventually("every pool volume requests 2Gi", WAIT, || async {
        let volumes = day_two_volumes(&client, &namespace).await;
        if volumes.len() == 3 && volumes.values().all(|s| s == "2Gi") {
            Ok(())
        } else {
            Err(format!("{volumes:?}"))
        }
    })
    .await;
    assert_none_forbidden(&controllers, "volume growth");

    // Scale-down: the last replica goes, and with it its volume (whenScaled: Delete).
    apply_day_two(&client, &namespace, 2, "2Gi", "{}").await;
    eventually("two pool pods and their two volumes", WAIT, || async {
        let pods = harness::pool_pods(&client, &namespace, "day2").await;
        let volumes: Vec<String> = day_two_volumes(&client, &namespace)
            .await
            .into_keys()
            .collect();
        if pods.len() == 2 && volumes == [volume(0), volume(1)] {
            Ok(())
        } else {
            Err(format!("pods {pods:?}, volumes {volumes:?}"))
        }
    })
    .await;
    assert_none_forbidden(&controllers, "scale-down");

    // A restart-class setting: the replica is restarted (deleted and recreated) first.
    let before = harness::pool_pods(&client, &namespace, "day2").await;
    let replica = format!("{set}-1");
    apply_day_two(&client, &namespace, 2, "2Gi", "{shared_buffers: 256MB}").await;
    eventually("the replica is restarted", WAIT, || async {
        let now = harness::pool_pods(&client, &namespace, "day2").await;
        match (before.get(&replica), now.get(&replica)) {
            (Some((old, _)), Some((new, _))) if old != new => Ok(()),
            _ => Err(format!("before {before:?}, now {now:?}")),
        }
    })
    .await;
    assert_none_forbidden(&controllers, "restart");

    // Deletion: the cluster, its children and its volumes (whenDeleted: Delete) go, the
    // data-handler's finalizers released under the chart's roles.
    let clusters: Api<MultigresCluster> = Api::namespaced(client.clone(), &namespace);
    clusters
        .delete("day2", &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "the cluster, its Shard and its volumes are gone",
        WAIT,
        || async {
            let cluster = clusters.get_opt("day2").await.map_err(|e| e.to_string())?;
            let shards = names::<Shard>(&client, &namespace).await;
            let volumes = day_two_volumes(&client, &namespace).await;
            if cluster.is_none() && shards.is_empty() && volumes.is_empty() {
                Ok(())
            } else {
                Err(format!(
                    "cluster present: {}, shards {shards:?}, volumes {volumes:?}",
                    cluster.is_some()
                ))
            }
        },
    )
    .await;
    assert_none_forbidden(&controllers, "deletion");
}

/// Rules without those granting `verb` on `resource`.
fn without(rules: &[PolicyRule], resource: &str, verb: &str) -> Vec<PolicyRule> {
    rules
        .iter()
        .filter(|rule| {
            let grants = rule
                .resources
                .as_ref()
                .is_some_and(|r| r.iter().any(|r| r == resource))
                && rule.verbs.iter().any(|v| v == verb);
            !grants
        })
        .cloned()
        .collect()
}

#[tokio::test]
async fn a_rule_missing_from_the_chart_rbac_fails_its_handler_until_helm_upgrade_restores_it() {
    let release = release().await;
    let _serial = SERIAL.lock().await;
    let client = release.cluster.client().unwrap();
    let roles: Api<ClusterRole> = Api::all(client.clone());
    let name = format!("{RELEASE}-cluster-handler");
    let mut role = roles.get(&name).await.unwrap();
    let rules = role.rules.clone().unwrap_or_default();
    let reduced = without(&rules, "multigresclusters", "watch");
    assert!(
        reduced.len() < rules.len(),
        "no rule to remove in {rules:?}"
    );
    role.rules = Some(reduced);
    role.metadata.managed_fields = None;
    roles
        .replace(&name, &PostParams::default(), &role)
        .await
        .unwrap();

    let account = release
        .cluster
        .service_account_kubeconfig(NAMESPACE, &name, Duration::from_secs(600))
        .await
        .unwrap();
    let as_handler = release
        .cluster
        .client_for_kubeconfig(&account)
        .await
        .unwrap();
    let watch = WatchParams::default().timeout(1);
    eventually("the reduced role takes effect", WAIT, || async {
        let clusters: Api<MultigresCluster> = Api::all(as_handler.clone());
        match clusters.watch(&watch, "0").await {
            Err(kube::Error::Api(status)) if status.code == 403 => Ok(()),
            other => Err(format!("{:?}", other.map(|_| "watch allowed"))),
        }
    })
    .await;

    let handler = Handler::start(
        release.cluster,
        "cluster-handler",
        release.webhook_port,
        &[],
    )
    .await;
    eventually("the handler reports the refusal", WAIT, || async {
        handler
            .forbidden()
            .then_some(())
            .ok_or_else(|| handler.log())
    })
    .await;
    let info = handler.info().await;
    // Each kind reports itself synced once listed: the others may be, the refused one not.
    assert!(
        !info.synced_kinds.iter().any(|k| k == "MultigresCluster")
            && info.controllers.iter().all(|c| c.reconciles == 0),
        "synced or reconciled without its watch: {info:?}"
    );
    // Only a leader watches: one that cannot fill its caches cannot reconcile, so it is not ready.
    assert_eq!(info.leader_state(), LeaderState::Leader, "{info:?}");
    assert!(!info.serving, "ready without its caches: {info:?}");
    assert_eq!(handler.health().await, ServingStatus::NotServing);
    drop(handler);

    let chart = chart_dir();
    harness::helm(
        &[
            "upgrade",
            RELEASE,
            chart.to_str().unwrap(),
            "--namespace",
            NAMESPACE,
            "--reuse-values",
            "--wait",
        ],
        Some(release.cluster.kubeconfig()),
    )
    .await;
    let restored = roles.get(&name).await.unwrap().rules.unwrap_or_default();
    assert_eq!(restored, rules, "helm upgrade restores the role");
    let handler = Handler::start(
        release.cluster,
        "cluster-handler",
        release.webhook_port,
        &[],
    )
    .await;
    handler
        .wait_info("leading and serving again", |i| {
            i.leader_state() == LeaderState::Leader && i.serving
        })
        .await;
}

#[tokio::test]
async fn killing_the_leader_of_two_replicas_hands_over_and_reconciling_continues() {
    let release = release().await;
    let _serial = SERIAL.lock().await;
    let client = release.cluster.client().unwrap();
    let namespace = fresh_namespace(release.cluster, "chart-failover").await;
    let first = Handler::start(
        release.cluster,
        "cluster-handler",
        release.webhook_port,
        &[],
    )
    .await;
    let second = Handler::start(
        release.cluster,
        "cluster-handler",
        release.webhook_port,
        &[],
    )
    .await;
    let first_leads = eventually("one leader", WAIT, || async {
        let (a, b) = (first.info().await, second.info().await);
        match (a.leader_state(), b.leader_state()) {
            (LeaderState::Leader, LeaderState::Leader) => panic!("two leaders: {a:?} {b:?}"),
            (LeaderState::Leader, LeaderState::Standby) => Ok(true),
            (LeaderState::Standby, LeaderState::Leader) => Ok(false),
            _ => Err(format!("{a:?} {b:?}")),
        }
    })
    .await;
    let (leader, standby) = if first_leads {
        (&first, &second)
    } else {
        (&second, &first)
    };

    apply_minimal(&client, &namespace, "before").await;
    eventually("the leader reconciles the first cluster", WAIT, || async {
        let groups = names::<TableGroup>(&client, &namespace).await;
        groups
            .iter()
            .any(|g| g.starts_with("before"))
            .then_some(())
            .ok_or_else(|| format!("{groups:?}"))
    })
    .await;
    let standby_info = standby.info().await;
    assert!(
        standby_info.controllers.iter().all(|c| c.reconciles == 0),
        "a standby reconciled: {standby_info:?}"
    );

    leader.kill();
    let new_leader = standby
        .wait_info("takeover", |i| {
            i.leader_state() == LeaderState::Leader && i.serving
        })
        .await;
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), NAMESPACE);
    let lease = leases
        .get(&format!("{RELEASE}-cluster-handler"))
        .await
        .unwrap();
    assert_eq!(
        lease.spec.unwrap().holder_identity.as_deref(),
        Some(new_leader.identity.as_str())
    );

    apply_minimal(&client, &namespace, "after").await;
    eventually(
        "the new leader reconciles the second cluster",
        WAIT,
        || async {
            let groups = names::<TableGroup>(&client, &namespace).await;
            groups
                .iter()
                .any(|g| g.starts_with("after"))
                .then_some(())
                .ok_or_else(|| format!("{groups:?}"))
        },
    )
    .await;
    let info = standby.info().await;
    assert!(
        info.controllers.iter().any(|c| c.reconciles > 0),
        "the new leader reconciled nothing: {info:?}"
    );
}

#[tokio::test]
async fn every_handler_exposes_its_documented_metrics() {
    let release = release().await;
    let _serial = SERIAL.lock().await;
    let client = release.cluster.client().unwrap();
    let namespace = fresh_namespace(release.cluster, "chart-metrics").await;
    let controllers = start_controllers(release).await;
    apply_minimal(&client, &namespace, "metrics").await;

    let by_name: BTreeMap<&str, &Handler> = controllers
        .iter()
        .chain([&release.webhook])
        .map(|h| (h.name, h))
        .collect();
    for metric in documented_metrics() {
        if metric.on_first_event {
            continue;
        }
        for handler in &metric.handlers {
            let handler = by_name[handler.as_str()];
            eventually(
                &format!("{} on {}", metric.name, handler.name),
                WAIT,
                || async {
                    let text = handler.metrics().await;
                    let exposed = text.lines().any(|line| {
                        line.strip_prefix(&metric.name).is_some_and(|rest| {
                            rest.starts_with(['{', ' ']) || rest.starts_with("_bucket{")
                        })
                    });
                    exposed.then_some(()).ok_or(text)
                },
            )
            .await;
        }
    }
}

#[tokio::test]
async fn every_installed_object_passes_strict_field_validation() {
    let release = release().await;
    let _serial = SERIAL.lock().await;
    let client = release.cluster.client().unwrap();
    let manifest = harness::helm(
        &["get", "manifest", RELEASE, "--namespace", NAMESPACE],
        Some(release.cluster.kubeconfig()),
    )
    .await;
    let installed = yaml_documents(&manifest);
    for doc in &installed {
        let object: DynamicObject = serde_json::from_value(doc.clone()).unwrap();
        let mut probe = object.clone();
        probe.metadata.namespace = doc["metadata"]["namespace"].as_str().map(str::to_owned);
        manifest::apply(
            &client,
            &probe,
            probe.metadata.namespace.as_deref(),
            Mode::DryRun,
        )
        .await
        .unwrap_or_else(|e| panic!("the API server refuses {}: {e}", doc["metadata"]["name"]));
    }
    assert!(installed.len() >= 30, "{} objects", installed.len());
}
