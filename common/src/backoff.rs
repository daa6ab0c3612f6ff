//! Per-object exponential backoff with jitter for reconcile errors.
//!
//! kube's `error_policy` is stateless and never told about successes, so each controller keeps
//! one [`ObjectBackoff`] in its context: call [`ObjectBackoff::next_delay`] from the error
//! policy and [`ObjectBackoff::reset`] after a successful reconcile. Jitter keeps objects that
//! failed together (an API server outage) from retrying in lockstep.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::Duration;

use kube::runtime::controller::Action;
use rand::Rng;

/// How delays grow.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BackoffPolicy {
    /// Delay after the first failure.
    pub base: Duration,
    /// Upper bound of the delay before jitter.
    pub max: Duration,
    /// Relative spread: the delay is multiplied by a factor drawn from `[1 - jitter, 1 + jitter]`.
    pub jitter: f64,
}

impl Default for BackoffPolicy {
    /// 1 s doubling to 5 min, ±20 %.
    fn default() -> Self {
        Self {
            base: Duration::from_secs(1),
            max: Duration::from_secs(300),
            jitter: 0.2,
        }
    }
}

impl BackoffPolicy {
    /// The delay after `failures` consecutive failures (1 for the first), before jitter:
    /// `base * 2^(failures - 1)`, capped at `max`.
    pub fn delay(&self, failures: u32) -> Duration {
        let factor = 1u32
            .checked_shl(failures.saturating_sub(1))
            .unwrap_or(u32::MAX);
        self.base
            .checked_mul(factor)
            .unwrap_or(self.max)
            .min(self.max)
    }

    /// The delay after `failures` failures with jitter drawn from `rng`.
    pub fn jittered_delay(&self, failures: u32, rng: &mut impl Rng) -> Duration {
        let delay = self.delay(failures);
        if self.jitter <= 0.0 {
            return delay;
        }
        let factor = rng.random_range((1.0 - self.jitter)..=(1.0 + self.jitter));
        delay.mul_f64(factor.max(0.0))
    }
}

/// Consecutive failure counts per object, keyed by anything hashable (normally
/// `kube::runtime::reflector::ObjectRef<K>`).
#[derive(Debug)]
pub struct ObjectBackoff<Key> {
    policy: BackoffPolicy,
    failures: Mutex<HashMap<Key, u32>>,
}

impl<Key: Hash + Eq + Clone> ObjectBackoff<Key> {
    /// No object has failed yet.
    pub fn new(policy: BackoffPolicy) -> Self {
        Self {
            policy,
            failures: Mutex::new(HashMap::new()),
        }
    }

    fn failures_map(&self) -> std::sync::MutexGuard<'_, HashMap<Key, u32>> {
        // Nothing panics while the lock is held; recover the counts if something ever does.
        self.failures
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records one more failure of `key` and returns how long to wait before retrying it.
    pub fn next_delay(&self, key: &Key) -> Duration {
        self.next_delay_with(key, &mut rand::rng())
    }

    /// [`Self::next_delay`] with a caller-supplied random source.
    pub fn next_delay_with(&self, key: &Key, rng: &mut impl Rng) -> Duration {
        let failures = {
            let mut map = self.failures_map();
            let count = map.entry(key.clone()).or_insert(0);
            *count = count.saturating_add(1);
            *count
        };
        self.policy.jittered_delay(failures, rng)
    }

    /// What a controller does after a failed reconcile of `key`: a spec problem waits for the
    /// object to change (retrying cannot fix it); anything else is retried after the next delay.
    pub fn after_error(&self, key: &Key, invalid_spec: bool) -> Action {
        if invalid_spec {
            Action::await_change()
        } else {
            Action::requeue(self.next_delay(key))
        }
    }

    /// Forgets the failures of `key` after a success (or its deletion).
    pub fn reset(&self, key: &Key) {
        self.failures_map().remove(key);
    }

    /// Consecutive failures recorded for `key`.
    pub fn failures(&self, key: &Key) -> u32 {
        self.failures_map().get(key).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::reflector::ObjectRef;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;

    const NO_JITTER: BackoffPolicy = BackoffPolicy {
        base: Duration::from_millis(500),
        max: Duration::from_secs(10),
        jitter: 0.0,
    };

    #[test]
    fn delay_doubles_up_to_the_cap() {
        let delays: Vec<_> = (1..=7).map(|n| NO_JITTER.delay(n)).collect();
        assert_eq!(
            delays,
            [500, 1000, 2000, 4000, 8000, 10_000, 10_000].map(Duration::from_millis)
        );
        assert_eq!(NO_JITTER.delay(u32::MAX), Duration::from_secs(10));
    }

    #[test]
    fn jitter_stays_in_bounds_and_varies() {
        let policy = BackoffPolicy {
            jitter: 0.2,
            ..NO_JITTER
        };
        let mut rng = StdRng::seed_from_u64(7);
        let samples: Vec<_> = (0..200)
            .map(|_| policy.jittered_delay(3, &mut rng))
            .collect();
        for d in &samples {
            assert!(
                (Duration::from_millis(1600)..=Duration::from_millis(2400)).contains(d),
                "{d:?}"
            );
        }
        let distinct: std::collections::HashSet<_> = samples.iter().collect();
        assert!(
            distinct.len() > 100,
            "jitter barely varies: {}",
            distinct.len()
        );
    }

    #[test]
    fn a_spec_problem_waits_for_a_change_and_anything_else_backs_off() {
        let backoff = ObjectBackoff::new(NO_JITTER);
        let a = ObjectRef::<ConfigMap>::new("a").within("ns");
        assert_eq!(backoff.after_error(&a, true), Action::await_change());
        assert_eq!(
            backoff.after_error(&a, false),
            Action::requeue(Duration::from_millis(500))
        );
        assert_eq!(
            backoff.after_error(&a, false),
            Action::requeue(Duration::from_secs(1))
        );
    }

    #[test]
    fn failures_are_counted_per_object_and_reset_on_success() {
        let backoff = ObjectBackoff::new(NO_JITTER);
        let a = ObjectRef::<ConfigMap>::new("a").within("ns");
        let b = ObjectRef::<ConfigMap>::new("b").within("ns");

        assert_eq!(backoff.next_delay(&a), Duration::from_millis(500));
        assert_eq!(backoff.next_delay(&a), Duration::from_secs(1));
        assert_eq!(backoff.next_delay(&a), Duration::from_secs(2));
        assert_eq!(backoff.next_delay(&b), Duration::from_millis(500));
        assert_eq!(backoff.failures(&a), 3);
        assert_eq!(backoff.failures(&b), 1);

        backoff.reset(&a);
        assert_eq!(backoff.failures(&a), 0);
        assert_eq!(backoff.next_delay(&a), Duration::from_millis(500));
        assert_eq!(backoff.failures(&b), 1);
    }
}
