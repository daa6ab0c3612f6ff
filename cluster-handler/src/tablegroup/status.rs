//! The status of a TableGroup, aggregated from its Shards: pure, no client.
//!
//! A Shard counts as ready when the resource-handler reports it Healthy at its current
//! generation (its pods Ready and a primary known, so it serves SQL); the TableGroup is
//! Available when all of its shards are.

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;
use multigres_api::v1alpha1::{Phase, Shard, TableGroup, TableGroupStatus};
use multigres_common::conditions::{self, DesiredCondition, FALSE, TRUE};
use multigres_common::events::Notice;

use crate::children::{Health, aggregate, healths};

/// Condition: every shard is ready.
pub const AVAILABLE: &str = "Available";
/// Condition: the Shards cannot be applied, or one reports it is degraded.
pub const DEGRADED: &str = "Degraded";
/// Condition types this handler writes.
pub const OWNED_CONDITIONS: [&str; 2] = [AVAILABLE, DEGRADED];

/// How far the reconcile got.
#[derive(Debug)]
pub enum Outcome<'a> {
    /// The Shards were applied.
    Applied(&'a [Shard]),
    /// The Shards cannot be applied until something changes.
    Blocked {
        /// CamelCase reason.
        reason: &'static str,
        /// What is wrong.
        message: String,
    },
}

/// The status to write and what changed.
#[derive(Debug, Clone, PartialEq)]
pub struct Computed {
    /// The fields this handler owns.
    pub status: TableGroupStatus,
    /// The fields of `status` that differ from what is stored; empty when nothing does.
    pub changed: Vec<&'static str>,
    /// Events to publish for the transitions.
    pub notices: Vec<Notice>,
}

/// The status of `tg` after `outcome`, given the Shards it controls (by name).
pub fn compute(
    tg: &TableGroup,
    outcome: &Outcome<'_>,
    observed: &BTreeMap<String, Shard>,
    now: Timestamp,
) -> Computed {
    let generation = tg.metadata.generation;
    let current = tg.status.clone().unwrap_or_default();
    let total = tg.spec.shards.len();

    let (ready, phase, message, degraded) = match outcome {
        Outcome::Applied(desired) => {
            let healths = healths(desired, observed);
            let aggregate = aggregate(&healths, "shards");
            let degraded = aggregate
                .degraded
                .then(|| ("ShardDegraded", aggregate.message.clone()));
            (
                aggregate.healthy,
                aggregate.phase,
                aggregate.message,
                degraded,
            )
        }
        Outcome::Blocked { reason, message } => {
            let ready = observed
                .iter()
                .filter(|(name, shard)| {
                    crate::children::health(name, Some(*shard)).0 == Health::Healthy
                })
                .count();
            (
                ready,
                Phase::Degraded,
                message.clone(),
                Some((*reason, message.clone())),
            )
        }
    };

    let available = if total > 0 && ready == total {
        (
            TRUE,
            "AllShardsReady",
            format!("All {total} shards are ready"),
        )
    } else {
        (
            FALSE,
            "ShardsNotReady",
            format!("{ready}/{total} shards ready"),
        )
    };
    let degraded = match degraded {
        Some((reason, text)) => (TRUE, reason, text),
        None => (FALSE, "AsExpected", "No shard is degraded".to_owned()),
    };
    let mut merged = current.conditions.clone();
    let mut conditions_changed = false;
    for (type_, (status, reason, message)) in [(AVAILABLE, available), (DEGRADED, degraded)] {
        conditions_changed |= conditions::set_condition(
            &mut merged,
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
    let notices = crate::notice::transitions(
        current.phase,
        conditions::find_condition(&current.conditions, DEGRADED),
        phase,
        &message,
        conditions::find_condition(&merged, DEGRADED),
    );
    merged.retain(|c| OWNED_CONDITIONS.contains(&c.type_.as_str()));
    let count = |n: usize| Some(i32::try_from(n).unwrap_or(i32::MAX));
    let status = TableGroupStatus {
        observed_generation: generation,
        conditions: merged,
        phase: Some(phase),
        message: Some(message),
        ready_shards: count(ready),
        total_shards: count(total),
    };
    let changed = [
        ("conditions", conditions_changed),
        (
            "observedGeneration",
            current.observed_generation != status.observed_generation,
        ),
        ("phase", current.phase != status.phase),
        ("message", current.message != status.message),
        ("readyShards", current.ready_shards != status.ready_shards),
        ("totalShards", current.total_shards != status.total_shards),
    ]
    .into_iter()
    .filter_map(|(field, differs)| differs.then_some(field))
    .collect();
    Computed {
        status,
        changed,
        notices,
    }
}
