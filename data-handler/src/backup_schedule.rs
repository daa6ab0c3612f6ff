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
//! The decision is pure ([`decide`]); [`crate::backup_runs`] starts and collects the calls, on
//! the path requested backups take too.

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use multigres_api::backup_schedule::Schedule;
use multigres_api::v1alpha1::{
    BackupKind, BackupScheduleConfig, ScheduledBackupAttempt, ScheduledBackupsStatus,
};
use multigres_common::events::Notice;

use crate::backup_runs::{Done, kind_name};

/// Event reason: a scheduled backup started.
pub const STARTED: &str = "ScheduledBackupStarted";
/// Event reason: a scheduled backup completed.
pub const COMPLETED: &str = "ScheduledBackupCompleted";
/// Event reason: a scheduled backup failed.
pub const FAILED: &str = "ScheduledBackupFailed";
/// The longest time before a failed backup is tried again.
pub const RETRY_AFTER: SignedDuration = SignedDuration::from_mins(10);

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

/// The event of a scheduled backup of `kind` started on `pod`.
pub fn started_notice(kind: BackupKind, pod: &str) -> Notice {
    Notice::normal(
        STARTED,
        format!("taking a scheduled {} backup on pod {pod}", kind_name(kind)),
    )
}

/// The event of a scheduled backup that ran as `attempt` and ended with `result`.
pub fn finished_notice(attempt: &ScheduledBackupAttempt, result: &Result<Done, String>) -> Notice {
    let pod = &attempt.pod;
    match result {
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

/// Records in `status` the scheduled backup that ran as `attempt` and ended with `result`.
pub fn record(
    status: &mut ScheduledBackupsStatus,
    mut attempt: ScheduledBackupAttempt,
    result: Result<Done, String>,
) {
    match result {
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

/// What the expiry after a backup did, for a person.
fn expiry_message(done: &Done) -> Option<String> {
    match (&done.expiry_error, done.expired.as_slice()) {
        (Some(error), _) => Some(format!("expiring old backups failed: {error}")),
        (None, []) => None,
        (None, expired) => Some(format!("expired {}", expired.join(", "))),
    }
}

#[cfg(test)]
mod tests;
