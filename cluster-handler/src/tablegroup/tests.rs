//! The Shards a TableGroup produces and the status aggregated from them.

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use multigres_api::resolver;
use multigres_api::v1alpha1::{Phase, Shard, TableGroup};
use multigres_common::conditions::{FALSE, TRUE, find_condition};
use multigres_common::controller::Classify;
use serde_json::{Value, json};

use super::build;
use super::status::{self, Outcome};
use crate::cluster::build as cluster_build;
use crate::fixtures::{self, NAMESPACE, stored};

/// The TableGroup the cluster-handler makes for `sample`, as stored (uid `tg-uid`).
fn table_group(sample: &str) -> TableGroup {
    let fixtures::Sample { cluster, templates } = fixtures::sample(sample);
    let resolved = resolver::resolve(&cluster, &templates).unwrap();
    let owner = cluster_build::owner(&cluster).unwrap();
    let tg = cluster_build::children(&owner, &resolved)
        .table_groups
        .remove(0);
    stored(tg, "tg-uid", 1)
}

fn at(seconds: i64) -> Timestamp {
    Timestamp::from_second(seconds).unwrap()
}

#[test]
fn one_shard_per_entry_named_labelled_and_owned_by_the_table_group() {
    let tg = table_group("overrides");
    let shards = build::shards(&build::owner(&tg).unwrap(), &tg.spec);
    assert_eq!(shards.len(), 1);
    let shard = &shards[0];
    assert_eq!(shard.name_any(), "overrides-postgres-default-0-inf");
    assert_eq!(shard.namespace().as_deref(), Some(NAMESPACE));
    let labels: BTreeMap<&str, &str> = shard
        .labels()
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(
        labels,
        BTreeMap::from([
            ("app.kubernetes.io/name", "multigres"),
            ("app.kubernetes.io/part-of", "multigres"),
            ("app.kubernetes.io/managed-by", "multigres-operator"),
            ("app.kubernetes.io/instance", "overrides"),
            ("app.kubernetes.io/component", "shard"),
            ("multigres.com/cluster", "overrides"),
            ("multigres.com/database", "postgres"),
            ("multigres.com/tablegroup", "default"),
            ("multigres.com/shard", "0-inf"),
        ])
    );
    assert_eq!(
        serde_json::to_value(&shard.metadata.owner_references).unwrap(),
        json!([{
            "apiVersion": "multigres.com/v1alpha1", "kind": "TableGroup",
            "name": "overrides-postgres-default", "uid": "tg-uid",
            "controller": true, "blockOwnerDeletion": true,
        }])
    );
    let spec = serde_json::to_value(&shard.spec).unwrap();
    assert_eq!(spec["databaseName"], "postgres");
    assert_eq!(spec["tableGroupName"], "default");
    assert_eq!(spec["shardName"], "0-inf");
    // main: 2 per cell in zone-a and zone-b; reporting: 1 in zone-a.
    assert_eq!(spec["replicas"], 5);
    assert_eq!(spec["pools"]["main"]["storage"]["size"], "4Gi");
    assert_eq!(spec["pvcDeletionPolicy"]["whenDeleted"], "Retain");
    assert_eq!(
        spec["postgresPasswordSecretRef"]["name"],
        "overrides-postgres-password"
    );
    assert_eq!(
        shard.spec,
        resolver::shard_spec(&tg.spec, &tg.spec.shards[0]),
        "the spec is the resolver's"
    );
}

#[test]
fn a_table_group_that_names_no_cluster_cannot_have_shards() {
    let mut tg = table_group("minimal");
    let cluster = tg
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .remove("multigres.com/cluster");
    assert_eq!(
        build::owner(&tg).unwrap().cluster,
        cluster.unwrap(),
        "without its label, its owner reference names the cluster"
    );
    tg.metadata.owner_references = None;
    let error = super::Error::from(build::owner(&tg).unwrap_err());
    assert!(error.is_invalid_spec());
    assert_eq!(
        error.to_string(),
        "cannot tell which MultigresCluster this belongs to: set the multigres.com/cluster label \
         or a controller owner reference to the MultigresCluster"
    );
}

/// The Shards of `tg` as the resource-handler would report them.
fn reported(
    tg: &TableGroup,
    phase: &str,
    generation: i64,
    observed: i64,
) -> BTreeMap<String, Shard> {
    build::shards(&build::owner(tg).unwrap(), &tg.spec)
        .into_iter()
        .map(|shard| {
            let mut value: Value = serde_json::to_value(&shard).unwrap();
            value["metadata"]["generation"] = json!(generation);
            value["status"] = json!({"phase": phase, "observedGeneration": observed});
            (shard.name_any(), serde_json::from_value(value).unwrap())
        })
        .collect()
}

#[test]
fn status_counts_ready_shards_and_a_recompute_writes_nothing() {
    let tg = table_group("minimal");
    let shards = build::shards(&build::owner(&tg).unwrap(), &tg.spec);

    let waiting = status::compute(&tg, &Outcome::Applied(&shards), &BTreeMap::new(), at(10));
    assert!(!waiting.changed.is_empty());
    let s = &waiting.status;
    assert_eq!((s.ready_shards, s.total_shards), (Some(0), Some(1)));
    assert_eq!(s.phase, Some(Phase::Initializing));
    let available = find_condition(&s.conditions, "Available").unwrap();
    assert_eq!(
        (available.status.as_str(), available.message.as_str()),
        (FALSE, "0/1 shards ready")
    );

    let stale = status::compute(
        &tg,
        &Outcome::Applied(&shards),
        &reported(&tg, "Healthy", 2, 1),
        at(20),
    );
    assert_eq!(
        stale.status.ready_shards,
        Some(0),
        "a status of an older generation does not count"
    );
    assert_eq!(stale.status.phase, Some(Phase::Progressing));

    let healthy = reported(&tg, "Healthy", 2, 2);
    let ready = status::compute(&tg, &Outcome::Applied(&shards), &healthy, at(30));
    let s = &ready.status;
    assert_eq!((s.ready_shards, s.total_shards), (Some(1), Some(1)));
    assert_eq!(s.phase, Some(Phase::Healthy));
    assert_eq!(s.observed_generation, Some(1));
    let available = find_condition(&s.conditions, "Available").unwrap();
    assert_eq!(
        (available.status.as_str(), available.reason.as_str()),
        (TRUE, "AllShardsReady")
    );

    let mut tg = tg;
    tg.status = Some(ready.status.clone());
    let again = status::compute(&tg, &Outcome::Applied(&shards), &healthy, at(90));
    assert_eq!(again.changed, Vec::<&str>::new());
    assert!(again.notices.is_empty());
    assert_eq!(again.status, ready.status);
}

#[test]
fn a_degraded_shard_or_a_refused_apply_degrades_the_table_group() {
    let tg = table_group("minimal");
    let shards = build::shards(&build::owner(&tg).unwrap(), &tg.spec);
    let degraded = status::compute(
        &tg,
        &Outcome::Applied(&shards),
        &reported(&tg, "Degraded", 1, 1),
        at(1),
    );
    assert_eq!(degraded.status.phase, Some(Phase::Degraded));
    let condition = find_condition(&degraded.status.conditions, "Degraded").unwrap();
    assert_eq!(
        (condition.status.as_str(), condition.reason.as_str()),
        (TRUE, "ShardDegraded")
    );
    assert_eq!(
        condition.message,
        "Shard minimal-postgres-default-0-inf is degraded"
    );

    let refused = super::Error::Rejected {
        name: "minimal-postgres-default-0-inf".into(),
        message: "spec.pools: Too many".into(),
    };
    let blocked = status::compute(
        &tg,
        &Outcome::Blocked {
            reason: refused.reason(),
            message: refused.to_string(),
        },
        &reported(&tg, "Healthy", 1, 1),
        at(1),
    );
    assert_eq!(blocked.status.phase, Some(Phase::Degraded));
    assert_eq!(blocked.status.ready_shards, Some(1));
    let condition = find_condition(&blocked.status.conditions, "Degraded").unwrap();
    assert_eq!(condition.reason, "InvalidSpec");
    assert!(
        blocked
            .notices
            .iter()
            .any(|n| n.reason == "InvalidSpec" && n.message.contains("Too many"))
    );
}

#[test]
fn the_inherited_annotations_of_the_cluster_reach_every_cell_table_group_and_shard() {
    use multigres_api::confirm::DELETE_BACKUPS;
    use multigres_api::observability::PROJECT_REF_ANNOTATION;
    let fixtures::Sample {
        mut cluster,
        templates,
    } = fixtures::sample("overrides");
    let resolved = resolver::resolve(&cluster, &templates).unwrap();
    let plain = cluster_build::children(&cluster_build::owner(&cluster).unwrap(), &resolved);
    assert!(
        plain.cells.iter().all(|c| c.annotations().is_empty()),
        "no project, no annotation"
    );

    cluster
        .annotations_mut()
        .insert(PROJECT_REF_ANNOTATION.to_owned(), "proj-1".to_owned());
    // The resource-handler reads the backup confirmation from the Shard.
    cluster
        .annotations_mut()
        .insert(DELETE_BACKUPS.to_owned(), "overrides".to_owned());
    cluster
        .annotations_mut()
        .insert("unrelated.example/key".to_owned(), "x".to_owned());
    let children = cluster_build::children(&cluster_build::owner(&cluster).unwrap(), &resolved);
    let project =
        |annotations: &BTreeMap<String, String>| annotations.get(PROJECT_REF_ANNOTATION).cloned();
    for cell in &children.cells {
        assert_eq!(project(cell.annotations()).as_deref(), Some("proj-1"));
    }
    for topo in &children.topo_servers {
        assert_eq!(project(topo.annotations()).as_deref(), Some("proj-1"));
    }
    let tg = stored(children.table_groups[0].clone(), "tg-uid", 1);
    assert_eq!(project(tg.annotations()).as_deref(), Some("proj-1"));
    let shards = build::shards(&build::owner(&tg).unwrap(), &tg.spec);
    assert!(!shards.is_empty());
    for shard in &shards {
        assert_eq!(project(shard.annotations()).as_deref(), Some("proj-1"));
        assert_eq!(
            shard.annotations().get(DELETE_BACKUPS).map(String::as_str),
            Some("overrides")
        );
        assert_eq!(shard.annotations().len(), 2, "only the inherited ones");
    }
}
