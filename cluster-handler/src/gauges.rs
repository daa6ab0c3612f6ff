//! The seed's cluster gauges (`multigres_operator_cluster_info`, `_cluster_cells_total`,
//! `_cluster_shards_total`), computed at scrape time from the caches the controllers keep.

use std::collections::BTreeMap;

use kube::ResourceExt;
use kube::runtime::reflector::Store;
use multigres_api::labels::CLUSTER;
use multigres_api::v1alpha1::{Cell, MultigresCluster, Shard};
use multigres_common::status_metrics::StatusGauges;

use crate::watch::Guarded;

/// The caches the gauges are computed from.
#[derive(Clone)]
pub struct Caches {
    /// Every cluster in scope.
    pub clusters: Store<Guarded<MultigresCluster>>,
    /// The operator's Cells.
    pub cells: Store<Guarded<Cell>>,
    /// The operator's Shards.
    pub shards: Store<Guarded<Shard>>,
}

/// Objects per (namespace, `multigres.com/cluster` label).
fn per_cluster<K>(store: &Store<Guarded<K>>) -> BTreeMap<(String, String), u64>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned,
{
    let mut counts = BTreeMap::new();
    for object in store.state() {
        if let Some(cluster) = object.labels().get(CLUSTER) {
            *counts
                .entry((object.namespace().unwrap_or_default(), cluster.clone()))
                .or_default() += 1;
        }
    }
    counts
}

/// Sets the gauges of every cached cluster: its phase (`Unknown` until it has one, or while its
/// object does not read), and the Cells and Shards the operator made for it.
pub fn collect(gauges: &mut StatusGauges, caches: &Caches) {
    let cells = per_cluster(&caches.cells);
    let shards = per_cluster(&caches.shards);
    for cached in caches.clusters.state() {
        let key = (cached.namespace().unwrap_or_default(), cached.name_any());
        let phase = cached
            .0
            .as_ref()
            .ok()
            .and_then(|c| c.status.as_ref())
            .and_then(|s| s.phase)
            .map_or_else(|| "Unknown".to_owned(), |p| format!("{p:?}"));
        gauges.set_cluster(
            &key.0,
            &key.1,
            &phase,
            cells.get(&key).copied().unwrap_or_default(),
            shards.get(&key).copied().unwrap_or_default(),
        );
    }
}

#[cfg(test)]
mod tests {
    use kube::runtime::reflector::store::Writer;
    use kube::runtime::watcher::Event;
    use serde_json::json;

    use super::*;

    fn store<K>(objects: Vec<serde_json::Value>) -> Store<Guarded<K>>
    where
        K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned,
    {
        let mut writer = Writer::<Guarded<K>>::default();
        for object in objects {
            writer.apply_watcher_event(&Event::Apply(serde_json::from_value(object).unwrap()));
        }
        writer.as_reader()
    }

    fn child(kind: &str, name: &str, namespace: &str, cluster: &str) -> serde_json::Value {
        json!({
            "apiVersion": "multigres.com/v1alpha1", "kind": kind,
            "metadata": {"name": name, "namespace": namespace, "labels": {CLUSTER: cluster}},
        })
    }

    #[test]
    fn every_cached_cluster_reports_its_phase_and_children() {
        let caches = Caches {
            clusters: store(vec![
                json!({
                    "apiVersion": "multigres.com/v1alpha1", "kind": "MultigresCluster",
                    "metadata": {"name": "main", "namespace": "db"},
                    "spec": {"postgresPasswordSecretRef": {"name": "pw", "key": "password"},
                             "cells": [{"name": "zone-a", "zoneId": "zone-a"}]},
                    "status": {"phase": "Healthy"},
                }),
                json!({
                    "apiVersion": "multigres.com/v1alpha1", "kind": "MultigresCluster",
                    "metadata": {"name": "broken", "namespace": "db"},
                    "spec": {"cells": "not a list"},
                }),
            ]),
            cells: store(vec![
                child("Cell", "main-zone-a", "db", "main"),
                child("Cell", "main-zone-b", "db", "main"),
                child("Cell", "main-zone-a", "other", "main"),
            ]),
            shards: store(vec![child(
                "Shard",
                "main-postgres-default-0-inf",
                "db",
                "main",
            )]),
        };
        let mut gauges = StatusGauges::default();
        collect(&mut gauges, &caches);
        let text = gauges.render();
        for expected in [
            r#"multigres_operator_cluster_info{name="main",namespace="db",phase="Healthy"} 1"#,
            r#"multigres_operator_cluster_info{name="broken",namespace="db",phase="Unknown"} 1"#,
            r#"multigres_operator_cluster_cells_total{cluster="main",namespace="db"} 2"#,
            r#"multigres_operator_cluster_shards_total{cluster="main",namespace="db"} 1"#,
            r#"multigres_operator_cluster_cells_total{cluster="broken",namespace="db"} 0"#,
        ] {
            assert!(text.contains(expected), "{expected} missing in:\n{text}");
        }
    }
}
