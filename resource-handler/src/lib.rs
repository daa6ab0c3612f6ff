//! The resource-handler: turns TopoServer, Cell, Shard and each MultigresCluster's multiadmin,
//! multiadmin-web and (externally exposable) cluster-wide gateway Service into Kubernetes
//! workloads that run Multigres as Multigres expects (etcd StatefulSets,
//! multigateway and multiorch Deployments, PostgreSQL pool StatefulSets, Services and
//! PodDisruptionBudgets), restarts pool pods in a safe order, grows volumes, and reports
//! readiness on the custom resources' status.

pub mod cell;
pub mod conditions;
pub mod contract;
pub mod controller;
pub mod env;
pub mod gauges;
pub mod multiadmin;
pub mod names;
pub mod owner;
pub mod podspec;
pub mod readiness;
pub mod shard;
pub mod stateless;
pub mod storage;
pub mod sync;
pub mod tls;
pub mod toposerver;
pub mod unready;
pub mod workload_cache;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::core::DeserializeGuard;
use kube::runtime::watcher;
use multigres_api::observability::InheritedEnv;
use multigres_api::v1alpha1::{
    Cell, CellTemplate, CoreTemplate, MultigresCluster, Shard, ShardTemplate, TopoServer,
};
use multigres_common::HandlerContext;

use controller::{
    Base, Scope, Stores, managed, pool_pods, recorder, share, share_trimmed, slim_pod, triggers,
};
use workload_cache::{WorkloadStore, trim_template};

/// Fills every cache, reports SERVING, then runs every controller until shutdown.
///
/// Controllers start only once the caches are filled, and nothing else waits for a cache at
/// that point: a kube-runtime store wakes only one of several concurrent waiters when it
/// becomes ready, so waiting here while controllers wait too could leave one of them asleep.
pub async fn run(handler: HandlerContext, scope: Scope, telemetry: InheritedEnv) {
    sync::describe();
    let client = handler.client.clone();
    let all = watcher::Config::default;
    let (topo_servers, topo_watch) = share::<DeserializeGuard<TopoServer>>(&client, &scope, all());
    let (cells, cells_watch) = share::<DeserializeGuard<Cell>>(&client, &scope, all());
    let (shards, shards_watch) = share::<DeserializeGuard<Shard>>(&client, &scope, all());
    let (clusters, cluster_watch) =
        share::<DeserializeGuard<MultigresCluster>>(&client, &scope, all());
    let (core_templates, core_watch) =
        share::<DeserializeGuard<CoreTemplate>>(&client, &scope, all());
    let (cell_templates, cell_watch) =
        share::<DeserializeGuard<CellTemplate>>(&client, &scope, all());
    let (shard_templates, shard_watch) =
        share::<DeserializeGuard<ShardTemplate>>(&client, &scope, all());
    let (statefulsets, sts_watch) =
        share_trimmed::<StatefulSet>(&client, &scope, managed(), trim_template);
    let (deployments, deployment_watch) =
        share_trimmed::<Deployment>(&client, &scope, managed(), trim_template);
    let caches = gauges::Caches {
        statefulsets: statefulsets.store.clone(),
        deployments: deployments.store.clone(),
    };
    multigres_common::status_metrics::register(move |g| gauges::collect(g, &caches));
    let (services, service_watch) = share::<Service>(&client, &scope, managed());
    let (pdbs, pdb_watch) = share::<PodDisruptionBudget>(&client, &scope, managed());
    let (pods, pod_watch) = share_trimmed::<Pod>(&client, &scope, pool_pods(), slim_pod);
    let (pvcs, pvc_watch) = share::<PersistentVolumeClaim>(&client, &scope, managed());
    let (secrets, secret_watch) = share::<Secret>(&client, &scope, managed());
    let (config_maps, config_map_watch) = share::<ConfigMap>(&client, &scope, managed());
    let watches = [
        tokio::spawn(topo_watch),
        tokio::spawn(cells_watch),
        tokio::spawn(shards_watch),
        tokio::spawn(cluster_watch),
        tokio::spawn(core_watch),
        tokio::spawn(cell_watch),
        tokio::spawn(shard_watch),
        tokio::spawn(sts_watch),
        tokio::spawn(deployment_watch),
        tokio::spawn(service_watch),
        tokio::spawn(pdb_watch),
        tokio::spawn(pod_watch),
        tokio::spawn(pvc_watch),
        tokio::spawn(secret_watch),
        tokio::spawn(config_map_watch),
    ];
    let stores = Stores {
        statefulsets: WorkloadStore::new(statefulsets.store.clone()),
        deployments: WorkloadStore::new(deployments.store.clone()),
        services: services.store.clone(),
        pdbs: pdbs.store.clone(),
        pvcs: pvcs.store.clone(),
        pods: pods.store.clone(),
        secrets: secrets.store.clone(),
        config_maps: config_maps.store.clone(),
        clusters: clusters.store.clone(),
        core_templates: core_templates.store.clone(),
        cell_templates: cell_templates.store.clone(),
        shard_templates: shard_templates.store.clone(),
    };
    let filled = async {
        stores.wait_until_ready().await?;
        controller::filled(&topo_servers.store).await?;
        controller::filled(&cells.store).await?;
        controller::filled(&shards.store).await
    };
    let shutdown = &handler.shutdown;
    let stopped = tokio::select! {
        result = filled => match result {
            Ok(()) => false,
            Err(error) => {
                tracing::error!(%error, "a cache stopped before it was filled");
                true
            }
        },
        () = shutdown.wait() => true,
    };
    if !stopped {
        for kind in controller::WATCHED_KINDS {
            handler.state.mark_synced(kind);
        }
        handler.state.set_ready(true).await;
        tracing::info!("caches synced; serving");
        let base = Base {
            client: client.clone(),
            scope,
            state: handler.state.clone(),
            recorder: recorder(&client),
            stores,
            telemetry,
        };
        let topo = toposerver::run(
            base.ctx(toposerver::NAME),
            topo_servers,
            triggers(statefulsets.handle.clone(), &statefulsets.deletions),
            triggers(services.handle.clone(), &services.deletions),
            triggers(pdbs.handle.clone(), &pdbs.deletions),
            clusters.handle.clone(),
            shutdown,
        );
        let cells = cell::run(
            base.ctx(cell::NAME),
            cells,
            triggers(deployments.handle.clone(), &deployments.deletions),
            triggers(services.handle.clone(), &services.deletions),
            shutdown,
        );
        let shards = shard::run(
            base.ctx(shard::NAME),
            shards,
            shard::Triggers {
                statefulsets: triggers(statefulsets.handle, &statefulsets.deletions),
                deployments: triggers(deployments.handle.clone(), &deployments.deletions),
                services: triggers(services.handle.clone(), &services.deletions),
                pdbs: triggers(pdbs.handle, &pdbs.deletions),
                pods: triggers(pods.handle, &pods.deletions),
                config_maps: triggers(config_maps.handle, &config_maps.deletions),
                secrets: triggers(secrets.handle.clone(), &secrets.deletions),
                pvcs: triggers(pvcs.handle, &pvcs.deletions),
            },
            shutdown,
        );
        let admin = multiadmin::run(
            base.ctx(multiadmin::NAME),
            multiadmin::Triggers {
                clusters: clusters.handle,
                deployments: triggers(deployments.handle, &deployments.deletions),
                services: triggers(services.handle, &services.deletions),
                secrets: triggers(secrets.handle, &secrets.deletions),
                core_templates: core_templates.handle,
                cell_templates: cell_templates.handle,
                shard_templates: shard_templates.handle,
            },
            shutdown,
        );
        // One task each, so reconciles of different kinds run on different worker threads.
        let controllers = [
            tokio::spawn(topo),
            tokio::spawn(cells),
            tokio::spawn(shards),
            tokio::spawn(admin),
        ];
        for controller in controllers {
            if let Err(error) = controller.await {
                tracing::error!(%error, "a controller task failed");
            }
        }
    }
    for watch in watches {
        watch.abort();
    }
}
