//! What a handler is doing, shared between its controllers (which update it) and the gRPC
//! server (which reports it through grpc.health.v1 and `HandlerInfo`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use multigres_proto::operator::v1::{ControllerCounts, GetInfoResponse};
use tonic_health::ServingStatus;
use tonic_health::pb::health_server::HealthServer;
use tonic_health::server::{HealthReporter, HealthService};

/// How soon a reconcile that found the caches still filling runs again.
pub const UNSYNCED_RETRY: Duration = Duration::from_millis(250);

pub use multigres_proto::operator::v1::LeaderState;

/// The Lease a replica campaigns for, reported by `HandlerInfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseInfo {
    /// `<namespace>/<name>` of the Lease.
    pub lease: String,
    /// This replica's holder identity.
    pub identity: String,
}

#[derive(Debug, Default)]
struct Counts {
    reconciles: u64,
    errors: u64,
}

#[derive(Debug)]
struct Mutable {
    /// The work reported that it can do its job (caches synced, certificate loaded).
    work_ready: bool,
    /// The last attempt to read or write the Lease succeeded.
    lease_reachable: bool,
    /// The handler is shutting down.
    stopped: bool,
    leader_state: LeaderState,
    lease: Option<LeaseInfo>,
    lease_holder: Option<String>,
    synced_kinds: BTreeSet<String>,
    controllers: BTreeMap<String, Counts>,
}

impl Mutable {
    /// Whether this replica may reconcile: it acts (leads, or runs without leader election)
    /// and its work is ready.
    fn acting_ready(&self) -> bool {
        !self.stopped && self.work_ready && self.leader_state != LeaderState::Standby
    }

    /// What grpc.health.v1 reports. Readiness means "can do its job": a leader (or a replica
    /// without leader election) only once its work is ready, so a leader whose caches never
    /// fill (say, its RBAC refuses a watch) stays NOT_SERVING. A standby cannot reconcile,
    /// but its job is to be ready to take over, which it is while it can reach the Lease: a
    /// NOT_SERVING standby would hold every rolling update of the Deployment
    /// (`maxUnavailable: 0` waits for the new, standby, pods to become ready) and count
    /// against the PodDisruptionBudget, for no gain.
    fn serving(&self) -> bool {
        match self.leader_state {
            LeaderState::Standby => !self.stopped && self.lease_reachable,
            _ => self.acting_ready(),
        }
    }
}

#[derive(Debug)]
struct Inner {
    name: String,
    version: String,
    health: HealthReporter,
    /// Held while the health status is computed and published, so concurrent updates publish
    /// in order and the last one reflects the latest state.
    publishing: tokio::sync::Mutex<()>,
    mutable: Mutex<Mutable>,
}

/// Shared, cheaply cloneable handle on a handler's state.
#[derive(Debug, Clone)]
pub struct HandlerState {
    inner: Arc<Inner>,
}

impl HandlerState {
    /// A handler that is not serving yet, with leadership not decided yet and nothing synced.
    pub async fn new(name: impl Into<String>, version: impl Into<String>) -> Self {
        let health = HealthReporter::new();
        // The reporter starts the overall service ("") as SERVING; probes must not pass until
        // the handler says it is ready.
        health
            .set_service_status("", ServingStatus::NotServing)
            .await;
        Self {
            inner: Arc::new(Inner {
                name: name.into(),
                version: version.into(),
                health,
                publishing: tokio::sync::Mutex::new(()),
                mutable: Mutex::new(Mutable {
                    work_ready: false,
                    lease_reachable: false,
                    stopped: false,
                    leader_state: LeaderState::Unspecified,
                    lease: None,
                    lease_holder: None,
                    synced_kinds: BTreeSet::new(),
                    controllers: BTreeMap::new(),
                }),
            }),
        }
    }

    /// Binary name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    fn lock(&self) -> MutexGuard<'_, Mutable> {
        // No code path panics while holding the lock; recover the data if one ever does.
        self.inner
            .mutable
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The grpc.health.v1 service reporting this state's readiness as the overall service `""`.
    pub fn health_service(&self) -> HealthServer<HealthService> {
        HealthServer::new(HealthService::from_health_reporter(
            self.inner.health.clone(),
        ))
    }

    /// Publishes the current readiness to grpc.health.v1.
    async fn publish(&self) {
        let _publishing = self.inner.publishing.lock().await;
        let status = if self.is_serving() {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        self.inner.health.set_service_status("", status).await;
    }

    /// The work reports whether it can do its job: controllers once every cache has had its
    /// first complete list, the webhook once its certificate is loaded. What grpc.health.v1
    /// reports follows from this and the leadership (see [`Self::is_serving`]).
    pub async fn set_ready(&self, ready: bool) {
        self.lock().work_ready = ready;
        self.publish().await;
    }

    /// The handler is stopping: NOT_SERVING from now on, whatever else changes.
    pub async fn stop(&self) {
        self.lock().stopped = true;
        self.publish().await;
    }

    /// Whether grpc.health.v1 reports SERVING: a standby while it can reach the Lease (ready
    /// to take over), a leader or a replica without leader election once its work is ready.
    pub fn is_serving(&self) -> bool {
        self.lock().serving()
    }

    /// Records this replica's leadership, also published as the `multigres_operator_leader`
    /// gauge (1 when acting: leader or leader election off).
    pub async fn set_leader_state(&self, leader_state: LeaderState) {
        self.lock().leader_state = leader_state;
        let acting = matches!(leader_state, LeaderState::Leader | LeaderState::NotElected);
        crate::metrics::set_leader(self.name(), acting);
        self.publish().await;
    }

    /// This replica's leadership.
    pub fn leader_state(&self) -> LeaderState {
        self.lock().leader_state
    }

    /// Records whether the last attempt to read or write the Lease succeeded: a standby that
    /// cannot reach it could not take over, so it is not ready.
    pub async fn set_lease_reachable(&self, reachable: bool) {
        self.lock().lease_reachable = reachable;
        self.publish().await;
    }

    /// Records the Lease this replica campaigns for.
    pub fn set_lease(&self, lease: LeaseInfo) {
        self.lock().lease = Some(lease);
    }

    /// Records the Lease holder last observed (`None` when released or unknown).
    pub fn set_lease_holder(&self, holder: Option<String>) {
        self.lock().lease_holder = holder;
    }

    /// Marks a watched kind as synced (its initial list is in the cache).
    pub fn mark_synced(&self, kind: impl Into<String>) {
        self.lock().synced_kinds.insert(kind.into());
    }

    /// Records one reconcile in the counters `HandlerInfo` reports and in the Prometheus
    /// metrics; `outcome` is `Err(category)` with a short error category on failure.
    pub fn record_reconcile(&self, controller: &str, outcome: Result<(), &str>, elapsed: Duration) {
        {
            let mut mutable = self.lock();
            let counts = mutable
                .controllers
                .entry(controller.to_owned())
                .or_default();
            counts.reconciles += 1;
            if outcome.is_err() {
                counts.errors += 1;
            }
        }
        crate::metrics::record_reconcile(controller, outcome, elapsed);
    }

    /// Whether this replica may reconcile now: it acts (leads, or runs without leader
    /// election) and its work is ready (every cache has had its first complete list). A
    /// controller starts as soon as its own cache is filled, and an object judged before the
    /// others are listed would read what it refers to (a template, a topology server) as
    /// missing and be reported blocked for a moment after every restart, or while a watch is
    /// refused.
    pub fn may_reconcile(&self) -> bool {
        self.lock().acting_ready()
    }

    /// The `HandlerInfo` answer for the current state.
    pub fn info(&self) -> GetInfoResponse {
        let mutable = self.lock();
        let (lease, identity) = mutable
            .lease
            .as_ref()
            .map(|l| (l.lease.clone(), l.identity.clone()))
            .unwrap_or_default();
        GetInfoResponse {
            name: self.inner.name.clone(),
            version: self.inner.version.clone(),
            leader_state: mutable.leader_state.into(),
            synced_kinds: mutable.synced_kinds.iter().cloned().collect(),
            controllers: mutable
                .controllers
                .iter()
                .map(|(controller, counts)| ControllerCounts {
                    controller: controller.clone(),
                    reconciles: counts.reconciles,
                    errors: counts.errors,
                })
                .collect(),
            lease,
            identity,
            lease_holder: mutable.lease_holder.clone().unwrap_or_default(),
            serving: mutable.serving(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic_health::pb::health_check_response::ServingStatus as Probe;

    #[tokio::test]
    async fn info_reflects_updates() {
        let state = HandlerState::new("cluster-handler", "1.2.3").await;
        let info = state.info();
        assert_eq!(info.name, "cluster-handler");
        assert_eq!(info.version, "1.2.3");
        assert_eq!(info.leader_state(), LeaderState::Unspecified);
        assert!(!info.serving);
        assert!(info.lease.is_empty());

        state.mark_synced("Shard");
        state.mark_synced("Cell");
        state.mark_synced("Shard");
        state.record_reconcile("shard", Ok(()), Duration::from_millis(1));
        state.record_reconcile("shard", Err("kube_api"), Duration::from_millis(1));
        state.record_reconcile("cell", Ok(()), Duration::from_millis(1));
        state.set_lease(LeaseInfo {
            lease: "ops/my-lease".to_owned(),
            identity: "pod-a_1234".to_owned(),
        });
        state.set_lease_holder(Some("pod-b_5678".to_owned()));
        state.set_leader_state(LeaderState::Standby).await;
        state.set_lease_reachable(true).await;

        let info = state.info();
        assert_eq!(info.synced_kinds, ["Cell", "Shard"]);
        assert_eq!(
            info.controllers,
            [
                ControllerCounts {
                    controller: "cell".to_owned(),
                    reconciles: 1,
                    errors: 0
                },
                ControllerCounts {
                    controller: "shard".to_owned(),
                    reconciles: 2,
                    errors: 1
                },
            ]
        );
        assert_eq!(info.lease, "ops/my-lease");
        assert_eq!(info.identity, "pod-a_1234");
        assert_eq!(info.lease_holder, "pod-b_5678");
        assert_eq!(info.leader_state(), LeaderState::Standby);
        assert!(info.serving);
        assert!(state.is_serving());
    }

    /// What grpc.health.v1 answers for the overall service, asked the way a probe asks.
    async fn health(state: &HandlerState) -> Probe {
        use tonic_health::pb::health_server::Health;
        let service = HealthService::from_health_reporter(state.inner.health.clone());
        let request = tonic::Request::new(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        });
        service.check(request).await.unwrap().into_inner().status()
    }

    #[tokio::test]
    async fn a_standby_serves_only_while_it_can_reach_the_lease() {
        let state = HandlerState::new("cluster-handler", "1").await;
        state.set_leader_state(LeaderState::Standby).await;
        assert_eq!(health(&state).await, Probe::NotServing, "not read yet");
        state.set_lease_reachable(true).await;
        assert_eq!(health(&state).await, Probe::Serving, "ready to take over");
        assert!(state.info().serving);
        state.set_lease_reachable(false).await;
        assert_eq!(
            health(&state).await,
            Probe::NotServing,
            "could not take over"
        );
    }

    #[tokio::test]
    async fn a_leader_serves_only_once_its_caches_are_synced() {
        let state = HandlerState::new("cluster-handler", "1").await;
        state.set_leader_state(LeaderState::Standby).await;
        state.set_lease_reachable(true).await;
        assert_eq!(health(&state).await, Probe::Serving);

        // Elected, caches not synced (say, RBAC refuses a watch): not ready, however long.
        state.set_leader_state(LeaderState::Leader).await;
        assert_eq!(health(&state).await, Probe::NotServing);
        assert!(!state.info().serving);

        state.set_ready(true).await;
        assert_eq!(health(&state).await, Probe::Serving);
        assert!(state.info().serving);
    }

    #[tokio::test]
    async fn without_leader_election_the_work_alone_decides() {
        let state = HandlerState::new("webhook-server", "1").await;
        state.set_leader_state(LeaderState::NotElected).await;
        assert_eq!(health(&state).await, Probe::NotServing);
        state.set_ready(true).await;
        assert_eq!(health(&state).await, Probe::Serving);
    }

    #[tokio::test]
    async fn a_stopping_handler_never_serves_again() {
        let state = HandlerState::new("cluster-handler", "1").await;
        state.set_leader_state(LeaderState::Leader).await;
        state.set_ready(true).await;
        state.stop().await;
        assert_eq!(health(&state).await, Probe::NotServing);
        state.set_leader_state(LeaderState::Standby).await;
        state.set_lease_reachable(true).await;
        assert_eq!(health(&state).await, Probe::NotServing);
    }
}
