//! What the four controllers share: one cached watch per kind (fed to every controller that
//! needs it), the context handed to reconcilers, error classification, per-object backoff,
//! reconcile metrics and Warning events for specs that cannot be realised.

use std::fmt::Debug;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{
    ConfigMap, ObjectReference, PersistentVolumeClaim, Pod, Secret, Service,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::core::DeserializeGuard;
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, ReflectHandle, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use multigres_api::labels::{COMPONENT, Component, MANAGED_SELECTOR};
use multigres_api::observability::InheritedEnv;
use multigres_api::v1alpha1::{CellTemplate, CoreTemplate, MultigresCluster, ShardTemplate};
use multigres_common::backoff::{BackoffPolicy, ObjectBackoff};
use multigres_common::state::HandlerState;
use multigres_common::status_pacer::StatusPacer;
use multigres_common::telemetry::ErrorChain;
use serde::de::DeserializeOwned;
use tokio::sync::broadcast;

use crate::workload_cache::WorkloadStore;

/// Name under which events are reported.
pub const REPORTER: &str = "multigres.com/resource-handler";

/// How many watch events a shared reflector buffers for a slow subscriber.
const SHARED_BUFFER: usize = 1024;

/// Whether an error needs a spec change (wait for one) or may pass (retry with backoff).
pub trait Classify: std::error::Error + Send + Sync + 'static {
    /// True when retrying cannot help until the spec changes.
    fn is_invalid_spec(&self) -> bool;
    /// A short, bounded label for metrics, e.g. `invalid_spec` or `kube_api`.
    fn category(&self) -> &'static str;
}

/// A cached, label-filtered watch of one kind, shared by several controllers.
pub struct Shared<K: Resource + Clone + 'static>
where
    K::DynamicType: Eq + Hash + Clone,
{
    /// The cache.
    pub store: Store<K>,
    /// Changed objects for the first subscriber; clone it for each further one. Every handle
    /// must be polled (a controller does), or the watch stalls once the buffer is full.
    pub handle: ReflectHandle<K>,
    /// Deleted objects, which kube's shared streams do not pass on.
    pub deletions: Deletions<K>,
}

/// Deleted objects of one shared watch, for every controller that must recreate what it owns.
#[derive(Clone)]
pub struct Deletions<K>(broadcast::Sender<Arc<K>>);

/// What wakes a controller for an owned kind: changes and deletions of its objects.
pub type Trigger<K> = BoxStream<'static, Arc<K>>;

/// `handle`'s changes merged with `deletions`, so a child someone deletes is recreated at once
/// instead of at the owner's next change. Deletions are rare; if a subscriber falls more than
/// the buffer behind, the missed ones are logged and the owners catch up on their next event.
pub fn triggers<K>(handle: ReflectHandle<K>, deletions: &Deletions<K>) -> Trigger<K>
where
    K: Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Default + Send + Sync,
{
    let deleted = futures::stream::unfold(deletions.0.subscribe(), |mut rx| async move {
        loop {
            match rx.recv().await {
                Ok(object) => return Some((object, rx)),
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    tracing::warn!(missed, "deletion notices dropped for a slow controller");
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    });
    futures::stream::select(handle, deleted).boxed()
}

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
            Scope::Namespace(namespace) => Api::namespaced(client.clone(), namespace),
        }
    }
}

/// Logs watch failures (the watcher retries with backoff) and drops the events.
fn drive<S, T>(kind: String, events: S) -> impl Future<Output = ()> + Send + 'static
where
    S: Stream<Item = Result<T, watcher::Error>> + Send + 'static,
{
    events.for_each(move |event| {
        if let Err(error) = event {
            tracing::warn!(%kind, error = %ErrorChain(&error), "watch failed, retrying");
        }
        std::future::ready(())
    })
}

/// Starts a shared watch of `K` over every namespace with `config`; the returned future keeps
/// it running and must be polled. Managed fields are dropped before caching: never read here,
/// and often larger than the object.
pub fn share<K>(
    client: &Client,
    scope: &Scope,
    config: watcher::Config,
) -> (Shared<K>, impl Future<Output = ()> + Send + 'static)
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + Debug
        + DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    share_trimmed(client, scope, config, |_| {})
}

/// Like [`share`], with `trim` also applied to every object before it is cached, to drop what
/// no reconciler reads of a kind cached in large numbers.
pub fn share_trimmed<K>(
    client: &Client,
    scope: &Scope,
    config: watcher::Config,
    trim: fn(&mut K),
) -> (Shared<K>, impl Future<Output = ()> + Send + 'static)
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + Debug
        + DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store_shared(SHARED_BUFFER);
    let handle = writer
        .subscribe()
        .expect("a shared store always accepts subscribers");
    let (deleted, _) = broadcast::channel(SHARED_BUFFER);
    let deletions = Deletions(deleted.clone());
    let events = multigres_common::watch::watcher(scope.api::<K>(client), config)
        .default_backoff()
        .modify(move |obj: &mut K| {
            obj.managed_fields_mut().clear();
            trim(obj);
        })
        .inspect(move |event| {
            if let Ok(watcher::Event::Delete(object)) = event {
                // No subscriber (a kind no controller owns) is not an error.
                let _ = deleted.send(Arc::new(object.clone()));
            }
        })
        .reflect_shared(writer);
    (
        Shared {
            store,
            handle,
            deletions,
        },
        drive(K::kind(&()).into_owned(), events),
    )
}

/// Objects this operator manages (every child carries the label).
pub fn managed() -> watcher::Config {
    watcher::Config::default().labels(MANAGED_SELECTOR)
}

/// Kinds reported as synced (HandlerInfo) once their caches are filled.
pub const WATCHED_KINDS: [&str; 15] = [
    "TopoServer",
    "Cell",
    "Shard",
    "MultigresCluster",
    "CoreTemplate",
    "CellTemplate",
    "ShardTemplate",
    "StatefulSet",
    "Deployment",
    "Service",
    "PodDisruptionBudget",
    "PersistentVolumeClaim",
    "Pod",
    "Secret",
    "ConfigMap",
];

/// The caches every reconciler reads children from.
#[derive(Clone)]
pub struct Stores {
    /// etcd and pool StatefulSets, without pod templates.
    pub statefulsets: WorkloadStore<StatefulSet>,
    /// multigateway, multiorch and multiadmin Deployments, without pod templates.
    pub deployments: WorkloadStore<Deployment>,
    /// Every Service this handler creates.
    pub services: Store<Service>,
    /// etcd and pool PodDisruptionBudgets.
    pub pdbs: Store<PodDisruptionBudget>,
    /// Data and backup volumes (for growth).
    pub pvcs: Store<PersistentVolumeClaim>,
    /// Pool pods only (what the ordered restarts need).
    pub pods: Store<Pod>,
    /// TLS Secrets this operator issued (labelled; users' Secrets are read directly).
    pub secrets: Store<Secret>,
    /// Rendered postgresql.conf ConfigMaps (labelled; referenced ones are read directly).
    pub config_maps: Store<ConfigMap>,
    /// Clusters (multiadmin, pull settings of etcd pods).
    pub clusters: Store<DeserializeGuard<MultigresCluster>>,
    /// Templates the resolver reads for multiadmin.
    pub core_templates: Store<DeserializeGuard<CoreTemplate>>,
    /// Templates the resolver reads for multiadmin.
    pub cell_templates: Store<DeserializeGuard<CellTemplate>>,
    /// Templates the resolver reads for multiadmin.
    pub shard_templates: Store<DeserializeGuard<ShardTemplate>>,
}

impl Stores {
    /// Waits until every cache holds its initial list.
    pub async fn wait_until_ready(&self) -> Result<(), reflector::store::WriterDropped> {
        filled(&self.statefulsets).await?;
        filled(&self.deployments).await?;
        filled(&self.services).await?;
        filled(&self.pdbs).await?;
        filled(&self.pvcs).await?;
        filled(&self.pods).await?;
        filled(&self.secrets).await?;
        filled(&self.config_maps).await?;
        filled(&self.clusters).await?;
        filled(&self.core_templates).await?;
        filled(&self.cell_templates).await?;
        filled(&self.shard_templates).await
    }
}

/// Waits until `store` holds its initial list.
pub async fn filled<K>(store: &Store<K>) -> Result<(), reflector::store::WriterDropped>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    store.wait_until_ready().await?;
    tracing::debug!(kind = %K::kind(&()), "cache filled");
    Ok(())
}

/// Pool pods: the only pods a reconciler looks at.
pub fn pool_pods() -> watcher::Config {
    watcher::Config::default().labels(&format!(
        "{MANAGED_SELECTOR},{COMPONENT}={}",
        Component::Pool.as_str()
    ))
}

/// Keeps of a pool pod what the reconcilers read (its metadata, status conditions and any
/// container stuck waiting, see [`crate::unready`]): the spec and the container statuses are
/// most of a pod's size, and every pool pod is cached.
pub fn slim_pod(pod: &mut Pod) {
    pod.spec = None;
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
}

impl Base {
    /// The context of controller `name`.
    pub fn ctx<K: Resource<DynamicType = ()>>(&self, name: &'static str) -> Arc<Ctx<K>> {
        Arc::new(Ctx {
            client: self.client.clone(),
            scope: self.scope.clone(),
            state: self.state.clone(),
            recorder: self.recorder.clone(),
            stores: self.stores.clone(),
            telemetry: self.telemetry.clone(),
            name,
            backoff: ObjectBackoff::new(BackoffPolicy::default()),
            pacer: StatusPacer::default(),
        })
    }
}

/// Everything a reconciler needs.
pub struct Ctx<K: Resource<DynamicType = ()>> {
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
    /// Name of the controller in metrics and HandlerInfo.
    pub name: &'static str,
    /// Consecutive failures per object.
    pub backoff: ObjectBackoff<ObjectRef<K>>,
    /// When each object's status was last written, to pace progress-only status writes.
    pub pacer: StatusPacer<String>,
}

impl<K: Resource<DynamicType = ()>> Ctx<K> {
    /// Publishes an event about `obj`; a failure to publish is logged, never fatal.
    pub async fn event(&self, obj: &K, type_: EventType, reason: &str, note: String) {
        self.event_about(obj, None, type_, reason, note).await;
    }

    /// Publishes an event about `obj` that concerns `related` too (e.g. the pod restarted);
    /// events with different related objects are kept apart rather than folded into one
    /// series.
    pub async fn event_about(
        &self,
        obj: &K,
        related: Option<ObjectReference>,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(note),
            action: "Reconcile".to_owned(),
            secondary: related,
        };
        crate::sync::count(self.name, "Event", "event");
        if let Err(error) = self.recorder.publish(&event, &obj.object_ref(&())).await {
            tracing::warn!(error = %ErrorChain(&error), "cannot publish an event");
        }
    }
}

/// The shared event recorder of this handler.
pub fn recorder(client: &Client) -> Recorder {
    Recorder::new(
        client.clone(),
        Reporter {
            controller: REPORTER.to_owned(),
            instance: std::env::var("POD_NAME").ok(),
        },
    )
}

/// Runs one reconcile of `obj`: records its outcome, resets the backoff on success, and
/// publishes a Warning event when the spec cannot be realised.
pub async fn observe<K, E, F>(ctx: &Ctx<K>, obj: &K, reconcile: F) -> Result<Action, E>
where
    K: Resource<DynamicType = ()> + Clone,
    E: Classify,
    F: Future<Output = Result<Action, E>>,
{
    let started = Instant::now();
    let result = reconcile.await;
    let elapsed = started.elapsed();
    match &result {
        Ok(_) => {
            ctx.backoff.reset(&ObjectRef::from_obj(obj));
            ctx.state.record_reconcile(ctx.name, Ok(()), elapsed);
        }
        Err(error) => {
            ctx.state
                .record_reconcile(ctx.name, Err(error.category()), elapsed);
            tracing::warn!(
                controller = ctx.name,
                name = %obj.name_any(),
                namespace = ?obj.namespace(),
                error = %ErrorChain(error),
                "reconcile failed"
            );
            if error.is_invalid_spec() {
                let note = ErrorChain(error).to_string();
                ctx.event(obj, EventType::Warning, "InvalidSpec", note)
                    .await;
            }
        }
    }
    result
}

/// Invalid specs wait for a change; anything else is retried with per-object backoff.
pub fn error_policy<K, E>(obj: Arc<K>, error: &E, ctx: Arc<Ctx<K>>) -> Action
where
    K: Resource<DynamicType = ()> + Clone,
    E: Classify,
{
    ctx.backoff
        .after_error(&ObjectRef::from_obj(&obj), error.is_invalid_spec())
}

/// How long to wait before looking again at something only polling can see progress of
/// (a restarted pod coming back).
pub const POLL: Duration = Duration::from_secs(5);

/// Drives a controller's result stream until it ends (on shutdown).
pub async fn drain<S, T, E>(name: &'static str, results: S)
where
    S: Stream<Item = Result<T, E>>,
    E: std::error::Error + 'static,
{
    results
        .for_each(|result| {
            if let Err(error) = result {
                tracing::debug!(controller = name, error = %ErrorChain(&error), "controller event");
            }
            std::future::ready(())
        })
        .await;
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::shard::rollout::pod_view;

    #[test]
    fn a_slimmed_pool_pod_reads_the_same_and_keeps_no_spec() {
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
            "spec": {"containers": [{"name": "postgres", "image": "postgres:17",
                "env": [{"name": "PGDATA", "value": "/data"}]}]},
            "status": {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": "postgres", "image": "postgres:17",
                    "imageID": "", "ready": true, "restartCount": 0}],
            },
        }))
        .unwrap();
        let before = pod_view(&pod, &BTreeMap::new());
        let metadata = pod.metadata.clone();
        slim_pod(&mut pod);
        assert_eq!(pod_view(&pod, &BTreeMap::new()), before);
        assert!(before.is_some_and(|view| view.ready));
        assert_eq!(pod.metadata, metadata);
        assert_eq!(pod.spec, None);
        let status = pod.status.unwrap();
        assert_eq!(status.container_statuses, None);
        assert_eq!(status.conditions.map(|c| c.len()), Some(1));
    }
}
