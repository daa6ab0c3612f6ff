//! Backups on request (`multigres.com/backup-request` on the MultigresCluster, see
//! [`multigres_api::backup_request`]): each Shard takes one backup per request id, through the
//! same path as scheduled backups ([`crate::backup_runs`]).
//!
//! The Shard reads the request from its cluster's annotations in the data-handler's cache of
//! MultigresClusters, which the Shard controller already keeps for the connection settings and
//! which wakes the cluster's Shards on every change of the cluster: no copy of the annotation on
//! each Shard (the cluster-handler's path for `confirm-delete-backups`) has to be kept in step,
//! and the request is seen as soon as it is written.
//!
//! The Shard's status holds everything the decision needs ([`decide`], pure), as for the
//! schedule: the request running or last answered (`requestedBackup`), the one answered before
//! it (`previousRequestedBackup`) and one waiting for the running backup (`queuedRequest`). A
//! request id answered there is never taken again, so the same annotation applied again, or a
//! restarted data-handler, takes no second backup; a request shown running whose call a restart
//! abandoned is taken again. A failed request is not retried: the requester asks again with a
//! new id.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use multigres_api::backup_request::{self as api, Request};
use multigres_api::v1alpha1::{
    BackupKind, BackupRequestState, MultigresCluster, QueuedBackupRequest, RequestedBackupStatus,
    ScheduledBackupAttempt, Shard, ShardStatus,
};
use multigres_common::events::Notice;
use serde_json::{Map, Value, json};

use crate::backup_runs::{Done, Purpose};

/// Event reason: a requested backup started.
pub const STARTED: &str = "BackupRequestStarted";
/// Event reason: a requested backup completed.
pub const COMPLETED: &str = "BackupRequestCompleted";
/// Event reason: a requested backup failed, or the request cannot be followed.
pub const FAILED: &str = "BackupRequestFailed";
/// Event reason: a request waits for the backup running before it.
pub const QUEUED: &str = "BackupRequestQueued";

/// A request as this Shard reads it: the annotation's id, the kind with its default applied,
/// and why it cannot be followed, if it cannot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Asked {
    /// The request id.
    pub id: String,
    /// The kind to take.
    pub kind: BackupKind,
    /// Why the request cannot be followed (the webhook refuses it; an object written without
    /// the webhook can still hold one).
    pub problem: Option<String>,
}

/// The request `cluster`'s annotations make of `shard`: the kind defaults to the shard's
/// schedule's, else full.
pub fn asked(cluster: &MultigresCluster, shard: &Shard) -> Option<Asked> {
    let backup = shard.spec.backup.as_ref();
    let default = backup
        .and_then(|b| b.schedule.as_ref())
        .and_then(|s| s.type_)
        .unwrap_or(BackupKind::Full);
    let asked = match api::requested(cluster.annotations())? {
        Ok(Request { id, kind }) => Asked {
            id,
            kind: kind.unwrap_or(default),
            problem: None,
        },
        Err((id, error)) => Asked {
            id,
            kind: default,
            problem: Some(error.to_string()),
        },
    };
    Some(match backup {
        Some(_) => asked,
        None => Asked {
            problem: Some("the shard has no backup configuration".to_owned()),
            ..asked
        },
    })
}

/// The requests' status fields of a Shard.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Requests {
    /// `status.requestedBackup`.
    pub requested: Option<RequestedBackupStatus>,
    /// `status.previousRequestedBackup`.
    pub previous: Option<RequestedBackupStatus>,
    /// `status.queuedRequest`.
    pub queued: Option<QueuedBackupRequest>,
}

impl Requests {
    /// What `status` holds.
    pub fn of(status: Option<&ShardStatus>) -> Self {
        let Some(status) = status else {
            return Self::default();
        };
        Self {
            requested: status.requested_backup.clone(),
            previous: status.previous_requested_backup.clone(),
            queued: status.queued_request.clone(),
        }
    }

    /// Whether request `id` was answered (completed or failed).
    pub fn answered(&self, id: &str) -> bool {
        let requested = self
            .requested
            .as_ref()
            .is_some_and(|r| r.id == id && r.state != BackupRequestState::Running);
        requested || self.previous.as_ref().is_some_and(|r| r.id == id)
    }

    /// Records `started` as the request running now: the one answered before it becomes the
    /// previous one, and it leaves the queue.
    pub fn start(&mut self, started: RequestedBackupStatus) {
        self.shift(&started.id);
        if self.queued.as_ref().is_some_and(|q| q.id == started.id) {
            self.queued = None;
        }
        self.requested = Some(started);
    }

    /// Records `answered` (completed, failed or refused).
    pub fn answer(&mut self, answered: RequestedBackupStatus) {
        self.shift(&answered.id);
        if self.queued.as_ref().is_some_and(|q| q.id == answered.id) {
            self.queued = None;
        }
        self.requested = Some(answered);
    }

    /// Moves an answered request other than `id` to the previous one.
    fn shift(&mut self, id: &str) {
        if self.requested.as_ref().is_some_and(|r| r.id != id) {
            self.previous = self.requested.take();
        }
    }

    /// The status fields, for a server-side apply that owns them: absent ones are left out.
    pub fn fields(&self) -> Map<String, Value> {
        let mut out = Map::new();
        if let Some(requested) = &self.requested {
            out.insert("requestedBackup".into(), json!(requested));
        }
        if let Some(previous) = &self.previous {
            out.insert("previousRequestedBackup".into(), json!(previous));
        }
        if let Some(queued) = &self.queued {
            out.insert("queuedRequest".into(), json!(queued));
        }
        out
    }
}

/// What the requests ask for now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Nothing: no request, or it is answered, running or queued.
    Nothing,
    /// Take request `id` now; `again` when a restart abandoned its earlier call.
    Start {
        id: String,
        kind: BackupKind,
        again: bool,
    },
    /// Note request `id` as waiting for the backup running now.
    Queue(QueuedBackupRequest),
    /// Answer request `id` as failed at once: it cannot be followed.
    Refuse {
        id: String,
        kind: BackupKind,
        message: String,
    },
}

/// What `asked` (the cluster's request, if any) asks of a shard whose request fields are
/// `stored`, while `busy` (the purpose of the backup it runs now, if any) runs.
///
/// While a backup runs, a new request is queued (one: a later id waits in the annotation until
/// the queued one starts). Once none runs: a request shown running (its call abandoned by a
/// restart) is taken again, then the queued one, then the annotation's if not answered.
pub fn decide(asked: Option<&Asked>, stored: &Requests, busy: Option<&Purpose>) -> Decision {
    let shown_running = stored
        .requested
        .as_ref()
        .filter(|r| r.state == BackupRequestState::Running);
    if let Some(busy) = busy {
        let Some(asked) = asked else {
            return Decision::Nothing;
        };
        let running = matches!(busy, Purpose::Requested { id, .. } if *id == asked.id);
        let waits = shown_running.is_some_and(|r| r.id == asked.id)
            || stored.queued.is_some()
            || asked.problem.is_some();
        if running || waits || stored.answered(&asked.id) {
            return Decision::Nothing;
        }
        return Decision::Queue(QueuedBackupRequest {
            id: asked.id.clone(),
            type_: asked.kind,
        });
    }
    if let Some(running) = shown_running {
        return Decision::Start {
            id: running.id.clone(),
            kind: running.type_,
            again: true,
        };
    }
    if let Some(queued) = &stored.queued {
        return Decision::Start {
            id: queued.id.clone(),
            kind: queued.type_,
            again: false,
        };
    }
    match asked {
        Some(asked) if !stored.answered(&asked.id) => match &asked.problem {
            Some(problem) => Decision::Refuse {
                id: asked.id.clone(),
                kind: asked.kind,
                message: problem.clone(),
            },
            None => Decision::Start {
                id: asked.id.clone(),
                kind: asked.kind,
                again: false,
            },
        },
        _ => Decision::Nothing,
    }
}

/// Request `id` started as `attempt`.
pub fn started(
    id: &str,
    kind: BackupKind,
    attempt: &ScheduledBackupAttempt,
    again: bool,
) -> RequestedBackupStatus {
    RequestedBackupStatus {
        id: id.to_owned(),
        type_: kind,
        state: BackupRequestState::Running,
        started_at: Some(attempt.start_time.clone()),
        completed_at: None,
        pod: Some(attempt.pod.clone()),
        backup: None,
        message: again.then(|| {
            "taken again: the data-handler restarted while the earlier attempt ran".to_owned()
        }),
    }
}

/// Request `id`, whose backup ran as `attempt` (ended), answered by `result`.
pub fn finished(
    id: &str,
    kind: BackupKind,
    attempt: ScheduledBackupAttempt,
    result: Result<Done, String>,
) -> RequestedBackupStatus {
    let (state, backup, message) = match result {
        Ok(done) => (BackupRequestState::Completed, Some(done.backup), None),
        Err(message) => (BackupRequestState::Failed, None, Some(message)),
    };
    RequestedBackupStatus {
        id: id.to_owned(),
        type_: kind,
        state,
        started_at: Some(attempt.start_time),
        completed_at: attempt.end_time,
        pod: Some(attempt.pod),
        backup,
        message,
    }
}

/// Request `id` answered as failed at `now` without a backup: `message` says why.
pub fn refused(
    id: &str,
    kind: BackupKind,
    message: String,
    now: Timestamp,
) -> RequestedBackupStatus {
    RequestedBackupStatus {
        id: id.to_owned(),
        type_: kind,
        state: BackupRequestState::Failed,
        started_at: None,
        completed_at: Some(Time(now)),
        pod: None,
        backup: None,
        message: Some(message),
    }
}

/// The event of a request that started.
pub fn started_notice(started: &RequestedBackupStatus) -> Notice {
    let pod = started.pod.as_deref().unwrap_or_default();
    let again = if started.message.is_some() {
        " again (the data-handler restarted while the earlier attempt ran)"
    } else {
        ""
    };
    Notice::normal(
        STARTED,
        format!(
            "request {}: taking a backup ({}) on pod {pod}{again}",
            started.id,
            crate::backup_runs::kind_name(started.type_)
        ),
    )
}

/// The event of an answered request.
pub fn finished_notice(answered: &RequestedBackupStatus) -> Notice {
    let id = &answered.id;
    let message = answered.message.as_deref().unwrap_or("unknown error");
    match (&answered.state, &answered.pod, &answered.backup) {
        (BackupRequestState::Completed, pod, backup) => Notice::normal(
            COMPLETED,
            format!(
                "request {id}: backup {} completed on pod {}",
                backup.as_deref().unwrap_or("?"),
                pod.as_deref().unwrap_or("?")
            ),
        ),
        (_, Some(pod), _) => Notice::warning(
            FAILED,
            format!(
                "request {id}: the backup on pod {pod} failed: {message}; it is not tried \
                 again: ask again with a new id; see the multipooler's log of that pod"
            ),
        ),
        (_, None, _) => Notice::warning(
            FAILED,
            format!("request {id} cannot be followed: {message}"),
        ),
    }
}

/// The event of request `id` queued behind the backup of `purpose` running on `pod`.
pub fn queued_notice(id: &str, purpose: &Purpose, pod: &str) -> Notice {
    let running = match purpose {
        Purpose::Scheduled => "a scheduled backup".to_owned(),
        Purpose::Requested { id, .. } => format!("the backup of request {id}"),
    };
    Notice::normal(
        QUEUED,
        format!("request {id} waits for {running} running on pod {pod}; it is taken right after"),
    )
}

#[cfg(test)]
mod tests;
