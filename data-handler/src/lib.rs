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
pub mod backup_request;
pub mod backup_runs;
pub mod backup_schedule;
pub mod cell;
pub mod cluster;
pub mod conditions;
pub mod deletion;
pub mod desired;
pub mod dial;
pub mod finalizer;
pub mod postgres_roles;
pub mod recoverable_window;
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
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod};
use kube::runtime::controller::{Config, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use multigres_api::labels::{self, Component, MANAGED_SELECTOR};
use multigres_api::v1alpha1::{
    Cell, CellTemplate, CoreTemplate, MultigresCluster, Shard, ShardTemplate, TopoServer,
};
use multigres_common::HandlerContext;
use multigres_common::backoff::BackoffPolicy;
use multigres_common::controller::{self, Ctx, Kit};
use multigres_common::events::Recorder;
use multigres_common::shared_watch::{SharedWatch, Watches};
use multigres_common::shutdown::Shutdown;
use multigres_common::state::HandlerState;
use multigres_common::templates::TemplateStores;
use multigres_common::watch::Scope;

use crate::target::Connections;
use crate::watch::{Guarded, claim_capacity_only, labelled, pod_metadata_only};
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
    fn backoff(&self) -> BackoffPolicy {
        BackoffPolicy {
            base: Duration::from_secs(1),
            max: self.retry_max,
            jitter: 0.2,
        }
    }
}

/// Runs the three controllers over `scope` until `ctx.shutdown` fires. Reports SERVING once
/// every cache has synced.
pub async fn run(ctx: HandlerContext, scope: Scope, settings: Settings) {
    let mut watches = Watches::new(ctx.client.clone(), scope, ctx.state.clone());
    let shared = Shared::on(&mut watches);
    let mut running = watches.start();
    let base = Base::new(&ctx, settings);
    let clusters = cluster_controller(&shared, &base);
    let cells = cell_controller(&shared, &base);
    let shards = shard_controller(&shared, &base);
    futures::join!(
        clusters,
        cells,
        shards,
        running.ready_when_listed(&ctx.shutdown)
    );
}

/// The shared watches the controllers read, one per kind.
struct Shared {
    clusters: SharedWatch<Guarded<MultigresCluster>>,
    core_templates: SharedWatch<Guarded<CoreTemplate>>,
    cell_templates: SharedWatch<Guarded<CellTemplate>>,
    shard_templates: SharedWatch<Guarded<ShardTemplate>>,
    topo_servers: SharedWatch<Guarded<TopoServer>>,
    cells: SharedWatch<Guarded<Cell>>,
    shards: SharedWatch<Guarded<Shard>>,
    /// Pool pods, metadata only.
    pods: SharedWatch<Guarded<Pod>>,
    /// The shards' rendered postgresql.conf (the resource-handler labels it as a shard object).
    config_maps: SharedWatch<Guarded<ConfigMap>>,
    /// Pool pods' data claims, metadata and status only (their capacity).
    claims: SharedWatch<Guarded<PersistentVolumeClaim>>,
}

impl Shared {
    /// Shares a watch of each kind on `watches`: every MultigresCluster and template, only the
    /// operator's objects of the other kinds.
    fn on(watches: &mut Watches) -> Self {
        let everything = watcher::Config::default;
        let managed = || watcher::Config::default().labels(MANAGED_SELECTOR);
        let component = |component: Component| {
            watcher::Config::default().labels(&format!(
                "{MANAGED_SELECTOR},{}={}",
                labels::COMPONENT,
                component.as_str()
            ))
        };
        Self {
            clusters: watches.share(everything()),
            core_templates: watches.share(everything()),
            cell_templates: watches.share(everything()),
            shard_templates: watches.share(everything()),
            topo_servers: watches.share(managed()),
            cells: watches.share(managed()),
            shards: watches.share(managed()),
            pods: watches.share_trimmed(component(Component::Pool), pod_metadata_only),
            config_maps: watches.share(component(Component::Shard)),
            claims: watches.share_trimmed(component(Component::Pool), claim_capacity_only),
        }
    }
}

/// What the controllers' contexts are made from, and how every controller runs.
struct Base {
    client: Client,
    /// This binary's field manager, also the controller name of its events.
    field_manager: String,
    recorder: Recorder,
    /// Open topology connections, shared by the controllers.
    connections: Arc<Connections>,
    state: HandlerState,
    settings: Settings,
    shutdown: Shutdown,
}

impl Base {
    /// The parts of `ctx` the controllers use, and what they share.
    fn new(ctx: &HandlerContext, settings: Settings) -> Self {
        let field_manager = multigres_common::apply::field_manager(NAME);
        let recorder = Recorder::for_pod(ctx.client.clone(), field_manager.clone());
        let connections = Arc::new(Connections::new(
            ctx.client.clone(),
            settings.connect_timeout,
            settings.request_timeout,
        ));
        Self {
            client: ctx.client.clone(),
            field_manager,
            recorder,
            connections,
            state: ctx.state.clone(),
            settings,
            shutdown: ctx.shutdown.clone(),
        }
    }

    /// The kit of `controller`.
    fn kit<K: Resource<DynamicType = ()>>(&self, controller: &'static str) -> Kit<K> {
        Kit::new(controller, &self.state, &self.recorder).with_backoff(self.settings.backoff())
    }

    /// The write path of `controller`.
    fn writer(&self, controller: &'static str) -> Writer {
        Writer::new(self.client.clone(), controller, self.field_manager.clone())
    }

    /// Every controller's concurrency and debounce.
    fn config(&self) -> Config {
        Config::default()
            .concurrency(CONCURRENCY)
            .debounce(DEBOUNCE)
    }
}

/// The MultigresCluster controller ([`cluster`]), woken by its clusters, their TopoServers,
/// the templates of their namespace, and their Shards when the roll-up of the backup request
/// moves.
fn cluster_controller(watches: &Shared, base: &Base) -> impl Future<Output = ()> {
    let context = Ctx::new(
        base.kit(cluster::CONTROLLER),
        cluster::Inputs {
            templates: TemplateStores {
                core: watches.core_templates.store(),
                cell: watches.cell_templates.store(),
                shard: watches.shard_templates.store(),
            },
            topo_servers: watches.topo_servers.store(),
            shards: watches.shards.store(),
            connections: base.connections.clone(),
            writer: base.writer(cluster::CONTROLLER),
            pacer: Default::default(),
            settings: base.settings.clone(),
        },
    );
    let clusters = &watches.clusters;
    let controller = Controller::for_shared_stream(clusters.changes(), clusters.store())
        .owns_shared_stream(watches.topo_servers.changes_and_deletions())
        .watches_shared_stream(
            watches.core_templates.changes_and_deletions(),
            in_same_namespace(&clusters.store()),
        )
        .watches_shared_stream(
            watches.cell_templates.changes_and_deletions(),
            in_same_namespace(&clusters.store()),
        )
        .watches_shared_stream(
            watches.shard_templates.changes_and_deletions(),
            in_same_namespace(&clusters.store()),
        )
        .watches_shared_stream(
            watches.shards.changes_and_deletions(),
            backup_request_moved(&clusters.store(), &watches.shards.store()),
        );
    controller::run(
        controller,
        base.config(),
        &base.shutdown,
        cluster::reconcile,
        context,
    )
}

/// The Cell controller ([`cell`]), woken by its cells and their clusters.
fn cell_controller(watches: &Shared, base: &Base) -> impl Future<Output = ()> {
    let context = Ctx::new(
        base.kit(cell::CONTROLLER),
        cell::Inputs {
            clusters: watches.clusters.store(),
            topo_servers: watches.topo_servers.store(),
            connections: base.connections.clone(),
            writer: base.writer(cell::CONTROLLER),
            pacer: Default::default(),
            settings: base.settings.clone(),
        },
    );
    let cells = &watches.cells;
    let controller = Controller::for_shared_stream(cells.changes(), cells.store())
        .watches_shared_stream(watches.clusters.changes(), children_of(&cells.store()));
    controller::run(
        controller,
        base.config(),
        &base.shutdown,
        cell::reconcile,
        context,
    )
}

/// The Shard roles controller ([`shard`]), woken by its shards, their clusters, their pool
/// pods and their rendered postgresql.conf.
fn shard_controller(watches: &Shared, base: &Base) -> impl Future<Output = ()> {
    let context = Ctx::new(
        base.kit(shard::CONTROLLER),
        shard::Inputs {
            clusters: watches.clusters.store(),
            cells: watches.cells.store(),
            pods: watches.pods.store(),
            config_maps: watches.config_maps.store(),
            claims: watches.claims.store(),
            volume_pacer: Default::default(),
            topo_servers: watches.topo_servers.store(),
            connections: base.connections.clone(),
            credentials: dial::Credentials::new(base.client.clone()),
            writer: base.writer(shard::CONTROLLER),
            reload_waits: Default::default(),
            switchovers: Default::default(),
            backup_checks: Default::default(),
            backup_runs: Default::default(),
            role_checks: Default::default(),
            passwords: postgres_roles::Passwords::new(base.client.clone()),
            settings: base.settings.clone(),
        },
    );
    let shards = &watches.shards;
    let published = shards.store();
    multigres_common::status_metrics::register(move |g| {
        shard::consensus::collect(g, &published);
        backup_health::collect(g, &published);
        shard::collect(g, &published);
    });
    let controller = Controller::for_shared_stream(shards.changes(), shards.store())
        .watches_shared_stream(watches.clusters.changes(), children_of(&shards.store()))
        .watches_shared_stream(
            watches.pods.changes_and_deletions(),
            |pod: Arc<Guarded<Pod>>| pod.0.as_ref().ok().and_then(shard::shard_of),
        )
        .owns_shared_stream(watches.config_maps.changes_and_deletions());
    controller::run(
        controller,
        base.config(),
        &base.shutdown,
        shard::reconcile,
        context,
    )
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

/// Maps a change of a Shard to its cluster when the cluster's `status.backupRequest` no longer
/// matches its Shards: Shard statuses change often (roles, cohort, backups), and each cluster
/// reconcile also checks its topology records, so only a change the roll-up shows wakes it.
fn backup_request_moved(
    clusters: &Store<Guarded<MultigresCluster>>,
    shards: &Store<Guarded<Shard>>,
) -> impl Fn(Arc<Guarded<Shard>>) -> Option<ObjectRef<Guarded<MultigresCluster>>> + Send + Sync + 'static
{
    let (clusters, shards) = (clusters.clone(), shards.clone());
    move |shard: Arc<Guarded<Shard>>| {
        let namespace = shard.meta().namespace.clone()?;
        let name = shard.meta().labels.as_ref()?.get(labels::CLUSTER)?.clone();
        let key = ObjectRef::new(&name).within(&namespace);
        let cached = clusters.get(&key)?;
        let owner = cached.0.as_ref().ok()?;
        let stored = owner
            .status
            .as_ref()
            .and_then(|s| s.backup_request.as_ref());
        // The Shard as changed, whether or not the cache holds it yet (a deleted one is left
        // out at the cluster's next reconcile).
        let mut of_cluster = cluster::shards_of(&shards, owner);
        of_cluster.retain(|s| s.meta().name != shard.meta().name);
        of_cluster.extend(shard.0.as_ref().ok().cloned());
        of_cluster.sort_by_key(ResourceExt::name_any);
        let now = cluster::status::backup_request(owner, &of_cluster);
        (now.as_ref() != stored).then(|| ObjectRef::from_obj(&*cached))
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
