//! Scheduled backups (`backup.schedule`): Multigres takes one backup when a shard is created
//! and none after, so the data-handler asks for the others.
//!
//! When the schedule's first time after the newest backup (or the last scheduled one, whichever
//! ended later) has come, the data-handler asks a serving replica's multipooler for a backup
//! (`MultipoolerManager.Backup`, as multiadmin does; the primary only when the shard has no
//! other pod), and after it completes, for the expiry of old backups with the schedule's
//! `retainFull` (`ExpireBackups`). A failed backup is tried again at the schedule's next time, or
//! [`RETRY_AFTER`] after it failed when that is sooner (a daily schedule should not wait a day
//! after a passing fault, such as a WAL segment archived late). The
//! calls run in a task of their own; the Shard's `status.scheduledBackups` shows the running
//! one, the last success and the last failure with its reason, and the schedule's next time.
//! Everything the decision needs is in that status, so a restarted data-handler carries on
//! where the previous one stopped; a backup whose call it abandoned is taken again.
//!
//! The decision is pure ([`decide`]); [`run`] starts and collects the calls.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use multigres_api::backup_schedule::Schedule;
use multigres_api::v1alpha1::{
    BackupKind, BackupScheduleConfig, ScheduledBackupAttempt, ScheduledBackupsStatus, Shard,
};
use multigres_common::events::Notice;
use multigres_common::telemetry::ErrorChain;
use multigres_proto::multipooler::multipoolermanagerdata::{BackupRequest, ExpireBackupsRequest};
use multigres_proto::topo::PoolerServingStatus;

use crate::backup_health;

use crate::dial::Dial;
use crate::reload::{self, RpcError};
use crate::roles::{self, PoolPod, ShardKey};
use crate::topo::PoolerRecord;

/// Event reason: a scheduled backup started.
pub const STARTED: &str = "ScheduledBackupStarted";
/// Event reason: a scheduled backup completed.
pub const COMPLETED: &str = "ScheduledBackupCompleted";
/// Event reason: a scheduled backup failed.
pub const FAILED: &str = "ScheduledBackupFailed";
/// The longest time before a failed backup is tried again.
pub const RETRY_AFTER: SignedDuration = SignedDuration::from_mins(10);
/// How often a running backup is looked at.
pub const POLL: Duration = Duration::from_secs(10);
/// Time allowed for each call: Multigres allows a backup 30 minutes (`BackupTimeout`), after
/// it waits for its action lock and the shard's backup lease.
const CALL_TIMEOUT: Duration = Duration::from_secs(35 * 60);
/// The pgBackRest option `retainFull` sets on `ExpireBackups` (underscores, as the RPC wants).
const RETENTION_FULL: &str = "repo1_retention_full";

/// What the schedule asks for now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Take a backup now.
    Start,
    /// Nothing before `until` (`None`: nothing until the spec or the backups change).
    Wait { until: Option<Timestamp> },
    /// The expression does not parse (the webhook refuses it; an object written without the
    /// webhook can still hold one).
    Invalid(String),
}

/// Whether `config`'s schedule asks for a backup at `now`, given what `stored` says of past
/// scheduled backups and when the newest backup of the repository completed.
pub fn decide(
    config: &BackupScheduleConfig,
    stored: Option<&ScheduledBackupsStatus>,
    newest: Option<Timestamp>,
    now: Timestamp,
) -> Decision {
    let schedule = match Schedule::parse(&config.cron) {
        Ok(schedule) => schedule,
        Err(message) => return Decision::Invalid(message),
    };
    if config.suspend {
        return Decision::Wait { until: None };
    }
    let ended = |a: &ScheduledBackupAttempt| a.end_time.as_ref().map(|t| t.0);
    let last_success = stored.and_then(|s| s.last_success.as_ref()).and_then(ended);
    // Before the shard's first backup there is nothing to schedule after: Multigres takes it.
    let Some(anchor) = newest.into_iter().chain(last_success).max() else {
        return Decision::Wait { until: None };
    };
    let Some(next) = schedule.next_after(anchor) else {
        return Decision::Wait { until: None };
    };
    let failed = stored
        .and_then(|s| s.last_failure.as_ref())
        .and_then(ended)
        .filter(|failed| *failed >= anchor);
    let due = match failed {
        Some(failed) => {
            // Saturating: the status is writable by anyone who may patch `shards/status`, and
            // a failure dated in the year 9999 must not overflow (a panic aborts the handler).
            let soon = failed.checked_add(RETRY_AFTER).unwrap_or(Timestamp::MAX);
            let retry = schedule.next_after(failed).map_or(soon, |t| t.min(soon));
            next.max(retry)
        }
        None => next,
    };
    if due <= now {
        Decision::Start
    } else {
        Decision::Wait { until: Some(due) }
    }
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

/// A backup being taken: the attempt as published, and where its call leaves the result.
struct Run {
    attempt: ScheduledBackupAttempt,
    result: Arc<Mutex<Option<Result<Done, String>>>>,
}

/// The running backup of each shard (`namespace/name`).
#[derive(Default)]
pub struct Runs(Mutex<HashMap<String, Run>>);

impl Runs {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Run>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// What the schedule step found for one Shard.
#[derive(Debug, Default)]
pub struct Outcome {
    /// `status.scheduledBackups` to publish.
    pub status: Option<ScheduledBackupsStatus>,
    /// Events.
    pub notices: Vec<Notice>,
    /// Whether a backup finished now: the repository's backups changed.
    pub finished: bool,
    /// Whether a backup is running (its end is looked for every [`POLL`]).
    pub running: bool,
}

/// The schedule step of `shard`: collects a finished backup, starts a due one, and says what
/// to publish. `newest` is when the newest backup of the repository completed.
pub fn run(
    runs: &Runs,
    dial: &Dial,
    shard: &Shard,
    key: ShardKey<'_>,
    pods: &[PoolPod],
    poolers: &BTreeMap<String, Option<Vec<PoolerRecord>>>,
    newest: Option<Timestamp>,
) -> Outcome {
    let slot = backup_health::slot(shard);
    let stored = shard
        .status
        .as_ref()
        .and_then(|s| s.scheduled_backups.clone());
    let config = shard.spec.backup.as_ref().and_then(|b| b.schedule.as_ref());
    let Some(config) = config else {
        runs.lock().remove(&slot);
        return Outcome::default();
    };
    let now = Timestamp::now();
    let mut status = stored.clone().unwrap_or_default();
    let mut outcome = Outcome::default();
    if let Some(finished) = collect(runs, &slot, now) {
        outcome.finished = true;
        outcome.notices.push(finished.notice());
        finished.record(&mut status);
    }
    if runs.lock().contains_key(&slot) {
        outcome.running = true;
        outcome.status = Some(status);
        return outcome;
    }
    status.running = None;
    match decide(config, Some(&status), newest, now) {
        Decision::Start => match source(key, pods, poolers) {
            Some((pod, address, on_primary)) => {
                let call = Call {
                    dial: dial.clone(),
                    address,
                    on_primary,
                };
                let attempt = start(runs, &slot, config, &pod.name, call, now);
                outcome.notices.push(Notice::normal(
                    STARTED,
                    format!(
                        "taking a scheduled {} backup on pod {}",
                        kind_name(config.type_),
                        pod.name
                    ),
                ));
                status.running = Some(attempt);
                status.next_time = None;
                outcome.running = true;
            }
            None => {
                tracing::info!(shard = %slot, "scheduled backup due, but no serving replica to take it on; waiting");
            }
        },
        Decision::Wait { until } => status.next_time = until.map(Time),
        Decision::Invalid(message) => {
            tracing::warn!(shard = %slot, %message, "backup schedule not followed");
            status.next_time = None;
        }
    }
    outcome.status = Some(status);
    outcome
}

/// A backup whose call ended, as collected.
struct Finished {
    attempt: ScheduledBackupAttempt,
    result: Result<Done, String>,
}

impl Finished {
    fn notice(&self) -> Notice {
        let pod = &self.attempt.pod;
        match &self.result {
            Ok(done) => Notice::normal(
                COMPLETED,
                format!("scheduled backup {} completed on pod {pod}", done.backup)
                    + &expiry_message(done)
                        .map(|m| format!("; {m}"))
                        .unwrap_or_default(),
            ),
            Err(message) => Notice::warning(
                FAILED,
                format!(
                    "scheduled backup on pod {pod} failed: {message}; it is tried again at the \
                     schedule's next time, within {} minutes; see the multipooler's log of that \
                     pod",
                    RETRY_AFTER.as_mins()
                ),
            ),
        }
    }

    fn record(self, status: &mut ScheduledBackupsStatus) {
        let mut attempt = self.attempt;
        match self.result {
            Ok(done) => {
                attempt.message = expiry_message(&done);
                attempt.backup = Some(done.backup);
                status.last_success = Some(attempt);
            }
            Err(message) => {
                attempt.message = Some(message);
                status.last_failure = Some(attempt);
            }
        }
    }
}

/// What the expiry after a backup did, for a person.
fn expiry_message(done: &Done) -> Option<String> {
    match (&done.expiry_error, done.expired.as_slice()) {
        (Some(error), _) => Some(format!("expiring old backups failed: {error}")),
        (None, []) => None,
        (None, expired) => Some(format!("expired {}", expired.join(", "))),
    }
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
    let mut attempt = map.remove(slot)?.attempt;
    attempt.end_time = Some(Time(now));
    Some(Finished { attempt, result })
}

/// How a backup's calls reach the multipooler of the pod it is taken on.
struct Call {
    dial: Dial,
    address: String,
    /// The pod is the primary (the shard has no other pool pod).
    on_primary: bool,
}

/// Starts the calls for a backup of `slot` on `pod` and records the run.
fn start(
    runs: &Runs,
    slot: &str,
    config: &BackupScheduleConfig,
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
        r#type: kind_name(config.type_).to_owned(),
        ..Default::default()
    };
    let retain_full = config.retain_full;
    let slot_name = slot.to_owned();
    let into = result.clone();
    tokio::spawn(async move {
        let outcome = take(&call.dial, &call.address, request, retain_full).await;
        match &outcome {
            Ok(done) => {
                tracing::info!(shard = %slot_name, backup = %done.backup, expired = ?done.expired, "scheduled backup completed")
            }
            Err(message) => tracing::warn!(shard = %slot_name, %message, "scheduled backup failed"),
        }
        *into.lock().unwrap_or_else(PoisonError::into_inner) = Some(outcome);
    });
    runs.lock().insert(
        slot.to_owned(),
        Run {
            attempt: attempt.clone(),
            result,
        },
    );
    attempt
}

/// The kind as `MultipoolerManager.Backup` names it.
fn kind_name(kind: Option<BackupKind>) -> &'static str {
    match kind.unwrap_or(BackupKind::Full) {
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
