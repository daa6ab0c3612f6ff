//! Watches feeding the controllers: one reflector per kind, every object behind a
//! [`DeserializeGuard`] (a malformed object becomes a per-object error instead of a failed
//! watch) and stripped of `managedFields` before it is cached (they are never read here and
//! are often larger than the object itself).

use std::fmt::Debug;

use futures::{Stream, StreamExt};
use kube::core::DeserializeGuard;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;

/// Which namespaces the handler serves: every namespace, or one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Every namespace (the operator's ClusterRole bound with a ClusterRoleBinding).
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

/// Resolves once a reflector has listed its objects for the first time. Any number of tasks
/// may wait on it, unlike `Store::wait_until_ready`, which wakes only the last task that polled
/// it (and the controller's runner already waits on its own store that way).
#[derive(Debug, Clone)]
pub struct Synced(tokio::sync::watch::Receiver<bool>);

impl Synced {
    /// Waits for the first complete list (returns early if the reflector is dropped).
    pub async fn wait(mut self) {
        // An error means the stream is gone (shutdown): nothing more to wait for.
        let _ = self.0.wait_for(|listed| *listed).await;
    }
}

/// A reflector: the store to read, the event stream that fills it (which must be polled, by a
/// controller after `applied_objects()` or `touched_objects()`, for the store to fill), and
/// its first-list signal.
pub struct Reflected<K: Resource<DynamicType = ()> + Clone + 'static, S> {
    /// The cache.
    pub store: Store<Guarded<K>>,
    /// Watch events, applied to `store` as they pass.
    pub events: S,
    /// Resolves once `store` holds the first complete list.
    pub synced: Synced,
}

/// A reflector of `K` over `scope` with `config`.
pub fn reflect<K>(
    client: &Client,
    scope: &Scope,
    config: watcher::Config,
) -> Reflected<K, impl Stream<Item = watcher::Result<watcher::Event<Guarded<K>>>> + Send + 'static>
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
    let (listed, synced) = tokio::sync::watch::channel(false);
    let events = multigres_common::watch::watcher(scope.api::<Guarded<K>>(client), config)
        .default_backoff()
        .modify(|obj: &mut Guarded<K>| obj.managed_fields_mut().clear())
        .reflect(writer)
        .inspect(move |event| {
            if matches!(event, Ok(watcher::Event::InitDone)) {
                listed.send_replace(true);
            }
        });
    Reflected {
        store: reader,
        events,
        synced: Synced(synced),
    }
}

/// The valid objects of `store` in `namespace`.
pub fn in_namespace<K>(
    store: &Store<Guarded<K>>,
    namespace: &str,
) -> Vec<std::sync::Arc<Guarded<K>>>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    store
        .state()
        .into_iter()
        .filter(|obj| obj.meta().namespace.as_deref() == Some(namespace))
        .collect()
}
