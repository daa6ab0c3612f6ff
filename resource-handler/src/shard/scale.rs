//! Scale-ups that wait for the volumes of scaled-away replicas to go, scale-downs that wait
//! for the primary to hand over, and the claims a scale-down leaves behind.
//!
//! Pool StatefulSets always retain the claims of scaled-away replicas: under `whenScaled:
//! Delete` the StatefulSet controller would have the claim deleted with the pod, while the
//! consensus cohort may still count that pod, and scaling back up would then bring the member
//! back empty. This handler deletes such a claim itself once the pod is gone and out of the
//! cohort ([`scaled_away`]). A scale-up that reaches the ordinal of a claim still on its way out
//! would find it stale and skip the pod for good (the StatefulSet controller watches no claims),
//! so the StatefulSet is held below the first such ordinal and raised once the claim is gone.
//!
//! A scale-down removes the highest ordinals, whichever pod is the primary. When one of them is
//! the primary and a pod that stays could take over, the StatefulSet is held just above the
//! primary's ordinal (replicas above it go) until it has handed over (see
//! [`super::switchover`]); then the scale-down continues. Pods whose role is unknown are not
//! protected, as in a rollout where nothing serves.
//!
//! Once the data-handler publishes the shard's consensus cohort (`status.cohort`), a
//! scale-down also removes one pod at a time, and each only while every pod that stays is a
//! healthy cohort member and no pod removed before is still in the cohort: removing a pod
//! while the one standby a commit waits for is outside the cohort blocks every write, and
//! multiorch drops one member per cycle. The pod leaves gracefully (its multipooler announces
//! the shutdown, and multiorch removes it from the cohort).

use std::sync::Arc;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::ResourceExt;
use multigres_api::v1alpha1::CohortStatus;

use super::rollout::{PodView, Role};
use crate::conditions::{Computed, TRUE};

/// Condition type: a pool scale-down waits for the consensus cohort.
pub const SCALE_DOWN: &str = "ScaleDown";

/// A pool StatefulSet applied with fewer replicas than wanted, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldScaleUp {
    /// The pool StatefulSet.
    pub statefulset: String,
    /// Replicas applied for now.
    pub replicas: i32,
    /// Replicas the spec asks for.
    pub wanted: i32,
    /// The claim of a scaled-away replica that is still on its way out.
    pub claim: String,
}

impl HeldScaleUp {
    /// What a user reads on the Shard's Available condition.
    pub fn message(&self) -> String {
        format!(
            "{} stays at {} of {} replicas until PersistentVolumeClaim {} of a scaled-away \
             replica is deleted (whenScaled: Delete)",
            self.statefulset, self.replicas, self.wanted, self.claim
        )
    }
}

/// Whether `claim` is about to be deleted: marked for deletion, or handed to a scaled-away pod
/// (the only claims the StatefulSet controller gives a Pod owner: claims of StatefulSets
/// written before they always retained them).
pub fn leaving(claim: &PersistentVolumeClaim) -> bool {
    claim.metadata.deletion_timestamp.is_some()
        || claim.owner_references().iter().any(|o| o.kind == "Pod")
}

/// Lowers the replicas of `desired` below the first new ordinal whose claim is still leaving.
///
/// `current` is the StatefulSet as it is now (`None`: not created yet); `lookup` finds a claim
/// of its namespace by name (the names the StatefulSet controller gives them).
pub fn hold(
    desired: &mut StatefulSet,
    current: Option<&StatefulSet>,
    lookup: impl Fn(&str) -> Option<Arc<PersistentVolumeClaim>>,
) -> Option<HeldScaleUp> {
    let replicas = |set: &StatefulSet| set.spec.as_ref().and_then(|s| s.replicas);
    let wanted = replicas(desired)?;
    let from = current.and_then(replicas).unwrap_or(0);
    let statefulset = desired.name_any();
    let templates: Vec<String> = desired
        .spec
        .as_ref()
        .and_then(|s| s.volume_claim_templates.as_ref())
        .into_iter()
        .flatten()
        .map(ResourceExt::name_any)
        .collect();
    let (ordinal, claim) = (from..wanted).find_map(|ordinal| {
        templates.iter().find_map(|template| {
            let claim = format!("{template}-{statefulset}-{ordinal}");
            lookup(&claim)
                .is_some_and(|c| leaving(&c))
                .then_some((ordinal, claim))
        })
    })?;
    desired.spec.as_mut()?.replicas = Some(ordinal);
    Some(HeldScaleUp {
        statefulset,
        replicas: ordinal,
        wanted,
        claim,
    })
}

/// How a scale-down that removes the primary goes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handover {
    /// A Ready replica that stays can take over: held, and the primary is asked to hand over.
    Requested,
    /// Pods stay, but none is a Ready replica: held, until one can take over.
    NoReadyReplica,
    /// No pod stays: not held; the primary goes, and
    /// multiorch fails over if any pooler is left.
    Unavailable,
}

/// A pool scale-down that removes the primary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScaleDown {
    /// The pool StatefulSet.
    pub statefulset: String,
    /// Replicas it has now.
    pub from: i32,
    /// Replicas applied for now.
    pub replicas: i32,
    /// Replicas the spec asks for.
    pub wanted: i32,
    /// The primary among the pods the scale-down removes.
    pub primary: String,
    /// What happens to it.
    pub handover: Handover,
}

impl ScaleDown {
    /// Why the primary hands over, for conditions and events.
    pub fn purpose(&self) -> String {
        format!(
            "{} scales down from {} to {} replicas",
            self.statefulset, self.from, self.wanted
        )
    }
}

/// The replicas `desired` asks for and `current` has, when that is fewer.
fn scaling_down(desired: &StatefulSet, current: Option<&StatefulSet>) -> Option<(i32, i32)> {
    let replicas = |set: &StatefulSet| set.spec.as_ref().and_then(|s| s.replicas);
    let wanted = replicas(desired)?;
    let from = current.and_then(replicas)?;
    (wanted < from).then_some((wanted, from))
}

/// Holds a scale-down of `desired` above the primary's ordinal while it has not handed over.
///
/// `current` is the StatefulSet as it is now; `pods` are all pool pods of the shard (any of
/// them may take over).
pub fn hold_down(
    desired: &mut StatefulSet,
    current: Option<&StatefulSet>,
    pods: &[PodView],
) -> Option<ScaleDown> {
    let (wanted, from) = scaling_down(desired, current)?;
    let statefulset = desired.name_any();
    let leaving = |p: &PodView| p.set == statefulset && p.ordinal().is_some_and(|o| o >= wanted);
    let (ordinal, primary) = pods
        .iter()
        .filter(|p| p.role == Role::Primary && !p.terminating && leaving(p))
        .filter_map(|p| Some((p.ordinal()?, p)))
        .min_by_key(|(ordinal, _)| *ordinal)?;
    let staying: Vec<&PodView> = pods
        .iter()
        .filter(|p| !leaving(p) && !p.terminating)
        .collect();
    let handover = if staying.is_empty() {
        Handover::Unavailable
    } else if staying.iter().any(|p| p.can_take_over()) {
        Handover::Requested
    } else {
        Handover::NoReadyReplica
    };
    let applied = match handover {
        Handover::Unavailable => wanted,
        Handover::Requested | Handover::NoReadyReplica => (ordinal + 1).min(from),
    };
    desired.spec.as_mut()?.replicas = Some(applied);
    Some(ScaleDown {
        statefulset: statefulset.clone(),
        from,
        replicas: applied,
        wanted,
        primary: primary.name.clone(),
        handover,
    })
}

/// What a scale-down held for the consensus cohort waits for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CohortWait {
    /// Pods that stay are not healthy cohort members (yet).
    Outside(Vec<String>),
    /// Pods removed before are still cohort members: multiorch has not dropped them yet.
    Leaving(Vec<String>),
    /// The cohort would keep fewer members than the policy needs, so multiorch could not drop
    /// the removed one; the primary leads without being a member, and once it hands over,
    /// multiorch adds it.
    LeaderOutside {
        /// The primary.
        leader: String,
        /// Members the cohort would keep.
        left: usize,
        /// Members the policy needs.
        required: i32,
    },
    /// The cohort would keep fewer members than the policy needs.
    TooFew {
        /// Members the cohort would keep.
        left: usize,
        /// Members the policy needs.
        required: i32,
    },
}

/// A pool scale-down held, or stepped one pod at a time, for the consensus cohort.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CohortHold {
    /// The pool StatefulSet.
    pub statefulset: String,
    /// Replicas applied for now.
    pub replicas: i32,
    /// Replicas the spec asks for.
    pub wanted: i32,
    /// Why it is not lower; `None` while it steps down one pod at a time.
    pub waiting: Option<CohortWait>,
}

impl CohortHold {
    /// What a user reads on the Shard's `ScaleDown` condition.
    pub fn message(&self) -> String {
        let (statefulset, replicas, wanted) = (&self.statefulset, self.replicas, self.wanted);
        match &self.waiting {
            None => format!(
                "{statefulset} scales down to {wanted} replicas one pod at a time (now \
                 {replicas}), each once the cohort has let the last one go"
            ),
            Some(CohortWait::Outside(pods)) => format!(
                "{statefulset} stays at {replicas} replicas (of {wanted}) until every pod that \
                 stays is a healthy cohort member (not yet: {}): removing a pod now could take \
                 away the standby every commit waits for",
                pods.join(", ")
            ),
            Some(CohortWait::Leaving(pods)) => format!(
                "{statefulset} stays at {replicas} replicas (of {wanted}) until multiorch has \
                 dropped the removed {} from the cohort",
                pods.join(", ")
            ),
            Some(CohortWait::LeaderOutside {
                leader,
                left,
                required,
            }) => format!(
                "{statefulset} stays at {replicas} replicas (of {wanted}): the cohort would keep \
                 {left} members and needs {required}, and the primary {leader} leads without \
                 being one; it is asked to hand over, so that multiorch adds it"
            ),
            Some(CohortWait::TooFew { left, required }) => format!(
                "{statefulset} stays at {replicas} replicas (of {wanted}): the cohort would keep \
                 {left} members and the durability policy needs {required}, so multiorch could \
                 not drop the removed pod; keep at least {required} pool pods, or change the \
                 durability policy"
            ),
        }
    }
}

/// The primaries that lead without being cohort members while a scale-down needs the cohort to
/// keep them (see [`CohortWait::LeaderOutside`]), with why.
pub fn leaders_to_hand_over(holds: &[CohortHold]) -> Vec<(String, String)> {
    holds
        .iter()
        .filter_map(|h| match &h.waiting {
            Some(CohortWait::LeaderOutside { leader, .. }) => Some((
                leader.clone(),
                format!(
                    "before {} scales down to {} replicas: it leads without being a cohort \
                     member, and the cohort must keep it",
                    h.statefulset, h.wanted
                ),
            )),
            _ => None,
        })
        .collect()
}

/// The `ScaleDown` condition while scale-downs wait for the cohort or step one pod at a time;
/// absent otherwise.
pub fn condition(holds: &[CohortHold]) -> Option<Computed> {
    if holds.is_empty() {
        return None;
    }
    let reason = if holds.iter().any(|h| h.waiting.is_some()) {
        "WaitingForCohort"
    } else {
        "OnePodAtATime"
    };
    let message: Vec<String> = holds.iter().map(CohortHold::message).collect();
    Some(Computed::new(SCALE_DOWN, TRUE, reason, message.join("; ")))
}

/// Why removing the pods `removed` would leave the cohort with fewer members than an
/// `AT_LEAST_N` policy needs (multiorch refuses to drop a member then); `None` when it would not,
/// or for other policies.
fn too_few(cohort: &CohortStatus, removed: impl Fn(&str) -> bool) -> Option<CohortWait> {
    let required = cohort.required?;
    let by_count = cohort
        .policy
        .as_deref()
        .is_some_and(|p| p.starts_with("AT_LEAST_"));
    let members = cohort.pods.iter().filter(|(_, p)| p.member).map(|(n, _)| n);
    let left = members.filter(|name| !removed(name)).count();
    if !by_count || i32::try_from(left).is_ok_and(|l| l >= required) {
        return None;
    }
    let leader = cohort.leader.as_ref();
    match leader.and_then(|l| cohort.pods.get(l).map(|p| (l, p.member))) {
        Some((leader, false)) => Some(CohortWait::LeaderOutside {
            leader: leader.clone(),
            left,
            required,
        }),
        _ => Some(CohortWait::TooFew { left, required }),
    }
}

/// Holds or steps a scale-down of `desired` for the shard's published `cohort` (see the module
/// documentation); `None` when there is no cohort, no scale-down, or nothing to hold.
///
/// `current` is the StatefulSet as it is now; `pods` are all pool pods of the shard.
pub fn hold_for_cohort(
    desired: &mut StatefulSet,
    current: Option<&StatefulSet>,
    pods: &[PodView],
    cohort: Option<&CohortStatus>,
) -> Option<CohortHold> {
    let cohort = cohort?;
    let (wanted, from) = scaling_down(desired, current)?;
    let statefulset = desired.name_any();
    let ordinal = |name: &str| -> Option<i32> {
        name.strip_prefix(statefulset.as_str())?
            .strip_prefix('-')?
            .parse()
            .ok()
    };
    let members = cohort
        .pods
        .iter()
        .filter(|(_, p)| p.member)
        .map(|(name, _)| name)
        .chain(&cohort.missing);
    let leaving: Vec<String> = members
        .filter(|name| ordinal(name).is_some_and(|o| o >= from))
        .cloned()
        .collect();
    let next = from - 1;
    let outside: Vec<String> = pods
        .iter()
        .filter(|p| !p.terminating && !p.in_cohort)
        .filter(|p| p.set != statefulset || p.ordinal().is_some_and(|o| o < next))
        .map(|p| p.name.clone())
        .collect();
    let (applied, waiting) = if !outside.is_empty() {
        (from, Some(CohortWait::Outside(outside)))
    } else if !leaving.is_empty() {
        (from, Some(CohortWait::Leaving(leaving)))
    } else if let Some(short) = too_few(cohort, |name| ordinal(name).is_some_and(|o| o >= next)) {
        (from, Some(short))
    } else if next > wanted {
        (next, None)
    } else {
        return None;
    };
    desired.spec.as_mut()?.replicas = Some(applied);
    Some(CohortHold {
        statefulset,
        replicas: applied,
        wanted,
        waiting,
    })
}

/// Claims of a pool's scaled-away replicas under `whenScaled: Delete`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScaledAway {
    /// Claims to delete now, by name, with their UIDs.
    pub delete: Vec<(String, String)>,
    /// Claims kept for now, each with the pod the consensus cohort still counts.
    pub waiting: Vec<(String, String)>,
}

/// Which claims of StatefulSet `statefulset` (claim templates `templates`, now at `replicas`)
/// belong to scaled-away replicas and may go: a claim is deleted only once its pod is gone and
/// no longer a member of the published `cohort` (a member without a pod still counts toward
/// every quorum, and scaling back up brings it back with its data). Without a published
/// cohort, as soon as the pod is gone.
pub fn scaled_away<'a>(
    statefulset: &str,
    templates: &[String],
    replicas: i32,
    claims: impl IntoIterator<Item = &'a PersistentVolumeClaim>,
    pods: &[PodView],
    cohort: Option<&CohortStatus>,
) -> ScaledAway {
    let mut found = ScaledAway::default();
    for claim in claims {
        if claim.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let name = claim.name_any();
        let ordinal = templates.iter().find_map(|template| {
            name.strip_prefix(template.as_str())?
                .strip_prefix('-')?
                .strip_prefix(statefulset)?
                .strip_prefix('-')?
                .parse::<i32>()
                .ok()
        });
        let Some(ordinal) = ordinal.filter(|o| *o >= replicas) else {
            continue;
        };
        let pod = format!("{statefulset}-{ordinal}");
        if pods.iter().any(|p| p.name == pod) {
            continue;
        }
        if cohort.is_some_and(|c| c.takes_part(&pod) || c.missing.contains(&pod)) {
            found.waiting.push((name, pod));
        } else {
            found
                .delete
                .push((name, claim.metadata.uid.clone().unwrap_or_default()));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(replicas: i32) -> StatefulSet {
        serde_yaml::from_str(&format!(
            "metadata: {{name: pool}}\n\
             spec:\n  replicas: {replicas}\n  serviceName: pool\n  selector: {{}}\n  \
             template: {{}}\n  volumeClaimTemplates: [{{metadata: {{name: data}}}}]\n"
        ))
        .unwrap()
    }

    fn claim(yaml: &str) -> Arc<PersistentVolumeClaim> {
        Arc::new(serde_yaml::from_str(yaml).unwrap())
    }

    /// Looks claims up by name among `claims`.
    fn among(
        claims: &[Arc<PersistentVolumeClaim>],
    ) -> impl Fn(&str) -> Option<Arc<PersistentVolumeClaim>> + '_ {
        |name| claims.iter().find(|c| c.name_any() == name).cloned()
    }

    const OWNED_BY_POD: &str = "metadata:\n  name: data-pool-2\n  ownerReferences:\n  - \
                                {apiVersion: v1, kind: Pod, name: pool-2, uid: u2}\n";
    const TERMINATING: &str =
        "metadata: {name: data-pool-1, deletionTimestamp: '2026-01-01T00:00:00Z'}\n";
    const IN_USE: &str = "metadata: {name: data-pool-1}\n";

    #[test]
    fn a_scale_up_stops_below_the_first_claim_still_leaving() {
        let mut desired = set(3);
        let claims = [claim(IN_USE), claim(OWNED_BY_POD)];
        let held = hold(&mut desired, Some(&set(1)), among(&claims));
        assert_eq!(
            held,
            Some(HeldScaleUp {
                statefulset: "pool".into(),
                replicas: 2,
                wanted: 3,
                claim: "data-pool-2".into(),
            })
        );
        assert_eq!(desired.spec.unwrap().replicas, Some(2));
        assert!(held.unwrap().message().contains("data-pool-2"));

        let mut desired = set(3);
        let held = hold(&mut desired, Some(&set(1)), among(&[claim(TERMINATING)]));
        assert_eq!(held.map(|h| h.replicas), Some(1), "held where it is");
    }

    #[test]
    fn nothing_is_held_without_a_leaving_claim_or_without_a_scale_up() {
        let mut desired = set(3);
        assert_eq!(
            hold(&mut desired, Some(&set(1)), among(&[claim(IN_USE)])),
            None
        );
        assert_eq!(desired.spec.unwrap().replicas, Some(3));

        let mut desired = set(1);
        let claims = [claim(OWNED_BY_POD), claim(TERMINATING)];
        assert_eq!(
            hold(&mut desired, Some(&set(3)), among(&claims)),
            None,
            "scale-down"
        );
        let mut desired = set(2);
        assert_eq!(
            hold(&mut desired, Some(&set(2)), among(&claims)),
            None,
            "claims of ordinals already running belong to their pods"
        );
    }

    #[test]
    fn a_new_statefulset_waits_for_claims_of_an_earlier_one() {
        let mut desired = set(3);
        let held = hold(&mut desired, None, among(&[claim(TERMINATING)]));
        assert_eq!(held.map(|h| h.replicas), Some(1));
    }

    fn member(name: &str, role: Role) -> PodView {
        PodView::ready(name, role)
    }

    #[test]
    fn a_scale_down_is_held_above_the_primary_until_it_hands_over() {
        let mut pods = vec![
            member("pool-0", Role::Replica),
            member("pool-1", Role::Primary),
            member("pool-2", Role::Replica),
        ];
        let mut desired = set(1);
        let down = hold_down(&mut desired, Some(&set(3)), &pods).unwrap();
        assert_eq!(
            down,
            ScaleDown {
                statefulset: "pool".into(),
                from: 3,
                replicas: 2,
                wanted: 1,
                primary: "pool-1".into(),
                handover: Handover::Requested,
            },
            "pool-2 goes; pool-1 stays until pool-0 is the primary"
        );
        assert_eq!(desired.spec.unwrap().replicas, Some(2));
        assert_eq!(down.purpose(), "pool scales down from 3 to 1 replicas");

        // pool-0 not Ready: nobody can take over yet, still held, nothing requested.
        pods[0].ready = false;
        let mut desired = set(1);
        let down = hold_down(&mut desired, Some(&set(2)), &pods).unwrap();
        assert_eq!(
            (down.replicas, down.handover),
            (2, Handover::NoReadyReplica)
        );

        // Handed over: the scale-down goes on.
        pods[0].ready = true;
        pods[0].role = Role::Primary;
        pods[1].role = Role::Replica;
        let mut desired = set(1);
        assert_eq!(hold_down(&mut desired, Some(&set(2)), &pods), None);
        assert_eq!(desired.spec.unwrap().replicas, Some(1));
    }

    #[test]
    fn a_pod_of_another_pool_can_take_over() {
        let pods = [
            member("pool-0", Role::Primary),
            member("other-0", Role::Replica),
        ];
        let mut desired = set(0);
        let down = hold_down(&mut desired, Some(&set(1)), &pods).unwrap();
        assert_eq!((down.replicas, down.handover), (1, Handover::Requested));
    }

    #[test]
    fn without_anyone_to_take_over_the_scale_down_goes_on() {
        let pods = [member("pool-0", Role::Primary)];
        let mut desired = set(0);
        let down = hold_down(&mut desired, Some(&set(1)), &pods).unwrap();
        assert_eq!((down.replicas, down.handover), (0, Handover::Unavailable));
        assert_eq!(desired.spec.unwrap().replicas, Some(0));
    }

    #[test]
    fn scale_downs_of_replicas_or_of_unknown_roles_are_not_held() {
        let pods = [
            member("pool-0", Role::Primary),
            member("pool-1", Role::Replica),
        ];
        let mut desired = set(1);
        assert_eq!(hold_down(&mut desired, Some(&set(2)), &pods), None);
        let unknown = [
            member("pool-0", Role::Unknown),
            member("pool-1", Role::Unknown),
        ];
        assert_eq!(hold_down(&mut desired, Some(&set(2)), &unknown), None);
        assert_eq!(desired.spec.unwrap().replicas, Some(1));
        let mut terminating = member("pool-1", Role::Primary);
        terminating.terminating = true;
        let pods = [member("pool-0", Role::Replica), terminating];
        let mut desired = set(1);
        assert_eq!(
            hold_down(&mut desired, Some(&set(2)), &pods),
            None,
            "already going"
        );
        let mut desired = set(3);
        assert_eq!(
            hold_down(&mut desired, Some(&set(2)), &pods),
            None,
            "scale-up"
        );
    }

    fn cohort(members: &[&str], missing: &[&str]) -> CohortStatus {
        use multigres_api::v1alpha1::{CohortPod, Replication};
        CohortStatus {
            pods: members
                .iter()
                .map(|m| {
                    let pod = CohortPod {
                        member: true,
                        replication: Replication::Streaming,
                        lag_mebibytes: None,
                    };
                    ((*m).to_owned(), pod)
                })
                .collect(),
            missing: missing.iter().map(|m| (*m).to_owned()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn with_a_cohort_a_scale_down_removes_one_pod_at_a_time() {
        let pods = [
            member("pool-0", Role::Primary),
            member("pool-1", Role::Replica),
            member("pool-2", Role::Replica),
            member("pool-3", Role::Replica),
        ];
        let all = cohort(&["pool-0", "pool-1", "pool-2", "pool-3"], &[]);
        let mut desired = set(1);
        let hold = hold_for_cohort(&mut desired, Some(&set(4)), &pods, Some(&all)).unwrap();
        assert_eq!((hold.replicas, &hold.waiting), (3, &None));
        assert_eq!(desired.spec.unwrap().replicas, Some(3));
        assert!(hold.message().contains("one pod at a time"));
        let stepping = condition(std::slice::from_ref(&hold)).unwrap();
        assert_eq!(
            (stepping.type_, stepping.reason),
            (SCALE_DOWN, "OnePodAtATime")
        );
        assert_eq!(condition(&[]), None);

        // pool-3 went, but the cohort still lists it: wait for multiorch to drop it.
        let mut desired = set(1);
        let hold = hold_for_cohort(&mut desired, Some(&set(3)), &pods[..3], Some(&all)).unwrap();
        assert_eq!(
            (hold.replicas, hold.waiting.clone()),
            (3, Some(CohortWait::Leaving(vec!["pool-3".into()])))
        );
        assert!(hold.message().contains("dropped the removed pool-3"));
        let gone = cohort(&["pool-0", "pool-1", "pool-2"], &["pool-3"]);
        let mut desired = set(1);
        let hold = hold_for_cohort(&mut desired, Some(&set(3)), &pods[..3], Some(&gone));
        assert_eq!(
            hold.map(|h| h.replicas),
            Some(3),
            "still a member, without a pod"
        );

        // Dropped: the last step is not held.
        let left = cohort(&["pool-0", "pool-1", "pool-2"], &[]);
        let mut desired = set(2);
        assert_eq!(
            hold_for_cohort(&mut desired, Some(&set(3)), &pods[..3], Some(&left)),
            None
        );
        assert_eq!(desired.spec.unwrap().replicas, Some(2));
    }

    #[test]
    fn a_scale_down_waits_for_every_pod_that_stays_to_be_a_member() {
        let mut pods = vec![
            member("pool-0", Role::Primary),
            member("pool-1", Role::Replica),
            member("pool-2", Role::Replica),
        ];
        pods[1].in_cohort = false;
        let all = cohort(&["pool-0", "pool-2"], &[]);
        let mut desired = set(2);
        let hold = hold_for_cohort(&mut desired, Some(&set(3)), &pods, Some(&all)).unwrap();
        assert_eq!(
            (hold.replicas, hold.waiting.clone()),
            (3, Some(CohortWait::Outside(vec!["pool-1".into()])))
        );
        assert!(hold.message().contains("(not yet: pool-1)"));
        assert_eq!(condition(&[hold]).unwrap().reason, "WaitingForCohort");
        assert_eq!(desired.spec.unwrap().replicas, Some(3));

        // The pod about to go need not be a member; without a cohort nothing is held.
        pods[1].in_cohort = true;
        pods[2].in_cohort = false;
        let mut desired = set(2);
        assert_eq!(
            hold_for_cohort(&mut desired, Some(&set(3)), &pods, Some(&all)),
            None
        );
        let mut desired = set(2);
        assert_eq!(
            hold_for_cohort(&mut desired, Some(&set(3)), &pods, None),
            None
        );
    }

    #[test]
    fn a_scale_down_never_leaves_the_cohort_below_the_policy() {
        use multigres_api::v1alpha1::{CohortPod, Replication};
        let pods = [
            member("pool-0", Role::Replica),
            member("pool-1", Role::Primary),
            member("pool-2", Role::Replica),
        ];
        // Seen on real pods: pool-1 leads a rule whose cohort is {pool-0, pool-2}.
        let mut led = cohort(&["pool-0", "pool-2"], &[]);
        led.policy = Some("AT_LEAST_2".into());
        led.required = Some(2);
        led.leader = Some("pool-1".into());
        led.pods.insert(
            "pool-1".into(),
            CohortPod {
                member: false,
                replication: Replication::Primary,
                lag_mebibytes: None,
            },
        );
        let mut desired = set(2);
        let hold = hold_for_cohort(&mut desired, Some(&set(3)), &pods, Some(&led)).unwrap();
        assert_eq!(
            hold.waiting,
            Some(CohortWait::LeaderOutside {
                leader: "pool-1".into(),
                left: 1,
                required: 2
            })
        );
        assert_eq!(hold.replicas, 3);
        assert!(
            hold.message().contains("asked to hand over"),
            "{}",
            hold.message()
        );
        let asked = leaders_to_hand_over(&[hold]);
        assert_eq!(asked.len(), 1);
        assert_eq!(asked[0].0, "pool-1");

        // A cohort of two under AT_LEAST_2 cannot lose a member at all.
        let mut two = cohort(&["pool-0", "pool-1"], &[]);
        two.policy = Some("AT_LEAST_2".into());
        two.required = Some(2);
        two.leader = Some("pool-0".into());
        let mut desired = set(1);
        let hold = hold_for_cohort(&mut desired, Some(&set(2)), &pods[..2], Some(&two)).unwrap();
        assert_eq!(
            (hold.replicas, hold.waiting.clone()),
            (
                2,
                Some(CohortWait::TooFew {
                    left: 1,
                    required: 2
                })
            )
        );
        assert!(hold.message().contains("keep at least 2 pool pods"));
        assert!(leaders_to_hand_over(&[hold]).is_empty());
    }

    #[test]
    fn a_scaled_away_claim_goes_only_once_its_pod_is_gone_and_out_of_the_cohort() {
        let templates = ["data".to_owned()];
        let claims = [
            claim("metadata: {name: data-pool-0, uid: u0}"),
            claim("metadata: {name: data-pool-1, uid: u1}"),
            claim("metadata: {name: data-pool-2, uid: u2}"),
            claim("metadata: {name: data-pool-3, uid: u3}"),
            claim(
                "metadata: {name: data-pool-4, uid: u4, deletionTimestamp: '2026-01-01T00:00:00Z'}",
            ),
            claim("metadata: {name: backup-pool-2, uid: b2}"),
            claim("metadata: {name: data-other-2, uid: o2}"),
        ];
        let pods = [
            member("pool-0", Role::Primary),
            member("pool-1", Role::Replica),
            {
                let mut leaving = member("pool-2", Role::Replica);
                leaving.terminating = true;
                leaving
            },
        ];
        let found = |cohort: Option<&CohortStatus>, pods: &[PodView]| {
            scaled_away(
                "pool",
                &templates,
                2,
                claims.iter().map(|c| &**c),
                pods,
                cohort,
            )
        };
        // Without a published cohort: as soon as the pod is gone (pool-2 still terminates).
        assert_eq!(
            found(None, &pods).delete,
            [("data-pool-3".to_owned(), "u3".to_owned())]
        );
        // pool-3 is still a member without a pod: kept until multiorch drops it.
        let counted = cohort(&["pool-0", "pool-1"], &["pool-3"]);
        let now = found(Some(&counted), &pods[..2]);
        assert_eq!(
            now.waiting,
            [("data-pool-3".to_owned(), "pool-3".to_owned())]
        );
        assert_eq!(
            now.delete,
            [("data-pool-2".to_owned(), "u2".to_owned())],
            "pool-2 is gone and not a member"
        );
        let dropped = cohort(&["pool-0", "pool-1"], &[]);
        assert_eq!(found(Some(&dropped), &pods[..2]).delete.len(), 2);
        assert!(found(Some(&dropped), &pods[..2]).waiting.is_empty());
    }
}
