//! Status conditions (`metav1.Condition`) without timestamp churn.
//!
//! A reconcile that finds nothing new must write nothing; rewriting `lastTransitionTime` on every
//! pass would make every status apply a change, and every change triggers another reconcile.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// Condition status `True`.
pub const TRUE: &str = "True";
/// Condition status `False`.
pub const FALSE: &str = "False";
/// Condition status `Unknown`.
pub const UNKNOWN: &str = "Unknown";

/// A condition as a reconcile computes it; [`set_condition`] supplies the transition time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesiredCondition<'a> {
    /// Condition type, for example `Available`.
    pub type_: &'a str,
    /// `True`, `False` or `Unknown`.
    pub status: &'a str,
    /// One CamelCase word saying why.
    pub reason: &'a str,
    /// What a person should know or do.
    pub message: &'a str,
    /// `metadata.generation` the condition was computed from.
    pub observed_generation: Option<i64>,
}

/// Sets `desired` in `conditions` and says whether the list changed.
///
/// `lastTransitionTime` becomes `now` only when the condition is new or its status changed;
/// a change of reason, message or generation alone keeps the old time.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    desired: &DesiredCondition<'_>,
    now: Timestamp,
) -> bool {
    match conditions.iter_mut().find(|c| c.type_ == desired.type_) {
        Some(existing) => {
            let unchanged = existing.status == desired.status
                && existing.reason == desired.reason
                && existing.message == desired.message
                && existing.observed_generation == desired.observed_generation;
            if unchanged {
                return false;
            }
            if existing.status != desired.status {
                existing.last_transition_time = Time(now);
            }
            existing.status = desired.status.to_owned();
            existing.reason = desired.reason.to_owned();
            existing.message = desired.message.to_owned();
            existing.observed_generation = desired.observed_generation;
            true
        }
        None => {
            conditions.push(Condition {
                type_: desired.type_.to_owned(),
                status: desired.status.to_owned(),
                reason: desired.reason.to_owned(),
                message: desired.message.to_owned(),
                observed_generation: desired.observed_generation,
                last_transition_time: Time(now),
            });
            true
        }
    }
}

/// A condition as a reconcile computes it, before timestamps: what each handler's pure
/// status code returns, set on the object's list by [`Computed::set_on`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Computed {
    /// Condition type, for example `Available`.
    pub type_: &'static str,
    /// `True`, `False` or `Unknown`.
    pub status: &'static str,
    /// One CamelCase word saying why.
    pub reason: &'static str,
    /// What a person should know or do.
    pub message: String,
}

impl Computed {
    /// A condition of `type_` with `status`.
    pub fn new(
        type_: &'static str,
        status: &'static str,
        reason: &'static str,
        message: impl Into<String>,
    ) -> Self {
        Self {
            type_,
            status,
            reason,
            message: message.into(),
        }
    }

    /// A `True` condition.
    pub fn yes(type_: &'static str, reason: &'static str, message: impl Into<String>) -> Self {
        Self::new(type_, TRUE, reason, message)
    }

    /// A `False` condition.
    pub fn no(type_: &'static str, reason: &'static str, message: impl Into<String>) -> Self {
        Self::new(type_, FALSE, reason, message)
    }

    /// An `Unknown` condition.
    pub fn unknown(type_: &'static str, reason: &'static str, message: impl Into<String>) -> Self {
        Self::new(type_, UNKNOWN, reason, message)
    }

    /// Whether the condition holds.
    pub fn is_true(&self) -> bool {
        self.status == TRUE
    }

    /// Sets this condition in `conditions` (see [`set_condition`]); whether it changed.
    pub fn set_on(
        &self,
        conditions: &mut Vec<Condition>,
        generation: Option<i64>,
        now: Timestamp,
    ) -> bool {
        set_condition(
            conditions,
            &DesiredCondition {
                type_: self.type_,
                status: self.status,
                reason: self.reason,
                message: &self.message,
                observed_generation: generation,
            },
            now,
        )
    }
}

/// The condition of type `type_`, if present.
pub fn find_condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether the condition of type `type_` is present with status `True`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    find_condition(conditions, type_).is_some_and(|c| c.status == TRUE)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(seconds).unwrap()
    }

    fn ready<'a>(status: &'a str, message: &'a str, generation: i64) -> DesiredCondition<'a> {
        DesiredCondition {
            type_: "Ready",
            status,
            reason: if status == TRUE {
                "AllReady"
            } else {
                "Waiting"
            },
            message,
            observed_generation: Some(generation),
        }
    }

    #[test]
    fn new_condition_is_added_with_now() {
        let mut conditions = Vec::new();
        assert!(set_condition(
            &mut conditions,
            &ready(FALSE, "0/3 ready", 1),
            at(100)
        ));
        assert_eq!(conditions.len(), 1);
        let c = &conditions[0];
        assert_eq!(
            (c.type_.as_str(), c.status.as_str(), c.reason.as_str()),
            ("Ready", FALSE, "Waiting")
        );
        assert_eq!(c.message, "0/3 ready");
        assert_eq!(c.observed_generation, Some(1));
        assert_eq!(c.last_transition_time, Time(at(100)));
    }

    #[test]
    fn same_condition_later_changes_nothing() {
        let mut conditions = Vec::new();
        set_condition(&mut conditions, &ready(TRUE, "3/3 ready", 1), at(100));
        let before = conditions.clone();
        assert!(!set_condition(
            &mut conditions,
            &ready(TRUE, "3/3 ready", 1),
            at(200)
        ));
        assert_eq!(conditions, before);
    }

    #[test]
    fn message_change_keeps_transition_time() {
        let mut conditions = Vec::new();
        set_condition(&mut conditions, &ready(FALSE, "0/3 ready", 1), at(100));
        assert!(set_condition(
            &mut conditions,
            &ready(FALSE, "1/3 ready", 2),
            at(200)
        ));
        let c = &conditions[0];
        assert_eq!(c.message, "1/3 ready");
        assert_eq!(c.observed_generation, Some(2));
        assert_eq!(c.last_transition_time, Time(at(100)));
    }

    #[test]
    fn status_change_moves_transition_time() {
        let mut conditions = Vec::new();
        set_condition(&mut conditions, &ready(FALSE, "0/3 ready", 1), at(100));
        assert!(set_condition(
            &mut conditions,
            &ready(TRUE, "3/3 ready", 1),
            at(300)
        ));
        let c = &conditions[0];
        assert_eq!((c.status.as_str(), c.reason.as_str()), (TRUE, "AllReady"));
        assert_eq!(c.last_transition_time, Time(at(300)));
        assert!(is_true(&conditions, "Ready"));
    }

    #[test]
    fn a_computed_condition_sets_like_a_desired_one() {
        let mut conditions = Vec::new();
        let waiting = Computed::no("Ready", "Waiting", "0/3 ready");
        assert!(!waiting.is_true());
        assert!(waiting.set_on(&mut conditions, Some(1), at(100)));
        assert!(
            !waiting.set_on(&mut conditions, Some(1), at(200)),
            "nothing new"
        );
        let ready = Computed::yes("Ready", "AllReady", "3/3 ready");
        assert!(ready.is_true());
        assert!(ready.set_on(&mut conditions, Some(1), at(300)));
        assert_eq!(conditions[0].last_transition_time, Time(at(300)));
        assert_eq!(Computed::unknown("Ready", "NotChecked", "").status, UNKNOWN);
        assert_eq!(Computed::new("Ready", TRUE, "AllReady", "3/3 ready"), ready);
    }

    #[test]
    fn other_types_are_left_alone() {
        let mut conditions = Vec::new();
        set_condition(&mut conditions, &ready(TRUE, "ok", 1), at(100));
        let registered = DesiredCondition {
            type_: "TopologyRegistered",
            status: FALSE,
            reason: "TopoUnreachable",
            message: "etcd at 127.0.0.1:2379 refused the connection",
            observed_generation: Some(1),
        };
        assert!(set_condition(&mut conditions, &registered, at(150)));
        assert_eq!(conditions.len(), 2);
        assert_eq!(conditions[0].last_transition_time, Time(at(100)));
        assert!(is_true(&conditions, "Ready"));
        assert!(!is_true(&conditions, "TopologyRegistered"));
        assert!(!is_true(&conditions, "Missing"));
        assert_eq!(
            find_condition(&conditions, "TopologyRegistered").map(|c| c.reason.as_str()),
            Some("TopoUnreachable")
        );
    }
}
