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
pub mod owner;
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
    Base, Stores, managed, pool_pods, recorder, slim_pod, slim_stateless_pod, stateless_pods,
};
use multigres_common::shared_watch::Watches;
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
    let all = watcher::Config::default;
    let mut watches = Watches::new(client.clone(), scope.clone(), handler.state.clone());
    let topo_servers = watches.share::<Guarded<TopoServer>>(all());
    let cells = watches.share::<Guarded<Cell>>(all());
    let shards = watches.share::<Guarded<Shard>>(all());
    let clusters = watches.share::<Guarded<MultigresCluster>>(all());
    let core_templates = watches.share::<Guarded<CoreTemplate>>(all());
    let cell_templates = watches.share::<Guarded<CellTemplate>>(all());
    let shard_templates = watches.share::<Guarded<ShardTemplate>>(all());
    let statefulsets = watches.share_trimmed::<StatefulSet>(managed(), slim);
    let deployments = watches.share_trimmed::<Deployment>(managed(), slim_deployment);
    let caches = gauges::Caches {
        statefulsets: statefulsets.store(),
        deployments: deployments.store(),
    };
    multigres_common::status_metrics::register(move |g| gauges::collect(g, &caches));
    let services = watches.share_trimmed::<Service>(managed(), slim);
    let pdbs = watches.share_trimmed::<PodDisruptionBudget>(managed(), slim_budget);
    let network_policies = watches.share::<NetworkPolicy>(managed());
    let pods = watches.share_trimmed::<Pod>(pool_pods(), slim_pod);
    let stateless = watches.share_trimmed::<Pod>(stateless_pods(), slim_stateless_pod);
    let pvcs = watches.share::<PersistentVolumeClaim>(managed());
    let secrets = watches.share::<Secret>(managed());
    let config_maps = watches.share_trimmed::<ConfigMap>(managed(), slim);
    // The Jobs a shard runs before its pool pods start (few, and gone an hour after they end).
    let jobs = watches.share::<Job>(managed());
    let mut running = watches.start();
    let stores = Stores {
        statefulsets: SlimStore::new(statefulsets.store()),
        deployments: SlimStore::new(deployments.store()),
        services: SlimStore::new(services.store()),
        pdbs: SlimStore::new(pdbs.store()),
        network_policies: network_policies.store(),
        pvcs: pvcs.store(),
        pods: pods.store(),
        stateless_pods: stateless.store(),
        secrets: secrets.store(),
        config_maps: SlimStore::new(config_maps.store()),
        jobs: jobs.store(),
        clusters: clusters.store(),
        core_templates: core_templates.store(),
        cell_templates: cell_templates.store(),
        shard_templates: shard_templates.store(),
        cordoned: cordon::Cordoned::default(),
    };
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
    let topo = toposerver::run(
        base.ctx(toposerver::NAME),
        topo_servers,
        toposerver::Triggers {
            statefulsets: statefulsets.changes_and_deletions(),
            services: services.changes_and_deletions(),
            pdbs: pdbs.changes_and_deletions(),
            clusters: clusters.changes(),
        },
        shutdown,
    );
    let cells = cell::run(
        base.ctx(cell::NAME),
        cells,
        cell::Triggers {
            deployments: deployments.changes_and_deletions(),
            services: services.changes_and_deletions(),
            pdbs: pdbs.changes_and_deletions(),
            secrets: secrets.changes_and_deletions(),
            cordons: cells_drained,
        },
        shutdown,
    );
    let shards = shard::run(
        base.ctx(shard::NAME),
        shards,
        shard::Triggers {
            statefulsets: statefulsets.changes_and_deletions(),
            deployments: deployments.changes_and_deletions(),
            services: services.changes_and_deletions(),
            pdbs: pdbs.changes_and_deletions(),
            pods: pods.changes_and_deletions(),
            config_maps: config_maps.changes_and_deletions(),
            secrets: secrets.changes_and_deletions(),
            pvcs: pvcs.changes_and_deletions(),
            jobs: jobs.changes_and_deletions(),
            cordons: shards_drained,
        },
        shutdown,
    );
    let admin = multiadmin::run(
        base.ctx(multiadmin::NAME),
        multiadmin::Triggers {
            clusters: clusters.changes(),
            deployments: deployments.changes_and_deletions(),
            services: services.changes_and_deletions(),
            secrets: secrets.changes_and_deletions(),
            network_policies: network_policies.changes_and_deletions(),
            core_templates: core_templates.changes(),
            cell_templates: cell_templates.changes(),
            shard_templates: shard_templates.changes(),
        },
        shutdown,
    );
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
