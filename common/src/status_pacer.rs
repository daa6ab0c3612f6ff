//! Pacing of status writes while an object converges.
//!
//! A converging object's status moves in small steps: each pod that becomes ready moves a ready
//! count, an intermediate phase (`Initializing`, then `Progressing`) lasts a few seconds, a
//! condition message names the children still awaited. Writing every step costs the API server
//! a write (and every watcher an event) per step, several per object, which dominated the
//! handlers' writes in the benchmark (docs/performance.md).
//!
//! The rule: a status that carries news is written at once; a status that only carries progress
//! is written at most once per [`MIN_INTERVAL`] per object, with its latest value. News is:
//!
//! - the first status this handler writes (nothing of its fields is stored yet);
//! - a change of `observedGeneration` (the user changed the spec);
//! - for an object with a phase, any change unless it is converging (an intermediate phase,
//!   `Initializing` or `Progressing`, both before and after): reaching `Healthy`, becoming
//!   `Degraded`, leaving `Healthy`, and any change of a settled object; while converging, the
//!   phase sums the conditions up and their intermediate flips are progress;
//! - for an object without a phase, a condition whose status or reason changes (or appears).
//!
//! Everything else (counts and messages of a converging object, intermediate phases) is
//! progress. A deferred write is not
//! lost: the reconcile asks to run again when the interval has passed ([`Pace::Defer`]), and
//! writes the latest value then. Once written, the status equals what is computed, so nothing
//! is deferred and nothing is requeued: an idle object costs no writes.
//!
//! The pacer remembers when it last wrote each object, in memory, and forgets an object once
//! its interval has passed (nothing is deferred for it any more), so it holds at most the
//! objects written in the last [`MIN_INTERVAL`].

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::Duration;

use kube::runtime::controller::Action;
use serde::Serialize;
use serde_json::Value;
use tokio::time::Instant;

/// Least time between two progress-only status writes of one object. Short enough that a
/// person watching `kubectl get` sees counts move, long enough that a pool of pods becoming
/// ready one by one costs one or two writes instead of one per pod.
pub const MIN_INTERVAL: Duration = Duration::from_secs(5);

/// Phases an object passes through on its way to a settled phase.
const TRANSIENT_PHASES: [&str; 2] = ["Initializing", "Progressing"];

/// What to do with a status that differs from the stored one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pace {
    /// Write it now.
    Write,
    /// Progress only, and the object's last write is recent: reconcile again after this long.
    Defer(Duration),
}

/// The action of a reconcile that planned `planned` (a requeue delay, `None` for
/// [`Action::await_change`]) and deferred a status write by `deferred`: a requeue when the
/// deferred write is due, unless the planned one comes sooner.
pub fn action(planned: Option<Duration>, deferred: Option<Duration>) -> Action {
    match (planned, deferred) {
        (Some(planned), Some(deferred)) => Action::requeue(planned.min(deferred)),
        (Some(delay), None) | (None, Some(delay)) => Action::requeue(delay),
        (None, None) => Action::await_change(),
    }
}

impl Pace {
    /// How long the write is deferred, if it is.
    pub fn deferred(self) -> Option<Duration> {
        match self {
            Pace::Write => None,
            Pace::Defer(delay) => Some(delay),
        }
    }
}

/// When each object's status was last written, to pace progress-only writes.
#[derive(Debug)]
pub struct StatusPacer<K> {
    interval: Duration,
    last_write: Mutex<HashMap<K, Instant>>,
}

impl<K: Eq + Hash + Clone> Default for StatusPacer<K> {
    fn default() -> Self {
        Self::new(MIN_INTERVAL)
    }
}

impl<K: Eq + Hash + Clone> StatusPacer<K> {
    /// A pacer allowing one progress-only write per `interval` per object.
    pub fn new(interval: Duration) -> Self {
        Self {
            interval,
            last_write: Mutex::new(HashMap::new()),
        }
    }

    /// Whether to write `desired` (the status fields this handler owns, as JSON) over `stored`
    /// (the object's stored status, if any) now. Call only when they differ; call
    /// [`StatusPacer::wrote`] after a write.
    pub fn pace(&self, key: &K, stored: Option<&Value>, desired: &Value) -> Pace {
        if is_news(stored, desired) {
            return Pace::Write;
        }
        let last = self.lock().get(key).copied();
        match last.map(|at| at + self.interval) {
            Some(due) if due > Instant::now() => Pace::Defer(due - Instant::now()),
            _ => Pace::Write,
        }
    }

    /// [`StatusPacer::pace`] for typed statuses. A status that cannot be turned into JSON is
    /// not paced: its write reports the error.
    pub fn pace_typed<S: Serialize>(&self, key: &K, stored: Option<&S>, desired: &S) -> Pace {
        match (serde_json::to_value(stored), serde_json::to_value(desired)) {
            (Ok(stored), Ok(desired)) => self.pace(key, Some(&stored), &desired),
            _ => Pace::Write,
        }
    }

    /// Records a status write of `key` now, and forgets objects whose interval has passed.
    pub fn wrote(&self, key: &K) {
        let now = Instant::now();
        let mut last = self.lock();
        last.retain(|_, at| *at + self.interval > now);
        last.insert(key.clone(), now);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<K, Instant>> {
        // The map is only read and replaced entry by entry: a panic elsewhere cannot leave it
        // half-updated, so a poisoned lock is still usable.
        self.last_write
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Whether `desired` carries news over `stored` (see the module documentation). Fields
/// `desired` leaves out are not compared.
pub fn is_news(stored: Option<&Value>, desired: &Value) -> bool {
    let Some(stored) = stored.filter(|s| s.is_object()) else {
        return true;
    };
    let field = |v: &Value, name: &str| v.get(name).cloned().unwrap_or(Value::Null);
    if desired.get("observedGeneration").is_some()
        && field(desired, "observedGeneration") != field(stored, "observedGeneration")
    {
        return true;
    }
    let phase = |v: &Value| v.get("phase").and_then(Value::as_str).map(str::to_owned);
    let transient = |p: &str| TRANSIENT_PHASES.contains(&p);
    match (phase(stored), phase(desired)) {
        (_, None) => {}
        (None, Some(_)) => return true,
        (Some(old), Some(new)) => return !(transient(&old) && transient(&new)),
    }
    let conditions = |v: &Value| v.get("conditions").and_then(Value::as_array).cloned();
    let stored_conditions = conditions(stored).unwrap_or_default();
    conditions(desired).into_iter().flatten().any(|wanted| {
        let same_type = stored_conditions
            .iter()
            .find(|c| c.get("type") == wanted.get("type"));
        same_type.is_none_or(|c| {
            c.get("status") != wanted.get("status") || c.get("reason") != wanted.get("reason")
        })
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn status(phase: &str, ready: i64, available: &str) -> Value {
        json!({
            "observedGeneration": 1,
            "phase": phase,
            "readyReplicas": ready,
            "conditions": [{
                "type": "Available",
                "status": available,
                "reason": if available == "True" { "AllReady" } else { "NotReady" },
                "message": format!("{ready}/3 ready"),
            }],
        })
    }

    fn conditions_only(status: &str, reason: &str, message: &str) -> Value {
        json!({
            "conditions": [{
                "type": "TopologyRegistered",
                "status": status,
                "reason": reason,
                "message": message,
            }],
        })
    }

    #[test]
    fn first_status_and_new_generation_are_news() {
        let desired = status("Initializing", 0, "False");
        assert!(is_news(None, &desired));
        assert!(is_news(Some(&json!({})), &desired), "no phase stored yet");
        let mut newer = status("Progressing", 1, "False");
        newer["observedGeneration"] = json!(2);
        assert!(is_news(Some(&status("Progressing", 1, "False")), &newer));
    }

    #[test]
    fn counts_messages_and_intermediate_phases_are_progress() {
        let stored = status("Initializing", 0, "False");
        assert!(!is_news(Some(&stored), &status("Initializing", 1, "False")));
        assert!(!is_news(Some(&stored), &status("Progressing", 2, "False")));
    }

    #[test]
    fn settled_phases_are_news_both_ways() {
        let converging = status("Progressing", 2, "False");
        let healthy = status("Healthy", 3, "True");
        assert!(is_news(Some(&converging), &healthy));
        assert!(is_news(Some(&healthy), &status("Progressing", 2, "False")));
        assert!(is_news(Some(&converging), &status("Degraded", 2, "False")));
    }

    #[test]
    fn a_settled_object_reports_every_change_at_once() {
        let mut flipped = status("Healthy", 3, "True");
        flipped["conditions"][0]["status"] = json!("False");
        flipped["conditions"][0]["reason"] = json!("NotReady");
        assert!(is_news(Some(&status("Healthy", 3, "True")), &flipped));
        let mut recounted = status("Healthy", 3, "True");
        recounted["readyReplicas"] = json!(4);
        assert!(is_news(Some(&status("Healthy", 3, "True")), &recounted));
    }

    #[test]
    fn without_a_phase_conditions_decide() {
        let stored = conditions_only("False", "Waiting", "0 of 2 cells");
        assert!(!is_news(
            Some(&stored),
            &conditions_only("False", "Waiting", "1 of 2 cells")
        ));
        assert!(is_news(
            Some(&stored),
            &conditions_only("True", "Registered", "2 of 2 cells")
        ));
        assert!(is_news(
            Some(&stored),
            &json!({"conditions": [{"type": "Other", "status": "True", "reason": "Set"}]})
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn progress_is_written_at_most_once_per_interval() {
        let pacer = StatusPacer::new(Duration::from_secs(5));
        let key = "ns/shard".to_owned();
        let stored = status("Progressing", 1, "False");
        let desired = status("Progressing", 2, "False");
        assert_eq!(pacer.pace(&key, Some(&stored), &desired), Pace::Write);
        pacer.wrote(&key);

        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(
            pacer.pace(&key, Some(&desired), &status("Progressing", 3, "False")),
            Pace::Defer(Duration::from_secs(3))
        );
        // News is never held back.
        assert_eq!(
            pacer.pace(&key, Some(&desired), &status("Healthy", 3, "True")),
            Pace::Write
        );
        // Another object is paced on its own.
        assert_eq!(
            pacer.pace(&"ns/other".to_owned(), Some(&stored), &desired),
            Pace::Write
        );

        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(
            pacer.pace(&key, Some(&desired), &status("Progressing", 3, "False")),
            Pace::Write
        );
    }

    #[tokio::test(start_paused = true)]
    async fn objects_are_forgotten_once_their_interval_passed() {
        let pacer = StatusPacer::new(Duration::from_secs(5));
        pacer.wrote(&"a");
        tokio::time::advance(Duration::from_secs(3)).await;
        pacer.wrote(&"b");
        assert_eq!(pacer.len(), 2);
        tokio::time::advance(Duration::from_secs(3)).await;
        pacer.wrote(&"c");
        assert_eq!(pacer.len(), 2, "a is past its interval");
        tokio::time::advance(Duration::from_secs(6)).await;
        pacer.wrote(&"c");
        assert_eq!(pacer.len(), 1);
    }

    #[test]
    fn a_deferred_write_requeues_no_later_than_planned() {
        let (one, three) = (Duration::from_secs(1), Duration::from_secs(3));
        assert_eq!(
            action(None, Pace::Defer(three).deferred()),
            Action::requeue(three)
        );
        assert_eq!(action(Some(one), Some(three)), Action::requeue(one));
        assert_eq!(action(Some(three), Some(one)), Action::requeue(one));
        assert_eq!(
            action(Some(three), Pace::Write.deferred()),
            Action::requeue(three)
        );
        assert_eq!(action(None, None), Action::await_change());
    }
}
