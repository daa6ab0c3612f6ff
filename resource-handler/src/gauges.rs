//! The seed's replica gauges (`multigres_operator_cell_gateway_replicas`,
//! `_shard_pool_replicas`, `_toposerver_replicas`), computed at scrape time from the workloads
//! this handler caches: desired is the workload's `spec.replicas`, ready its
//! `status.readyReplicas`, attributed to the Cell, Shard or TopoServer that controls it.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use kube::ResourceExt;
use kube::runtime::reflector::Store;
use multigres_api::labels::{COMPONENT, Component, POOL};
use multigres_common::status_metrics::{Replicas, StatusGauges};

/// The workloads the gauges are computed from.
#[derive(Clone)]
pub struct Caches {
    /// Pool and etcd StatefulSets.
    pub statefulsets: Store<StatefulSet>,
    /// multigateway (and other) Deployments.
    pub deployments: Store<Deployment>,
}

/// Name of the controlling owner of `kind`, if that is what controls `object`.
fn controller<K: ResourceExt>(object: &K, kind: &str) -> Option<String> {
    object
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == kind)
        .map(|o| o.name.clone())
}

fn is(object: &impl ResourceExt, component: Component) -> bool {
    object.labels().get(COMPONENT).map(String::as_str) == Some(component.as_str())
}

fn add(total: &mut Replicas, desired: Option<i32>, ready: Option<i32>) {
    total.desired += i64::from(desired.unwrap_or(1));
    total.ready += i64::from(ready.unwrap_or(0));
}

/// Sets the gateway replicas of every Cell, the replicas of every Shard pool (summed over its
/// cells) and the replicas of every TopoServer.
pub fn collect(gauges: &mut StatusGauges, caches: &Caches) {
    for deployment in caches.deployments.state() {
        let Some(cell) = controller(&*deployment, "Cell") else {
            continue;
        };
        if !is(&*deployment, Component::Multigateway) {
            continue;
        }
        let mut replicas = Replicas::default();
        add(
            &mut replicas,
            deployment.spec.as_ref().and_then(|s| s.replicas),
            deployment.status.as_ref().and_then(|s| s.ready_replicas),
        );
        gauges.set_cell_gateway(&deployment.namespace().unwrap_or_default(), &cell, replicas);
    }
    let mut pools: BTreeMap<(String, String, String), Replicas> = BTreeMap::new();
    for set in caches.statefulsets.state() {
        let desired = set.spec.as_ref().and_then(|s| s.replicas);
        let ready = set.status.as_ref().and_then(|s| s.ready_replicas);
        let namespace = set.namespace().unwrap_or_default();
        if is(&*set, Component::Pool) {
            let (Some(shard), Some(pool)) = (controller(&*set, "Shard"), set.labels().get(POOL))
            else {
                continue;
            };
            add(
                pools.entry((namespace, shard, pool.clone())).or_default(),
                desired,
                ready,
            );
        } else if (is(&*set, Component::GlobalTopo) || is(&*set, Component::LocalTopo))
            && let Some(topo) = controller(&*set, "TopoServer")
        {
            let mut replicas = Replicas::default();
            add(&mut replicas, desired, ready);
            gauges.set_toposerver(&namespace, &topo, replicas);
        }
    }
    for ((namespace, shard, pool), replicas) in pools {
        gauges.set_shard_pool(&namespace, &shard, &pool, replicas);
    }
}

#[cfg(test)]
mod tests {
    use kube::runtime::reflector::store::Writer;
    use kube::runtime::watcher::Event;
    use serde_json::json;

    use super::*;

    fn store<K>(objects: Vec<serde_json::Value>) -> Store<K>
    where
        K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned,
    {
        let mut writer = Writer::<K>::default();
        for object in objects {
            writer.apply_watcher_event(&Event::Apply(serde_json::from_value(object).unwrap()));
        }
        writer.as_reader()
    }

    fn workload(
        kind: &str,
        name: &str,
        component: &str,
        owner: (&str, &str),
        pool: Option<&str>,
        (desired, ready): (i32, i32),
    ) -> serde_json::Value {
        let mut labels = json!({COMPONENT: component});
        if let Some(pool) = pool {
            labels[POOL] = json!(pool);
        }
        json!({
            "apiVersion": "apps/v1", "kind": kind,
            "metadata": {
                "name": name, "namespace": "db", "labels": labels,
                "ownerReferences": [{
                    "apiVersion": "multigres.com/v1alpha1", "kind": owner.0, "name": owner.1,
                    "uid": "u", "controller": true,
                }],
            },
            "spec": {"replicas": desired, "selector": {}, "template": {}},
            "status": {"readyReplicas": ready},
        })
    }

    #[test]
    fn workloads_are_attributed_to_their_controlling_object() {
        let caches = Caches {
            statefulsets: store(vec![
                workload(
                    "StatefulSet",
                    "p-a",
                    "shard-pool",
                    ("Shard", "s"),
                    Some("main"),
                    (2, 2),
                ),
                workload(
                    "StatefulSet",
                    "p-b",
                    "shard-pool",
                    ("Shard", "s"),
                    Some("main"),
                    (2, 1),
                ),
                workload(
                    "StatefulSet",
                    "etcd",
                    "global-topo",
                    ("TopoServer", "t"),
                    None,
                    (3, 2),
                ),
                workload(
                    "StatefulSet",
                    "odd",
                    "shard-pool",
                    ("Other", "x"),
                    Some("main"),
                    (1, 1),
                ),
            ]),
            deployments: store(vec![
                workload(
                    "Deployment",
                    "gw",
                    "multigateway",
                    ("Cell", "c"),
                    None,
                    (2, 0),
                ),
                workload(
                    "Deployment",
                    "orch",
                    "multiorch",
                    ("Shard", "s"),
                    None,
                    (1, 1),
                ),
            ]),
        };
        let mut gauges = StatusGauges::default();
        collect(&mut gauges, &caches);
        let text = gauges.render();
        let samples: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(
            samples,
            [
                r#"multigres_operator_cell_gateway_replicas{cell="c",namespace="db",state="desired"} 2"#,
                r#"multigres_operator_cell_gateway_replicas{cell="c",namespace="db",state="ready"} 0"#,
                r#"multigres_operator_shard_pool_replicas{shard="s",pool="main",namespace="db",state="desired"} 4"#,
                r#"multigres_operator_shard_pool_replicas{shard="s",pool="main",namespace="db",state="ready"} 3"#,
                r#"multigres_operator_toposerver_replicas{name="t",namespace="db",state="desired"} 3"#,
                r#"multigres_operator_toposerver_replicas{name="t",namespace="db",state="ready"} 2"#,
            ]
        );
    }
}
