//! The TableGroup controller: applies one Shard per shard entry of a TableGroup, deletes the
//! Shards it controls that are no longer listed, and aggregates their status.

pub mod build;
pub mod status;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};
use multigres_api::owner::OwnerError;
use multigres_api::v1alpha1::{Shard, TableGroup};
use multigres_common::apply::ApplyError;
use multigres_common::controller::{self, Category, Classify, Ctx};
use multigres_common::events::Notice;
use multigres_common::status_pacer::{self, FirstStatus, StatusPacer};

use crate::children::{Slot, owned_by, slot};
use crate::watch::{Guarded, in_namespace};
use crate::writes::{self, Writer};
use status::Outcome;

/// Name of this controller in metrics and `HandlerInfo`.
pub const CONTROLLER: &str = "tablegroup";

/// When a Shard is still terminating, look again after this long.
const TERMINATING_RETRY: Duration = Duration::from_secs(5);

/// Why a TableGroup could not be reconciled.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The stored object does not match the API types.
    #[error("TableGroup {name} cannot be read: {message}")]
    Malformed {
        /// `namespace/name`.
        name: String,
        /// The deserializer's message.
        message: String,
    },
    /// The TableGroup lacks its identity, or says of no cluster that it belongs to it.
    #[error(transparent)]
    Owner(#[from] OwnerError),
    /// The API server refused a Shard built from the spec.
    #[error("Shard {name} was refused by the API server: {message}")]
    Rejected {
        /// Shard name.
        name: String,
        /// The API server's message.
        message: String,
    },
    /// A Shard's name is taken by an object another owner controls.
    #[error(
        "Shard {name} exists and is controlled by {owner_kind} {owner}; it is left alone until it is gone"
    )]
    Foreign {
        /// Shard name.
        name: String,
        /// Kind of its controller.
        owner_kind: String,
        /// Name of its controller.
        owner: String,
    },
    /// Applying a Shard failed.
    #[error(transparent)]
    Apply(ApplyError),
    /// Deleting a Shard failed.
    #[error("cannot delete Shard {name}")]
    Delete {
        /// Shard name.
        name: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// Writing the TableGroup's status failed.
    #[error("cannot write the status")]
    Status(#[source] ApplyError),
}

impl Classify for Error {
    fn category(&self) -> Category {
        match self {
            Error::Malformed { .. } | Error::Owner(_) => Category::Malformed,
            Error::Rejected { .. } => Category::InvalidSpec,
            Error::Foreign { .. } => Category::Conflict,
            Error::Apply(_) | Error::Delete { .. } | Error::Status(_) => Category::KubeApi,
        }
    }

    /// The reason of the TableGroup's `Progressing` condition too.
    fn reason(&self) -> &'static str {
        match self {
            Error::Malformed { .. } | Error::Owner(_) => "InvalidObject",
            Error::Rejected { .. } => "InvalidSpec",
            Error::Foreign { .. } => "NameConflict",
            Error::Apply(_) => "ApplyFailed",
            Error::Delete { .. } => "DeleteFailed",
            Error::Status(_) => "StatusFailed",
        }
    }

    /// A Shard the API server refuses is the TableGroup's `Progressing` condition's news.
    fn on_conditions(&self) -> bool {
        self.category() == Category::InvalidSpec
    }
}

impl Error {
    fn from_apply(error: ApplyError) -> Self {
        match writes::rejection(&error) {
            Some((_, name, message)) => Error::Rejected { name, message },
            None => Error::Apply(error),
        }
    }
}

/// What this controller reads and writes with, besides the kit.
pub struct Inputs {
    /// TableGroups managed by the operator.
    pub table_groups: Store<Guarded<TableGroup>>,
    /// Shards managed by the operator.
    pub shards: Store<Guarded<Shard>>,
    /// Where its writes go.
    pub writer: Writer,
    /// When each object's status was last written, to pace progress-only status writes.
    pub pacer: Arc<StatusPacer<String>>,
}

/// This controller's context.
pub type Context = Ctx<Guarded<TableGroup>, Inputs>;

/// Reconciles one TableGroup.
pub async fn reconcile(obj: Arc<Guarded<TableGroup>>, ctx: Arc<Context>) -> Result<Action, Error> {
    controller::reconcile(&ctx, &obj, reconcile_table_group(&obj, &ctx)).await
}

async fn reconcile_table_group(obj: &Guarded<TableGroup>, ctx: &Context) -> Result<Action, Error> {
    let tg = match &obj.0 {
        Ok(tg) => tg,
        Err(invalid) => {
            return Err(Error::Malformed {
                name: format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any()),
                message: invalid.error.clone(),
            });
        }
    };
    if tg.meta().deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let namespace = tg.namespace().unwrap_or_default();
    let uid = tg.uid().unwrap_or_default();
    let result = match realize(tg, ctx).await {
        Err(error) if !error.is_invalid_spec() => return Err(error),
        result => result,
    };
    let outcome = match &result {
        Ok(realized) => Outcome::Applied(&realized.shards),
        Err(error) => Outcome::Blocked {
            reason: error.reason(),
            message: error.to_string(),
        },
    };
    let observed: BTreeMap<String, Shard> = in_namespace(&ctx.shards, &namespace)
        .iter()
        .filter_map(|cached| cached.0.as_ref().ok())
        .filter(|shard| owned_by(*shard, &uid))
        .map(|shard| (shard.name_any(), shard.clone()))
        .collect();
    let computed = status::compute(tg, &outcome, &observed, Timestamp::now());
    let mut deferred = None;
    if !computed.changed.is_empty() {
        tracing::info!(changed = ?computed.changed, "status changed");
        deferred = writes::apply_status_paced(
            &ctx.writer,
            &ctx.table_groups,
            &ctx.pacer,
            tg,
            tg.status.as_ref(),
            &computed.status,
            // Users watch the MultigresCluster, which already shows this progress.
            FirstStatus::WhenBudgetAllows,
        )
        .await
        .map_err(Error::Status)?;
    }
    let reference = tg.object_ref(&());
    let deletions = result
        .as_ref()
        .map(|r| r.notices.as_slice())
        .unwrap_or_default();
    // The transitions' events go with the status that shows them: a deferred status publishes
    // them once written (the next reconcile computes them again from the stored status).
    let transitions = if deferred.is_none() {
        computed.notices.as_slice()
    } else {
        &[]
    };
    for notice in deletions.iter().chain(transitions) {
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

struct Realized {
    shards: Vec<Shard>,
    terminating: bool,
    notices: Vec<Notice>,
}

/// Applies every Shard that differs from its cached version and deletes the Shards this
/// TableGroup controls that it no longer lists (none while the cluster is paused).
async fn realize(tg: &TableGroup, ctx: &Context) -> Result<Realized, Error> {
    let owner = build::owner(tg)?;
    let shards = build::shards(&owner, &tg.spec);
    let mut terminating = false;
    for desired in &shards {
        let name = desired.name_any();
        let cached = ctx
            .shards
            .get(&ObjectRef::new(&name).within(&owner.namespace));
        let observed = match slot(cached.as_deref(), &owner.reference.uid) {
            Slot::Free(observed) => observed,
            Slot::Terminating => {
                terminating = true;
                continue;
            }
            Slot::Taken(controller) => {
                return Err(Error::Foreign {
                    name,
                    owner_kind: controller.kind.clone(),
                    owner: controller.name.clone(),
                });
            }
        };
        writes::apply_child(&ctx.writer, &ctx.shards, desired, observed)
            .await
            .map_err(Error::from_apply)?;
    }
    let wanted: BTreeSet<String> = shards.iter().map(ResourceExt::name_any).collect();
    let mut notices = Vec::new();
    // A paused cluster's Shards stay: deleting one deletes its workloads.
    let cached_shards = match multigres_api::labels::paused(tg.annotations()) {
        true => Vec::new(),
        false => in_namespace(&ctx.shards, &owner.namespace),
    };
    for cached in cached_shards {
        let Ok(shard) = &cached.0 else { continue };
        let name = shard.name_any();
        if !owned_by(shard, &owner.reference.uid)
            || wanted.contains(&name)
            || shard.meta().deletion_timestamp.is_some()
        {
            continue;
        }
        writes::delete_child(&ctx.writer, &ctx.shards, shard)
            .await
            .map_err(|source| Error::Delete {
                name: name.clone(),
                source,
            })?;
        notices.push(Notice::normal(
            "Deleted",
            format!("Deleted Shard {name}: the TableGroup no longer lists it"),
        ));
    }
    Ok(Realized {
        shards,
        terminating,
        notices,
    })
}

#[cfg(test)]
mod tests;
