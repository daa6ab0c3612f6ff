//! Data-plane observability and log levels (`spec.observability`, `spec.logLevels`): every
//! Multigres container (multigateway, multiorch, pgctld, multipooler, multiadmin) gets exactly
//! the `OTEL_*` environment the cluster asks for, with its own `multigres.component`, and the
//! sampling ConfigMap mounted at `/etc/otel`; each process gets its `--log-level`. Setting
//! `otlpEndpoint: disabled` removes every variable and the mount.

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{Container, PodSpec};
use kube::Api;
use kube::api::{Patch, PatchParams};
use multigres_api::v1alpha1::MultigresCluster;
use multigres_e2e::harness::{
    Stack, WAIT, admin, apply_yaml, control_plane, eventually, fresh_namespace,
};
use serde_json::json;

const CLUSTER: &str = r#"
apiVersion: multigres.com/v1alpha1
kind: MultigresCluster
metadata:
  name: otel
spec:
  globalTopoServer:
    external:
      endpoints: [http://127.0.0.1:23790]
      rootPath: /otel/global
  postgresPasswordSecretRef: {name: pg, key: password}
  logLevels: {pgctld: debug, multipooler: warn, multiorch: error, multiadmin: debug, multigateway: warn}
  observability:
    otlpEndpoint: http://collector.example:4318
    otlpProtocol: http/protobuf
    tracesExporter: otlp
    metricsExporter: otlp
    metricExportInterval: "15000"
    metricsTemporality: delta
    tracesSampler: multigres_custom
    samplingConfigRef: {name: sampling}
  cells:
    - {name: zone-a, zoneId: zone-a}
"#;

const SHARD: &str = "otel-postgres-default-0-inf";

/// `(container, component, --log-level)` of every Multigres process, and where it runs.
const PROCESSES: [(&str, &str, &str, &str); 5] = [
    (
        "otel-zone-a-multigateway",
        "multigateway",
        "multigateway",
        "warn",
    ),
    (
        "otel-postgres-default-0-inf-multiorch-zone-a",
        "multiorch",
        "multiorch",
        "error",
    ),
    ("otel-multiadmin", "multiadmin", "multiadmin", "debug"),
    ("pool", "postgres", "pgctld", "debug"),
    ("pool", "multipooler", "multipooler", "warn"),
];

fn otel_env(c: &Container) -> Vec<(String, String)> {
    c.env
        .iter()
        .flatten()
        .filter(|e| e.name.starts_with("OTEL_"))
        .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
        .collect()
}

fn expected_env(component: &str) -> Vec<(String, String)> {
    [
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "http://collector.example:4318",
        ),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ("OTEL_TRACES_EXPORTER", "otlp"),
        ("OTEL_METRICS_EXPORTER", "otlp"),
        ("OTEL_METRIC_EXPORT_INTERVAL", "15000"),
        ("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "delta"),
        ("OTEL_TRACES_SAMPLER", "multigres_custom"),
        (
            "OTEL_RESOURCE_ATTRIBUTES",
            &format!("multigres.cluster=otel,multigres.component={component}"),
        ),
        (
            "OTEL_TRACES_SAMPLER_CONFIG",
            "/etc/otel/sampling-config.yaml",
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

/// The pod templates of every Multigres workload, by the names in [`PROCESSES`].
async fn pods(client: &kube::Client, ns: &str) -> Option<Vec<(String, PodSpec)>> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
    let mut out = Vec::new();
    for name in [
        "otel-zone-a-multigateway",
        &format!("{SHARD}-multiorch-zone-a"),
        "otel-multiadmin",
    ] {
        let d = deployments.get_opt(name).await.ok()??;
        out.push((name.to_owned(), d.spec?.template.spec?));
    }
    let pool = sets
        .get_opt(&format!("{SHARD}-pool-default-zone-a"))
        .await
        .ok()??;
    out.push(("pool".to_owned(), pool.spec?.template.spec?));
    Some(out)
}

fn container<'a>(pod: &'a PodSpec, name: &str) -> &'a Container {
    pod.containers
        .iter()
        .chain(pod.init_containers.iter().flatten())
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("container {name}"))
}

/// Whether every process shows `want(component)` as its OTEL env and the sampling mount
/// exactly when `mounted`.
fn check(
    pods: &[(String, PodSpec)],
    want: impl Fn(&str) -> Vec<(String, String)>,
    mounted: bool,
) -> Result<(), String> {
    for (workload, name, component, _) in PROCESSES {
        let pod = &pods.iter().find(|(n, _)| n == workload).unwrap().1;
        let c = container(pod, name);
        if otel_env(c) != want(component) {
            return Err(format!("{name}: {:?}", otel_env(c)));
        }
        let mount = c
            .volume_mounts
            .iter()
            .flatten()
            .any(|m| m.name == "otel-sampling-config" && m.mount_path == "/etc/otel");
        let volume = pod
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == "otel-sampling-config");
        let volume_ok = match volume {
            Some(v) => mounted && v.config_map.as_ref().is_some_and(|c| c.name == "sampling"),
            None => !mounted,
        };
        if mount != mounted || !volume_ok {
            return Err(format!("{name}: mount {mount}, volume {volume:?}"));
        }
    }
    Ok(())
}

#[tokio::test]
async fn every_process_gets_its_telemetry_env_and_log_level() {
    let cluster = control_plane().await;
    let ns = fresh_namespace(cluster, "parity-otel").await;
    let _stack = Stack::start(cluster, &ns, None).await;
    apply_yaml(cluster, &ns, CLUSTER).await;
    let client = admin(cluster);

    let settled = eventually("every process has its OTEL env", WAIT, || async {
        let pods = pods(&client, &ns).await.ok_or("workloads missing")?;
        check(&pods, expected_env, true)?;
        Ok::<_, String>(pods)
    })
    .await;
    for (workload, name, _, level) in PROCESSES {
        let pod = &settled.iter().find(|(n, _)| n == workload).unwrap().1;
        let args = container(pod, name).args.clone().unwrap_or_default();
        let levels: Vec<&String> = args
            .iter()
            .filter(|a| a.starts_with("--log-level"))
            .collect();
        assert_eq!(
            levels,
            [&format!("--log-level={level}")],
            "{name}: {args:?}"
        );
    }

    let clusters: Api<MultigresCluster> = Api::namespaced(client.clone(), &ns);
    clusters
        .patch(
            "otel",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"observability": {"otlpEndpoint": "disabled"}}})),
        )
        .await
        .unwrap();
    eventually(
        "disabled removes every variable and the mount",
        WAIT,
        || async {
            let pods = pods(&client, &ns).await.ok_or("workloads missing")?;
            check(&pods, |_| Vec::new(), false)
        },
    )
    .await;
}
