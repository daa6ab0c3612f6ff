//! MultigresCluster controller of this handler: runs the cluster's multiadmin. The cluster is
//! resolved here with the templates of its namespace, exactly as the cluster-handler resolves
//! it, so multiadmin follows the same images and the same global topology as every other
//! component.

pub mod build;

use std::collections::BTreeSet;
use std::sync::Arc;

use futures::Future;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Secret, Service};
use kube::core::DeserializeGuard;
use kube::core::error_boundary::InvalidObject;
use kube::runtime::Controller;
use kube::runtime::controller::{Action, Config};
use kube::runtime::reflector::{ObjectRef, ReflectHandle, Store};
use kube::{Api, Resource, ResourceExt};
use multigres_api::observability::{PROJECT_REF_ANNOTATION, Process};
use multigres_api::resolver::{ResolveError, Templates, images, resolve};
use multigres_api::v1alpha1::{CellTemplate, CoreTemplate, MultigresCluster, ShardTemplate};
use multigres_common::shutdown::Shutdown;

use crate::controller::{Classify, Ctx, Stores, drain, error_policy, observe, owned};
use crate::owner::{Owner, OwnerError};
use crate::sync::{self, SyncError};

/// Controller name in metrics and HandlerInfo.
pub const NAME: &str = "multiadmin";

type Guard = DeserializeGuard<MultigresCluster>;

/// Why a cluster's multiadmin could not be reconciled.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The stored object does not match the schema this binary knows.
    #[error("the MultigresCluster cannot be read: {0}")]
    Malformed(#[source] Box<InvalidObject>),
    /// The object was never stored.
    #[error(transparent)]
    Owner(#[from] OwnerError),
    /// The cluster cannot be resolved (e.g. a named template does not exist).
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    /// Internal TLS certificates could not be issued or stored.
    #[error("internal TLS")]
    Tls(#[from] crate::tls::TlsError),
    /// A write to the API server failed.
    #[error(transparent)]
    Sync(#[from] SyncError),
}

impl Classify for Error {
    fn is_invalid_spec(&self) -> bool {
        match self {
            Error::Sync(_) => false,
            Error::Tls(e) => e.is_invalid_spec(),
            _ => true,
        }
    }

    fn category(&self) -> &'static str {
        if self.is_invalid_spec() {
            "invalid_spec"
        } else {
            "kube_api"
        }
    }
}

/// The change streams the multiadmin controller is triggered by.
pub struct Triggers {
    /// The clusters themselves.
    pub clusters: ReflectHandle<Guard>,
    /// Owned multiadmin Deployments.
    pub deployments: ReflectHandle<Deployment>,
    /// Owned multiadmin Services.
    pub services: ReflectHandle<Service>,
    /// Owned internal TLS Secrets (a deleted one is issued again).
    pub secrets: ReflectHandle<Secret>,
    /// Template changes re-resolve the clusters of their namespace.
    pub core_templates: ReflectHandle<DeserializeGuard<CoreTemplate>>,
    /// Template changes re-resolve the clusters of their namespace.
    pub cell_templates: ReflectHandle<DeserializeGuard<CellTemplate>>,
    /// Template changes re-resolve the clusters of their namespace.
    pub shard_templates: ReflectHandle<DeserializeGuard<ShardTemplate>>,
}

/// Every cluster in the namespace of `obj` (a template change may change their resolution).
fn clusters_in_namespace_of<T: Resource>(
    clusters: &Store<Guard>,
) -> impl Fn(Arc<T>) -> Vec<ObjectRef<Guard>> + Send + Sync + 'static {
    let clusters = clusters.clone();
    move |template: Arc<T>| {
        let namespace = template.meta().namespace.clone();
        clusters
            .state()
            .into_iter()
            .filter(|c| c.meta().namespace == namespace)
            .map(|c| ObjectRef::from_obj(&*c))
            .collect()
    }
}

/// The controller, ready to be polled until shutdown.
pub fn run(
    ctx: Arc<Ctx<Guard>>,
    triggers: Triggers,
    shutdown: &Shutdown,
) -> impl Future<Output = ()> + Send + 'static {
    let clusters = ctx.stores.clusters.clone();
    let shutdown = futures::FutureExt::shared(futures::FutureExt::boxed(shutdown.wait()));
    let results = Controller::for_shared_stream(triggers.clusters, clusters.clone())
        .owns_shared_stream(triggers.deployments)
        .owns_shared_stream(triggers.services)
        .owns_shared_stream(triggers.secrets)
        .watches_shared_stream(triggers.core_templates, clusters_in_namespace_of(&clusters))
        .watches_shared_stream(triggers.cell_templates, clusters_in_namespace_of(&clusters))
        .watches_shared_stream(
            triggers.shard_templates,
            clusters_in_namespace_of(&clusters),
        )
        .with_config(Config::default().concurrency(2))
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx);
    drain(NAME, results)
}

async fn reconcile(obj: Arc<Guard>, ctx: Arc<Ctx<Guard>>) -> Result<Action, Error> {
    observe(&ctx, &obj, reconcile_inner(&obj, &ctx)).await
}

/// The valid templates of `namespace`, by kind and name.
pub fn templates(stores: &Stores, namespace: &str) -> Templates {
    fn specs<T, S>(
        store: &Store<DeserializeGuard<T>>,
        namespace: &str,
        spec: fn(&T) -> S,
    ) -> std::collections::BTreeMap<String, S>
    where
        T: Resource<DynamicType = ()> + Clone + 'static,
    {
        store
            .state()
            .iter()
            .filter_map(|t| t.0.as_ref().ok())
            .filter(|t| t.meta().namespace.as_deref() == Some(namespace))
            .filter_map(|t| Some((t.meta().name.clone()?, spec(t))))
            .collect()
    }
    Templates {
        core: specs(&stores.core_templates, namespace, |t: &CoreTemplate| {
            t.spec.clone()
        }),
        cell: specs(&stores.cell_templates, namespace, |t: &CellTemplate| {
            t.spec.clone()
        }),
        shard: specs(&stores.shard_templates, namespace, |t: &ShardTemplate| {
            t.spec.clone()
        }),
    }
}

async fn reconcile_inner(guard: &Guard, ctx: &Ctx<Guard>) -> Result<Action, Error> {
    let cluster = guard
        .0
        .as_ref()
        .map_err(|e| Error::Malformed(Box::new(e.clone())))?;
    if cluster.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let owner = Owner::with_cluster(cluster, cluster.name_any())?;
    let ns = owner.namespace.as_str();
    // The images the cluster-handler gave the other components (its adopted default set).
    let recorded = images::recorded_effective(cluster);
    let resolved = resolve(
        &images::complete(cluster, &recorded),
        &templates(&ctx.stores, ns),
    )?;
    let internal_tls = cluster.spec.internal_tls.as_ref();
    crate::tls::reconcile_internal(ctx, guard, &owner, &resolved, internal_tls).await?;
    let mut objects = build::build(&owner, &resolved);
    crate::env::add_to_deployment(
        &mut objects.deployment,
        "multiadmin",
        Process::Multiadmin,
        crate::env::Source {
            config: cluster.spec.observability.as_ref(),
            inherited: &ctx.telemetry,
            cluster: &owner.cluster,
            project: cluster
                .annotations()
                .get(PROJECT_REF_ANNOTATION)
                .map(String::as_str),
        },
    );
    if crate::tls::enabled(internal_tls) {
        let process = crate::tls::Process::Multiadmin;
        let deployment = &mut objects.deployment;
        crate::tls::mount_internal_deployment(deployment, process, &owner.cluster, ns);
    }
    let name = objects.deployment.name_any();
    let deployments = Api::<Deployment>::namespaced(ctx.client.clone(), ns);
    let services = Api::<Service>::namespaced(ctx.client.clone(), ns);
    sync::ensure(NAME, &services, &ctx.stores.services, objects.service).await?;
    sync::ensure(
        NAME,
        &deployments,
        &ctx.stores.deployments,
        objects.deployment,
    )
    .await?;
    let keep = BTreeSet::from([name]);
    let uid = owner.uid();
    sync::prune(
        NAME,
        &services,
        &owned(&ctx.stores.services, ns, uid),
        &keep,
    )
    .await?;
    sync::prune(
        NAME,
        &deployments,
        &owned(&ctx.stores.deployments, ns, uid),
        &keep,
    )
    .await?;
    Ok(Action::await_change())
}
