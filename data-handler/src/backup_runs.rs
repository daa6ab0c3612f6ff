//! The one path by which the data-handler takes a backup, scheduled ([`crate::backup_schedule`])
//! or requested ([`crate::backup_request`]): it asks a serving replica's multipooler for it
//! (`MultipoolerManager.Backup`, as multiadmin does; the primary only when the shard has no
//! other pod), in a task of its own, and collects the result at a later reconcile.
//!
//! A shard runs one backup at a time: Multigres serialises them anyway (its action lock and the
//! shard's backup lease), and one run per shard lets a request that arrives while another backup
//! runs be queued in status rather than fail on the lease. A request goes before the schedule:
//! a person waits for it.
//!
//! [`run`] is the backup step of a Shard reconcile: it collects a finished backup, lets the
//! requests' decision and then the schedule's start the next one, and says what to publish.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use multigres_api::v1alpha1::{
    BackupKind, MultigresCluster, ScheduledBackupAttempt, ScheduledBackupsStatus, Shard,
};
use multigres_common::events::Notice;
use multigres_common::telemetry::ErrorChain;
use multigres_proto::multipooler::multipoolermanagerdata::{BackupRequest, ExpireBackupsRequest};
use multigres_proto::topo::PoolerServingStatus;

use crate::backup_health;
use crate::backup_request::{self, Requests};
use crate::backup_schedule::{self, Decision};
use crate::dial::Dial;
use crate::reload::{self, RpcError};
use crate::roles::{self, PoolPod, ShardKey};
use crate::topo::PoolerRecord;

/// How often a running backup is looked at.
pub const POLL: Duration = Duration::from_secs(10);
/// Time allowed for each call: Multigres allows a backup 30 minutes (`BackupTimeout`), after
/// it waits for its action lock and the shard's backup lease.
const CALL_TIMEOUT: Duration = Duration::from_secs(35 * 60);
/// The pgBackRest option `retainFull` sets on `ExpireBackups` (underscores, as the RPC wants).
const RETENTION_FULL: &str = "repo1_retention_full";

/// Why a backup is taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Purpose {
    /// The schedule's time came.
    Scheduled,
    /// The cluster's annotation asked for it.
    Requested {
        /// The request id.
        id: String,
        /// The kind asked for.
        kind: BackupKind,
    },
}

/// The pod to take a backup on, with its multipooler's address: a serving replica; the
/// primary only when the shard has no other pool pod (a backup on the primary loads it).
pub fn source<'p>(
    key: ShardKey<'_>,
    pods: &'p [PoolPod],
    poolers: &BTreeMap<String, Option<Vec<PoolerRecord>>>,
) -> Option<(&'p PoolPod, String, bool)> {
    let serving = |pod: &'p PoolPod| {
        let record = roles::pooler_of(key, pod, poolers)?;
        let serves = record.pooler.serving_status() == PoolerServingStatus::Serving;
        serves
            .then(|| reload::address(record))
            .flatten()
            .map(|address| (pod, address, record.is_primary()))
    };
    let candidates: Vec<(&PoolPod, String, bool)> = pods.iter().filter_map(serving).collect();
    let replica = candidates.iter().find(|(_, _, primary)| !primary).cloned();
    match replica {
        Some(replica) => Some(replica),
        None if pods.len() == 1 => candidates.into_iter().next(),
        None => None,
    }
}

/// What a finished call found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Done {
    /// The new backup's label.
    pub backup: String,
    /// Labels of the backups the expiry removed.
    pub expired: Vec<String>,
    /// Why the expiry failed, if it did (the backup itself completed).
    pub expiry_error: Option<String>,
}

/// A backup being taken: the attempt as published, why, and where its call leaves the result.
struct Run {
    attempt: ScheduledBackupAttempt,
    purpose: Purpose,
    result: Arc<Mutex<Option<Result<Done, String>>>>,
}

/// The running backup of each shard (`namespace/name`).
#[derive(Default)]
pub struct Runs(Mutex<HashMap<String, Run>>);

impl Runs {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Run>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Why `slot`'s running backup is taken, and on which pod.
    fn busy(&self, slot: &str) -> Option<(Purpose, String)> {
        self.lock()
            .get(slot)
            .map(|run| (run.purpose.clone(), run.attempt.pod.clone()))
    }
}

/// What the backup step found for one Shard.
#[derive(Debug, Default)]
pub struct Outcome {
    /// `status.scheduledBackups` to publish (`None` without a schedule).
    pub schedule: Option<ScheduledBackupsStatus>,
    /// The requests' status fields to publish.
    pub requests: Requests,
    /// Events.
    pub notices: Vec<Notice>,
    /// Whether a backup finished now: the repository's backups changed.
    pub finished: bool,
    /// Whether a backup is running (its end is looked for every [`POLL`]).
    pub running: bool,
}

/// Where the backup steps reach the shard's multipoolers.
#[derive(Clone, Copy)]
pub struct Reach<'a> {
    /// The calls' connections.
    pub dial: &'a Dial,
    /// The shard in the topology.
    pub key: ShardKey<'a>,
    /// Its pool pods.
    pub pods: &'a [PoolPod],
    /// Their pooler records, as answered now.
    pub poolers: &'a BTreeMap<String, Option<Vec<PoolerRecord>>>,
}

/// The backup step of `shard` (of `cluster`, whose annotations carry the request): collects a
/// finished backup, starts the next one (a request first, then the schedule's), and says what
/// to publish. `newest` is when the newest backup of the repository completed.
pub fn run(
    runs: &Runs,
    reach: &Reach<'_>,
    shard: &Shard,
    cluster: Option<&MultigresCluster>,
    newest: Option<Timestamp>,
) -> Outcome {
    let slot = backup_health::slot(shard);
    let status = shard.status.as_ref();
    let config = shard.spec.backup.as_ref().and_then(|b| b.schedule.as_ref());
    let now = Timestamp::now();
    let mut outcome = Outcome {
        schedule: config.map(|_| {
            status
                .and_then(|s| s.scheduled_backups.clone())
                .unwrap_or_default()
        }),
        requests: Requests::of(status),
        ..Outcome::default()
    };
    if let Some(finished) = collect(runs, &slot, now) {
        outcome.finished = true;
        match finished.purpose {
            Purpose::Scheduled => {
                // A schedule removed meanwhile publishes nothing more.
                if let Some(schedule) = outcome.schedule.as_mut() {
                    outcome.notices.push(backup_schedule::finished_notice(
                        &finished.attempt,
                        &finished.result,
                    ));
                    backup_schedule::record(schedule, finished.attempt, finished.result);
                }
            }
            Purpose::Requested { id, kind } => {
                let answered =
                    backup_request::finished(&id, kind, finished.attempt, finished.result);
                outcome
                    .notices
                    .push(backup_request::finished_notice(&answered));
                outcome.requests.answer(answered);
            }
        }
    }
    let busy = runs.busy(&slot);
    let asked = cluster.and_then(|c| backup_request::asked(c, shard));
    let unclaimed = shard.unclaimed_repository();
    let decision = unless_unclaimed(
        backup_request::decide(
            asked.as_ref(),
            &outcome.requests,
            busy.as_ref().map(|(purpose, _)| purpose),
        ),
        unclaimed,
    );
    let requested = request(
        runs,
        reach,
        &slot,
        decision,
        busy.as_ref(),
        now,
        &mut outcome,
    );
    if busy.is_some() || requested {
        if !matches!(busy, Some((Purpose::Scheduled, _)))
            && let Some(schedule) = outcome.schedule.as_mut()
        {
            // A scheduled backup shown running whose call a restart abandoned.
            schedule.running = None;
        }
        outcome.running = true;
        return outcome;
    }
    let (Some(config), Some(schedule)) = (config, outcome.schedule.as_mut()) else {
        return outcome;
    };
    schedule.running = None;
    match backup_schedule::decide(config, Some(schedule), newest, now) {
        Decision::Start if unclaimed.is_some() => {
            tracing::warn!(shard = %slot, reason = unclaimed, "scheduled backup due, but the repository is not this cluster's; not taken");
        }
        Decision::Start => match source(reach.key, reach.pods, reach.poolers) {
            Some((pod, address, on_primary)) => {
                let call = Call {
                    dial: reach.dial.clone(),
                    address,
                    on_primary,
                };
                let kind = config.type_.unwrap_or(BackupKind::Full);
                let order = Order {
                    kind,
                    retain_full: config.retain_full,
                    purpose: Purpose::Scheduled,
                };
                let attempt = start(runs, &slot, order, &pod.name, call, now);
                outcome
                    .notices
                    .push(backup_schedule::started_notice(kind, &pod.name));
                schedule.running = Some(attempt);
                schedule.next_time = None;
                outcome.running = true;
            }
            None => {
                tracing::info!(shard = %slot, "scheduled backup due, but no serving replica to take it on; waiting");
            }
        },
        Decision::Wait { until } => schedule.next_time = until.map(Time),
        Decision::Invalid(message) => {
            tracing::warn!(shard = %slot, %message, "backup schedule not followed");
            schedule.next_time = None;
        }
    }
    outcome
}

/// `decision` for a shard whose repository is not marked as its cluster's (`unclaimed`: the
/// resource-handler's `BackupRepository` condition says why): a request is answered Failed
/// with that reason instead of taken, so no backup goes into another cluster's repository.
fn unless_unclaimed(
    decision: backup_request::Decision,
    unclaimed: Option<&str>,
) -> backup_request::Decision {
    match (unclaimed, decision) {
        (Some(why), backup_request::Decision::Start { id, kind, .. }) => {
            backup_request::Decision::Refuse {
                id,
                kind,
                message: format!("not taken: {why}"),
            }
        }
        (_, decision) => decision,
    }
}

/// Follows the requests' `decision` for `slot` (`busy`: the backup running now, and its pod);
/// returns whether a requested backup started.
fn request(
    runs: &Runs,
    reach: &Reach<'_>,
    slot: &str,
    decision: backup_request::Decision,
    busy: Option<&(Purpose, String)>,
    now: Timestamp,
    outcome: &mut Outcome,
) -> bool {
    match decision {
        backup_request::Decision::Nothing => false,
        backup_request::Decision::Queue(queued) => {
            if let Some((purpose, pod)) = busy {
                outcome
                    .notices
                    .push(backup_request::queued_notice(&queued.id, purpose, pod));
            }
            outcome.requests.queued = Some(queued);
            false
        }
        backup_request::Decision::Refuse { id, kind, message } => {
            let answered = backup_request::refused(&id, kind, message, now);
            outcome
                .notices
                .push(backup_request::finished_notice(&answered));
            outcome.requests.answer(answered);
            false
        }
        backup_request::Decision::Start { id, kind, again } => {
            let Some((pod, address, on_primary)) = source(reach.key, reach.pods, reach.poolers)
            else {
                tracing::info!(shard = %slot, request = %id, "backup requested, but no serving replica to take it on; waiting");
                return false;
            };
            let call = Call {
                dial: reach.dial.clone(),
                address,
                on_primary,
            };
            let order = Order {
                kind,
                // Old backups expire after scheduled ones, on the schedule's terms.
                retain_full: None,
                purpose: Purpose::Requested {
                    id: id.clone(),
                    kind,
                },
            };
            let attempt = start(runs, slot, order, &pod.name, call, now);
            let started = backup_request::started(&id, kind, &attempt, again);
            outcome
                .notices
                .push(backup_request::started_notice(&started));
            outcome.requests.start(started);
            true
        }
    }
}

/// A backup whose call ended, as collected.
struct Finished {
    attempt: ScheduledBackupAttempt,
    purpose: Purpose,
    result: Result<Done, String>,
}

/// Takes `slot`'s finished run out of `runs`, stamped with its end.
fn collect(runs: &Runs, slot: &str, now: Timestamp) -> Option<Finished> {
    let mut map = runs.lock();
    let result = map
        .get(slot)?
        .result
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take()?;
    let run = map.remove(slot)?;
    let mut attempt = run.attempt;
    attempt.end_time = Some(Time(now));
    Some(Finished {
        attempt,
        purpose: run.purpose,
        result,
    })
}

/// How a backup's calls reach the multipooler of the pod it is taken on.
struct Call {
    dial: Dial,
    address: String,
    /// The pod is the primary (the shard has no other pool pod).
    on_primary: bool,
}

/// What to ask for.
struct Order {
    kind: BackupKind,
    /// Full backups to keep after it (`None`: no expiry).
    retain_full: Option<u32>,
    purpose: Purpose,
}

/// Starts the calls for a backup of `slot` on `pod` and records the run.
fn start(
    runs: &Runs,
    slot: &str,
    order: Order,
    pod: &str,
    call: Call,
    now: Timestamp,
) -> ScheduledBackupAttempt {
    let attempt = ScheduledBackupAttempt {
        start_time: Time(now),
        end_time: None,
        pod: pod.to_owned(),
        backup: None,
        message: None,
    };
    let result = Arc::new(Mutex::new(None));
    let request = BackupRequest {
        force_primary: call.on_primary,
        r#type: kind_name(order.kind).to_owned(),
        ..Default::default()
    };
    let retain_full = order.retain_full;
    let slot_name = slot.to_owned();
    let why = match &order.purpose {
        Purpose::Scheduled => "scheduled".to_owned(),
        Purpose::Requested { id, .. } => format!("requested ({id})"),
    };
    let into = result.clone();
    tokio::spawn(async move {
        let outcome = take(&call.dial, &call.address, request, retain_full).await;
        match &outcome {
            Ok(done) => {
                tracing::info!(shard = %slot_name, %why, backup = %done.backup, expired = ?done.expired, "backup completed")
            }
            Err(message) => tracing::warn!(shard = %slot_name, %why, %message, "backup failed"),
        }
        *into.lock().unwrap_or_else(PoisonError::into_inner) = Some(outcome);
    });
    runs.lock().insert(
        slot.to_owned(),
        Run {
            attempt: attempt.clone(),
            purpose: order.purpose,
            result,
        },
    );
    attempt
}

/// The kind as `MultipoolerManager.Backup` names it.
pub fn kind_name(kind: BackupKind) -> &'static str {
    match kind {
        BackupKind::Full => "full",
        BackupKind::Diff => "differential",
        BackupKind::Incr => "incremental",
    }
}

/// Asks the multipooler at `address` for the backup, then for the expiry of old ones.
async fn take(
    dial: &Dial,
    address: &str,
    request: BackupRequest,
    retain_full: Option<u32>,
) -> Result<Done, String> {
    let failed = |rpc: &'static str| {
        move |source| {
            ErrorChain(&RpcError::Call {
                rpc,
                address: address.to_owned(),
                source,
            })
            .to_string()
        }
    };
    let mut client = dial
        .connect(address, CALL_TIMEOUT)
        .await
        .map_err(|e| ErrorChain(&e).to_string())?;
    let backup = client
        .backup(request)
        .await
        .map_err(failed("Backup"))?
        .into_inner()
        .backup_id;
    let mut done = Done {
        backup,
        expired: Vec::new(),
        expiry_error: None,
    };
    if let Some(count) = retain_full {
        let request = ExpireBackupsRequest {
            overrides: HashMap::from([(RETENTION_FULL.to_owned(), count.to_string())]),
        };
        match client.expire_backups(request).await {
            Ok(answer) => done.expired = answer.into_inner().expired_backup_ids,
            Err(source) => done.expiry_error = Some(failed("ExpireBackups")(source)),
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests;
