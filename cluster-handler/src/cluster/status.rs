//! The status of a MultigresCluster, aggregated from its children: pure, no client.
//!
//! The cluster-handler owns `observedGeneration`, `phase`, `message`, `cells`, `databases`,
//! `resolvedTemplates` and the conditions `Available`, `Progressing`, `Degraded` and `Paused`; other
//! handlers own other condition types on the same object, which are left alone.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use multigres_api::labels::{self, CLUSTER};
use multigres_api::names;
use multigres_api::v1alpha1::{
    Cell, CellName, CellStatusSummary, DatabaseName, DatabaseStatusSummary, MultigresCluster,
    MultigresClusterStatus, Phase, ResolvedTemplates, TableGroup, TableGroupSpec, TopoServer,
};
use multigres_common::conditions::{self, DesiredCondition, FALSE, TRUE};
use multigres_common::events::Notice;

use super::build::Children;
use crate::children::{aggregate, healths};

/// Condition: queries are served: every cell's gateways are ready, and so is every shard of
/// every database (a gateway answers at once, but without a ready shard it has nothing to route
/// to). A shard is ready once it has a primary: until multiorch elects one, the gateway answers
/// `no writable primary is currently available`.
pub const AVAILABLE: &str = "Available";
/// Condition: the children are converging towards the spec.
pub const PROGRESSING: &str = "Progressing";
/// Condition: the spec cannot be realized, or a child reports it is degraded.
pub const DEGRADED: &str = "Degraded";
/// Condition, present while the cluster is paused ([`labels::PAUSED`]).
pub const PAUSED: &str = "Paused";
/// Condition, present while the cluster hibernates ([`labels::HIBERNATE`]): True once every
/// child reports no pod left.
pub const HIBERNATED: &str = "Hibernated";
/// Condition types this handler writes.
pub const OWNED_CONDITIONS: [&str; 5] = [AVAILABLE, PROGRESSING, DEGRADED, PAUSED, HIBERNATED];

/// Reason when a child reports Degraded.
pub const CHILD_DEGRADED: &str = "ChildDegraded";

/// The cluster's children as cached, by name: only valid objects controlled by the cluster.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    /// TopoServers by name.
    pub topo_servers: BTreeMap<String, TopoServer>,
    /// Cells by name.
    pub cells: BTreeMap<String, Cell>,
    /// TableGroups by name.
    pub table_groups: BTreeMap<String, TableGroup>,
}

/// How far the reconcile got.
#[derive(Debug)]
pub enum Outcome<'a> {
    /// The children were applied.
    Applied(&'a Children),
    /// The spec cannot be realized until the user changes something; no child was changed.
    Blocked {
        /// CamelCase reason, e.g. `TemplateNotFound`.
        reason: &'static str,
        /// What is wrong and how to fix it.
        message: String,
    },
}

/// The status to write and what changed.
#[derive(Debug, Clone, PartialEq)]
pub struct Computed {
    /// The fields this handler owns (conditions: only its own types).
    pub status: MultigresClusterStatus,
    /// The fields of `status` that differ from what is stored; empty when nothing does.
    pub changed: Vec<&'static str>,
    /// Events to publish for the transitions.
    pub notices: Vec<Notice>,
}

/// The status of `cluster` after `outcome`, given its cached children; `now` stamps conditions
/// whose status changes.
pub fn compute(
    cluster: &MultigresCluster,
    outcome: &Outcome<'_>,
    observed: &Observed,
    resolved_templates: ResolvedTemplates,
    now: Timestamp,
) -> Computed {
    let generation = cluster.metadata.generation;
    let name = cluster.name_any();
    let current = cluster.status.clone().unwrap_or_default();

    let cells = cell_summaries(cluster, &name, observed);
    let databases = database_summaries(&table_groups(outcome, observed), observed);
    let (phase, message, degraded) = phase(outcome, observed);
    let available = available(cluster, &name, &cells, &databases);
    let progressing = progressing(&phase, outcome, &message);
    let degraded = match degraded {
        Some((reason, text)) => (TRUE, reason, text),
        None => (FALSE, "AsExpected", "No component is degraded".to_owned()),
    };

    let mut merged = current.conditions.clone();
    let conditions_changed = set_conditions(
        &mut merged,
        [
            (AVAILABLE, available),
            (PROGRESSING, progressing),
            (DEGRADED, degraded),
        ],
        generation,
        now,
    );
    let conditions_changed = conditions_changed
        | set_paused(&mut merged, cluster, now)
        | set_hibernated(&mut merged, cluster, phase, now);
    let notices = crate::notice::transitions(
        current.phase,
        conditions::find_condition(&current.conditions, DEGRADED),
        phase,
        &message,
        conditions::find_condition(&merged, DEGRADED),
    );
    merged.retain(|c| OWNED_CONDITIONS.contains(&c.type_.as_str()));

    let status = MultigresClusterStatus {
        observed_generation: generation,
        conditions: merged,
        phase: Some(phase),
        message: Some(message),
        cells,
        databases,
        resolved_templates: Some(resolved_templates),
        ..MultigresClusterStatus::default()
    };
    let changed = changed_fields(&current, &status, conditions_changed);
    Computed {
        status,
        changed,
        notices,
    }
}

/// A condition's status, reason and message.
type Verdict = (&'static str, &'static str, String);

/// The table groups the databases are counted from: the ones applied now, else (blocked) the
/// ones cached.
fn table_groups<'a>(
    outcome: &Outcome<'a>,
    observed: &'a Observed,
) -> Vec<(String, &'a TableGroupSpec)> {
    match outcome {
        Outcome::Applied(children) => children
            .table_groups
            .iter()
            .map(|tg| (tg.name_any(), &tg.spec))
            .collect(),
        Outcome::Blocked { .. } => observed
            .table_groups
            .iter()
            .map(|(n, tg)| (n.clone(), &tg.spec))
            .collect(),
    }
}

/// `Available` of cluster `name`: true once every cell and every shard is ready; else which
/// ones hold it back.
fn available(
    cluster: &MultigresCluster,
    name: &str,
    cells: &BTreeMap<CellName, CellStatusSummary>,
    databases: &BTreeMap<DatabaseName, DatabaseStatusSummary>,
) -> Verdict {
    let ready_cells = cells.values().filter(|c| c.ready).count();
    let (ready_shards, total_shards) = databases.values().fold((0, 0), |(ready, total), db| {
        (ready + db.ready_shards, total + db.total_shards)
    });
    if cells.is_empty() {
        (FALSE, "NoCells", "The cluster has no cells".to_owned())
    } else if ready_cells < cells.len() {
        let waiting: Vec<&str> = cells
            .iter()
            .filter(|(_, c)| !c.ready)
            .map(|(n, _)| n.as_str())
            .collect();
        (
            FALSE,
            "CellsNotReady",
            format!(
                "{ready_cells}/{} cells ready; not ready: {}",
                cells.len(),
                crate::notice::list(&waiting, 5)
            ),
        )
    } else if total_shards == 0 || ready_shards < total_shards {
        let waiting: Vec<String> = databases
            .iter()
            .filter(|(_, db)| db.ready_shards < db.total_shards)
            .map(|(name, db)| format!("{name} ({}/{})", db.ready_shards, db.total_shards))
            .collect();
        (
            FALSE,
            "ShardsNotReady",
            format!(
                "The gateways are ready, but {ready_shards}/{total_shards} shards are: queries \
                 are not served until every shard is; waiting for: {}; each Shard's Available \
                 condition names the pods holding it back (kubectl describe shards -n {} -l \
                 {CLUSTER}={name})",
                crate::notice::list(&waiting.iter().map(String::as_str).collect::<Vec<_>>(), 5),
                cluster.namespace().unwrap_or_default(),
            ),
        )
    } else {
        (
            TRUE,
            "AllCellsAndShardsReady",
            format!(
                "All {} cells and {total_shards} shards are ready",
                cells.len()
            ),
        )
    }
}

/// `Progressing` in `phase` after `outcome`, with the phase's `message`.
fn progressing(phase: &Phase, outcome: &Outcome<'_>, message: &str) -> Verdict {
    match (phase, outcome) {
        (_, Outcome::Blocked { reason, .. }) => (FALSE, *reason, message.to_owned()),
        (Phase::Healthy, _) => (
            FALSE,
            "Ready",
            "Every component has reached the desired state".to_owned(),
        ),
        (Phase::Degraded, _) => (FALSE, CHILD_DEGRADED, message.to_owned()),
        (Phase::Hibernated, _) => (FALSE, "Hibernated", message.to_owned()),
        _ => (TRUE, "Reconciling", message.to_owned()),
    }
}

/// Sets each condition of `wanted` on `conditions`, at `generation`; true when any changed.
fn set_conditions(
    conditions: &mut Vec<Condition>,
    wanted: [(&'static str, Verdict); 3],
    generation: Option<i64>,
    now: Timestamp,
) -> bool {
    let mut changed = false;
    for (type_, (status, reason, message)) in wanted {
        changed |= conditions::set_condition(
            conditions,
            &DesiredCondition {
                type_,
                status,
                reason,
                message: &message,
                observed_generation: generation,
            },
            now,
        );
    }
    changed
}

/// Sets the [`PAUSED`] condition while `cluster` is paused and drops it otherwise; returns
/// whether the conditions changed.
fn set_paused(conditions: &mut Vec<Condition>, cluster: &MultigresCluster, now: Timestamp) -> bool {
    if !labels::paused(cluster.annotations()) {
        let before = conditions.len();
        conditions.retain(|c| c.type_ != PAUSED);
        return conditions.len() != before;
    }
    let message = format!(
        "annotation {} is \"true\": no workload of this cluster is applied, restarted, scaled or \
         deleted, and no child is deleted; spec changes reach the children and wait there. \
         Remove the annotation (kubectl multigres resume) to apply them",
        labels::PAUSED
    );
    conditions::set_condition(
        conditions,
        &DesiredCondition {
            type_: PAUSED,
            status: TRUE,
            reason: "PausedByAnnotation",
            message: &message,
            observed_generation: cluster.metadata.generation,
        },
        now,
    )
}

/// Sets the [`HIBERNATED`] condition while `cluster` hibernates (True once the children's
/// `phase` is Hibernated) and drops it otherwise; returns whether the conditions changed.
fn set_hibernated(
    conditions: &mut Vec<Condition>,
    cluster: &MultigresCluster,
    phase: Phase,
    now: Timestamp,
) -> bool {
    if !labels::hibernated(cluster.annotations()) {
        let before = conditions.len();
        conditions.retain(|c| c.type_ != HIBERNATED);
        return conditions.len() != before;
    }
    let switch = labels::HIBERNATE;
    let (status, reason, message) = if phase == Phase::Hibernated {
        (
            TRUE,
            "Hibernated",
            format!(
                "annotation {switch} is \"true\": no pod of this cluster's data plane runs; its \
                 volumes, topology, backups and Secrets are kept. Remove the annotation \
                 (kubectl multigres wake) to start it again"
            ),
        )
    } else {
        (
            FALSE,
            "Hibernating",
            format!("annotation {switch} is \"true\": the cluster's pods are stopping"),
        )
    };
    conditions::set_condition(
        conditions,
        &DesiredCondition {
            type_: HIBERNATED,
            status,
            reason,
            message: &message,
            observed_generation: cluster.metadata.generation,
        },
        now,
    )
}

/// The fields of `status` that differ from the `current` ones (`conditions` as the merge
/// told: `conditions_changed`).
fn changed_fields(
    current: &MultigresClusterStatus,
    status: &MultigresClusterStatus,
    conditions_changed: bool,
) -> Vec<&'static str> {
    [
        ("conditions", conditions_changed),
        (
            "observedGeneration",
            current.observed_generation != status.observed_generation,
        ),
        ("phase", current.phase != status.phase),
        ("message", current.message != status.message),
        ("cells", current.cells != status.cells),
        ("databases", current.databases != status.databases),
        (
            "resolvedTemplates",
            current.resolved_templates != status.resolved_templates,
        ),
    ]
    .into_iter()
    .filter_map(|(field, differs)| differs.then_some(field))
    .collect()
}

/// One summary per cell of the spec: ready when its handler reports it Available at its
/// current generation.
fn cell_summaries(
    cluster: &MultigresCluster,
    name: &str,
    observed: &Observed,
) -> BTreeMap<CellName, CellStatusSummary> {
    cluster
        .spec
        .cells
        .iter()
        .map(|c| {
            let child = observed.cells.get(&names::cell(name, c.name.as_str()));
            let status = child.and_then(|cell| {
                cell.status
                    .as_ref()
                    .filter(|s| s.observed_generation == cell.metadata.generation)
            });
            let summary = CellStatusSummary {
                ready: status.is_some_and(|s| conditions::is_true(&s.conditions, AVAILABLE)),
                gateway_replicas: status.and_then(|s| s.gateway_replicas).unwrap_or(0),
            };
            (c.name.clone(), summary)
        })
        .collect()
}

/// Shard counts per database: every shard of the table groups, and the ready ones as each
/// TableGroup reports at its current generation.
fn database_summaries(
    table_groups: &[(String, &TableGroupSpec)],
    observed: &Observed,
) -> BTreeMap<DatabaseName, DatabaseStatusSummary> {
    let mut out: BTreeMap<DatabaseName, DatabaseStatusSummary> = BTreeMap::new();
    for (name, spec) in table_groups {
        let summary = out.entry(spec.database_name.clone()).or_default();
        summary.total_shards += i32::try_from(spec.shards.len()).unwrap_or(i32::MAX);
        let ready = observed.table_groups.get(name).and_then(|tg| {
            tg.status
                .as_ref()
                .filter(|s| s.observed_generation == tg.metadata.generation)
                .and_then(|s| s.ready_shards)
        });
        summary.ready_shards += ready.unwrap_or(0);
    }
    out
}

/// The phase, its message, and the Degraded reason and message if degraded.
fn phase(
    outcome: &Outcome<'_>,
    observed: &Observed,
) -> (Phase, String, Option<(&'static str, String)>) {
    let children = match outcome {
        Outcome::Blocked { reason, message } => {
            return (
                Phase::Degraded,
                message.clone(),
                Some((*reason, message.clone())),
            );
        }
        Outcome::Applied(children) => children,
    };
    let healths = [
        healths(&children.topo_servers, &observed.topo_servers),
        healths(&children.cells, &observed.cells),
        healths(&children.table_groups, &observed.table_groups),
    ]
    .concat();
    let aggregate = aggregate(&healths, "components");
    let degraded = aggregate
        .degraded
        .then(|| (CHILD_DEGRADED, aggregate.message.clone()));
    (aggregate.phase, aggregate.message, degraded)
}
