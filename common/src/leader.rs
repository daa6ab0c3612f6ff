//! Active/standby leader election with a `coordination.k8s.io/v1` Lease, the way client-go's
//! leaderelection does it: acquire when the Lease is free or expired, renew every retry period,
//! give up when renewal has failed for the renew deadline, release on shutdown.
//!
//! Expiry is judged on this replica's monotonic clock from when it last saw the Lease change,
//! never by comparing `renewTime` with the local wall clock, so skew between machines cannot make
//! two replicas act at once. Writes use the Lease's `resourceVersion` (optimistic concurrency):
//! when two standbys race for an expired Lease, exactly one update succeeds.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::{Api, Client};
use rand::Rng;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::apply::post_params;
use crate::shutdown::Shutdown;
use crate::state::{HandlerState, LeaderState, LeaseInfo};
use crate::telemetry::ErrorChain;

/// Where and how to campaign.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseConfig {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease.
    pub name: String,
    /// This replica's holder identity; unique per process.
    pub identity: String,
    /// How long the Lease stays valid after a renewal.
    pub lease_duration: Duration,
    /// How long the leader keeps trying to renew before giving up.
    pub renew_deadline: Duration,
    /// Interval between attempts.
    pub retry_period: Duration,
    /// The field manager of this binary's writes, so the Lease's writers are named too.
    pub field_manager: String,
}

/// Why a leader stopped leading before it was asked to.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    /// Another replica holds the Lease now, or renewal failed for the whole renew deadline.
    #[error("lost leadership of Lease {lease}: {reason}")]
    Lost {
        /// `<namespace>/<name>`.
        lease: String,
        /// What happened.
        reason: String,
    },
}

/// A holder identity unique per process: the pod name (POD_NAME, else HOSTNAME, else the
/// kernel host name) and a random suffix, so two processes on one host never share it.
pub fn default_identity() -> String {
    let host = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".to_owned());
    format!("{host}_{:08x}", rand::rng().random::<u32>())
}

/// What this replica last saw of the Lease and when, on its own clock.
#[derive(Debug, Clone, PartialEq)]
struct Observation {
    holder: Option<String>,
    renew_time: Option<MicroTime>,
    lease_duration: Duration,
    seen_at: Instant,
}

impl Observation {
    /// Folds the Lease as read at `now` into the previous observation: the clock restarts only
    /// when the holder or its renew time changed.
    fn update(previous: Option<Self>, spec: &LeaseSpec, now: Instant, fallback: Duration) -> Self {
        let holder = spec
            .holder_identity
            .clone()
            .filter(|holder| !holder.is_empty());
        let lease_duration = spec
            .lease_duration_seconds
            .and_then(|s| u64::try_from(s).ok())
            .map_or(fallback, Duration::from_secs);
        let seen_at = match previous {
            Some(prev) if prev.holder == holder && prev.renew_time == spec.renew_time => {
                prev.seen_at
            }
            _ => now,
        };
        Self {
            holder,
            renew_time: spec.renew_time.clone(),
            lease_duration,
            seen_at,
        }
    }

    fn decide(&self, identity: &str, now: Instant) -> Decision {
        match &self.holder {
            Some(holder) if holder == identity => Decision::Renew,
            None => Decision::Acquire,
            Some(_) if now.duration_since(self.seen_at) >= self.lease_duration => Decision::Acquire,
            Some(holder) => Decision::Standby {
                holder: holder.clone(),
            },
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Decision {
    /// We hold it: refresh renewTime.
    Renew,
    /// Free (released) or expired: take it.
    Acquire,
    /// Someone else holds a live Lease.
    Standby { holder: String },
}

/// Outcome of one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Attempt {
    /// We hold the Lease now.
    Held,
    /// Someone else does (`None` when a race left it unknown).
    NotHeld { holder: Option<String> },
}

fn is_conflict(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 409)
}

/// Campaigns for one Lease on behalf of one process.
#[derive(Debug)]
pub struct LeaderElector {
    api: Api<Lease>,
    config: LeaseConfig,
    observation: Option<Observation>,
}

impl LeaderElector {
    /// An elector that has not read the Lease yet.
    pub fn new(client: Client, config: LeaseConfig) -> Self {
        Self {
            api: Api::namespaced(client, &config.namespace),
            config,
            observation: None,
        }
    }

    fn lease_key(&self) -> String {
        format!("{}/{}", self.config.namespace, self.config.name)
    }

    fn duration_seconds(&self) -> i32 {
        i32::try_from(self.config.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX)
    }

    async fn try_acquire_or_renew(&mut self) -> Result<Attempt, kube::Error> {
        let now = Instant::now();
        let timestamp = MicroTime(Timestamp::now());
        let Some(lease) = self.api.get_opt(&self.config.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.config.name.clone()),
                    namespace: Some(self.config.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.config.identity.clone()),
                    lease_duration_seconds: Some(self.duration_seconds()),
                    acquire_time: Some(timestamp.clone()),
                    renew_time: Some(timestamp),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self
                .api
                .create(&post_params(&self.config.field_manager), &lease)
                .await
            {
                Ok(created) => {
                    self.observe(&created, now);
                    Ok(Attempt::Held)
                }
                Err(e) if is_conflict(&e) => Ok(Attempt::NotHeld { holder: None }),
                Err(e) => Err(e),
            };
        };

        let observation = self.observe(&lease, now);
        let decision = observation.decide(&self.config.identity, now);
        let previous_holder = observation.holder.clone();
        let mut spec = lease.spec.clone().unwrap_or_default();
        match decision {
            Decision::Standby { holder } => {
                return Ok(Attempt::NotHeld {
                    holder: Some(holder),
                });
            }
            Decision::Renew => {}
            Decision::Acquire => {
                if previous_holder.is_some() {
                    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
                }
                spec.holder_identity = Some(self.config.identity.clone());
                spec.acquire_time = Some(timestamp.clone());
            }
        }
        spec.renew_time = Some(timestamp);
        spec.lease_duration_seconds = Some(self.duration_seconds());
        let updated = Lease {
            metadata: lease.metadata.clone(),
            spec: Some(spec),
        };
        match self
            .api
            .replace(
                &self.config.name,
                &post_params(&self.config.field_manager),
                &updated,
            )
            .await
        {
            Ok(stored) => {
                self.observe(&stored, now);
                Ok(Attempt::Held)
            }
            Err(e) if is_conflict(&e) => Ok(Attempt::NotHeld {
                holder: previous_holder,
            }),
            Err(e) => Err(e),
        }
    }

    fn observe(&mut self, lease: &Lease, now: Instant) -> Observation {
        let spec = lease.spec.clone().unwrap_or_default();
        let observation = Observation::update(
            self.observation.take(),
            &spec,
            now,
            self.config.lease_duration,
        );
        self.observation = Some(observation.clone());
        observation
    }

    /// Clears the holder if we still hold the Lease, so a standby takes over at once instead of
    /// waiting for it to expire.
    async fn release(&mut self) -> Result<(), kube::Error> {
        let Some(lease) = self.api.get_opt(&self.config.name).await? else {
            return Ok(());
        };
        let mut spec = lease.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return Ok(());
        }
        let timestamp = MicroTime(Timestamp::now());
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.acquire_time = Some(timestamp.clone());
        spec.renew_time = Some(timestamp);
        let released = Lease {
            metadata: lease.metadata,
            spec: Some(spec),
        };
        self.api
            .replace(
                &self.config.name,
                &post_params(&self.config.field_manager),
                &released,
            )
            .await
            .map(drop)
    }

    /// Campaigns until `stop` fires, publishing leadership on `leading` and in `state`.
    ///
    /// Returns `Ok` after `stop` (releasing the Lease if held) and `Err` when leadership is lost;
    /// the caller must then stop acting at once.
    pub async fn run(
        mut self,
        state: HandlerState,
        leading: watch::Sender<bool>,
        stop: Shutdown,
    ) -> Result<(), LeaderError> {
        let lease = self.lease_key();
        state.set_lease(LeaseInfo {
            lease: lease.clone(),
            identity: self.config.identity.clone(),
        });
        state.set_leader_state(LeaderState::Standby).await;
        tracing::info!(%lease, identity = %self.config.identity, "campaigning for leadership");

        let mut last_renewed: Option<Instant> = None;
        loop {
            // While leading, an attempt may only use what is left of the renew deadline, so a
            // hanging API server cannot keep this replica acting past it.
            let budget = last_renewed.map_or(self.config.renew_deadline, |renewed| {
                self.config.renew_deadline.saturating_sub(renewed.elapsed())
            });
            let attempt = tokio::time::timeout(budget, self.try_acquire_or_renew()).await;
            let now = Instant::now();
            state
                .set_lease_reachable(matches!(attempt, Ok(Ok(_))))
                .await;
            let lost_reason = match attempt {
                Ok(Ok(Attempt::Held)) => {
                    if last_renewed.is_none() {
                        tracing::info!(%lease, "acquired leadership");
                        state.set_lease_holder(Some(self.config.identity.clone()));
                        state.set_leader_state(LeaderState::Leader).await;
                        leading.send_replace(true);
                    }
                    last_renewed = Some(now);
                    None
                }
                Ok(Ok(Attempt::NotHeld { holder })) => {
                    state.set_lease_holder(holder.clone());
                    last_renewed.map(|_| {
                        format!(
                            "the Lease is held by {}",
                            holder.as_deref().unwrap_or("another replica")
                        )
                    })
                }
                Ok(Err(error)) => {
                    let error = ErrorChain(&error).to_string();
                    tracing::warn!(%lease, %error, "cannot acquire or renew the Lease");
                    self.deadline_passed(last_renewed, now, &error)
                }
                Err(_) => {
                    tracing::warn!(%lease, "acquiring or renewing the Lease timed out");
                    self.deadline_passed(last_renewed, now, "the API server did not answer")
                }
            };
            if let Some(reason) = lost_reason {
                state.set_leader_state(LeaderState::Standby).await;
                leading.send_replace(false);
                tracing::error!(%lease, %reason, "lost leadership");
                return Err(LeaderError::Lost { lease, reason });
            }
            tokio::select! {
                () = stop.wait() => break,
                () = tokio::time::sleep(self.config.retry_period) => {}
            }
        }

        if last_renewed.is_some() {
            leading.send_replace(false);
            state.set_leader_state(LeaderState::Standby).await;
            match tokio::time::timeout(self.config.renew_deadline, self.release()).await {
                Ok(Ok(())) => {
                    state.set_lease_holder(None);
                    tracing::info!(%lease, "released leadership");
                }
                Ok(Err(error)) => {
                    tracing::warn!(%lease, error = %ErrorChain(&error), "cannot release the Lease");
                }
                Err(_) => tracing::warn!(%lease, "releasing the Lease timed out"),
            }
        }
        Ok(())
    }

    /// The loss reason once renewal has failed for the whole renew deadline while leading.
    fn deadline_passed(
        &self,
        last_renewed: Option<Instant>,
        now: Instant,
        error: &str,
    ) -> Option<String> {
        let renewed = last_renewed?;
        (now.duration_since(renewed) >= self.config.renew_deadline).then(|| {
            format!(
                "renewal failed for {:?}: {error}",
                self.config.renew_deadline
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DURATION: Duration = Duration::from_secs(15);

    fn spec(holder: Option<&str>, renewed_at: i64) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(str::to_owned),
            renew_time: Some(MicroTime(Timestamp::from_second(renewed_at).unwrap())),
            lease_duration_seconds: Some(15),
            ..LeaseSpec::default()
        }
    }

    #[test]
    fn own_lease_is_renewed() {
        let now = Instant::now();
        let obs = Observation::update(None, &spec(Some("me"), 1), now, DURATION);
        assert_eq!(obs.decide("me", now), Decision::Renew);
    }

    #[test]
    fn free_lease_is_acquired_at_once() {
        let now = Instant::now();
        for holder in [None, Some("")] {
            let obs = Observation::update(None, &spec(holder, 1), now, DURATION);
            assert_eq!(obs.decide("me", now), Decision::Acquire);
        }
    }

    #[test]
    fn live_lease_of_another_means_standby() {
        let start = Instant::now();
        let obs = Observation::update(None, &spec(Some("other"), 1), start, DURATION);
        assert_eq!(
            obs.decide("me", start + Duration::from_secs(14)),
            Decision::Standby {
                holder: "other".to_owned()
            }
        );
    }

    #[test]
    fn lease_not_renewed_for_its_duration_is_taken_over() {
        let start = Instant::now();
        let first = Observation::update(None, &spec(Some("other"), 1), start, DURATION);
        // The same record read again later does not restart the clock.
        let later = start + Duration::from_secs(15);
        let again = Observation::update(Some(first), &spec(Some("other"), 1), later, DURATION);
        assert_eq!(again.seen_at, start);
        assert_eq!(again.decide("me", later), Decision::Acquire);
    }

    #[test]
    fn renewal_by_the_holder_restarts_the_clock() {
        let start = Instant::now();
        let first = Observation::update(None, &spec(Some("other"), 1), start, DURATION);
        let later = start + Duration::from_secs(10);
        let renewed = Observation::update(Some(first), &spec(Some("other"), 11), later, DURATION);
        assert_eq!(renewed.seen_at, later);
        assert_eq!(
            renewed.decide("me", start + Duration::from_secs(20)),
            Decision::Standby {
                holder: "other".to_owned()
            }
        );
        assert_eq!(renewed.decide("me", later + DURATION), Decision::Acquire);
    }

    #[test]
    fn lease_duration_comes_from_the_lease_when_set() {
        let start = Instant::now();
        let mut short = spec(Some("other"), 1);
        short.lease_duration_seconds = Some(1);
        let obs = Observation::update(None, &short, start, DURATION);
        assert_eq!(
            obs.decide("me", start + Duration::from_secs(1)),
            Decision::Acquire
        );
        short.lease_duration_seconds = None;
        let obs = Observation::update(None, &short, start, DURATION);
        assert!(matches!(
            obs.decide("me", start + Duration::from_secs(1)),
            Decision::Standby { .. }
        ));
    }

    #[test]
    fn identities_are_unique_per_call() {
        let a = default_identity();
        let b = default_identity();
        assert_ne!(a, b);
        assert!(
            a.rsplit_once('_')
                .is_some_and(|(host, suffix)| !host.is_empty() && suffix.len() == 8)
        );
    }
}
