//! The resource-handler: turns TopoServer, Cell, Shard and each MultigresCluster's multiadmin
//! into Kubernetes workloads that run Multigres as Multigres expects (etcd StatefulSets,
//! multigateway and multiorch Deployments, PostgreSQL pool StatefulSets, Services and
//! PodDisruptionBudgets), restarts pool pods in a safe order, grows volumes, and reports
//! readiness on the custom resources' status.

pub mod cell;
pub mod conditions;
pub mod contract;
pub mod controller;
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
pub mod toposerver;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::core::DeserializeGuard;
use kube::runtime::watcher;
use multigres_api::v1alpha1::{CellTemplate, CoreTemplate, MultigresCluster, ShardTemplate};
use multigres_common::HandlerContext;

use controller::{Base, Scope, Stores, cache, managed, pool_pods, recorder, share};

/// Runs every controller until shutdown; reports SERVING once every cache is filled.
pub async fn run(handler: HandlerContext, scope: Scope) {
    sync::describe();
    let client = handler.client.clone();
    let (statefulsets, sts_watch) = share::<StatefulSet>(&client, &scope, managed());
    let (deployments, deployment_watch) = share::<Deployment>(&client, &scope, managed());
    let caches = gauges::Caches {
        statefulsets: statefulsets.store.clone(),
        deployments: deployments.store.clone(),
    };
    multigres_common::status_metrics::register(move |g| gauges::collect(g, &caches));
    let (services, service_watch) = share::<Service>(&client, &scope, managed());
    let (pdbs, pdb_watch) = share::<PodDisruptionBudget>(&client, &scope, managed());
    let (pods, pod_watch) = share::<Pod>(&client, &scope, pool_pods());
    let (clusters, cluster_watch) =
        share::<DeserializeGuard<MultigresCluster>>(&client, &scope, watcher::Config::default());
    let (core_templates, core_watch) =
        share::<DeserializeGuard<CoreTemplate>>(&client, &scope, watcher::Config::default());
    let (cell_templates, cell_watch) =
        share::<DeserializeGuard<CellTemplate>>(&client, &scope, watcher::Config::default());
    let (shard_templates, shard_watch) =
        share::<DeserializeGuard<ShardTemplate>>(&client, &scope, watcher::Config::default());
    let (pvcs, pvc_watch) = cache::<PersistentVolumeClaim>(&client, &scope, managed());
    let stores = Stores {
        statefulsets: statefulsets.store.clone(),
        deployments: deployments.store.clone(),
        services: services.store.clone(),
        pdbs: pdbs.store.clone(),
        pvcs,
        pods: pods.store.clone(),
        clusters: clusters.store.clone(),
        core_templates: core_templates.store.clone(),
        cell_templates: cell_templates.store.clone(),
        shard_templates: shard_templates.store.clone(),
    };
    let base = Base {
        client: client.clone(),
        scope,
        state: handler.state.clone(),
        recorder: recorder(&client),
        stores: stores.clone(),
    };
    let shutdown = &handler.shutdown;
    let (topo_store, topo) = toposerver::run(
        base.ctx(toposerver::NAME),
        statefulsets.handle.clone(),
        services.handle.clone(),
        pdbs.handle.clone(),
        clusters.handle.clone(),
        shutdown,
    );
    let (cell_store, cells) = cell::run(
        base.ctx(cell::NAME),
        deployments.handle.clone(),
        services.handle.clone(),
        shutdown,
    );
    let (shard_store, shards) = shard::run(
        base.ctx(shard::NAME),
        shard::Triggers {
            statefulsets: statefulsets.handle,
            deployments: deployments.handle.clone(),
            services: services.handle.clone(),
            pdbs: pdbs.handle,
            pods: pods.handle,
        },
        shutdown,
    );
    let admin = multiadmin::run(
        base.ctx(multiadmin::NAME),
        multiadmin::Triggers {
            clusters: clusters.handle,
            deployments: deployments.handle,
            services: services.handle,
            core_templates: core_templates.handle,
            cell_templates: cell_templates.handle,
            shard_templates: shard_templates.handle,
        },
        shutdown,
    );
    let watches = [
        tokio::spawn(sts_watch),
        tokio::spawn(deployment_watch),
        tokio::spawn(service_watch),
        tokio::spawn(pdb_watch),
        tokio::spawn(pod_watch),
        tokio::spawn(cluster_watch),
        tokio::spawn(core_watch),
        tokio::spawn(cell_watch),
        tokio::spawn(shard_watch),
        tokio::spawn(pvc_watch),
    ];
    let state = handler.state.clone();
    let ready = tokio::spawn(async move {
        let filled = async {
            stores.wait_until_ready().await?;
            topo_store.wait_until_ready().await?;
            cell_store.wait_until_ready().await?;
            shard_store.wait_until_ready().await
        };
        match filled.await {
            Ok(()) => {
                for kind in controller::WATCHED_KINDS {
                    state.mark_synced(kind);
                }
                state.set_serving(true).await;
                tracing::info!("caches filled, controllers running");
            }
            Err(error) => tracing::error!(%error, "a cache stopped before it was filled"),
        }
    });
    futures::join!(topo, cells, shards, admin);
    ready.abort();
    for watch in watches {
        watch.abort();
    }
}
