//! cluster-handler: turns a MultigresCluster (and its templates) into child custom resources
//! (TopoServer, Cell, TableGroup, Shard) and aggregates their status.
//!
//! Two controllers run in this binary: [`cluster`] (MultigresCluster → TopoServers, Cells,
//! TableGroups) and [`tablegroup`] (TableGroup → Shards). Both write with the field manager
//! `multigres-operator/cluster-handler`, forced, and only when the cached object differs from
//! what they would write.

pub mod children;
pub mod cluster;
#[cfg(test)]
mod fixtures;
pub mod gauges;
pub mod notice;
pub mod tablegroup;
pub mod watch;
pub mod writes;

use std::sync::Arc;
use std::time::Duration;

use kube::Resource;
use kube::runtime::controller::{Config, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use multigres_api::labels::MANAGED_SELECTOR;
use multigres_api::resolver::TemplateKind;
use multigres_api::v1alpha1::{
    Cell, CellTemplate, CoreTemplate, MultigresCluster, Shard, ShardTemplate, TableGroup,
    TopoServer,
};
use multigres_common::HandlerContext;
use multigres_common::controller::{self, Ctx, Kit};
use multigres_common::events::Recorder;
use multigres_common::shared_watch::Watches;
use multigres_common::status_pacer::{self, Budget, StatusPacer};
use multigres_common::watch::Scope;

use crate::watch::Guarded;
use crate::writes::Writer;

/// The binary's name, also its field manager suffix.
pub const NAME: &str = "cluster-handler";

/// Reconciles of different objects that may run at once, per controller.
const CONCURRENCY: u16 = 4;
/// Bursts of events for one object (e.g. a cluster's children being created) are folded into
/// one reconcile after this quiet period. Short, because a new cluster passes it on every hop
/// down (cluster, table group) and back up (table group and cluster status), and no write
/// depends on it: each write waits until the cache shows it, so a reconcile soon after never
/// re-sends it.
const DEBOUNCE: Duration = Duration::from_millis(50);
/// Progress-only status writes of both controllers together (one pacer): a token every 3 s,
/// 2 at most. A cluster's and a table group's statuses sum up the children's, whose own
/// statuses the other handlers write as they progress; news (a first status of an Available
/// object, a phase settling, a condition flipping) is written at once whatever the budget, so
/// what waits is a count or a message moving on. A converging cluster and its table group each
/// show progress every 5 to 10 s; many converging together take turns, and the
/// handler's writes stay within 1.2 per object written whatever their number
/// (docs/performance.md).
const PROGRESS_BUDGET: Budget = Budget {
    token_period: Duration::from_secs(3),
    burst: 2,
};

/// Runs both controllers over `scope` until `ctx.shutdown` fires, giving clusters `images`
/// as the operator's default image set. Reports SERVING once every cache has synced.
pub async fn run(ctx: HandlerContext, scope: Scope, images: cluster::images::ImageDefaults) {
    let client = ctx.client.clone();
    let everything = watcher::Config::default;
    let managed = || watcher::Config::default().labels(MANAGED_SELECTOR);

    let mut watches = Watches::new(client.clone(), scope, ctx.state.clone());
    let clusters = watches.share::<Guarded<MultigresCluster>>(everything());
    let core_templates = watches.share::<Guarded<CoreTemplate>>(everything());
    let cell_templates = watches.share::<Guarded<CellTemplate>>(everything());
    let shard_templates = watches.share::<Guarded<ShardTemplate>>(everything());
    let topo_servers = watches.share::<Guarded<TopoServer>>(managed());
    let cells = watches.share::<Guarded<Cell>>(managed());
    let table_groups = watches.share::<Guarded<TableGroup>>(managed());
    let shards = watches.share::<Guarded<Shard>>(managed());
    let mut running = watches.start();
    let caches = gauges::Caches {
        clusters: clusters.store(),
        cells: cells.store(),
        shards: shards.store(),
    };
    multigres_common::status_metrics::register(move |g| gauges::collect(g, &caches));

    let field_manager = multigres_common::apply::field_manager(NAME);
    let recorder = Recorder::for_pod(client.clone(), field_manager.clone());
    let pacer = Arc::new(StatusPacer::with_budget(
        status_pacer::MIN_INTERVAL,
        PROGRESS_BUDGET,
    ));
    let cluster_ctx = Ctx::new(
        Kit::new(cluster::CONTROLLER, &ctx.state, &recorder),
        cluster::Inputs {
            stores: cluster::Stores {
                clusters: clusters.store(),
                core_templates: core_templates.store(),
                cell_templates: cell_templates.store(),
                shard_templates: shard_templates.store(),
                topo_servers: topo_servers.store(),
                cells: cells.store(),
                table_groups: table_groups.store(),
            },
            writer: Writer::new(client.clone(), cluster::CONTROLLER, field_manager.clone()),
            pacer: pacer.clone(),
            images,
        },
    );
    let table_group_ctx = Ctx::new(
        Kit::new(tablegroup::CONTROLLER, &ctx.state, &recorder),
        tablegroup::Inputs {
            table_groups: table_groups.store(),
            shards: shards.store(),
            writer: Writer::new(client.clone(), tablegroup::CONTROLLER, field_manager),
            pacer,
        },
    );

    let config = Config::default()
        .concurrency(CONCURRENCY)
        .debounce(DEBOUNCE);
    let cluster_controller = Controller::for_shared_stream(clusters.changes(), clusters.store())
        .owns_shared_stream(topo_servers.changes_and_deletions())
        .owns_shared_stream(cells.changes_and_deletions())
        .owns_shared_stream(table_groups.changes_and_deletions())
        .watches_shared_stream(
            core_templates.changes_and_deletions(),
            users::<CoreTemplate>(&clusters.store(), TemplateKind::Core),
        )
        .watches_shared_stream(
            cell_templates.changes_and_deletions(),
            users::<CellTemplate>(&clusters.store(), TemplateKind::Cell),
        )
        .watches_shared_stream(
            shard_templates.changes_and_deletions(),
            users::<ShardTemplate>(&clusters.store(), TemplateKind::Shard),
        );
    let table_group_controller =
        Controller::for_shared_stream(table_groups.changes(), table_groups.store())
            .owns_shared_stream(shards.changes_and_deletions());
    let shutdown = &ctx.shutdown;
    futures::join!(
        controller::run(
            cluster_controller,
            config.clone(),
            shutdown,
            cluster::reconcile,
            cluster_ctx
        ),
        controller::run(
            table_group_controller,
            config,
            shutdown,
            tablegroup::reconcile,
            table_group_ctx
        ),
        running.ready_when_listed(shutdown)
    );
}

/// The mapper of a template watch: the clusters depending on the changed template.
fn users<T>(
    clusters: &Store<Guarded<MultigresCluster>>,
    kind: TemplateKind,
) -> impl Fn(Arc<Guarded<T>>) -> Vec<ObjectRef<Guarded<MultigresCluster>>> + Send + Sync + 'static
where
    T: Resource<DynamicType = ()> + Clone + 'static,
{
    let clusters = clusters.clone();
    move |template| cluster::clusters_using(&clusters, kind, &*template)
}
