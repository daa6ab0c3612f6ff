//! Backups on request: the annotation `multigres.com/backup-request` on a MultigresCluster asks
//! for one backup of every shard, now (docs/backups.md, "Backup on request").
//!
//! An annotation rather than a resource of its own: it needs no new CRD, RBAC rule or
//! controller, it travels with the cluster's manifest (GitOps tools apply it like any other
//! field), and `kubectl annotate` is all a person needs. The value is the request's id, chosen
//! by the requester (`kubectl multigres backup` uses the UTC time, `20261204T221500Z`): a new
//! value asks for a new backup, and the same value applied again asks for nothing, since each
//! Shard's status keeps the ids it answered.
//!
//! Pure: the names, the checks the webhook and the data-handler share, and the roll-up of the
//! shards' answers into the cluster's `status.backupRequest`.

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use crate::v1alpha1::{
    BackupKind, BackupRequestPhase, BackupRequestRollup, BackupRequestState, RequestedBackupStatus,
    Shard, ShardStatus,
};

/// Asks for a backup of every shard of the cluster; the value is the request's id.
pub const REQUEST: &str = "multigres.com/backup-request";

/// Kind of the requested backup: `full`, `diff` or `incr` (default: the schedule's type if the
/// cluster has a schedule, else `full`).
pub const REQUEST_TYPE: &str = "multigres.com/backup-request-type";

/// The longest id: a label value's, so an id can be copied into a label or a name part.
pub const MAX_ID: usize = 63;

/// What an id may be, for messages.
pub const ID_RULE: &str = "1 to 63 letters, digits, '-', '_' or '.', starting and ending with \
                           a letter or digit (e.g. 20261204T221500Z)";

/// What a type may be, for messages.
pub const TYPE_RULE: &str = "full, diff or incr";

/// A request as the annotations state it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The id.
    pub id: String,
    /// The kind asked for; `None` when the annotation is absent (the default applies).
    pub kind: Option<BackupKind>,
}

/// Why the annotations do not state a request that can be followed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// The id is not a label-value-like token.
    #[error("{REQUEST}: {id:?} is not a request id: use {ID_RULE}")]
    Id { id: String },
    /// The type is not one of the kinds.
    #[error("{REQUEST_TYPE}: {kind:?} is not a backup type: use {TYPE_RULE}")]
    Kind { kind: String },
}

/// Whether `id` is a request id: [`ID_RULE`].
pub fn valid_id(id: &str) -> bool {
    let bytes = id.as_bytes();
    let alnum = |b: &u8| b.is_ascii_alphanumeric();
    !bytes.is_empty()
        && bytes.len() <= MAX_ID
        && bytes.first().is_some_and(alnum)
        && bytes.last().is_some_and(alnum)
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// The kind `text` names ([`TYPE_RULE`]).
pub fn parse_kind(text: &str) -> Option<BackupKind> {
    match text {
        "full" => Some(BackupKind::Full),
        "diff" => Some(BackupKind::Diff),
        "incr" => Some(BackupKind::Incr),
        _ => None,
    }
}

/// The request `annotations` state: `None` without [`REQUEST`].
pub fn requested(
    annotations: &BTreeMap<String, String>,
) -> Option<Result<Request, (String, RequestError)>> {
    let id = annotations.get(REQUEST)?;
    if !valid_id(id) {
        return Some(Err((id.clone(), RequestError::Id { id: id.clone() })));
    }
    let kind = match annotations.get(REQUEST_TYPE) {
        None => None,
        Some(text) => match parse_kind(text) {
            Some(kind) => Some(kind),
            None => {
                let error = RequestError::Kind { kind: text.clone() };
                return Some(Err((id.clone(), error)));
            }
        },
    };
    Some(Ok(Request {
        id: id.clone(),
        kind,
    }))
}

/// A fresh id for a request made at `now`: its UTC time to the second, `20261204T221500Z`.
pub fn id_at(now: Timestamp) -> String {
    now.strftime("%Y%m%dT%H%M%SZ").to_string()
}

/// Where request `id` stands on a shard whose status is `status`.
#[derive(Debug, Clone, PartialEq)]
pub enum ShardAnswer<'a> {
    /// Not taken yet.
    Pending,
    /// Waits for the backup running before it.
    Queued,
    /// Taken: running or answered.
    Taken(&'a RequestedBackupStatus),
}

/// Where request `id` stands on the shard whose status is `status`.
pub fn answer<'a>(id: &str, status: Option<&'a ShardStatus>) -> ShardAnswer<'a> {
    let Some(status) = status else {
        return ShardAnswer::Pending;
    };
    let taken = [&status.requested_backup, &status.previous_requested_backup]
        .into_iter()
        .flatten()
        .find(|r| r.id == id);
    match taken {
        Some(taken) => ShardAnswer::Taken(taken),
        None if status.queued_request.as_ref().is_some_and(|q| q.id == id) => ShardAnswer::Queued,
        None => ShardAnswer::Pending,
    }
}

/// [`rollup`] over the cluster's Shards as read, each named by its object name.
pub fn rollup_of(id: &str, shards: &[Shard]) -> BackupRequestRollup {
    let names: Vec<String> = shards.iter().map(ResourceExt::name_any).collect();
    let answers: Vec<(&str, Option<&ShardStatus>)> = names
        .iter()
        .zip(shards)
        .map(|(name, shard)| (name.as_str(), shard.status.as_ref()))
        .collect();
    rollup(id, &answers)
}

/// Where request `id` stands over `shards` (name and status of each Shard of the cluster).
pub fn rollup(id: &str, shards: &[(&str, Option<&ShardStatus>)]) -> BackupRequestRollup {
    let mut completed = 0;
    let mut failed = Vec::new();
    let mut running = 0;
    let mut queued = Vec::new();
    let mut pending = Vec::new();
    for (name, status) in shards {
        match answer(id, *status) {
            ShardAnswer::Taken(r) => match r.state {
                BackupRequestState::Completed => completed += 1,
                BackupRequestState::Running => running += 1,
                BackupRequestState::Failed => failed.push(format!(
                    "shard {name}: {}",
                    r.message.as_deref().unwrap_or("failed")
                )),
            },
            ShardAnswer::Queued => queued.push(*name),
            ShardAnswer::Pending => pending.push(*name),
        }
    }
    let count = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
    let total = shards.len();
    let shards_failed = failed.len();
    let answered = completed + shards_failed;
    let (state, message) = if total == 0 {
        (
            BackupRequestPhase::Pending,
            Some("the cluster has no Shard yet".to_owned()),
        )
    } else if answered == total && failed.is_empty() {
        (BackupRequestPhase::Completed, None)
    } else if answered == total {
        (BackupRequestPhase::Failed, Some(failed.join("; ")))
    } else {
        let mut parts = failed;
        if !queued.is_empty() {
            parts.push(format!(
                "waiting for the backup running before it on {}",
                queued.join(", ")
            ));
        }
        if !pending.is_empty() {
            parts.push(format!(
                "not taken yet on {} (no serving pool pod to take it on, or not seen yet)",
                pending.join(", ")
            ));
        }
        let state = if running > 0 || answered > 0 {
            BackupRequestPhase::Running
        } else if !queued.is_empty() {
            BackupRequestPhase::Queued
        } else {
            BackupRequestPhase::Pending
        };
        (state, Some(parts.join("; ")).filter(|m| !m.is_empty()))
    };
    BackupRequestRollup {
        id: id.to_owned(),
        state,
        shards_completed: count(completed),
        shards_failed: count(shards_failed),
        shards_total: count(total),
        message,
    }
}

#[cfg(test)]
mod tests;
