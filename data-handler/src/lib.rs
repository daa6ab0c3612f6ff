//! The data handler: keeps the Multigres topology in etcd in line with the cluster's resources.
//!
//! Three controllers run in this binary, all writing with the field manager
//! `multigres-operator/data-handler`:
//! - [`cluster`]: registers each MultigresCluster's cells and databases, prunes, deregisters on
//!   delete, and reports `TopoServerReachable` / `TopologyRegistered` on the cluster;
//! - [`cell`]: reports the same conditions on each Cell from its record, and deregisters a cell
//!   that left its cluster;
//! - [`shard`]: publishes pool pod roles (primary / replica) read from the pooler records,
//!   delivers reload-class PostgreSQL configuration changes through the multipoolers
//!   ([`reload`]), answers switchover requests ([`switchover`]) and publishes how old the
//!   newest backup is ([`backup_health`]).
//!
//! The etcd side is in [`topo`] (records, store) and [`sync`] (ownership, register, prune); the
//! pure decisions in [`desired`], [`target`], [`conditions`], [`deletion`] and [`roles`].

pub mod backup_health;
pub mod cell;
pub mod cluster;
pub mod conditions;
pub mod deletion;
pub mod desired;
pub mod finalizer;
pub mod reload;
pub mod roles;
pub mod shard;
pub mod switchover;
pub mod sync;
pub mod target;
pub mod topo;
pub mod watch;
pub mod writes;

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::Resource;
use kube::runtime::controller::{self, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use multigres_api::labels::{self, Component, MANAGED_SELECTOR};
use multigres_api::v1alpha1::{
    Cell, CellTemplate, CoreTemplate, MultigresCluster, Shard, ShardTemplate, TopoServer,
};
use multigres_common::HandlerContext;
use multigres_common::backoff::{BackoffPolicy, ObjectBackoff};
use multigres_common::telemetry::ErrorChain;

use crate::target::Connections;
use crate::watch::{
    Guarded, Scope, labelled, pod_metadata_only, reflect, reflect_shared, reflect_trimmed,
};
use crate::writes::Writer;

/// The binary's name, also its field manager suffix.
pub const NAME: &str = "data-handler";

/// Reconciles of different objects that may run at once, per controller.
const CONCURRENCY: u16 = 4;
/// Bursts of events for one object are folded into one reconcile after this quiet period.
const DEBOUNCE: Duration = Duration::from_millis(200);

/// Periods and timeouts of the controllers, from the binary's flags.
#[derive(Debug, Clone)]
pub struct Settings {
    /// How often a healthy cluster's records and a cell's record are checked again: an etcd
    /// outage or an edit of the records makes no Kubernetes event.
    pub check_period: Duration,
    /// How long a deleted object's deregistration may keep failing before its finalizer is
    /// released anyway, with a Warning event.
    pub unreachable_timeout: Duration,
    /// How often pool pod roles are read from the topology.
    pub roles_period: Duration,
    /// Time allowed to connect to etcd.
    pub connect_timeout: Duration,
    /// Time allowed for each etcd request.
    pub request_timeout: Duration,
    /// Upper bound of the retry delay while the topology server is down, so registration
    /// resumes promptly once it is back.
    pub retry_max: Duration,
}

impl Settings {
    /// Exponential backoff from one second up to `retry_max`, ±20 % jitter.
    fn backoff<K: std::hash::Hash + Eq + Clone>(&self) -> ObjectBackoff<K> {
        ObjectBackoff::new(BackoffPolicy {
            base: Duration::from_secs(1),
            max: self.retry_max,
            jitter: 0.2,
        })
    }
}

/// Runs the three controllers over `scope` until `ctx.shutdown` fires. Reports SERVING once
/// every cache has synced.
pub async fn run(ctx: HandlerContext, scope: Scope, settings: Settings) {
    writes::describe();
    let client = ctx.client.clone();
    let everything = watcher::Config::default;
    let managed = || watcher::Config::default().labels(MANAGED_SELECTOR);
    let pool_pods = watcher::Config::default().labels(&format!(
        "{MANAGED_SELECTOR},{}={}",
        labels::COMPONENT,
        Component::Pool.as_str()
    ));

    let (clusters, [for_clusters, for_cells, for_shards], cluster_watch) =
        reflect_shared::<MultigresCluster, 3>(&client, &scope, everything());
    let (core_templates, core_events) = reflect::<CoreTemplate>(&client, &scope, everything());
    let (cell_templates, cell_template_events) =
        reflect::<CellTemplate>(&client, &scope, everything());
    let (shard_templates, shard_template_events) =
        reflect::<ShardTemplate>(&client, &scope, everything());
    let (topo_servers, topo_events) = reflect::<TopoServer>(&client, &scope, managed());
    let (cells, cell_events) = reflect::<Cell>(&client, &scope, managed());
    let (shards, shard_events) = reflect::<Shard>(&client, &scope, managed());
    let (pods, pod_events) = reflect_trimmed::<Pod>(&client, &scope, pool_pods, pod_metadata_only);
    // The shards' rendered postgresql.conf (the resource-handler labels it as a shard object).
    let shard_config_maps = watcher::Config::default().labels(&format!(
        "{MANAGED_SELECTOR},{}={}",
        labels::COMPONENT,
        Component::Shard.as_str()
    ));
    let (config_maps, config_map_events) = reflect::<ConfigMap>(&client, &scope, shard_config_maps);

    let field_manager = multigres_common::apply::field_manager(NAME);
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: field_manager.clone(),
            instance: std::env::var("POD_NAME").ok(),
        },
    );
    let connections = Arc::new(Connections::new(
        client.clone(),
        settings.connect_timeout,
        settings.request_timeout,
    ));
    let cluster_ctx = Arc::new(cluster::Context {
        templates: cluster::TemplateStores {
            core: core_templates.clone(),
            cell: cell_templates.clone(),
            shard: shard_templates.clone(),
        },
        topo_servers: topo_servers.clone(),
        connections: connections.clone(),
        writer: Writer::new(client.clone(), cluster::CONTROLLER, field_manager.clone()),
        recorder: recorder.clone(),
        state: ctx.state.clone(),
        backoff: settings.backoff(),
        pacer: Default::default(),
        settings: settings.clone(),
    });
    let cell_ctx = Arc::new(cell::Context {
        clusters: clusters.clone(),
        topo_servers: topo_servers.clone(),
        connections: connections.clone(),
        writer: Writer::new(client.clone(), cell::CONTROLLER, field_manager.clone()),
        recorder: recorder.clone(),
        state: ctx.state.clone(),
        backoff: settings.backoff(),
        pacer: Default::default(),
        settings: settings.clone(),
    });
    let shard_ctx = Arc::new(shard::Context {
        clusters: clusters.clone(),
        cells: cells.clone(),
        pods: pods.clone(),
        config_maps: config_maps.clone(),
        topo_servers: topo_servers.clone(),
        connections,
        writer: Writer::new(client.clone(), shard::CONTROLLER, field_manager),
        recorder,
        reload_waits: Default::default(),
        switchovers: Default::default(),
        backup_checks: Default::default(),
        state: ctx.state.clone(),
        backoff: settings.backoff(),
        settings,
    });

    let config = controller::Config::default()
        .concurrency(CONCURRENCY)
        .debounce(DEBOUNCE);
    let cluster_controller = Controller::for_shared_stream(for_clusters, clusters.clone())
        .owns_stream(topo_events.touched_objects())
        .watches_stream(core_events.touched_objects(), in_same_namespace(&clusters))
        .watches_stream(
            cell_template_events.touched_objects(),
            in_same_namespace(&clusters),
        )
        .watches_stream(
            shard_template_events.touched_objects(),
            in_same_namespace(&clusters),
        )
        .with_config(config.clone())
        .graceful_shutdown_on(ctx.shutdown.wait())
        .run(cluster::reconcile, cluster::error_policy, cluster_ctx)
        .for_each(|result| async move { log(cluster::CONTROLLER, result) });

    let cell_controller = Controller::for_stream(cell_events.applied_objects(), cells.clone())
        .watches_shared_stream(for_cells, children_of(&cells))
        .with_config(config.clone())
        .graceful_shutdown_on(ctx.shutdown.wait())
        .run(cell::reconcile, cell::error_policy, cell_ctx)
        .for_each(|result| async move { log(cell::CONTROLLER, result) });

    let shard_controller = Controller::for_stream(shard_events.applied_objects(), shards.clone())
        .watches_shared_stream(for_shards, children_of(&shards))
        .watches_stream(pod_events.touched_objects(), |pod: Guarded<Pod>| {
            pod.0.as_ref().ok().and_then(shard::shard_of)
        })
        .owns_stream(config_map_events.touched_objects())
        .with_config(config)
        .graceful_shutdown_on(ctx.shutdown.wait())
        .run(shard::reconcile, shard::error_policy, shard_ctx)
        .for_each(|result| async move { log(shard::CONTROLLER, result) });

    let readiness = async {
        synced(&ctx, &clusters).await;
        synced(&ctx, &core_templates).await;
        synced(&ctx, &cell_templates).await;
        synced(&ctx, &shard_templates).await;
        synced(&ctx, &topo_servers).await;
        synced(&ctx, &cells).await;
        synced(&ctx, &shards).await;
        synced(&ctx, &pods).await;
        synced(&ctx, &config_maps).await;
        ctx.state.set_ready(true).await;
        tracing::info!("caches synced; serving");
    };
    let readiness = async {
        tokio::select! {
            () = readiness => {}
            () = ctx.shutdown.wait() => {}
        }
    };
    // The cluster watch feeds the three controllers through their handles; drive it here
    // until shutdown (it never ends on its own).
    let cluster_watch = async {
        let watch = cluster_watch.for_each(|event| async move {
            if let Err(error) = event {
                tracing::warn!(error = %ErrorChain(&error), "MultigresCluster watch failed; retrying");
            }
        });
        tokio::select! {
            () = watch => {}
            () = ctx.shutdown.wait() => {}
        }
    };
    futures::join!(
        cluster_watch,
        cluster_controller,
        cell_controller,
        shard_controller,
        readiness
    );
}

async fn synced<K>(ctx: &HandlerContext, store: &Store<Guarded<K>>)
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    if store.wait_until_ready().await.is_ok() {
        ctx.state.mark_synced(K::kind(&()));
    }
}

/// Maps a change of a template to every cluster of its namespace (templates are few, and a
/// cluster that does not use the template re-registers nothing).
fn in_same_namespace<T>(
    clusters: &Store<Guarded<MultigresCluster>>,
) -> impl Fn(Guarded<T>) -> Vec<ObjectRef<Guarded<MultigresCluster>>> + Send + Sync + 'static
where
    T: Resource<DynamicType = ()> + Clone + 'static,
{
    let clusters = clusters.clone();
    move |template| {
        let namespace = template.meta().namespace.clone().unwrap_or_default();
        clusters
            .state()
            .iter()
            .filter(|c| c.meta().namespace.as_deref() == Some(namespace.as_str()))
            .map(|c| ObjectRef::from_obj(&**c))
            .collect()
    }
}

/// Maps a change of a cluster to its children of kind `K` (by the `multigres.com/cluster`
/// label), so they re-read the connection settings at once.
fn children_of<K>(
    store: &Store<Guarded<K>>,
) -> impl Fn(Arc<Guarded<MultigresCluster>>) -> Vec<ObjectRef<Guarded<K>>> + Send + Sync + 'static
where
    K: Resource<DynamicType = ()> + Clone + Debug + Send + Sync + 'static,
{
    let store = store.clone();
    move |cluster: Arc<Guarded<MultigresCluster>>| {
        let namespace = cluster.meta().namespace.clone().unwrap_or_default();
        let name = cluster.meta().name.clone().unwrap_or_default();
        labelled(&store, &namespace, labels::CLUSTER, &name)
    }
}

fn log<K, E>(
    controller: &'static str,
    result: Result<(ObjectRef<K>, controller::Action), controller::Error<E, watcher::Error>>,
) where
    K: Resource,
    E: std::error::Error + 'static,
{
    match result {
        Ok((object, action)) => tracing::debug!(controller, %object, ?action, "reconciled"),
        Err(controller::Error::ReconcilerFailed(error, object)) => {
            tracing::warn!(controller, %object, error = %ErrorChain(&error), "reconcile failed");
        }
        Err(controller::Error::ObjectNotFound(object)) => {
            tracing::debug!(controller, %object, "object gone before its reconcile");
        }
        Err(error) => tracing::warn!(controller, error = %ErrorChain(&error), "controller error"),
    }
}
