//! The MultigresCluster controller: resolves a cluster with the templates of its namespace,
//! applies its TopoServers, Cells and TableGroups, removes the ones the spec no longer has, and
//! aggregates their status into the cluster's.

pub mod build;
pub mod guard;
pub mod images;
pub mod status;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};
use multigres_api::labels;
use multigres_api::owner::{Owner, OwnerError};
use multigres_api::resolver::{self, ResolveError, TemplateKind, Templates};
use multigres_api::v1alpha1::{
    CellTemplate, CoreTemplate, MultigresCluster, ResolvedTemplates, ShardTemplate, TableGroup,
    TemplateRef, TopoServer,
};
use multigres_common::apply::ApplyError;
use multigres_common::controller::{self, Category, Classify, Ctx};
use multigres_common::events::Notice;
use multigres_common::status_pacer::{self, FirstStatus, StatusPacer};

use crate::children::{Child, Slot, is_orphan, owned_by, slot};
use crate::watch::{Guarded, in_namespace};
use crate::writes::{self, Writer};
use build::Children;
use status::{Observed, Outcome};

/// Name of this controller in metrics and `HandlerInfo`.
pub const CONTROLLER: &str = "multigrescluster";

/// When a child is still terminating, look again after this long.
const TERMINATING_RETRY: Duration = Duration::from_secs(5);

/// Why a cluster could not be reconciled.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The stored object does not match the API types (e.g. written by a newer operator).
    #[error("MultigresCluster {name} cannot be read: {message}")]
    Malformed {
        /// `namespace/name`.
        name: String,
        /// The deserializer's message.
        message: String,
    },
    /// The cluster was not read from the API server.
    #[error(transparent)]
    Owner(#[from] OwnerError),
    /// A template the cluster uses does not match the API types.
    #[error("{kind} {name:?} cannot be read: {message}; fix or recreate it")]
    MalformedTemplate {
        /// Template kind.
        kind: TemplateKind,
        /// Template name.
        name: String,
        /// The deserializer's message.
        message: String,
    },
    /// The spec and templates do not resolve (missing template, unsupported value).
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    /// The API server refused a child built from the spec.
    #[error("{kind} {name} was refused by the API server: {message}")]
    Rejected {
        /// Child kind.
        kind: String,
        /// Child name.
        name: String,
        /// The API server's message.
        message: String,
    },
    /// A child's name is taken by an object another owner controls (for example a child of a
    /// deleted cluster of the same name, not yet garbage-collected).
    #[error(
        "{kind} {name} exists and is controlled by {owner_kind} {owner}; it is left alone until it is gone"
    )]
    Foreign {
        /// Child kind.
        kind: String,
        /// Child name.
        name: String,
        /// Kind of its controller.
        owner_kind: String,
        /// Name of its controller.
        owner: String,
    },
    /// Applying a child failed (API server unreachable, conflict, timeout).
    #[error(transparent)]
    Apply(ApplyError),
    /// Deleting a child failed.
    #[error("cannot delete {kind} {name}")]
    Delete {
        /// Child kind.
        kind: String,
        /// Child name.
        name: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// Writing the cluster's status failed.
    #[error("cannot write the status")]
    Status(#[source] ApplyError),
    /// The applied-images record cannot be used under the lazy strategy.
    #[error(transparent)]
    Images(#[from] images::RecordInvalid),
    /// The new resolution would delete data without confirmation, or remove pools.
    #[error(transparent)]
    Held(#[from] guard::Held),
}

impl Classify for Error {
    fn category(&self) -> Category {
        match self {
            Error::Malformed { .. } | Error::Owner(_) => Category::Malformed,
            Error::MalformedTemplate { .. }
            | Error::Resolve(_)
            | Error::Rejected { .. }
            | Error::Images(_)
            | Error::Held(_) => Category::InvalidSpec,
            Error::Foreign { .. } => Category::Conflict,
            Error::Apply(_) | Error::Delete { .. } | Error::Status(_) => Category::KubeApi,
        }
    }

    /// The reason of the cluster's `Progressing` condition too.
    fn reason(&self) -> &'static str {
        match self {
            Error::Malformed { .. } | Error::Owner(_) => "InvalidObject",
            Error::MalformedTemplate { .. } => "InvalidTemplate",
            Error::Resolve(ResolveError::MissingTemplates(_)) => "TemplateNotFound",
            Error::Resolve(_) | Error::Rejected { .. } => "InvalidSpec",
            Error::Foreign { .. } => "NameConflict",
            Error::Apply(_) => "ApplyFailed",
            Error::Delete { .. } => "DeleteFailed",
            Error::Status(_) => "StatusFailed",
            Error::Images(_) => "InvalidImageRecord",
            Error::Held(held) => held.reason(),
        }
    }

    /// A spec the cluster cannot be realised by is its `Progressing` condition's news.
    fn on_conditions(&self) -> bool {
        self.category() == Category::InvalidSpec
    }
}

impl Error {
    fn from_apply(error: ApplyError) -> Self {
        match writes::rejection(&error) {
            Some((kind, name, message)) => Error::Rejected {
                kind,
                name,
                message,
            },
            None => Error::Apply(error),
        }
    }
}

/// The caches the controller reads.
#[derive(Clone)]
pub struct Stores {
    /// MultigresClusters.
    pub clusters: Store<Guarded<MultigresCluster>>,
    /// CoreTemplates.
    pub core_templates: Store<Guarded<CoreTemplate>>,
    /// CellTemplates.
    pub cell_templates: Store<Guarded<CellTemplate>>,
    /// ShardTemplates.
    pub shard_templates: Store<Guarded<ShardTemplate>>,
    /// TopoServers managed by the operator.
    pub topo_servers: Store<Guarded<TopoServer>>,
    /// Cells managed by the operator.
    pub cells: Store<Guarded<multigres_api::v1alpha1::Cell>>,
    /// TableGroups managed by the operator.
    pub table_groups: Store<Guarded<TableGroup>>,
}

/// What this controller reads and writes with, besides the kit.
pub struct Inputs {
    /// The caches it reads.
    pub stores: Stores,
    /// Where its writes go.
    pub writer: Writer,
    /// When each object's status was last written, to pace progress-only status writes.
    pub pacer: Arc<StatusPacer<String>>,
    /// The operator's default images and update strategy.
    pub images: images::ImageDefaults,
}

/// This controller's context.
pub type Context = Ctx<Guarded<MultigresCluster>, Inputs>;

/// Reconciles one cluster.
pub async fn reconcile(
    obj: Arc<Guarded<MultigresCluster>>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    controller::reconcile(&ctx, &obj, reconcile_cluster(&obj, &ctx)).await
}

async fn reconcile_cluster(
    obj: &Guarded<MultigresCluster>,
    ctx: &Context,
) -> Result<Action, Error> {
    let cluster = match &obj.0 {
        Ok(cluster) => cluster,
        Err(invalid) => {
            return Err(Error::Malformed {
                name: format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any()),
                message: invalid.error.clone(),
            });
        }
    };
    if cluster.meta().deletion_timestamp.is_some() {
        // Children go with the cluster through their owner references.
        return Ok(Action::await_change());
    }
    let owner = build::owner(cluster)?;
    let referenced = resolver::referenced_templates(cluster);

    let decision = images::decide(cluster, &ctx.images);
    let realized = match &decision {
        Ok(decision) => realize(cluster, decision, &owner, &referenced, ctx).await,
        Err(invalid) => Err(Error::Images(invalid.clone())),
    };
    let result = match realized {
        Err(error) if !error.is_invalid_spec() => return Err(error),
        result => result,
    };
    let outcome = match &result {
        Ok(realized) => Outcome::Applied(&realized.children),
        Err(error) => Outcome::Blocked {
            reason: error.reason(),
            message: error.to_string(),
        },
    };
    let observed = observe(&ctx.stores, &owner);
    let now = Timestamp::now();
    let mut computed = status::compute(cluster, &outcome, &observed, referenced, now);
    let current = cluster.status.clone().unwrap_or_default();
    let decided = decision.as_ref().ok();
    for field in images::set_status(
        &mut computed.status,
        &current,
        decided,
        cluster.metadata.generation,
        now,
    ) {
        if !computed.changed.contains(&field) {
            computed.changed.push(field);
        }
    }
    let mut deferred = None;
    if !computed.changed.is_empty() {
        tracing::info!(changed = ?computed.changed, "status changed");
        deferred = writes::apply_status_paced(
            &ctx.writer,
            &ctx.stores.clusters,
            &ctx.pacer,
            cluster,
            cluster.status.as_ref(),
            &computed.status,
            FirstStatus::Deadline,
        )
        .await
        .map_err(Error::Status)?;
    }
    let reference = cluster.object_ref(&());
    let deletions = result
        .as_ref()
        .map(|r| r.notices.as_slice())
        .unwrap_or_default();
    let image_notices = decided.map(|d| d.notices.as_slice()).unwrap_or_default();
    // The transitions' events go with the status that shows them: a deferred status publishes
    // them once written (the next reconcile computes them again from the stored status).
    let transitions = if deferred.is_none() {
        computed.notices.as_slice()
    } else {
        &[]
    };
    for notice in deletions.iter().chain(transitions).chain(image_notices) {
        ctx.kit
            .publish_event(&notice.event("Reconcile"), &reference)
            .await;
    }
    match result {
        Err(error) => Err(error),
        Ok(realized) if realized.terminating => {
            Ok(status_pacer::action(Some(TERMINATING_RETRY), deferred))
        }
        Ok(_) => Ok(status_pacer::action(None, deferred)),
    }
}

/// The children applied, and what happened on the way.
struct Realized {
    children: Children,
    /// Some desired child still has a terminating predecessor; it is applied once gone.
    terminating: bool,
    /// Deletions to report.
    notices: Vec<Notice>,
}

/// Resolves the cluster, applies every child that differs from its cached version, and
/// deletes the TopoServers and TableGroups it controls that the spec no longer has. Cells are
/// never deleted here: cells are append-only, so a Cell without a spec entry is left for a
/// person to look at. A resolution that would remove pools, or delete a TopoServer or
/// TableGroup the cluster's annotations do not confirm, is not applied at all ([`guard`]).
/// While the cluster is paused ([`labels::PAUSED`]) nothing is deleted; the children are still
/// applied, carrying the annotation, so their handlers hold their workloads.
async fn realize(
    cluster: &MultigresCluster,
    decision: &images::Decision,
    owner: &Owner,
    referenced: &ResolvedTemplates,
    ctx: &Context,
) -> Result<Realized, Error> {
    let templates = templates(&ctx.stores, &owner.namespace, referenced)?;
    let completed = resolver::images::complete(cluster, &decision.effective);
    let resolved = resolver::resolve(&completed, &templates)?;
    let children = build::children(owner, &resolved);
    let stores = &ctx.stores;
    guard::check(cluster, &templates, &children, &observe(stores, owner))?;
    if decision.annotation_changed(cluster) {
        // Recorded before any child changes, so a restart in between never rolls a held
        // cluster back or forth.
        writes::apply_annotation(
            &ctx.writer,
            &stores.clusters,
            cluster,
            resolver::images::APPLIED_IMAGES_ANNOTATION,
            &decision.annotation,
        )
        .await
        .map_err(Error::from_apply)?;
    }
    let mut terminating = false;
    for child in &children.topo_servers {
        terminating |= apply_child(&ctx.writer, &stores.topo_servers, child, owner).await?;
    }
    for child in &children.cells {
        terminating |= apply_child(&ctx.writer, &stores.cells, child, owner).await?;
    }
    for child in &children.table_groups {
        terminating |= apply_child(&ctx.writer, &stores.table_groups, child, owner).await?;
    }
    let mut notices = Vec::new();
    // A paused cluster's children stay: deleting one deletes its workloads.
    if !labels::paused(cluster.annotations()) {
        delete_orphans(
            ctx,
            &stores.topo_servers,
            &children.topo_servers,
            owner,
            &mut notices,
        )
        .await?;
        delete_orphans(
            ctx,
            &stores.table_groups,
            &children.table_groups,
            owner,
            &mut notices,
        )
        .await?;
    }
    Ok(Realized {
        children,
        terminating,
        notices,
    })
}

/// Applies `desired` unless its cached version is up to date; returns whether it had to wait
/// for a terminating object of the same name.
async fn apply_child<K: Child>(
    writer: &Writer,
    store: &Store<Guarded<K>>,
    desired: &K,
    owner: &Owner,
) -> Result<bool, Error> {
    let key = ObjectRef::<Guarded<K>>::new(&desired.name_any()).within(&owner.namespace);
    let cached = store.get(&key);
    let observed = match slot(cached.as_deref(), &owner.reference.uid) {
        Slot::Free(observed) => observed,
        Slot::Terminating => return Ok(true),
        Slot::Taken(controller) => {
            return Err(Error::Foreign {
                kind: K::kind(&()).into_owned(),
                name: desired.name_any(),
                owner_kind: controller.kind.clone(),
                owner: controller.name.clone(),
            });
        }
    };
    writes::apply_child(writer, store, desired, observed)
        .await
        .map_err(Error::from_apply)?;
    Ok(false)
}

/// Deletes the children of kind `K` that carry the cluster's label and owner reference but
/// are not in `desired`.
async fn delete_orphans<K: Child>(
    ctx: &Context,
    store: &Store<Guarded<K>>,
    desired: &[K],
    owner: &Owner,
    notices: &mut Vec<Notice>,
) -> Result<(), Error> {
    let wanted: BTreeSet<String> = desired.iter().map(ResourceExt::name_any).collect();
    for cached in in_namespace(store, &owner.namespace) {
        let Ok(child) = &cached.0 else { continue };
        let name = child.name_any();
        let orphan = owned_by(child, &owner.reference.uid)
            && is_orphan(child, &owner.name, |n| wanted.contains(n));
        if !orphan {
            continue;
        }
        let kind = K::kind(&()).into_owned();
        writes::delete_child(&ctx.writer, store, child)
            .await
            .map_err(|source| Error::Delete {
                kind: kind.clone(),
                name: name.clone(),
                source,
            })?;
        notices.push(Notice::normal(
            "Deleted",
            format!("Deleted {kind} {name}: the spec no longer has it"),
        ));
    }
    Ok(())
}

/// The valid cached children the cluster controls, by name.
fn observe(stores: &Stores, owner: &Owner) -> Observed {
    Observed {
        topo_servers: owned(&stores.topo_servers, owner),
        cells: owned(&stores.cells, owner),
        table_groups: owned(&stores.table_groups, owner),
    }
}

fn owned<K: Child>(store: &Store<Guarded<K>>, owner: &Owner) -> BTreeMap<String, K> {
    in_namespace(store, &owner.namespace)
        .iter()
        .filter_map(|cached| cached.0.as_ref().ok())
        .filter(|child| owned_by(*child, &owner.reference.uid))
        .map(|child| (child.name_any(), child.clone()))
        .collect()
}

/// The templates of `namespace` for the resolver. A template the cluster references that
/// cannot be read is an error; unreadable templates it does not use are ignored.
fn templates(
    stores: &Stores,
    namespace: &str,
    referenced: &ResolvedTemplates,
) -> Result<Templates, Error> {
    Ok(Templates {
        core: specs(
            &stores.core_templates,
            namespace,
            TemplateKind::Core,
            &referenced.core_templates,
            |t| t.spec.clone(),
        )?,
        cell: specs(
            &stores.cell_templates,
            namespace,
            TemplateKind::Cell,
            &referenced.cell_templates,
            |t| t.spec.clone(),
        )?,
        shard: specs(
            &stores.shard_templates,
            namespace,
            TemplateKind::Shard,
            &referenced.shard_templates,
            |t| t.spec.clone(),
        )?,
    })
}

fn specs<K, S>(
    store: &Store<Guarded<K>>,
    namespace: &str,
    kind: TemplateKind,
    referenced: &[TemplateRef],
    spec: impl Fn(&K) -> S,
) -> Result<BTreeMap<String, S>, Error>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    let mut out = BTreeMap::new();
    for cached in in_namespace(store, namespace) {
        let name = cached.name_any();
        match &cached.0 {
            Ok(template) => {
                out.insert(name, spec(template));
            }
            Err(invalid) if referenced.iter().any(|r| r.as_str() == name) => {
                return Err(Error::MalformedTemplate {
                    kind,
                    name,
                    message: invalid.error.clone(),
                });
            }
            Err(_) => {}
        }
    }
    Ok(out)
}

/// Whether a cluster whose status records `resolved` depends on the template `name` of
/// `kind`. A cluster that recorded nothing yet depends on every template.
pub fn uses_template(resolved: Option<&ResolvedTemplates>, kind: TemplateKind, name: &str) -> bool {
    let Some(resolved) = resolved else {
        return true;
    };
    let names = match kind {
        TemplateKind::Core => &resolved.core_templates,
        TemplateKind::Cell => &resolved.cell_templates,
        TemplateKind::Shard => &resolved.shard_templates,
    };
    names.iter().any(|n| n.as_str() == name)
}

/// The clusters in the template's namespace that depend on it, to reconcile when it changes.
pub fn clusters_using<T: Resource>(
    clusters: &Store<Guarded<MultigresCluster>>,
    kind: TemplateKind,
    template: &T,
) -> Vec<ObjectRef<Guarded<MultigresCluster>>> {
    let Some(namespace) = template.meta().namespace.as_deref() else {
        return Vec::new();
    };
    let name = template.meta().name.as_deref().unwrap_or_default();
    in_namespace(clusters, namespace)
        .iter()
        .filter(|cached| {
            cached.0.as_ref().is_ok_and(|c| {
                uses_template(
                    c.status
                        .as_ref()
                        .and_then(|s| s.resolved_templates.as_ref()),
                    kind,
                    name,
                )
            })
        })
        .map(|cached| ObjectRef::from_obj(&**cached))
        .collect()
}

#[cfg(test)]
mod tests;
