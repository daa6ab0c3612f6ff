//! Ordered restarts of pool pods. Pool StatefulSets use the `OnDelete` update strategy, so a
//! pod template change reaches a pod only when the handler deletes it. This module decides,
//! from what is observed, which pod to restart next: one at a time, each only once every other
//! pod is Ready again, replicas first and the primary last, and never while it cannot tell
//! which pod is the primary. The primary is not restarted while a Ready replica could take
//! over: it is asked to hand over first (see [`super::switchover`]), and restarted once it is
//! a replica; only when no replica can take over is it restarted as the primary, as a
//! failover.
//!
//! Once the data-handler publishes the shard's consensus cohort (`status.cohort`), a Ready pod
//! is restarted (or the primary asked to hand over) only while every other pod is a healthy
//! cohort member (label `multigres.com/cohort=member`): a pod restarted last is Ready before
//! multiorch has re-added it, and restarting the next one in that window takes away the
//! standby every commit waits for. A recreated pod carries no label until it is read again,
//! so it counts as outside. Without a published cohort (the data-handler cannot call the
//! multipoolers, e.g. under `internalTLS`) restarts follow readiness alone.
//!
//! A template never lowers a hot-standby-sensitive setting below what the pods run: the
//! rendered file holds it (see [`multigres_api::postgres::standby`]), so a restart here never
//! starts a standby below its primary's values.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use multigres_api::labels::{
    COHORT, COHORT_MEMBER, HOT_STANDBY_SETTINGS, ROLE, SWITCHOVER_REQUESTED, USER_SWITCHOVER,
};
use multigres_api::postgres::standby::{self, StandbySettings};

/// The label the StatefulSet controller puts on each pod: the revision it was created from.
pub const REVISION_LABEL: &str = "controller-revision-hash";

/// A pod's database role, as the data-handler publishes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Primary,
    Replica,
    Unknown,
}

impl Role {
    /// Parses `PRIMARY`/`primary`, `REPLICA`/`replica`; anything else is unknown.
    pub fn parse(value: &str) -> Self {
        if value.eq_ignore_ascii_case("primary") {
            Role::Primary
        } else if value.eq_ignore_ascii_case("replica") {
            Role::Replica
        } else {
            Role::Unknown
        }
    }
}

/// What the planner needs to know about one pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodView {
    /// Name.
    pub name: String,
    /// UID, so a deletion hits only the pod that was planned.
    pub uid: String,
    /// StatefulSet the pod belongs to.
    pub set: String,
    /// Revision it runs (`controller-revision-hash`).
    pub revision: Option<String>,
    /// Ready condition is True.
    pub ready: bool,
    /// Being deleted.
    pub terminating: bool,
    /// Database role.
    pub role: Role,
    /// Its pending switchover request (the `multigres.com/switchover-requested` value).
    pub switchover: Option<String>,
    /// A healthy member of the consensus cohort, as its `multigres.com/cohort` label says.
    pub in_cohort: bool,
    /// A person asked for a switchover on it (annotation `multigres.com/switchover`).
    pub user_switchover: bool,
    /// Its node is cordoned: it is about to be drained.
    pub cordoned: bool,
    /// Its postgresql.conf restart fingerprint (from its template).
    pub config_hash: Option<String>,
    /// The hot-standby-sensitive settings it started with (its [`HOT_STANDBY_SETTINGS`]
    /// stamp; `None` before it is stamped).
    pub standby: Option<StandbySettings>,
}

impl PodView {
    /// Its StatefulSet ordinal (the number after the set's name).
    pub fn ordinal(&self) -> Option<i32> {
        self.name
            .strip_prefix(self.set.as_str())?
            .strip_prefix('-')?
            .parse()
            .ok()
    }

    /// Whether it could take over as the primary now: a Ready replica staying in place, on a
    /// node that is not being drained.
    pub fn can_take_over(&self) -> bool {
        self.role == Role::Replica && self.ready && !self.terminating && !self.cordoned
    }
}

#[cfg(test)]
impl PodView {
    /// A Ready pod `name` (`<set>-<ordinal>`) with `role`, a healthy cohort member, on a node
    /// that is not cordoned: the pod most tests start from.
    pub fn ready(name: &str, role: Role) -> PodView {
        PodView {
            name: name.into(),
            uid: format!("uid-{name}"),
            set: name.rsplit_once('-').unwrap().0.into(),
            revision: None,
            ready: true,
            terminating: false,
            role,
            switchover: None,
            in_cohort: true,
            user_switchover: false,
            cordoned: false,
            config_hash: None,
            standby: None,
        }
    }
}

/// What the planner needs to know about one pool StatefulSet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetView {
    /// Name.
    pub name: String,
    /// Revision new pods get (`status.updateRevision`).
    pub update_revision: Option<String>,
    /// The controller has observed the current spec (so `update_revision` is current).
    pub observed: bool,
    /// Pods it should have.
    pub replicas: i32,
}

/// Why no pod is restarted now although some run an old template.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Wait {
    /// A StatefulSet controller has not caught up with the latest template yet.
    SetNotObserved(String),
    /// A pod is going away (the last restart, or something else).
    PodTerminating(String),
    /// A pod the StatefulSet wants does not exist (yet).
    PodMissing { set: String, have: usize, want: i32 },
    /// No pod is known to be the primary while some pods serve.
    RolesUnknown,
    /// Several pods claim to be the primary.
    SeveralPrimaries(Vec<String>),
    /// An up-to-date pod is not Ready (yet).
    PodNotReady(String),
    /// The primary, the last outdated pod, is asked to hand over to a Ready replica first.
    Switchover(String),
    /// Pods other than the next one to restart are not healthy cohort members (yet).
    Cohort(Vec<String>),
    /// Restarts are supervised and the revisions `pending` are not released yet.
    Release { pending: String },
}

impl Wait {
    /// A sentence for the `RollingUpdate` condition.
    pub fn message(&self) -> String {
        match self {
            Wait::SetNotObserved(set) => {
                format!("waiting for the StatefulSet controller to observe {set}")
            }
            Wait::PodTerminating(pod) => format!("waiting for pod {pod} to terminate"),
            Wait::PodMissing { set, have, want } => {
                format!("waiting for {set} to have its {want} pods ({have} exist)")
            }
            Wait::RolesUnknown => "waiting for pod roles: no pod is known to be the primary, \
                so the restart order cannot be decided (roles come from the data-handler)"
                .to_owned(),
            Wait::SeveralPrimaries(pods) => format!(
                "waiting for pod roles to settle: {} all report PRIMARY",
                pods.join(", ")
            ),
            Wait::PodNotReady(pod) => format!("waiting for pod {pod} to be Ready"),
            Wait::Switchover(pod) => format!(
                "waiting for the primary {pod} to hand over to a replica before its restart"
            ),
            Wait::Cohort(pods) => format!(
                "waiting for {} to rejoin the Multigres cohort and stream from the primary \
                 (multiorch re-adds a restarted pod once it streams; the Shard's CohortHealthy \
                 condition says what is missing)",
                pods.join(", ")
            ),
            Wait::Release { pending } => format!(
                "restarts are supervised (multigres.com/restart-policy): the pool pods wait for a \
                 release of {pending}; run `kubectl multigres restart <cluster>` or annotate this \
                 Shard with multigres.com/release-restarts={pending}"
            ),
        }
    }

    /// A CamelCase reason for the `RollingUpdate` condition.
    pub fn reason(&self) -> &'static str {
        match self {
            Wait::RolesUnknown | Wait::SeveralPrimaries(_) => "WaitingForRoles",
            Wait::Switchover(_) => "WaitingForSwitchover",
            Wait::Cohort(_) => "WaitingForCohort",
            Wait::Release { .. } => "WaitingForRelease",
            Wait::SetNotObserved(_)
            | Wait::PodTerminating(_)
            | Wait::PodMissing { .. }
            | Wait::PodNotReady(_) => "WaitingForPods",
        }
    }
}

/// The next step of a rolling restart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Every pod runs the current template.
    UpToDate { pods: usize },
    /// Delete this pod so its StatefulSet recreates it from the current template (`primary`:
    /// the primary itself, with no replica to hand over to or no way to ask for it).
    Restart {
        pod: String,
        uid: String,
        primary: bool,
        outdated: usize,
        total: usize,
    },
    /// Nothing can be restarted safely now.
    Wait {
        wait: Wait,
        outdated: usize,
        total: usize,
    },
}

/// A pod's view, with its role from `roles` (the Shard status, keyed by pod name) or else
/// from its `multigres.com/role` label; `cordoned` tells whether a node is cordoned.
pub fn pod_view(
    pod: &Pod,
    roles: &BTreeMap<String, String>,
    cordoned: impl Fn(&str) -> bool,
) -> Option<PodView> {
    let set = pod
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == "StatefulSet")?
        .name
        .clone();
    let name = pod.name_any();
    let role = roles
        .get(&name)
        .or_else(|| pod.labels().get(ROLE))
        .map_or(Role::Unknown, |r| Role::parse(r));
    let ready = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    Some(PodView {
        uid: pod.uid().unwrap_or_default(),
        revision: pod.labels().get(REVISION_LABEL).cloned(),
        terminating: pod.metadata.deletion_timestamp.is_some(),
        switchover: pod.annotations().get(SWITCHOVER_REQUESTED).cloned(),
        in_cohort: pod.labels().get(COHORT).map(String::as_str) == Some(COHORT_MEMBER),
        user_switchover: pod.annotations().contains_key(USER_SWITCHOVER),
        config_hash: pod
            .annotations()
            .get(multigres_api::postgres::CONFIG_HASH_ANNOTATION)
            .cloned(),
        standby: pod
            .annotations()
            .get(HOT_STANDBY_SETTINGS)
            .and_then(|v| standby::parse_standby(v)),
        cordoned: pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .is_some_and(cordoned),
        set,
        name,
        ready,
        role,
    })
}

/// A StatefulSet's view.
pub fn set_view(sts: &StatefulSet) -> SetView {
    let status = sts.status.clone().unwrap_or_default();
    SetView {
        name: sts.name_any(),
        update_revision: status.update_revision,
        observed: match (sts.metadata.generation, status.observed_generation) {
            (Some(g), Some(o)) => o >= g,
            _ => false,
        },
        replicas: sts.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1),
    }
}

/// The revisions outdated pods wait for, one per StatefulSet, sorted: what a release names.
fn pending_revisions(
    sets: &[SetView],
    pods: &[&PodView],
    outdated: impl Fn(&PodView) -> bool,
) -> String {
    let mut revisions: Vec<&str> = sets
        .iter()
        .filter(|s| pods.iter().any(|p| p.set == s.name && outdated(p)))
        .filter_map(|s| s.update_revision.as_deref())
        .collect();
    revisions.sort_unstable();
    revisions.join(",")
}

/// Decides the next restart across all pools of one shard (the shard has one primary across
/// all of them). `cohort`: whether the shard's cohort is published, so Ready pods restart only
/// while every other pod is a healthy member. `released`: under supervised restarts, what the
/// Shard's release annotation names (`Some("")` when it has none); `None` when not supervised.
pub fn plan(sets: &[SetView], pods: &[PodView], cohort: bool, released: Option<&str>) -> Step {
    let by_set: BTreeMap<&str, &SetView> = sets.iter().map(|s| (s.name.as_str(), s)).collect();
    let mut pods: Vec<&PodView> = pods
        .iter()
        .filter(|p| by_set.contains_key(p.set.as_str()))
        .collect();
    pods.sort_by(|a, b| a.name.cmp(&b.name));
    let outdated = |p: &PodView| {
        let set = by_set[p.set.as_str()];
        set.update_revision.is_none() || p.revision != set.update_revision
    };
    let total = sets
        .iter()
        .map(|s| s.replicas.max(0) as usize)
        .sum::<usize>();
    let outdated_count = pods.iter().filter(|p| outdated(p)).count();
    let wait = |wait| Step::Wait {
        wait,
        outdated: outdated_count,
        total,
    };
    if let Some(set) = sets.iter().find(|s| !s.observed) {
        return wait(Wait::SetNotObserved(set.name.clone()));
    }
    if outdated_count == 0 {
        return Step::UpToDate { pods: pods.len() };
    }
    if let Some(released) = released {
        let pending = pending_revisions(sets, &pods, outdated);
        if released != pending {
            return wait(Wait::Release { pending });
        }
    }
    if let Some(p) = pods.iter().find(|p| p.terminating) {
        return wait(Wait::PodTerminating(p.name.clone()));
    }
    for set in sets {
        let have = pods.iter().filter(|p| p.set == set.name).count();
        if (have as i32) < set.replicas {
            return wait(Wait::PodMissing {
                set: set.name.clone(),
                have,
                want: set.replicas,
            });
        }
    }
    let primaries: Vec<&PodView> = pods
        .iter()
        .copied()
        .filter(|p| p.role == Role::Primary)
        .collect();
    if primaries.len() > 1 {
        return wait(Wait::SeveralPrimaries(
            primaries.iter().map(|p| p.name.clone()).collect(),
        ));
    }
    // With no pod serving there is no primary to protect, so order does not matter.
    if primaries.is_empty() && pods.iter().any(|p| p.ready) {
        return wait(Wait::RolesUnknown);
    }
    if let Some(p) = pods.iter().find(|p| !outdated(p) && !p.ready) {
        return wait(Wait::PodNotReady(p.name.clone()));
    }
    let restart = |p: &PodView| Step::Restart {
        pod: p.name.clone(),
        uid: p.uid.clone(),
        primary: p.role == Role::Primary,
        outdated: outdated_count,
        total,
    };
    // Outdated replicas that are not Ready first (restarting them costs no availability),
    // then the Ready ones, then the primary.
    let replicas = || {
        pods.iter()
            .filter(|p| outdated(p) && p.role != Role::Primary)
    };
    if let Some(p) = replicas().find(|p| !p.ready) {
        return restart(p);
    }
    let next = replicas().next().or(primaries.first());
    if let Some(next) = next.filter(|_| cohort) {
        let outside: Vec<String> = pods
            .iter()
            .filter(|p| p.name != next.name && !p.in_cohort)
            .map(|p| p.name.clone())
            .collect();
        if !outside.is_empty() {
            return wait(Wait::Cohort(outside));
        }
    }
    if let Some(p) = replicas().next() {
        return restart(p);
    }
    match primaries.first() {
        Some(primary) if pods.iter().any(|p| p.can_take_over()) => {
            wait(Wait::Switchover(primary.name.clone()))
        }
        Some(primary) => restart(primary),
        None => Step::UpToDate { pods: pods.len() },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(name: &str, revision: &str, replicas: i32) -> SetView {
        SetView {
            name: name.into(),
            update_revision: Some(revision.into()),
            observed: true,
            replicas,
        }
    }

    fn pod(name: &str, revision: &str, role: Role) -> PodView {
        PodView {
            revision: Some(revision.into()),
            ..PodView::ready(name, role)
        }
    }

    fn restarted(step: &Step) -> &str {
        match step {
            Step::Restart { pod, .. } => pod,
            other => panic!("expected a restart, got {other:?}"),
        }
    }

    #[test]
    fn supervised_restarts_wait_for_a_release_of_exactly_the_pending_revisions() {
        let sets = [set("pool-a", "pool-a-v2", 2), set("pool-b", "pool-b-v1", 1)];
        let pods = vec![
            pod("pool-a-0", "pool-a-v1", Role::Replica),
            pod("pool-a-1", "pool-a-v1", Role::Primary),
            pod("pool-b-0", "pool-b-v1", Role::Replica),
        ];
        let pending = || Wait::Release {
            pending: "pool-a-v2".into(),
        };
        for released in [Some(""), Some("pool-a-v1")] {
            let step = plan(&sets, &pods, false, released);
            assert!(
                matches!(&step, Step::Wait { wait, outdated: 2, .. } if *wait == pending()),
                "{step:?}"
            );
        }
        assert_eq!(pending().reason(), "WaitingForRelease");
        assert!(pending().message().contains("kubectl multigres restart"));
        assert_eq!(
            restarted(&plan(&sets, &pods, false, Some("pool-a-v2"))),
            "pool-a-0"
        );
        assert_eq!(restarted(&plan(&sets, &pods, false, None)), "pool-a-0");
        // Nothing outdated: nothing to release.
        let current = [set("pool-a", "pool-a-v1", 2), set("pool-b", "pool-b-v1", 1)];
        assert!(matches!(
            plan(&current, &pods, false, Some("")),
            Step::UpToDate { pods: 3 }
        ));
    }

    /// Applies the planner until everything is up to date, recreating each restarted pod at
    /// the new revision (Ready again) and handing a primary's role to the first replica that
    /// can take over when asked to, and returns the restart order.
    fn run_to_completion(sets: &[SetView], mut pods: Vec<PodView>) -> Vec<String> {
        let mut order = Vec::new();
        for _ in 0..20 {
            match plan(sets, &pods, false, None) {
                Step::UpToDate { .. } => return order,
                Step::Restart { pod: name, .. } => {
                    let p = pods.iter_mut().find(|p| p.name == name).unwrap();
                    let set = sets.iter().find(|s| s.name == p.set).unwrap();
                    p.revision = set.update_revision.clone();
                    order.push(name);
                }
                Step::Wait {
                    wait: Wait::Switchover(name),
                    ..
                } => {
                    let heir = pods.iter().position(|p| p.can_take_over()).unwrap();
                    pods[heir].role = Role::Primary;
                    let old = pods.iter_mut().find(|p| p.name == name).unwrap();
                    old.role = Role::Replica;
                }
                Step::Wait { wait, .. } => panic!("unexpected wait: {wait:?}"),
            }
        }
        panic!("did not converge: {order:?}");
    }

    #[test]
    fn replicas_restart_first_and_the_primary_last() {
        let sets = [set("pool-a", "v2", 3), set("pool-b", "v2", 2)];
        let pods = vec![
            pod("pool-a-0", "v1", Role::Primary),
            pod("pool-a-1", "v1", Role::Replica),
            pod("pool-a-2", "v1", Role::Replica),
            pod("pool-b-0", "v1", Role::Unknown),
            pod("pool-b-1", "v2", Role::Replica),
        ];
        assert_eq!(
            run_to_completion(&sets, pods),
            ["pool-a-1", "pool-a-2", "pool-b-0", "pool-a-0"]
        );
    }

    #[test]
    fn the_primary_hands_over_to_a_ready_replica_before_its_restart() {
        let sets = [set("pool-a", "v2", 2)];
        let mut pods = [
            pod("pool-a-0", "v1", Role::Primary),
            pod("pool-a-1", "v2", Role::Replica),
        ];
        let step = plan(&sets, &pods, false, None);
        assert_eq!(
            step,
            Step::Wait {
                wait: Wait::Switchover("pool-a-0".into()),
                outdated: 1,
                total: 2,
            }
        );
        let Step::Wait { wait, .. } = step else {
            unreachable!()
        };
        assert_eq!(wait.reason(), "WaitingForSwitchover");
        assert!(wait.message().contains("primary pool-a-0 to hand over"));
        // Handed over: the old primary is an outdated replica now, restarted as such.
        pods[0].role = Role::Replica;
        pods[1].role = Role::Primary;
        assert_eq!(
            plan(&sets, &pods, false, None),
            Step::Restart {
                pod: "pool-a-0".into(),
                uid: "uid-pool-a-0".into(),
                primary: false,
                outdated: 1,
                total: 2,
            }
        );
    }

    #[test]
    fn the_primary_restarts_as_such_when_no_replica_can_take_over() {
        let sets = [set("pool-a", "v2", 1)];
        let alone = [pod("pool-a-0", "v1", Role::Primary)];
        assert_eq!(
            plan(&sets, &alone, false, None),
            Step::Restart {
                pod: "pool-a-0".into(),
                uid: "uid-pool-a-0".into(),
                primary: true,
                outdated: 1,
                total: 1,
            },
            "a one-pod pool has nobody to hand over to"
        );
        // A replica without a known role cannot take over.
        let sets = [set("pool-a", "v2", 2)];
        let unknown = [
            pod("pool-a-0", "v1", Role::Primary),
            pod("pool-a-1", "v2", Role::Unknown),
        ];
        assert_eq!(restarted(&plan(&sets, &unknown, false, None)), "pool-a-0");
    }

    #[test]
    fn nothing_outdated_is_up_to_date() {
        let sets = [set("pool-a", "v1", 2)];
        let pods = [
            pod("pool-a-0", "v1", Role::Primary),
            pod("pool-a-1", "v1", Role::Unknown),
        ];
        assert_eq!(plan(&sets, &pods, false, None), Step::UpToDate { pods: 2 });
    }

    #[test]
    fn unknown_roles_block_while_pods_serve() {
        let sets = [set("pool-a", "v2", 2)];
        let mut pods = vec![
            pod("pool-a-0", "v1", Role::Unknown),
            pod("pool-a-1", "v1", Role::Replica),
        ];
        let step = plan(&sets, &pods, false, None);
        assert!(
            matches!(
                &step,
                Step::Wait {
                    wait: Wait::RolesUnknown,
                    outdated: 2,
                    total: 2
                }
            ),
            "{step:?}"
        );
        // Nothing serves: no primary to protect, restart in name order.
        for p in &mut pods {
            p.ready = false;
        }
        assert_eq!(restarted(&plan(&sets, &pods, false, None)), "pool-a-0");
    }

    #[test]
    fn each_restart_waits_for_the_previous_pod_to_be_ready() {
        let sets = [set("pool-a", "v2", 3)];
        let mut pods = vec![
            pod("pool-a-0", "v1", Role::Primary),
            pod("pool-a-1", "v2", Role::Replica),
            pod("pool-a-2", "v1", Role::Replica),
        ];
        pods[1].ready = false;
        assert_eq!(
            plan(&sets, &pods, false, None),
            Step::Wait {
                wait: Wait::PodNotReady("pool-a-1".into()),
                outdated: 2,
                total: 3
            }
        );
        pods[1].terminating = true;
        assert!(matches!(
            plan(&sets, &pods, false, None),
            Step::Wait {
                wait: Wait::PodTerminating(_),
                ..
            }
        ));
        let missing = [pods[0].clone(), pods[2].clone()];
        assert!(matches!(
            plan(&sets, &missing, false, None),
            Step::Wait {
                wait: Wait::PodMissing {
                    have: 2,
                    want: 3,
                    ..
                },
                ..
            }
        ));
    }

    #[test]
    fn a_broken_outdated_replica_goes_before_healthy_ones() {
        let sets = [set("pool-a", "v2", 3)];
        let mut pods = vec![
            pod("pool-a-0", "v1", Role::Primary),
            pod("pool-a-1", "v1", Role::Replica),
            pod("pool-a-2", "v1", Role::Replica),
        ];
        pods[2].ready = false;
        assert_eq!(restarted(&plan(&sets, &pods, false, None)), "pool-a-2");
    }

    #[test]
    fn stale_sets_and_several_primaries_wait() {
        let mut stale = set("pool-a", "v2", 2);
        stale.observed = false;
        let pods = [
            pod("pool-a-0", "v1", Role::Primary),
            pod("pool-a-1", "v1", Role::Primary),
        ];
        assert!(matches!(
            plan(&[stale], &pods, false, None),
            Step::Wait {
                wait: Wait::SetNotObserved(_),
                ..
            }
        ));
        let step = plan(&[set("pool-a", "v2", 2)], &pods, false, None);
        assert!(
            matches!(&step, Step::Wait { wait: Wait::SeveralPrimaries(p), .. } if p.len() == 2),
            "{step:?}"
        );
        assert_eq!(Wait::RolesUnknown.reason(), "WaitingForRoles");
    }

    #[test]
    fn roles_come_from_the_shard_status_then_the_pod_label() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "pool-a-0", "uid": "u",
                "labels": {"controller-revision-hash": "pool-a-abc", "multigres.com/role": "replica"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet",
                    "name": "pool-a", "uid": "s", "controller": true}],
            },
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        }))
        .unwrap();
        let view = pod_view(&pod, &BTreeMap::new(), |_| false).unwrap();
        assert_eq!((view.ordinal(), view.switchover), (Some(0), None));
        assert_eq!(
            (
                view.set.as_str(),
                view.revision.as_deref(),
                view.role,
                view.ready
            ),
            ("pool-a", Some("pool-a-abc"), Role::Replica, true)
        );
        let roles = BTreeMap::from([("pool-a-0".to_owned(), "PRIMARY".to_owned())]);
        assert_eq!(
            pod_view(&pod, &roles, |_| false).unwrap().role,
            Role::Primary
        );
    }

    #[test]
    fn a_restarted_pod_outside_the_cohort_holds_the_next_restart() {
        let sets = [set("pool-a", "v2", 3)];
        let mut pods = vec![
            pod("pool-a-0", "v1", Role::Primary),
            pod("pool-a-1", "v2", Role::Replica),
            pod("pool-a-2", "v1", Role::Replica),
        ];
        pods[1].in_cohort = false;
        let step = plan(&sets, &pods, true, None);
        let Step::Wait { wait, .. } = &step else {
            panic!("expected a wait, got {step:?}");
        };
        assert_eq!(wait, &Wait::Cohort(vec!["pool-a-1".into()]));
        assert_eq!(wait.reason(), "WaitingForCohort");
        assert!(wait.message().contains("pool-a-1"), "{}", wait.message());
        assert_eq!(
            restarted(&plan(&sets, &pods, false, None)),
            "pool-a-2",
            "without a published cohort, readiness decides"
        );
        pods[1].in_cohort = true;
        assert_eq!(restarted(&plan(&sets, &pods, true, None)), "pool-a-2");
    }

    #[test]
    fn the_primary_hands_over_only_once_every_other_pod_is_a_member() {
        let sets = [set("pool-a", "v2", 3)];
        let mut pods = vec![
            pod("pool-a-0", "v1", Role::Primary),
            pod("pool-a-1", "v2", Role::Replica),
            pod("pool-a-2", "v2", Role::Replica),
        ];
        pods[2].in_cohort = false;
        assert!(matches!(
            plan(&sets, &pods, true, None),
            Step::Wait {
                wait: Wait::Cohort(_),
                ..
            }
        ));
        pods[2].in_cohort = true;
        pods[0].in_cohort = false;
        assert_eq!(
            plan(&sets, &pods, true, None),
            Step::Wait {
                wait: Wait::Switchover("pool-a-0".into()),
                outdated: 1,
                total: 3
            },
            "the pod about to restart need not be a member itself"
        );
    }

    #[test]
    fn a_broken_replica_restarts_whatever_the_cohort() {
        let sets = [set("pool-a", "v2", 3)];
        let mut pods = vec![
            pod("pool-a-0", "v1", Role::Primary),
            pod("pool-a-1", "v1", Role::Replica),
            pod("pool-a-2", "v1", Role::Replica),
        ];
        pods[1].ready = false;
        pods[1].in_cohort = false;
        pods[2].in_cohort = false;
        assert_eq!(restarted(&plan(&sets, &pods, true, None)), "pool-a-1");
    }
}
