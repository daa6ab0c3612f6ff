//! The Cell controller: reports whether the cell's record in the global topology says what the
//! Cell's spec says (`TopoServerReachable`, `TopologyRegistered`), and keeps a finalizer so a
//! cell that leaves its cluster loses its record before the Cell goes.
//!
//! The MultigresCluster controller is the only writer of Cell records (one writer, no
//! last-writer races); this controller reads the record and compares. Both compute the record
//! with [`crate::desired::cell_record`]. The cluster supplies the connection settings (TLS
//! Secrets), so a change of the cluster also re-checks its Cells.

use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::runtime::reflector::Store;
use kube::{Resource, ResourceExt};
use multigres_api::labels;
use multigres_api::names;
use multigres_api::v1alpha1::{Cell, MultigresCluster, TopoServer};
use multigres_common::apply::ApplyError;
use multigres_common::conditions::Computed;
use multigres_common::controller::{self, Category, Classify, Ctx};
use multigres_common::events::Notice;
use multigres_common::status_pacer::{self, StatusPacer};
use multigres_common::telemetry::ErrorChain;

use crate::Settings;
use crate::conditions::{self, TOPO_SERVER_REACHABLE, TOPOLOGY_REGISTERED};
use crate::deletion::{self, Verdict};
use crate::desired::{cell_record, owner_id};
use crate::finalizer;
use crate::sync::{self, CellState};
use crate::target::{ConnectError, Connections, Target, TargetError};
use crate::topo::{CellSpec, RecordRef, TopoError, TopoStore};
use crate::watch::{Guarded, full_name, valid};
use crate::writes::{self, Writer};

/// Name of this controller in metrics and `HandlerInfo`.
pub const CONTROLLER: &str = "cell";

/// Why a Cell could not be checked or finalized.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The stored object does not match the API types.
    #[error("Cell {name} cannot be read: {message}")]
    Malformed { name: String, message: String },
    /// The Cell names no MultigresCluster that exists (yet).
    #[error("MultigresCluster {cluster} of this Cell is not found")]
    ClusterNotFound { cluster: String },
    /// The topology server settings cannot be used.
    #[error(transparent)]
    Target(#[from] TargetError),
    /// The managed topology server is not serving yet.
    #[error("TopoServer {topo_server} is not Available yet")]
    ServerNotReady { topo_server: String },
    /// The connection could not be prepared (TLS Secrets).
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// etcd failed or refused.
    #[error(transparent)]
    Topo(#[from] TopoError),
    /// Adding or removing the finalizer failed.
    #[error("cannot update the finalizers")]
    Finalizer(#[source] kube::Error),
    /// Writing the conditions failed.
    #[error("cannot write the status")]
    Status(#[source] ApplyError),
    /// Removing the cell's record failed; retried until the give-up timeout.
    #[error("cannot remove the topology record of the deleted cell yet")]
    Cleanup(#[source] Box<Error>),
}

impl Classify for Error {
    /// Only a change (of the Cell or its cluster, which re-triggers the Cell) can fix an
    /// invalid spec; everything else is retried with backoff.
    fn category(&self) -> Category {
        match self {
            Error::Malformed { .. } => Category::Malformed,
            Error::ClusterNotFound { .. } | Error::ServerNotReady { .. } => Category::Waiting,
            Error::Target(_) => Category::InvalidSpec,
            Error::Connect(e) => e.category(),
            Error::Topo(_) | Error::Cleanup(_) => Category::DataPlane,
            Error::Finalizer(_) | Error::Status(_) => Category::KubeApi,
        }
    }

    /// A check's failures are the Cell's conditions ([`conditions_of`]).
    fn on_conditions(&self) -> bool {
        matches!(
            self,
            Error::ClusterNotFound { .. }
                | Error::Target(_)
                | Error::ServerNotReady { .. }
                | Error::Connect(_)
                | Error::Topo(_)
        )
    }
}

/// What this controller reads and writes with, besides the kit.
pub struct Inputs {
    /// MultigresClusters, for the owner of each Cell.
    pub clusters: Store<Guarded<MultigresCluster>>,
    /// Managed TopoServers, to tell when a cluster's server is going away.
    pub topo_servers: Store<Guarded<TopoServer>>,
    /// Open topology connections.
    pub connections: Arc<Connections>,
    /// Where its writes go.
    pub writer: Writer,
    /// When each Cell's conditions were last written, to pace progress-only writes.
    pub pacer: StatusPacer<String>,
    /// Periods and timeouts.
    pub settings: Settings,
}

/// This controller's context.
pub type Context = Ctx<Guarded<Cell>, Inputs>;

/// Reconciles one Cell.
pub async fn reconcile(obj: Arc<Guarded<Cell>>, ctx: Arc<Context>) -> Result<Action, Error> {
    controller::reconcile(&ctx, &obj, reconcile_cell(&obj, &ctx)).await
}

/// The MultigresCluster a Cell belongs to: the one its `multigres.com/cluster` label names, in
/// its namespace, provided the Cell's owner references (if any) point at that very cluster.
pub fn owner_cluster(
    cell: &Cell,
    clusters: &Store<Guarded<MultigresCluster>>,
) -> Option<MultigresCluster> {
    let name = cell.labels().get(labels::CLUSTER)?;
    let cluster = valid(clusters, &cell.namespace().unwrap_or_default(), name)?;
    let owners: Vec<_> = cell
        .owner_references()
        .iter()
        .filter(|r| r.kind == "MultigresCluster")
        .collect();
    let uid = cluster.uid();
    (owners.is_empty() || owners.iter().any(|r| Some(&r.uid) == uid.as_ref())).then_some(cluster)
}

async fn reconcile_cell(obj: &Guarded<Cell>, ctx: &Context) -> Result<Action, Error> {
    let cell = match &obj.0 {
        Ok(cell) => cell,
        Err(invalid) => {
            let error = Error::Malformed {
                name: full_name(obj),
                message: invalid.error.clone(),
            };
            // Nothing can be worked out from an unreadable Cell: let it go if it is leaving.
            if obj.meta().deletion_timestamp.is_some()
                && let Some(patch) = finalizer::remove(obj.meta().finalizers.as_deref())
            {
                writes::patch_json(&ctx.writer, obj, patch)
                    .await
                    .map_err(Error::Finalizer)?;
                return Ok(Action::await_change());
            }
            return Err(error);
        }
    };
    let cluster = owner_cluster(cell, &ctx.clusters);
    if cell.meta().deletion_timestamp.is_some() {
        return finalize(cell, cluster.as_ref(), ctx).await;
    }
    if let Some(patch) = finalizer::add(cell.meta().finalizers.as_deref()) {
        writes::patch_json(&ctx.writer, cell, patch)
            .await
            .map_err(Error::Finalizer)?;
    }
    let check = check(cell, cluster.as_ref(), ctx).await;
    let existing = cell
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let computed = conditions_of(&check);
    let (ours, changed) = conditions::merge(
        existing,
        &computed,
        cell.meta().generation,
        Timestamp::now(),
    );
    let waits_for_a_change = check.outcome.as_ref().is_err_and(Error::is_invalid_spec);
    let deferred = if changed {
        crate::cluster::write_conditions(
            &ctx.writer,
            &ctx.pacer,
            cell,
            cell.status.as_ref(),
            conditions::status_body(&ours),
            waits_for_a_change,
        )
        .await
        .map_err(Error::Status)?
    } else {
        None
    };
    // A deferred status publishes its transitions' events once written.
    if deferred.is_none() {
        let reference = cell.object_ref(&());
        for notice in conditions::transitions(existing, &ours) {
            ctx.kit
                .publish_event(&notice.event("Check"), &reference)
                .await;
        }
    }
    check
        .outcome
        .map(|_| status_pacer::action(Some(ctx.settings.check_period), deferred))
}

/// One look at a Cell's record.
pub struct Check {
    /// `namespace/name` of the cluster, or what the label names.
    pub cluster: String,
    /// The server, described for messages, once known.
    pub server: Option<String>,
    /// The record key, once connected.
    pub key: Option<String>,
    /// The record the Cell wants.
    pub wanted: Option<CellSpec>,
    /// The comparison, or why there is none.
    pub outcome: Result<CellState, Error>,
}

async fn check(cell: &Cell, cluster: Option<&MultigresCluster>, ctx: &Context) -> Check {
    let namespace = cell.namespace().unwrap_or_default();
    let label = cell
        .labels()
        .get(labels::CLUSTER)
        .cloned()
        .unwrap_or_default();
    let mut check = Check {
        cluster: format!("{namespace}/{label}"),
        server: None,
        key: None,
        wanted: None,
        outcome: Err(Error::ClusterNotFound {
            cluster: format!("{namespace}/{label}"),
        }),
    };
    let Some(cluster) = cluster else {
        return check;
    };
    let target = match Target::new(cluster, &cell.spec.global_topo_server) {
        Ok(target) => target,
        Err(error) => {
            check.outcome = Err(error.into());
            return check;
        }
    };
    check.server = Some(target.describe());
    let topo_server = valid(
        &ctx.topo_servers,
        &namespace,
        &names::global_topo_server(&cluster.name_any()),
    );
    if let Some(name) = crate::target::waiting_for(&target, topo_server.as_ref()) {
        check.outcome = Err(Error::ServerNotReady {
            topo_server: name.to_owned(),
        });
        return check;
    }
    let wanted = cell_record(&cluster.name_any(), &namespace, &cell.spec);
    check.wanted = Some(wanted.clone());
    let store: Arc<TopoStore> = match ctx.connections.open(&namespace, &target).await {
        Ok(store) => store,
        Err(error) => {
            check.outcome = Err(error.into());
            return check;
        }
    };
    check.key = Some(store.paths().cell(&wanted.name));
    check.outcome = sync::check_cell(&store, &wanted).await.map_err(Error::from);
    check
}

/// The Cell's two conditions after a [`Check`]: pure.
pub fn conditions_of(check: &Check) -> Vec<Computed> {
    let (r, t) = (TOPO_SERVER_REACHABLE, TOPOLOGY_REGISTERED);
    let server = check
        .server
        .clone()
        .unwrap_or_else(|| "the topology server".to_owned());
    let cluster = &check.cluster;
    let key = check.key.as_deref().unwrap_or("its key");
    let see = format!("MultigresCluster {cluster} registers it; see its {t} condition");
    match &check.outcome {
        Ok(state) => {
            let registered = match state {
                CellState::Registered => Computed::yes(
                    t,
                    "Registered",
                    match &check.wanted {
                        Some(w) => format!(
                            "The Cell record {key} lists servers {} and root {}.",
                            w.server_addresses.join(", "),
                            w.root
                        ),
                        None => format!("The Cell record {key} is as the spec says."),
                    },
                ),
                CellState::Missing => Computed::no(
                    t,
                    "NotRegistered",
                    format!("No Cell record at {key} yet. {see}."),
                ),
                CellState::Differs { stored } => Computed::no(
                    t,
                    "OutOfDate",
                    format!(
                        "The Cell record {key} lists servers {} and root {}; the spec wants {} and root {}. {see}.",
                        stored.server_addresses.join(", "),
                        stored.root,
                        check
                            .wanted
                            .as_ref()
                            .map(|w| w.server_addresses.join(", "))
                            .unwrap_or_default(),
                        check
                            .wanted
                            .as_ref()
                            .map(|w| w.root.as_str())
                            .unwrap_or_default(),
                    ),
                ),
            };
            vec![conditions::reachable(&server, None), registered]
        }
        Err(e @ Error::ClusterNotFound { .. }) => {
            let message = format!(
                "{e} (label {}); the topology settings come from it.",
                labels::CLUSTER
            );
            vec![
                Computed::unknown(r, "ClusterNotFound", message.clone()),
                Computed::unknown(t, "ClusterNotFound", message),
            ]
        }
        Err(e @ Error::ServerNotReady { .. }) => {
            let message = format!("Waiting before connecting to {server}: {e}.");
            vec![
                Computed::unknown(r, "TopoServerNotReady", message.clone()),
                Computed::unknown(t, "TopoServerNotReady", message),
            ]
        }
        Err(Error::Topo(e)) => {
            let registered = if e.is_transient() {
                Computed::unknown(
                    t,
                    "NotChecked",
                    format!("Cannot check the record while {server} is unreachable (see {r})."),
                )
            } else {
                Computed::no(t, "RecordUnreadable", ErrorChain(e).to_string())
            };
            vec![conditions::reachable(&server, Some(e)), registered]
        }
        Err(Error::Connect(ConnectError::Topo(e))) => vec![
            conditions::reachable(&server, Some(e)),
            Computed::unknown(
                t,
                "NotChecked",
                format!("Cannot connect to {server} (see {r})."),
            ),
        ],
        Err(e) => vec![
            Computed::unknown(r, "NotChecked", format!("Not checked: {}", ErrorChain(e))),
            Computed::unknown(
                t,
                "NotChecked",
                format!(
                    "Not checked: {}. See the {t} condition of MultigresCluster {cluster}.",
                    ErrorChain(e)
                ),
            ),
        ],
    }
}

/// What deleting a Cell means for its record.
#[derive(Debug, Clone)]
pub enum CellDeletion<'a> {
    /// Let the Cell go without touching the record, for this reason.
    Keep(&'static str),
    /// The cell left this cluster: remove its record first.
    Deregister(&'a MultigresCluster),
}

/// Pure: what to do with the record of the deleted Cell `name` of `cluster` (`None` when the
/// cluster no longer exists).
pub fn deletion_plan<'a>(name: &str, cluster: Option<&'a MultigresCluster>) -> CellDeletion<'a> {
    let Some(cluster) = cluster else {
        return CellDeletion::Keep("its MultigresCluster is gone, and removed its records itself");
    };
    if cluster.meta().deletion_timestamp.is_some() {
        return CellDeletion::Keep(
            "its MultigresCluster is being deleted and removes its records itself",
        );
    }
    if cluster.spec.cells.iter().any(|c| c.name.as_str() == name) {
        return CellDeletion::Keep("its MultigresCluster still has the cell, so the record stays");
    }
    if cluster
        .spec
        .topology_pruning
        .as_ref()
        .and_then(|p| p.enabled)
        == Some(false)
    {
        return CellDeletion::Keep("topology pruning is disabled on its MultigresCluster");
    }
    CellDeletion::Deregister(cluster)
}

async fn finalize(
    cell: &Cell,
    cluster: Option<&MultigresCluster>,
    ctx: &Context,
) -> Result<Action, Error> {
    let Some(release) = finalizer::remove(cell.meta().finalizers.as_deref()) else {
        return Ok(Action::await_change());
    };
    let name = cell.spec.name.as_str();
    let reference = cell.object_ref(&());
    match deletion_plan(name, cluster) {
        CellDeletion::Keep(why) => {
            tracing::debug!(cell = %full_name(cell), why, "releasing the Cell without touching its record");
        }
        CellDeletion::Deregister(cluster) => {
            let notice = match deregister(cell, cluster, ctx).await {
                Ok((target, removed)) => Notice::normal(
                    "TopologyDeregistered",
                    if removed {
                        format!("Removed cell {name} from {}", target.describe())
                    } else {
                        format!(
                            "No record of cell {name} held by this cluster in {}",
                            target.describe()
                        )
                    },
                ),
                Err((target, error)) => {
                    let namespace = cluster.namespace().unwrap_or_default();
                    let topo_server = valid(
                        &ctx.topo_servers,
                        &namespace,
                        &names::global_topo_server(&cluster.name_any()),
                    );
                    let server = target.as_ref().map_or(deletion::ServerState::Present, |t| {
                        deletion::server_state(&t.server, topo_server.as_ref())
                    });
                    let since = cell.meta().deletion_timestamp.as_ref().map(|t| t.0);
                    let timeout = ctx.settings.unreachable_timeout;
                    match deletion::after_failure(&server, since, Timestamp::now(), timeout) {
                        Verdict::Retry => return Err(Error::Cleanup(Box::new(error))),
                        Verdict::GiveUp { why } => Notice::warning(
                            "TopologyCleanupSkipped",
                            format!(
                                "Released the finalizer without removing the record of cell {name}: {why}. Last error: {}. If the server comes back, remove the record with etcdctl.",
                                ErrorChain(&error)
                            ),
                        ),
                    }
                }
            };
            ctx.kit
                .publish_event(&notice.event("Deregister"), &reference)
                .await;
        }
    }
    writes::patch_json(&ctx.writer, cell, release)
        .await
        .map_err(Error::Finalizer)?;
    Ok(Action::await_change())
}

async fn deregister(
    cell: &Cell,
    cluster: &MultigresCluster,
    ctx: &Context,
) -> Result<(Target, bool), (Option<Target>, Error)> {
    let namespace = cell.namespace().unwrap_or_default();
    let target =
        Target::new(cluster, &cell.spec.global_topo_server).map_err(|e| (None, e.into()))?;
    let store = match ctx.connections.open(&namespace, &target).await {
        Ok(store) => store,
        Err(error) => return Err((Some(target), error.into())),
    };
    let owner = owner_id(&namespace, &cluster.name_any());
    match store
        .release(&RecordRef::cell(cell.spec.name.as_str()), &owner)
        .await
    {
        Ok(removed) => Ok((target, removed)),
        Err(error) => Err((Some(target), error.into())),
    }
}

#[cfg(test)]
mod tests;
