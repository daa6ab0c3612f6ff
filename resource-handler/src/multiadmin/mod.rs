//! MultigresCluster controller of this handler: runs the cluster's multiadmin and
//! multiadmin-web, the cluster-wide multigateway Service, their external exposure, and reports
//! the external endpoints on the cluster's status; it also keeps the cluster's TLS material and
//! the Secrets of the PostgreSQL roles whose passwords the operator generates
//! ([`crate::role_secrets`]). The cluster is resolved here with the
//! templates of its namespace, exactly as the cluster-handler resolves it, so these follow the
//! same images and the same global topology as every other component.

pub mod build;
pub mod external;
pub mod web;

use std::collections::BTreeSet;
use std::sync::Arc;

use futures::Future;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::Controller;
use kube::runtime::controller::{Action, Config};
use kube::runtime::events::EventType;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Resource, ResourceExt};
use multigres_api::labels::{CLUSTER, COMPONENT, Component};
use multigres_api::observability::{InheritedEnv, PROJECT_REF_ANNOTATION, Process};
use multigres_api::owner::{Owner, OwnerError};
use multigres_api::resolver::{ResolveError, ResolvedCluster, images, resolve};
use multigres_api::v1alpha1::{
    CellTemplate, CoreTemplate, GatewayTlsConfig, MultigresCluster, ShardTemplate,
};
use multigres_common::apply::apply_status;
use multigres_common::controller as kit;
use multigres_common::guard::Guarded;
use multigres_common::guard::InvalidObject;
use multigres_common::shared_watch::Changes;
use multigres_common::shutdown::Shutdown;

use crate::conditions::Computed;
use crate::controller::{Category, Classify, Ctx, owned};
use crate::sync::{self, FIELD_MANAGER, SyncError};
use external::{Exposed, InvalidExposure};

/// Controller name in metrics and HandlerInfo.
pub const NAME: &str = "multiadmin";

type Guard = Guarded<MultigresCluster>;

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
    /// `externalGateway` or `externalAdminWeb` asks for something a Service cannot carry.
    #[error(transparent)]
    Exposure(#[from] InvalidExposure),
    /// `networkPolicy` or a `loadBalancerSourceRanges` names a range or source Kubernetes
    /// would refuse.
    #[error(transparent)]
    Network(#[from] multigres_api::network::InvalidNetworkField),
    /// The cluster's internal or gateway certificates could not be issued, stored or asked
    /// of cert-manager.
    #[error("certificates")]
    Tls(#[from] crate::tls::TlsError),
    /// A generated role Secret (the web UI's, the application role's) could not be read,
    /// generated or written.
    #[error(transparent)]
    RoleSecret(#[from] crate::role_secrets::RoleSecretError),
    /// A write to the API server failed.
    #[error(transparent)]
    Sync(#[from] SyncError),
}

impl Classify for Error {
    fn category(&self) -> Category {
        match self {
            Error::Malformed(_) | Error::Owner(_) => Category::Malformed,
            Error::Resolve(_) | Error::Exposure(_) | Error::Network(_) => Category::InvalidSpec,
            Error::Tls(e) if e.is_invalid_spec() => Category::InvalidSpec,
            Error::Tls(_) | Error::RoleSecret(_) | Error::Sync(_) => Category::KubeApi,
        }
    }
}

/// The change streams the multiadmin controller is triggered by.
pub struct Triggers {
    /// The clusters themselves.
    pub clusters: Changes<Guard>,
    /// Owned multiadmin and multiadmin-web Deployments, and every cell's multigateway
    /// Deployment (their readiness is the external gateway's).
    pub deployments: Changes<Deployment>,
    /// Owned Services (their load-balancer status is the external endpoints').
    pub services: Changes<Service>,
    /// Owned TLS and generated role Secrets (a deleted one is made again).
    pub secrets: Changes<Secret>,
    /// Owned NetworkPolicies (a deleted or edited one is applied again).
    pub network_policies: Changes<NetworkPolicy>,
    /// Template changes re-resolve the clusters of their namespace.
    pub core_templates: Changes<Guarded<CoreTemplate>>,
    /// Template changes re-resolve the clusters of their namespace.
    pub cell_templates: Changes<Guarded<CellTemplate>>,
    /// Template changes re-resolve the clusters of their namespace.
    pub shard_templates: Changes<Guarded<ShardTemplate>>,
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

/// The cluster an object matters to: its controller when that is a MultigresCluster, or else
/// the cluster its labels name when it is of component `labelled` (a multigateway Deployment,
/// owned by a Cell; the gateway Secret cert-manager writes, owned by nobody).
fn cluster_of<K: Resource>(labelled: Component) -> impl Fn(Arc<K>) -> Option<ObjectRef<Guard>> {
    move |obj: Arc<K>| {
        let namespace = obj.meta().namespace.clone()?;
        let owner = obj
            .owner_references()
            .iter()
            .find(|o| o.controller == Some(true) && o.kind == "MultigresCluster")
            .map(|o| o.name.clone());
        let labels = obj.labels();
        let by_label = || {
            (labels.get(COMPONENT).map(String::as_str) == Some(labelled.as_str()))
                .then(|| labels.get(CLUSTER).cloned())
                .flatten()
        };
        let cluster = owner.or_else(by_label)?;
        Some(ObjectRef::new(&cluster).within(&namespace))
    }
}

/// The controller, ready to be polled until shutdown.
pub fn run(
    ctx: Arc<Ctx<Guard>>,
    triggers: Triggers,
    shutdown: &Shutdown,
) -> impl Future<Output = ()> + Send + 'static {
    let clusters = ctx.stores.clusters.clone();
    let controller = Controller::for_shared_stream(triggers.clusters, clusters.clone())
        .watches_shared_stream(
            triggers.deployments,
            cluster_of::<Deployment>(Component::Multigateway),
        )
        .owns_shared_stream(triggers.services)
        .watches_shared_stream(
            triggers.secrets,
            cluster_of::<Secret>(Component::GatewayTls),
        )
        .owns_shared_stream(triggers.network_policies)
        .watches_shared_stream(triggers.core_templates, clusters_in_namespace_of(&clusters))
        .watches_shared_stream(triggers.cell_templates, clusters_in_namespace_of(&clusters))
        .watches_shared_stream(
            triggers.shard_templates,
            clusters_in_namespace_of(&clusters),
        );
    kit::run(
        controller,
        Config::default().concurrency(2),
        shutdown,
        reconcile,
        ctx,
    )
}

async fn reconcile(obj: Arc<Guard>, ctx: Arc<Ctx<Guard>>) -> Result<Action, Error> {
    kit::reconcile(&ctx, &obj, reconcile_inner(&obj, &ctx)).await
}

/// Validates the exposure, resolves the cluster, builds, applies, prunes and reports.
async fn reconcile_inner(guard: &Guard, ctx: &Ctx<Guard>) -> Result<Action, Error> {
    let cluster = guard
        .0
        .as_ref()
        .map_err(|e| Error::Malformed(Box::new(e.clone())))?;
    if cluster.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    external::validate(Exposed::Gateway, cluster)?;
    external::validate(Exposed::AdminWeb, cluster)?;
    if let Some(invalid) = multigres_api::network::invalid_fields(&cluster.spec)
        .into_iter()
        .next()
    {
        return Err(invalid.into());
    }
    let owner = Owner::of_cluster(cluster)?;
    // A paused cluster's workloads and network policies stay as they are. Its certificates
    // and role Secrets are still kept (an expired certificate would stop it), and nothing
    // restarts for them while it is paused.
    let paused = multigres_api::labels::paused(cluster.annotations());
    if !paused {
        let trusted = crate::netpol::Trusted {
            operator_namespace: &ctx.operator_namespace,
        };
        let policies = crate::netpol::build(&owner, cluster, trusted);
        crate::netpol::sync(ctx, NAME, &owner, policies).await?;
    }
    let resolved = resolve_cluster(ctx, cluster, &owner.namespace)?;
    certificates(ctx, guard, &owner, &resolved, cluster).await?;
    // Before the Deployments: multiadmin-web reads its password from one of them.
    crate::role_secrets::reconcile(ctx, guard, &owner, &cluster.spec).await?;
    if !paused {
        let objects = desire(&owner, cluster, &resolved, &ctx.telemetry);
        apply(ctx, &owner, objects).await?;
        prune(ctx, &owner).await?;
    }
    update_status(ctx, guard, cluster, &owner).await?;
    Ok(Action::await_change())
}

/// The cluster's internal, gateway and exporter certificates, issued or kept; what they made
/// or replaced is one event on the cluster, also when a later one fails.
async fn certificates(
    ctx: &Ctx<Guard>,
    guard: &Guard,
    owner: &Owner,
    resolved: &ResolvedCluster,
    cluster: &MultigresCluster,
) -> Result<(), Error> {
    let mut issued = Vec::new();
    let result = async {
        let internal_tls = cluster.spec.internal_tls.as_ref();
        issued.extend(crate::tls::reconcile_internal(ctx, owner, resolved, internal_tls).await?);
        issued.extend(crate::tls::reconcile_gateway(ctx, owner, resolved, &cluster.spec).await?);
        issued.extend(crate::exporter::reconcile(ctx, owner, &cluster.spec).await?);
        Ok::<_, crate::tls::TlsError>(())
    }
    .await;
    crate::tls::announce_issued(ctx, guard, &issued).await;
    Ok(result?)
}

/// The cluster resolved with the templates of `namespace` (from the cache) and the images the
/// cluster-handler gave the other components (its adopted default set).
fn resolve_cluster(
    ctx: &Ctx<Guard>,
    cluster: &MultigresCluster,
    namespace: &str,
) -> Result<ResolvedCluster, ResolveError> {
    let recorded = images::recorded_effective(cluster);
    resolve(
        &images::complete(cluster, &recorded),
        &ctx.stores.templates.of_namespace(namespace),
    )
}

/// The cluster-wide objects this controller applies.
struct Objects {
    /// multiadmin's and multiadmin-web's.
    deployments: [Deployment; 2],
    /// multiadmin's, multiadmin-web's and the cluster-wide multigateway ones.
    services: [Service; 4],
}

/// Builds multiadmin (with its telemetry environment and internal TLS), multiadmin-web and
/// the cluster-wide gateway Services, exposed as the cluster asks.
fn desire(
    owner: &Owner,
    cluster: &MultigresCluster,
    resolved: &ResolvedCluster,
    inherited: &InheritedEnv,
) -> Objects {
    let mut admin = build::build(owner, resolved);
    crate::env::add_to_deployment(
        &mut admin.deployment,
        "multiadmin",
        Process::Multiadmin,
        crate::env::Source {
            config: cluster.spec.observability.as_ref(),
            inherited,
            cluster: &owner.cluster,
            project: cluster
                .annotations()
                .get(PROJECT_REF_ANNOTATION)
                .map(String::as_str),
        },
    );
    crate::tls::mount_process_tls_deployment(
        &mut admin.deployment,
        crate::tls::Process::Multiadmin,
        owner,
        cluster.spec.internal_tls.as_ref(),
        &resolved.topo_ref,
    );
    // The UI logs in as its own read-only role. With TLS required its plaintext client is
    // refused: it gets no password to hold.
    let required = GatewayTlsConfig::is_required(cluster.spec.gateway_tls.as_ref());
    let web = web::build(owner, resolved, !required);
    let mut web_service = web.service;
    external::expose(&mut web_service, Exposed::AdminWeb.enabled(cluster));
    let mut gateway_service = external::gateway_service(owner);
    external::expose(&mut gateway_service, Exposed::Gateway.enabled(cluster));
    let gateway_replica_service = external::gateway_replica_service(owner);
    let mut deployments = [admin.deployment, web.deployment];
    if multigres_api::labels::hibernated(cluster.annotations()) {
        for spec in deployments.iter_mut().filter_map(|d| d.spec.as_mut()) {
            spec.replicas = Some(0);
        }
    }
    Objects {
        deployments,
        services: [
            admin.service,
            web_service,
            gateway_service,
            gateway_replica_service,
        ],
    }
}

/// Applies every object that changed.
async fn apply(ctx: &Ctx<Guard>, owner: &Owner, objects: Objects) -> Result<(), Error> {
    let ns = owner.namespace.as_str();
    let deployments = Api::<Deployment>::namespaced(ctx.client.clone(), ns);
    let services = Api::<Service>::namespaced(ctx.client.clone(), ns);
    // Independent objects are applied together: under load each write (a Service's above
    // all, which allocates a cluster IP) takes a round trip and a watch event to settle, and
    // one after another they would add up.
    let applied_services = objects
        .services
        .map(|service| sync::ensure(NAME, &services, &ctx.stores.services, service));
    let applied_deployments = objects
        .deployments
        .map(|deployment| sync::ensure(NAME, &deployments, &ctx.stores.deployments, deployment));
    futures::try_join!(
        futures::future::try_join_all(applied_services),
        futures::future::try_join_all(applied_deployments),
    )?;
    Ok(())
}

/// Deletes the Services and Deployments of the cluster this controller no longer keeps.
async fn prune(ctx: &Ctx<Guard>, owner: &Owner) -> Result<(), Error> {
    let ns = owner.namespace.as_str();
    let uid = owner.uid();
    let names = Names::of(&owner.cluster);
    let keep_services = BTreeSet::from([
        names.multiadmin.clone(),
        names.web.clone(),
        names.gateway.clone(),
        names.gateway_replica.clone(),
    ]);
    sync::prune(
        NAME,
        &Api::<Service>::namespaced(ctx.client.clone(), ns),
        &owned(&ctx.stores.services, ns, uid),
        &keep_services,
    )
    .await?;
    let keep_deployments = BTreeSet::from([names.multiadmin, names.web]);
    sync::prune(
        NAME,
        &Api::<Deployment>::namespaced(ctx.client.clone(), ns),
        &owned(&ctx.stores.deployments, ns, uid),
        &keep_deployments,
    )
    .await?;
    Ok(())
}

/// Applies the external endpoints' status when it differs from the stored one (as the
/// cached Services and Deployments show them), with an event for each condition that
/// changed reason.
async fn update_status(
    ctx: &Ctx<Guard>,
    guard: &Guard,
    cluster: &MultigresCluster,
    owner: &Owner,
) -> Result<(), Error> {
    let ns = owner.namespace.as_str();
    let names = Names::of(&owner.cluster);
    let service = |name: &str| ctx.stores.services.get(&ObjectRef::new(name).within(ns));
    let gateway_service = service(&names.gateway);
    let web_service = service(&names.web);
    let web_ready = ctx
        .stores
        .deployments
        .get(&ObjectRef::new(&names.web).within(ns))
        .and_then(|d| d.status.as_ref().and_then(|s| s.ready_replicas))
        .unwrap_or(0);
    let (desired, transitions) = external::status(
        cluster,
        external::Observed {
            service: gateway_service.as_deref(),
            ready_pods: ready_gateways(&ctx.stores.deployments, ns, &owner.cluster),
        },
        external::Observed {
            service: web_service.as_deref(),
            ready_pods: web_ready,
        },
        Timestamp::now(),
    );
    if external::differs(cluster, &desired) {
        let api = Api::<MultigresCluster>::namespaced(ctx.client.clone(), ns);
        sync::count(NAME, "MultigresCluster", "apply-status");
        apply_status(&api, FIELD_MANAGER, &owner.name, &desired)
            .await
            .map_err(SyncError::from)?;
        for cond in transitions {
            report(ctx, guard, &cond).await;
        }
    }
    Ok(())
}

/// Names of the cluster-wide objects this controller keeps.
struct Names {
    multiadmin: String,
    web: String,
    gateway: String,
    gateway_replica: String,
}

impl Names {
    fn of(cluster: &str) -> Self {
        Self {
            multiadmin: crate::names::multiadmin(cluster),
            web: crate::names::multiadmin_web(cluster),
            gateway: crate::names::cluster_multigateway(cluster),
            gateway_replica: crate::names::cluster_multigateway_replica(cluster),
        }
    }
}

/// Ready multigateway pods of every cell of `cluster`: what the cluster-wide Service reaches.
fn ready_gateways(store: &Store<Deployment>, namespace: &str, cluster: &str) -> i32 {
    store
        .state()
        .iter()
        .filter(|d| d.metadata.namespace.as_deref() == Some(namespace))
        .filter(|d| {
            let labels = d.labels();
            labels.get(CLUSTER).map(String::as_str) == Some(cluster)
                && labels.get(COMPONENT).map(String::as_str)
                    == Some(Component::Multigateway.as_str())
        })
        .map(|d| {
            d.status
                .as_ref()
                .and_then(|s| s.ready_replicas)
                .unwrap_or(0)
        })
        .sum()
}

/// An event for an external condition that changed reason, saying what it means (and, while
/// no endpoint exists, what to do).
async fn report(ctx: &Ctx<Guard>, guard: &Guard, cond: &Computed) {
    let type_ =
        if cond.reason == external::ENDPOINT_READY || cond.reason == external::AWAITING_ENDPOINT {
            EventType::Normal
        } else {
            EventType::Warning
        };
    ctx.kit
        .event(
            guard,
            type_,
            cond.reason,
            format!("{}: {}", cond.type_, cond.message),
        )
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prune_keeps_every_object_the_build_applies() {
        let cluster: MultigresCluster =
            serde_yaml::from_str(include_str!("../../fixtures/cluster-external-topo.yaml"))
                .unwrap();
        let owner = Owner::with_cluster(&cluster, cluster.name_any()).unwrap();
        let resolved = resolve(&cluster, &multigres_api::resolver::Templates::default()).unwrap();
        let objects = desire(&owner, &cluster, &resolved, &InheritedEnv::default());
        let names = Names::of(&owner.cluster);
        assert_eq!(
            objects.services.each_ref().map(|s| s.name_any()),
            [
                names.multiadmin.clone(),
                names.web.clone(),
                names.gateway,
                names.gateway_replica
            ]
        );
        assert_eq!(
            objects.deployments.each_ref().map(|d| d.name_any()),
            [names.multiadmin, names.web]
        );
    }
}
