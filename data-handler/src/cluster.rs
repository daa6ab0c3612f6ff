//! The MultigresCluster controller: registers the cluster's cells and databases in its global
//! topology, prunes the records it holds that the spec no longer has, reports
//! `TopoServerReachable` and `TopologyRegistered` on the cluster, and removes its records when the
//! cluster is deleted (a finalizer that gives up, with a Warning event, once the server is gone
//! for good).
//!
//! dereference → validate (resolve, target, records) → apply to etcd ([`crate::sync`]) →
//! status. A healthy cluster is checked again every `check_period`, since an etcd outage or an
//! edit of the records makes no Kubernetes event; a failing one is retried with backoff.

pub mod status;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::runtime::reflector::Store;
use kube::{Resource, ResourceExt};
use multigres_api::labels;
use multigres_api::names;
use multigres_api::resolver::{self, ResolveError};
use multigres_api::v1alpha1::{BackupRequestRollup, MultigresCluster, Shard, TopoServer};
use multigres_common::apply::ApplyError;
use multigres_common::controller::{self, Category, Classify, Ctx};
use multigres_common::events::Notice;
use multigres_common::status_pacer::{self, Pace, StatusPacer};
use multigres_common::templates::TemplateStores;

use crate::Settings;
use crate::conditions;
use crate::deletion::{self, Verdict};
use crate::desired::{self, owner_id};
use crate::finalizer;
use crate::sync::{self, Registered};
use crate::target::{ConnectError, Connections, Target, TargetError};
use crate::topo::{RecordRef, TopoError};
use crate::watch::{Guarded, full_name, valid, valid_in};
use crate::writes::{self, Writer};

/// Name of this controller in metrics and `HandlerInfo`.
pub const CONTROLLER: &str = "multigrescluster";

/// Why a cluster's topology could not be reconciled.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The stored object does not match the API types.
    #[error("MultigresCluster {name} cannot be read: {message}")]
    Malformed { name: String, message: String },
    /// The spec and templates do not resolve.
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    /// The topology server settings cannot be used.
    #[error(transparent)]
    Target(#[from] TargetError),
    /// A record built from the spec would be unusable by Multigres.
    #[error("the spec gives an unusable topology record: {0}")]
    Records(#[source] TopoError),
    /// The managed topology server is not serving yet; its TopoServer changing re-triggers.
    #[error("TopoServer {topo_server} is not Available yet")]
    ServerNotReady { topo_server: String },
    /// The connection could not be prepared (TLS Secrets).
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// etcd failed or refused.
    #[error(transparent)]
    Topo(TopoError),
    /// Adding or removing the finalizer failed.
    #[error("cannot update the finalizers")]
    Finalizer(#[source] kube::Error),
    /// Writing the conditions failed.
    #[error("cannot write the status")]
    Status(#[source] ApplyError),
    /// Deleting the cluster's records failed; retried until the give-up timeout.
    #[error("cannot remove the topology records of the deleted cluster yet")]
    Cleanup(#[source] Box<Error>),
}

impl Classify for Error {
    /// Only a change of the cluster can fix an invalid spec: no retry until it changes.
    /// Everything else (server down, Secret missing, record held by another cluster) is retried
    /// with backoff, since the fix happens outside the cluster object.
    fn category(&self) -> Category {
        match self {
            Error::Malformed { .. } => Category::Malformed,
            Error::Resolve(_) | Error::Target(_) | Error::Records(_) => Category::InvalidSpec,
            Error::ServerNotReady { .. } => Category::Waiting,
            Error::Connect(e) => e.category(),
            Error::Topo(_) | Error::Cleanup(_) => Category::DataPlane,
            Error::Finalizer(_) | Error::Status(_) => Category::KubeApi,
        }
    }

    /// `TopoServerReachable` and `TopologyRegistered` say every failure of a pass
    /// ([`status::conditions`]).
    fn on_conditions(&self) -> bool {
        !matches!(self, Error::Status(_) | Error::Cleanup(_))
    }
}

/// What this controller reads and writes with, besides the kit.
pub struct Inputs {
    /// Templates, for resolving clusters.
    pub templates: TemplateStores,
    /// Managed TopoServers, to tell when a cluster's server is going away.
    pub topo_servers: Store<Guarded<TopoServer>>,
    /// Shards, for the roll-up of a backup request (`status.backupRequest`).
    pub shards: Store<Guarded<Shard>>,
    /// Open topology connections.
    pub connections: Arc<Connections>,
    /// Where its writes go.
    pub writer: Writer,
    /// When each cluster's conditions were last written, to pace progress-only writes.
    pub pacer: StatusPacer<String>,
    /// Periods and timeouts.
    pub settings: Settings,
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
        Err(invalid) => return malformed(obj, &invalid.error, ctx).await,
    };
    if cluster.meta().deletion_timestamp.is_some() {
        return finalize(cluster, ctx).await;
    }
    let pass = register(cluster, ctx).await;
    let existing = cluster
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let computed = status::conditions(pass.target.as_ref(), &pass.result);
    let (ours, changed) = conditions::merge(
        existing,
        &computed,
        cluster.meta().generation,
        Timestamp::now(),
    );
    let stored_request = cluster
        .status
        .as_ref()
        .and_then(|s| s.backup_request.as_ref());
    let request = status::backup_request(cluster, &shards_of(&ctx.shards, cluster));
    let request_changed = request.as_ref() != stored_request;
    let waits_for_a_change = pass.result.as_ref().is_err_and(Error::is_invalid_spec);
    let deferred = if changed || request_changed {
        write_conditions(
            &ctx.writer,
            &ctx.pacer,
            cluster,
            cluster.status.as_ref(),
            status_body(&ours, request.as_ref()),
            // A requester waits on the roll-up: it is news.
            waits_for_a_change || request_changed,
        )
        .await
        .map_err(Error::Status)?
    } else {
        None
    };
    // The transitions' events go with the status that shows them: a deferred status publishes
    // them once written (the next pass computes them again from the stored status).
    let mut notices = if deferred.is_none() {
        conditions::transitions(existing, &ours)
    } else {
        Vec::new()
    };
    if let (Some(target), Ok(done)) = (&pass.target, &pass.result) {
        notices.extend(status::registration_notices(target, done));
    }
    let reference = cluster.object_ref(&());
    for notice in &notices {
        ctx.kit
            .publish_event(&notice.event("Register"), &reference)
            .await;
    }
    if let Some(notice) = status::backup_request_notice(stored_request, request.as_ref()) {
        ctx.kit
            .publish_event(&notice.event("Backup"), &reference)
            .await;
    }
    pass.result
        .map(|_| status_pacer::action(Some(ctx.settings.check_period), deferred))
}

/// The Shards of `cluster`, by its label, sorted by name (the roll-up's message lists them in
/// this order, and must not change with the cache's).
pub fn shards_of(shards: &Store<Guarded<Shard>>, cluster: &MultigresCluster) -> Vec<Shard> {
    let name = cluster.name_any();
    let mut found = valid_in(shards, &cluster.namespace().unwrap_or_default(), |shard| {
        shard.labels().get(labels::CLUSTER) == Some(&name)
    });
    found.sort_by_key(ResourceExt::name_any);
    found
}

/// This handler's status fields of a cluster, for one apply (it drops the fields it leaves
/// out): the conditions, and the backup request's roll-up.
fn status_body(
    conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    request: Option<&BackupRequestRollup>,
) -> serde_json::Value {
    let mut body = conditions::status_body(conditions);
    if let Some(request) = request {
        body["backupRequest"] = serde_json::json!(request);
    }
    body
}

/// Applies `body`, this handler's status fields of `obj` (`stored` is its stored status), unless
/// they only carry progress and `pacer` wrote `obj` recently or spent its progress budget, or
/// `obj` is converging and was first seen less than the pacing interval ago
/// ([`multigres_common::status_pacer`]); never deferred when `urgent` (the object is not
/// reconciled again until it changes). Returns how long the write was deferred, if it was.
pub(crate) async fn write_conditions<K>(
    writer: &Writer,
    pacer: &StatusPacer<String>,
    obj: &K,
    stored: Option<&impl serde::Serialize>,
    body: serde_json::Value,
    urgent: bool,
) -> Result<Option<Duration>, ApplyError>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned,
{
    let key = format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any());
    let stored = serde_json::to_value(stored).unwrap_or_default();
    if !urgent && let Pace::Defer(delay) = pacer.pace(&key, Some(&stored), &body) {
        tracing::debug!(?delay, "progress-only status write deferred");
        return Ok(Some(delay));
    }
    writer.apply_status(obj, &body).await?;
    pacer.wrote(&key);
    Ok(None)
}

/// A cluster that cannot be read: nothing can be registered. If it is being deleted, its
/// finalizer is released at once, since its topology settings are unknown.
async fn malformed(
    obj: &Guarded<MultigresCluster>,
    message: &str,
    ctx: &Context,
) -> Result<Action, Error> {
    let error = Error::Malformed {
        name: full_name(obj),
        message: message.to_owned(),
    };
    let reference = obj.object_ref(&());
    if obj.meta().deletion_timestamp.is_some() {
        if let Some(patch) = finalizer::remove(obj.meta().finalizers.as_deref()) {
            let notice = Notice::warning(
                "TopologyCleanupSkipped",
                format!(
                    "Released the {} finalizer without removing topology records: {error}",
                    finalizer::FINALIZER
                ),
            );
            ctx.kit
                .publish_event(&notice.event("Deregister"), &reference)
                .await;
            writes::patch_json(&ctx.writer, obj, patch)
                .await
                .map_err(Error::Finalizer)?;
        }
        return Ok(Action::await_change());
    }
    let notice = Notice::warning("InvalidObject", error.to_string());
    ctx.kit
        .publish_event(&notice.event("Register"), &reference)
        .await;
    Err(error)
}

/// One registration attempt: the target (when it could be worked out) and what happened.
struct Pass {
    target: Option<Target>,
    result: Result<Registered, Error>,
}

async fn register(cluster: &MultigresCluster, ctx: &Context) -> Pass {
    let namespace = cluster.namespace().unwrap_or_default();
    let resolved = match resolver::resolve(cluster, &ctx.templates.of_namespace(&namespace)) {
        Ok(resolved) => resolved,
        Err(error) => return failed(None, error.into()),
    };
    let target = match Target::new(cluster, &resolved.topo_ref) {
        Ok(target) => target,
        Err(error) => return failed(None, error.into()),
    };
    let topology = match desired::topology(cluster, &resolved) {
        Ok(topology) => topology,
        Err(error) => return failed(Some(target), Error::Records(error)),
    };
    let topo_server = valid(
        &ctx.topo_servers,
        &namespace,
        &names::global_topo_server(&cluster.name_any()),
    );
    if let Some(name) = crate::target::waiting_for(&target, topo_server.as_ref()) {
        let topo_server = name.to_owned();
        return failed(Some(target), Error::ServerNotReady { topo_server });
    }
    let store = match ctx.connections.open(&namespace, &target).await {
        Ok(store) => store,
        Err(error) => return failed(Some(target), error.into()),
    };
    let owner = owner_id(&namespace, &cluster.name_any());
    let result = async {
        let owners = store.owners().await.map_err(Error::Topo)?;
        // The finalizer goes on once the server has answered, before the first write: a
        // cluster whose server never answered has nothing to remove and is deleted at once.
        if let Some(patch) = finalizer::add(cluster.meta().finalizers.as_deref()) {
            writes::patch_json(&ctx.writer, cluster, patch)
                .await
                .map_err(Error::Finalizer)?;
        }
        sync::register(&store, &owner, &topology, &owners)
            .await
            .map_err(Error::Topo)
    }
    .await;
    Pass {
        target: Some(target),
        result,
    }
}

fn failed(target: Option<Target>, error: Error) -> Pass {
    Pass {
        target,
        result: Err(error),
    }
}

/// Deletion: removes every record the cluster holds, then its finalizer. Failures are retried
/// until [`deletion::after_failure`] gives up; then the finalizer is released with a Warning
/// event naming what may remain.
async fn finalize(cluster: &MultigresCluster, ctx: &Context) -> Result<Action, Error> {
    let Some(release) = finalizer::remove(cluster.meta().finalizers.as_deref()) else {
        return Ok(Action::await_change());
    };
    let namespace = cluster.namespace().unwrap_or_default();
    let topo_server = valid(
        &ctx.topo_servers,
        &namespace,
        &names::global_topo_server(&cluster.name_any()),
    );
    let notice = match deregister(cluster, topo_server.as_ref(), ctx).await {
        Cleanup::Done { target, removed } => {
            ctx.connections.forget(&target);
            status::deregistered_notice(&target, &removed)
        }
        Cleanup::ServerGone { why } => status::cleanup_skipped_notice(cluster, None, &why, None),
        Cleanup::Failed { target, error } => {
            let server = target.as_ref().map_or(deletion::ServerState::Present, |t| {
                deletion::server_state(&t.server, topo_server.as_ref())
            });
            let since = cluster.meta().deletion_timestamp.as_ref().map(|t| t.0);
            let timeout = ctx.settings.unreachable_timeout;
            match deletion::after_failure(&server, since, Timestamp::now(), timeout) {
                Verdict::Retry => return Err(Error::Cleanup(Box::new(error))),
                Verdict::GiveUp { why } => {
                    if let Some(target) = &target {
                        ctx.connections.forget(target);
                    }
                    status::cleanup_skipped_notice(cluster, target.as_ref(), &why, Some(&error))
                }
            }
        }
    };
    let reference = cluster.object_ref(&());
    ctx.kit
        .publish_event(&notice.event("Deregister"), &reference)
        .await;
    writes::patch_json(&ctx.writer, cluster, release)
        .await
        .map_err(Error::Finalizer)?;
    Ok(Action::await_change())
}

/// How removing a deleted cluster's records went.
enum Cleanup {
    /// Every record it held is gone.
    Done {
        target: Target,
        removed: Vec<RecordRef>,
    },
    /// Its managed topology server no longer exists: the records went with it.
    ServerGone { why: String },
    /// Something failed; `target` when it could be worked out.
    Failed {
        target: Option<Target>,
        error: Error,
    },
}

async fn deregister(
    cluster: &MultigresCluster,
    topo_server: Option<&TopoServer>,
    ctx: &Context,
) -> Cleanup {
    let namespace = cluster.namespace().unwrap_or_default();
    let Some(topo_ref) = crate::target::deletion_topo_ref(cluster, topo_server) else {
        return Cleanup::ServerGone {
            why: format!(
                "its TopoServer {} no longer exists",
                names::global_topo_server(&cluster.name_any())
            ),
        };
    };
    let target = match Target::new(cluster, &topo_ref) {
        Ok(target) => target,
        Err(error) => {
            return Cleanup::Failed {
                target: None,
                error: error.into(),
            };
        }
    };
    let store = match ctx.connections.open(&namespace, &target).await {
        Ok(store) => store,
        Err(error) => {
            return Cleanup::Failed {
                target: Some(target),
                error: error.into(),
            };
        }
    };
    match sync::deregister(&store, &owner_id(&namespace, &cluster.name_any())).await {
        Ok(removed) => Cleanup::Done { target, removed },
        Err(error) => Cleanup::Failed {
            target: Some(target),
            error: Error::Topo(error),
        },
    }
}
