//! The resource-handler binary against a real control plane, running as its own
//! ServiceAccount with only the rules of `deploy/rbac/resource-handler.yaml` (bound in the
//! test's namespace). TopoServer, Cell, Shard and MultigresCluster objects are applied directly,
//! as the cluster-handler would write them; the workloads appear with the Multigres process
//! contract, kwok makes their pods Ready and the status climbs to `Available`; a pod template
//! change restarts pool pods replicas first and the primary last; PVCs are kept or removed as
//! the policy says; volumes grow and never shrink; multiadmin follows the real global
//! topology; each cluster gets its NetworkPolicies and loses them when it opts out; an idle
//! object costs no writes; a hand-edited pod template is written back once,
//! also by a restarted handler.
//!
//! Each test works in its own namespace with its own handler (`--watch-namespace`).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Pod, Service};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use multigres_api::v1alpha1::{Cell, Shard, TopoServer};
use multigres_e2e::cluster::LocalCluster;
use multigres_e2e::harness::{
    FULL_CYCLE, HandlerProcess, WAIT, eventually, fresh_namespace, pool_pods, publish_roles,
    publish_status, run_plugin,
};
use multigres_e2e::manifest::{self, Mode};
use serde_json::json;

/// The node label a cell's `zoneId` pins pods to (what the resolver writes).
const ZONE_ID_LABEL: &str = "topology.k8s.aws/zone-id";

async fn cluster() -> &'static LocalCluster {
    let cluster = multigres_e2e::harness::control_plane().await;
    label_nodes_with_zone_ids(cluster).await;
    cluster
}

/// Gives each fake node the zone-id label cells pin their pods to (its zone's name), so pods
/// of a cell with `zoneId: zone-a` schedule onto `kwok-node-zone-a`.
async fn label_nodes_with_zone_ids(cluster: &LocalCluster) {
    let nodes: Api<Node> = Api::all(cluster.client().unwrap());
    for name in cluster.node_names() {
        let zone = name.trim_start_matches("kwok-node-");
        let patch = json!({"metadata": {"labels": {ZONE_ID_LABEL: zone}}});
        nodes
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap_or_else(|e| panic!("labelling node {name}: {e}"));
    }
}

/// The resource-handler serving one namespace as its own ServiceAccount, once its caches are
/// filled.
async fn start_handler(cluster: &LocalCluster, namespace: &str) -> HandlerProcess {
    HandlerProcess::start_in(cluster, "resource-handler", namespace, &[]).await
}

/// Server-side applies `yaml` into `namespace` as the test (standing in for the
/// cluster-handler).
async fn apply_yaml(client: &Client, namespace: &str, yaml: &str) {
    for doc in manifest::parse_documents(yaml, Path::new("inline.yaml")).unwrap() {
        manifest::apply(client, &doc, Some(namespace), Mode::Apply)
            .await
            .unwrap_or_else(|e| panic!("applying {:?}: {e}", doc.metadata.name));
    }
}

/// Merge-patches the spec of a custom resource.
async fn patch_spec<K>(api: &Api<K>, name: &str, spec: serde_json::Value)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": spec})),
    )
    .await
    .unwrap_or_else(|e| panic!("patching {name}: {e}"));
}

fn condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Waits until the object's condition `type_` has `status` (and reason, when given).
async fn wait_condition<K, F>(
    api: &Api<K>,
    name: &str,
    type_: &str,
    status: &str,
    reason: Option<&str>,
    conditions: F,
) -> K
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    F: Fn(&K) -> Vec<Condition>,
{
    eventually(
        &format!("{name} {type_}={status} {reason:?}"),
        WAIT,
        || async {
            let obj = api.get(name).await.map_err(|e| e.to_string())?;
            let conds = conditions(&obj);
            match condition(&conds, type_) {
                Some(c) if c.status == status && reason.is_none_or(|r| c.reason == r) => Ok(obj),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await
}

fn args_of(pod: &k8s_openapi::api::core::v1::PodSpec, container: &str) -> Vec<String> {
    pod.containers
        .iter()
        .chain(pod.init_containers.iter().flatten())
        .find(|c| c.name == container)
        .and_then(|c| c.args.clone())
        .unwrap_or_default()
}

fn statefulset_pod(sts: &StatefulSet) -> &k8s_openapi::api::core::v1::PodSpec {
    sts.spec.as_ref().unwrap().template.spec.as_ref().unwrap()
}

fn deployment_pod(d: &Deployment) -> &k8s_openapi::api::core::v1::PodSpec {
    d.spec.as_ref().unwrap().template.spec.as_ref().unwrap()
}

/// PVC names in `namespace` carrying `label=value`, sorted.
async fn pvc_names(client: &Client, namespace: &str, selector: &str) -> Vec<String> {
    let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
    let mut names: Vec<String> = api
        .list(&ListParams::default().labels(selector))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| p.name_any())
        .collect();
    names.sort();
    names
}

/// A TopoServer as the cluster-handler writes it for cluster `cluster`.
fn topo_server(cluster: &str, replicas: i32, when_deleted: &str, size: &str) -> String {
    format!(
        r#"
apiVersion: multigres.com/v1alpha1
kind: TopoServer
metadata:
  name: {cluster}-global-topo
  labels:
    app.kubernetes.io/instance: {cluster}
    app.kubernetes.io/component: global-topo
    app.kubernetes.io/managed-by: multigres-operator
    multigres.com/cluster: {cluster}
spec:
  etcd:
    image: gcr.io/etcd-development/etcd:v3.6.7
    replicas: {replicas}
    storage: {{size: {size}}}
    rootPath: /multigres/global
  pvcDeletionPolicy: {{whenDeleted: {when_deleted}, whenScaled: Retain}}
"#
    )
}

#[tokio::test]
async fn a_topo_server_runs_etcd_becomes_available_and_deletes_its_volumes_as_asked() {
    let cluster = cluster().await;
    let ns = fresh_namespace(cluster, "rh-topo").await;
    let handler = start_handler(cluster, &ns).await;
    let client = cluster.client().unwrap();
    apply_yaml(&client, &ns, &topo_server("prod", 3, "Delete", "1Gi")).await;

    let topos: Api<TopoServer> = Api::namespaced(client.clone(), &ns);
    let topo = wait_condition(
        &topos,
        "prod-global-topo",
        "Available",
        "True",
        Some("AllMembersReady"),
        |t: &TopoServer| t.status.clone().unwrap_or_default().conditions,
    )
    .await;
    let status = topo.status.unwrap();
    assert_eq!(status.client_service.as_deref(), Some("prod-global-topo"));
    assert_eq!(
        status.peer_service.as_deref(),
        Some("prod-global-topo-peer")
    );
    assert_eq!(status.observed_generation, topo.metadata.generation);
    assert_eq!(status.message.as_deref(), Some("3/3 etcd members ready"));

    let sts: StatefulSet = Api::namespaced(client.clone(), &ns)
        .get("prod-global-topo")
        .await
        .unwrap();
    let peer = format!("prod-global-topo-peer.{ns}.svc");
    let args = args_of(statefulset_pod(&sts), "etcd");
    assert!(
        args.contains(&format!(
            "--initial-cluster=prod-global-topo-0=http://prod-global-topo-0.{peer}:2380,\
             prod-global-topo-1=http://prod-global-topo-1.{peer}:2380,\
             prod-global-topo-2=http://prod-global-topo-2.{peer}:2380"
        )),
        "{args:?}"
    );
    assert!(
        args.contains(&"--initial-cluster-state=new".to_owned()),
        "{args:?}"
    );
    let spec = sts.spec.as_ref().unwrap();
    let retention = spec
        .persistent_volume_claim_retention_policy
        .clone()
        .unwrap();
    assert_eq!(retention.when_deleted.as_deref(), Some("Delete"));
    assert_eq!(spec.pod_management_policy.as_deref(), Some("Parallel"));

    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    let peer_svc = services
        .get("prod-global-topo-peer")
        .await
        .unwrap()
        .spec
        .unwrap();
    assert_eq!(peer_svc.cluster_ip.as_deref(), Some("None"));
    let client_svc = services
        .get("prod-global-topo")
        .await
        .unwrap()
        .spec
        .unwrap();
    assert_eq!(client_svc.ports.unwrap()[0].port, 2379);
    let pdb: PodDisruptionBudget = Api::namespaced(client.clone(), &ns)
        .get("prod-global-topo")
        .await
        .unwrap();
    assert_eq!(
        pdb.spec.unwrap().max_unavailable,
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(1))
    );

    let selector = "app.kubernetes.io/component=global-topo,multigres.com/cluster=prod";
    let pvcs = pvc_names(&client, &ns, selector).await;
    assert_eq!(
        pvcs,
        [
            "data-prod-global-topo-0",
            "data-prod-global-topo-1",
            "data-prod-global-topo-2"
        ]
    );

    // An even member count is refused without touching the running etcd.
    patch_spec(&topos, "prod-global-topo", json!({"etcd": {"replicas": 5}})).await;
    eventually("the member count change is refused", WAIT, || async {
        let t = topos
            .get("prod-global-topo")
            .await
            .map_err(|e| e.to_string())?;
        let message = t.status.and_then(|s| s.message).unwrap_or_default();
        if message.contains("cannot change from 3 to 5") {
            Ok(())
        } else {
            Err(message)
        }
    })
    .await;
    let sts: StatefulSet = Api::namespaced(client.clone(), &ns)
        .get("prod-global-topo")
        .await
        .unwrap();
    assert_eq!(sts.spec.unwrap().replicas, Some(3));

    // whenDeleted: Delete — the volumes go with the TopoServer.
    topos
        .delete("prod-global-topo", &DeleteParams::foreground())
        .await
        .unwrap();
    eventually("the etcd volumes are deleted", WAIT, || async {
        let left = pvc_names(&client, &ns, selector).await;
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("{left:?}"))
        }
    })
    .await;
    drop(handler);
}

const CELL: &str = r#"
apiVersion: multigres.com/v1alpha1
kind: Cell
metadata:
  name: prod-zone-a
  labels:
    app.kubernetes.io/instance: prod
    app.kubernetes.io/component: cell
    app.kubernetes.io/managed-by: multigres-operator
    multigres.com/cluster: prod
    multigres.com/cell: zone-a
spec:
  name: zone-a
  zoneId: zone-a
  images:
    imagePullPolicy: IfNotPresent
    imagePullSecrets: [{name: regcred}]
    multigateway: ghcr.io/multigres/multigres:sha-66d2310
  multigateway:
    replicas: 2
    buffer: {enabled: true}
  globalTopoServer:
    address: prod-global-topo.NAMESPACE.svc:2379
    rootPath: /multigres/global
    implementation: etcd
"#;

/// The gateway certificate Secret of cluster `prod`, as the multiadmin controller labels it
/// (a standalone Cell has no cluster to issue it); kwok pods never read its content.
const GATEWAY_TLS: &str = r#"
apiVersion: v1
kind: Secret
metadata:
  name: prod-gateway-tls
  labels:
    app.kubernetes.io/managed-by: multigres-operator
    app.kubernetes.io/component: gateway-tls
    multigres.com/cluster: prod
type: kubernetes.io/tls
stringData:
  tls.crt: certificate
  tls.key: key
"#;

#[tokio::test]
async fn a_cell_runs_its_gateways_reports_them_ready_and_idles_without_writes() {
    let cluster = cluster().await;
    let ns = fresh_namespace(cluster, "rh-cell").await;
    let handler = start_handler(cluster, &ns).await;
    let client = cluster.client().unwrap();
    apply_yaml(&client, &ns, &CELL.replace("NAMESPACE", &ns)).await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        deployments
            .get_opt("prod-zone-a-multigateway")
            .await
            .unwrap()
            .is_none(),
        "no gateway before its certificate"
    );
    apply_yaml(&client, &ns, GATEWAY_TLS).await;

    let cells: Api<Cell> = Api::namespaced(client.clone(), &ns);
    let cell = wait_condition(
        &cells,
        "prod-zone-a",
        "Available",
        "True",
        None,
        |c: &Cell| c.status.clone().unwrap_or_default().conditions,
    )
    .await;
    let status = cell.status.unwrap();
    assert_eq!(
        (status.gateway_replicas, status.gateway_ready_replicas),
        (Some(2), Some(2))
    );
    assert_eq!(
        status.gateway_service_name.as_deref(),
        Some("prod-zone-a-multigateway")
    );

    let gateway: Deployment = deployments.get("prod-zone-a-multigateway").await.unwrap();
    let pod = deployment_pod(&gateway);
    let annotations = gateway.spec.as_ref().unwrap().template.metadata.as_ref();
    assert!(
        annotations
            .and_then(|m| m.annotations.as_ref())
            .is_some_and(|a| a.contains_key("multigres.com/gateway-certificate")),
        "the gateway pods carry their certificate's digest"
    );
    assert_eq!(
        args_of(pod, "multigateway"),
        [
            "--http-port=15100".to_owned(),
            "--grpc-port=15170".to_owned(),
            "--pg-port=5432".to_owned(),
            "--pg-replica-port=5433".to_owned(),
            format!("--topo-global-server-addresses=prod-global-topo.{ns}.svc:2379"),
            "--topo-global-root=/multigres/global".to_owned(),
            "--cell=zone-a".to_owned(),
            "--service-id=$(POD_NAME)".to_owned(),
            "--hostname=$(POD_IP)".to_owned(),
            "--log-level=info".to_owned(),
            "--lameduck-period=5s".to_owned(),
            "--onclose-timeout=1s".to_owned(),
            "--buffer-enabled=true".to_owned(),
            "--pg-tls-cert-file=/etc/multigres/gateway-tls/tls.crt".to_owned(),
            "--pg-tls-key-file=/etc/multigres/gateway-tls/tls.key".to_owned(),
        ]
    );
    assert_eq!(pod.image_pull_secrets.as_ref().unwrap()[0].name, "regcred");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let running = pods
        .list(&ListParams::default().labels("app.kubernetes.io/component=multigateway"))
        .await
        .unwrap();
    assert_eq!(running.items.len(), 2);
    for p in &running.items {
        assert_eq!(
            p.spec.as_ref().unwrap().node_name.as_deref(),
            Some("kwok-node-zone-a")
        );
    }
    let service: Service = Api::namespaced(client.clone(), &ns)
        .get("prod-zone-a-multigateway")
        .await
        .unwrap();
    let ports: Vec<i32> = service
        .spec
        .unwrap()
        .ports
        .unwrap()
        .iter()
        .map(|p| p.port)
        .collect();
    assert_eq!(ports, [5432, 5433, 15100, 15170]);

    // A reconcile that finds nothing to change writes nothing.
    let writes_before = handler
        .counter("multigres_operator_api_writes_total", "controller=\"cell\"")
        .await;
    let reconciles_before = handler
        .counter("multigres_operator_reconcile_total", "controller=\"cell\"")
        .await;
    cells
        .patch(
            "prod-zone-a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"e2e/touched": "1"}}})),
        )
        .await
        .unwrap();
    eventually("the touched Cell is reconciled", WAIT, || async {
        let now = handler
            .counter("multigres_operator_reconcile_total", "controller=\"cell\"")
            .await;
        if now > reconciles_before {
            Ok(())
        } else {
            Err(format!("{now} reconciles"))
        }
    })
    .await;
    let writes_after = handler
        .counter("multigres_operator_api_writes_total", "controller=\"cell\"")
        .await;
    println!(
        "cell: {writes_before} writes to converge, {} on an idle reconcile",
        writes_after - writes_before
    );
    assert_eq!(
        writes_after, writes_before,
        "an idle reconcile wrote something"
    );

    // Someone deletes the gateway Deployment and Service: both come back at once, new objects
    // with the same names.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    let name = "prod-zone-a-multigateway";
    let old_uids = (gateway.metadata.uid.clone(), service.metadata.uid.clone());
    deployments
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
    services
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
    let started = std::time::Instant::now();
    eventually(
        "the deleted Deployment and Service are recreated",
        WAIT,
        || async {
            let deployment = deployments.get(name).await.map_err(|e| e.to_string())?;
            let service = services.get(name).await.map_err(|e| e.to_string())?;
            let uids = (deployment.metadata.uid, service.metadata.uid);
            if uids.0 != old_uids.0 && uids.1 != old_uids.1 {
                Ok(())
            } else {
                Err(format!("still the old objects: {uids:?}"))
            }
        },
    )
    .await;
    println!(
        "cell: deleted Deployment and Service recreated in {:?}",
        started.elapsed()
    );
}

/// A Shard with one pool of `replicas` pods in zone-a, as the cluster-handler writes it.
fn shard(
    cluster: &str,
    namespace: &str,
    replicas: i32,
    image: &str,
    pvc: &str,
    size: &str,
) -> String {
    format!(
        r#"
apiVersion: multigres.com/v1alpha1
kind: Shard
metadata:
  name: {cluster}-postgres-default-0-inf
  labels:
    app.kubernetes.io/instance: {cluster}
    app.kubernetes.io/component: shard
    app.kubernetes.io/managed-by: multigres-operator
    multigres.com/cluster: {cluster}
    multigres.com/database: postgres
    multigres.com/tablegroup: default
    multigres.com/shard: 0-inf
spec:
  databaseName: postgres
  tableGroupName: default
  shardName: 0-inf
  images:
    imagePullPolicy: IfNotPresent
    imagePullSecrets: [{{name: regcred}}]
    multiorch: ghcr.io/multigres/multigres:sha-66d2310
    multipooler: {image}
    postgres: ghcr.io/multigres/pgctld:sha-66d2310
  globalTopoServer:
    address: {cluster}-global-topo.{namespace}.svc:2379
    rootPath: /multigres/global
    implementation: etcd
  multiorch:
    cells: [zone-a]
  pools:
    main:
      cells: [zone-a]
      replicasPerCell: {replicas}
      storage: {{size: {size}}}
      pvcDeletionPolicy: {pvc}
  backup:
    type: s3
    s3: {{bucket: backups, region: eu-west-1}}
  postgresPasswordSecretRef: {{name: pg-superuser, key: password}}
  cellTopologyLabels:
    zone-a: {{{ZONE_ID_LABEL}: zone-a}}
"#
    )
}

fn shard_conditions(s: &Shard) -> Vec<Condition> {
    s.status.clone().unwrap_or_default().conditions
}

#[tokio::test]
async fn a_template_change_restarts_pool_pods_replicas_first_and_the_primary_last() {
    let cluster = cluster().await;
    let ns = fresh_namespace(cluster, "rh-rollout").await;
    let _handler = start_handler(cluster, &ns).await;
    let client = cluster.client().unwrap();
    let old = "ghcr.io/multigres/multigres:sha-66d2310";
    let retain = "{whenDeleted: Retain, whenScaled: Retain}";
    apply_yaml(&client, &ns, &shard("roll", &ns, 3, old, retain, "1Gi")).await;
    let name = "roll-postgres-default-0-inf";
    let shards: Api<Shard> = Api::namespaced(client.clone(), &ns);
    // Every pod Ready, but no primary known (nothing publishes roles yet): not Available, and
    // the condition says what it waits for.
    let s = wait_condition(
        &shards,
        name,
        "Available",
        "False",
        Some("NoPrimary"),
        shard_conditions,
    )
    .await;
    let status = s.status.clone().unwrap();
    assert_eq!(status.ready_replicas, Some(3));
    assert_eq!(
        (status.pools_ready, status.orch_ready),
        (Some(true), Some(true))
    );
    let available = condition(&status.conditions, "Available").unwrap();
    assert!(
        available.message.contains("no primary yet"),
        "{}",
        available.message
    );
    assert_eq!(
        status.phase,
        Some(multigres_api::v1alpha1::Phase::Progressing)
    );
    assert_eq!(
        condition(&status.conditions, "RollingUpdate").map(|c| c.reason.as_str()),
        Some("UpToDate")
    );

    let set = format!("{name}-pool-main-zone-a");
    let sts: StatefulSet = Api::namespaced(client.clone(), &ns)
        .get(&set)
        .await
        .unwrap();
    let pod = statefulset_pod(&sts);
    assert_eq!(
        sts.spec
            .as_ref()
            .unwrap()
            .update_strategy
            .as_ref()
            .unwrap()
            .type_
            .as_deref(),
        Some("OnDelete")
    );
    let pooler = args_of(pod, "multipooler");
    for expected in [
        "--cell=zone-a".to_owned(),
        "--database=postgres".to_owned(),
        "--table-group=default".to_owned(),
        "--shard=0-inf".to_owned(),
        "--service-id=$(POD_NAME)".to_owned(),
        format!("--hostname=$(POD_NAME).{set}.{ns}.svc"),
        "--pgctld-addr=127.0.0.1:15470".to_owned(),
        // The resource-handler's default --pooler-unrecoverable-timeout.
        "--postgres-unrecoverable-timeout=300s".to_owned(),
    ] {
        assert!(pooler.contains(&expected), "{expected} not in {pooler:?}");
    }
    assert_eq!(args_of(pod, "postgres")[0], "server");
    let orch: Deployment = Api::namespaced(client.clone(), &ns)
        .get(&format!("{name}-multiorch-zone-a"))
        .await
        .unwrap();
    assert!(
        args_of(deployment_pod(&orch), "multiorch")
            .contains(&"--watch-targets=postgres/default/0-inf".to_owned())
    );

    let before = pool_pods(&client, &ns, "roll").await;
    assert_eq!(before.len(), 3);
    let primary = format!("{set}-1");

    // A new image while no role is known: nothing is restarted, and the condition says why.
    let new = "ghcr.io/multigres/multigres:sha-next";
    patch_spec(&shards, name, json!({"images": {"multipooler": new}})).await;
    wait_condition(
        &shards,
        name,
        "RollingUpdate",
        "True",
        Some("WaitingForRoles"),
        shard_conditions,
    )
    .await;
    tokio::time::sleep(FULL_CYCLE).await;
    assert_eq!(
        pool_pods(&client, &ns, "roll").await,
        before,
        "a pod was restarted without roles"
    );

    // Roles published as the data-handler does: pod 1 is the primary.
    publish_roles(&shards, name, before.keys(), &primary).await;

    // Record the order pods come back with a new uid, and that every other pod was Ready
    // each time one went away. Once the replicas are done, the primary is asked to hand over
    // (the pod annotation the data-handler answers) and is not restarted until pod 0 is the
    // primary, published here as the data-handler would.
    let mut order: Vec<String> = Vec::new();
    let mut last = before.clone();
    let mut handed_over = false;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let deadline = Instant::now() + WAIT;
    while order.len() < 3 {
        assert!(
            Instant::now() < deadline,
            "restarts stalled after {order:?}"
        );
        let now = pool_pods(&client, &ns, "roll").await;
        for (pod, (uid, _)) in &now {
            if before.get(pod).map(|(u, _)| u) != Some(uid) && !order.contains(pod) {
                order.push(pod.clone());
            }
        }
        let restarting: Vec<_> = before
            .keys()
            .filter(|p| !now.contains_key(*p) || now[*p].0 != last[*p].0)
            .collect();
        if !restarting.is_empty() {
            let others_ready = now
                .iter()
                .filter(|(p, _)| !restarting.contains(p))
                .all(|(_, (_, ready))| *ready);
            assert!(
                others_ready,
                "{restarting:?} restarted while another pod was not Ready: {now:?}"
            );
        }
        if now.len() == 3 {
            last = now;
        }
        if order.len() == 2 && !handed_over {
            let asked = pods.get(&primary).await.unwrap();
            let requested = asked
                .metadata
                .annotations
                .unwrap_or_default()
                .contains_key("multigres.com/switchover-requested");
            let s = shards.get(name).await.unwrap();
            let conditions = shard_conditions(&s);
            let waiting = condition(&conditions, "Switchover").is_some_and(|c| {
                c.reason == "WaitingForSwitchover" && c.message.contains(&primary)
            }) && condition(&conditions, "RollingUpdate")
                .is_some_and(|c| c.reason == "WaitingForSwitchover");
            if requested && waiting {
                assert_eq!(
                    asked.metadata.uid,
                    Some(before[&primary].0.clone()),
                    "the primary was not restarted before it handed over"
                );
                publish_roles(&shards, name, before.keys(), &format!("{set}-0")).await;
                handed_over = true;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        handed_over,
        "the primary restarted before it was asked to hand over (or the Shard never said it waits)"
    );
    assert_eq!(
        order,
        [format!("{set}-0"), format!("{set}-2"), primary.clone()],
        "restart order"
    );
    let s = wait_condition(
        &shards,
        name,
        "RollingUpdate",
        "False",
        Some("UpToDate"),
        shard_conditions,
    )
    .await;
    assert_eq!(
        s.status.unwrap().pod_roles.len(),
        3,
        "the handler never touches the data-handler's fields"
    );
    // The new primary is a current pool pod: the shard serves again.
    let s = wait_condition(
        &shards,
        name,
        "Available",
        "True",
        Some("AllReady"),
        shard_conditions,
    )
    .await;
    let available = condition(&shard_conditions(&s), "Available")
        .unwrap()
        .clone();
    assert!(
        available.message.ends_with(&format!("primary {set}-0")),
        "{}",
        available.message
    );
    for pod in before.keys() {
        let p = pods.get(pod).await.unwrap();
        let image = p.spec.unwrap().containers[0].image.clone();
        assert_eq!(image.as_deref(), Some(new), "{pod}");
    }
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    let notes = |reason: &'static str| {
        let events = events.clone();
        async move {
            events
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .filter(|e| e.reason.as_deref() == Some(reason))
                .filter_map(|e| e.note)
                .collect::<Vec<String>>()
        }
    };
    let requested = notes("SwitchoverRequested").await;
    assert!(
        requested.iter().any(|n| n.contains(&primary)),
        "{requested:?}"
    );
    let restarts = notes("RestartingPod").await;
    assert!(
        restarts
            .iter()
            .any(|n| n.contains(&primary) && n.contains("a replica")),
        "the old primary restarts as a replica: {restarts:?}"
    );
    switchover_condition_clears(
        &shards,
        name,
        "the Switchover condition is gone once nothing waits",
    )
    .await;
}

/// A Shard `<cluster>-postgres-default-0-inf` of `replicas` pool pods in one cell, applied with
/// `annotations` in a fresh namespace with its own handler, every pod up and the first replica
/// after pod 0 published as the primary (pod 1).
struct RunningShard {
    _handler: HandlerProcess,
    client: Client,
    ns: String,
    shards: Api<Shard>,
    name: String,
    set: String,
    before: BTreeMap<String, (String, bool)>,
}

/// [`running_shard_with`] with every volume retained.
async fn running_shard(
    cluster: &str,
    replicas: i32,
    annotations: serde_json::Value,
) -> RunningShard {
    let retain = "{whenDeleted: Retain, whenScaled: Retain}";
    running_shard_with(cluster, replicas, annotations, retain).await
}

/// A shard of `replicas` pool pods under volume policy `policy`, carrying `annotations`, up to
/// date and with roles published.
async fn running_shard_with(
    cluster: &str,
    replicas: i32,
    annotations: serde_json::Value,
    policy: &str,
) -> RunningShard {
    let local = self::cluster().await;
    let ns = fresh_namespace(local, &format!("rh-{cluster}")).await;
    let handler = start_handler(local, &ns).await;
    let client = local.client().unwrap();
    let image = "ghcr.io/multigres/multigres:sha-66d2310";
    apply_yaml(
        &client,
        &ns,
        &shard(cluster, &ns, replicas, image, policy, "1Gi"),
    )
    .await;
    let name = format!("{cluster}-postgres-default-0-inf");
    let shards: Api<Shard> = Api::namespaced(client.clone(), &ns);
    let metadata = json!({"metadata": {"annotations": annotations}});
    shards
        .patch(&name, &PatchParams::default(), &Patch::Merge(metadata))
        .await
        .unwrap();
    wait_condition(
        &shards,
        &name,
        "RollingUpdate",
        "False",
        Some("UpToDate"),
        shard_conditions,
    )
    .await;
    let set = format!("{name}-pool-main-zone-a");
    let before = pool_pods(&client, &ns, cluster).await;
    assert_eq!(before.len(), replicas as usize);
    publish_roles(&shards, &name, before.keys(), &format!("{set}-1")).await;
    RunningShard {
        _handler: handler,
        client,
        ns,
        shards,
        name,
        set,
        before,
    }
}

#[tokio::test]
async fn a_lowered_max_connections_is_held_and_restarts_no_pod() {
    let RunningShard {
        _handler,
        client,
        ns,
        shards,
        name,
        before,
        ..
    } = running_shard("lower", 3, json!({})).await;
    let name = name.as_str();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    // Each pod is stamped with the hot-standby-sensitive values it started with (the
    // baseline max_connections is 60).
    for pod in before.keys() {
        eventually("the pods' hot-standby settings stamp", WAIT, || async {
            match annotation(&pods, pod, "multigres.com/hot-standby-settings").await {
                Some(v) if v.contains("max_connections=60") => Ok(()),
                other => Err(format!("{pod}: {other:?}")),
            }
        })
        .await;
    }

    // Lowered: the file holds the running value (any pod restarting below it would abort
    // recovery), nothing needs a restart, and the status and an event say so.
    patch_spec(
        &shards,
        name,
        json!({"postgresConfig": {"max_connections": "40"}}),
    )
    .await;
    let held = |s: &Shard| {
        s.status
            .as_ref()
            .and_then(|s| s.postgres_config.as_ref())
            .map(|c| c.held_settings.clone())
            .unwrap_or_default()
    };
    eventually("heldSettings in the Shard status", WAIT, || async {
        let s = shards.get(name).await.unwrap();
        match held(&s).as_slice() {
            [one] if one == "max_connections 60 (asked 40)" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let config_maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client.clone(), &ns);
    let file = config_maps
        .get(&format!("{name}-postgres-config"))
        .await
        .unwrap()
        .data
        .unwrap()["postgresql.conf"]
        .clone();
    let last = file.lines().rfind(|l| l.starts_with("max_connections = "));
    assert_eq!(last, Some("max_connections = 60"), "{file}");
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    eventually("a PostgresConfigHeld event", WAIT, || async {
        let list = events.list(&ListParams::default()).await.unwrap();
        list.items
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("PostgresConfigHeld")
                    && e.note
                        .as_deref()
                        .is_some_and(|m| m.contains("max_connections 60 (asked 40)"))
            })
            .then_some(())
            .ok_or_else(|| "none yet".to_owned())
    })
    .await;
    wait_condition(
        &shards,
        name,
        "RollingUpdate",
        "False",
        Some("UpToDate"),
        shard_conditions,
    )
    .await;
    tokio::time::sleep(FULL_CYCLE).await;
    assert_eq!(
        pool_pods(&client, &ns, "lower").await,
        before,
        "a pod restarted for a held max_connections"
    );

    // Asked again at the running value: nothing is held any more, and no pod restarted.
    patch_spec(
        &shards,
        name,
        json!({"postgresConfig": {"max_connections": "60"}}),
    )
    .await;
    eventually("heldSettings cleared", WAIT, || async {
        let s = shards.get(name).await.unwrap();
        held(&s)
            .is_empty()
            .then_some(())
            .ok_or_else(|| format!("{:?}", held(&s)))
    })
    .await;
    assert_eq!(pool_pods(&client, &ns, "lower").await, before);
}

#[tokio::test]
async fn a_paused_shard_changes_no_workload_until_resumed() {
    let RunningShard {
        _handler,
        client,
        ns,
        shards,
        name,
        set,
        before,
    } = running_shard("hold", 3, json!({})).await;
    let name = name.as_str();
    let old = "ghcr.io/multigres/multigres:sha-66d2310";
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    let pooler_image = |sts: &StatefulSet| image_of(statefulset_pod(sts), "multipooler");

    // Paused, as the cluster-handler passes the cluster's annotation on: the condition says
    // so, and a new image and a scale-up reach neither the StatefulSet nor the pods.
    let paused = |value: serde_json::Value| json!({"metadata": {"annotations": {"multigres.com/paused": value}}});
    shards
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(paused(json!("true"))),
        )
        .await
        .unwrap();
    wait_condition(
        &shards,
        name,
        "Paused",
        "True",
        Some("PausedByAnnotation"),
        shard_conditions,
    )
    .await;
    let new = "ghcr.io/multigres/multigres:sha-next";
    patch_spec(
        &shards,
        name,
        json!({"images": {"multipooler": new}, "pools": {"main": {"replicasPerCell": 4}}}),
    )
    .await;
    tokio::time::sleep(FULL_CYCLE).await;
    let held = sets.get(&set).await.unwrap();
    assert_eq!(pooler_image(&held).as_deref(), Some(old));
    assert_eq!(held.spec.as_ref().and_then(|s| s.replicas), Some(3));
    assert_eq!(pool_pods(&client, &ns, "hold").await, before);
    let s = shards.get(name).await.unwrap();
    assert_eq!(
        condition(&shard_conditions(&s), "Available").map(|c| c.reason.as_str()),
        Some("AllReady"),
        "status keeps being reported while paused"
    );

    // Resumed: what waited is applied, and the condition goes.
    shards
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(paused(json!(null))),
        )
        .await
        .unwrap();
    eventually("the held changes applied", WAIT, || async {
        let sts = sets.get(&set).await.unwrap();
        let replicas = sts.spec.as_ref().and_then(|s| s.replicas);
        match (pooler_image(&sts).as_deref(), replicas) {
            (Some(image), Some(4)) if image == new => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    eventually("the Paused condition gone", WAIT, || async {
        let s = shards.get(name).await.unwrap();
        match condition(&shard_conditions(&s), "Paused") {
            None => Ok(()),
            Some(c) => Err(format!("{c:?}")),
        }
    })
    .await;
}

#[tokio::test]
async fn a_hibernating_shard_stops_every_pod_at_once_and_keeps_its_volumes() {
    let RunningShard {
        _handler,
        client,
        ns,
        shards,
        name,
        set,
        before,
    } = running_shard_with(
        "sleep",
        3,
        json!({}),
        "{whenDeleted: Delete, whenScaled: Delete}",
    )
    .await;
    let name = name.as_str();
    let pods: Vec<String> = before.keys().cloned().collect();
    let members: Vec<&String> = pods.iter().collect();
    // A whole cohort: a scale-down would step one pod at a time and hand the primary over.
    publish_cohort(&client, &ns, name, &pods, &format!("{set}-1"), &members).await;
    let selector = "multigres.com/cluster=sleep";
    let claims = pvc_names(&client, &ns, selector).await;
    assert_eq!(claims.len(), 3, "{claims:?}");
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let replicas = |spec: Option<i32>| spec.unwrap_or(-1);
    let switch = |value: serde_json::Value| json!({"metadata": {"annotations": {"multigres.com/hibernate": value}}});

    shards
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(switch(json!("true"))),
        )
        .await
        .unwrap();
    // The published cohort never drops a member here: a gated scale-down would wait at 2
    // replicas for good, so reaching 0 shows there is no gate.
    eventually("every workload at zero replicas", WAIT, || async {
        let sts = sets.get(&set).await.unwrap();
        let orchs = deployments
            .list(&ListParams::default().labels("app.kubernetes.io/component=multiorch"))
            .await
            .unwrap();
        let orch: Vec<i32> = orchs
            .items
            .iter()
            .map(|d| replicas(d.spec.as_ref().and_then(|s| s.replicas)))
            .collect();
        match (
            replicas(sts.spec.as_ref().and_then(|s| s.replicas)),
            orch.as_slice(),
        ) {
            (0, [0]) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    wait_condition(
        &shards,
        name,
        "Hibernated",
        "True",
        Some("Hibernated"),
        shard_conditions,
    )
    .await;
    let s = shards.get(name).await.unwrap();
    assert_eq!(
        s.status.as_ref().and_then(|s| s.phase),
        Some(multigres_api::v1alpha1::Phase::Hibernated)
    );
    assert!(pool_pods(&client, &ns, "sleep").await.is_empty());
    tokio::time::sleep(FULL_CYCLE).await;
    assert_eq!(
        pvc_names(&client, &ns, selector).await,
        claims,
        "whenScaled: Delete deletes no claim of a stopped pod"
    );

    // Woken: the pods come back on the same claims, and the condition goes.
    shards
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(switch(json!(null))),
        )
        .await
        .unwrap();
    eventually("the pool pods back", WAIT, || async {
        let now = pool_pods(&client, &ns, "sleep").await;
        (now.len() == 3)
            .then_some(())
            .ok_or_else(|| format!("{:?}", now.keys()))
    })
    .await;
    assert_eq!(pvc_names(&client, &ns, selector).await, claims);
    eventually("the Hibernated condition gone", WAIT, || async {
        let s = shards.get(name).await.unwrap();
        match condition(&shard_conditions(&s), "Hibernated") {
            None => Ok(()),
            Some(c) => Err(format!("{c:?}")),
        }
    })
    .await;
}

#[tokio::test]
async fn supervised_restarts_wait_for_a_release_of_what_is_pending() {
    // Supervised, as the cluster-handler passes the cluster's annotation on.
    let supervised = json!({"multigres.com/restart-policy": "supervised"});
    let RunningShard {
        _handler,
        client,
        ns,
        shards,
        name,
        set,
        before,
    } = running_shard("sup", 2, supervised).await;
    let name = name.as_str();

    // A new image: no pod restarts, the condition and status.pendingRestart say what waits.
    let new = "ghcr.io/multigres/multigres:sha-next";
    patch_spec(&shards, name, json!({"images": {"multipooler": new}})).await;
    let s = wait_condition(
        &shards,
        name,
        "RollingUpdate",
        "True",
        Some("WaitingForRelease"),
        shard_conditions,
    )
    .await;
    let pending = s.status.unwrap().pending_restart.unwrap();
    assert!(pending.starts_with(&set), "{pending}");
    // It says first what the restart will change: the condition and one event, both naming
    // the container and its old and new images (from the StatefulSet's revisions).
    let says = "multipooler image ghcr.io/multigres/multigres:sha-66d2310";
    let changes = format!(" -> {new}");
    eventually("the condition says what changes", WAIT, || async {
        let s = shards.get(name).await.map_err(|e| e.to_string())?;
        let message = shard_conditions(&s)
            .into_iter()
            .find(|c| c.type_ == "RollingUpdate")
            .map(|c| c.message)
            .unwrap_or_default();
        (message.contains("what changes: ") && message.contains(says) && message.contains(&changes))
            .then_some(())
            .ok_or(message)
    })
    .await;
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    let announced: Vec<String> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("RestartPending"))
        .filter_map(|e| e.note)
        .collect();
    assert!(
        !announced.is_empty()
            && announced.iter().all(|n| n.contains(&changes)
                && n.contains(&pending)
                && n.contains(
                    "one at a time with the primary last, once released: what changes: "
                )),
        "a RestartPending event naming the change and the release: {announced:?}"
    );
    tokio::time::sleep(FULL_CYCLE).await;
    assert_eq!(pool_pods(&client, &ns, "sup").await, before);

    // Released (what `kubectl multigres restart` writes): the replica restarts first.
    let release = json!({"metadata": {"annotations": {"multigres.com/release-restarts": pending}}});
    shards
        .patch(name, &PatchParams::default(), &Patch::Merge(release))
        .await
        .unwrap();
    let replica = format!("{set}-0");
    eventually("the released replica restarts", WAIT, || async {
        let now = pool_pods(&client, &ns, "sup").await;
        match (now.get(&replica), before.get(&replica)) {
            (Some((uid, _)), Some((old_uid, _))) if uid != old_uid => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

/// Publishes what the data-handler would for a shard whose pods `members` are healthy cohort
/// members and `primary` the primary: `status.podRoles`, `status.cohort` and `FailureTolerant`
/// (true from three members, as under `AT_LEAST_2`; one apply, as the data-handler's is), and
/// each pod's `multigres.com/cohort` and `multigres.com/role` labels.
async fn publish_cohort(
    client: &Client,
    ns: &str,
    shard: &str,
    pods: &[String],
    primary: &str,
    members: &[&String],
) {
    let tolerant = members.len() >= 3;
    publish_cohort_as(client, ns, shard, pods, primary, members, tolerant).await;
}

/// [`publish_cohort`], saying whether the shard survives losing one pod.
async fn publish_cohort_as(
    client: &Client,
    ns: &str,
    shard: &str,
    pods: &[String],
    primary: &str,
    members: &[&String],
    tolerant: bool,
) {
    let roles: BTreeMap<&String, &str> = pods
        .iter()
        .map(|p| (p, if p == primary { "PRIMARY" } else { "REPLICA" }))
        .collect();
    let cohort: BTreeMap<&String, serde_json::Value> = pods
        .iter()
        .map(|p| {
            let member = members.contains(&p);
            let replication = if p == primary { "Primary" } else { "Streaming" };
            (p, json!({"member": member, "replication": replication}))
        })
        .collect();
    let summary = format!("{}/{} AT_LEAST_2", members.len(), members.len());
    let shards: Api<Shard> = Api::namespaced(client.clone(), ns);
    let status = json!({
        "podRoles": roles,
        "cohort": {"summary": summary, "policy": "AT_LEAST_2", "required": 2,
                   "leader": primary, "pods": cohort},
        "conditions": [failure_tolerant(tolerant)],
    });
    publish_status(&shards, shard, status).await;
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    for pod in pods {
        let value = if members.contains(&pod) {
            "member"
        } else {
            "outside"
        };
        let role = if pod == primary { "primary" } else { "replica" };
        let patch = json!({"metadata": {"labels": {
            "multigres.com/cohort": value,
            "multigres.com/role": role,
        }}});
        // The handler may act on the status above before the labels land: a pod it has
        // already scaled away needs no labels.
        match api
            .patch(pod, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => panic!("labelling pod {pod}: {e}"),
        }
    }
}

/// The data-handler's `FailureTolerant` condition: whether writes survive losing one pod.
fn failure_tolerant(tolerant: bool) -> serde_json::Value {
    let (status, reason) = match tolerant {
        true => ("True", "SurvivesOnePodLoss"),
        false => ("False", "OnePodLossStopsWrites"),
    };
    json!({"type": "FailureTolerant", "status": status, "reason": reason, "message": "",
           "lastTransitionTime": "2026-01-01T00:00:00Z"})
}

/// Waits until pod `name` carries the handler's request to hand over (`what` says why).
async fn asked_to_hand_over(pods: &Api<Pod>, name: &str, what: &str) {
    eventually(what, WAIT, || async {
        match annotation(pods, name, "multigres.com/switchover-requested").await {
            Some(_) => Ok(()),
            None => Err("no request yet".to_owned()),
        }
    })
    .await;
}

/// The value of annotation `key` on pod `name`.
async fn annotation(pods: &Api<Pod>, name: &str, key: &str) -> Option<String> {
    let pod = pods.get(name).await.unwrap();
    pod.annotations().get(key).cloned()
}

#[tokio::test]
async fn a_person_asks_for_a_switchover_and_scale_downs_wait_for_the_cohort() {
    let cluster = cluster().await;
    let ns = fresh_namespace(cluster, "rh-cohort").await;
    let _handler = start_handler(cluster, &ns).await;
    let client = cluster.client().unwrap();
    let image = "ghcr.io/multigres/multigres:sha-66d2310";
    let retain = "{whenDeleted: Retain, whenScaled: Retain}";
    apply_yaml(&client, &ns, &shard("co", &ns, 3, image, retain, "1Gi")).await;
    let name = "co-postgres-default-0-inf";
    let set = format!("{name}-pool-main-zone-a");
    let shards: Api<Shard> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let names: Vec<String> = eventually("three Ready pool pods", WAIT, || async {
        let now = pool_pods(&client, &ns, "co").await;
        match now.len() == 3 && now.values().all(|(_, ready)| *ready) {
            true => Ok(now.into_keys().collect()),
            false => Err(format!("{now:?}")),
        }
    })
    .await;
    let (p0, p1) = (format!("{set}-0"), format!("{set}-1"));
    let all: Vec<&String> = names.iter().collect();
    publish_cohort(&client, &ns, name, &names, &p1, &all).await;
    wait_condition(&shards, name, "Available", "True", None, shard_conditions).await;

    // The pool's replica budget, as the disruption controller reads it, lets a drain take one
    // of the two replicas of this three-pod StatefulSet (whose primary it does not select).
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), &ns);
    eventually("one replica may be evicted", WAIT, || async {
        let pdb = budgets.get(&set).await.map_err(|e| e.to_string())?;
        let status = pdb.status.unwrap_or_default();
        match (status.expected_pods, status.disruptions_allowed) {
            (2, 1) => Ok(()),
            other => Err(format!("expected pods, disruptions allowed: {other:?}")),
        }
    })
    .await;

    // A person asks the primary to hand over with `kubectl multigres switchover --wait`: the
    // plugin annotates the primary the Shard names, the handler turns that into the request the
    // data-handler answers, and says so; the plugin follows until another pod is the primary.
    let error = run_plugin(cluster, &["status", "co", "-n", &ns])
        .await
        .unwrap_err();
    let expected =
        format!("MultigresCluster {ns}/co not found in namespace {ns}; no clusters here");
    assert!(error.contains(&expected), "{error}");
    let args = ["switchover", name, "-n", &ns, "--wait", "--timeout", "120"].map(str::to_owned);
    let plugin = tokio::spawn(async move {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run_plugin(cluster, &args).await
    });
    asked_to_hand_over(&pods, &p1, "the primary is asked to hand over").await;
    let s = wait_condition(
        &shards,
        name,
        "Switchover",
        "True",
        Some("WaitingForSwitchover"),
        shard_conditions,
    )
    .await;
    let message = condition(&shard_conditions(&s), "Switchover")
        .unwrap()
        .message
        .clone();
    assert!(message.contains("as asked for on it"), "{message}");

    // Multiorch promoted pod 0 (published here as the data-handler would): the person's
    // request is answered and removed, the handler's withdrawn.
    publish_cohort(&client, &ns, name, &names, &p0, &all).await;
    let said = plugin.await.unwrap().unwrap_or_else(|e| panic!("{e}"));
    println!("kubectl multigres switchover:\n{said}");
    assert!(
        said.contains(&format!("asked {p1} (primary of Shard {name})")),
        "{said}"
    );
    assert!(
        said.contains(&format!("{p1} is still the primary")),
        "progress: {said}"
    );
    assert!(
        said.contains(&format!("{p0} is the primary (was {p1})")),
        "{said}"
    );
    eventually("the answered requests are removed", WAIT, || async {
        let user = annotation(&pods, &p1, "multigres.com/switchover").await;
        let handler = annotation(&pods, &p1, "multigres.com/switchover-requested").await;
        match (user, handler) {
            (None, None) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    switchover_condition_clears(
        &shards,
        name,
        "the Switchover condition is gone once answered",
    )
    .await;
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    let done = eventually("a SwitchoverDone event", WAIT, || async {
        let list = events.list(&ListParams::default()).await.unwrap().items;
        list.into_iter()
            .find(|e| e.reason.as_deref() == Some("SwitchoverDone"))
            .and_then(|e| e.note)
            .ok_or("none yet".to_owned())
    })
    .await;
    assert!(done.contains(&p1) && done.contains(&p0), "{done}");

    // A scale-down 3 -> 2 that removes the primary (pod 2, placed there on purpose) while pod 1,
    // which stays, is outside the cohort: held at 3, the ScaleDown condition names pod 1, and
    // nobody is asked to hand over yet.
    let p2 = format!("{set}-2");
    let members: Vec<&String> = names.iter().filter(|p| **p != p1).collect();
    publish_cohort(&client, &ns, name, &names, &p2, &members).await;
    patch_spec(
        &shards,
        name,
        json!({"pools": {"main": {"replicasPerCell": 2}}}),
    )
    .await;
    let s = wait_condition(
        &shards,
        name,
        "ScaleDown",
        "True",
        Some("WaitingForCohort"),
        shard_conditions,
    )
    .await;
    let message = condition(&shard_conditions(&s), "ScaleDown")
        .unwrap()
        .message
        .clone();
    assert!(message.contains(&format!("not yet: {p1}")), "{message}");
    tokio::time::sleep(FULL_CYCLE).await;
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    let replicas = |sts: StatefulSet| sts.spec.and_then(|s| s.replicas);
    assert_eq!(replicas(sets.get(&set).await.unwrap()), Some(3), "held");
    assert_eq!(
        annotation(&pods, &p2, "multigres.com/switchover-requested").await,
        None,
        "no hand-over while the cohort is not whole"
    );

    // Pod 1 is a member again: the primary is asked to hand over before it is removed, and
    // held at 3 until pod 0 is the primary; then pod 2 goes.
    publish_cohort(&client, &ns, name, &names, &p2, &all).await;
    asked_to_hand_over(
        &pods,
        &p2,
        "the primary is asked to hand over before it is removed",
    )
    .await;
    let s = wait_condition(&shards, name, "Switchover", "True", None, shard_conditions).await;
    let message = condition(&shard_conditions(&s), "Switchover")
        .unwrap()
        .message
        .clone();
    assert!(message.contains("scales down from 3 to 2"), "{message}");
    tokio::time::sleep(FULL_CYCLE).await;
    assert_eq!(
        replicas(sets.get(&set).await.unwrap()),
        Some(3),
        "held for the primary"
    );
    publish_cohort(&client, &ns, name, &names, &p0, &all).await;
    eventually("the old primary goes", WAIT, || async {
        match replicas(sets.get(&set).await.unwrap()) {
            Some(2) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    eventually("the ScaleDown condition is gone", WAIT, || async {
        let s = shards.get(name).await.unwrap();
        match condition(&shard_conditions(&s), "ScaleDown") {
            None => Ok(()),
            Some(c) => Err(c.message.clone()),
        }
    })
    .await;
}

/// Creates a fake node `name` in zone-id `zone` (kwok runs its pods).
async fn create_node(client: &Client, name: &str, zone: &str) {
    let node: Node = serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {"kubernetes.io/hostname": name, "type": "kwok", ZONE_ID_LABEL: zone},
        },
        "status": {
            "allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110"},
            "capacity": {"cpu": "32", "memory": "256Gi", "pods": "110"},
        },
    }))
    .unwrap();
    Api::<Node>::all(client.clone())
        .create(&Default::default(), &node)
        .await
        .unwrap();
}

/// The status code of a refused eviction of pod `name`, `None` when it is evicted.
async fn evict(pods: &Api<Pod>, name: &str) -> Option<u16> {
    match pods.evict(name, &Default::default()).await {
        Ok(_) => None,
        Err(kube::Error::Api(e)) => Some(e.code),
        Err(e) => panic!("evicting {name}: {e}"),
    }
}

/// The pods of Deployment `name` not being deleted, each with its node and readiness.
async fn deployment_pods(client: &Client, ns: &str, name: &str) -> Vec<(String, bool)> {
    let deployment = Api::<Deployment>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .unwrap();
    let labels = deployment.spec.unwrap().selector.match_labels.unwrap();
    let selector: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&selector.join(",")))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|pod| pod.metadata.deletion_timestamp.is_none())
        .map(|pod| {
            let ready = multigres_e2e::real::is_ready(&pod);
            (
                pod.spec.and_then(|s| s.node_name).unwrap_or_default(),
                ready,
            )
        })
        .collect()
}

/// Sets `spec.unschedulable` of node `name`, as `kubectl cordon` and `uncordon` do.
async fn set_cordoned(nodes: &Api<Node>, name: &str, cordoned: bool) {
    let patch = json!({"spec": {"unschedulable": cordoned}});
    nodes
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_drain_takes_the_primary_only_after_it_hands_over_and_nothing_that_would_stop_writes() {
    let cluster = cluster().await;
    let ns = fresh_namespace(cluster, "rh-drain").await;
    let client = cluster.client().unwrap();
    // Nodes of the test's own, so a cordon disturbs no other test: two in zone A (the second
    // a spare that multiorch can move to), one in zone B.
    let (node_a, spare_a, node_b) = (format!("{ns}-a"), format!("{ns}-a2"), format!("{ns}-b"));
    create_node(&client, &node_a, &node_a).await;
    create_node(&client, &spare_a, &node_a).await;
    create_node(&client, &node_b, &node_b).await;
    let nodes: Api<Node> = Api::all(client.clone());
    // The spare stays cordoned until zone A's pods run, so they all start on node A.
    set_cordoned(&nodes, &spare_a, true).await;
    // The handler may list nodes cluster-wide, as the chart's ClusterRoleBinding lets it.
    let binding: k8s_openapi::api::rbac::v1::ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": format!("{ns}-resource-handler")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "multigres-operator-resource-handler"},
        "subjects": [{"kind": "ServiceAccount", "name": "resource-handler", "namespace": ns}],
    }))
    .unwrap();
    let bindings: Api<k8s_openapi::api::rbac::v1::ClusterRoleBinding> = Api::all(client.clone());
    bindings
        .create(&Default::default(), &binding)
        .await
        .unwrap();
    let _handler = start_handler(cluster, &ns).await;
    let image = "ghcr.io/multigres/multigres:sha-66d2310";
    let retain = "{whenDeleted: Retain, whenScaled: Retain}";
    let yaml = shard("dr", &ns, 1, image, retain, "1Gi")
        .replace("cells: [zone-a]", "cells: [zone-a, zone-b]")
        .replace(
            &format!("zone-a: {{{ZONE_ID_LABEL}: zone-a}}"),
            &format!(
                "zone-a: {{{ZONE_ID_LABEL}: {node_a}}}\n    zone-b: {{{ZONE_ID_LABEL}: {node_b}}}"
            ),
        );
    apply_yaml(&client, &ns, &yaml).await;
    let name = "dr-postgres-default-0-inf";
    let orch = format!("{name}-multiorch-zone-a");
    let (on_a, on_b) = (
        format!("{name}-pool-main-zone-a-0"),
        format!("{name}-pool-main-zone-b-0"),
    );
    let names = vec![on_a.clone(), on_b.clone()];
    eventually("a Ready pool pod on each node", WAIT, || async {
        let now = pool_pods(&client, &ns, "dr").await;
        match now.len() == 2 && now.values().all(|(_, ready)| *ready) {
            true => Ok(()),
            false => Err(format!("{now:?}")),
        }
    })
    .await;
    let orch_on = |node: String| {
        let (client, ns, orch) = (client.clone(), ns.clone(), orch.clone());
        move || {
            let (client, ns, orch, node) = (client.clone(), ns.clone(), orch.clone(), node.clone());
            async move {
                let pods = deployment_pods(&client, &ns, &orch).await;
                match pods.as_slice() {
                    [(on, true)] if *on == node => Ok(()),
                    other => Err(format!("multiorch pods (node, ready): {other:?}")),
                }
            }
        }
    };
    eventually("multiorch Ready on node A", WAIT, orch_on(node_a.clone())).await;
    set_cordoned(&nodes, &spare_a, false).await;
    let all: Vec<&String> = names.iter().collect();
    publish_cohort(&client, &ns, name, &names, &on_a, &all).await;

    // Neither the primary's budget nor the only multiorch's allows an eviction.
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), &ns);
    for budget in [format!("{name}-primary"), orch.clone()] {
        eventually("the budget is in force", WAIT, || async {
            let pdb = budgets.get(&budget).await.map_err(|e| e.to_string())?;
            let status = pdb.status.unwrap_or_default();
            match (status.expected_pods, status.disruptions_allowed) {
                (1, 0) => Ok(()),
                other => Err(format!(
                    "{budget}: expected pods, disruptions allowed: {other:?}"
                )),
            }
        })
        .await;
    }
    // Evictions without kube's retries, which wait out a refusal's Retry-After for minutes.
    let once = {
        let mut config = cluster.config().clone();
        config.default_retry = false;
        Client::try_from(config).unwrap()
    };
    let evictions: Api<Pod> = Api::namespaced(once, &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    assert_eq!(
        evict(&evictions, &on_a).await,
        Some(429),
        "the primary is not evicted"
    );

    // `kubectl drain` cordons the node first: the primary is asked to hand over to the replica
    // on the other node, and says why; multiorch, which appoints the new primary, stays.
    set_cordoned(&nodes, &node_a, true).await;
    asked_to_hand_over(
        &pods,
        &on_a,
        "the primary on the cordoned node is asked to hand over",
    )
    .await;
    let shards: Api<Shard> = Api::namespaced(client.clone(), &ns);
    let s = wait_condition(&shards, name, "Switchover", "True", None, shard_conditions).await;
    let message = condition(&shard_conditions(&s), "Switchover")
        .unwrap()
        .message
        .clone();
    assert!(
        message.contains("before its node, cordoned, is drained"),
        "{message}"
    );
    let s = wait_condition(
        &shards,
        name,
        "Drain",
        "True",
        Some("PrimaryHandingOver"),
        shard_conditions,
    )
    .await;
    let message = condition(&shard_conditions(&s), "Drain")
        .unwrap()
        .message
        .clone();
    assert!(message.contains(&on_a), "{message}");
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let moved = |d: &Deployment| d.annotations().get("multigres.com/drained-node").cloned();
    assert_eq!(
        moved(&deployments.get(&orch).await.unwrap()),
        None,
        "multiorch does not move while the primary has not handed over"
    );

    // Handed over (published as the data-handler would): the old primary is a replica. Two
    // pods under AT_LEAST_2 cannot lose one without stopping writes: its eviction is refused,
    // and the Shard says why and what to do. multiorch moves to the spare node.
    publish_cohort(&client, &ns, name, &names, &on_b, &all).await;
    let s = wait_condition(
        &shards,
        name,
        "Drain",
        "True",
        Some("EvictionWouldStopWrites"),
        shard_conditions,
    )
    .await;
    let message = condition(&shard_conditions(&s), "Drain")
        .unwrap()
        .message
        .clone();
    assert!(message.contains("replicasPerCell"), "{message}");
    assert_eq!(
        evict(&evictions, &on_a).await,
        Some(429),
        "a pod the cohort cannot spare is not evicted"
    );
    eventually(
        "multiorch runs on the spare node",
        WAIT,
        orch_on(spare_a.clone()),
    )
    .await;
    let mark = moved(&deployments.get(&orch).await.unwrap()).unwrap_or_default();
    assert!(mark.starts_with(&format!("{node_a}/")), "{mark}");

    // Once the shard survives losing a pod (the data-handler says so), the drain evicts it.
    publish_cohort_as(&client, &ns, name, &names, &on_b, &all, true).await;
    eventually("the old primary can be evicted", WAIT, || async {
        match evict(&evictions, &on_a).await {
            None => Ok(()),
            Some(code) => Err(format!("refused: {code}")),
        }
    })
    .await;
    bindings
        .delete(&format!("{ns}-resource-handler"), &Default::default())
        .await
        .unwrap();
    for node in [&node_a, &spare_a, &node_b] {
        nodes.delete(node, &Default::default()).await.unwrap();
    }
}

/// Waits until Shard `name` has no `Switchover` condition. The handler removes the answered
/// requests from the pod before it writes the Shard's status, so the two are seen apart.
async fn switchover_condition_clears(shards: &Api<Shard>, name: &str, what: &str) {
    eventually(what, WAIT, || async {
        let s = shards.get(name).await.map_err(|e| e.to_string())?;
        match condition(&shard_conditions(&s), "Switchover") {
            None => Ok(()),
            Some(c) => Err(format!("{:?}: {}", c.reason, c.message)),
        }
    })
    .await;
}

/// The image of `container` in a workload's pod template.
fn image_of(pod: &k8s_openapi::api::core::v1::PodSpec, container: &str) -> Option<String> {
    pod.containers
        .iter()
        .find(|c| c.name == container)
        .and_then(|c| c.image.clone())
}

/// Sets the image of `container` in the pod template of workload `name`, as `kubectl edit`
/// would.
async fn edit_image<K>(api: &Api<K>, name: &str, container: &str, image: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let patch = json!({"spec": {"template": {"spec": {"containers": [
        {"name": container, "image": image}
    ]}}}});
    api.patch(name, &PatchParams::default(), &Patch::Strategic(patch))
        .await
        .unwrap_or_else(|e| panic!("editing the image of {name}: {e}"));
}

/// Server-side applies of `kind` by the shard controller so far.
fn shard_applies(writes: &BTreeMap<String, u64>, kind: &str) -> u64 {
    writes
        .get(&format!("shard/{kind}/apply"))
        .copied()
        .unwrap_or(0)
}

#[tokio::test]
async fn edited_pod_templates_are_reverted_with_one_write_also_after_a_restart() {
    let cluster = cluster().await;
    let ns = fresh_namespace(cluster, "rh-drift").await;
    let mut handler = start_handler(cluster, &ns).await;
    let client = cluster.client().unwrap();
    let image = "ghcr.io/multigres/multigres:sha-66d2310";
    let retain = "{whenDeleted: Retain, whenScaled: Retain}";
    apply_yaml(&client, &ns, &shard("drift", &ns, 1, image, retain, "1Gi")).await;
    let name = "drift-postgres-default-0-inf";
    let shards: Api<Shard> = Api::namespaced(client.clone(), &ns);
    let set = format!("{name}-pool-main-zone-a");
    let primary = format!("{set}-0");
    publish_roles(&shards, name, [&primary], &primary).await;
    wait_condition(&shards, name, "Available", "True", None, shard_conditions).await;
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let orch = format!("{name}-multiorch-zone-a");
    let converged = handler.settled(Duration::from_secs(3)).await;

    // Someone edits a container image in the pool StatefulSet and in the multiorch
    // Deployment: both are put back, with one apply each.
    edit_image(&sets, &set, "multipooler", "example.com/edited:1").await;
    edit_image(&deployments, &orch, "multiorch", "example.com/edited:1").await;
    let edited = Instant::now();
    eventually("both edited images are reverted", WAIT, || async {
        let sts = sets.get(&set).await.map_err(|e| e.to_string())?;
        let deployment = deployments.get(&orch).await.map_err(|e| e.to_string())?;
        let images = (
            image_of(statefulset_pod(&sts), "multipooler"),
            image_of(deployment_pod(&deployment), "multiorch"),
        );
        if images == (Some(image.to_owned()), Some(image.to_owned())) {
            Ok(())
        } else {
            Err(format!("{images:?}"))
        }
    })
    .await;
    println!("edited images reverted in {:?}", edited.elapsed());
    let reverted = handler.settled(Duration::from_secs(3)).await;
    for kind in ["StatefulSet", "Deployment"] {
        assert_eq!(
            shard_applies(&reverted, kind) - shard_applies(&converged, kind),
            1,
            "{kind} applies: {converged:?} then {reverted:?}"
        );
    }

    // While the handler is down, someone edits the Deployment's image again. The restarted
    // handler knows no template yet: it reads both workloads once, writes back only the
    // edited one and leaves the StatefulSet alone.
    handler.stop();
    edit_image(&deployments, &orch, "multiorch", "example.com/edited:2").await;
    handler.restart().await;
    eventually("the image edited while down is reverted", WAIT, || async {
        let deployment = deployments.get(&orch).await.map_err(|e| e.to_string())?;
        match image_of(deployment_pod(&deployment), "multiorch") {
            Some(now) if now == image => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let restarted = handler.settled(Duration::from_secs(3)).await;
    println!("writes after the restart: {restarted:?}");
    assert_eq!(shard_applies(&restarted, "Deployment"), 1, "{restarted:?}");
    assert_eq!(shard_applies(&restarted, "StatefulSet"), 0, "{restarted:?}");
}

/// A pool pod that cannot run is named on the Shard with the scheduler's reason: here its
/// volume asks for a StorageClass that does not exist, so the claim never binds.
#[tokio::test]
async fn a_pool_pod_that_cannot_schedule_is_named_on_the_shard_with_why() {
    let cluster = cluster().await;
    let ns = fresh_namespace(cluster, "rh-unready").await;
    let handler = start_handler(cluster, &ns).await;
    let client = cluster.client().unwrap();
    let image = "ghcr.io/multigres/multigres:sha-66d2310";
    let policy = "{whenDeleted: Delete, whenScaled: Delete}";
    let storage = "1Gi, class: no-such-class";
    apply_yaml(
        &client,
        &ns,
        &shard("stuck", &ns, 1, image, policy, storage),
    )
    .await;
    let shards: Api<Shard> = Api::namespaced(client.clone(), &ns);
    let name = "stuck-postgres-default-0-inf";
    let pod = format!("{name}-pool-main-zone-a-0");
    let message = eventually("the Shard names its unschedulable pod", WAIT, || async {
        let shard = shards.get(name).await.map_err(|e| e.to_string())?;
        let conds = shard_conditions(&shard);
        let available = condition(&conds, "Available").ok_or("no Available condition")?;
        let named = format!("not ready: {pod}: unschedulable: ");
        if available.status == "False"
            && available.reason == "NotReady"
            && available.message.contains(&named)
        {
            Ok(available.message.clone())
        } else {
            Err(format!("{available:?}"))
        }
    })
    .await;
    println!("Available=False NotReady: {message}");
    assert!(
        message.contains("pod has unbound immediate PersistentVolumeClaims"),
        "the scheduler's reason is quoted: {message}"
    );
    assert!(handler.exit_status().is_none(), "the handler exited");
}

/// The request and the capacity of claim `name`, as written.
async fn claim_size(pvcs: &Api<PersistentVolumeClaim>, name: &str) -> (String, String) {
    let pvc = pvcs.get(name).await.unwrap();
    let request = pvc
        .spec
        .and_then(|s| s.resources)
        .and_then(|r| r.requests)
        .and_then(|r| r.get("storage").map(|q| q.0.clone()))
        .unwrap_or_default();
    let capacity = pvc
        .status
        .and_then(|s| s.capacity)
        .and_then(|c| c.get("storage").map(|q| q.0.clone()))
        .unwrap_or_default();
    (request, capacity)
}

/// Gives claim `name` the capacity `size`, as storage does once an expansion is done (no
/// resizer runs on fake nodes).
async fn expanded(pvcs: &Api<PersistentVolumeClaim>, name: &str, size: &str) {
    pvcs.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"capacity": {"storage": size}}})),
    )
    .await
    .unwrap_or_else(|e| panic!("expanding {name}: {e}"));
}

/// Publishes the data-handler's `podRoles` and one pod's measured `used` bytes of `capacity`.
async fn publish_usage(shards: &Api<Shard>, shard: &str, pod: &str, used: i64, capacity: i64) {
    publish_status(
        shards,
        shard,
        json!({"podRoles": {pod: "PRIMARY"},
               "volumes": [{"pod": pod, "dataBytes": used - (64 << 20), "walBytes": 64 << 20,
                            "capacityBytes": capacity, "measuredAt": "2026-12-05T07:00:00Z"}]}),
    )
    .await;
}

#[tokio::test]
async fn a_pool_volume_past_its_threshold_grows_by_the_step_up_to_the_ceiling_and_says_so() {
    let cluster = cluster().await;
    let ns = fresh_namespace(cluster, "rh-autogrow").await;
    let _handler = start_handler(cluster, &ns).await;
    let client = cluster.client().unwrap();
    let image = "ghcr.io/multigres/multigres:sha-66d2310";
    multigres_e2e::harness::allow_volume_expansion(&client).await;
    let retain = "{whenDeleted: Retain, whenScaled: Retain}";
    apply_yaml(&client, &ns, &shard("grow", &ns, 1, image, retain, "1Gi")).await;
    let name = "grow-postgres-default-0-inf";
    let pod = "grow-postgres-default-0-inf-pool-main-zone-a-0";
    let claim = format!("data-{pod}");
    let shards: Api<Shard> = Api::namespaced(client.clone(), &ns);
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    patch_spec(
        &shards,
        name,
        json!({"pools": {"main": {"autoGrow": {"threshold": 80, "step": "50%", "ceiling": "2Gi"}}}}),
    )
    .await;
    eventually("the claim is bound at 1Gi", WAIT, || async {
        match pvcs.get_opt(&claim).await.map_err(|e| e.to_string())? {
            Some(_) => match claim_size(&pvcs, &claim).await {
                (r, c) if r == "1Gi" && c == "1Gi" => Ok(()),
                other => Err(format!("{other:?}")),
            },
            None => Err("no claim yet".to_owned()),
        }
    })
    .await;
    const GI: i64 = 1 << 30;
    // Below the threshold: nothing.
    publish_usage(&shards, name, pod, GI * 7 / 10, GI).await;
    wait_condition(
        &shards,
        name,
        "VolumeAutoGrow",
        "True",
        Some("BelowCeiling"),
        shard_conditions,
    )
    .await;
    assert_eq!(claim_size(&pvcs, &claim).await.0, "1Gi");

    // Past 80 %: +50 %, then nothing more until storage gave it, however full.
    publish_usage(&shards, name, pod, GI * 85 / 100, GI).await;
    let grown = |want: &'static str| {
        let (pvcs, claim) = (pvcs.clone(), claim.clone());
        async move {
            eventually(&format!("{claim} requests {want}"), WAIT, || async {
                match claim_size(&pvcs, &claim).await {
                    (r, _) if r == want => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            })
            .await;
        }
    };
    grown("1536Mi").await;
    publish_usage(&shards, name, pod, GI * 95 / 100, GI).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        claim_size(&pvcs, &claim).await.0,
        "1536Mi",
        "one step while expanding"
    );

    // Given, and past 80 % again: the step is cut at the ceiling.
    expanded(&pvcs, &claim, "1536Mi").await;
    publish_usage(&shards, name, pod, 1300 << 20, 1536 << 20).await;
    grown("2Gi").await;
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    let notes = |reason: &'static str| {
        let events = events.clone();
        async move {
            events
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .filter(|e| e.reason.as_deref() == Some(reason))
                .filter_map(|e| e.note)
                .collect::<Vec<String>>()
        }
    };
    // One series for the claim: its first note, and two occurrences. The Event is published
    // after the claim's write, so it is waited for.
    eventually("one VolumeAutoGrown series of two", WAIT, || async {
        let growths: Vec<(String, i32)> = events
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("VolumeAutoGrown"))
            .map(|e| {
                let count = e.series.map_or(1, |s| s.count);
                (e.note.unwrap_or_default(), count)
            })
            .collect();
        match growths.as_slice() {
            [(note, 2)]
                if note.contains("uses 871Mi of 1024Mi (threshold 80 %): requested 1536Mi") =>
            {
                Ok(())
            }
            _ => Err(format!("{growths:?}")),
        }
    })
    .await;

    // At the ceiling and past 80 %: nothing grows, and the condition and one event say so.
    expanded(&pvcs, &claim, "2Gi").await;
    publish_usage(&shards, name, pod, GI * 19 / 10, 2 * GI).await;
    let s = wait_condition(
        &shards,
        name,
        "VolumeAutoGrow",
        "False",
        Some("AtCeiling"),
        shard_conditions,
    )
    .await;
    let message = condition(&shard_conditions(&s), "VolumeAutoGrow")
        .unwrap()
        .message
        .clone();
    assert!(
        message.contains(&format!("volume {claim} is at its ceiling 2Gi"))
            && message.contains("raise autoGrow.ceiling"),
        "{message}"
    );
    assert_eq!(
        claim_size(&pvcs, &claim).await.0,
        "2Gi",
        "never past the ceiling"
    );
    // A claim auto-grown above storage.size is no shrink.
    let s = shards.get(name).await.unwrap();
    let conditions = shard_conditions(&s);
    let synced = condition(&conditions, "StorageSynced").unwrap();
    assert_eq!(synced.reason, "UpToDate", "{synced:?}");
    let at_ceiling = eventually("the AtCeiling Event", WAIT, || async {
        let at_ceiling = notes("AtCeiling").await;
        match at_ceiling.is_empty() {
            true => Err("not yet".to_owned()),
            false => Ok(at_ceiling),
        }
    })
    .await;
    assert_eq!(at_ceiling.len(), 1, "announced once: {at_ceiling:?}");

    // The webhook is not in this tier; the handler reports a setting it cannot read.
    patch_spec(
        &shards,
        name,
        json!({"pools": {"main": {"autoGrow": {"step": "0%", "ceiling": "2Gi"}}}}),
    )
    .await;
    let s = wait_condition(
        &shards,
        name,
        "VolumeAutoGrow",
        "False",
        Some("InvalidSpec"),
        shard_conditions,
    )
    .await;
    let message = condition(&shard_conditions(&s), "VolumeAutoGrow")
        .unwrap()
        .message
        .clone();
    assert!(message.contains("pools.main.autoGrow.step"), "{message}");
}

#[tokio::test]
async fn a_larger_volume_on_a_class_without_expansion_is_refused_and_says_so() {
    let cluster = cluster().await;
    let ns = fresh_namespace(cluster, "rh-fixed-size").await;
    let _handler = start_handler(cluster, &ns).await;
    let client = cluster.client().unwrap();
    let image = "ghcr.io/multigres/multigres:sha-66d2310";
    // A class no provisioner serves and that cannot expand; its volume is made by hand, as an
    // administrator makes static volumes.
    let class = format!("fixed-{ns}");
    let pod = "fixed-postgres-default-0-inf-pool-main-zone-a-0";
    let claim = format!("data-{pod}");
    apply_yaml(
        &client,
        &ns,
        &format!(
            r#"
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {{name: {class}}}
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: Immediate
allowVolumeExpansion: false
---
apiVersion: v1
kind: PersistentVolume
metadata: {{name: {class}}}
spec:
  capacity: {{storage: 1Gi}}
  accessModes: [ReadWriteOnce]
  storageClassName: {class}
  persistentVolumeReclaimPolicy: Retain
  claimRef: {{namespace: {ns}, name: {claim}}}
  hostPath: {{path: /tmp/{class}}}
"#
        ),
    )
    .await;
    let retain = "{whenDeleted: Retain, whenScaled: Retain}";
    let yaml = shard("fixed", &ns, 1, image, retain, "1Gi").replace(
        "storage: {size: 1Gi}",
        &format!("storage: {{size: 1Gi, class: {class}}}"),
    );
    apply_yaml(&client, &ns, &yaml).await;
    let name = "fixed-postgres-default-0-inf";
    let shards: Api<Shard> = Api::namespaced(client.clone(), &ns);
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    eventually("the claim is bound to the static volume", WAIT, || async {
        match pvcs.get_opt(&claim).await.map_err(|e| e.to_string())? {
            Some(c) if c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound") => {
                Ok(())
            }
            other => Err(format!("{:?}", other.and_then(|c| c.status))),
        }
    })
    .await;
    patch_spec(
        &shards,
        name,
        json!({"pools": {"main": {"storage": {"size": "2Gi"}}}}),
    )
    .await;
    let s = wait_condition(
        &shards,
        name,
        "StorageSynced",
        "False",
        Some("ExpansionRefused"),
        shard_conditions,
    )
    .await;
    let message = condition(&shard_conditions(&s), "StorageSynced")
        .unwrap()
        .message
        .clone();
    println!("StorageSynced: {message}");
    assert!(
        message.contains(&format!("growing volume {claim} was refused"))
            && message.contains("allowVolumeExpansion: true"),
        "{message}"
    );
    assert_eq!(claim_size(&pvcs, &claim).await.0, "1Gi", "nothing changed");
}

#[tokio::test]
async fn pool_volumes_are_kept_or_removed_as_the_policy_says_and_grow_but_never_shrink() {
    let cluster = cluster().await;
    let ns = fresh_namespace(cluster, "rh-volumes").await;
    let handler = start_handler(cluster, &ns).await;
    let client = cluster.client().unwrap();
    let image = "ghcr.io/multigres/multigres:sha-66d2310";
    multigres_e2e::harness::allow_volume_expansion(&client).await;
    let keep = "{whenDeleted: Retain, whenScaled: Delete}";
    let drop_all = "{whenDeleted: Delete, whenScaled: Retain}";
    apply_yaml(&client, &ns, &shard("keep", &ns, 3, image, keep, "1Gi")).await;
    apply_yaml(&client, &ns, &shard("drop", &ns, 2, image, drop_all, "1Gi")).await;
    let shards: Api<Shard> = Api::namespaced(client.clone(), &ns);
    for (name, replicas) in [
        ("keep-postgres-default-0-inf", 3),
        ("drop-postgres-default-0-inf", 2),
    ] {
        let set = format!("{name}-pool-main-zone-a");
        let pods: Vec<String> = (0..replicas).map(|i| format!("{set}-{i}")).collect();
        publish_roles(&shards, name, &pods, &pods[0]).await;
        wait_condition(&shards, name, "Available", "True", None, shard_conditions).await;
    }
    let keep_sel = "app.kubernetes.io/component=shard-pool,multigres.com/cluster=keep";
    let drop_sel = "app.kubernetes.io/component=shard-pool,multigres.com/cluster=drop";
    let keep_set = "keep-postgres-default-0-inf-pool-main-zone-a";
    let drop_set = "drop-postgres-default-0-inf-pool-main-zone-a";
    assert_eq!(pvc_names(&client, &ns, keep_sel).await.len(), 3);

    // Growth: the larger size reaches every existing volume.
    patch_spec(
        &shards,
        "keep-postgres-default-0-inf",
        json!({"pools": {"main": {"storage": {"size": "2Gi"}}}}),
    )
    .await;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    eventually("the pool volumes request 2Gi", WAIT, || async {
        let sizes: Vec<String> = pvcs
            .list(&ListParams::default().labels(keep_sel))
            .await
            .map_err(|e| e.to_string())?
            .items
            .iter()
            .filter_map(|p| {
                Some(
                    p.spec.as_ref()?.resources.as_ref()?.requests.as_ref()?["storage"]
                        .0
                        .clone(),
                )
            })
            .collect();
        if sizes.len() == 3 && sizes.iter().all(|s| s == "2Gi") {
            Ok(())
        } else {
            Err(format!("{sizes:?}"))
        }
    })
    .await;
    wait_condition(
        &shards,
        "keep-postgres-default-0-inf",
        "StorageSynced",
        "True",
        Some("UpToDate"),
        shard_conditions,
    )
    .await;

    // A shrink is reported and not acted on.
    patch_spec(
        &shards,
        "keep-postgres-default-0-inf",
        json!({"pools": {"main": {"storage": {"size": "1Gi"}}}}),
    )
    .await;
    let s = wait_condition(
        &shards,
        "keep-postgres-default-0-inf",
        "StorageSynced",
        "False",
        Some("ShrinkRefused"),
        shard_conditions,
    )
    .await;
    let message = condition(&shard_conditions(&s), "StorageSynced")
        .unwrap()
        .message
        .clone();
    assert!(message.contains("volumes cannot shrink"), "{message}");
    let still: PersistentVolumeClaim = pvcs.get(&format!("data-{keep_set}-0")).await.unwrap();
    assert_eq!(
        still.spec.unwrap().resources.unwrap().requests.unwrap()["storage"].0,
        "2Gi"
    );

    // whenScaled: Delete removes the volume of the removed pod, once the consensus cohort no
    // longer counts it; Retain keeps it.
    let keep_shard = "keep-postgres-default-0-inf";
    let keep_pods: Vec<String> = (0..3).map(|i| format!("{keep_set}-{i}")).collect();
    let members: Vec<&String> = keep_pods.iter().collect();
    publish_cohort(
        &client,
        &ns,
        keep_shard,
        &keep_pods,
        &keep_pods[0],
        &members,
    )
    .await;
    patch_spec(
        &shards,
        keep_shard,
        json!({"pools": {"main": {"replicasPerCell": 2, "storage": {"size": "2Gi"}}}}),
    )
    .await;
    patch_spec(
        &shards,
        "drop-postgres-default-0-inf",
        json!({"pools": {"main": {"replicasPerCell": 1}}}),
    )
    .await;
    eventually("the keep pool scales to two pods", WAIT, || async {
        let pods = pool_pods(&client, &ns, "keep").await;
        match pods.len() {
            2 => Ok(()),
            _ => Err(format!("{pods:?}")),
        }
    })
    .await;
    // The removed pod is still a member (multiorch has not dropped it yet): its volume stays.
    let streaming = json!({"member": true, "replication": "Streaming"});
    let counted = |missing: Vec<&String>| {
        json!({"summary": "2/3 AT_LEAST_2", "policy": "AT_LEAST_2", "required": 2,
               "leader": keep_pods[0], "missing": missing,
               "pods": {&keep_pods[0]: {"member": true, "replication": "Primary"},
                        &keep_pods[1]: streaming}})
    };
    let roles = json!({&keep_pods[0]: "PRIMARY", &keep_pods[1]: "REPLICA"});
    let status = json!({"podRoles": roles, "cohort": counted(vec![&keep_pods[2]])});
    publish_status(&shards, keep_shard, status).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        pvc_names(&client, &ns, keep_sel)
            .await
            .contains(&format!("data-{keep_set}-2")),
        "the volume of a pod the cohort still counts is kept"
    );
    let status = json!({"podRoles": roles, "cohort": counted(vec![])});
    publish_status(&shards, keep_shard, status).await;
    eventually("the scaled-down keep volume is deleted", WAIT, || async {
        let names = pvc_names(&client, &ns, keep_sel).await;
        let want = [format!("data-{keep_set}-0"), format!("data-{keep_set}-1")];
        if names == want {
            Ok(())
        } else {
            Err(format!("{names:?}"))
        }
    })
    .await;
    eventually("the drop pool scales to one pod", WAIT, || async {
        let pods = pool_pods(&client, &ns, "drop").await;
        if pods.len() == 1 {
            Ok(())
        } else {
            Err(format!("{pods:?}"))
        }
    })
    .await;
    assert_eq!(
        pvc_names(&client, &ns, drop_sel).await,
        [format!("data-{drop_set}-0"), format!("data-{drop_set}-1")],
        "whenScaled: Retain keeps the volume"
    );

    // whenDeleted: Retain keeps the volumes with the Shard gone; Delete removes them.
    for name in ["keep-postgres-default-0-inf", "drop-postgres-default-0-inf"] {
        shards
            .delete(name, &DeleteParams::foreground())
            .await
            .unwrap();
    }
    eventually(
        "the drop volumes are deleted with their Shard",
        WAIT,
        || async {
            let names = pvc_names(&client, &ns, drop_sel).await;
            if names.is_empty() {
                Ok(())
            } else {
                Err(format!("{names:?}"))
            }
        },
    )
    .await;
    eventually("the keep StatefulSet is gone", WAIT, || async {
        let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
        match sets.get_opt(keep_set).await.map_err(|e| e.to_string())? {
            None => Ok(()),
            Some(_) => Err("still there".to_owned()),
        }
    })
    .await;
    assert_eq!(
        pvc_names(&client, &ns, keep_sel).await,
        [format!("data-{keep_set}-0"), format!("data-{keep_set}-1")],
        "whenDeleted: Retain keeps the volumes"
    );
    drop(handler);
}

const CLUSTER: &str = r#"
apiVersion: multigres.com/v1alpha1
kind: MultigresCluster
metadata:
  name: admin
spec:
  images:
    imagePullSecrets: [{name: regcred}]
  globalTopoServer:
    external:
      endpoints: [http://127.0.0.1:23790]
      rootPath: /teams/a/global
  postgresPasswordSecretRef: {name: pg, key: password}
  cells:
    - {name: zone-a, zoneId: zone-a}
"#;

#[tokio::test]
async fn multiadmin_follows_the_clusters_real_global_topology() {
    let cluster = cluster().await;
    let ns = fresh_namespace(cluster, "rh-admin").await;
    let _handler = start_handler(cluster, &ns).await;
    let client = cluster.client().unwrap();
    apply_yaml(&client, &ns, CLUSTER).await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let topo_args = |d: &Deployment| -> Vec<String> {
        args_of(deployment_pod(d), "multiadmin")
            .into_iter()
            .filter(|a| a.starts_with("--topo-global"))
            .collect()
    };
    let admin = eventually("multiadmin dials the external topology", WAIT, || async {
        let d = deployments
            .get_opt("admin-multiadmin")
            .await
            .map_err(|e| e.to_string())?;
        let d = d.ok_or("no multiadmin yet")?;
        if topo_args(&d)
            == [
                "--topo-global-server-addresses=127.0.0.1:23790",
                "--topo-global-root=/teams/a/global",
            ]
        {
            Ok(d)
        } else {
            Err(format!("{:?}", topo_args(&d)))
        }
    })
    .await;
    let pod = deployment_pod(&admin);
    assert!(args_of(pod, "multiadmin").contains(&"--service-map=grpc-multiadmin".to_owned()));
    assert_eq!(pod.image_pull_secrets.as_ref().unwrap()[0].name, "regcred");
    let owner = &admin.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("MultigresCluster", "admin")
    );

    // Switching to a managed topology points multiadmin at the TopoServer's client Service.
    let clusters: Api<multigres_api::v1alpha1::MultigresCluster> =
        Api::namespaced(client.clone(), &ns);
    clusters
        .patch(
            "admin",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"globalTopoServer": {"external": null, "etcd": {"rootPath": "/teams/a/managed"}}}})),
        )
        .await
        .unwrap();
    eventually("multiadmin follows the managed topology", WAIT, || async {
        let d = deployments
            .get("admin-multiadmin")
            .await
            .map_err(|e| e.to_string())?;
        let want = [
            format!("--topo-global-server-addresses=admin-global-topo.{ns}.svc:2379"),
            "--topo-global-root=/teams/a/managed".to_owned(),
        ];
        if topo_args(&d) == want {
            Ok(())
        } else {
            Err(format!("{:?}", topo_args(&d)))
        }
    })
    .await;
}

/// The names of the NetworkPolicies in `ns`, sorted.
async fn policy_names(policies: &Api<NetworkPolicy>) -> Result<Vec<String>, String> {
    let list = policies
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?;
    let mut names: Vec<String> = list.items.iter().map(|p| p.name_any()).collect();
    names.sort();
    Ok(names)
}

#[tokio::test]
async fn a_cluster_gets_network_policies_and_loses_them_when_it_opts_out() {
    let cluster = cluster().await;
    let ns = fresh_namespace(cluster, "rh-netpol").await;
    let _handler = start_handler(cluster, &ns).await;
    let client = cluster.client().unwrap();
    apply_yaml(&client, &ns, CLUSTER).await;
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), &ns);
    let all = [
        "admin-deny-ingress",
        "admin-multiadmin-ingress",
        "admin-multiadmin-web-ingress",
        "admin-multigateway-ingress",
        "admin-multiorch-ingress",
        "admin-pool-ingress",
        "admin-topo-ingress",
    ];
    eventually("every policy exists", WAIT, || async {
        let names = policy_names(&policies).await?;
        if names == all {
            Ok(())
        } else {
            Err(format!("{names:?}"))
        }
    })
    .await;
    let pool = policies.get("admin-pool-ingress").await.unwrap();
    let owner = &pool.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("MultigresCluster", "admin")
    );
    let spec = pool.spec.unwrap();
    let rules = spec.ingress.clone();
    let ports: Vec<_> = spec.ingress.unwrap()[0]
        .ports
        .iter()
        .flatten()
        .filter_map(|p| p.port.clone())
        .collect();
    assert!(
        !ports.contains(&IntOrString::Int(15470)),
        "pgctld's gRPC port is open to no one: {ports:?}"
    );
    assert_eq!(
        spec.pod_selector.unwrap().match_labels.unwrap()["app.kubernetes.io/component"],
        "shard-pool"
    );

    // A port opened by hand is closed again, the rules put back as they were: the cache keeps
    // no rules, only a digest of them, so the edit is noticed by its digest and the stored
    // policy compared and written back.
    let opened = json!({"spec": {"ingress": [{"ports": [{"port": 22, "protocol": "TCP"}]}]}});
    policies
        .patch(
            "admin-pool-ingress",
            &PatchParams::default(),
            &Patch::Merge(opened),
        )
        .await
        .unwrap();
    eventually("the hand-opened port is closed", WAIT, || async {
        let policy = policies
            .get("admin-pool-ingress")
            .await
            .map_err(|e| e.to_string())?;
        let ingress = policy.spec.and_then(|s| s.ingress);
        if ingress == rules {
            Ok(())
        } else {
            Err(format!("{ingress:?}"))
        }
    })
    .await;

    // Opting out deletes them; the exposed gateway's load balancer admits only its ranges.
    let clusters: Api<multigres_api::v1alpha1::MultigresCluster> =
        Api::namespaced(client.clone(), &ns);
    let spec = json!({"spec": {
        "networkPolicy": {"enabled": false},
        "externalGateway": {"enabled": true, "loadBalancerSourceRanges": ["203.0.113.0/24"]},
    }});
    clusters
        .patch("admin", &PatchParams::default(), &Patch::Merge(spec))
        .await
        .unwrap();
    eventually("the policies are deleted", WAIT, || async {
        let names = policy_names(&policies).await?;
        if names.is_empty() {
            Ok(())
        } else {
            Err(format!("{names:?}"))
        }
    })
    .await;
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    eventually("the gateway's source ranges", WAIT, || async {
        let s = services
            .get("admin-multigateway")
            .await
            .map_err(|e| e.to_string())?;
        let ranges = s.spec.and_then(|s| s.load_balancer_source_ranges);
        if ranges.as_deref() == Some(&["203.0.113.0/24".to_owned()][..]) {
            Ok(())
        } else {
            Err(format!("{ranges:?}"))
        }
    })
    .await;
}

/// The gateway Certificates of cert-manager, read as the test sees them.
fn certificates(client: &Client, ns: &str) -> Api<kube::api::DynamicObject> {
    let gvk = kube::api::GroupVersionKind::gvk("cert-manager.io", "v1", "Certificate");
    let resource = kube::api::ApiResource::from_gvk(&gvk);
    Api::namespaced_with(client.clone(), ns, &resource)
}

/// Whether `cert` (PEM) chains to `ca` (PEM) and is valid for `name`, as openssl verifies a
/// server certificate for a client.
fn verifies_for(cert: &str, ca: &str, name: &str) -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let (cert_path, ca_path) = (dir.path().join("tls.crt"), dir.path().join("ca.crt"));
    std::fs::write(&cert_path, cert).map_err(|e| e.to_string())?;
    std::fs::write(&ca_path, ca).map_err(|e| e.to_string())?;
    let out = std::process::Command::new("openssl")
        .args([
            "verify",
            "-purpose",
            "sslserver",
            "-verify_hostname",
            name,
            "-CAfile",
        ])
        .arg(&ca_path)
        .arg(&cert_path)
        .output()
        .map_err(|e| format!("openssl: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "openssl verify for {name}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// The Secret a gateway Deployment mounts its certificate from.
fn gateway_secret(d: &Deployment) -> Option<String> {
    deployment_pod(d)
        .volumes
        .as_ref()?
        .iter()
        .find(|v| v.name == "gateway-tls")?
        .secret
        .as_ref()?
        .secret_name
        .clone()
}

#[tokio::test]
async fn the_gateway_serves_a_certificate_from_cert_manager_or_from_the_users_own_secret() {
    let cluster = cluster().await;
    let manager = multigres_e2e::cert_manager::CertManager::start(cluster)
        .await
        .unwrap();
    let ca = manager.ca_issuer(cluster, "corp-ca").await.unwrap();
    let ns = fresh_namespace(cluster, "rh-issuer").await;
    let _handler = start_handler(cluster, &ns).await;
    let client = cluster.client().unwrap();
    let spec = CLUSTER.replace("name: admin", "name: prod").replace(
        "  cells:",
        "  issuerName: corp-ca\n  certCommonName: db.example.com\n  cells:",
    );
    apply_yaml(&client, &ns, &spec).await;

    // The Certificate names the issuer and the gateway's names; cert-manager issues it, and
    // the CA that signed it is published for clients.
    let certs = certificates(&client, &ns);
    let cert = eventually("the gateway Certificate", WAIT, || async {
        certs
            .get_opt("prod-gateway-cert")
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "no Certificate yet".to_owned())
    })
    .await;
    assert_eq!(cert.data["spec"]["issuerRef"]["name"], "corp-ca");
    assert_eq!(cert.data["spec"]["commonName"], "db.example.com");
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), &ns);
    let wait = multigres_e2e::cert_manager::ISSUE_WAIT;
    let served =
        multigres_e2e::cert_manager::tls_secret_key(&secrets, "prod-gateway-cert", "tls.crt", wait)
            .await;
    for name in [
        "db.example.com",
        &format!("prod-multigateway.{ns}.svc"),
        &format!("prod-zone-a-multigateway.{ns}.svc.cluster.local"),
    ] {
        verifies_for(&served, &ca, name).unwrap();
    }
    let issued = secrets.get("prod-gateway-cert").await.unwrap();
    assert_eq!(
        issued
            .labels()
            .get("app.kubernetes.io/component")
            .map(String::as_str),
        Some("gateway-tls"),
        "cert-manager labels the Secret as the operator asked, so its cache sees it"
    );
    let config_maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client.clone(), &ns);
    eventually("the issuer's CA published", WAIT, || async {
        let published = config_maps
            .get_opt("prod-gateway-ca")
            .await
            .map_err(|e| e.to_string())?
            .and_then(|c| c.data?.get("ca.crt").cloned());
        (published.as_deref() == Some(ca.as_str()))
            .then_some(())
            .ok_or(format!("published: {published:?}"))
    })
    .await;
    assert!(
        secrets.get_opt("prod-gateway-tls").await.unwrap().is_none(),
        "the operator's own gateway CA issues nothing"
    );

    // A cell serves the Secret its spec names (the cluster-handler writes the cert-manager
    // one there): from the cache for cert-manager's, by a read for the user's own.
    let cell = CELL.replace("NAMESPACE", &ns).replace(
        "  name: zone-a\n",
        "  name: zone-a\n  gatewayTLS: {secretName: prod-gateway-cert}\n",
    );
    apply_yaml(&client, &ns, &cell).await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let mounted = |want: &'static str| {
        let deployments = deployments.clone();
        async move {
            eventually(&format!("the gateway mounts {want}"), WAIT, || async {
                let d = deployments
                    .get_opt("prod-zone-a-multigateway")
                    .await
                    .map_err(|e| e.to_string())?
                    .ok_or("no gateway yet")?;
                let secret = gateway_secret(&d);
                (secret.as_deref() == Some(want))
                    .then_some(())
                    .ok_or(format!("mounts {secret:?}"))
            })
            .await
        }
    };
    mounted("prod-gateway-cert").await;

    // Both sources at once are refused by name.
    let clusters: Api<multigres_api::v1alpha1::MultigresCluster> =
        Api::namespaced(client.clone(), &ns);
    let both = json!({"spec": {"gatewayTLS": {"secretName": "mine"}}});
    let refused = clusters
        .patch("prod", &PatchParams::default(), &Patch::Merge(&both))
        .await
        .expect_err("issuerName with gatewayTLS.secretName");
    assert!(
        refused
            .to_string()
            .contains("spec.issuerName and spec.gatewayTLS.secretName"),
        "{refused}"
    );

    // The user's own Secret: the Certificate goes (its Secret stays: cert-manager's
    // convention), the user's CA is published, and the cell serves the user's Secret.
    let mine = secrets.get("prod-gateway-cert").await.unwrap();
    let own = json!({
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": "mine"},
        "data": mine.data,
    });
    apply_yaml(&client, &ns, &serde_yaml::to_string(&own).unwrap()).await;
    let user = json!({"spec": {"issuerName": null, "gatewayTLS": {"secretName": "mine"}}});
    clusters
        .patch("prod", &PatchParams::default(), &Patch::Merge(&user))
        .await
        .unwrap();
    eventually("the Certificate removed", WAIT, || async {
        match certs.get_opt("prod-gateway-cert").await {
            Ok(None) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert!(
        secrets
            .get_opt("prod-gateway-cert")
            .await
            .unwrap()
            .is_some()
    );
    let cells: Api<Cell> = Api::namespaced(client.clone(), &ns);
    let to_mine = json!({"spec": {"gatewayTLS": {"secretName": "mine"}}});
    cells
        .patch(
            "prod-zone-a",
            &PatchParams::default(),
            &Patch::Merge(&to_mine),
        )
        .await
        .unwrap();
    mounted("mine").await;
    drop(manager);
}
