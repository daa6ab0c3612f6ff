//! What a drain may take from a shard: which replica pool pods its disruption budget lets go,
//! and the `Drain` condition that says, while pool pods sit on cordoned nodes, what the drain
//! waits for and what to do about it. Pure: the caller reads the Shard and its pods.

use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use multigres_api::v1alpha1::{CohortStatus, FAILURE_TOLERANT, Shard};

use super::rollout::{PodView, Role};
use crate::conditions::{Computed, TRUE};

/// Condition type: pool pods of the shard are on cordoned nodes.
pub const DRAIN: &str = "Drain";

/// Why a drain may or may not evict a replica pool pod now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Evictions {
    /// No cohort is published (the data-handler does not read it): one replica at a time.
    Unknown,
    /// Every pod takes part in commits and the shard survives losing one.
    Allowed,
    /// A pod does not take part in commits now: a commit may be waiting for the others.
    CohortNotWhole,
    /// Losing one pod would stop writes (`FailureTolerant` is not True).
    WouldStopWrites,
}

impl Evictions {
    /// What the published cohort and `FailureTolerant` of `shard` allow.
    pub fn of(shard: &Shard) -> Evictions {
        let Some(status) = shard.status.as_ref() else {
            return Evictions::Unknown;
        };
        let Some(cohort) = status.cohort.as_ref() else {
            return Evictions::Unknown;
        };
        let tolerant = status
            .conditions
            .iter()
            .any(|c| c.type_ == FAILURE_TOLERANT && c.status == TRUE);
        if !cohort.is_whole() {
            Evictions::CohortNotWhole
        } else if !tolerant {
            Evictions::WouldStopWrites
        } else {
            Evictions::Allowed
        }
    }

    /// Whether a replica may be evicted.
    pub fn allowed(self) -> bool {
        matches!(self, Evictions::Unknown | Evictions::Allowed)
    }
}

/// `pdb`, the replica budget of pool StatefulSet `set`: one of its replicas (of `pods`, the
/// shard's pool pods) at a time, none unless `evictions` are allowed. It is a `minAvailable`
/// count of the replicas there are: with `maxUnavailable` the disruption controller expects
/// the StatefulSet's whole scale, primary included, which this budget does not select, so it
/// would never allow an eviction.
pub fn replica_budget(
    pdb: &PodDisruptionBudget,
    set: &str,
    pods: &[PodView],
    evictions: Evictions,
) -> PodDisruptionBudget {
    let replicas = pods
        .iter()
        .filter(|p| p.set == set && p.role != Role::Primary)
        .count();
    let keep = replicas.saturating_sub(usize::from(evictions.allowed()));
    let mut pdb = pdb.clone();
    if let Some(spec) = pdb.spec.as_mut() {
        spec.max_unavailable = None;
        spec.min_available = Some(IntOrString::Int(i32::try_from(keep).unwrap_or(i32::MAX)));
    }
    pdb
}

/// The `Drain` condition while any of `pods` is on a cordoned node (none otherwise).
pub fn condition(
    pods: &[PodView],
    evictions: Evictions,
    cohort: Option<&CohortStatus>,
) -> Option<Computed> {
    let stranded: Vec<&PodView> = pods
        .iter()
        .filter(|p| p.cordoned && !p.terminating)
        .collect();
    if stranded.is_empty() {
        return None;
    }
    if let Some(primary) = stranded.iter().find(|p| p.role == Role::Primary) {
        return Some(Computed::new(
            DRAIN,
            TRUE,
            "PrimaryHandingOver",
            format!(
                "the primary {} is on a cordoned node: its eviction is refused until it has \
                 handed over to a replica on another node (see the Switchover condition); the \
                 cell's multiorch moves after that",
                primary.name
            ),
        ));
    }
    let names = stranded
        .iter()
        .map(|p| p.name.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    let summary = cohort.map_or(String::new(), |c| format!(" (cohort {})", c.summary));
    let (reason, message) = match evictions {
        Evictions::Unknown | Evictions::Allowed => (
            "EvictionsAllowed",
            format!(
                "{names} on cordoned nodes may be evicted, one pod at a time{summary}; a pod \
                 whose volume is bound to its node stays Pending until the node is uncordoned"
            ),
        ),
        Evictions::CohortNotWhole => (
            "WaitingForCohort",
            format!(
                "evicting {names} waits until every pool pod takes part in commits again \
                 (CohortHealthy){summary}: a commit may be waiting for the others"
            ),
        ),
        Evictions::WouldStopWrites => (
            "EvictionWouldStopWrites",
            format!(
                "{names} cannot be evicted: losing one pool pod would stop writes \
                 (FailureTolerant){summary}; add a pool pod (raise replicasPerCell) so the \
                 shard survives the drain, or uncordon the node"
            ),
        ),
    };
    Some(Computed::new(DRAIN, TRUE, reason, message))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(status: serde_json::Value) -> Shard {
        let mut shard: Shard =
            serde_yaml::from_str(include_str!("../../fixtures/shard.yaml")).unwrap();
        shard.status = serde_json::from_value(status).unwrap();
        shard
    }

    fn tolerant(status: &str) -> serde_json::Value {
        serde_json::json!({"type": FAILURE_TOLERANT, "status": status, "reason": "R",
            "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"})
    }

    fn whole() -> serde_json::Value {
        serde_json::json!({"summary": "2/2 AT_LEAST_2", "leader": "p-0", "pods": {
            "p-0": {"member": true, "replication": "Primary"},
            "p-1": {"member": true, "replication": "Streaming"},
        }})
    }

    #[test]
    fn replicas_may_be_evicted_only_while_the_shard_survives_losing_one() {
        let pdb: PodDisruptionBudget = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "pool"},
            "spec": {"selector": {"matchLabels": {"pool": "p"}}},
        }))
        .unwrap();
        // Three pods in set `p`, the primary among them, and one of another set.
        let pods = [
            pod("p-0", Role::Primary, false),
            pod("p-1", Role::Replica, false),
            pod("p-2", Role::Unknown, false),
            PodView {
                set: "q".into(),
                ..pod("q-0", Role::Replica, false)
            },
        ];
        let evictions = |status| Evictions::of(&shard(status));
        let limit = |status| {
            let spec = replica_budget(&pdb, "p", &pods, evictions(status))
                .spec
                .unwrap();
            assert_eq!(spec.max_unavailable, None);
            spec.min_available
        };
        // Of the two replicas of `p`, one must stay, or both.
        let one_may_go = Some(IntOrString::Int(1));
        let none_may_go = Some(IntOrString::Int(2));
        assert_eq!(limit(serde_json::Value::Null), one_may_go, "no status yet");
        assert_eq!(
            limit(serde_json::json!({})),
            one_may_go,
            "no cohort published"
        );
        let status =
            |cohort, conditions| serde_json::json!({"cohort": cohort, "conditions": conditions});
        assert_eq!(limit(status(whole(), vec![tolerant("True")])), one_may_go);
        assert_eq!(
            evictions(status(whole(), vec![tolerant("False")])),
            Evictions::WouldStopWrites
        );
        assert_eq!(limit(status(whole(), vec![tolerant("False")])), none_may_go);
        assert_eq!(
            evictions(status(whole(), vec![])),
            Evictions::WouldStopWrites,
            "tolerance unknown"
        );
        let mut part = whole();
        part["pods"]["p-1"]["replication"] = "NotStreaming".into();
        assert_eq!(
            evictions(status(part.clone(), vec![tolerant("True")])),
            Evictions::CohortNotWhole
        );
        assert_eq!(limit(status(part, vec![tolerant("True")])), none_may_go);
    }

    fn pod(name: &str, role: Role, cordoned: bool) -> PodView {
        PodView {
            cordoned,
            ..PodView::ready(name, role)
        }
    }

    #[test]
    fn the_condition_says_what_a_drain_waits_for_and_what_to_do() {
        let calm = [
            pod("p-0", Role::Primary, false),
            pod("p-1", Role::Replica, false),
        ];
        assert_eq!(condition(&calm, Evictions::Allowed, None), None);

        let primary = [
            pod("p-0", Role::Primary, true),
            pod("p-1", Role::Replica, false),
        ];
        let c = condition(&primary, Evictions::Allowed, None).unwrap();
        assert_eq!((c.type_, c.reason), (DRAIN, "PrimaryHandingOver"));
        assert!(c.message.contains("p-0"), "{}", c.message);

        let replica = [
            pod("p-0", Role::Primary, false),
            pod("p-1", Role::Replica, true),
        ];
        let cohort: CohortStatus = serde_json::from_value(whole()).unwrap();
        let allowed = condition(&replica, Evictions::Allowed, Some(&cohort)).unwrap();
        assert_eq!(allowed.reason, "EvictionsAllowed");
        assert!(allowed.message.contains("p-1") && allowed.message.contains("2/2 AT_LEAST_2"));
        let stop = condition(&replica, Evictions::WouldStopWrites, Some(&cohort)).unwrap();
        assert_eq!(stop.reason, "EvictionWouldStopWrites");
        assert!(stop.message.contains("replicasPerCell"), "{}", stop.message);
        let wait = condition(&replica, Evictions::CohortNotWhole, Some(&cohort)).unwrap();
        assert_eq!(wait.reason, "WaitingForCohort");
    }
}
