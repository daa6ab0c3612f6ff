//! The condition types this handler owns and how they are merged into a status it writes.
//!
//! Several handlers write conditions on the same object (server-side apply keyed by `type`),
//! so a status this handler applies carries only its own condition types, with their
//! transition times kept from what was observed.

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use multigres_api::v1alpha1::Phase;

pub use multigres_common::conditions::{Computed, FALSE, TRUE};

/// The workload serves: every replica is ready at the current generation.
pub const AVAILABLE: &str = "Available";
/// MultigresCluster: the external gateway endpoint exists and gateways behind it are ready.
pub const GATEWAY_EXTERNAL_READY: &str = "GatewayExternalReady";
/// MultigresCluster: the external admin web endpoint exists and multiadmin-web is ready.
pub const ADMIN_WEB_EXTERNAL_READY: &str = "AdminWebExternalReady";

/// `desired` as full conditions, transition times taken from `observed` for those whose status
/// did not change. Only the desired types are returned: the others belong to other handlers.
pub fn merge(
    observed: &[Condition],
    desired: &[Computed],
    generation: Option<i64>,
    now: Timestamp,
) -> Vec<Condition> {
    let mut all = observed.to_vec();
    for cond in desired {
        cond.set_on(&mut all, generation, now);
    }
    all.retain(|c| desired.iter().any(|d| d.type_ == c.type_));
    all
}

/// Condition, present while the object's cluster is paused (annotation
/// `multigres.com/paused`, passed on by the cluster-handler).
pub const PAUSED: &str = "Paused";

/// The [`PAUSED`] condition of a paused `what` (`shard`, `cell`, ...).
pub fn paused(what: &str) -> Computed {
    Computed::new(
        PAUSED,
        TRUE,
        "PausedByAnnotation",
        format!(
            "the cluster's annotation {} is \"true\": no workload of this {what} is applied, \
             restarted, scaled, grown or deleted; changes wait until it is removed",
            multigres_api::labels::PAUSED
        ),
    )
}

/// Condition, present while the object's cluster hibernates (annotation
/// `multigres.com/hibernate`, passed on by the cluster-handler).
pub const HIBERNATED: &str = "Hibernated";

/// How far a hibernating `what` (`shard`, `cell`, ...) has got with `running` of its pods still
/// there: the [`HIBERNATED`] condition, True once none is, and the phase, Hibernated then and
/// Progressing before.
pub fn hibernation(what: &str, running: i32) -> (Computed, Phase) {
    let switch = multigres_api::labels::HIBERNATE;
    if running > 0 {
        let message = format!(
            "the cluster's annotation {switch} is \"true\": {running} pods of this {what} are \
             still stopping; its volumes stay"
        );
        return (
            Computed::new(HIBERNATED, FALSE, "Hibernating", message),
            Phase::Progressing,
        );
    }
    let message = format!(
        "the cluster's annotation {switch} is \"true\": every pod of this {what} is stopped, \
         its volumes, topology records, backups and Secrets are kept; remove the annotation \
         (kubectl multigres wake) to start them again on the same volumes"
    );
    (
        Computed::new(HIBERNATED, TRUE, "Hibernated", message),
        Phase::Hibernated,
    )
}

/// `Available` reason while pods of the object are on nodes that stopped reporting (see
/// [`crate::unready::node_not_reporting`]).
pub const NODES_NOT_REPORTING: &str = "NodesNotReporting";

/// The phase shown by `kubectl get`: Degraded when the spec cannot be realised or pods were
/// lost with nodes that stopped reporting (`silent`), Healthy when available, Progressing
/// otherwise.
pub fn phase(available: bool, problem: Option<&str>, silent: &BTreeSet<String>) -> Phase {
    match (problem, available) {
        (Some(_), _) => Phase::Degraded,
        (None, _) if !silent.is_empty() => Phase::Degraded,
        (None, true) => Phase::Healthy,
        (None, false) => Phase::Progressing,
    }
}

/// `message` led by the `pods` lost with the nodes in `silent`, when there are any: what makes
/// the object Degraded comes first.
pub fn with_lost_pods(pods: &str, silent: &BTreeSet<String>, message: String) -> String {
    if silent.is_empty() {
        return message;
    }
    let nodes: Vec<&str> = silent.iter().map(String::as_str).collect();
    format!(
        "{pods} lost with their nodes, which stopped reporting: {}; {message}",
        nodes.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    #[test]
    fn merge_keeps_times_and_drops_foreign_types() {
        let observed = vec![
            Condition {
                type_: AVAILABLE.into(),
                status: TRUE.into(),
                reason: "AllReady".into(),
                message: "3/3".into(),
                observed_generation: Some(1),
                last_transition_time: Time(at(10)),
            },
            Condition {
                type_: "TopologyRegistered".into(),
                status: TRUE.into(),
                reason: "Registered".into(),
                message: "ok".into(),
                observed_generation: Some(1),
                last_transition_time: Time(at(11)),
            },
        ];
        let desired = [
            Computed::new(AVAILABLE, TRUE, "AllReady", "3/3"),
            Computed::new("RollingUpdate", FALSE, "UpToDate", "done"),
        ];
        let merged = merge(&observed, &desired, Some(1), at(50));
        assert_eq!(merged.len(), 2);
        assert_eq!(merged[0], observed[0], "unchanged condition kept as is");
        assert_eq!(merged[1].type_, "RollingUpdate");
        assert_eq!(merged[1].last_transition_time, Time(at(50)));
        assert!(merged.iter().all(|c| c.type_ != "TopologyRegistered"));
    }

    #[test]
    fn phase_prefers_problems() {
        let none = BTreeSet::new();
        assert_eq!(phase(true, Some("bad"), &none), Phase::Degraded);
        assert_eq!(phase(true, None, &none), Phase::Healthy);
        assert_eq!(phase(false, None, &none), Phase::Progressing);
        let lost = BTreeSet::from(["node-b".to_owned()]);
        assert_eq!(phase(true, None, &lost), Phase::Degraded);
    }

    #[test]
    fn hibernation_is_done_once_no_pod_is_left() {
        let (stopping, phase) = hibernation("shard", 2);
        assert_eq!(
            (stopping.status, stopping.reason, phase),
            (FALSE, "Hibernating", Phase::Progressing)
        );
        assert!(stopping.message.contains("2 pods of this shard"));
        let (done, phase) = hibernation("shard", 0);
        assert_eq!(
            (done.status, done.reason, phase),
            (TRUE, "Hibernated", Phase::Hibernated)
        );
        assert!(done.message.contains("kubectl multigres wake"));
    }
}
