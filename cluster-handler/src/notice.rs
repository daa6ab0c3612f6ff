//! Events worth telling a person about, derived from status transitions so that a reconcile
//! that changes nothing publishes nothing.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use multigres_api::v1alpha1::Phase;
use multigres_common::conditions::TRUE;
use multigres_common::events::Notice;

/// The events for a move from (`old_phase`, `old_degraded`) to (`new_phase`, `new_degraded`):
/// a phase change into or out of a settled phase (reaching Healthy or Degraded, leaving them;
/// the steps of a first convergence, none → Initializing → Progressing, are visible in the
/// status and are no news worth an Event each); a Warning with the Degraded reason when the
/// object becomes degraded or the reason or message changes; a Normal `Recovered` when it stops
/// being degraded.
pub fn transitions(
    old_phase: Option<Phase>,
    old_degraded: Option<&Condition>,
    new_phase: Phase,
    new_message: &str,
    new_degraded: Option<&Condition>,
) -> Vec<Notice> {
    let mut out = Vec::new();
    let settled = |phase: Phase| !matches!(phase, Phase::Initializing | Phase::Progressing);
    if old_phase != Some(new_phase) && (settled(new_phase) || old_phase.is_some_and(settled)) {
        let from = old_phase.map_or_else(|| "none".to_owned(), |p| format!("{p:?}"));
        let text = format!("Phase changed from {from} to {new_phase:?}: {new_message}");
        // One reason per target phase: kube's recorder folds events of one reason into a
        // series that keeps the first message, so a shared reason would hide every later
        // transition behind the first one's text.
        let reason = format!("PhaseChangedTo{new_phase:?}");
        out.push(if new_phase == Phase::Degraded {
            Notice::warning(reason, text)
        } else {
            Notice::normal(reason, text)
        });
    }
    let was = old_degraded.filter(|c| c.status == TRUE);
    let now = new_degraded.filter(|c| c.status == TRUE);
    match (was, now) {
        (_, Some(now))
            if was.is_none_or(|was| was.reason != now.reason || was.message != now.message) =>
        {
            out.push(Notice::warning(now.reason.clone(), now.message.clone()));
        }
        (Some(was), None) => out.push(Notice::normal(
            "Recovered",
            format!("No longer degraded (was {}: {})", was.reason, was.message),
        )),
        _ => {}
    }
    out
}

/// `items` joined with `; `, at most `max` of them, then how many more there are.
pub fn list(items: &[&str], max: usize) -> String {
    let shown = items
        .iter()
        .take(max)
        .copied()
        .collect::<Vec<_>>()
        .join("; ");
    match items.len().saturating_sub(max) {
        0 => shown,
        more => format!("{shown}; and {more} more"),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    use super::*;

    fn degraded(status: &str, reason: &str, message: &str) -> Condition {
        Condition {
            type_: "Degraded".into(),
            status: status.into(),
            reason: reason.into(),
            message: message.into(),
            observed_generation: Some(1),
            last_transition_time: Time(Timestamp::UNIX_EPOCH),
        }
    }

    #[test]
    fn nothing_new_publishes_nothing() {
        let ok = degraded("False", "AsExpected", "fine");
        assert!(
            transitions(
                Some(Phase::Healthy),
                Some(&ok),
                Phase::Healthy,
                "m",
                Some(&ok)
            )
            .is_empty()
        );
        let bad = degraded("True", "TemplateNotFound", "x missing");
        assert!(
            transitions(
                Some(Phase::Degraded),
                Some(&bad),
                Phase::Degraded,
                "m",
                Some(&bad)
            )
            .is_empty()
        );
    }

    #[test]
    fn becoming_degraded_warns_with_the_reason() {
        let ok = degraded("False", "AsExpected", "fine");
        let bad = degraded(
            "True",
            "TemplateNotFound",
            "spec.x: ShardTemplate \"t\" missing",
        );
        let notices = transitions(
            Some(Phase::Healthy),
            Some(&ok),
            Phase::Degraded,
            "spec.x: ShardTemplate \"t\" missing",
            Some(&bad),
        );
        assert_eq!(
            notices,
            [
                Notice::warning(
                    "PhaseChangedToDegraded",
                    "Phase changed from Healthy to Degraded: spec.x: ShardTemplate \"t\" missing"
                ),
                Notice::warning("TemplateNotFound", "spec.x: ShardTemplate \"t\" missing"),
            ]
        );
    }

    #[test]
    fn recovering_and_first_phase_are_normal() {
        let bad = degraded("True", "TemplateNotFound", "gone");
        let ok = degraded("False", "AsExpected", "fine");
        let notices = transitions(
            Some(Phase::Degraded),
            Some(&bad),
            Phase::Progressing,
            "0/3 healthy",
            Some(&ok),
        );
        assert_eq!(notices.len(), 2);
        assert_eq!(
            notices[1],
            Notice::normal(
                "Recovered",
                "No longer degraded (was TemplateNotFound: gone)"
            )
        );
        let first = transitions(None, None, Phase::Healthy, "all healthy", Some(&ok));
        assert_eq!(
            first,
            [Notice::normal(
                "PhaseChangedToHealthy",
                "Phase changed from none to Healthy: all healthy"
            )]
        );
    }

    #[test]
    fn steps_of_a_first_convergence_publish_nothing() {
        let ok = degraded("False", "AsExpected", "fine");
        assert!(transitions(None, None, Phase::Initializing, "waiting", Some(&ok)).is_empty());
        let started = transitions(
            Some(Phase::Initializing),
            Some(&ok),
            Phase::Progressing,
            "1/3 healthy",
            Some(&ok),
        );
        assert!(started.is_empty());
        let reached = transitions(
            Some(Phase::Progressing),
            Some(&ok),
            Phase::Healthy,
            "all healthy",
            Some(&ok),
        );
        assert_eq!(reached[0].reason, "PhaseChangedToHealthy");
        let left = transitions(
            Some(Phase::Healthy),
            Some(&ok),
            Phase::Progressing,
            "2/3 healthy",
            Some(&ok),
        );
        assert_eq!(left[0].reason, "PhaseChangedToProgressing");
    }

    #[test]
    fn long_lists_are_cut() {
        assert_eq!(list(&["a", "b"], 3), "a; b");
        assert_eq!(list(&["a", "b", "c", "d", "e"], 3), "a; b; c; and 2 more");
    }
}
