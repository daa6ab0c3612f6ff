//! Backup health: how old the shard's newest complete backup is, published on the Shard as
//! `status.lastBackupTime`, `status.lastBackupType` and the condition `BackupHealthy`.
//!
//! The multipoolers take the backups (pgBackRest; scheduled ones on the data-handler's request,
//! `backup_schedule`), and know which are complete. When the shard has a
//! backup configured and the topology names its primary, the primary's multipooler is asked
//! for its backups (`MultipoolerManager.GetBackups`) at most once per [`PACE`] per shard, or at
//! once when the primary changed. The newest complete backup decides: `BackupHealthy` is
//! `True`/`BackupRecent` when it completed at most [`STALE_AFTER`] ago, `False`/`BackupStale`
//! when longer ago, `False`/`NoBackup` when there is none. A check that gets no answer (the
//! multipooler is unreachable, does not answer in time, or internalTLS leaves the data-handler
//! without a client certificate) changes nothing: the published values stay, and the reason is
//! logged. Transitions are announced by events (`BackupHealthy`, Warning `BackupStale`,
//! Warning `NoBackup` when backups disappear).
//!
//! The reading of an answer is pure ([`newest`], [`assess`], [`next`], [`transition`]); [`run`]
//! decides whether to call and calls; the Shard controller writes.
//!
//! Upstream's GetBackups lists pgBackRest's backups oldest first and applies `limit` by keeping
//! the first ones, so a limit would drop the newest backups once the repository holds more
//! than that; the call asks for all of them ([`LIMIT`]): the multipooler runs the same
//! `pgbackrest info` either way, and the retention policy bounds the list.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::civil::DateTime;
use k8s_openapi::jiff::tz::TimeZone;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use kube::runtime::reflector::Store;
use multigres_api::v1alpha1::{
    BackupKind, RecoverableWindow, ScheduledBackupAttempt, ScheduledBackupsStatus, Shard,
    ShardStatus,
};
use multigres_common::conditions::{Computed, DesiredCondition, FALSE, TRUE, set_condition};
use multigres_common::events::Notice;
use multigres_common::status_metrics::StatusGauges;
use multigres_common::telemetry::ErrorChain;
use multigres_proto::multipooler::multipoolermanagerdata::backup_metadata::Status;
use multigres_proto::multipooler::multipoolermanagerdata::{BackupMetadata, GetBackupsRequest};
use serde_json::{Map, Value, json};

use crate::backup_request::Requests;
use crate::backup_runs::Reach;
use crate::dial::Dial;
use crate::postgres_roles::Session;
use crate::recoverable_window;
use crate::reload::{self, RpcError};
use crate::roles;
use crate::watch::Guarded;

/// The condition type.
pub const BACKUP_HEALTHY: &str = "BackupHealthy";
/// Reason: the newest complete backup is recent.
pub const RECENT: &str = "BackupRecent";
/// Reason: the newest complete backup is older than [`STALE_AFTER`].
pub const STALE: &str = "BackupStale";
/// Reason: the repository holds no complete backup.
pub const NONE: &str = "NoBackup";
/// Reason: the last scheduled backup failed, after the newest complete one.
pub const FAILED: &str = "BackupFailed";
/// Age beyond which the newest complete backup is stale (upstream's `BackupStaleThreshold`: a
/// daily schedule plus an hour of slack).
pub const STALE_AFTER: SignedDuration = SignedDuration::from_hours(25);
/// Least time between two checks of one shard with the same primary.
pub const PACE: Duration = Duration::from_secs(60);
/// `GetBackups` limit: 0 is all (see the module documentation).
pub const LIMIT: u32 = 0;
/// Time allowed for `GetBackups`: the multipooler runs `pgbackrest info`, which it allows 30 s
/// (upstream `InfoTimeout`), after taking its action lock.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// A shard not checked for this long (gone, or without a primary) is forgotten.
const FORGET_AFTER: Duration = Duration::from_secs(3600);

/// The newest complete backup of an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Newest {
    /// Its pgBackRest label, e.g. `20261125-175640F`.
    pub id: String,
    /// When it completed (whole seconds).
    pub completed: Timestamp,
    /// Its kind, when the answer says.
    pub kind: Option<BackupKind>,
}

/// Why a check has no answer; the published values stay.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// The multipooler could not be asked.
    #[error(transparent)]
    Rpc(#[from] RpcError),
    /// A complete backup reports no stop time and its label is not a pgBackRest label, so how
    /// old the newest backup is cannot be told.
    #[error("backup {id:?} reports no stop time and its label is not a pgBackRest label")]
    Undated { id: String },
}

impl CheckError {
    /// Whether waiting does not help: only a change of the multipooler (its record, its
    /// version) can. Anything else is transient.
    pub fn is_invalid(&self) -> bool {
        match self {
            CheckError::Rpc(error) => error.is_invalid(),
            CheckError::Undated { .. } => true,
        }
    }
}

/// When `label`'s backup started, from the label: `YYYYMMDD-HHMMSS` and the kind letter, after
/// the label of the full backup it builds on for a differential or incremental one
/// (`20261125-175640F_20261125-180000I`). pgBackRest writes the time of the host that took the
/// backup, which is UTC in the pool pods.
pub fn label_time(label: &str) -> Option<Timestamp> {
    let own = own_label(label)?;
    let stamp = own.get(..own.len() - 1)?;
    let digits = |range: std::ops::Range<usize>| -> Option<i64> {
        let part = stamp.get(range)?;
        part.bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| part.parse().ok())?
    };
    if stamp.len() != 15 || stamp.as_bytes()[8] != b'-' {
        return None;
    }
    let n = |range| digits(range).and_then(|v| i8::try_from(v).ok());
    let year = i16::try_from(digits(0..4)?).ok()?;
    let datetime = DateTime::new(
        year,
        n(4..6)?,
        n(6..8)?,
        n(9..11)?,
        n(11..13)?,
        n(13..15)?,
        0,
    );
    TimeZone::UTC.to_timestamp(datetime.ok()?).ok()
}

/// The part of `label` that names the backup itself (the last, after the full backup's label),
/// if it ends with a kind letter.
fn own_label(label: &str) -> Option<&str> {
    let own = label.rsplit('_').next()?;
    own.ends_with(['F', 'D', 'I']).then_some(own)
}

/// The kind of `backup`: its `type` (`full`, `diff`, `incr`, as pgBackRest reports it), else
/// its label's letter.
pub fn kind_of(backup: &BackupMetadata) -> Option<BackupKind> {
    match backup.r#type.as_str() {
        "full" => Some(BackupKind::Full),
        "diff" => Some(BackupKind::Diff),
        "incr" => Some(BackupKind::Incr),
        _ => match own_label(&backup.backup_id)?.chars().last()? {
            'F' => Some(BackupKind::Full),
            'D' => Some(BackupKind::Diff),
            _ => Some(BackupKind::Incr),
        },
    }
}

/// When `backup` completed: its `stop_timestamp`, else the time in its label (when it
/// started, the best estimate left).
pub fn completed_at(backup: &BackupMetadata) -> Option<Timestamp> {
    match &backup.stop_timestamp {
        Some(stop) if stop.seconds > 0 => Timestamp::from_second(stop.seconds).ok(),
        _ => label_time(&backup.backup_id),
    }
}

/// The newest complete backup among `backups` (`None`: there is none). Incomplete backups do
/// not count; a complete one that cannot be dated makes the answer unusable, since it may be
/// the newest.
pub fn newest(backups: &[BackupMetadata]) -> Result<Option<Newest>, CheckError> {
    let mut best: Option<Newest> = None;
    for backup in backups.iter().filter(|b| b.status() == Status::Complete) {
        let completed = completed_at(backup).ok_or_else(|| CheckError::Undated {
            id: backup.backup_id.clone(),
        })?;
        if best.as_ref().is_none_or(|b| completed >= b.completed) {
            best = Some(Newest {
                id: backup.backup_id.clone(),
                completed,
                kind: kind_of(backup),
            });
        }
    }
    Ok(best)
}

/// How a person reads an age: whole hours, rounded down, so the message changes at most hourly.
fn hours(age: SignedDuration) -> i64 {
    age.as_secs().max(0) / 3600
}

/// `BackupHealthy` for the newest complete backup `found` and the last failed scheduled
/// backup `failure`, at `now`: a failure after the newest backup makes it `BackupFailed`.
pub fn assess(
    found: Option<&Newest>,
    failure: Option<&ScheduledBackupAttempt>,
    now: Timestamp,
) -> Computed {
    let failed_at = failure.and_then(|f| Some((f, f.end_time.as_ref()?.0)));
    if let Some((failure, at)) = failed_at.filter(|(_, at)| found.is_none_or(|n| *at > n.completed))
    {
        let newest = found.map_or("there is no backup".to_owned(), |n| {
            format!(
                "the newest backup is {} ({}h old)",
                n.id,
                hours(now.duration_since(n.completed))
            )
        });
        return Computed::no(
            BACKUP_HEALTHY,
            FAILED,
            format!(
                "The scheduled backup on pod {} failed at {at}: {}; {newest}. It is tried again; \
                 check the pod's multipooler log and the backup repository",
                failure.pod,
                failure.message.as_deref().unwrap_or("no reason given")
            ),
        );
    }
    let Some(newest) = found else {
        return Computed::no(BACKUP_HEALTHY, NONE, "No backups found");
    };
    let what = match newest.kind {
        Some(BackupKind::Full) => "full backup",
        Some(BackupKind::Diff) => "differential backup",
        Some(BackupKind::Incr) => "incremental backup",
        None => "backup",
    };
    let age = now.duration_since(newest.completed);
    let h = hours(age);
    if age <= STALE_AFTER {
        let ago = if h == 0 {
            "less than 1h ago".to_owned()
        } else {
            format!("{h}h ago")
        };
        Computed::yes(
            BACKUP_HEALTHY,
            RECENT,
            format!("Last {what} {} completed {ago}", newest.id),
        )
    } else {
        Computed::no(
            BACKUP_HEALTHY,
            STALE,
            format!(
                "Last {what} {} is over {h}h old (threshold: {}h); check that backups are \
                 scheduled and the multipoolers' logs",
                newest.id,
                STALE_AFTER.as_hours()
            ),
        )
    }
}

/// What this handler publishes about backups on a Shard.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Published {
    /// `status.lastBackupTime`.
    pub time: Option<Time>,
    /// `status.lastBackupType`.
    pub kind: Option<BackupKind>,
    /// The `BackupHealthy` condition.
    pub condition: Option<Condition>,
    /// `status.retainedBackups`.
    pub retained: Vec<String>,
    /// `status.scheduledBackups` (see [`crate::backup_schedule`]).
    pub schedule: Option<ScheduledBackupsStatus>,
    /// The requested backups' fields (see [`crate::backup_request`]).
    pub requests: Requests,
    /// `status.recoverableWindow` (see [`crate::recoverable_window`]).
    pub window: Option<RecoverableWindow>,
}

impl Published {
    /// What `status` holds.
    pub fn of(status: Option<&ShardStatus>) -> Self {
        let Some(status) = status else {
            return Self::default();
        };
        Self {
            time: status.last_backup_time.clone(),
            kind: status.last_backup_type,
            condition: status
                .conditions
                .iter()
                .find(|c| c.type_ == BACKUP_HEALTHY)
                .cloned(),
            retained: status.retained_backups.clone(),
            schedule: status.scheduled_backups.clone(),
            requests: Requests::of(Some(status)),
            window: status.recoverable_window.clone(),
        }
    }

    /// The status fields, for a server-side apply that owns them: absent ones are left out
    /// (and so dropped if this handler had set them). `conditions` carries only
    /// `BackupHealthy`: the list is keyed by type, so other handlers' entries stay.
    pub fn fields(&self) -> Map<String, Value> {
        let mut out = Map::new();
        if let Some(time) = &self.time {
            out.insert("lastBackupTime".into(), json!(time));
        }
        if let Some(kind) = self.kind {
            out.insert("lastBackupType".into(), json!(kind));
        }
        if let Some(condition) = &self.condition {
            out.insert("conditions".into(), json!([condition]));
        }
        if !self.retained.is_empty() {
            out.insert("retainedBackups".into(), json!(self.retained));
        }
        if let Some(schedule) = &self.schedule {
            out.insert("scheduledBackups".into(), json!(schedule));
        }
        out.extend(self.requests.fields());
        if let Some(window) = &self.window {
            out.insert("recoverableWindow".into(), json!(window));
        }
        out
    }
}

/// What to publish after a check found `found` (the newest complete backup, or none) at `now`,
/// over the `stored` values: the backup's time and kind (the previous ones when there is no
/// backup), and `BackupHealthy` (see [`assess`]), whose `lastTransitionTime` moves only when
/// its status does. The retained backups and the schedule's and requests' status stay as
/// stored.
pub fn next(
    stored: &Published,
    found: Option<&Newest>,
    failure: Option<&ScheduledBackupAttempt>,
    now: Timestamp,
    generation: Option<i64>,
) -> Published {
    let computed = assess(found, failure, now);
    let mut conditions: Vec<Condition> = stored.condition.iter().cloned().collect();
    set_condition(
        &mut conditions,
        &DesiredCondition {
            type_: computed.type_,
            status: computed.status,
            reason: computed.reason,
            message: &computed.message,
            observed_generation: generation,
        },
        now,
    );
    Published {
        time: found
            .map(|n| Time(n.completed))
            .or_else(|| stored.time.clone()),
        kind: found.map_or(stored.kind, |n| n.kind),
        condition: conditions.pop(),
        retained: stored.retained.clone(),
        schedule: stored.schedule.clone(),
        requests: stored.requests.clone(),
        window: stored.window.clone(),
    }
}

/// The event for a change of `BackupHealthy` from `old` to `new`: `BackupHealthy` when it
/// becomes `True`; a Warning with the reason when it becomes `False` or changes reason, except
/// `NoBackup` on first sight (a new shard before its first backup).
pub fn transition(old: Option<&Condition>, new: Option<&Condition>) -> Option<Notice> {
    let new = new?;
    let same = old.is_some_and(|o| o.status == new.status && o.reason == new.reason);
    if same {
        return None;
    }
    match new.status.as_str() {
        TRUE => Some(Notice::normal(BACKUP_HEALTHY, new.message.clone())),
        FALSE if old.is_none() && new.reason == NONE => None,
        FALSE => Some(Notice::warning(new.reason.clone(), new.message.clone())),
        _ => None,
    }
}

/// When each shard (`namespace/name`) was last checked, and with which primary.
#[derive(Debug, Default)]
pub struct Checks(Mutex<HashMap<String, (Instant, String)>>);

impl Checks {
    /// Whether `shard` is due a check at `now` with primary `primary`: never checked, checked
    /// [`PACE`] ago or longer, or its primary changed since. A due check is recorded as made.
    /// Shards not checked for an hour are forgotten.
    pub fn due(&self, shard: &str, primary: &str, now: Instant) -> bool {
        self.due_after(shard, primary, now, PACE)
    }

    /// Whether `shard` is due a check at `now` with `key` (what the check depends on, such as
    /// its primary): never checked, checked `pace` ago or longer, or checked with another key.
    /// A due check is recorded as made.
    pub fn due_after(&self, shard: &str, key: &str, now: Instant, pace: Duration) -> bool {
        let mut map = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let due = map
            .get(shard)
            .is_none_or(|(at, k)| k != key || now.saturating_duration_since(*at) >= pace);
        if due {
            map.retain(|_, (at, _)| now.saturating_duration_since(*at) < FORGET_AFTER);
            map.insert(shard.to_owned(), (now, key.to_owned()));
        }
        due
    }

    /// Forgets `shard`'s last check, so the next reconcile checks again (its result could not
    /// be written).
    pub fn forget(&self, shard: &str) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(shard);
    }
}

/// What a check found.
#[derive(Debug)]
pub struct Outcome {
    /// The values to publish.
    pub next: Published,
    /// The transition's event.
    pub notice: Option<Notice>,
}

/// Checks `shard`'s backups when due (see the module documentation), over the `stored` values
/// (with the schedule step's news): `None` when not due, not applicable, or without an answer
/// (logged).
pub async fn run(
    checks: &Checks,
    reach: &Reach<'_>,
    shard: &Shard,
    stored: &Published,
    superuser: Option<&str>,
) -> Option<Outcome> {
    shard.spec.backup.as_ref()?;
    let Reach {
        dial,
        key,
        pods,
        poolers,
    } = *reach;
    let (pod, record) = roles::primary(key, pods, poolers)?;
    let slot = slot(shard);
    if !checks.due(&slot, &pod.name, Instant::now()) {
        return None;
    }
    let Some(address) = reload::address(record) else {
        tracing::debug!(shard = %slot, record = %record.key, "backup health not checked: the primary's pooler record names no gRPC address");
        return None;
    };
    let backups = match check(dial, &address).await {
        Ok(backups) => backups,
        Err(error) => {
            if error.is_invalid() {
                tracing::warn!(shard = %slot, primary = %pod.name, error = %ErrorChain(&error), "cannot tell the backup health; keeping the published one");
            } else {
                tracing::info!(shard = %slot, primary = %pod.name, error = %ErrorChain(&error), "cannot tell the backup health now; keeping the published one");
            }
            return None;
        }
    };
    let found = match newest(&backups) {
        Ok(found) => found,
        Err(error) => {
            tracing::warn!(shard = %slot, primary = %pod.name, error = %ErrorChain(&error), "cannot tell the backup health; keeping the published one");
            return None;
        }
    };
    tracing::debug!(shard = %slot, newest = ?found, "backups checked");
    let archiver = match superuser {
        Some(superuser) => {
            let session = Session {
                key,
                superuser: superuser.to_owned(),
                address: address.clone(),
            };
            recoverable_window::read_archiver(dial, &session)
                .await
                .inspect_err(|why| tracing::info!(shard = %slot, primary = %pod.name, why, "cannot read the archiver now; the recoverable window keeps its latest end"))
                .ok()
        }
        None => None,
    };
    let failure = stored
        .schedule
        .as_ref()
        .and_then(|s| s.last_failure.as_ref());
    let mut next = next(
        stored,
        found.as_ref(),
        failure,
        Timestamp::now(),
        shard.metadata.generation,
    );
    next.retained = retained(&backups);
    next.window = recoverable_window::window(
        recoverable_window::earliest(&backups).as_ref(),
        archiver.as_ref(),
        stored.window.as_ref(),
    );
    let notice = transition(stored.condition.as_ref(), next.condition.as_ref());
    Some(Outcome { next, notice })
}

/// The key of `shard` in the backup steps' memories: `namespace/name`.
pub fn slot(shard: &Shard) -> String {
    format!(
        "{}/{}",
        shard.namespace().unwrap_or_default(),
        shard.name_any()
    )
}

/// Asks the multipooler at `address` for its backups.
async fn check(dial: &Dial, address: &str) -> Result<Vec<BackupMetadata>, CheckError> {
    let backups = dial
        .connect(address, CALL_TIMEOUT)
        .await?
        .get_backups(GetBackupsRequest { limit: LIMIT })
        .await
        .map(|r| r.into_inner().backups)
        .map_err(|source| RpcError::Call {
            rpc: "GetBackups",
            address: address.to_owned(),
            source,
        })?;
    Ok(backups)
}

/// The labels of the complete backups among `backups`, oldest first (by completion, then
/// label).
pub fn retained(backups: &[BackupMetadata]) -> Vec<String> {
    let mut complete: Vec<(Option<Timestamp>, &str)> = backups
        .iter()
        .filter(|b| b.status() == Status::Complete)
        .map(|b| (completed_at(b), b.backup_id.as_str()))
        .collect();
    complete.sort();
    complete.into_iter().map(|(_, id)| id.to_owned()).collect()
}

/// Sets the last-backup gauge of every Shard in `shards` whose status has a backup time.
pub fn collect(gauges: &mut StatusGauges, shards: &Store<Guarded<Shard>>) {
    for shard in shards.state() {
        let Ok(shard) = &shard.0 else { continue };
        if let Some(time) = shard
            .status
            .as_ref()
            .and_then(|s| s.last_backup_time.as_ref())
        {
            gauges.set_shard_last_backup(
                &shard.namespace().unwrap_or_default(),
                &shard.name_any(),
                time.0.as_second(),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use multigres_common::conditions::UNKNOWN;

    use super::*;

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    /// A backup as upstream's multipooler reports it (`backup/list.go`, `parseBackups`).
    fn backup(label: &str, kind: &str, status: Status, stop: Option<&str>) -> BackupMetadata {
        BackupMetadata {
            table_group: "default".into(),
            shard: "0-inf".into(),
            status: status as i32,
            backup_id: label.into(),
            r#type: kind.into(),
            stop_timestamp: stop.map(|s| prost_types::Timestamp {
                seconds: at(s).as_second(),
                nanos: 0,
            }),
            ..Default::default()
        }
    }

    #[test]
    fn labels_give_the_backups_own_time_and_kind() {
        assert_eq!(
            label_time("20261125-175640F"),
            Some(at("2026-11-25T17:56:40Z"))
        );
        assert_eq!(
            label_time("20261125-175640F_20261126-180000I"),
            Some(at("2026-11-26T18:00:00Z")),
            "an incremental's own time, not its full backup's"
        );
        assert_eq!(
            label_time("20261125-175640F_20261126-010203D"),
            Some(at("2026-11-26T01:02:03Z"))
        );
        for bad in [
            "",
            "F",
            "20261125-175640",
            "20261125-175640X",
            "20261325-175640F",
            "2026112-5175640F",
            "20261125-17564aF",
            "+2026112-175640F",
            "20261125-175640F_",
        ] {
            assert_eq!(label_time(bad), None, "{bad}");
        }
        let unlabelled = |label: &str| backup(label, "", Status::Complete, None);
        assert_eq!(
            kind_of(&unlabelled("20261125-175640F")),
            Some(BackupKind::Full)
        );
        assert_eq!(
            kind_of(&unlabelled("20261125-175640F_20261126-010203D")),
            Some(BackupKind::Diff)
        );
        assert_eq!(
            kind_of(&unlabelled("20261125-175640F_20261126-180000I")),
            Some(BackupKind::Incr)
        );
        assert_eq!(kind_of(&unlabelled("nightly")), None);
    }

    #[test]
    fn the_reported_type_and_stop_time_come_first() {
        let b = backup(
            "20261125-175640F",
            "diff",
            Status::Complete,
            Some("2026-11-25T18:30:00Z"),
        );
        assert_eq!(kind_of(&b), Some(BackupKind::Diff));
        assert_eq!(completed_at(&b), Some(at("2026-11-25T18:30:00Z")));
        let types = [
            ("full", BackupKind::Full),
            ("diff", BackupKind::Diff),
            ("incr", BackupKind::Incr),
        ];
        for (name, kind) in types {
            assert_eq!(
                kind_of(&backup("x", name, Status::Complete, None)),
                Some(kind)
            );
        }
        let unset = backup("20261125-175640F", "full", Status::Complete, None);
        assert_eq!(completed_at(&unset), Some(at("2026-11-25T17:56:40Z")));
    }

    #[test]
    fn the_newest_complete_backup_wins() {
        // Oldest first, as pgBackRest lists them; the last one failed.
        let backups = [
            backup(
                "20261123-010000F",
                "full",
                Status::Complete,
                Some("2026-11-23T01:20:00Z"),
            ),
            backup(
                "20261123-010000F_20261125-010000I",
                "incr",
                Status::Complete,
                Some("2026-11-25T01:05:00Z"),
            ),
            backup(
                "20261124-120000F",
                "full",
                Status::Complete,
                Some("2026-11-24T12:40:00Z"),
            ),
            backup(
                "20261125-120000F",
                "full",
                Status::Incomplete,
                Some("2026-11-25T12:30:00Z"),
            ),
            backup("20261126-000000F", "full", Status::Unknown, None),
        ];
        assert_eq!(
            newest(&backups).unwrap(),
            Some(Newest {
                id: "20261123-010000F_20261125-010000I".into(),
                completed: at("2026-11-25T01:05:00Z"),
                kind: Some(BackupKind::Incr),
            }),
            "by completion, not by label: the incremental on the older full is the newest"
        );
        assert_eq!(newest(&[]).unwrap(), None);
        assert_eq!(
            newest(&backups[3..]).unwrap(),
            None,
            "incomplete ones do not count"
        );
        assert_eq!(
            retained(&backups),
            [
                "20261123-010000F",
                "20261124-120000F",
                "20261123-010000F_20261125-010000I"
            ],
            "the complete ones, oldest first"
        );
    }

    #[test]
    fn a_scheduled_backup_that_failed_after_the_newest_one_is_reported() {
        let now = at("2026-11-27T02:30:00Z");
        let failure = ScheduledBackupAttempt {
            start_time: Time(at("2026-11-27T02:00:00Z")),
            end_time: Some(Time(at("2026-11-27T02:01:00Z"))),
            pod: "pool-2".into(),
            backup: None,
            message: Some("Backup at http://pool-2:15200 failed: repository unreachable".into()),
        };
        let older = found("2026-11-26T02:10:00Z", Some(BackupKind::Full));
        let failed = assess(Some(&older), Some(&failure), now);
        assert_eq!((failed.status, failed.reason), (FALSE, FAILED));
        assert_eq!(
            failed.message,
            "The scheduled backup on pod pool-2 failed at 2026-11-27T02:01:00Z: Backup at \
             http://pool-2:15200 failed: repository unreachable; the newest backup is \
             20261125-175640F (24h old). It is tried again; check the pod's multipooler log and \
             the backup repository"
        );
        let since = found("2026-11-27T02:20:00Z", Some(BackupKind::Full));
        let recovered = assess(Some(&since), Some(&failure), now);
        assert_eq!(
            (recovered.status, recovered.reason),
            (TRUE, RECENT),
            "a backup completed after the failure"
        );
        assert_eq!(assess(None, Some(&failure), now).reason, FAILED);
    }

    #[test]
    fn an_undatable_complete_backup_leaves_the_answer_unusable() {
        let backups = [
            backup(
                "20261125-175640F",
                "full",
                Status::Complete,
                Some("2026-11-25T18:00:00Z"),
            ),
            backup("nightly", "full", Status::Complete, None),
        ];
        let error = newest(&backups).unwrap_err();
        assert!(matches!(&error, CheckError::Undated { id } if id == "nightly"));
        assert!(error.is_invalid());
        let undatable_failure = backup("nightly", "full", Status::Incomplete, None);
        assert_eq!(newest(&[undatable_failure]).unwrap(), None);
    }

    fn found(completed: &str, kind: Option<BackupKind>) -> Newest {
        Newest {
            id: "20261125-175640F".into(),
            completed: at(completed),
            kind,
        }
    }

    #[test]
    fn recent_up_to_25_hours_then_stale() {
        let now = at("2026-11-26T19:00:00Z");
        let recent = assess(
            Some(&found("2026-11-26T15:30:00Z", Some(BackupKind::Full))),
            None,
            now,
        );
        assert_eq!((recent.status, recent.reason), (TRUE, RECENT));
        assert_eq!(
            recent.message,
            "Last full backup 20261125-175640F completed 3h ago"
        );
        let edge = assess(Some(&found("2026-11-25T18:00:00Z", None)), None, now);
        assert_eq!((edge.status, edge.reason), (TRUE, RECENT), "exactly 25h");
        assert_eq!(
            edge.message,
            "Last backup 20261125-175640F completed 25h ago"
        );
        let stale = assess(
            Some(&found("2026-11-25T17:59:59Z", Some(BackupKind::Incr))),
            None,
            now,
        );
        assert_eq!((stale.status, stale.reason), (FALSE, STALE));
        assert!(
            stale.message.starts_with(
                "Last incremental backup 20261125-175640F is over 25h old (threshold: 25h)"
            ),
            "{}",
            stale.message
        );
        let fresh = assess(
            Some(&found("2026-11-26T19:00:05Z", Some(BackupKind::Diff))),
            None,
            now,
        );
        assert_eq!(
            (fresh.reason, fresh.message.as_str()),
            (
                RECENT,
                "Last differential backup 20261125-175640F completed less than 1h ago"
            ),
            "a clock ahead of ours is not an error"
        );
        let none = assess(None, None, now);
        assert_eq!(
            (none.status, none.reason, none.message.as_str()),
            (FALSE, NONE, "No backups found")
        );
    }

    #[test]
    fn next_keeps_times_stable_and_the_last_backup_when_none_is_left() {
        let t0 = at("2026-11-26T19:00:00Z");
        let healthy = next(
            &Published::default(),
            Some(&found("2026-11-26T18:00:00Z", Some(BackupKind::Full))),
            None,
            t0,
            Some(3),
        );
        assert_eq!(healthy.time, Some(Time(at("2026-11-26T18:00:00Z"))));
        assert_eq!(healthy.kind, Some(BackupKind::Full));
        let c = healthy.condition.clone().unwrap();
        assert_eq!((c.status.as_str(), c.reason.as_str()), (TRUE, RECENT));
        assert_eq!(
            (c.last_transition_time.clone(), c.observed_generation),
            (Time(t0), Some(3))
        );

        // A minute later: the same values, nothing to write.
        let again = next(
            &healthy,
            Some(&found("2026-11-26T18:00:00Z", Some(BackupKind::Full))),
            None,
            at("2026-11-26T19:01:00Z"),
            Some(3),
        );
        assert_eq!(again, healthy);

        // An hour later the age in the message moves, the transition time does not.
        let later = next(
            &healthy,
            Some(&found("2026-11-26T18:00:00Z", Some(BackupKind::Full))),
            None,
            at("2026-11-26T20:00:00Z"),
            Some(3),
        );
        let c = later.condition.unwrap();
        assert!(c.message.ends_with("completed 2h ago"), "{}", c.message);
        assert_eq!(c.last_transition_time, Time(t0));

        let gone = next(&healthy, None, None, at("2026-11-26T21:00:00Z"), Some(3));
        assert_eq!((gone.time, gone.kind), (healthy.time.clone(), healthy.kind));
        let c = gone.condition.unwrap();
        assert_eq!((c.status.as_str(), c.reason.as_str()), (FALSE, NONE));
        assert_eq!(c.last_transition_time, Time(at("2026-11-26T21:00:00Z")));

        let unknown_kind = next(
            &healthy,
            Some(&found("2026-11-26T22:00:00Z", None)),
            None,
            at("2026-11-26T22:00:00Z"),
            Some(3),
        );
        assert_eq!(unknown_kind.kind, None, "not the previous backup's kind");
    }

    fn condition(status: &str, reason: &str) -> Condition {
        Condition {
            type_: BACKUP_HEALTHY.into(),
            status: status.into(),
            reason: reason.into(),
            message: "m".into(),
            observed_generation: None,
            last_transition_time: Time(Timestamp::UNIX_EPOCH),
        }
    }

    #[test]
    fn transitions_are_announced_once() {
        let recent = condition(TRUE, RECENT);
        let stale = condition(FALSE, STALE);
        let none = condition(FALSE, NONE);
        let event = |old: Option<&Condition>, new: &Condition| {
            transition(old, Some(new)).map(|n| (n.type_, n.reason))
        };
        use kube::runtime::events::EventType::{Normal, Warning};
        assert_eq!(event(None, &recent), Some((Normal, BACKUP_HEALTHY.into())));
        assert_eq!(event(Some(&recent), &recent), None);
        assert_eq!(event(Some(&recent), &stale), Some((Warning, STALE.into())));
        assert_eq!(event(Some(&stale), &stale), None);
        assert_eq!(
            event(Some(&stale), &recent),
            Some((Normal, BACKUP_HEALTHY.into()))
        );
        assert_eq!(event(None, &stale), Some((Warning, STALE.into())));
        assert_eq!(
            event(None, &none),
            None,
            "a new shard before its first backup"
        );
        assert_eq!(event(Some(&recent), &none), Some((Warning, NONE.into())));
        assert_eq!(event(Some(&none), &stale), Some((Warning, STALE.into())));
        assert_eq!(event(Some(&recent), &condition(UNKNOWN, "X")), None);
        assert_eq!(transition(Some(&recent), None), None);
    }

    #[test]
    fn checks_are_paced_per_shard_unless_the_primary_changes() {
        let checks = Checks::default();
        let t0 = Instant::now();
        assert!(checks.due("ns/s", "p-0", t0));
        assert!(!checks.due("ns/s", "p-0", t0 + Duration::from_secs(10)));
        assert!(checks.due("ns/other", "p-0", t0), "per shard");
        assert!(
            checks.due("ns/s", "p-1", t0 + Duration::from_secs(20)),
            "new primary"
        );
        assert!(!checks.due("ns/s", "p-1", t0 + Duration::from_secs(79)));
        assert!(checks.due("ns/s", "p-1", t0 + Duration::from_secs(80)));
        checks.forget("ns/s");
        assert!(checks.due("ns/s", "p-1", t0 + Duration::from_secs(81)));
        assert!(checks.due("ns/s", "p-1", t0 + Duration::from_secs(4000)));
        assert_eq!(
            checks.0.lock().unwrap().keys().collect::<Vec<_>>(),
            ["ns/s"],
            "shards not checked for an hour are forgotten"
        );
    }

    #[test]
    fn published_reads_and_writes_only_its_fields() {
        let status = ShardStatus {
            last_backup_time: Some(Time(at("2026-01-02T03:04:05Z"))),
            last_backup_type: Some(BackupKind::Incr),
            conditions: vec![
                Condition {
                    type_: "Available".into(),
                    ..condition(TRUE, "Ready")
                },
                condition(FALSE, STALE),
            ],
            ..Default::default()
        };
        let published = Published::of(Some(&status));
        assert_eq!(published.condition, Some(condition(FALSE, STALE)));
        assert_eq!(
            Value::Object(published.fields()),
            json!({
                "lastBackupTime": "2026-01-02T03:04:05Z",
                "lastBackupType": "incr",
                "conditions": [{
                    "type": "BackupHealthy", "status": "False", "reason": "BackupStale",
                    "message": "m", "lastTransitionTime": "1970-01-01T00:00:00Z",
                }],
            })
        );
        assert_eq!(Published::of(None), Published::default());
        assert!(Published::default().fields().is_empty());
    }

    /// Upstream's answer on the wire, made with `protoc
    /// --encode=multipoolermanagerdata.GetBackupsResponse` from upstream's
    /// `multipoolermanagerdata.proto`: `backups { table_group: "default" shard: "0-inf" status:
    /// COMPLETE backup_id: "20261125-175640F" type: "full" stop_timestamp { seconds: 1795629420 }
    /// } backups { table_group: "default" shard: "0-inf" status: INCOMPLETE backup_id:
    /// "20261125-175640F_20261126-180000I" type: "incr" stop_timestamp { seconds: 1795716030 } }`.
    #[test]
    fn an_upstream_answer_decodes() {
        use multigres_proto::multipooler::multipoolermanagerdata::GetBackupsResponse;
        use prost::Message;
        const ANSWER_HEX: &str = "0a320a0764656661756c741205302d696e66180222103230323631313235\
                                  2d31373536343046420466756c6c620608ecc29cd8060a430a0764656661\
                                  756c741205302d696e661801222132303236313132352d31373536343046\
                                  5f32303236313132362d313830303030494204696e6372620608bee7a1d8\
                                  06";
        let bytes: Vec<u8> = (0..ANSWER_HEX.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&ANSWER_HEX[i..i + 2], 16).unwrap())
            .collect();
        let response = GetBackupsResponse::decode(bytes.as_slice()).unwrap();
        assert_eq!(response.backups[1].status(), Status::Incomplete);
        assert_eq!(
            newest(&response.backups).unwrap(),
            Some(Newest {
                id: "20261125-175640F".into(),
                completed: at("2026-11-25T17:57:00Z"),
                kind: Some(BackupKind::Full),
            })
        );
    }
}
