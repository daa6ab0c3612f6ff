//! The resource-handler: turns TopoServer, Cell, Shard and each MultigresCluster's multiadmin,
//! multiadmin-web and (externally exposable) cluster-wide gateway Service into Kubernetes
//! workloads that run Multigres as Multigres expects (etcd StatefulSets,
//! multigateway and multiorch Deployments, PostgreSQL pool StatefulSets, Services,
//! PodDisruptionBudgets and each cluster's NetworkPolicies), generates the TLS material and the
//! Secrets of the PostgreSQL roles whose passwords the operator makes ([`role_secrets`]),
//! restarts pool pods in a safe order, grows volumes, and reports readiness on the custom
//! resources' status.

pub mod cell;
pub mod conditions;
pub mod contract;
pub mod controller;
pub mod cordon;
pub mod env;
pub mod exporter;
pub mod gauges;
pub mod multiadmin;
pub mod names;
pub mod netpol;
pub mod podspec;
pub mod readiness;
pub mod role_secrets;
pub mod shard;
pub mod slim_cache;
pub mod stateless;
pub mod storage;
pub mod sync;
pub mod tls;
pub mod toposerver;
pub mod unready;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::runtime::watcher;
use multigres_api::observability::InheritedEnv;
use multigres_api::v1alpha1::{
    Cell, CellTemplate, CoreTemplate, MultigresCluster, Shard, ShardTemplate, TopoServer,
};
use multigres_common::HandlerContext;
use multigres_common::guard::Guarded;

use controller::{
    Base, Stores, managed, other_pods, pool_pods, recorder, slim_other_pod, slim_pod,
};
use futures::channel::mpsc::UnboundedReceiver;
use multigres_common::shared_watch::{SharedWatch, Watches};
use multigres_common::templates::TemplateStores;
use multigres_common::watch::Scope;
use slim_cache::{SlimStore, slim, slim_budget, slim_deployment};

/// Fills every cache, reports SERVING, then runs every controller until shutdown.
/// `operator_namespace` is the namespace the handlers run in, which the clusters'
/// NetworkPolicies admit to the internal ports; `unrecoverable_timeout` is how long a pool pod's
/// PostgreSQL may keep failing before its multipooler quarantines it and the pod is replaced.
///
/// As in every handler, no reconcile runs before every cache is filled
/// ([`multigres_common::controller::reconcile`]), so none reads a cache that is still filling.
pub async fn run(
    handler: HandlerContext,
    scope: Scope,
    telemetry: InheritedEnv,
    operator_namespace: String,
    unrecoverable_timeout: std::time::Duration,
) {
    let client = handler.client.clone();
    let mut watches = Watches::new(client.clone(), scope.clone(), handler.state.clone());
    let shared = Shared::on(&mut watches);
    let mut running = watches.start();
    let stores = shared.stores();
    let shutdown = &handler.shutdown;
    let (shard_drains, shards_drained) = futures::channel::mpsc::unbounded();
    let (cell_drains, cells_drained) = futures::channel::mpsc::unbounded();
    let cordons = cordon::watch(
        client.clone(),
        stores.cordoned.clone(),
        vec![shard_drains, cell_drains],
        shutdown.clone(),
    );
    let base = Base {
        client: client.clone(),
        scope,
        state: handler.state.clone(),
        recorder: recorder(&client),
        stores,
        telemetry,
        operator_namespace,
        unrecoverable_timeout,
        kubernetes: Default::default(),
    };
    let topo_triggers = shared.toposerver_triggers();
    let cells_triggers = shared.cell_triggers(cells_drained);
    let shards_triggers = shared.shard_triggers(shards_drained);
    let admin_triggers = shared.multiadmin_triggers();
    let topo = toposerver::run(
        base.ctx(toposerver::NAME),
        shared.topo_servers,
        topo_triggers,
        shutdown,
    );
    let cells = cell::run(base.ctx(cell::NAME), shared.cells, cells_triggers, shutdown);
    let shards = shard::run(
        base.ctx(shard::NAME),
        shared.shards,
        shards_triggers,
        shutdown,
    );
    let admin = multiadmin::run(base.ctx(multiadmin::NAME), admin_triggers, shutdown);
    // One task each: the runtime polls each controller on its own, so one with many reconciles
    // in flight does not hold back the others' streams.
    let controllers = [
        tokio::spawn(cordons),
        tokio::spawn(topo),
        tokio::spawn(cells),
        tokio::spawn(shards),
        tokio::spawn(admin),
    ];
    let supervised = async {
        for controller in controllers {
            if let Err(error) = controller.await {
                tracing::error!(%error, "a controller task failed");
            }
        }
    };
    futures::join!(supervised, running.ready_when_listed(shutdown));
    drop(running);
}

/// The shared watches of the resource-handler, one per kind (two for pods: pool pods, and
/// etcd, multigateway and multiorch pods).
struct Shared {
    topo_servers: SharedWatch<Guarded<TopoServer>>,
    cells: SharedWatch<Guarded<Cell>>,
    shards: SharedWatch<Guarded<Shard>>,
    clusters: SharedWatch<Guarded<MultigresCluster>>,
    core_templates: SharedWatch<Guarded<CoreTemplate>>,
    cell_templates: SharedWatch<Guarded<CellTemplate>>,
    shard_templates: SharedWatch<Guarded<ShardTemplate>>,
    statefulsets: SharedWatch<StatefulSet>,
    deployments: SharedWatch<Deployment>,
    services: SharedWatch<Service>,
    pdbs: SharedWatch<PodDisruptionBudget>,
    network_policies: SharedWatch<NetworkPolicy>,
    pods: SharedWatch<Pod>,
    other_pods: SharedWatch<Pod>,
    pvcs: SharedWatch<PersistentVolumeClaim>,
    secrets: SharedWatch<Secret>,
    config_maps: SharedWatch<ConfigMap>,
    /// The Jobs a shard runs before its pool pods start (few, and gone an hour after they end).
    jobs: SharedWatch<Job>,
}

impl Shared {
    /// Registers every watch with `watches`: the operator's children by its label, slimmed
    /// where they are many and large.
    fn on(watches: &mut Watches) -> Self {
        let all = watcher::Config::default;
        let shared = Self {
            topo_servers: watches.share(all()),
            cells: watches.share(all()),
            shards: watches.share(all()),
            clusters: watches.share(all()),
            core_templates: watches.share(all()),
            cell_templates: watches.share(all()),
            shard_templates: watches.share(all()),
            statefulsets: watches.share_trimmed(managed(), slim),
            deployments: watches.share_trimmed(managed(), slim_deployment),
            services: watches.share_trimmed(managed(), slim),
            pdbs: watches.share_trimmed(managed(), slim_budget),
            network_policies: watches.share_trimmed(managed(), slim),
            pods: watches.share_trimmed(pool_pods(), slim_pod),
            other_pods: watches.share_trimmed(other_pods(), slim_other_pod),
            pvcs: watches.share(managed()),
            secrets: watches.share(managed()),
            config_maps: watches.share_trimmed(managed(), slim),
            jobs: watches.share(managed()),
        };
        let caches = gauges::Caches {
            statefulsets: shared.statefulsets.store(),
            deployments: shared.deployments.store(),
        };
        multigres_common::status_metrics::register(move |g| gauges::collect(g, &caches));
        shared
    }

    /// The caches every reconciler reads.
    fn stores(&self) -> Stores {
        Stores {
            statefulsets: SlimStore::new(self.statefulsets.store()),
            deployments: SlimStore::new(self.deployments.store()),
            services: SlimStore::new(self.services.store()),
            pdbs: SlimStore::new(self.pdbs.store()),
            network_policies: SlimStore::new(self.network_policies.store()),
            pvcs: self.pvcs.store(),
            pods: self.pods.store(),
            other_pods: self.other_pods.store(),
            secrets: self.secrets.store(),
            config_maps: SlimStore::new(self.config_maps.store()),
            jobs: self.jobs.store(),
            clusters: self.clusters.store(),
            templates: TemplateStores {
                core: self.core_templates.store(),
                cell: self.cell_templates.store(),
                shard: self.shard_templates.store(),
            },
            cordoned: cordon::Cordoned::default(),
        }
    }

    /// What wakes a TopoServer besides its own changes.
    fn toposerver_triggers(&self) -> toposerver::Triggers {
        toposerver::Triggers {
            statefulsets: self.statefulsets.changes_and_deletions(),
            services: self.services.changes_and_deletions(),
            pdbs: self.pdbs.changes_and_deletions(),
            clusters: self.clusters.changes(),
        }
    }

    /// What wakes a Cell besides its own changes; `cordons` tells of a drain.
    fn cell_triggers(&self, cordons: UnboundedReceiver<()>) -> cell::Triggers {
        cell::Triggers {
            deployments: self.deployments.changes_and_deletions(),
            services: self.services.changes_and_deletions(),
            pdbs: self.pdbs.changes_and_deletions(),
            secrets: self.secrets.changes_and_deletions(),
            cordons,
        }
    }

    /// What wakes a Shard besides its own changes; `cordons` tells of a drain.
    fn shard_triggers(&self, cordons: UnboundedReceiver<()>) -> shard::Triggers {
        shard::Triggers {
            statefulsets: self.statefulsets.changes_and_deletions(),
            deployments: self.deployments.changes_and_deletions(),
            services: self.services.changes_and_deletions(),
            pdbs: self.pdbs.changes_and_deletions(),
            pods: self.pods.changes_and_deletions(),
            config_maps: self.config_maps.changes_and_deletions(),
            secrets: self.secrets.changes_and_deletions(),
            pvcs: self.pvcs.changes_and_deletions(),
            jobs: self.jobs.changes_and_deletions(),
            cordons,
        }
    }

    /// What wakes a cluster's multiadmin.
    fn multiadmin_triggers(&self) -> multiadmin::Triggers {
        multiadmin::Triggers {
            clusters: self.clusters.changes(),
            deployments: self.deployments.changes_and_deletions(),
            services: self.services.changes_and_deletions(),
            secrets: self.secrets.changes_and_deletions(),
            network_policies: self.network_policies.changes_and_deletions(),
            core_templates: self.core_templates.changes(),
            cell_templates: self.cell_templates.changes(),
            shard_templates: self.shard_templates.changes(),
        }
    }
}
