//! What happens to a cluster's volumes, with the cluster-handler and resource-handler running
//! as their own ServiceAccounts and the real StatefulSet controller and garbage collector:
//! - `whenDeleted: Retain`: deleting the cluster keeps every volume, and recreating it binds the
//!   very same PVCs (same UIDs);
//! - `whenDeleted: Delete`: deleting the cluster leaves nothing of it behind, volumes included,
//!   but the filesystem backup volume, which goes too only when the cluster's
//!   `multigres.com/confirm-delete-backups` annotation names it;
//! - `whenScaled`: scaling a pool down and up again brings back the same PVCs under `Retain`,
//!   and deletes the scaled-away ones (new ones on scale-up) under `Delete`; a scale-up over a
//!   scaled-away volume that is still terminating waits, says so, and completes once it is gone.
//!
//! Each test has its own namespace; the clusters' topology is an external endpoint nobody
//! dials (no data-handler runs), which the volume lifecycle does not depend on. The test
//! publishes the pods' roles in its place, so that the clusters become Available.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{DeleteParams, ListParams};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use multigres_api::v1alpha1::{MultigresCluster, Phase, Shard};
use multigres_e2e::harness::{
    self, Stack, WAIT, admin, control_plane, eventually, fresh_namespace,
};
use serde_json::{Value, json};

/// A one-cell cluster with pools `keep` (`whenScaled: Retain`) and `drop` (`whenScaled:
/// Delete`) of `replicas` pods each, and the cluster-level `whenDeleted`.
fn cluster(name: &str, when_deleted: &str, replicas: i32) -> Value {
    let pool = |when_scaled: &str| {
        json!({
            "type": "readWrite", "cells": ["zone-a"], "replicasPerCell": replicas,
            "storage": {"size": "1Gi"},
            "pvcDeletionPolicy": {"whenScaled": when_scaled},
        })
    };
    json!({
        "apiVersion": "multigres.com/v1alpha1", "kind": "MultigresCluster",
        "metadata": {"name": name},
        "spec": {
            "postgresPasswordSecretRef": {"name": "pw", "key": "password"},
            "globalTopoServer": {"external": {"endpoints": ["http://127.0.0.1:1"], "rootPath": "/x"}},
            "pvcDeletionPolicy": {"whenDeleted": when_deleted},
            "cells": [{"name": "zone-a", "zoneId": "zone-a"}],
            "databases": [{"name": "postgres", "default": true, "tablegroups": [{
                "name": "default", "default": true,
                "shards": [{"name": "0-inf", "spec": {
                    "pools": {"keep": pool("Retain"), "drop": pool("Delete")},
                }}],
            }]}],
        },
    })
}

async fn apply(clusters: &Api<MultigresCluster>, body: &Value) {
    let name = body["metadata"]["name"].as_str().expect("name");
    clusters
        .patch(
            name,
            &PatchParams::apply("e2e-user").force(),
            &Patch::Apply(body),
        )
        .await
        .unwrap_or_else(|e| panic!("applying {name}: {e}"));
}

/// Waits until the cluster is Healthy at its current generation. No data-handler runs and no
/// multiorch elects a primary on fake nodes: the roles are published here meanwhile, ordinal 0
/// the primary ([`harness::elect_primaries`]).
async fn wait_healthy(client: &Client, clusters: &Api<MultigresCluster>, name: &str) {
    eventually(&format!("{name} is Healthy"), 3 * WAIT, || async {
        let namespace = clusters.namespace().unwrap_or_default();
        harness::elect_primaries(client, namespace).await?;
        let c = clusters.get(name).await.map_err(|e| e.to_string())?;
        let status = c.status.clone().unwrap_or_default();
        if status.observed_generation == c.metadata.generation
            && status.phase == Some(Phase::Healthy)
        {
            Ok(())
        } else {
            Err(format!("{:?} {:?}", status.phase, status.conditions))
        }
    })
    .await;
}

/// Every PVC in the namespace that is not being deleted: name → UID.
async fn volumes(client: &Client, namespace: &str) -> BTreeMap<String, String> {
    let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
    api.list(&ListParams::default())
        .await
        .expect("listing PVCs")
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| (p.name_any(), p.uid().unwrap_or_default()))
        .collect()
}

/// The volumes of pool `pool` (its StatefulSet is `...-pool-<pool>-<cell>`).
fn of_pool(all: &BTreeMap<String, String>, pool: &str) -> BTreeMap<String, String> {
    all.iter()
        .filter(|(name, _)| name.contains(&format!("-pool-{pool}-")))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Waits until the pool volumes are `keep` and `drop` replicas of each, and returns them all.
async fn wait_pool_volumes(
    client: &Client,
    namespace: &str,
    replicas: usize,
) -> BTreeMap<String, String> {
    eventually(&format!("{replicas} volumes per pool"), WAIT, || async {
        let all = volumes(client, namespace).await;
        let counts = (of_pool(&all, "keep").len(), of_pool(&all, "drop").len());
        if counts == (replicas, replicas) {
            Ok(all)
        } else {
            Err(format!("{all:?}"))
        }
    })
    .await
}

/// Names of every object labelled as part of cluster `name`, by kind, across the kinds the
/// handlers and workload controllers create.
async fn leftovers(client: &Client, namespace: &str, name: &str) -> Vec<String> {
    let kinds = harness::cluster_object_kinds();
    harness::cluster_objects(client, namespace, name, &kinds)
        .await
        .into_iter()
        .map(|(kind, object)| format!("{}/{}", kind.kind, object.name_any()))
        .collect()
}

/// Deletes the cluster and waits until nothing labelled with it remains but volumes.
async fn delete_cluster(client: &Client, clusters: &Api<MultigresCluster>, name: &str) {
    let namespace = clusters
        .get(name)
        .await
        .expect("cluster")
        .namespace()
        .expect("namespace");
    clusters
        .delete(name, &DeleteParams::background())
        .await
        .expect("deleting the cluster");
    eventually(
        &format!("{name} and its workloads are gone"),
        WAIT,
        || async {
            let left: Vec<String> = leftovers(client, &namespace, name)
                .await
                .into_iter()
                .filter(|o| !o.starts_with("PersistentVolumeClaim/"))
                .collect();
            let gone = clusters
                .get_opt(name)
                .await
                .map_err(|e| e.to_string())?
                .is_none();
            if gone && left.is_empty() {
                Ok(())
            } else {
                Err(format!("cluster gone: {gone}; left: {left:?}"))
            }
        },
    )
    .await;
}

#[tokio::test]
async fn with_retain_a_recreated_cluster_binds_the_same_volumes() {
    let plane = control_plane().await;
    let namespace = fresh_namespace(plane, "retain").await;
    let stack = Stack::start(plane, &namespace, None).await;
    let client = admin(plane);
    let clusters: Api<MultigresCluster> = Api::namespaced(client.clone(), &namespace);
    let spec = cluster("kept", "Retain", 2);
    apply(&clusters, &spec).await;
    wait_healthy(&client, &clusters, "kept").await;
    let before = wait_pool_volumes(&client, &namespace, 2).await;

    delete_cluster(&client, &clusters, "kept").await;
    assert_eq!(
        volumes(&client, &namespace).await,
        before,
        "every volume survives the cluster"
    );

    apply(&clusters, &spec).await;
    wait_healthy(&client, &clusters, "kept").await;
    assert_eq!(
        volumes(&client, &namespace).await,
        before,
        "the recreated cluster uses the same PVCs and no others"
    );
    // The pool pods mount those claims.
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), &namespace);
    let claimed: std::collections::BTreeSet<String> = pods
        .list(&ListParams::default().labels("app.kubernetes.io/component=shard-pool"))
        .await
        .expect("pods")
        .items
        .iter()
        .flat_map(|p| p.spec.iter().flat_map(|s| s.volumes.iter().flatten()))
        .filter_map(|v| Some(v.persistent_volume_claim.as_ref()?.claim_name.clone()))
        .collect();
    assert_eq!(
        claimed,
        before.keys().cloned().collect(),
        "the pool pods mount exactly the kept volumes (data and backup)"
    );
    println!(
        "whenDeleted Retain: {} PVCs kept across delete and recreate, same UIDs: {:?}",
        before.len(),
        before.keys().collect::<Vec<_>>()
    );
    for handler in stack.handlers() {
        assert!(handler.exit_status().is_none(), "{} exited", handler.name());
    }
}

/// Under `whenDeleted: Delete` a deleted cluster leaves nothing behind but its filesystem
/// backup volume, the only copy of its backups; that goes too only when the cluster's
/// annotation `multigres.com/confirm-delete-backups` names it (docs/operations.md, "Changes
/// that delete data").
#[tokio::test]
async fn with_delete_nothing_of_a_deleted_cluster_is_left_but_unconfirmed_backups() {
    let plane = control_plane().await;
    let namespace = fresh_namespace(plane, "delete").await;
    let stack = Stack::start(plane, &namespace, None).await;
    let client = admin(plane);
    let clusters: Api<MultigresCluster> = Api::namespaced(client.clone(), &namespace);
    apply(&clusters, &cluster("dropped", "Delete", 2)).await;
    wait_healthy(&client, &clusters, "dropped").await;
    let before = wait_pool_volumes(&client, &namespace, 2).await;
    let backup = "dropped-postgres-default-0-inf-backup";
    assert!(before.contains_key(backup), "{before:?}");

    delete_cluster(&client, &clusters, "dropped").await;
    eventually("only the backup volume is left", WAIT, || async {
        let left = volumes(&client, &namespace).await;
        let labelled = leftovers(&client, &namespace, "dropped").await;
        let kept = BTreeMap::from([(backup.to_owned(), before[backup].clone())]);
        if left == kept && labelled == [format!("PersistentVolumeClaim/{backup}")] {
            Ok(())
        } else {
            Err(format!("{left:?} {labelled:?}"))
        }
    })
    .await;
    println!(
        "whenDeleted Delete: {} of {} PVCs and every other labelled object gone after the \
         cluster; backup volume {backup} kept (same UID)",
        before.len() - 1,
        before.len()
    );

    let mut confirmed = cluster("confirmed", "Delete", 2);
    confirmed["metadata"]["annotations"] =
        json!({"multigres.com/confirm-delete-backups": "confirmed"});
    apply(&clusters, &confirmed).await;
    wait_healthy(&client, &clusters, "confirmed").await;
    let mine = |all: BTreeMap<String, String>| -> BTreeMap<String, String> {
        all.into_iter()
            .filter(|(name, _)| name.contains("confirmed-"))
            .collect()
    };
    let before = mine(wait_pool_volumes(&client, &namespace, 2).await);
    assert!(
        before.contains_key("confirmed-postgres-default-0-inf-backup"),
        "{before:?}"
    );
    delete_cluster(&client, &clusters, "confirmed").await;
    eventually(
        "no volume of the confirmed cluster is left",
        WAIT,
        || async {
            let left = mine(volumes(&client, &namespace).await);
            let labelled = leftovers(&client, &namespace, "confirmed").await;
            if left.is_empty() && labelled.is_empty() {
                Ok(())
            } else {
                Err(format!("{left:?} {labelled:?}"))
            }
        },
    )
    .await;
    println!(
        "whenDeleted Delete with confirm-delete-backups: all {} PVCs, the backup volume \
         included, and every labelled object gone after the cluster",
        before.len()
    );
    for handler in stack.handlers() {
        assert!(handler.exit_status().is_none(), "{} exited", handler.name());
    }
}

/// Adds (`hold`) or removes the test's own finalizer on PVC `name`.
async fn hold_volume(client: &Client, namespace: &str, name: &str, hold: bool) {
    let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
    // The StatefulSet controller and the PVC protection controller update the claim too: a
    // conflict is retried with the claim as it is then.
    eventually(&format!("the finalizers of {name} set"), WAIT, || async {
        let pvc = api.get(name).await.map_err(|e| e.to_string())?;
        let mut finalizers: Vec<String> = pvc
            .finalizers()
            .iter()
            .filter(|f| *f != HOLD)
            .cloned()
            .collect();
        if hold {
            finalizers.push(HOLD.to_owned());
        }
        let patch = json!({"metadata": {
            "finalizers": finalizers, "resourceVersion": pvc.resource_version(),
        }});
        api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(drop)
            .map_err(|e| e.to_string())
    })
    .await;
}

/// The finalizer that keeps a scaled-away volume terminating for as long as the test wants.
const HOLD: &str = "e2e.multigres.com/hold";

#[tokio::test]
async fn scaling_down_and_up_follows_when_scaled() {
    let plane = control_plane().await;
    let namespace = fresh_namespace(plane, "scaled").await;
    let stack = Stack::start(plane, &namespace, None).await;
    let client = admin(plane);
    let clusters: Api<MultigresCluster> = Api::namespaced(client.clone(), &namespace);
    apply(&clusters, &cluster("scaled", "Retain", 3)).await;
    wait_healthy(&client, &clusters, "scaled").await;
    let three = wait_pool_volumes(&client, &namespace, 3).await;
    // The last drop volume stays terminating after the scale-down, as a slow garbage collector
    // or storage driver would leave it. A StatefulSet scaled up over it would wait for it to go
    // and never look again (its controller does not watch claims).
    let (held, _) = of_pool(&three, "drop")
        .into_iter()
        .next_back()
        .expect("a volume");
    hold_volume(&client, &namespace, &held, true).await;

    apply(&clusters, &cluster("scaled", "Retain", 1)).await;
    wait_healthy(&client, &clusters, "scaled").await;
    let one = eventually("the drop pool's scaled-away volumes go", WAIT, || async {
        let all = volumes(&client, &namespace).await;
        if of_pool(&all, "drop").len() == 1 {
            Ok(all)
        } else {
            Err(format!("{all:?}"))
        }
    })
    .await;
    assert_eq!(
        of_pool(&one, "keep"),
        of_pool(&three, "keep"),
        "whenScaled Retain keeps every volume"
    );
    let first_drop = of_pool(&three, "drop")
        .into_iter()
        .next()
        .expect("a volume");
    assert_eq!(
        of_pool(&one, "drop"),
        BTreeMap::from([first_drop.clone()]),
        "whenScaled Delete keeps only the remaining pod's volume"
    );

    apply(&clusters, &cluster("scaled", "Retain", 3)).await;
    let waiting = eventually(
        "the scale-up waits for the terminating volume",
        WAIT,
        || async {
            let shards: Api<Shard> = Api::namespaced(client.clone(), &namespace);
            let listed = shards
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            let available = listed
                .items
                .iter()
                .flat_map(|s| s.status.iter().flat_map(|st| st.conditions.iter()))
                .find(|c| c.type_ == "Available")
                .cloned();
            match available {
                Some(c) if c.reason == "WaitingForVolumeDeletion" && c.message.contains(&held) => {
                    Ok(c.message)
                }
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    hold_volume(&client, &namespace, &held, false).await;
    wait_healthy(&client, &clusters, "scaled").await;
    let again = wait_pool_volumes(&client, &namespace, 3).await;
    assert_eq!(
        of_pool(&again, "keep"),
        of_pool(&three, "keep"),
        "whenScaled Retain: the same PVCs come back"
    );
    let drop_again = of_pool(&again, "drop");
    assert_eq!(
        drop_again.keys().collect::<Vec<_>>(),
        of_pool(&three, "drop").keys().collect::<Vec<_>>(),
        "same names"
    );
    for (name, uid) in &drop_again {
        if *name == first_drop.0 {
            assert_eq!(*uid, first_drop.1, "{name} was never removed");
        } else {
            assert_ne!(Some(uid), three.get(name), "{name} is a new volume");
        }
    }
    println!(
        "whenScaled: 3 -> 1 -> 3 replicas; Retain pool kept {:?}; Delete pool recreated {} \
         volumes; while {held} was terminating the shard said: {waiting}",
        of_pool(&three, "keep").keys().collect::<Vec<_>>(),
        drop_again.len() - 1
    );
    for handler in stack.handlers() {
        assert!(handler.exit_status().is_none(), "{} exited", handler.name());
    }
}
