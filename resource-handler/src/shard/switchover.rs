//! Switchover requests: before the handler removes (scale-down) or restarts (rollout) the
//! primary pool pod on purpose, it asks for the primary to hand over to a replica, and waits.
//!
//! The handlers coordinate only through the Kubernetes API: the request is the pod annotation
//! `multigres.com/switchover-requested` (an RFC 3339 time that identifies it). The data-handler,
//! seeing it on a pod the topology says is the primary, has the pod's multipooler
//! `ResignLeadership` (writes drained, PostgreSQL restarted as a standby); multiorch then
//! promotes another pooler, and the role labels follow the topology. Once the pod is no longer
//! the primary, the rollout restarts it as a replica and the scale-down removes it. A request
//! still unanswered after [`RENEW`] is renewed (a new time), so the data-handler tries again;
//! a request no longer needed is withdrawn.
//!
//! A person asks for a switchover by annotating the primary pool pod with
//! `multigres.com/switchover` ([`user_requests`]): the handler turns it into the same request,
//! under the gates of a rollout (a Ready replica can take over; with a published cohort, every
//! other pod is a healthy member), and removes the annotation once another pod is the primary.
//!
//! Deciding is pure ([`needed`], [`changes`], [`condition`]); [`request`] writes.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::Patch;
use kube::runtime::events::EventType;
use multigres_api::labels::{SWITCHOVER_REQUESTED, USER_SWITCHOVER};
use multigres_common::apply::patch_params;
use multigres_common::telemetry::ErrorChain;
use serde_json::json;

use super::rollout::{PodView, Role, Step, Wait};
use super::scale::{Handover, ScaleDown};
use super::{Guard, NAME};
use crate::conditions::{Computed, FALSE, TRUE};
use crate::controller::Ctx;
use crate::sync::FIELD_MANAGER;

/// Condition type reporting a primary that must hand over before it goes.
pub const SWITCHOVER: &str = "Switchover";
/// How long a request may go unanswered before it is renewed.
pub const RENEW: Duration = Duration::from_secs(300);

/// The pods to ask to hand over, with why (for events): the primary a rollout waits for, and
/// the primaries held scale-downs wait for when a replica can take over.
pub fn needed(step: Option<&Step>, downs: &[ScaleDown]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    if let Some(Step::Wait {
        wait: Wait::Switchover(pod),
        ..
    }) = step
    {
        out.insert(
            pod.clone(),
            "before its restart for the new pod template".to_owned(),
        );
    }
    for down in downs.iter().filter(|d| d.handover == Handover::Requested) {
        out.insert(down.primary.clone(), format!("before {}", down.purpose()));
    }
    out
}

/// Hand-overs asked for outside a rollout or scale-down: by a person (annotation
/// `multigres.com/switchover`, see [`user_requests`]) or by a drain ([`drain_requests`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Requests {
    /// Primaries to ask to hand over now, with why.
    pub ask: BTreeMap<String, String>,
    /// Primaries whose hand-over waits, each with what it waits for.
    pub waiting: Vec<String>,
    /// Pods whose person's request is answered: a replica while another pod is the primary.
    pub answered: Vec<String>,
}

/// Reads the requests people put on `pods`. `cohort`: whether the shard's cohort is published (then every other pod must be a healthy
/// member first). A request on a pod with no known role, or on a replica while no pod is the
/// primary (a hand-over under way), stays.
pub fn user_requests(pods: &[PodView], cohort: bool) -> Requests {
    let mut out = Requests::default();
    let primary = pods
        .iter()
        .find(|p| p.role == Role::Primary && !p.terminating);
    for pod in pods.iter().filter(|p| p.user_switchover && !p.terminating) {
        match pod.role {
            Role::Replica if primary.is_some() => out.answered.push(pod.name.clone()),
            Role::Primary => {
                let what = format!("the switchover asked for on the primary {}", pod.name);
                match gate(pods, pod, cohort, &what) {
                    Ok(()) => {
                        let purpose = "as asked for on it (annotation multigres.com/switchover)";
                        out.ask.insert(pod.name.clone(), purpose.to_owned());
                    }
                    Err(waiting) => out.waiting.push(waiting),
                }
            }
            Role::Replica | Role::Unknown => {}
        }
    }
    out
}

/// The hand-overs a drain calls for: the primary, when its node is cordoned, under the same
/// gates as a person's request (nothing is ever answered: the drain evicts the pod once it is
/// a replica).
pub fn drain_requests(pods: &[PodView], cohort: bool) -> Requests {
    let mut out = Requests::default();
    let draining = pods
        .iter()
        .filter(|p| p.role == Role::Primary && p.cordoned && !p.terminating);
    for pod in draining {
        let what = format!("the primary {} on a cordoned node", pod.name);
        match gate(pods, pod, cohort, &what) {
            Ok(()) => {
                let purpose = "before its node, cordoned, is drained";
                out.ask.insert(pod.name.clone(), purpose.to_owned());
            }
            Err(waiting) => out.waiting.push(waiting),
        }
    }
    out
}

/// Whether `primary` may be asked to hand over now (`what` names the request): a Ready replica
/// can take over, and (with a published `cohort`) every other pod
/// takes part in commits; otherwise what it waits for.
fn gate(pods: &[PodView], primary: &PodView, cohort: bool, what: &str) -> Result<(), String> {
    let outside: Vec<&str> = pods
        .iter()
        .filter(|p| p.name != primary.name && !p.terminating && !p.in_cohort)
        .map(|p| p.name.as_str())
        .collect();
    if !pods.iter().any(PodView::can_take_over) {
        Err(format!(
            "{what} waits for a Ready replica on a node that is not cordoned to take over"
        ))
    } else if cohort && !outside.is_empty() {
        Err(format!(
            "{what} waits for {} to be healthy cohort members",
            outside.join(", ")
        ))
    } else {
        Ok(())
    }
}

/// A write of a pod's request annotation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    /// Pod name.
    pub pod: String,
    /// Its UID (the write applies to this pod only).
    pub uid: String,
    /// The new request (`None`: withdrawn).
    pub value: Option<String>,
    /// Why it is asked for (`None` when withdrawn).
    pub purpose: Option<String>,
    /// A request renewed after [`RENEW`].
    pub renewed: bool,
}

/// The annotation writes that make `pods`' requests match `needed`: a new request where none
/// is, a renewed one where it is older than [`RENEW`] (or unreadable), a withdrawal where one
/// is no longer needed. `settled`: whether `needed` is complete (a rollout step is known);
/// otherwise nothing is withdrawn.
pub fn changes(
    pods: &[PodView],
    needed: &BTreeMap<String, String>,
    settled: bool,
    now: Timestamp,
) -> Vec<Change> {
    pods.iter()
        .filter(|p| !p.terminating)
        .filter_map(|p| {
            let purpose = needed.get(&p.name);
            let change = |value: Option<String>, renewed| Change {
                pod: p.name.clone(),
                uid: p.uid.clone(),
                value,
                purpose: purpose.cloned(),
                renewed,
            };
            match (purpose, p.switchover.as_deref()) {
                (Some(_), None) => Some(change(Some(now.to_string()), false)),
                (Some(_), Some(at)) => {
                    let stale = at
                        .parse::<Timestamp>()
                        .map_or(true, |at| now.duration_since(at).unsigned_abs() >= RENEW);
                    stale.then(|| change(Some(now.to_string()), true))
                }
                (None, Some(_)) if settled => Some(change(None, false)),
                (None, _) => None,
            }
        })
        .collect()
}

/// The `Switchover` condition: True while a primary must hand over before it goes, False when
/// one goes without (nobody can take over), absent when no primary is about to go.
pub fn condition(step: Option<&Step>, downs: &[ScaleDown], asked: &Requests) -> Option<Computed> {
    let process = "the data-handler has its multipooler resign leadership (annotation \
                   multigres.com/switchover-requested) and multiorch promotes a replica";
    let mut requested = Vec::new();
    let mut no_replica = Vec::new();
    let mut without = Vec::new();
    if let Some(step) = step {
        match step {
            Step::Wait {
                wait: Wait::Switchover(pod),
                ..
            } => requested.push(format!(
                "the primary {pod} hands over before its restart for the new pod template"
            )),
            Step::Restart {
                pod, primary: true, ..
            } => without.push(format!("the primary {pod} restarts")),
            _ => {}
        }
    }
    for down in downs {
        let (primary, purpose) = (&down.primary, down.purpose());
        match down.handover {
            Handover::Requested => requested.push(format!(
                "the primary {primary} hands over before {purpose} (held at {})",
                down.replicas
            )),
            Handover::NoReadyReplica => no_replica.push(format!(
                "the primary {primary} must hand over before {purpose} (held at {}), but no \
                 replica that stays is Ready to take over",
                down.replicas
            )),
            Handover::Unavailable => {
                without.push(format!("the primary {primary} is removed ({purpose})"))
            }
        }
    }
    for (pod, purpose) in &asked.ask {
        requested.push(format!("the primary {pod} hands over {purpose}"));
    }
    no_replica.extend(asked.waiting.iter().cloned());
    if !requested.is_empty() || !no_replica.is_empty() {
        let reason = if requested.is_empty() {
            "WaitingForReplica"
        } else {
            "WaitingForSwitchover"
        };
        let mut parts = requested;
        if !parts.is_empty() {
            parts.push(process.to_owned());
        }
        parts.extend(no_replica);
        return Some(Computed::new(SWITCHOVER, TRUE, reason, parts.join("; ")));
    }
    if without.is_empty() {
        return None;
    }
    let message = format!(
        "{} without a switchover: no other pool pod is a Ready replica to take over; \
         multiorch fails over",
        without.join("; ")
    );
    Some(Computed::new(
        SWITCHOVER,
        FALSE,
        "WithoutSwitchover",
        message,
    ))
}

/// Removes the answered requests of people (`answered`, among `pods`) with a Normal event each:
/// the pod is a replica now, and `primary` the primary. A pod gone or replaced meanwhile is
/// skipped; a failed write is logged and tried again on the next reconcile.
pub async fn answer_users(
    ctx: &Ctx<Guard>,
    guard: &Guard,
    ns: &str,
    pods: &[PodView],
    answered: &[String],
) {
    let api = Api::<Pod>::namespaced(ctx.client.clone(), ns);
    let primary = pods
        .iter()
        .find(|p| p.role == Role::Primary)
        .map_or("?", |p| p.name.as_str());
    for pod in pods.iter().filter(|p| answered.contains(&p.name)) {
        if !annotate(&api, &pod.name, &pod.uid, USER_SWITCHOVER, None).await {
            continue;
        }
        tracing::info!(pod = %pod.name, %primary, "switchover asked for on the pod is done");
        let note = format!(
            "the switchover asked for on pod {} is done: it is a replica, and {primary} is the \
             primary",
            pod.name
        );
        let related = pod_reference(ns, &pod.name, &pod.uid);
        ctx.kit
            .event_about(
                guard,
                Some(related),
                EventType::Normal,
                "SwitchoverDone",
                note,
            )
            .await;
    }
}

/// Sets (`None`: removes) annotation `key` of pod `name`, only if it is still the pod `uid`
/// (a JSON merge patch carrying the UID, which the API server refuses to change); whether it
/// was written. A pod gone or replaced meanwhile is skipped; a failed write is logged.
async fn annotate(api: &Api<Pod>, name: &str, uid: &str, key: &str, value: Option<&str>) -> bool {
    let patch = json!({"metadata": {"uid": uid, "annotations": {key: value}}});
    crate::sync::count(NAME, "Pod", "patch");
    match api
        .patch(name, &patch_params(FIELD_MANAGER), &Patch::Merge(patch))
        .await
    {
        Ok(_) => true,
        Err(kube::Error::Api(e)) if [404, 409, 422].contains(&e.code) => false,
        Err(error) => {
            tracing::warn!(pod = %name, annotation = key, error = %ErrorChain(&error), "cannot write the pod's switchover annotation");
            false
        }
    }
}

/// Pod `name` (`uid`) of `ns`, as the related object of an event.
fn pod_reference(ns: &str, name: &str, uid: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".to_owned()),
        kind: Some("Pod".to_owned()),
        name: Some(name.to_owned()),
        namespace: Some(ns.to_owned()),
        uid: Some(uid.to_owned()),
        ..Default::default()
    }
}

/// Writes `changes` (a JSON merge patch of the one annotation, carrying the planned pod's UID,
/// which the API server refuses to change, so a replaced pod is not written), with
/// a Normal event for each new or renewed request. A pod gone or replaced meanwhile is
/// skipped; a failed write is logged and tried again on the next reconcile.
pub async fn request(ctx: &Ctx<Guard>, guard: &Guard, ns: &str, changes: &[Change]) {
    let pods = Api::<Pod>::namespaced(ctx.client.clone(), ns);
    for change in changes {
        let value = change.value.as_deref();
        if !annotate(&pods, &change.pod, &change.uid, SWITCHOVER_REQUESTED, value).await {
            continue;
        }
        let (Some(at), Some(purpose)) = (&change.value, &change.purpose) else {
            tracing::info!(pod = %change.pod, "switchover request withdrawn");
            continue;
        };
        tracing::info!(pod = %change.pod, %at, renewed = change.renewed, "switchover requested");
        let (reason, note) = if change.renewed {
            (
                "SwitchoverRenewed",
                format!(
                    "the primary {} has not handed over within {} s; asked again {purpose}",
                    change.pod,
                    RENEW.as_secs()
                ),
            )
        } else {
            (
                "SwitchoverRequested",
                format!(
                    "asked the primary {} to hand over to a replica {purpose}; the \
                     data-handler has its multipooler resign leadership and multiorch promotes \
                     a replica",
                    change.pod
                ),
            )
        };
        let related = pod_reference(ns, &change.pod, &change.uid);
        ctx.kit
            .event_about(guard, Some(related), EventType::Normal, reason, note)
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shard::rollout::Role;

    fn pod(name: &str, request: Option<&str>) -> PodView {
        PodView {
            name: name.into(),
            uid: format!("uid-{name}"),
            set: "pool".into(),
            switchover: request.map(Into::into),
            ..PodView::ready(name, Role::Primary)
        }
    }

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(second).unwrap()
    }

    fn down(handover: Handover) -> ScaleDown {
        ScaleDown {
            statefulset: "pool".into(),
            from: 3,
            replicas: 2,
            wanted: 1,
            primary: "pool-1".into(),
            handover,
        }
    }

    fn rollout_wait(pod: &str) -> Step {
        Step::Wait {
            wait: Wait::Switchover(pod.into()),
            outdated: 1,
            total: 3,
        }
    }

    #[test]
    fn rollouts_and_held_scale_downs_ask_their_primary() {
        let step = rollout_wait("pool-0");
        let downs = [down(Handover::Requested), down(Handover::NoReadyReplica)];
        let asked = needed(Some(&step), &downs[..1]);
        assert_eq!(
            asked,
            BTreeMap::from([
                (
                    "pool-0".to_owned(),
                    "before its restart for the new pod template".to_owned()
                ),
                (
                    "pool-1".to_owned(),
                    "before pool scales down from 3 to 1 replicas".to_owned()
                ),
            ])
        );
        assert!(
            needed(None, &downs[1..]).is_empty(),
            "nobody to hand over to: nothing asked"
        );
    }

    #[test]
    fn a_request_is_written_once_renewed_when_stale_and_withdrawn_when_done() {
        let now = at(1_000);
        let asked = BTreeMap::from([("p-0".to_owned(), "why".to_owned())]);
        let fresh = (now - RENEW / 2).to_string();
        let stale = (now - RENEW).to_string();
        let pods = [pod("p-0", None), pod("p-1", None)];
        assert_eq!(
            changes(&pods, &asked, true, now),
            [Change {
                pod: "p-0".into(),
                uid: "uid-p-0".into(),
                value: Some(now.to_string()),
                purpose: Some("why".into()),
                renewed: false,
            }]
        );
        assert!(
            changes(&[pod("p-0", Some(&fresh))], &asked, true, now).is_empty(),
            "already asked: no write"
        );
        let renewed = changes(&[pod("p-0", Some(&stale))], &asked, true, now);
        assert_eq!(
            (renewed[0].value.clone(), renewed[0].renewed),
            (Some(now.to_string()), true)
        );
        let garbled = changes(&[pod("p-0", Some("soon"))], &asked, true, now);
        assert!(garbled[0].renewed, "an unreadable request is renewed");

        let done = [pod("p-0", Some(&fresh))];
        let withdrawn = changes(&done, &BTreeMap::new(), true, now);
        assert_eq!(
            (withdrawn[0].value.clone(), withdrawn[0].purpose.clone()),
            (None, None)
        );
        assert!(
            changes(&done, &BTreeMap::new(), false, now).is_empty(),
            "kept while the rollout step is not known"
        );
        let mut going = pod("p-0", Some(&fresh));
        going.terminating = true;
        assert!(changes(&[going], &BTreeMap::new(), true, now).is_empty());
    }

    #[test]
    fn the_condition_names_the_pod_and_what_it_waits_for() {
        let step = rollout_wait("pool-0");
        let c = condition(Some(&step), &[], &Requests::default()).unwrap();
        assert_eq!((c.status, c.reason), (TRUE, "WaitingForSwitchover"));
        assert_eq!(
            c.message,
            "the primary pool-0 hands over before its restart for the new pod template; the \
             data-handler has its multipooler resign leadership (annotation \
             multigres.com/switchover-requested) and multiorch promotes a replica"
        );

        let c = condition(None, &[down(Handover::Requested)], &Requests::default()).unwrap();
        assert!(
            c.message
                .starts_with("the primary pool-1 hands over before pool scales down from 3 to 1 replicas (held at 2)"),
            "{}",
            c.message
        );
        let c = condition(
            None,
            &[down(Handover::NoReadyReplica)],
            &Requests::default(),
        )
        .unwrap();
        assert_eq!((c.status, c.reason), (TRUE, "WaitingForReplica"));
        assert!(c.message.contains("no replica that stays is Ready"));
    }

    #[test]
    fn a_primary_going_without_a_switchover_is_said_so() {
        let restart = Step::Restart {
            pod: "pool-0".into(),
            uid: "u".into(),
            primary: true,
            outdated: 1,
            total: 1,
        };
        let c = condition(Some(&restart), &[], &Requests::default()).unwrap();
        assert_eq!((c.status, c.reason), (FALSE, "WithoutSwitchover"));
        assert_eq!(
            c.message,
            "the primary pool-0 restarts without a switchover: no other pool pod is a Ready \
             replica to take over; multiorch fails over"
        );
        let c = condition(None, &[down(Handover::Unavailable)], &Requests::default()).unwrap();
        assert!(c.message.contains("the primary pool-1 is removed"));

        let replica = Step::Restart {
            pod: "pool-0".into(),
            uid: "u".into(),
            primary: false,
            outdated: 1,
            total: 2,
        };
        assert_eq!(condition(Some(&replica), &[], &Requests::default()), None);
        assert_eq!(
            condition(Some(&Step::UpToDate { pods: 2 }), &[], &Requests::default()),
            None
        );
    }

    fn with_role(name: &str, role: Role) -> PodView {
        PodView {
            role,
            ..pod(name, None)
        }
    }

    #[test]
    fn a_person_asks_the_primary_to_hand_over_under_the_rollout_gates() {
        let mut pods = vec![
            with_role("pool-0", Role::Primary),
            with_role("pool-1", Role::Replica),
        ];
        pods[0].user_switchover = true;
        let users = user_requests(&pods, true);
        assert_eq!(users.ask.keys().collect::<Vec<_>>(), ["pool-0"]);
        assert!(users.waiting.is_empty() && users.answered.is_empty());
        let c = condition(None, &[], &users).unwrap();
        assert_eq!((c.status, c.reason), (TRUE, "WaitingForSwitchover"));
        assert!(c.message.contains("as asked for on it"), "{}", c.message);

        pods[1].in_cohort = false;
        let users = user_requests(&pods, true);
        assert!(users.ask.is_empty());
        assert!(users.waiting[0].contains("waits for pool-1 to be healthy cohort members"));
        assert_eq!(
            user_requests(&pods, false).ask.len(),
            1,
            "without a published cohort, readiness decides"
        );

        pods[1].ready = false;
        let users = user_requests(&pods, false);
        assert!(users.waiting[0].contains("waits for a Ready replica"));
        let drained = drain_requests(&pods, false);
        assert!(
            drained.ask.is_empty() && drained.waiting.is_empty(),
            "no cordoned node"
        );
        let c = condition(None, &[], &users).unwrap();
        assert_eq!(c.reason, "WaitingForReplica");
    }

    #[test]
    fn a_request_is_answered_once_another_pod_is_the_primary() {
        let mut pods = vec![
            with_role("pool-0", Role::Replica),
            with_role("pool-1", Role::Replica),
        ];
        pods[0].user_switchover = true;
        assert_eq!(
            user_requests(&pods, true),
            Requests::default(),
            "no primary yet: the hand-over is under way"
        );
        pods[1].role = Role::Primary;
        let users = user_requests(&pods, true);
        assert_eq!(users.answered, ["pool-0"]);
        assert!(users.ask.is_empty());
    }

    #[test]
    fn a_primary_on_a_cordoned_node_hands_over_to_a_replica_elsewhere() {
        let mut pods = vec![
            with_role("pool-0", Role::Primary),
            with_role("pool-1", Role::Replica),
        ];
        pods[0].cordoned = true;
        let drained = drain_requests(&pods, true);
        assert_eq!(
            drained.ask.get("pool-0").map(String::as_str),
            Some("before its node, cordoned, is drained")
        );
        let c = condition(None, &[], &drained).unwrap();
        assert!(
            c.message.contains("pool-0 hands over before its node"),
            "{}",
            c.message
        );

        pods[1].cordoned = true;
        let drained = drain_requests(&pods, true);
        assert!(drained.ask.is_empty());
        assert!(
            drained.waiting[0].contains("not cordoned"),
            "{:?}",
            drained.waiting
        );
    }
}
