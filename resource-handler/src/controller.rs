//! What the four controllers share: the caches of the shared watches
//! ([`multigres_common::shared_watch`]) and the context handed to reconcilers, made with the
//! kit of [`multigres_common::controller`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{
    ConfigMap, PersistentVolumeClaim, Pod, PodSpec, PodStatus, Secret, Service,
};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use multigres_api::labels::{COMPONENT, Component, MANAGED_SELECTOR};
use multigres_api::observability::InheritedEnv;
use multigres_api::owner::Owner;
use multigres_api::v1alpha1::MultigresCluster;
use multigres_common::controller::Kit;
use multigres_common::events::Recorder;
use multigres_common::guard::Guarded;
use multigres_common::state::HandlerState;
use multigres_common::status_pacer::StatusPacer;
use multigres_common::templates::TemplateStores;
use multigres_common::watch::Scope;

use crate::slim_cache::SlimStore;

/// Name under which events are reported: the field manager, as every handler reports.
pub const REPORTER: &str = crate::sync::FIELD_MANAGER;

pub use multigres_common::controller::{Category, Classify};

/// Objects this operator manages (every child carries the label).
pub fn managed() -> watcher::Config {
    watcher::Config::default().labels(MANAGED_SELECTOR)
}

/// The caches every reconciler reads children from.
#[derive(Clone)]
pub struct Stores {
    /// etcd and pool StatefulSets, without pod templates.
    pub statefulsets: SlimStore<StatefulSet>,
    /// multigateway, multiorch and multiadmin Deployments, without pod templates.
    pub deployments: SlimStore<Deployment>,
    /// Every Service this handler creates, with only the type of its spec.
    pub services: SlimStore<Service>,
    /// etcd and pool PodDisruptionBudgets, without spec and status.
    pub pdbs: SlimStore<PodDisruptionBudget>,
    /// Each cluster's NetworkPolicies, without spec and labels.
    pub network_policies: SlimStore<NetworkPolicy>,
    /// Data and backup volumes (for growth).
    pub pvcs: Store<PersistentVolumeClaim>,
    /// Pool pods only (what the ordered restarts need).
    pub pods: Store<Pod>,
    /// etcd, multigateway and multiorch pods: their labels, node and conditions (which one a
    /// drain strands, which nodes stopped reporting).
    pub other_pods: Store<Pod>,
    /// TLS and role Secrets this operator generated (labelled; users' Secrets are read
    /// directly).
    pub secrets: Store<Secret>,
    /// Rendered postgresql.conf ConfigMaps (labelled; referenced ones are read directly),
    /// without the file.
    pub config_maps: SlimStore<ConfigMap>,
    /// The Jobs shards run before their pool pods start (labelled).
    pub jobs: Store<Job>,
    /// Clusters (multiadmin, pull settings of etcd pods).
    pub clusters: Store<Guarded<MultigresCluster>>,
    /// Templates the resolver reads for multiadmin.
    pub templates: TemplateStores,
    /// Nodes being drained.
    pub cordoned: crate::cordon::Cordoned,
}

impl Stores {
    /// `child`'s annotations with the holds (pause, supervised restarts) its MultigresCluster
    /// asks for, from the cache: what every reconciler decides by, so a hold set on the cluster
    /// holds the child before the cluster-handler has copied it there
    /// ([`multigres_api::labels::with_cluster_holds`]).
    pub fn holds<K: ResourceExt>(&self, owner: &Owner, child: &K) -> BTreeMap<String, String> {
        let cluster = self
            .clusters
            .get(&ObjectRef::new(&owner.cluster).within(&owner.namespace));
        multigres_api::labels::with_cluster_holds(
            child.annotations(),
            cluster
                .as_deref()
                .and_then(|c| c.0.as_ref().ok())
                .map(ResourceExt::annotations),
        )
    }
}

/// Pool pods: the only pods a reconciler looks at.
pub fn pool_pods() -> watcher::Config {
    watcher::Config::default().labels(&format!(
        "{MANAGED_SELECTOR},{COMPONENT}={}",
        Component::Pool.as_str()
    ))
}

/// etcd, multigateway and multiorch pods: a Deployment of one pod is moved off a cordoned node
/// ([`crate::cordon::move_single_pod`]), and a workload not Ready names the nodes of its pods
/// that stopped reporting ([`crate::unready::silent_nodes`]).
pub fn other_pods() -> watcher::Config {
    let components = [
        Component::GlobalTopo,
        Component::LocalTopo,
        Component::Multigateway,
        Component::Multiorch,
    ]
    .map(Component::as_str)
    .join(",");
    watcher::Config::default().labels(&format!("{MANAGED_SELECTOR},{COMPONENT} in ({components})"))
}

/// Keeps of an etcd, multigateway or multiorch pod what the reconcilers read: its name, labels,
/// deletion, node and status conditions.
pub fn slim_other_pod(pod: &mut Pod) {
    pod.metadata.annotations = None;
    pod.metadata.owner_references = None;
    pod.spec = pod.spec.take().map(|spec| PodSpec {
        node_name: spec.node_name,
        ..Default::default()
    });
    pod.status = pod.status.take().map(|status| PodStatus {
        conditions: status.conditions,
        ..Default::default()
    });
}

/// Keeps of a pool pod what the reconcilers read (its metadata, its node, status conditions
/// and any container stuck waiting, see [`crate::unready`]): the rest of the spec and the
/// container statuses are most of a pod's size, and every pool pod is cached.
pub fn slim_pod(pod: &mut Pod) {
    pod.spec = pod.spec.take().map(|spec| PodSpec {
        node_name: spec.node_name,
        ..Default::default()
    });
    if let Some(status) = pod.status.as_mut() {
        crate::unready::slim_status(status);
    }
}

/// The children of `K` in `store` that `owner_uid` controls, in `namespace`.
pub fn owned<K>(store: &Store<K>, namespace: &str, owner_uid: &str) -> Vec<Arc<K>>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    store.state_filter(|obj| {
        obj.meta().namespace.as_deref() == Some(namespace)
            && crate::sync::controlled_by(obj, owner_uid)
    })
}

/// The objects of `store` in `namespace` whose labels include every one of `selector` (a
/// workload's `matchLabels`): its pods, read from a cache.
pub fn selected<K>(
    store: &Store<K>,
    namespace: &str,
    selector: &BTreeMap<String, String>,
) -> Vec<Arc<K>>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    store.state_filter(|obj| {
        let labels = obj.labels();
        obj.meta().namespace.as_deref() == Some(namespace)
            && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
    })
}

/// What every controller's context is made from.
#[derive(Clone)]
pub struct Base {
    /// Client of the handler's identity.
    pub client: Client,
    /// Namespaces served.
    pub scope: Scope,
    /// Where reconcile counts are reported.
    pub state: HandlerState,
    /// Shared event recorder.
    pub recorder: Recorder,
    /// Caches children are read from.
    pub stores: Stores,
    /// The handler's own `OTEL_*` environment, the fallback of every cluster's telemetry.
    pub telemetry: InheritedEnv,
    /// The namespace the handlers run in, which the clusters' NetworkPolicies admit.
    pub operator_namespace: String,
    /// How long a multipooler lets its PostgreSQL fail before it quarantines itself and its
    /// pod is replaced (`--pooler-unrecoverable-timeout`; zero: never).
    pub unrecoverable_timeout: Duration,
    /// The Kubernetes cluster's identity in backup repository markers.
    pub kubernetes: crate::shard::repository::KubernetesId,
}

impl Base {
    /// The context of controller `name`.
    pub fn ctx<K: Resource<DynamicType = ()>>(&self, name: &'static str) -> Arc<Ctx<K>> {
        Ctx::new(
            Kit::new(name, &self.state, &self.recorder),
            Inputs {
                client: self.client.clone(),
                scope: self.scope.clone(),
                stores: self.stores.clone(),
                telemetry: self.telemetry.clone(),
                operator_namespace: self.operator_namespace.clone(),
                unrecoverable_timeout: self.unrecoverable_timeout,
                kubernetes: self.kubernetes.clone(),
                pacer: StatusPacer::default(),
                revisions: Default::default(),
            },
        )
    }
}

/// What the resource-handler's controllers read and write with, besides the kit.
pub struct Inputs {
    /// Client of the handler's identity.
    pub client: Client,
    /// Namespaces served.
    pub scope: Scope,
    /// Caches children are read from.
    pub stores: Stores,
    /// The handler's own `OTEL_*` environment, the fallback of every cluster's telemetry.
    pub telemetry: InheritedEnv,
    /// The namespace the handlers run in, which the clusters' NetworkPolicies admit.
    pub operator_namespace: String,
    /// See [`Base::unrecoverable_timeout`].
    pub unrecoverable_timeout: Duration,
    /// See [`Base::kubernetes`].
    pub kubernetes: crate::shard::repository::KubernetesId,
    /// When each object's status was last written, to pace progress-only status writes.
    pub pacer: StatusPacer<String>,
    /// Pod templates of StatefulSet revisions already read (what a pending restart changes).
    pub revisions: crate::shard::template_changes::RevisionTemplates,
}

/// The context of a resource-handler controller of `K`.
pub type Ctx<K> = multigres_common::controller::Ctx<K, Inputs>;

/// The shared event recorder of this handler.
pub fn recorder(client: &Client) -> Recorder {
    Recorder::for_pod(client.clone(), REPORTER.to_owned())
}

/// How long to wait before looking again at something only polling can see progress of
/// (a restarted pod coming back).
pub const POLL: Duration = Duration::from_secs(5);

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::shard::rollout::pod_view;

    #[test]
    fn selected_takes_the_namespace_and_every_label_of_the_selector() {
        let pod = |ns: &str, name: &str, labels: &[(&str, &str)]| {
            let labels = labels.iter().map(|(k, v)| (k.to_string(), v.to_string()));
            let mut pod = Pod::default();
            pod.metadata.namespace = Some(ns.into());
            pod.metadata.name = Some(name.into());
            pod.metadata.labels = Some(labels.collect());
            pod
        };
        let mut writer = kube::runtime::reflector::store::Writer::<Pod>::default();
        for p in [
            pod("a", "both", &[("app", "gw"), ("cell", "z1")]),
            pod("a", "one", &[("app", "gw")]),
            pod("b", "elsewhere", &[("app", "gw"), ("cell", "z1")]),
        ] {
            writer.apply_watcher_event(&watcher::Event::Apply(p));
        }
        let selector = BTreeMap::from([("app".into(), "gw".into()), ("cell".into(), "z1".into())]);
        let found = selected(&writer.as_reader(), "a", &selector);
        let names: Vec<_> = found.iter().map(|p| p.name_any()).collect();
        assert_eq!(names, ["both"]);
    }

    #[test]
    fn a_slimmed_pool_pod_reads_the_same_and_keeps_only_its_node() {
        let mut pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "pool-a-0",
                "namespace": "ns",
                "uid": "u-1",
                "labels": {"controller-revision-hash": "pool-a-abc", "multigres.com/role": "replica"},
                "annotations": {"multigres.com/config-hash": "h1"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet",
                    "name": "pool-a", "uid": "s-1", "controller": true}],
            },
            "spec": {"nodeName": "node-a", "containers": [{"name": "postgres",
                "image": "postgres:17", "env": [{"name": "PGDATA", "value": "/data"}]}]},
            "status": {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": "postgres", "image": "postgres:17",
                    "imageID": "", "ready": true, "restartCount": 0}],
            },
        }))
        .unwrap();
        let cordoned = |node: &str| node == "node-a";
        let before = pod_view(&pod, &BTreeMap::new(), cordoned);
        let metadata = pod.metadata.clone();
        slim_pod(&mut pod);
        assert_eq!(pod_view(&pod, &BTreeMap::new(), cordoned), before);
        assert!(before.is_some_and(|view| view.ready && view.cordoned));
        assert_eq!(pod.metadata, metadata);
        let spec = pod.spec.unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("node-a"));
        assert!(spec.containers.is_empty(), "only the node is kept");
        let status = pod.status.unwrap();
        assert_eq!(status.container_statuses, None);
        assert_eq!(status.conditions.map(|c| c.len()), Some(1));
    }
}
