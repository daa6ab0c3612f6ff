//! PostgreSQL configuration (`postgresConfig`, `postgresConfigRef`, `initdbArgs`): the
//! resource-handler renders the shard's postgresql.conf into `<shard>-postgres-config` with
//! exactly the rendered contents (a missing referenced ConfigMap is reported until it
//! appears), mounts it into pgctld; a change PostgreSQL applies on reload restarts no pod, and
//! a change that needs a restart restarts the replicas first and the primary last. The
//! data-handler delivers a reload-only change: it calls `ReloadConfig` on each pod's
//! multipooler (here a gRPC server in the test, registered in a real topology etcd) with the
//! expected settings and stamps the confirmed reload on the pod.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use multigres_api::postgres::{RELOAD_MARKER, render_shard};
use multigres_api::v1alpha1::Shard;
use multigres_e2e::etcd::{EtcdConfig, EtcdProcess};
use multigres_e2e::harness::{
    FULL_CYCLE, HandlerProcess, WAIT, admin, apply_yaml, control_plane, eventually,
    fresh_namespace, pool_pods, publish_roles,
};
use multigres_proto::multipooler::multipoolermanager::multipooler_manager_server::{
    MultipoolerManager, MultipoolerManagerServer,
};
use multigres_proto::multipooler::multipoolermanagerdata::{
    ReloadConfigRequest, ReloadConfigResponse,
};
use multigres_proto::topo::{
    Cell as CellRecord, Id, Multipooler, RoutingRole, RoutingState, ShardKey, id,
};
use prost::Message;
use serde_json::json;

const NAME: &str = "pgc-postgres-default-0-inf";
const SET: &str = "pgc-postgres-default-0-inf-pool-main-zone-a";
const CONFIG_MAP: &str = "pgc-postgres-default-0-inf-postgres-config";
const CONFIG_HASH: &str = "multigres.com/postgres-config-hash";
const RELOAD_HASH: &str = "multigres.com/postgres-reload-hash";
const REFERENCED: &str = "statement_timeout = 30s\n";

/// A Shard as the cluster-handler writes it: one pool of three pods, a postgresConfig map, a
/// postgresConfigRef and initdb arguments.
fn shard(namespace: &str) -> String {
    format!(
        r#"
apiVersion: multigres.com/v1alpha1
kind: Shard
metadata:
  name: {NAME}
  labels:
    app.kubernetes.io/instance: pgc
    app.kubernetes.io/component: shard
    app.kubernetes.io/managed-by: multigres-operator
    multigres.com/cluster: pgc
    multigres.com/database: postgres
    multigres.com/tablegroup: default
    multigres.com/shard: 0-inf
spec:
  databaseName: postgres
  tableGroupName: default
  shardName: 0-inf
  images:
    multiorch: ghcr.io/multigres/multigres:sha-66d2310
    multipooler: ghcr.io/multigres/multigres:sha-66d2310
    postgres: ghcr.io/multigres/pgctld:sha-66d2310
  globalTopoServer:
    address: pgc-global-topo.{namespace}.svc:2379
    rootPath: /multigres/global
    implementation: etcd
  multiorch:
    cells: [zone-a]
  initdbArgs: --data-checksums
  postgresConfig: {{work_mem: 8MB, max_connections: "100"}}
  postgresConfigRef: {{name: tuning, key: extra.conf}}
  pools:
    main:
      cells: [zone-a]
      replicasPerCell: 3
      storage: {{size: 1Gi}}
      postgres:
        resources:
          requests: {{cpu: 100m, memory: 256Mi}}
          limits: {{memory: 512Mi}}
  postgresPasswordSecretRef: {{name: pg-superuser, key: password}}
"#
    )
}

/// The restart fingerprint on the pool's pod template.
async fn template_hash(api: &Api<StatefulSet>) -> Option<String> {
    let set = api.get(SET).await.ok()?;
    let template = set.spec?.template.metadata?;
    template.annotations?.get(CONFIG_HASH).cloned()
}

async fn patch_config(shards: &Api<Shard>, config: serde_json::Value) {
    shards
        .patch(
            NAME,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"postgresConfig": config}})),
        )
        .await
        .unwrap();
}

/// Stamps the reload fingerprint `hash` on every pool pod, as the data-handler does once a
/// pod's PostgreSQL confirmed it reloaded the file (no data-handler runs in this test): until
/// then the config counts as in progress.
async fn confirm_reloads(client: &kube::Client, ns: &str, hash: &str) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    for pod in pool_pods(client, ns, "pgc").await.keys() {
        let stamp = json!({"metadata": {"annotations": {RELOAD_HASH: hash}}});
        pods.patch(pod, &PatchParams::default(), &Patch::Merge(stamp))
            .await
            .unwrap();
    }
}

/// The ConfigMap once it holds a file whose lines include `line`.
async fn config_with(config_maps: &Api<ConfigMap>, line: &str) -> ConfigMap {
    eventually(&format!("the config holds {line:?}"), WAIT, || async {
        let cm = config_maps
            .get(CONFIG_MAP)
            .await
            .map_err(|e| e.to_string())?;
        let text = cm.data.clone().unwrap_or_default();
        let text = text.get("postgresql.conf").cloned().unwrap_or_default();
        if text.lines().any(|l| l == line) {
            Ok(cm)
        } else {
            Err(text)
        }
    })
    .await
}

#[tokio::test]
async fn the_rendered_config_reloads_without_restarts_and_restarts_replicas_before_the_primary() {
    let cluster = control_plane().await;
    let ns = fresh_namespace(cluster, "pg-config").await;
    let _handler = HandlerProcess::start_in(cluster, "resource-handler", &ns, &[]).await;
    let client = admin(cluster);
    let shards: Api<Shard> = Api::namespaced(client.clone(), &ns);
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    let pod_api: Api<Pod> = Api::namespaced(client.clone(), &ns);

    // The referenced ConfigMap does not exist yet: reported, nothing is created.
    apply_yaml(cluster, &ns, &shard(&ns)).await;
    let error = eventually("the missing ConfigMap is reported", WAIT, || async {
        let s = shards.get(NAME).await.map_err(|e| e.to_string())?;
        s.status
            .and_then(|st| st.postgres_config)
            .and_then(|pc| pc.error)
            .ok_or_else(|| "no postgresConfig.error yet".to_owned())
    })
    .await;
    assert_eq!(
        error,
        format!(
            "postgresConfigRef: ConfigMap \"tuning\" not found in namespace \"{ns}\"; create it \
             with key \"extra.conf\" or remove postgresConfigRef"
        )
    );
    assert!(config_maps.get_opt(CONFIG_MAP).await.unwrap().is_none());
    assert!(sets.get_opt(SET).await.unwrap().is_none());
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    eventually("a Warning event names the ConfigMap", WAIT, || async {
        let list = events.list(&ListParams::default()).await.unwrap();
        list.items
            .iter()
            .find(|e| {
                e.type_.as_deref() == Some("Warning")
                    && e.note.as_deref().is_some_and(|n| n.contains("\"tuning\""))
            })
            .map(|_| ())
            .ok_or_else(|| format!("{} events", list.items.len()))
    })
    .await;

    // Creating it is noticed (the handler watches ConfigMaps) and the file is rendered.
    apply_yaml(
        cluster,
        &ns,
        &format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: tuning}}\ndata:\n  extra.conf: \
             \"{}\"\n",
            REFERENCED.replace('\n', "\\n")
        ),
    )
    .await;
    let cm = config_with(&config_maps, "work_mem = '8MB'").await;
    let stored = shards.get(NAME).await.unwrap();
    let expected =
        render_shard("pgc", &stored.spec, Some(REFERENCED), &Default::default()).unwrap();
    let text = cm.data.as_ref().unwrap()["postgresql.conf"].clone();
    assert_eq!(text, expected.text, "exact contents");
    for line in [
        "cluster_name = 'pgc/postgres/default/0-inf'",
        // Sized from the 512Mi limit.
        "shared_buffers = '128MB'",
        "# postgresConfigRef: ConfigMap tuning, key extra.conf.",
        "statement_timeout = 30s",
        "max_connections = '100'",
    ] {
        assert!(text.lines().any(|l| l == line), "{line:?} in\n{text}");
    }
    assert_eq!(cm.annotations()[CONFIG_HASH], expected.split.restart_hash);
    assert_eq!(
        cm.owner_references()[0].uid,
        stored.uid().unwrap(),
        "owned by the Shard"
    );

    // Pool pods mount it, carry its restart fingerprint, and come up.
    let restart_hash = expected.split.restart_hash.clone();
    eventually(
        "the pod template carries the restart fingerprint",
        WAIT,
        || async {
            match template_hash(&sets).await {
                Some(hash) if hash == restart_hash => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    let set = sets.get(SET).await.unwrap();
    let pod = set.spec.unwrap().template.spec.unwrap();
    let pgctld = pod.init_containers.unwrap().remove(0);
    let env: BTreeMap<_, _> = pgctld
        .env
        .unwrap()
        .into_iter()
        .map(|e| (e.name, e.value.unwrap_or_default()))
        .collect();
    assert_eq!(
        env["POSTGRES_INITDB_EXTRA_CONF"],
        "/etc/pgctld/postgres-config/postgresql.conf"
    );
    assert_eq!(env["POSTGRES_INITDB_ARGS"], "--data-checksums");
    let before = eventually("three Ready pool pods", WAIT, || async {
        let now = pool_pods(&client, &ns, "pgc").await;
        if now.len() == 3 && now.values().all(|(_, ready)| *ready) {
            Ok(now)
        } else {
            Err(format!("{now:?}"))
        }
    })
    .await;
    let reload_hash = cm.annotations()[RELOAD_HASH].clone();
    let unconfirmed = shards.get(NAME).await.unwrap().status.unwrap();
    assert_eq!(
        unconfirmed.postgres_config.and_then(|pc| pc.in_progress),
        Some(true),
        "in progress until every pod confirmed the reload-class settings"
    );
    confirm_reloads(&client, &ns, &reload_hash).await;
    let settled = eventually("the config settles", WAIT, || async {
        let s = shards.get(NAME).await.map_err(|e| e.to_string())?;
        let pc = s
            .status
            .and_then(|st| st.postgres_config)
            .unwrap_or_default();
        match (pc.in_progress, &pc.last_applied_at, &pc.error) {
            (Some(false), Some(_), None) => Ok(pc),
            _ => Err(format!("{pc:?}")),
        }
    })
    .await;

    // Roles, as the data-handler publishes them: pod 1 is the primary.
    let primary = format!("{SET}-1");
    publish_roles(&shards, NAME, before.keys(), &primary).await;

    // A reload-class change: the file changes, the pod template and the pods do not.
    patch_config(&shards, json!({"work_mem": "16MB"})).await;
    let cm = config_with(&config_maps, "work_mem = '16MB'").await;
    let new_reload_hash = cm.annotations()[RELOAD_HASH].clone();
    assert_ne!(new_reload_hash, reload_hash);
    assert_eq!(cm.annotations()[CONFIG_HASH], restart_hash);
    tokio::time::sleep(FULL_CYCLE).await;
    assert_eq!(
        template_hash(&sets).await.as_deref(),
        Some(restart_hash.as_str())
    );
    assert_eq!(
        pool_pods(&client, &ns, "pgc").await,
        before,
        "a reload-only change restarted a pod"
    );
    eventually("a pending reload is in progress", WAIT, || async {
        let s = shards.get(NAME).await.map_err(|e| e.to_string())?;
        let pc = s
            .status
            .and_then(|st| st.postgres_config)
            .unwrap_or_default();
        (pc.in_progress == Some(true))
            .then_some(())
            .ok_or_else(|| format!("{pc:?}"))
    })
    .await;
    confirm_reloads(&client, &ns, &new_reload_hash).await;
    let settled = eventually("the reload settles", WAIT, || async {
        let s = shards.get(NAME).await.map_err(|e| e.to_string())?;
        let pc = s
            .status
            .and_then(|st| st.postgres_config)
            .unwrap_or_default();
        match (pc.in_progress, &pc.last_applied_at) {
            (Some(false), Some(at)) if Some(at) != settled.last_applied_at.as_ref() => Ok(pc),
            _ => Err(format!("{pc:?}")),
        }
    })
    .await;

    // A restart-class change: replicas restart first, the primary last, one at a time.
    patch_config(&shards, json!({"shared_buffers": "256MB"})).await;
    let cm = config_with(&config_maps, "shared_buffers = '256MB'").await;
    let new_hash = cm.annotations()[CONFIG_HASH].clone();
    assert_ne!(new_hash, restart_hash);
    // Once the replicas are done, the primary is asked to hand over before its restart; the
    // switchover is played here as the data-handler and multiorch would: pod 0 becomes primary.
    let mut order: Vec<String> = Vec::new();
    let mut handed_over = false;
    let deadline = Instant::now() + WAIT * 2;
    while order.len() < 3 {
        assert!(
            Instant::now() < deadline,
            "restarts stalled after {order:?}"
        );
        let now = pool_pods(&client, &ns, "pgc").await;
        for (pod, (uid, _)) in &now {
            if before.get(pod).map(|(u, _)| u) != Some(uid) && !order.contains(pod) {
                order.push(pod.clone());
            }
        }
        if order.len() == 2 && !handed_over {
            let requested = pod_api
                .get(&primary)
                .await
                .unwrap()
                .annotations()
                .contains_key("multigres.com/switchover-requested");
            if requested {
                publish_roles(&shards, NAME, before.keys(), &format!("{SET}-0")).await;
                handed_over = true;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        handed_over,
        "the primary restarted before it was asked to hand over"
    );
    assert_eq!(
        order,
        [format!("{SET}-0"), format!("{SET}-2"), primary],
        "restart order"
    );
    for pod in before.keys() {
        let p = pod_api.get(pod).await.unwrap();
        assert_eq!(p.annotations().get(CONFIG_HASH), Some(&new_hash), "{pod}");
    }
    eventually("the new config settles", WAIT, || async {
        // The restarted pods confirm the (unchanged) reload-class settings anew.
        confirm_reloads(&client, &ns, &new_reload_hash).await;
        let s = shards.get(NAME).await.map_err(|e| e.to_string())?;
        let pc = s
            .status
            .and_then(|st| st.postgres_config)
            .unwrap_or_default();
        // Stamped anew once the new config settled on every pod: later than the reload's
        // stamp, even when the rollout settles within the same second (a stored time keeps
        // whole seconds).
        match (
            pc.in_progress,
            &pc.last_applied_at,
            &settled.last_applied_at,
        ) {
            (Some(false), Some(at), Some(before)) if at.0 > before.0 => Ok(()),
            _ => Err(format!("{pc:?}; before the change: {settled:?}")),
        }
    })
    .await;
}

/// A multipooler's management service as far as reloads go, from upstream's own
/// `multipoolermanagerservice.proto` (same gRPC path and messages): records the expected
/// settings of every `ReloadConfig` and answers that PostgreSQL reloaded; every other method
/// answers UNIMPLEMENTED.
#[derive(Clone, Default)]
struct Multipoolers {
    received: Arc<Mutex<Vec<BTreeMap<String, String>>>>,
}

#[tonic::async_trait]
impl MultipoolerManager for Multipoolers {
    async fn reload_config(
        &self,
        request: tonic::Request<ReloadConfigRequest>,
    ) -> Result<tonic::Response<ReloadConfigResponse>, tonic::Status> {
        let expected = request.into_inner().expected_settings.into_iter().collect();
        self.received.lock().unwrap().push(expected);
        Ok(tonic::Response::new(ReloadConfigResponse {
            config_load_time: Some(Default::default()),
            ..Default::default()
        }))
    }
}

#[tokio::test]
async fn a_reload_only_change_is_reloaded_through_each_multipooler_and_stamped_on_the_pod() {
    let cluster = control_plane().await;
    let ns = fresh_namespace(cluster, "pg-reload").await;
    let client = admin(cluster);
    let shards: Api<Shard> = Api::namespaced(client.clone(), &ns);
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let pod_api: Api<Pod> = Api::namespaced(client.clone(), &ns);

    // The multipoolers' gRPC endpoint, and the topology they register in.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let grpc_port = i32::from(listener.local_addr().unwrap().port());
    let multipoolers = Multipoolers::default();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(MultipoolerManagerServer::new(multipoolers.clone()))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    let etcd = EtcdProcess::start(EtcdConfig::default()).await.unwrap();
    let topo = etcd_client::Client::connect([etcd.client_url()], None)
        .await
        .unwrap();

    let _resources = HandlerProcess::start_in(cluster, "resource-handler", &ns, &[]).await;
    let _data = HandlerProcess::start_in(
        cluster,
        "data-handler",
        &ns,
        &["--roles-poll-period=1s", "--topo-check-period=1s"],
    )
    .await;
    apply_yaml(
        cluster,
        &ns,
        &format!(
            r#"
apiVersion: multigres.com/v1alpha1
kind: MultigresCluster
metadata: {{name: pgc}}
spec:
  postgresPasswordSecretRef: {{name: pg-superuser, key: password}}
  globalTopoServer:
    external: {{endpoints: ["{}"], rootPath: /multigres/global}}
  cells: [{{name: zone-a, zoneId: zone-a}}]
---
apiVersion: v1
kind: ConfigMap
metadata: {{name: tuning}}
data:
  extra.conf: "{}"
"#,
            etcd.client_url(),
            REFERENCED.replace('\n', "\\n")
        ),
    )
    .await;
    apply_yaml(cluster, &ns, &shard(&ns)).await;
    let before = eventually("three Ready pool pods", WAIT, || async {
        let now = pool_pods(&client, &ns, "pgc").await;
        if now.len() == 3 && now.values().all(|(_, ready)| *ready) {
            Ok(now)
        } else {
            Err(format!("{now:?}"))
        }
    })
    .await;

    // Each pod's multipooler registers in the cell topology, reachable at the test's server.
    let mut topo_kv = topo.kv_client();
    let cell_root = eventually("the cell is registered", WAIT, || async {
        let got = topo_kv
            .clone()
            .get("/multigres/global/cells/zone-a/Cell", None)
            .await
            .map_err(|e| e.to_string())?;
        let kv = got.kvs().first().ok_or("no Cell record yet")?;
        Ok::<_, String>(CellRecord::decode(kv.value()).unwrap().root)
    })
    .await;
    for (i, pod) in before.keys().enumerate() {
        let record = Multipooler {
            id: Some(Id {
                component: id::ComponentType::Multipooler as i32,
                cell: "zone-a".to_owned(),
                name: pod.clone(),
            }),
            shard_key: Some(ShardKey {
                database: "postgres".to_owned(),
                table_group: "default".to_owned(),
                shard: "0-inf".to_owned(),
            }),
            hostname: "127.0.0.1".to_owned(),
            port_map: [("grpc".to_owned(), grpc_port)].into(),
            routing_state: Some(RoutingState {
                role: if i == 1 {
                    RoutingRole::Primary
                } else {
                    RoutingRole::Replica
                } as i32,
                rule: None,
            }),
            ..Default::default()
        };
        topo_kv
            .put(
                format!("{cell_root}/poolers/multipooler-zone-a-{pod}/Pooler"),
                record.encode_to_vec(),
                None,
            )
            .await
            .unwrap();
    }
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    let stamped = async |hash: &str| {
        eventually(&format!("every pod stamped {hash}"), WAIT, || async {
            let mut stamps = BTreeMap::new();
            for pod in before.keys() {
                let p = pod_api.get(pod).await.map_err(|e| e.to_string())?;
                stamps.insert(pod.clone(), p.annotations().get(RELOAD_HASH).cloned());
            }
            if stamps.values().all(|s| s.as_deref() == Some(hash)) {
                return Ok(());
            }
            let notes: Vec<String> = events
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?
                .items
                .into_iter()
                .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(NAME))
                .map(|e| format!("{:?}: {:?}", e.reason, e.note))
                .collect();
            let roles = shards
                .get(NAME)
                .await
                .map_err(|e| e.to_string())?
                .status
                .map(|s| s.pod_roles);
            Err(format!(
                "{stamps:?}; Shard events: {notes:?}; podRoles: {roles:?}"
            ))
        })
        .await;
    };
    let cm = config_with(&config_maps, "work_mem = '8MB'").await;
    stamped(&cm.annotations()[RELOAD_HASH]).await;

    // A reload-only change: every multipooler is asked to reload with the new value expected,
    // each pod is stamped with the new fingerprint, and no pod restarts.
    patch_config(&shards, json!({"work_mem": "16MB"})).await;
    let cm = config_with(&config_maps, "work_mem = '16MB'").await;
    let reload_hash = cm.annotations()[RELOAD_HASH].clone();
    stamped(&reload_hash).await;
    let asked: Vec<BTreeMap<String, String>> = multipoolers
        .received
        .lock()
        .unwrap()
        .iter()
        .filter(|e| e.get(RELOAD_MARKER) == Some(&reload_hash))
        .cloned()
        .collect();
    assert_eq!(asked.len(), 3, "one ReloadConfig per pod: {asked:?}");
    for expected in &asked {
        assert_eq!(expected["work_mem"], "16MB");
        assert_eq!(
            expected["statement_timeout"], "30s",
            "referenced settings too"
        );
        assert!(
            !expected.contains_key("max_connections"),
            "restart-class settings are not expected of a reload: {expected:?}"
        );
    }
    assert_eq!(
        pool_pods(&client, &ns, "pgc").await,
        before,
        "a reload restarted a pod"
    );
    eventually("ConfigReloaded events on the Shard", WAIT, || async {
        let list = events.list(&ListParams::default()).await.unwrap();
        let reloaded: Vec<&str> = list
            .items
            .iter()
            .filter(|e| {
                e.reason.as_deref() == Some("ConfigReloaded")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(NAME)
            })
            .filter_map(|e| e.note.as_deref())
            .collect();
        if before
            .keys()
            .all(|pod| reloaded.iter().any(|n| n.contains(pod.as_str())))
        {
            Ok(())
        } else {
            Err(format!("{reloaded:?}"))
        }
    })
    .await;
}
