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

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::Resource;
use kube::runtime::controller::{self, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use multigres_api::labels::{self, Component, MANAGED_SELECTOR};
use multigres_api::v1alpha1::{
    Cell, CellTemplate, CoreTemplate, MultigresCluster, Shard, ShardTemplate, TopoServer,
};
use multigres_common::HandlerContext;
use multigres_common::backoff::{BackoffPolicy, ObjectBackoff};
use multigres_common::controller::{drive, error_policy};
use multigres_common::shared_watch::Watches;
use multigres_common::watch::Scope;

use crate::target::Connections;
use crate::watch::{Guarded, labelled, pod_metadata_only};
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
    let client = ctx.client.clone();
    let everything = watcher::Config::default;
    let managed = || watcher::Config::default().labels(MANAGED_SELECTOR);
    let pool_pods = watcher::Config::default().labels(&format!(
        "{MANAGED_SELECTOR},{}={}",
        labels::COMPONENT,
        Component::Pool.as_str()
    ));

    let mut watches = Watches::new(client.clone(), scope, ctx.state.clone());
    let clusters = watches.share::<Guarded<MultigresCluster>>(everything());
    let core_templates = watches.share::<Guarded<CoreTemplate>>(everything());
    let cell_templates = watches.share::<Guarded<CellTemplate>>(everything());
    let shard_templates = watches.share::<Guarded<ShardTemplate>>(everything());
    let topo_servers = watches.share::<Guarded<TopoServer>>(managed());
    let cells = watches.share::<Guarded<Cell>>(managed());
    let shards = watches.share::<Guarded<Shard>>(managed());
    let pods = watches.share_trimmed::<Guarded<Pod>>(pool_pods, pod_metadata_only);
    // The shards' rendered postgresql.conf (the resource-handler labels it as a shard object).
    let shard_config_maps = watcher::Config::default().labels(&format!(
        "{MANAGED_SELECTOR},{}={}",
        labels::COMPONENT,
        Component::Shard.as_str()
    ));
    let config_maps = watches.share::<Guarded<ConfigMap>>(shard_config_maps);
    let mut running = watches.start();

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
            core: core_templates.store(),
            cell: cell_templates.store(),
            shard: shard_templates.store(),
        },
        topo_servers: topo_servers.store(),
        connections: connections.clone(),
        writer: Writer::new(client.clone(), cluster::CONTROLLER, field_manager.clone()),
        recorder: recorder.clone(),
        state: ctx.state.clone(),
        backoff: settings.backoff(),
        pacer: Default::default(),
        settings: settings.clone(),
    });
    let cell_ctx = Arc::new(cell::Context {
        clusters: clusters.store(),
        topo_servers: topo_servers.store(),
        connections: connections.clone(),
        writer: Writer::new(client.clone(), cell::CONTROLLER, field_manager.clone()),
        recorder: recorder.clone(),
        state: ctx.state.clone(),
        backoff: settings.backoff(),
        pacer: Default::default(),
        settings: settings.clone(),
    });
    let shard_ctx = Arc::new(shard::Context {
        clusters: clusters.store(),
        cells: cells.store(),
        pods: pods.store(),
        config_maps: config_maps.store(),
        topo_servers: topo_servers.store(),
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
    let cluster_controller = Controller::for_shared_stream(clusters.changes(), clusters.store())
        .owns_shared_stream(topo_servers.changes_and_deletions())
        .watches_shared_stream(
            core_templates.changes_and_deletions(),
            in_same_namespace(&clusters.store()),
        )
        .watches_shared_stream(
            cell_templates.changes_and_deletions(),
            in_same_namespace(&clusters.store()),
        )
        .watches_shared_stream(
            shard_templates.changes_and_deletions(),
            in_same_namespace(&clusters.store()),
        )
        .with_config(config.clone())
        .graceful_shutdown_on(ctx.shutdown.wait())
        .run(cluster::reconcile, error_policy, cluster_ctx);

    let cell_controller = Controller::for_shared_stream(cells.changes(), cells.store())
        .watches_shared_stream(clusters.changes(), children_of(&cells.store()))
        .with_config(config.clone())
        .graceful_shutdown_on(ctx.shutdown.wait())
        .run(cell::reconcile, error_policy, cell_ctx);

    let shard_controller = Controller::for_shared_stream(shards.changes(), shards.store())
        .watches_shared_stream(clusters.changes(), children_of(&shards.store()))
        .watches_shared_stream(pods.changes_and_deletions(), |pod: Arc<Guarded<Pod>>| {
            pod.0.as_ref().ok().and_then(shard::shard_of)
        })
        .owns_shared_stream(config_maps.changes_and_deletions())
        .with_config(config)
        .graceful_shutdown_on(ctx.shutdown.wait())
        .run(shard::reconcile, error_policy, shard_ctx);

    let readiness = running.ready_when_listed(&ctx.shutdown);
    futures::join!(
        drive(cluster::CONTROLLER, cluster_controller),
        drive(cell::CONTROLLER, cell_controller),
        drive(shard::CONTROLLER, shard_controller),
        readiness
    );
}

/// Maps a change of a template to every cluster of its namespace (templates are few, and a
/// cluster that does not use the template re-registers nothing).
fn in_same_namespace<T>(
    clusters: &Store<Guarded<MultigresCluster>>,
) -> impl Fn(Arc<Guarded<T>>) -> Vec<ObjectRef<Guarded<MultigresCluster>>> + Send + Sync + 'static
where
    T: Resource<DynamicType = ()> + Clone + 'static,
{
    let clusters = clusters.clone();
    move |template: Arc<Guarded<T>>| {
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
