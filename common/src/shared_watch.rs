//! One cached watch per kind, shared by every controller of a handler that reads or is
//! triggered by that kind.
//!
//! kube's own shared streams (`reflect_shared` and its `ReflectHandle`) are not used, for two
//! defects: a `ReflectHandle` passes on references and looks each one up in the cache when its
//! subscriber gets to it, and when the object is gone by then (a pool pod that changed and was
//! deleted before its StatefulSet recreated it) it returns `Pending` without arranging to be
//! woken, so that controller hears nothing more of the kind until some unrelated wake-up,
//! possibly never; and deletions are never passed on (kube-rs issue 1590), so an owner is not
//! told that someone deleted its child. Here each subscriber receives the objects themselves,
//! after the cache took them in: applied objects, and on request deleted ones (also those a
//! fresh list after a broken watch no longer shows). A subscriber that falls more than the
//! buffer behind is handed every cached object instead of what it missed, so no change is
//! lost and the watch never waits for a slow controller.

use std::collections::HashMap;
use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt, Stream, StreamExt};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::broadcast;

use crate::shutdown::Shutdown;
use crate::state::HandlerState;
use crate::telemetry::ErrorChain;
use crate::watch::Scope;

/// Changes one shared watch buffers for a slow subscriber; one that falls further behind is
/// handed every cached object instead. Each slot costs a few words until used, and a value is
/// dropped as soon as every subscriber has taken it.
const BUFFER: usize = 256;

pub use crate::guard::Guarded;

/// The annotation in which client-side `kubectl apply` keeps the whole object it applied.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// What a subscriber is woken by.
pub type Changes<K> = BoxStream<'static, Arc<K>>;

/// One change the watch passed to its cache.
#[derive(Clone)]
enum Change<K> {
    /// The object was created or changed (or listed).
    Applied(Arc<K>),
    /// The object is gone; its last known state.
    Deleted(Arc<K>),
}

/// A cached watch of `K` and the means to subscribe to its changes. Cloning it is cheap and
/// shares the same cache and watch.
pub struct SharedWatch<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    store: Store<K>,
    changes: broadcast::Sender<Change<K>>,
    listed: tokio::sync::watch::Receiver<bool>,
}

impl<K> Clone for SharedWatch<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            changes: self.changes.clone(),
            listed: self.listed.clone(),
        }
    }
}

impl<K> SharedWatch<K>
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    /// The cache.
    pub fn store(&self) -> Store<K> {
        self.store.clone()
    }

    /// Objects created or changed, each passed on once the cache holds it; a new subscription
    /// starts with every object already cached. For a controller's own kind.
    pub fn changes(&self) -> Changes<K> {
        self.subscribe(false)
    }

    /// Like [`Self::changes`], and deleted objects too: for a kind a controller owns or watches,
    /// so a child someone deletes is recreated at once instead of at the owner's next change.
    pub fn changes_and_deletions(&self) -> Changes<K> {
        self.subscribe(true)
    }

    /// Resolves once the cache holds its first complete list; false when the watch stopped
    /// before that (shutdown).
    pub async fn listed(&self) -> bool {
        let mut listed = self.listed.clone();
        listed.wait_for(|listed| *listed).await.is_ok()
    }

    fn subscribe(&self, with_deletions: bool) -> Changes<K> {
        // Subscribed before the cache is read, so nothing falls between the two (an object
        // may come twice, which a controller folds into one reconcile).
        let receiver = self.changes.subscribe();
        let cached = futures::stream::iter(self.store.state());
        let store = self.store.clone();
        let changes =
            futures::stream::unfold((receiver, store), move |(mut receiver, store)| async move {
                loop {
                    let objects = match receiver.recv().await {
                        Ok(Change::Applied(object)) => vec![object],
                        Ok(Change::Deleted(object)) if with_deletions => vec![object],
                        Ok(Change::Deleted(_)) => continue,
                        Err(broadcast::error::RecvError::Lagged(missed)) => {
                            tracing::warn!(
                                kind = %K::kind(&()),
                                missed,
                                "a slow controller missed changes; handing it every cached object"
                            );
                            store.state()
                        }
                        Err(broadcast::error::RecvError::Closed) => return None,
                    };
                    return Some((futures::stream::iter(objects), (receiver, store)));
                }
            })
            .flatten();
        cached.chain(changes).boxed()
    }
}

/// Caches the objects of `events` and passes each change on to the subscribers of the returned
/// [`SharedWatch`] once the cache shows it. The returned stream must be polled for anything to
/// happen.
fn fan_out<K, S>(events: S) -> (SharedWatch<K>, impl Stream<Item = S::Item> + Send + 'static)
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    S: Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static,
{
    let (store, writer) = reflector::store();
    let (changes, _) = broadcast::channel(BUFFER);
    let (listed_tx, listed) = tokio::sync::watch::channel(false);
    let shared = SharedWatch {
        store: store.clone(),
        changes: changes.clone(),
        listed,
    };
    // What the cache held when a fresh list began, to tell which objects it no longer has.
    let mut before_list: HashMap<ObjectRef<K>, Arc<K>> = HashMap::new();
    // No subscriber yet (or a kind no controller is triggered by) is not an error: sends are
    // not checked.
    let events = events.reflect(writer).inspect(move |event| match event {
        Ok(watcher::Event::Apply(object)) => {
            // The cached copy, not another one.
            let cached = store.get(&ObjectRef::from_obj(object));
            let object = cached.unwrap_or_else(|| Arc::new(object.clone()));
            let _ = changes.send(Change::Applied(object));
        }
        Ok(watcher::Event::Delete(object)) => {
            let _ = changes.send(Change::Deleted(Arc::new(object.clone())));
        }
        Ok(watcher::Event::Init) => {
            before_list = store
                .state()
                .into_iter()
                .map(|object| (ObjectRef::from_obj(&*object), object))
                .collect();
        }
        // A full list (the first, or after the watch had to start over) may have changed
        // anything: every cached object counts as changed, and what the previous cache held
        // and this list lacks was deleted meanwhile.
        Ok(watcher::Event::InitDone) => {
            for object in store.state() {
                before_list.remove(&ObjectRef::from_obj(&*object));
                let _ = changes.send(Change::Applied(object));
            }
            for (_, gone) in before_list.drain() {
                let _ = changes.send(Change::Deleted(gone));
            }
            listed_tx.send_replace(true);
        }
        Ok(watcher::Event::InitApply(_)) | Err(_) => {}
    });
    (shared, events)
}

/// The shared watches of one handler: each is started with [`Watches::share`], and all run
/// once [`Watches::start`] is called. Each kind is reported synced (`HandlerInfo`) by itself
/// when its first list is cached.
pub struct Watches {
    client: Client,
    scope: Scope,
    state: HandlerState,
    drivers: Vec<BoxFuture<'static, ()>>,
    listed: Vec<BoxFuture<'static, bool>>,
}

impl Watches {
    /// Watches over `scope` with `client`, reporting to `state`.
    pub fn new(client: Client, scope: Scope, state: HandlerState) -> Self {
        Self {
            client,
            scope,
            state,
            drivers: Vec::new(),
            listed: Vec::new(),
        }
    }

    /// A shared watch of `K` with `config`. Managed fields and `kubectl apply`'s copy of the
    /// last applied object (`kubectl.kubernetes.io/last-applied-configuration`) are dropped
    /// before caching: never read by a handler, and each often as large as the rest of the
    /// object.
    pub fn share<K>(&mut self, config: watcher::Config) -> SharedWatch<K>
    where
        K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + Debug
            + DeserializeOwned
            + Send
            + Sync
            + 'static,
    {
        self.share_trimmed(config, |_| {})
    }

    /// Like [`Self::share`], with `trim` also applied to every object before it is cached, to
    /// drop what no reconciler reads of a kind cached in large numbers.
    pub fn share_trimmed<K>(&mut self, config: watcher::Config, trim: fn(&mut K)) -> SharedWatch<K>
    where
        K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + Debug
            + DeserializeOwned
            + Send
            + Sync
            + 'static,
    {
        let events = crate::watch::watcher(self.scope.api::<K>(&self.client), config)
            .default_backoff()
            .modify(move |obj: &mut K| {
                drop_unread_metadata(obj);
                trim(obj);
            });
        let (shared, events) = fan_out(events);
        let kind = K::kind(&()).into_owned();
        self.drivers.push(drive(kind.clone(), events).boxed());
        let (watch, state) = (shared.clone(), self.state.clone());
        self.listed.push(
            async move {
                let listed = watch.listed().await;
                if listed {
                    tracing::debug!(%kind, "cache filled");
                    state.mark_synced(kind);
                }
                listed
            }
            .boxed(),
        );
        shared
    }

    /// Starts every watch, each on a task of its own; they stop when the returned
    /// [`RunningWatches`] is dropped.
    pub fn start(self) -> RunningWatches {
        RunningWatches {
            tasks: self.drivers.into_iter().map(tokio::spawn).collect(),
            listed: self.listed,
            state: self.state,
        }
    }
}

/// The running watches of a handler.
pub struct RunningWatches {
    tasks: Vec<tokio::task::JoinHandle<()>>,
    listed: Vec<BoxFuture<'static, bool>>,
    state: HandlerState,
}

impl RunningWatches {
    /// Resolves once every cache holds its first list (each kind is reported synced as it
    /// gets there); false when a watch stopped first. Resolves at once when asked again.
    async fn all_listed(&mut self) -> bool {
        let pending = std::mem::take(&mut self.listed);
        futures::future::join_all(pending)
            .await
            .into_iter()
            .all(|listed| listed)
    }
}

impl RunningWatches {
    /// Waits until every cache holds its first list, then reports the handler's work ready
    /// (SERVING once it acts) and gives back what start-up alone needed
    /// ([`crate::memory::release_startup_memory`]). False when shutdown came first or a watch
    /// stopped: the work is then never ready.
    pub async fn ready_when_listed(&mut self, shutdown: &Shutdown) -> bool {
        let listed = tokio::select! {
            listed = self.all_listed() => listed,
            () = shutdown.wait() => false,
        };
        if listed {
            self.state.set_ready(true).await;
            tracing::info!("caches synced; serving");
            crate::memory::release_startup_memory();
        }
        listed
    }
}

impl Drop for RunningWatches {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Drops the managed fields and [`LAST_APPLIED`] of `obj` (see [`Watches::share`]).
fn drop_unread_metadata<K: Resource>(obj: &mut K) {
    obj.meta_mut().managed_fields = None;
    if let Some(annotations) = obj.meta_mut().annotations.as_mut() {
        annotations.remove(LAST_APPLIED);
    }
}

/// Logs watch failures (the watcher retries with backoff) and drops the events.
fn drive<S, T>(kind: String, events: S) -> impl Future<Output = ()> + Send + 'static
where
    S: Stream<Item = watcher::Result<T>> + Send + 'static,
{
    events.for_each(move |event| {
        if let Err(error) = event {
            tracing::warn!(%kind, error = %ErrorChain(&error), "watch failed, retrying");
        }
        std::future::ready(())
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::time::Duration;

    use k8s_openapi::api::core::v1::Pod;
    use kube::ResourceExt;

    use super::*;

    fn pod(name: &str, version: &str) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.name = Some(name.to_owned());
        pod.metadata.namespace = Some("ns".to_owned());
        pod.metadata.resource_version = Some(version.to_owned());
        pod
    }

    /// The (name, resourceVersion) of the next `n` objects of `stream`.
    async fn next_n(stream: &mut Changes<Pod>, n: usize) -> BTreeSet<(String, String)> {
        let mut seen = BTreeSet::new();
        for _ in 0..n {
            let next = tokio::time::timeout(Duration::from_secs(5), stream.next()).await;
            let object = next.expect("the stream stalled").expect("the stream ended");
            seen.insert((
                object.name_any(),
                object.resource_version().unwrap_or_default(),
            ));
        }
        seen
    }

    /// Whether `stream` yields nothing more for a moment.
    async fn quiet(stream: &mut Changes<Pod>) -> bool {
        tokio::time::timeout(Duration::from_millis(200), stream.next())
            .await
            .is_err()
    }

    fn named(pairs: &[(&str, &str)]) -> BTreeSet<(String, String)> {
        pairs
            .iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn events(
        list: Vec<watcher::Event<Pod>>,
    ) -> impl Stream<Item = watcher::Result<watcher::Event<Pod>>> + Send + 'static {
        futures::stream::iter(list.into_iter().map(Ok))
    }

    #[tokio::test]
    async fn a_change_of_an_object_deleted_before_the_controller_reads_it_stalls_nothing() {
        // Pod b changes and is deleted before the controller gets to the change (a restarted
        // pool pod before its StatefulSet recreated it): kube's ReflectHandle went deaf here.
        let (shared, events) = fan_out(events(vec![
            watcher::Event::Init,
            watcher::Event::InitApply(pod("a", "1")),
            watcher::Event::InitDone,
            watcher::Event::Apply(pod("b", "2")),
            watcher::Event::Delete(pod("b", "3")),
            watcher::Event::Apply(pod("c", "4")),
            watcher::Event::Apply(pod("a", "5")),
        ]));
        let mut owner = shared.changes_and_deletions();
        let mut own_kind = shared.changes();
        events.for_each(|_| std::future::ready(())).await;
        let all = [("a", "1"), ("b", "2"), ("b", "3"), ("c", "4"), ("a", "5")];
        assert_eq!(next_n(&mut owner, 5).await, named(&all));
        assert!(quiet(&mut owner).await);
        let applied = [("a", "1"), ("b", "2"), ("c", "4"), ("a", "5")];
        assert_eq!(next_n(&mut own_kind, 4).await, named(&applied));
        assert!(quiet(&mut own_kind).await, "no deletion for the own kind");
        assert_eq!(shared.store().state().len(), 2, "the cache holds a and c");

        // A controller subscribing later starts with what is cached.
        let mut late = shared.changes();
        assert_eq!(next_n(&mut late, 2).await, named(&[("a", "5"), ("c", "4")]));
        assert!(shared.listed().await);
    }

    #[tokio::test]
    async fn an_object_a_fresh_list_no_longer_shows_is_passed_on_as_deleted() {
        // The watch broke, b was deleted meanwhile, and the fresh list lacks it.
        let (shared, events) = fan_out(events(vec![
            watcher::Event::Init,
            watcher::Event::InitApply(pod("a", "1")),
            watcher::Event::InitApply(pod("b", "2")),
            watcher::Event::InitDone,
            watcher::Event::Init,
            watcher::Event::InitApply(pod("a", "1")),
            watcher::Event::InitDone,
        ]));
        let mut owner = shared.changes_and_deletions();
        events.for_each(|_| std::future::ready(())).await;
        let listed = [("a", "1"), ("b", "2")];
        assert_eq!(next_n(&mut owner, 2).await, named(&listed));
        assert_eq!(
            next_n(&mut owner, 2).await,
            named(&listed),
            "a again, b gone"
        );
        assert!(quiet(&mut owner).await);
        assert_eq!(shared.store().state().len(), 1);
    }

    #[tokio::test]
    async fn a_controller_that_falls_behind_gets_every_cached_object_instead() {
        let count = BUFFER + 100;
        let changes = (0..count).map(|i| watcher::Event::Apply(pod(&format!("p{i}"), "1")));
        let list = [watcher::Event::Init, watcher::Event::InitDone];
        let (shared, events) = fan_out(events(list.into_iter().chain(changes).collect()));
        let mut slow = shared.changes_and_deletions();
        events.for_each(|_| std::future::ready(())).await;
        let mut names = BTreeSet::new();
        while names.len() < count {
            let next = tokio::time::timeout(Duration::from_secs(5), slow.next()).await;
            let object = next.expect("the stream stalled").expect("the stream ended");
            names.insert(object.name_any());
        }
        assert_eq!(names.len(), count, "no change was lost");
    }

    #[test]
    fn managed_fields_and_the_last_applied_object_are_not_cached() {
        let mut cached = pod("a", "1");
        cached.metadata.managed_fields = Some(vec![Default::default()]);
        cached.metadata.annotations = Some(
            [
                (LAST_APPLIED.to_owned(), "{}".to_owned()),
                ("kept".to_owned(), "yes".to_owned()),
            ]
            .into(),
        );
        drop_unread_metadata(&mut cached);
        assert_eq!(cached.metadata.managed_fields, None);
        assert_eq!(
            cached.metadata.annotations,
            Some([("kept".to_owned(), "yes".to_owned())].into())
        );
        let mut bare = pod("b", "1");
        drop_unread_metadata(&mut bare);
        assert_eq!(
            bare,
            pod("b", "1"),
            "nothing added to an object without them"
        );
    }

    #[tokio::test]
    async fn a_watch_that_never_lists_is_not_reported_listed() {
        let (shared, events) = fan_out(events(vec![watcher::Event::Init]));
        events.for_each(|_| std::future::ready(())).await;
        assert!(
            !shared.listed().await,
            "the watch ended before its first list"
        );
    }
}
