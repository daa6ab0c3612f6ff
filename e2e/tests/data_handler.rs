//! The data-handler binary against a real control plane and a real etcd on loopback as the
//! cluster's external topology server. The handler runs as its own ServiceAccount with only the
//! rules of `deploy/rbac/data-handler.yaml` (bound in the test's namespace):
//! - the records read back from etcd and decoded are what the spec says; the conditions on the
//!   cluster and its Cells follow an etcd stop and start, a cell added during the outage is
//!   registered once etcd is back, other handlers' status fields are untouched, an idle cluster
//!   costs no Kubernetes and no etcd writes, and deleting the cluster removes its records;
//! - with etcd gone, deleting the cluster still completes once the give-up timeout has passed,
//!   with a Warning event, and the records are left in place;
//! - pool pod roles read from pooler records (over TLS, with the client certificate from a
//!   Secret) are published on the Shard status and as pod labels, and follow a failover.
//!
//! Cells and Shards are created by the test exactly as the resolver describes them, so no other
//! handler needs to run.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::Path;
use std::time::{Duration, Instant};

use etcd_client::{Certificate, Client as Etcd, ConnectOptions, GetOptions, Identity, TlsOptions};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, OwnerReference};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, Resource, ResourceExt};
use multigres_api::labels::{self, Component, Placement};
use multigres_api::names;
use multigres_api::resolver::{self, Templates};
use multigres_api::v1alpha1::{Cell, MultigresCluster, Shard};
use multigres_e2e::cluster::LocalCluster;
use multigres_e2e::etcd::{EtcdConfig, EtcdProcess, EtcdTls};
use multigres_e2e::harness::{HandlerProcess, WAIT, eventually, fresh_namespace};
use multigres_e2e::pki::Pki;
use multigres_proto::topo::{
    BackupLocation, Cell as CellRecord, Database, DurabilityPolicy, FilesystemBackup, Id,
    Multipooler, QuorumType, RoutingRole, RoutingState, ShardKey, backup_location, id,
};
use prost::Message;
use serde_json::json;

/// The field manager the test writes as (the user, or another handler).
const TEST_MANAGER: &str = "e2e-test";
/// The finalizer the data-handler puts on clusters and Cells.
const FINALIZER: &str = "multigres.com/topology";

async fn control_plane() -> &'static LocalCluster {
    multigres_e2e::harness::control_plane().await
}

/// The data-handler serving one namespace as its own ServiceAccount, with fast topology
/// timings and `extra` flags, once its caches are synced.
async fn start_handler(cluster: &LocalCluster, namespace: &str, extra: &[&str]) -> HandlerProcess {
    let mut flags = vec![
        "--topo-check-period=1s",
        "--topo-retry-max=2s",
        "--topo-connect-timeout=1s",
        "--topo-request-timeout=2s",
        "--roles-poll-period=1s",
    ];
    flags.extend_from_slice(extra);
    HandlerProcess::start_in(cluster, "data-handler", namespace, &flags).await
}

/// A raw etcd client, reading records the way Multigres does.
struct Topology {
    client: Etcd,
}

impl Topology {
    async fn connect(endpoint: String, tls: Option<TlsOptions>) -> Topology {
        let options = tls.map(|t| ConnectOptions::new().with_tls(t));
        Topology {
            client: Etcd::connect([endpoint], options)
                .await
                .expect("raw etcd client"),
        }
    }

    async fn get(&self, key: &str) -> Result<Option<Vec<u8>>, String> {
        let mut client = self.client.clone();
        let response = client.get(key, None).await.map_err(|e| e.to_string())?;
        Ok(response.kvs().first().map(|kv| kv.value().to_vec()))
    }

    async fn cell(&self, root: &str, name: &str) -> Result<Option<CellRecord>, String> {
        let bytes = self.get(&format!("{root}/cells/{name}/Cell")).await?;
        bytes
            .map(|b| CellRecord::decode(b.as_slice()).map_err(|e| e.to_string()))
            .transpose()
    }

    async fn database(&self, root: &str, name: &str) -> Result<Option<Database>, String> {
        let bytes = self
            .get(&format!("{root}/databases/{name}/Database"))
            .await?;
        bytes
            .map(|b| Database::decode(b.as_slice()).map_err(|e| e.to_string()))
            .transpose()
    }

    /// Every key under `prefix`, sorted.
    async fn keys(&self, prefix: &str) -> Result<Vec<String>, String> {
        let options = GetOptions::new().with_prefix().with_keys_only();
        let response = self
            .client
            .clone()
            .get(prefix, Some(options))
            .await
            .map_err(|e| e.to_string())?;
        let mut keys: Vec<String> = response
            .kvs()
            .iter()
            .map(|kv| kv.key_str().unwrap_or_default().to_owned())
            .collect();
        keys.sort();
        Ok(keys)
    }

    /// The store's revision: unchanged means nothing was written.
    async fn revision(&self) -> i64 {
        let response = self.client.clone().get("/", None).await.expect("raw get");
        response.header().expect("header").revision()
    }

    async fn put(&self, key: &str, value: Vec<u8>) {
        self.client
            .clone()
            .put(key, value, None)
            .await
            .expect("raw put");
    }
}

/// A MultigresCluster whose global topology is the external etcd at `endpoint`, under `root`.
fn cluster_spec(name: &str, endpoint: &str, root: &str, cells: &[&str]) -> serde_json::Value {
    json!({
        "apiVersion": "multigres.com/v1alpha1",
        "kind": "MultigresCluster",
        "metadata": {"name": name},
        "spec": {
            "postgresPasswordSecretRef": {"name": "pw", "key": "password"},
            "globalTopoServer": {"external": {"endpoints": [endpoint], "rootPath": root}},
            "cells": cells.iter().map(|c| json!({"name": c, "zoneId": c})).collect::<Vec<_>>(),
        },
    })
}

async fn apply<K>(api: &Api<K>, name: &str, body: &serde_json::Value) -> K
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.patch(
        name,
        &PatchParams::apply(TEST_MANAGER).force(),
        &Patch::Apply(body),
    )
    .await
    .unwrap_or_else(|e| panic!("applying {name}: {e}"))
}

/// The controller owner reference the cluster-handler puts on children.
fn controller_ref<K: Resource<DynamicType = ()>>(owner: &K) -> OwnerReference {
    OwnerReference {
        api_version: "multigres.com/v1alpha1".to_owned(),
        kind: K::kind(&()).into_owned(),
        name: owner.meta().name.clone().unwrap(),
        uid: owner.meta().uid.clone().unwrap(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// Creates the cluster's Cells as the cluster-handler would: resolved specs, standard labels,
/// controller owner reference.
async fn create_cells(client: &Client, cluster: &MultigresCluster) {
    let namespace = cluster.namespace().unwrap();
    let name = cluster.name_any();
    let api: Api<Cell> = Api::namespaced(client.clone(), &namespace);
    let resolved = resolver::resolve(cluster, &Templates::default()).expect("cluster resolves");
    for resolved_cell in &resolved.cells {
        let cell_name = resolved_cell.spec.name.as_str();
        let child = names::cell(&name, cell_name);
        let mut cell = Cell::new(&child, resolved_cell.spec.clone());
        cell.metadata.labels = Some(labels::labels(
            &name,
            Component::Cell,
            &Placement {
                cell: Some(cell_name),
                ..Default::default()
            },
        ));
        cell.metadata.owner_references = Some(vec![controller_ref(cluster)]);
        api.patch(
            &child,
            &PatchParams::apply(TEST_MANAGER).force(),
            &Patch::Apply(&cell),
        )
        .await
        .unwrap_or_else(|e| panic!("creating Cell {child}: {e}"));
    }
}

fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// `(status, reason)` of the two topology conditions of a cluster.
async fn cluster_conditions(
    api: &Api<MultigresCluster>,
    name: &str,
) -> Result<(Vec<Condition>, [(String, String); 2]), String> {
    let c = api.get(name).await.map_err(|e| e.to_string())?;
    let conditions = c.status.map(|s| s.conditions).unwrap_or_default();
    let pair = |t: &str| {
        find(&conditions, t)
            .map(|c| (c.status.clone(), c.reason.clone()))
            .unwrap_or_default()
    };
    let state = [pair("TopoServerReachable"), pair("TopologyRegistered")];
    Ok((conditions, state))
}

async fn cell_conditions(api: &Api<Cell>, name: &str) -> Result<[(String, String); 2], String> {
    let c = api.get(name).await.map_err(|e| e.to_string())?;
    let conditions = c.status.map(|s| s.conditions).unwrap_or_default();
    let pair = |t: &str| {
        find(&conditions, t)
            .map(|c| (c.status.clone(), c.reason.clone()))
            .unwrap_or_default()
    };
    Ok([pair("TopoServerReachable"), pair("TopologyRegistered")])
}

fn pair(status: &str, reason: &str) -> (String, String) {
    (status.to_owned(), reason.to_owned())
}

/// Events about the object `name` with `reason`.
async fn events(client: &Client, namespace: &str, name: &str, reason: &str) -> Vec<Event> {
    let api: Api<Event> = Api::namespaced(client.clone(), namespace);
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                && e.reason.as_deref() == Some(reason)
        })
        .collect()
}

/// The Cell record the spec implies: the cell's own root, the global addresses (no scheme).
fn expected_cell(name: &str, etcd: &EtcdProcess) -> CellRecord {
    CellRecord {
        name: name.to_owned(),
        server_addresses: vec![etcd.client_addr()],
        root: format!("/multigres/{name}"),
    }
}

/// The Database record the spec implies: every cell, filesystem backups at `/backups`,
/// durability AT_LEAST_2.
fn expected_database(cells: &[&str]) -> Database {
    Database {
        name: "postgres".to_owned(),
        backup_location: Some(BackupLocation {
            location: Some(backup_location::Location::Filesystem(FilesystemBackup {
                path: "/backups".to_owned(),
            })),
            require_initial_repo_encryption: false,
            authoritative_generation: 0,
        }),
        cells: cells.iter().map(|c| (*c).to_owned()).collect(),
        bootstrap_durability_policy: Some(DurabilityPolicy {
            policy_name: "AT_LEAST_2".to_owned(),
            policy_version: 0,
            quorum_type: QuorumType::AtLeastN as i32,
            required_count: 2,
            description: String::new(),
        }),
    }
}

#[tokio::test]
async fn records_follow_the_spec_conditions_follow_etcd_and_delete_cleans_up() {
    let plane = control_plane().await;
    let namespace = fresh_namespace(plane, "dh-lifecycle").await;
    let mut etcd = EtcdProcess::start(EtcdConfig::default()).await.unwrap();
    let handler = start_handler(plane, &namespace, &[]).await;
    let client = plane.client().unwrap();
    let clusters: Api<MultigresCluster> = Api::namespaced(client.clone(), &namespace);
    let cells: Api<Cell> = Api::namespaced(client.clone(), &namespace);
    let root = "/multigres/e2e";
    let topo = Topology::connect(etcd.client_url(), None).await;

    let spec = cluster_spec("prod", &etcd.client_url(), root, &["zone-a", "zone-b"]);
    let cluster = apply(&clusters, "prod", &spec).await;
    create_cells(&client, &cluster).await;
    // Another handler's status: it must survive the data-handler's writes.
    clusters
        .patch_status(
            "prod",
            &PatchParams::apply("multigres-operator/cluster-handler").force(),
            &Patch::Apply(json!({
                "apiVersion": "multigres.com/v1alpha1", "kind": "MultigresCluster",
                "status": {
                    "phase": "Initializing",
                    "conditions": [{
                        "type": "Available", "status": "False", "reason": "CellsNotReady",
                        "message": "0/2 cells ready", "lastTransitionTime": "2026-01-01T00:00:00Z",
                    }],
                },
            })),
        )
        .await
        .unwrap();

    // Records as the spec says, read back and decoded.
    eventually("Cell and Database records", WAIT, || async {
        let got = (
            topo.cell(root, "zone-a").await?,
            topo.cell(root, "zone-b").await?,
            topo.database(root, "postgres").await?,
        );
        let want = (
            Some(expected_cell("zone-a", &etcd)),
            Some(expected_cell("zone-b", &etcd)),
            Some(expected_database(&["zone-a", "zone-b"])),
        );
        if got == want {
            Ok(())
        } else {
            Err(format!("{got:?}"))
        }
    })
    .await;
    let all_true = [pair("True", "Reachable"), pair("True", "Registered")];
    let (conditions, _) = eventually("cluster conditions True", WAIT, || async {
        let (conditions, state) = cluster_conditions(&clusters, "prod").await?;
        if state == all_true {
            Ok((conditions, state))
        } else {
            Err(format!("{state:?}"))
        }
    })
    .await;
    let registered = find(&conditions, "TopologyRegistered").unwrap();
    assert_eq!(
        registered.message,
        format!(
            "Registered cells zone-a, zone-b and database postgres in etcd at {} (root {root}).",
            etcd.client_url()
        )
    );
    assert!(
        find(&conditions, "Available").is_some(),
        "another handler's condition survives: {conditions:?}"
    );
    let stored = clusters.get("prod").await.unwrap();
    assert_eq!(
        stored
            .status
            .as_ref()
            .and_then(|s| s.phase)
            .map(|p| format!("{p:?}")),
        Some("Initializing".to_owned()),
        "another handler's phase survives"
    );
    assert!(stored.finalizers().iter().any(|f| f == FINALIZER));
    for cell in ["prod-zone-a", "prod-zone-b"] {
        eventually(&format!("{cell} conditions True"), WAIT, || async {
            let state = cell_conditions(&cells, cell).await?;
            if state == all_true {
                Ok(())
            } else {
                Err(format!("{state:?}"))
            }
        })
        .await;
        let stored = cells.get(cell).await.unwrap();
        assert!(stored.finalizers().iter().any(|f| f == FINALIZER), "{cell}");
    }

    // Idle: several check periods pass without a Kubernetes or etcd write.
    let writes = handler.writes().await;
    let revision = topo.revision().await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        handler.writes().await,
        writes,
        "no Kubernetes write while idle"
    );
    assert_eq!(topo.revision().await, revision, "no etcd write while idle");

    // Outage: the conditions say so, with the endpoint to check.
    etcd.stop();
    let down = [
        pair("False", "Unreachable"),
        pair("False", "TopoServerUnreachable"),
    ];
    let (conditions, _) = eventually("cluster conditions follow the outage", WAIT, || async {
        let (conditions, state) = cluster_conditions(&clusters, "prod").await?;
        if state == down {
            Ok((conditions, state))
        } else {
            Err(format!("{state:?}"))
        }
    })
    .await;
    let reachable = find(&conditions, "TopoServerReachable").unwrap();
    assert!(
        reachable.message.contains(&etcd.client_url()),
        "{}",
        reachable.message
    );
    eventually("Cell conditions follow the outage", WAIT, || async {
        let state = cell_conditions(&cells, "prod-zone-a").await?;
        if state == [pair("False", "Unreachable"), pair("Unknown", "NotChecked")] {
            Ok(())
        } else {
            Err(format!("{state:?}"))
        }
    })
    .await;
    assert!(
        !events(&client, &namespace, "prod", "Unreachable")
            .await
            .is_empty()
    );

    // A cell added while etcd is down is registered once it is back.
    let spec = cluster_spec(
        "prod",
        &etcd.client_url(),
        root,
        &["zone-a", "zone-b", "zone-c"],
    );
    let cluster = apply(&clusters, "prod", &spec).await;
    create_cells(&client, &cluster).await;
    etcd.restart().await.unwrap();
    eventually("zone-c registered after the outage", WAIT, || async {
        let got = (
            topo.cell(root, "zone-c").await?,
            topo.database(root, "postgres").await?,
        );
        let want = (
            Some(expected_cell("zone-c", &etcd)),
            Some(expected_database(&["zone-a", "zone-b", "zone-c"])),
        );
        if got == want {
            Ok(())
        } else {
            Err(format!("{got:?}"))
        }
    })
    .await;
    eventually("cluster conditions recover", WAIT, || async {
        let (_, state) = cluster_conditions(&clusters, "prod").await?;
        if state == all_true {
            Ok(())
        } else {
            Err(format!("{state:?}"))
        }
    })
    .await;
    eventually("Cell conditions recover", WAIT, || async {
        let state = cell_conditions(&cells, "prod-zone-c").await?;
        if state == all_true {
            Ok(())
        } else {
            Err(format!("{state:?}"))
        }
    })
    .await;
    // The event follows the condition it announces (written first), so it may lag behind it.
    eventually("a Recovered event on the cluster", WAIT, || async {
        match events(&client, &namespace, "prod", "Recovered").await {
            found if found.is_empty() => Err("no Recovered event yet".to_owned()),
            _ => Ok(()),
        }
    })
    .await;

    // Delete: the records go, then the cluster and its Cells.
    clusters
        .delete("prod", &DeleteParams::background())
        .await
        .unwrap();
    eventually("records removed", WAIT, || async {
        let keys = topo.keys(root).await?;
        if keys.is_empty() {
            Ok(())
        } else {
            Err(format!("{keys:?}"))
        }
    })
    .await;
    eventually("cluster and Cells gone", WAIT, || async {
        let cluster = clusters.get_opt("prod").await.map_err(|e| e.to_string())?;
        let left = cells
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?
            .items
            .len();
        if cluster.is_none() && left == 0 {
            Ok(())
        } else {
            Err(format!(
                "cluster {:?}, {left} Cells",
                cluster.map(|c| c.metadata)
            ))
        }
    })
    .await;
    let deregistered = events(&client, &namespace, "prod", "TopologyDeregistered").await;
    assert_eq!(deregistered.len(), 1, "{deregistered:?}");
    assert!(
        deregistered[0]
            .note
            .as_deref()
            .unwrap_or_default()
            .starts_with("Removed cells zone-a, zone-b, zone-c and database postgres"),
        "{deregistered:?}"
    );
    assert!(
        !handler.log().contains("\"level\":\"ERROR\""),
        "{}",
        handler.log()
    );
}

#[tokio::test]
async fn deleting_without_etcd_completes_after_the_timeout_with_a_warning() {
    let plane = control_plane().await;
    let namespace = fresh_namespace(plane, "dh-gone").await;
    let mut etcd = EtcdProcess::start(EtcdConfig::default()).await.unwrap();
    let timeout = Duration::from_secs(8);
    let _handler = start_handler(plane, &namespace, &["--topo-unreachable-timeout=8s"]).await;
    let client = plane.client().unwrap();
    let clusters: Api<MultigresCluster> = Api::namespaced(client.clone(), &namespace);
    let cells: Api<Cell> = Api::namespaced(client.clone(), &namespace);
    let root = "/multigres/gone";
    let topo = Topology::connect(etcd.client_url(), None).await;

    let spec = cluster_spec("lost", &etcd.client_url(), root, &["zone-a"]);
    let cluster = apply(&clusters, "lost", &spec).await;
    create_cells(&client, &cluster).await;
    eventually("registered", WAIT, || async {
        let (_, state) = cluster_conditions(&clusters, "lost").await?;
        let wanted = [pair("True", "Reachable"), pair("True", "Registered")];
        if state == wanted {
            Ok(())
        } else {
            Err(format!("{state:?}"))
        }
    })
    .await;
    let keys = topo.keys(root).await.unwrap();

    etcd.stop();
    let deleted_at = Instant::now();
    clusters
        .delete("lost", &DeleteParams::background())
        .await
        .unwrap();
    tokio::time::sleep(timeout / 2).await;
    let waiting = clusters.get_opt("lost").await.unwrap();
    assert!(
        waiting.is_some_and(|c| c.metadata.deletion_timestamp.is_some()),
        "the finalizer holds the cluster while the timeout has not passed"
    );
    eventually("cluster and Cells gone", WAIT, || async {
        let cluster = clusters.get_opt("lost").await.map_err(|e| e.to_string())?;
        let left = cells
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?
            .items
            .len();
        if cluster.is_none() && left == 0 {
            Ok(())
        } else {
            Err(format!(
                "cluster present: {}, {left} Cells",
                cluster.is_some()
            ))
        }
    })
    .await;
    assert!(
        deleted_at.elapsed() >= timeout,
        "released before the timeout"
    );
    let skipped = events(&client, &namespace, "lost", "TopologyCleanupSkipped").await;
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    assert_eq!(skipped[0].type_.as_deref(), Some("Warning"));
    let note = skipped[0].note.clone().unwrap_or_default();
    for part in [
        "--topo-unreachable-timeout",
        root,
        "cell zone-a and database postgres",
    ] {
        assert!(note.contains(part), "{part}: {note}");
    }

    // A cluster whose server never answered gets no finalizer: it registered nothing, so its
    // deletion does not wait for the timeout.
    let port = multigres_e2e::ports::free_loopback_port().unwrap();
    let spec = cluster_spec(
        "never",
        &format!("http://127.0.0.1:{port}"),
        root,
        &["zone-a"],
    );
    apply(&clusters, "never", &spec).await;
    eventually("unreachable from the start", WAIT, || async {
        let (_, state) = cluster_conditions(&clusters, "never").await?;
        if state[0] == pair("False", "Unreachable") {
            Ok(())
        } else {
            Err(format!("{state:?}"))
        }
    })
    .await;
    let never = clusters.get("never").await.unwrap();
    assert!(never.finalizers().is_empty(), "{:?}", never.finalizers());
    clusters
        .delete("never", &DeleteParams::background())
        .await
        .unwrap();
    eventually("deleted at once", timeout / 2, || async {
        match clusters.get_opt("never").await.map_err(|e| e.to_string())? {
            None => Ok(()),
            Some(c) => Err(format!("{:?}", c.metadata.finalizers)),
        }
    })
    .await;

    // Nothing was removed: the records are still there for whoever brings the server back.
    etcd.restart().await.unwrap();
    let topo = Topology::connect(etcd.client_url(), None).await;
    let after = eventually("etcd answers again", WAIT, || async {
        topo.keys(root).await
    })
    .await;
    assert_eq!(after, keys);
}

/// A pooler's self-registration as multipooler writes it.
fn pooler_record(pod: &str, service: &str, namespace: &str, role: RoutingRole) -> Vec<u8> {
    Multipooler {
        id: Some(Id {
            component: id::ComponentType::Multipooler as i32,
            cell: "zone-a".to_owned(),
            name: pod.to_owned(),
        }),
        shard_key: Some(ShardKey {
            database: "postgres".to_owned(),
            table_group: "default".to_owned(),
            shard: "0-inf".to_owned(),
        }),
        hostname: format!("{pod}.{service}.{namespace}.svc"),
        routing_state: Some(RoutingState {
            role: role as i32,
            rule: None,
        }),
        ..Default::default()
    }
    .encode_to_vec()
}

#[tokio::test]
async fn pod_roles_are_published_over_tls_and_follow_a_failover() {
    let plane = control_plane().await;
    let namespace = fresh_namespace(plane, "dh-roles").await;
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::generate(dir.path(), &[Ipv4Addr::LOCALHOST]).unwrap();
    let etcd = EtcdProcess::start(EtcdConfig {
        tls: Some(EtcdTls {
            cert_file: pki.apiserver_cert.clone(),
            key_file: pki.apiserver_key.clone(),
            client_ca_file: Some(pki.ca_cert.clone()),
        }),
        ..EtcdConfig::default()
    })
    .await
    .unwrap();
    let pem = |path: &Path| std::fs::read(path).unwrap();
    let client = plane.client().unwrap();
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(client.clone(), &namespace);
    let secret = |name: &str, data: serde_json::Value| {
        serde_json::from_value::<k8s_openapi::api::core::v1::Secret>(json!({
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "data": data,
        }))
        .unwrap()
    };
    let b64 = |path: &Path| serde_json::to_value(k8s_openapi::ByteString(pem(path))).unwrap();
    secrets
        .create(
            &PostParams::default(),
            &secret("etcd-ca", json!({"ca.crt": b64(&pki.ca_cert)})),
        )
        .await
        .unwrap();
    secrets
        .create(
            &PostParams::default(),
            &secret(
                "etcd-client",
                json!({"tls.crt": b64(&pki.admin_cert), "tls.key": b64(&pki.admin_key)}),
            ),
        )
        .await
        .unwrap();
    let _handler = start_handler(plane, &namespace, &[]).await;
    let clusters: Api<MultigresCluster> = Api::namespaced(client.clone(), &namespace);
    let shards: Api<Shard> = Api::namespaced(client.clone(), &namespace);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let tls = TlsOptions::new()
        .ca_certificate(Certificate::from_pem(pem(&pki.ca_cert)))
        .identity(Identity::from_pem(
            pem(&pki.admin_cert),
            pem(&pki.admin_key),
        ));
    let topo = Topology::connect(etcd.client_url(), Some(tls)).await;

    let mut spec = cluster_spec("roles", &etcd.client_url(), "/multigres/roles", &["zone-a"]);
    spec["spec"]["globalTopoServer"]["external"]["caSecret"] = json!("etcd-ca");
    spec["spec"]["globalTopoServer"]["external"]["clientCertSecret"] = json!("etcd-client");
    let cluster = apply(&clusters, "roles", &spec).await;
    create_cells(&client, &cluster).await;
    eventually("registered over TLS", WAIT, || async {
        let (_, state) = cluster_conditions(&clusters, "roles").await?;
        let wanted = [pair("True", "Reachable"), pair("True", "Registered")];
        if state == wanted {
            Ok(())
        } else {
            Err(format!("{state:?}"))
        }
    })
    .await;

    // The Shard as the cluster-handler writes it, and its pool pods as StatefulSets make them.
    let resolved = resolver::resolve(&cluster, &Templates::default()).unwrap();
    let tg = &resolved.table_groups[0];
    let shard_name = names::shard("roles", "postgres", "default", "0-inf");
    let at = |cell: Option<&'static str>, pool: Option<&'static str>| Placement {
        cell,
        database: Some("postgres"),
        table_group: Some("default"),
        shard: Some("0-inf"),
        pool,
    };
    let mut shard = Shard::new(&shard_name, resolver::shard_spec(tg, &tg.shards[0]));
    shard.metadata.labels = Some(labels::labels("roles", Component::Shard, &at(None, None)));
    shards
        .patch(
            &shard_name,
            &PatchParams::apply(TEST_MANAGER).force(),
            &Patch::Apply(&shard),
        )
        .await
        .unwrap();
    shards
        .patch_status(
            &shard_name,
            &PatchParams::apply("multigres-operator/resource-handler").force(),
            &Patch::Apply(json!({
                "apiVersion": "multigres.com/v1alpha1", "kind": "Shard",
                "status": {"phase": "Progressing", "poolsReady": false},
            })),
        )
        .await
        .unwrap();
    let service = format!("{shard_name}-pool-default-zone-a");
    let pod_names: Vec<String> = (0..2).map(|i| format!("{service}-{i}")).collect();
    for pod in &pod_names {
        let body: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": pod,
                "labels": labels::labels("roles", Component::Pool, &at(Some("zone-a"), Some("default"))),
            },
            "spec": {"containers": [{"name": "postgres", "image": "pgctld:test"}]},
        }))
        .unwrap();
        pods.create(&PostParams::default(), &body).await.unwrap();
    }
    let key = |pod: &str| format!("/multigres/zone-a/poolers/multipooler-zone-a-{pod}/Pooler");
    let publish = async |primary: usize| {
        for (i, pod) in pod_names.iter().enumerate() {
            let role = if i == primary {
                RoutingRole::Primary
            } else {
                RoutingRole::Replica
            };
            topo.put(&key(pod), pooler_record(pod, &service, &namespace, role))
                .await;
        }
    };
    let roles_are = async |primary: &str, replica: &str| {
        let want = BTreeMap::from([
            (primary.to_owned(), "PRIMARY".to_owned()),
            (replica.to_owned(), "REPLICA".to_owned()),
        ]);
        eventually(&format!("{primary} is the primary"), WAIT, || async {
            let shard = shards.get(&shard_name).await.map_err(|e| e.to_string())?;
            let roles = shard.status.map(|s| s.pod_roles).unwrap_or_default();
            let label = async |pod: &str| {
                pods.get(pod)
                    .await
                    .ok()
                    .and_then(|p| p.labels().get(labels::ROLE).cloned())
            };
            let got_labels = (label(primary).await, label(replica).await);
            let want_labels = (Some("primary".to_owned()), Some("replica".to_owned()));
            if roles == want && got_labels == want_labels {
                Ok(())
            } else {
                Err(format!("{roles:?} {got_labels:?}"))
            }
        })
        .await;
    };

    publish(0).await;
    roles_are(&pod_names[0], &pod_names[1]).await;
    let stored = shards.get(&shard_name).await.unwrap();
    let status = stored.status.unwrap();
    assert_eq!(
        (status.phase.map(|p| format!("{p:?}")), status.pools_ready),
        (Some("Progressing".to_owned()), Some(false)),
        "the resource-handler's status fields survive"
    );

    // Failover: the other pod becomes the primary.
    publish(1).await;
    roles_are(&pod_names[1], &pod_names[0]).await;
}
