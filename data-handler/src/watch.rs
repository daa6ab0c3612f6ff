//! Watches feeding the controllers: one reflector per kind, every object behind a
//! [`DeserializeGuard`] (a malformed object becomes a per-object error instead of a failed
//! watch) and stripped of `managedFields` before it is cached (never read here, and often
//! larger than the object itself).

use std::fmt::Debug;

use futures::Stream;
use k8s_openapi::api::core::v1::Pod;
use kube::core::DeserializeGuard;
use kube::runtime::reflector::{self, ObjectRef, ReflectHandle, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;

/// Which namespaces the handler serves: every namespace, or one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Every namespace (the ClusterRole bound with a ClusterRoleBinding).
    All,
    /// One namespace (the ClusterRole bound with a RoleBinding there).
    Namespace(String),
}

impl Scope {
    /// The API of kind `K` over this scope.
    pub fn api<K>(&self, client: &Client) -> Api<K>
    where
        K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
    {
        match self {
            Scope::All => Api::all(client.clone()),
            Scope::Namespace(ns) => Api::namespaced(client.clone(), ns),
        }
    }
}

/// A guarded object, as cached and handed to reconcilers.
pub type Guarded<K> = DeserializeGuard<K>;

/// Subscriptions to a shared watch of `K`, one per controller it triggers.
pub type Subscribers<K, const N: usize> = [ReflectHandle<Guarded<K>>; N];

/// What a watch of `K` yields.
pub type WatchEvent<K> = watcher::Result<watcher::Event<Guarded<K>>>;

/// A reflector of `K` over `scope` with `config`: the store to read and the event stream that
/// fills it. The stream must be polled (by a controller) for the store to fill.
pub fn reflect<K>(
    client: &Client,
    scope: &Scope,
    config: watcher::Config,
) -> (
    Store<Guarded<K>>,
    impl Stream<Item = WatchEvent<K>> + Send + 'static,
)
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + Debug
        + DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    reflect_trimmed(client, scope, config, |_| {})
}

/// Like [`reflect`], with `trim` also applied to every object before it is cached, to drop what
/// no reconciler reads of a kind cached in large numbers.
pub fn reflect_trimmed<K>(
    client: &Client,
    scope: &Scope,
    config: watcher::Config,
    trim: fn(&mut Guarded<K>),
) -> (
    Store<Guarded<K>>,
    impl Stream<Item = WatchEvent<K>> + Send + 'static,
)
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + Debug
        + DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let stream = multigres_common::watch::watcher(scope.api::<Guarded<K>>(client), config)
        .default_backoff()
        .modify(move |obj: &mut Guarded<K>| {
            obj.managed_fields_mut().clear();
            trim(obj);
        })
        .reflect(writer);
    (reader, stream)
}

/// Keeps of a pool pod only its metadata: the shard controller reads its name, labels and
/// annotations, and the spec and status are most of a pod's size, with every pool pod cached
/// and copied out of the cache on each shard reconcile.
pub fn pod_metadata_only(pod: &mut Guarded<Pod>) {
    if let Ok(pod) = pod.0.as_mut() {
        pod.spec = None;
        pod.status = None;
    }
}

/// Like [`reflect`], for a kind several controllers are triggered by: one watch, one store, and
/// `N` handles that each see every applied object. The returned stream drives the
/// watch and must be polled; each handle must be consumed too (a full buffer pauses the watch).
pub fn reflect_shared<K, const N: usize>(
    client: &Client,
    scope: &Scope,
    config: watcher::Config,
) -> (
    Store<Guarded<K>>,
    Subscribers<K, N>,
    impl Stream<Item = WatchEvent<K>> + Send + 'static,
)
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + Debug
        + DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store_shared(SHARED_BUFFER);
    let handles = std::array::from_fn(|_| {
        writer
            .subscribe()
            .expect("a writer made by store_shared always hands out subscriptions")
    });
    let stream = multigres_common::watch::watcher(scope.api::<Guarded<K>>(client), config)
        .default_backoff()
        .modify(|obj: &mut Guarded<K>| obj.managed_fields_mut().clear())
        .reflect_shared(writer);
    (reader, handles, stream)
}

/// Events a shared watch buffers per subscriber before it waits for the slowest.
const SHARED_BUFFER: usize = 256;

/// The valid objects of `store` in `namespace` that `wanted` picks. Only those are copied: a
/// reconcile of one Shard must not copy every pod of a namespace holding many clusters.
pub fn valid_in<K>(
    store: &Store<Guarded<K>>,
    namespace: &str,
    wanted: impl Fn(&K) -> bool,
) -> Vec<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    store
        .state()
        .iter()
        .filter(|obj| obj.meta().namespace.as_deref() == Some(namespace))
        .filter_map(|obj| obj.0.as_ref().ok())
        .filter(|obj| wanted(obj))
        .cloned()
        .collect()
}

/// The valid object `namespace/name` of `store`, if cached.
pub fn valid<K>(store: &Store<Guarded<K>>, namespace: &str, name: &str) -> Option<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    store
        .get(&ObjectRef::new(name).within(namespace))
        .and_then(|obj| obj.0.as_ref().ok().cloned())
}

/// References to the objects of `store` in `namespace` whose label `key` is `value`, for
/// mapping a change of one object to the objects that depend on it.
pub fn labelled<K>(
    store: &Store<Guarded<K>>,
    namespace: &str,
    key: &str,
    value: &str,
) -> Vec<ObjectRef<Guarded<K>>>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    store
        .state()
        .iter()
        .filter(|obj| {
            obj.meta().namespace.as_deref() == Some(namespace)
                && obj.labels().get(key).map(String::as_str) == Some(value)
        })
        .map(|obj| ObjectRef::from_obj(&**obj))
        .collect()
}

/// `namespace/name` of an object, for messages.
pub fn full_name<K: Resource>(obj: &K) -> String {
    format!(
        "{}/{}",
        obj.meta().namespace.as_deref().unwrap_or_default(),
        obj.meta().name.as_deref().unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reload::PodState;

    #[test]
    fn a_pool_pod_trimmed_to_its_metadata_reads_the_same() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "pool-a-0",
                "namespace": "ns",
                "labels": {"multigres.com/cell": "zone1", "multigres.com/role": "replica"},
                "annotations": {"multigres.com/config-hash": "h1"},
            },
            "spec": {"containers": [{"name": "postgres", "image": "postgres:17"}]},
            "status": {"phase": "Running", "podIP": "10.0.0.7"},
        }))
        .unwrap();
        let mut guarded = DeserializeGuard(Ok(pod.clone()));
        pod_metadata_only(&mut guarded);
        let trimmed = guarded.0.unwrap();
        assert_eq!(PodState::of(&trimmed), PodState::of(&pod));
        assert_eq!(trimmed.metadata, pod.metadata);
        assert_eq!((trimmed.spec, trimmed.status), (None, None));
    }
}
