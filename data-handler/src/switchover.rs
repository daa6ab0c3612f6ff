//! Switchovers the resource-handler asks for before it removes or restarts a primary pool pod.
//!
//! The request is the pod annotation `multigres.com/switchover-requested` (its value, a time,
//! identifies it). For a pod whose pooler record says it is the primary, and while another
//! pooler of the shard is registered to take over, the pod's multipooler is asked to
//! `ResignLeadership`: it drains writes, restarts PostgreSQL as a standby and publishes
//! REQUESTING_DEMOTION, and multiorch appoints a new leader. The call does not wait for that:
//! the role labels follow the topology as usual, and the resource-handler waits for them. Each
//! request resigns once: the request a resignation answered is recorded on the pod as
//! `multigres.com/switchover-resigned` (and in memory, in case that write fails). A failed call
//! is retried with exponential backoff, and each distinct failure is announced once as a
//! Warning event on the Shard.
//!
//! Deciding is pure ([`decide`], [`has_standby`], [`backoff`]); [`run`] calls, and the Shard
//! controller writes what it answers (the pod annotations, the events).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};
use multigres_api::labels::{CELL, SWITCHOVER_REQUESTED, SWITCHOVER_RESIGNED};
use multigres_api::v1alpha1::Shard;
use multigres_common::events::Notice;
use multigres_common::telemetry::ErrorChain;
use multigres_proto::multipooler::multipoolermanagerdata::ResignLeadershipRequest;
use multigres_proto::topo::PoolerLifecycleStatus;

use crate::dial::Dial;
use crate::reload::{self, RpcError};
use crate::roles::{self, PoolPod, ShardKey};
use crate::topo::PoolerRecord;
use crate::watch::Guarded;

/// How soon a shard with a pending switchover is looked at again.
pub const POLL: Duration = Duration::from_secs(5);
/// Time allowed for `ResignLeadership`: it drains writes and restarts PostgreSQL.
const CALL_TIMEOUT: Duration = Duration::from_secs(120);
/// First retry delay after a failed call; doubled after each further failure.
const BACKOFF_BASE: Duration = Duration::from_secs(5);
/// Longest retry delay.
const BACKOFF_MAX: Duration = Duration::from_secs(300);

/// A pool pod, as far as switchovers go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRequest {
    /// Pod name.
    pub name: String,
    /// Its cell label.
    pub cell: Option<String>,
    /// Its pending request.
    pub requested: Option<String>,
    /// The request its multipooler resigned for.
    pub resigned: Option<String>,
    /// Whether it is being deleted.
    pub deleting: bool,
}

impl PodRequest {
    /// The switchover state of `pod`.
    pub fn of(pod: &Pod) -> Self {
        let annotation = |key: &str| pod.annotations().get(key).cloned();
        Self {
            name: pod.name_any(),
            cell: pod.labels().get(CELL).cloned(),
            requested: annotation(SWITCHOVER_REQUESTED),
            resigned: annotation(SWITCHOVER_RESIGNED),
            deleting: pod.metadata.deletion_timestamp.is_some(),
        }
    }
}

/// What to do about one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// No request, nothing recorded.
    Idle,
    /// No request, but the record of an answered one is left: remove it.
    Forget,
    /// Requested, but the topology does not say the pod is the primary (it handed over, or its
    /// cell could not be read): nothing to do.
    NotPrimary,
    /// Its multipooler resigned for this request: multiorch appoints a new leader.
    Resigned,
    /// The primary, but no other pooler of the shard is registered to take over.
    NoStandby,
    /// The primary, but its pooler record names no gRPC address.
    NoAddress {
        /// The record's key.
        record: String,
    },
    /// Ask the multipooler at `address` to resign.
    Resign {
        /// Its management service.
        address: String,
    },
}

/// Decides for `pod`, given its pooler `record` (from the cells read now), whether another
/// pooler can take over (`standby`), and whether it already resigned for the pending request
/// by this handler's memory (`resigned`).
pub fn decide(
    pod: &PodRequest,
    record: Option<&PoolerRecord>,
    standby: bool,
    resigned: bool,
) -> Decision {
    let Some(request) = pod.requested.as_deref().filter(|_| !pod.deleting) else {
        return if pod.resigned.is_some() && !pod.deleting {
            Decision::Forget
        } else {
            Decision::Idle
        };
    };
    let Some(record) = record.filter(|r| r.is_primary()) else {
        return Decision::NotPrimary;
    };
    if resigned || pod.resigned.as_deref() == Some(request) {
        return Decision::Resigned;
    }
    if !standby {
        return Decision::NoStandby;
    }
    match reload::address(record) {
        Some(address) => Decision::Resign { address },
        None => Decision::NoAddress {
            record: record.key.clone(),
        },
    }
}

/// Whether a pooler of `shard` other than `pod`'s, not shut down and not the primary, is
/// registered in a cell read now: one multiorch can appoint (upstream's SwitchPrimary asks the
/// same before it resigns a leader).
pub fn has_standby(
    shard: ShardKey<'_>,
    pod: &str,
    poolers: &BTreeMap<String, Option<Vec<PoolerRecord>>>,
) -> bool {
    poolers.values().flatten().flatten().any(|r| {
        roles::of_shard(r, shard)
            && !roles::serves_pod(r, pod)
            && !r.is_primary()
            && r.pooler
                .lifecycle_status
                .as_ref()
                .is_none_or(|l| l.status() != PoolerLifecycleStatus::LifecycleShutdown)
    })
}

/// The delay before retrying after `failures` failed calls in a row.
pub fn backoff(failures: u32) -> Duration {
    BACKOFF_BASE
        .saturating_mul(2u32.saturating_pow(failures.saturating_sub(1)))
        .min(BACKOFF_MAX)
}

/// What this handler remembers of one pod's pending request.
#[derive(Debug, Clone)]
struct Attempt {
    /// The request.
    request: String,
    /// Calls failed in a row.
    failures: u32,
    /// No call before this.
    next: Option<Instant>,
    /// Its multipooler resigned for the request.
    resigned: bool,
    /// The last reason announced by an event.
    announced: Option<String>,
}

/// The pending requests' attempts, keyed `namespace/pod`.
#[derive(Debug, Default)]
pub struct Attempts(Mutex<HashMap<String, Attempt>>);

impl Attempts {
    fn with<T>(&self, key: &str, request: &str, f: impl FnOnce(&mut Attempt) -> T) -> T {
        let mut map = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let attempt = map.entry(key.to_owned()).or_insert_with(|| Attempt {
            request: request.to_owned(),
            failures: 0,
            next: None,
            resigned: false,
            announced: None,
        });
        if attempt.request != request {
            *attempt = Attempt {
                request: request.to_owned(),
                failures: 0,
                next: None,
                resigned: false,
                announced: None,
            };
        }
        f(attempt)
    }

    fn forget(&self, key: &str) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(key);
    }

    /// Drops the entries of `namespace` whose pod is not in `live`.
    fn retain(&self, namespace: &str, live: impl Fn(&str) -> bool) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .retain(|key, _| {
                key.split_once('/')
                    .is_none_or(|(ns, pod)| ns != namespace || live(pod))
            });
    }
}

/// What [`run`] borrows from the Shard controller's context.
pub struct StepInputs<'a> {
    /// Pending switchover requests' attempts (backoff, events announced).
    pub switchovers: &'a Attempts,
    /// Pool pods in the cache: the attempts of pods gone from it are dropped.
    pub pods: &'a Store<Guarded<Pod>>,
    /// How to reach the shard's multipoolers.
    pub dial: &'a Dial,
}

/// What to write about one pod, for the Shard controller.
#[derive(Debug)]
pub struct Answer<'p> {
    /// The pod.
    pub pod: &'p Pod,
    /// The new value of its `multigres.com/switchover-resigned` annotation, when it changes:
    /// the request its multipooler resigned for, or `None` to remove the record of a withdrawn
    /// request.
    pub record: Option<Option<String>>,
    /// The event to publish about it (each distinct one once per request).
    pub notice: Option<Notice>,
}

/// What one pass found.
#[derive(Debug, Default)]
pub struct Outcome<'p> {
    /// A switchover is pending: look again after [`POLL`].
    pub pending: bool,
    /// What to write, pod by pod.
    pub answers: Vec<Answer<'p>>,
}

/// Answers the switchover requests on `pods` (the shard's pool pods): calls the multipoolers
/// that must resign, and returns what to write.
pub async fn run<'p>(
    lent: &StepInputs<'_>,
    shard: &Shard,
    key: ShardKey<'_>,
    pods: &'p [Pod],
    poolers: &BTreeMap<String, Option<Vec<PoolerRecord>>>,
) -> Outcome<'p> {
    let mut out = Outcome::default();
    let namespace = shard.namespace().unwrap_or_default();
    lent.switchovers.retain(&namespace, |pod| {
        lent.pods
            .get(&ObjectRef::new(pod).within(&namespace))
            .is_some()
    });
    for pod in pods {
        let state = PodRequest::of(pod);
        let slot = format!("{namespace}/{}", state.name);
        let pool_pod = PoolPod {
            name: state.name.clone(),
            cell: state.cell.clone(),
        };
        let record = roles::pooler_of(key, &pool_pod, poolers);
        let standby = has_standby(key, &state.name, poolers);
        let request = state.requested.clone().unwrap_or_default();
        let remembered = lent.switchovers.with(&slot, &request, |a| a.resigned);
        let decision = decide(&state, record, standby, remembered);
        out.pending |= !matches!(decision, Decision::Idle | Decision::Forget);
        let reply = act(lent, &slot, &request, &state.name, decision).await;
        let notice = reply.notice.filter(|notice| {
            let note = notice.message.clone();
            lent.switchovers.with(&slot, &request, |a| {
                a.announced.replace(note.clone()).as_ref() != Some(&note)
            })
        });
        if reply.record.is_some() || notice.is_some() {
            out.answers.push(Answer {
                pod,
                record: reply.record,
                notice,
            });
        }
    }
    out
}

/// What carrying out a decision comes to for one pod.
#[derive(Debug, Default)]
struct Reply {
    /// The change of its record, as [`Answer::record`].
    record: Option<Option<String>>,
    /// Its event, before it is checked against the one last announced.
    notice: Option<Notice>,
}

/// Carries out `decision` for pod `name`, whose attempts are kept under `slot` for `request`.
/// Nothing comes of a call whose retry is not due yet.
async fn act(
    lent: &StepInputs<'_>,
    slot: &str,
    request: &str,
    name: &str,
    decision: Decision,
) -> Reply {
    let attempts = lent.switchovers;
    match decision {
        Decision::Idle => {
            attempts.forget(slot);
            Reply::default()
        }
        Decision::Forget => {
            attempts.forget(slot);
            Reply {
                record: Some(None),
                notice: None,
            }
        }
        Decision::Resign { address } => {
            let due = attempts.with(slot, request, |a| {
                a.next.is_none_or(|t| Instant::now() >= t)
            });
            if !due {
                return Reply::default();
            }
            resign_for(lent, slot, request, name, &address).await
        }
        waiting => Reply {
            record: None,
            notice: waiting_notice(&waiting, name),
        },
    }
}

/// The event of pod `name`'s request while it waits by `decision`: none while it waits
/// quietly, or when nothing waits.
fn waiting_notice(decision: &Decision, name: &str) -> Option<Notice> {
    match decision {
        Decision::Idle | Decision::Forget | Decision::NotPrimary | Decision::Resigned => None,
        Decision::NoStandby => Some(Notice::warning(
            "SwitchoverBlocked",
            format!(
                "pod {name}: a switchover is requested, but no other pooler of the shard is \
                 registered to take over; waiting for one"
            ),
        )),
        Decision::NoAddress { record } => Some(Notice::warning(
            "SwitchoverPending",
            format!(
                "pod {name}: a switchover is requested, but its multipooler record {record} has \
                 no hostname or no {:?} port; waiting for it to re-register",
                reload::GRPC_PORT
            ),
        )),
        Decision::Resign { .. } => None,
    }
}

/// Asks pod `name`'s multipooler at `address` to resign for `request`, and remembers the
/// outcome under `slot`: a resignation (recorded on the pod too), or a failure (retried
/// with backoff).
async fn resign_for(
    lent: &StepInputs<'_>,
    slot: &str,
    request: &str,
    name: &str,
    address: &str,
) -> Reply {
    let attempts = lent.switchovers;
    match resign(lent.dial, address).await {
        Ok(flush_lsn) => {
            tracing::info!(pod = %name, %flush_lsn, "multipooler resigned leadership for a switchover");
            attempts.with(slot, request, |a| a.resigned = true);
            let notice = Notice::normal(
                "ResignedLeadership",
                format!(
                    "pod {name}: its multipooler resigned leadership for the requested \
                     switchover (writes quiesced at LSN {flush_lsn}); multiorch appoints another \
                     pooler"
                ),
            );
            Reply {
                record: Some(Some(request.to_owned())),
                notice: Some(notice),
            }
        }
        Err(error) => {
            let delay = attempts.with(slot, request, |a| {
                a.failures += 1;
                let delay = backoff(a.failures);
                a.next = Some(Instant::now() + delay);
                delay
            });
            tracing::warn!(pod = %name, error = %ErrorChain(&error), retry_in = ?delay, "ResignLeadership failed");
            let notice = Notice::warning(
                "SwitchoverFailed",
                format!(
                    "pod {name}: ResignLeadership failed: {}; retrying with backoff",
                    ErrorChain(&error)
                ),
            );
            Reply {
                record: None,
                notice: Some(notice),
            }
        }
    }
}

/// Calls `MultipoolerManager.ResignLeadership` at `address`; returns the LSN at which writes
/// were quiesced.
async fn resign(dial: &Dial, address: &str) -> Result<String, RpcError> {
    dial.connect(address, CALL_TIMEOUT)
        .await?
        .resign_leadership(ResignLeadershipRequest {})
        .await
        .map(|r| r.into_inner().flush_lsn)
        .map_err(|source| RpcError::Call {
            rpc: "ResignLeadership",
            address: address.to_owned(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use multigres_proto::topo::{
        Id, Multipooler, PoolerLifecycle, RoutingRole, RoutingState, ShardKey as Key, id,
    };

    use super::*;

    const SHARD: ShardKey<'static> = ShardKey {
        database: "postgres",
        table_group: "default",
        shard: "0-inf",
    };

    fn record(pod: &str, role: RoutingRole, port: Option<i32>) -> PoolerRecord {
        let mut pooler = Multipooler {
            id: Some(Id {
                component: id::ComponentType::Multipooler as i32,
                cell: "zone-a".into(),
                name: pod.into(),
            }),
            shard_key: Some(Key {
                database: "postgres".into(),
                table_group: "default".into(),
                shard: "0-inf".into(),
            }),
            hostname: format!("{pod}.pool.ns.svc"),
            routing_state: Some(RoutingState {
                role: role as i32,
                rule: None,
            }),
            ..Default::default()
        };
        if let Some(port) = port {
            pooler.port_map.insert(reload::GRPC_PORT.into(), port);
        }
        PoolerRecord {
            key: format!("/multigres/zone-a/poolers/multipooler-zone-a-{pod}/Pooler"),
            revision: 0,
            id: format!("multipooler-zone-a-{pod}"),
            pooler,
        }
    }

    fn pod(requested: Option<&str>, resigned: Option<&str>) -> PodRequest {
        PodRequest {
            name: "p-0".into(),
            cell: Some("zone-a".into()),
            requested: requested.map(Into::into),
            resigned: resigned.map(Into::into),
            deleting: false,
        }
    }

    #[test]
    fn a_requested_primary_with_a_standby_is_asked_to_resign_once() {
        let primary = record("p-0", RoutingRole::Primary, Some(15270));
        let asked = pod(Some("t1"), None);
        assert_eq!(
            decide(&asked, Some(&primary), true, false),
            Decision::Resign {
                address: "http://p-0.pool.ns.svc:15270".into()
            }
        );
        assert_eq!(
            decide(&pod(Some("t1"), Some("t1")), Some(&primary), true, false),
            Decision::Resigned,
            "recorded on the pod"
        );
        assert_eq!(
            decide(&asked, Some(&primary), true, true),
            Decision::Resigned,
            "remembered"
        );
        assert_eq!(
            decide(&pod(Some("t2"), Some("t1")), Some(&primary), true, false),
            Decision::Resign {
                address: "http://p-0.pool.ns.svc:15270".into()
            },
            "a renewed request resigns again"
        );
    }

    #[test]
    fn nothing_is_called_without_a_standby_an_address_or_the_primary_role() {
        let asked = pod(Some("t1"), None);
        let primary = record("p-0", RoutingRole::Primary, Some(15270));
        assert_eq!(
            decide(&asked, Some(&primary), false, false),
            Decision::NoStandby
        );
        let unreachable = record("p-0", RoutingRole::Primary, None);
        assert!(matches!(
            decide(&asked, Some(&unreachable), true, false),
            Decision::NoAddress { record } if record.contains("multipooler-zone-a-p-0")
        ));
        let replica = record("p-0", RoutingRole::Replica, Some(15270));
        assert_eq!(
            decide(&asked, Some(&replica), true, false),
            Decision::NotPrimary,
            "handed over"
        );
        assert_eq!(decide(&asked, None, true, false), Decision::NotPrimary);
        let mut deleting = asked.clone();
        deleting.deleting = true;
        assert_eq!(
            decide(&deleting, Some(&primary), true, false),
            Decision::Idle
        );
    }

    #[test]
    fn the_record_of_a_withdrawn_request_is_removed() {
        let primary = record("p-0", RoutingRole::Primary, Some(15270));
        assert_eq!(
            decide(&pod(None, Some("t1")), Some(&primary), true, false),
            Decision::Forget
        );
        assert_eq!(
            decide(&pod(None, None), Some(&primary), true, false),
            Decision::Idle
        );
    }

    #[test]
    fn a_standby_is_another_live_pooler_of_the_shard() {
        let read = |records: Vec<PoolerRecord>| {
            BTreeMap::from([
                ("zone-a".to_owned(), Some(records)),
                ("zone-b".to_owned(), None),
            ])
        };
        let primary = record("p-0", RoutingRole::Primary, Some(1));
        assert!(!has_standby(SHARD, "p-0", &read(vec![primary.clone()])));
        let replica = record("p-1", RoutingRole::Replica, Some(1));
        assert!(has_standby(
            SHARD,
            "p-0",
            &read(vec![primary.clone(), replica.clone()])
        ));
        let mut stopped = replica.clone();
        stopped.pooler.lifecycle_status = Some(PoolerLifecycle {
            status: PoolerLifecycleStatus::LifecycleShutdown as i32,
            reason: String::new(),
            updated: None,
        });
        assert!(!has_standby(
            SHARD,
            "p-0",
            &read(vec![primary.clone(), stopped])
        ));
        let mut other_shard = replica;
        other_shard.pooler.shard_key.as_mut().unwrap().shard = "80-inf".into();
        assert!(!has_standby(
            SHARD,
            "p-0",
            &read(vec![primary, other_shard])
        ));
    }

    #[test]
    fn retries_back_off_exponentially_up_to_a_bound() {
        assert_eq!(backoff(1), Duration::from_secs(5));
        assert_eq!(backoff(2), Duration::from_secs(10));
        assert_eq!(backoff(4), Duration::from_secs(40));
        assert_eq!(backoff(10), BACKOFF_MAX);
        assert_eq!(backoff(u32::MAX), BACKOFF_MAX);
    }

    #[test]
    fn attempts_follow_the_request_and_are_dropped_with_their_pod() {
        let attempts = Attempts::default();
        attempts.with("ns/p-0", "t1", |a| {
            a.failures = 3;
            a.resigned = true;
        });
        assert!(attempts.with("ns/p-0", "t1", |a| a.resigned));
        assert_eq!(
            attempts.with("ns/p-0", "t2", |a| (a.failures, a.resigned)),
            (0, false),
            "a new request starts afresh"
        );
        attempts.with("other/p-0", "t1", |_| ());
        attempts.retain("ns", |_| false);
        assert_eq!(
            attempts.0.lock().unwrap().keys().collect::<Vec<_>>(),
            ["other/p-0"]
        );
    }

    #[test]
    fn a_pods_annotations_are_its_request() {
        let mut p = Pod::default();
        p.metadata.name = Some("p-0".into());
        p.metadata.labels = Some(BTreeMap::from([(CELL.to_owned(), "zone-a".to_owned())]));
        p.metadata.annotations = Some(BTreeMap::from([
            (SWITCHOVER_REQUESTED.to_owned(), "t2".to_owned()),
            (SWITCHOVER_RESIGNED.to_owned(), "t1".to_owned()),
        ]));
        assert_eq!(PodRequest::of(&p), pod(Some("t2"), Some("t1")));
    }
}
