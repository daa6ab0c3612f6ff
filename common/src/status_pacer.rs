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
//! - the first status this handler writes (nothing of its fields is stored yet) once the object
//!   has settled or is [`AVAILABLE`] (`True`); a first status of an object still converging and
//!   not yet available waits until [`MIN_INTERVAL`] after the handler first saw it, so an object
//!   that converges quickly gets one status write, not a `Progressing` one and then a `Healthy`
//!   one a moment later, while `kubectl wait --for=condition=Available` is not held up (it then
//!   draws on the budget below, but is written at the latest
//!   [`FIRST_STATUS_DEADLINE_INTERVALS`] intervals after first sight, token or not, unless the
//!   caller says the object needs no deadline: [`FirstStatus`]);
//! - a change of `observedGeneration` (the user changed the spec);
//! - for an object with a phase, any change unless it is converging (an intermediate phase,
//!   `Initializing` or `Progressing`, both before and after): reaching `Healthy`, becoming
//!   `Degraded`, leaving `Healthy`, and any change of a settled object;
//! - for every object, a condition whose status changes: pipelines gate on conditions
//!   (`kubectl wait --for=condition=Available`), so `Available` turning `True` while the phase
//!   still says `Progressing` (the gateways serve before the last pool is ready) is written at
//!   once, not when the phase settles;
//! - for an object without a phase, also a condition whose reason changes (or that appears).
//!
//! Everything else (counts, messages and reasons of a converging object, intermediate phases)
//! is progress. A deferred write is not lost: the reconcile asks to run again when it is due
//! ([`Pace::Defer`], [`action`]) and writes the latest value then. Once written, the status
//! equals what is computed, so nothing is deferred and nothing is requeued: an idle object
//! costs no writes.
//!
//! The interval bounds the writes of one object, not of the handler: when many objects converge
//! at once (100 clusters applied together take over a minute), a progress write falls due every
//! interval for each of them, so the API server's writes and the watch events per status step
//! grow with the number of converging objects. Progress-only writes (a converging object's
//! first status included) therefore also draw on a budget shared by everything one pacer (one
//! controller) writes: a token bucket refilled at [`PROGRESS_WRITES_PER_SECOND`] that holds at
//! most [`PROGRESS_BURST`] tokens. A write the per-object rule allows but that finds no token is
//! deferred until a token is expected plus a spread of up to one interval, which differs from
//! object to object and from one deferral to the next, so deferred objects do not all wake at
//! once and take turns. News neither waits for the budget nor spends it. The burst is what the
//! rate refills in one interval, so up to that many objects converging together never find the
//! budget spent: they are paced by the per-object rule alone. A handler whose statuses only
//! sum up other handlers' may give one pacer a smaller [`Budget`] and share it among its
//! controllers (the cluster-handler does).
//!
//! The pacer remembers when it last wrote (or first saw) each object, in memory, and forgets an
//! object [`FORGET_AFTER_INTERVALS`] intervals later, long after any deferred write of it was
//! due: it holds at most the objects written in the last minute, whether or not they still
//! exist. The budget is one instant and a counter.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::runtime::controller::Action;
use serde::Serialize;
use serde_json::Value;

/// Least time between two progress-only status writes of one object. Short enough that a
/// person watching `kubectl get` sees counts move, long enough that a pool of pods becoming
/// ready one by one costs one or two writes instead of one per pod.
pub const MIN_INTERVAL: Duration = Duration::from_secs(5);

/// How many intervals after first seeing an object its first status is written at the latest,
/// budget or not. Without it a new object competes for tokens with every converging object
/// that already shows a status, and lost for minutes when many converged at once (seen in the
/// fuzz test of e2e/tests/faults.rs: `kubectl get` showed a cluster without any status 3 min
/// after it was applied). Once per object, so the writes it adds are bounded by the objects.
pub const FIRST_STATUS_DEADLINE_INTERVALS: u32 = 3;

/// How many intervals after its last write the pacer forgets an object: a reconcile that runs
/// late, on a busy machine, still finds when the object was last written.
pub const FORGET_AFTER_INTERVALS: u32 = 12;

/// Progress-only status writes one pacer (one controller) makes per second once its burst is
/// spent, whatever the number of converging objects. For 100 objects converging over about a
/// minute, that is a little over one progress write each (mostly their first status) besides
/// their news, where the per-object interval alone allowed one each every five seconds; each of
/// them still gets a turn about every 50 s, so a long convergence keeps showing progress.
pub const PROGRESS_WRITES_PER_SECOND: u32 = 2;

/// Progress-only status writes one pacer makes at once before [`PROGRESS_WRITES_PER_SECOND`]
/// applies: what that rate refills in one [`MIN_INTERVAL`], so up to this many objects
/// converging together (the objects of a few clusters) are paced as without a budget.
pub const PROGRESS_BURST: u32 = PROGRESS_WRITES_PER_SECOND * MIN_INTERVAL.as_secs() as u32;

/// The progress budget of a pacer: one token every `token_period`, at most `burst` held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Time between two tokens.
    pub token_period: Duration,
    /// Tokens held at most (and at the start).
    pub burst: u32,
}

impl Default for Budget {
    /// [`PROGRESS_WRITES_PER_SECOND`] and [`PROGRESS_BURST`].
    fn default() -> Self {
        Self {
            token_period: Duration::from_secs(1) / PROGRESS_WRITES_PER_SECOND,
            burst: PROGRESS_BURST,
        }
    }
}

/// Phases an object passes through on its way to a settled phase.
const TRANSIENT_PHASES: [&str; 2] = ["Initializing", "Progressing"];

/// The condition pipelines wait for: a first status in which it is `True` is news even while
/// the phase still converges (a cluster serves once its gateways are up, before its last pool).
pub const AVAILABLE: &str = "Available";

/// Whether a converging object's first status has a deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FirstStatus {
    /// Written at the latest [`FIRST_STATUS_DEADLINE_INTERVALS`] intervals after first sight,
    /// token or not: objects people apply and watch, which must not look ignored.
    Deadline,
    /// Waits for a token like any progress: objects whose status only sums up others for a
    /// parent that already shows the progress (a TableGroup under its MultigresCluster). When
    /// many converge at once, this keeps their first status from costing a write each on top
    /// of their final one.
    WhenBudgetAllows,
}

/// What to do with a status that differs from the stored one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pace {
    /// Write it now.
    Write,
    /// Progress only, and the object's last write (or, before its first, the first sight of
    /// it) is recent, or the pacer's progress budget is spent: reconcile again after this long.
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

/// When each object's status was last written, and the progress budget of all of them, to pace
/// progress-only writes.
#[derive(Debug)]
pub struct StatusPacer<K> {
    interval: Duration,
    budget: Budget,
    state: Mutex<State<K>>,
}

#[derive(Debug)]
struct State<K> {
    /// When each object was last written (or, before its first write, first seen).
    last_write: HashMap<K, Instant>,
    budget: Bucket,
}

/// The token bucket of progress-only writes, kept as the instant up to which its tokens are
/// spent (a single number, instead of a count and the time it was counted): taking a token
/// moves that instant one token period on, and a token is there while the instant stays within
/// a burst's worth of periods from now. An instant in the past is a full bucket.
#[derive(Debug)]
struct Bucket {
    spent_until: Instant,
    /// Deferrals for want of a token so far, to vary each deferral's spread.
    deferrals: u64,
}

impl Bucket {
    fn full(now: Instant) -> Self {
        Self {
            spent_until: now,
            deferrals: 0,
        }
    }

    /// Takes a token of `budget` at `now`, or returns how long until one is there.
    fn take(&mut self, budget: Budget, now: Instant) -> Result<(), Duration> {
        let period = budget.token_period;
        let spent_until = self.spent_until.max(now) + period;
        let ahead = spent_until - now;
        let burst = period * budget.burst;
        if ahead > burst {
            return Err(ahead - burst);
        }
        self.spent_until = spent_until;
        Ok(())
    }
}

impl<K: Eq + Hash + Clone> Default for StatusPacer<K> {
    fn default() -> Self {
        Self::new(MIN_INTERVAL)
    }
}

impl<K: Eq + Hash + Clone> StatusPacer<K> {
    /// A pacer allowing one progress-only write per `interval` per object, within the default
    /// progress budget ([`PROGRESS_WRITES_PER_SECOND`], [`PROGRESS_BURST`]).
    pub fn new(interval: Duration) -> Self {
        Self::with_budget(interval, Budget::default())
    }

    /// A pacer allowing one progress-only write per `interval` per object, within `budget`.
    pub fn with_budget(interval: Duration, budget: Budget) -> Self {
        Self {
            interval,
            budget,
            state: Mutex::new(State {
                last_write: HashMap::new(),
                budget: Bucket::full(now()),
            }),
        }
    }

    /// Whether to write `desired` (the status fields this handler owns, as JSON) over `stored`
    /// (the object's stored status, if any) now. Call only when they differ, and write when
    /// this answers [`Pace::Write`]: a progress-only write has then taken its token from the
    /// budget. Call [`StatusPacer::wrote`] after a write.
    pub fn pace(&self, key: &K, stored: Option<&Value>, desired: &Value) -> Pace {
        self.pace_with(key, stored, desired, FirstStatus::Deadline)
    }

    /// [`StatusPacer::pace`], with `first` saying whether a first status has a deadline.
    pub fn pace_with(
        &self,
        key: &K,
        stored: Option<&Value>,
        desired: &Value,
        first: FirstStatus,
    ) -> Pace {
        let now = now();
        let change = classify(stored, desired);
        if change == Change::News {
            return Pace::Write;
        }
        let mut state = self.lock();
        let since = if change == Change::FirstWhileConverging {
            self.forget_old(&mut state.last_write, now);
            Some(*state.last_write.entry(key.clone()).or_insert(now))
        } else {
            state.last_write.get(key).copied()
        };
        if let Some(due) = since.map(|at| at + self.interval)
            && due > now
        {
            return Pace::Defer(due - now);
        }
        // A first status past its deadline is written whatever the budget; before it, a
        // deferral for want of a token wakes no later than the deadline.
        let first_deadline = since
            .filter(|_| change == Change::FirstWhileConverging && first == FirstStatus::Deadline)
            .map(|seen| seen + self.interval * FIRST_STATUS_DEADLINE_INTERVALS);
        if first_deadline.is_some_and(|deadline| deadline <= now) {
            return Pace::Write;
        }
        match state.budget.take(self.budget, now) {
            Ok(()) => Pace::Write,
            Err(until_token) => {
                state.budget.deferrals += 1;
                let delay = until_token + self.spread(key, state.budget.deferrals);
                Pace::Defer(first_deadline.map_or(delay, |deadline| delay.min(deadline - now)))
            }
        }
    }

    /// [`StatusPacer::pace`] for typed statuses. A status that cannot be turned into JSON is
    /// not paced: its write reports the error.
    pub fn pace_typed<S: Serialize>(
        &self,
        key: &K,
        stored: Option<&S>,
        desired: &S,
        first: FirstStatus,
    ) -> Pace {
        match (serde_json::to_value(stored), serde_json::to_value(desired)) {
            (Ok(stored), Ok(desired)) => self.pace_with(key, Some(&stored), &desired, first),
            _ => Pace::Write,
        }
    }

    /// Records a status write of `key` now, and forgets objects written long ago.
    pub fn wrote(&self, key: &K) {
        let now = now();
        let mut state = self.lock();
        self.forget_old(&mut state.last_write, now);
        state.last_write.insert(key.clone(), now);
    }

    fn forget_old(&self, last: &mut HashMap<K, Instant>, now: Instant) {
        let keep = self.interval * FORGET_AFTER_INTERVALS;
        last.retain(|_, at| *at + keep > now);
    }

    /// Less than one interval, from the key and the deferral's number: deterministic, but
    /// different for the objects deferred together and for one object from turn to turn, so
    /// none is always first to wake. Up to a whole interval, so that objects waiting for a
    /// token reconcile again about as often as the per-object rule alone would write them, not
    /// every token period.
    fn spread(&self, key: &K, deferral: u64) -> Duration {
        let mut hasher = DefaultHasher::new();
        key.hash(&mut hasher);
        deferral.hash(&mut hasher);
        let millis = u64::try_from(self.interval.as_millis()).unwrap_or(u64::MAX);
        Duration::from_millis(hasher.finish() % millis.max(1))
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().last_write.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<K>> {
        // The state is only read and replaced field by field, entry by entry: a panic elsewhere
        // cannot leave it half-updated, so a poisoned lock is still usable.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The pacer's clock: the monotonic clock, or in this crate's unit tests a clock each test
/// thread moves by hand (`tests::advance`), so a test of minutes of pacing takes no time and
/// needs no runtime with a paused clock (tokio's `test-util`, which every build would then carry).
#[cfg(not(test))]
fn now() -> Instant {
    Instant::now()
}

#[cfg(test)]
fn now() -> Instant {
    tests::clock()
}

/// What a status change is, for pacing (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Nothing of this handler's status is stored yet, and the object is still converging.
    FirstWhileConverging,
    /// Written at once.
    News,
    /// Written at most once per interval.
    Progress,
}

/// What changes from `stored` to `desired` (see the module documentation). Fields `desired`
/// leaves out are not compared.
pub fn classify(stored: Option<&Value>, desired: &Value) -> Change {
    let phase = |v: &Value| v.get("phase").and_then(Value::as_str).map(str::to_owned);
    let transient = |p: &str| TRANSIENT_PHASES.contains(&p);
    let conditions = |v: &Value| {
        v.get("conditions")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let wanted = conditions(desired);
    let stored = stored.filter(|s| s.is_object());
    let stored_conditions = stored.map(conditions).unwrap_or_default();
    let find = |type_: Option<&Value>| stored_conditions.iter().find(|c| c.get("type") == type_);
    let first = match (stored, phase(desired)) {
        (None, _) => true,
        (Some(stored), Some(_)) => phase(stored).is_none(),
        (Some(_), None) => {
            !wanted.is_empty() && wanted.iter().all(|c| find(c.get("type")).is_none())
        }
    };
    if first {
        let available = wanted.iter().any(|c| {
            c.get("type") == Some(&Value::from(AVAILABLE))
                && c.get("status") == Some(&Value::from("True"))
        });
        let converging = match phase(desired) {
            Some(phase) => transient(&phase) && !available,
            None => wanted
                .iter()
                .any(|c| c.get("status") != Some(&Value::from("True"))),
        };
        return if converging {
            Change::FirstWhileConverging
        } else {
            Change::News
        };
    }
    let Some(stored) = stored else {
        return Change::News;
    };
    let field = |v: &Value, name: &str| v.get(name).cloned().unwrap_or(Value::Null);
    if desired.get("observedGeneration").is_some()
        && field(desired, "observedGeneration") != field(stored, "observedGeneration")
    {
        return Change::News;
    }
    let flipped = wanted
        .iter()
        .any(|c| find(c.get("type")).is_some_and(|s| s.get("status") != c.get("status")));
    let news = flipped
        || match (phase(stored), phase(desired)) {
            (Some(old), Some(new)) => !(transient(&old) && transient(&new)),
            _ => wanted.iter().any(|c| {
                find(c.get("type")).is_none_or(|s| {
                    s.get("status") != c.get("status") || s.get("reason") != c.get("reason")
                })
            }),
        };
    if news { Change::News } else { Change::Progress }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use serde_json::json;

    use super::*;

    thread_local! {
        /// Where this test's clock started, and how far the test has moved it (each test runs
        /// on a thread of its own).
        static CLOCK: (Instant, Cell<Duration>) = (Instant::now(), Cell::new(Duration::ZERO));
    }

    /// The time on this test's clock.
    pub(super) fn clock() -> Instant {
        CLOCK.with(|(start, moved)| *start + moved.get())
    }

    /// Moves this test's clock `by` on.
    fn advance(by: Duration) {
        CLOCK.with(|(_, moved)| moved.set(moved.get() + by));
    }

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

    fn news(stored: &Value, desired: &Value) -> bool {
        classify(Some(stored), desired) == Change::News
    }

    fn progress(stored: &Value, desired: &Value) -> bool {
        classify(Some(stored), desired) == Change::Progress
    }

    #[test]
    fn first_status_waits_only_while_converging() {
        let converging = status("Initializing", 0, "False");
        assert_eq!(classify(None, &converging), Change::FirstWhileConverging);
        assert_eq!(
            classify(Some(&json!({"conditions": []})), &converging),
            Change::FirstWhileConverging,
            "another handler's fields are stored, no phase yet"
        );
        assert_eq!(classify(None, &status("Healthy", 3, "True")), Change::News);
        assert_eq!(
            classify(None, &status("Progressing", 2, "True")),
            Change::News,
            "available while the phase still converges"
        );
        assert_eq!(
            classify(None, &status("Degraded", 0, "False")),
            Change::News
        );
        let other = json!({"phase": "Progressing", "conditions": [{"type": "Available"}]});
        assert_eq!(
            classify(Some(&other), &conditions_only("False", "Waiting", "")),
            Change::FirstWhileConverging,
            "none of this handler's conditions is stored yet"
        );
        assert_eq!(
            classify(Some(&other), &conditions_only("True", "Registered", "")),
            Change::News
        );
    }

    #[test]
    fn a_new_generation_is_news() {
        let mut newer = status("Progressing", 1, "False");
        newer["observedGeneration"] = json!(2);
        assert!(news(&status("Progressing", 1, "False"), &newer));
    }

    #[test]
    fn counts_messages_and_intermediate_phases_are_progress() {
        let stored = status("Initializing", 0, "False");
        assert!(progress(&stored, &status("Initializing", 1, "False")));
        assert!(progress(&stored, &status("Progressing", 2, "False")));
    }

    #[test]
    fn a_condition_changing_status_is_news_while_converging() {
        let stored = status("Progressing", 2, "False");
        assert!(news(&stored, &status("Progressing", 3, "True")));
        let mut reasoned = status("Progressing", 2, "False");
        reasoned["conditions"][0]["reason"] = json!("StillWaiting");
        assert!(
            progress(&stored, &reasoned),
            "a new reason alone is progress"
        );
    }

    #[test]
    fn settled_phases_are_news_both_ways() {
        let converging = status("Progressing", 2, "False");
        let healthy = status("Healthy", 3, "True");
        assert!(news(&converging, &healthy));
        assert!(news(&healthy, &status("Progressing", 2, "False")));
        assert!(news(&converging, &status("Degraded", 2, "False")));
    }

    #[test]
    fn a_settled_object_reports_every_change_at_once() {
        let mut flipped = status("Healthy", 3, "True");
        flipped["conditions"][0]["status"] = json!("False");
        flipped["conditions"][0]["reason"] = json!("NotReady");
        assert!(news(&status("Healthy", 3, "True"), &flipped));
        let mut recounted = status("Healthy", 3, "True");
        recounted["readyReplicas"] = json!(4);
        assert!(news(&status("Healthy", 3, "True"), &recounted));
    }

    #[test]
    fn without_a_phase_conditions_decide() {
        let stored = conditions_only("False", "Waiting", "0 of 2 cells");
        assert!(progress(
            &stored,
            &conditions_only("False", "Waiting", "1 of 2 cells")
        ));
        assert!(news(
            &stored,
            &conditions_only("True", "Registered", "2 of 2 cells")
        ));
        let mut more = conditions_only("False", "Waiting", "0 of 2 cells");
        more["conditions"]
            .as_array_mut()
            .unwrap()
            .push(json!({"type": "Other", "status": "True", "reason": "Set"}));
        assert!(news(&stored, &more), "a condition appears");
    }

    #[test]
    fn a_converging_first_status_is_written_an_interval_after_first_sight() {
        let pacer = StatusPacer::new(Duration::from_secs(5));
        let key = "ns/cell";
        let waiting = status("Progressing", 0, "False");
        assert_eq!(
            pacer.pace(&key, None, &waiting),
            Pace::Defer(Duration::from_secs(5))
        );
        advance(Duration::from_secs(2));
        assert_eq!(
            pacer.pace(&key, None, &status("Progressing", 1, "False")),
            Pace::Defer(Duration::from_secs(3)),
            "the first sight counts, not the latest pass"
        );
        assert_eq!(
            pacer.pace(&key, None, &status("Healthy", 3, "True")),
            Pace::Write,
            "settled before the interval passed: written at once"
        );
        advance(Duration::from_secs(3));
        assert_eq!(pacer.pace(&key, None, &waiting), Pace::Write);
    }

    #[test]
    fn progress_is_written_at_most_once_per_interval() {
        let pacer = StatusPacer::new(Duration::from_secs(5));
        let key = "ns/shard".to_owned();
        let stored = status("Progressing", 1, "False");
        let desired = status("Progressing", 2, "False");
        assert_eq!(pacer.pace(&key, Some(&stored), &desired), Pace::Write);
        pacer.wrote(&key);

        advance(Duration::from_secs(2));
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

        advance(Duration::from_secs(3));
        assert_eq!(
            pacer.pace(&key, Some(&desired), &status("Progressing", 3, "False")),
            Pace::Write
        );
    }

    #[test]
    fn objects_are_forgotten_long_after_their_last_write() {
        let interval = Duration::from_secs(5);
        let forget = interval * FORGET_AFTER_INTERVALS;
        let pacer = StatusPacer::new(interval);
        pacer.wrote(&"a");
        advance(forget / 2);
        pacer.wrote(&"b");
        assert_eq!(pacer.len(), 2);
        advance(forget / 2);
        pacer.wrote(&"c");
        assert_eq!(pacer.len(), 2, "a is forgotten");
        advance(forget);
        pacer.wrote(&"c");
        assert_eq!(pacer.len(), 1);
    }

    /// The token period of the progress budget.
    fn token_period() -> Duration {
        Duration::from_secs(1) / PROGRESS_WRITES_PER_SECOND
    }

    /// Paces a progress-only change of `key`, recording the write if it is allowed.
    fn progress_write(pacer: &StatusPacer<String>, key: &str) -> Pace {
        let key = key.to_owned();
        let pace = pacer.pace(
            &key,
            Some(&status("Progressing", 1, "False")),
            &status("Progressing", 2, "False"),
        );
        if pace == Pace::Write {
            pacer.wrote(&key);
        }
        pace
    }

    /// Spends the whole burst on progress writes of objects `spent-<n>`.
    fn spend_the_burst(pacer: &StatusPacer<String>) {
        for n in 0..PROGRESS_BURST {
            assert_eq!(progress_write(pacer, &format!("spent-{n}")), Pace::Write);
        }
    }

    /// A pacer whose budget is one token per `token_period`, that token just spent.
    fn pacer_with_its_one_token_spent(token_period: Duration) -> StatusPacer<String> {
        let scarce = Budget {
            token_period,
            burst: 1,
        };
        let pacer = StatusPacer::with_budget(MIN_INTERVAL, scarce);
        assert_eq!(progress_write(&pacer, "spender"), Pace::Write);
        pacer
    }

    #[test]
    fn the_burst_is_what_the_rate_refills_in_one_interval() {
        assert_eq!(token_period() * PROGRESS_BURST, MIN_INTERVAL);
    }

    #[test]
    fn the_budget_allows_the_burst_then_defers_progress_until_a_token_is_there() {
        let pacer = StatusPacer::new(MIN_INTERVAL);
        spend_the_burst(&pacer);
        let Pace::Defer(delay) = progress_write(&pacer, "late") else {
            panic!("the budget is spent");
        };
        assert!(
            delay >= token_period() && delay < token_period() + MIN_INTERVAL,
            "{delay:?}"
        );
        advance(delay);
        assert_eq!(progress_write(&pacer, "late"), Pace::Write);
    }

    #[test]
    fn the_budget_refills_at_its_rate_up_to_the_burst() {
        let pacer = StatusPacer::new(MIN_INTERVAL);
        spend_the_burst(&pacer);
        advance(Duration::from_secs(1));
        let writes = |round: &str| {
            (0..2 * PROGRESS_BURST)
                .filter(|n| progress_write(&pacer, &format!("{round}-{n}")) == Pace::Write)
                .count()
        };
        assert_eq!(
            writes("after-a-second"),
            PROGRESS_WRITES_PER_SECOND as usize
        );
        advance(MIN_INTERVAL * 4);
        assert_eq!(
            writes("after-a-long-pause"),
            PROGRESS_BURST as usize,
            "a full bucket holds no more than the burst"
        );
    }

    #[test]
    fn a_smaller_budget_allows_its_own_burst_and_rate() {
        let budget = Budget {
            token_period: Duration::from_secs(2),
            burst: 3,
        };
        let pacer = StatusPacer::with_budget(MIN_INTERVAL, budget);
        let written = |pacer: &StatusPacer<String>, round: u32| {
            (0..10)
                .filter(|n| progress_write(pacer, &format!("r{round}-{n}")) == Pace::Write)
                .count()
        };
        assert_eq!(written(&pacer, 0), 3, "the burst");
        advance(Duration::from_secs(10));
        assert_eq!(written(&pacer, 1), 3, "refilled up to the burst, not five");
        advance(Duration::from_secs(4));
        assert_eq!(written(&pacer, 2), 2, "one token per period");
    }

    #[test]
    fn the_budget_never_holds_back_news_nor_is_spent_by_it() {
        let pacer = StatusPacer::new(MIN_INTERVAL);
        let converging = status("Progressing", 2, "False");
        let healthy = status("Healthy", 3, "True");
        for n in 0..2 * PROGRESS_BURST {
            let key = format!("news-{n}");
            assert_eq!(pacer.pace(&key, Some(&converging), &healthy), Pace::Write);
            pacer.wrote(&key);
        }
        spend_the_burst(&pacer);
        assert!(matches!(progress_write(&pacer, "late"), Pace::Defer(_)));
        let key = "settling".to_owned();
        assert_eq!(pacer.pace(&key, Some(&converging), &healthy), Pace::Write);
        assert_eq!(
            pacer.pace(&key, None, &healthy),
            Pace::Write,
            "a settled first status"
        );
    }

    #[test]
    fn a_converging_first_status_draws_on_the_budget() {
        let pacer = StatusPacer::new(MIN_INTERVAL);
        let key = "first".to_owned();
        let waiting = status("Progressing", 0, "False");
        assert_eq!(pacer.pace(&key, None, &waiting), Pace::Defer(MIN_INTERVAL));
        advance(MIN_INTERVAL);
        spend_the_burst(&pacer);
        let Pace::Defer(delay) = pacer.pace(&key, None, &waiting) else {
            panic!("the budget is spent");
        };
        assert!(delay >= token_period(), "{delay:?}");
        advance(delay);
        assert_eq!(pacer.pace(&key, None, &waiting), Pace::Write);
    }

    #[test]
    fn a_first_status_is_written_by_its_deadline_however_spent_the_budget() {
        let pacer = pacer_with_its_one_token_spent(Duration::from_secs(60));
        let key = "new".to_owned();
        let waiting = status("Initializing", 0, "False");
        assert_eq!(pacer.pace(&key, None, &waiting), Pace::Defer(MIN_INTERVAL));
        advance(MIN_INTERVAL);
        let deadline = MIN_INTERVAL * FIRST_STATUS_DEADLINE_INTERVALS;
        assert_eq!(
            pacer.pace(&key, None, &waiting),
            Pace::Defer(deadline - MIN_INTERVAL),
            "no token for a minute: it wakes at its deadline instead"
        );
        advance(deadline - MIN_INTERVAL);
        assert_eq!(pacer.pace(&key, None, &waiting), Pace::Write);
        pacer.wrote(&key);
        // The one token is spent until 60 s; had the late first status taken another, the next
        // would come at 120 s.
        let Pace::Defer(delay) = progress_write(&pacer, "other") else {
            panic!("the budget is still spent");
        };
        let until_token = Duration::from_secs(60) - deadline;
        assert!(
            delay >= until_token && delay < until_token + MIN_INTERVAL,
            "the late first status took no token: {delay:?}"
        );
        advance(MIN_INTERVAL);
        assert!(
            matches!(
                pacer.pace(&key, Some(&waiting), &status("Initializing", 1, "False")),
                Pace::Defer(_)
            ),
            "its later progress draws on the budget again"
        );
    }

    #[test]
    fn a_first_status_without_a_deadline_waits_for_a_token() {
        let pacer = pacer_with_its_one_token_spent(Duration::from_secs(30));
        let key = "summary".to_owned();
        let waiting = status("Initializing", 0, "False");
        let pace = |pacer: &StatusPacer<String>| {
            pacer.pace_with(&key, None, &waiting, FirstStatus::WhenBudgetAllows)
        };
        assert_eq!(pace(&pacer), Pace::Defer(MIN_INTERVAL));
        advance(MIN_INTERVAL * FIRST_STATUS_DEADLINE_INTERVALS);
        let Pace::Defer(delay) = pace(&pacer) else {
            panic!("past the deadline, but it has none: it waits for the token");
        };
        let until_token = Duration::from_secs(30) - MIN_INTERVAL * FIRST_STATUS_DEADLINE_INTERVALS;
        assert!(
            delay >= until_token && delay < until_token + MIN_INTERVAL,
            "it wakes when the token is expected: {delay:?}"
        );
        advance(delay);
        assert_eq!(pace(&pacer), Pace::Write);
    }

    #[test]
    fn objects_deferred_together_wake_spread_out() {
        let pacer = StatusPacer::new(MIN_INTERVAL);
        spend_the_burst(&pacer);
        let delays: Vec<Duration> = (0..20)
            .map(|n| match progress_write(&pacer, &format!("waiting-{n}")) {
                Pace::Defer(delay) => delay,
                Pace::Write => panic!("the budget is spent"),
            })
            .collect();
        let distinct: std::collections::BTreeSet<_> = delays.iter().collect();
        assert!(distinct.len() >= 18, "{delays:?}");
        let range = delays
            .iter()
            .max()
            .unwrap()
            .saturating_sub(*delays.iter().min().unwrap());
        assert!(range > MIN_INTERVAL / 2, "{delays:?}");
        assert!(
            delays
                .iter()
                .all(|d| *d >= token_period() && *d < token_period() + MIN_INTERVAL),
            "{delays:?}"
        );
        let again = progress_write(&pacer, "waiting-0");
        assert_ne!(again, Pace::Defer(delays[0]), "a new turn, a new spread");
    }

    #[test]
    fn a_few_objects_converging_together_are_paced_as_without_a_budget() {
        let pacer = StatusPacer::new(MIN_INTERVAL);
        let keys: Vec<String> = (0..PROGRESS_BURST).map(|n| format!("object-{n}")).collect();
        let mut writes = 0;
        for second in 0..60 {
            for key in &keys {
                match progress_write(&pacer, key) {
                    Pace::Write => writes += 1,
                    Pace::Defer(delay) => assert!(
                        delay <= MIN_INTERVAL,
                        "{key} at {second} s deferred by {delay:?}"
                    ),
                }
            }
            advance(Duration::from_secs(1));
        }
        assert_eq!(writes, keys.len() * 12, "one write per object per interval");
    }

    #[test]
    fn many_objects_converging_together_share_the_budget() {
        let pacer = StatusPacer::new(MIN_INTERVAL);
        let objects = 100;
        let converged_at = |n: usize| 60 + n % 10;
        let mut stored: Vec<Option<Value>> = vec![None; objects];
        let (mut progress_writes, mut news_writes) = (0, 0);
        let first_deadline = (MIN_INTERVAL * FIRST_STATUS_DEADLINE_INTERVALS).as_secs() as usize;
        for second in 0..70 {
            if second == first_deadline + 1 {
                assert!(
                    stored.iter().all(Option::is_some),
                    "every object shows a status by its deadline"
                );
            }
            for (n, stored) in stored.iter_mut().enumerate() {
                let desired = if second >= converged_at(n) {
                    status("Healthy", 3, "True")
                } else {
                    status("Progressing", (second % 3) as i64, "False")
                };
                if stored.as_ref() == Some(&desired) {
                    continue;
                }
                let news = classify(stored.as_ref(), &desired) == Change::News;
                let key = format!("cluster-{n}");
                if pacer.pace(&key, stored.as_ref(), &desired) == Pace::Write {
                    pacer.wrote(&key);
                    *stored = Some(desired);
                    if news {
                        news_writes += 1
                    } else {
                        progress_writes += 1
                    }
                } else {
                    assert!(!news, "news is written at once");
                }
            }
            advance(Duration::from_secs(1));
        }
        assert_eq!(news_writes, objects, "each object's Healthy status");
        let budget = PROGRESS_BURST as usize + 70 * PROGRESS_WRITES_PER_SECOND as usize;
        assert!(
            progress_writes <= budget + objects,
            "{progress_writes} progress writes: the budget, and at most one first status each \
             beyond it"
        );
        assert!(
            progress_writes >= budget - 20,
            "the budget is used: {progress_writes}"
        );
    }

    #[test]
    fn a_deferred_write_requeues_no_later_than_planned() {
        let (one, three) = (Duration::from_secs(1), Duration::from_secs(3));
        assert_eq!(action(None, Some(three)), Action::requeue(three));
        assert_eq!(action(Some(one), Some(three)), Action::requeue(one));
        assert_eq!(action(Some(three), Some(one)), Action::requeue(one));
        assert_eq!(action(Some(three), None), Action::requeue(three));
        assert_eq!(action(None, None), Action::await_change());
    }
}
