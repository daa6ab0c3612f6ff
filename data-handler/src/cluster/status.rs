//! The conditions and events of a cluster's topology pass, and the roll-up of its backup
//! request over its shards: pure.

use kube::ResourceExt;
use multigres_api::DEFAULT_DATABASE;
use multigres_api::backup_request::{self, REQUEST};
use multigres_api::v1alpha1::{BackupRequestPhase, BackupRequestRollup, MultigresCluster, Shard};
use multigres_common::conditions::Computed;
use multigres_common::events::Notice;
use multigres_common::telemetry::ErrorChain;

use super::Error;
use crate::conditions::{TOPO_SERVER_REACHABLE, TOPOLOGY_REGISTERED, reachable};
use crate::sync::Registered;
use crate::target::{ConnectError, EXTERNAL_FIELD, Target};
use crate::topo::{RecordKind, RecordRef, Registration, TopoError};

/// `TopoServerReachable` and `TopologyRegistered` after a registration pass against `target`
/// (`None` when the settings could not be worked out).
pub fn conditions(target: Option<&Target>, result: &Result<Registered, Error>) -> Vec<Computed> {
    let server = target.map_or_else(|| "the topology server".to_owned(), Target::describe);
    let (r, t) = (TOPO_SERVER_REACHABLE, TOPOLOGY_REGISTERED);
    let not_connected = || {
        Computed::no(
            t,
            "NotConnected",
            format!("Not registered: cannot connect to {server} (see {r})."),
        )
    };
    match result {
        Ok(done) => vec![
            reachable(&server, None),
            Computed::yes(t, "Registered", registered_message(&server, done)),
        ],
        Err(
            e
            @ (Error::Resolve(_) | Error::Target(_) | Error::Records(_) | Error::Malformed { .. }),
        ) => {
            vec![
                Computed::unknown(r, "NotChecked", format!("Not checked: {e}")),
                Computed::no(
                    t,
                    "InvalidSpec",
                    format!("{e}. Fix the MultigresCluster spec."),
                ),
            ]
        }
        Err(e @ Error::ServerNotReady { .. }) => {
            let message = format!("Waiting before connecting to {server}: {e}.");
            vec![
                Computed::unknown(r, "TopoServerNotReady", message.clone()),
                Computed::unknown(t, "TopoServerNotReady", message),
            ]
        }
        Err(Error::Connect(
            e @ (ConnectError::SecretMissing { .. } | ConnectError::SecretKeyMissing { .. }),
        )) => vec![
            Computed::no(
                r,
                "SecretNotFound",
                format!("{e}; it holds the TLS material to connect to {server}."),
            ),
            not_connected(),
        ],
        Err(Error::Connect(e @ ConnectError::SecretRead { .. })) => vec![
            Computed::unknown(
                r,
                "SecretUnreadable",
                format!(
                    "{}. Check that the data-handler may get Secrets in this namespace.",
                    ErrorChain(e)
                ),
            ),
            not_connected(),
        ],
        Err(Error::Connect(ConnectError::Topo(e))) => {
            vec![reachable(&server, Some(e)), not_connected()]
        }
        Err(Error::Topo(e)) => vec![reachable(&server, Some(e)), registration_failed(&server, e)],
        Err(e @ Error::Finalizer(_)) => vec![
            reachable(&server, None),
            Computed::no(
                t,
                "RegistrationFailed",
                format!(
                    "{}; nothing is registered before the finalizer is in place; retrying.",
                    ErrorChain(e)
                ),
            ),
        ],
        Err(e) => vec![
            Computed::unknown(r, "NotChecked", format!("Not checked: {}", ErrorChain(e))),
            Computed::no(t, "RegistrationFailed", ErrorChain(e).to_string()),
        ],
    }
}

fn registration_failed(server: &str, e: &TopoError) -> Computed {
    let t = TOPOLOGY_REGISTERED;
    match e {
        TopoError::Unavailable { .. } | TopoError::Timeout { .. } => Computed::no(
            t,
            "TopoServerUnreachable",
            format!(
                "Not registered: {server} is unreachable (see {TOPO_SERVER_REACHABLE}); retrying with backoff."
            ),
        ),
        TopoError::Conflict { .. } => Computed::no(t, "Conflict", format!("{e}; retrying.")),
        TopoError::OwnedByOther { .. } => Computed::no(
            t,
            "OwnedByAnotherCluster",
            format!(
                "{e}. Give this cluster its own root ({EXTERNAL_FIELD}.rootPath) or rename the cell."
            ),
        ),
        TopoError::Malformed { .. } => Computed::no(
            t,
            "MalformedRecord",
            format!(
                "{}. Neither Multigres nor the operator writes it this way; inspect it with etcdctl and delete it if nothing needs it.",
                ErrorChain(e)
            ),
        ),
        TopoError::Rejected { .. } => Computed::no(t, "Rejected", ErrorChain(e).to_string()),
        _ => Computed::no(t, "RegistrationFailed", ErrorChain(e).to_string()),
    }
}

/// "cells a, b and database postgres".
fn records_phrase(records: &[RecordRef]) -> String {
    let names = |kind: RecordKind| -> Vec<&str> {
        records
            .iter()
            .filter(|r| r.kind == kind)
            .map(|r| r.name.as_str())
            .collect()
    };
    let part = |singular: &str, names: Vec<&str>| match names.len() {
        0 => None,
        1 => Some(format!("{singular} {}", names[0])),
        _ => Some(format!("{singular}s {}", names.join(", "))),
    };
    [
        part("cell", names(RecordKind::Cell)),
        part("database", names(RecordKind::Database)),
    ]
    .into_iter()
    .flatten()
    .collect::<Vec<_>>()
    .join(" and ")
}

fn registered_message(server: &str, done: &Registered) -> String {
    let records: Vec<RecordRef> = done.records.iter().map(|(r, _)| r.clone()).collect();
    let mut message = if records.is_empty() {
        format!("Nothing to register in {server}.")
    } else {
        format!("Registered {} in {server}.", records_phrase(&records))
    };
    for (record, why) in &done.kept {
        message.push_str(&format!(
            " Kept {record}, which the spec no longer has: {why}."
        ));
    }
    message
}

/// Normal events for records written or pruned by a pass (none when nothing changed).
pub fn registration_notices(target: &Target, done: &Registered) -> Vec<Notice> {
    let server = target.describe();
    let mut out = Vec::new();
    let written: Vec<String> = done
        .written()
        .map(|(record, how)| {
            let how = if *how == Registration::Created {
                "created"
            } else {
                "updated"
            };
            format!("{record} ({how})")
        })
        .collect();
    if !written.is_empty() {
        out.push(Notice::normal(
            "TopologyRegistered",
            format!("Registered {} in {server}", written.join(", ")),
        ));
    }
    if !done.pruned.is_empty() {
        out.push(Notice::normal(
            "TopologyPruned",
            format!(
                "Removed {} from {server}: the spec no longer has them",
                records_phrase(&done.pruned)
            ),
        ));
    }
    out
}

/// The Normal event once a deleted cluster's records are gone.
pub fn deregistered_notice(target: &Target, removed: &[RecordRef]) -> Notice {
    let server = target.describe();
    let message = if removed.is_empty() {
        format!("No records of this cluster were left in {server}")
    } else {
        format!("Removed {} from {server}", records_phrase(removed))
    };
    Notice::normal("TopologyDeregistered", message)
}

/// The Warning event when a deleted cluster's finalizer is released without its records being
/// removed: why, the last error, and what may remain (the records the spec names, with their
/// ownership markers) so a person can remove them by hand.
pub fn cleanup_skipped_notice(
    cluster: &MultigresCluster,
    target: Option<&Target>,
    why: &str,
    error: Option<&Error>,
) -> Notice {
    let mut records: Vec<RecordRef> = cluster
        .spec
        .cells
        .iter()
        .map(|c| RecordRef::cell(c.name.as_str()))
        .collect();
    let databases: Vec<&str> = cluster
        .spec
        .databases
        .iter()
        .map(|d| d.name.as_str())
        .collect();
    if databases.is_empty() {
        records.push(RecordRef::database(DEFAULT_DATABASE));
    }
    records.extend(databases.into_iter().map(RecordRef::database));
    let mut message =
        format!("Released the finalizer without removing this cluster's topology records: {why}.");
    if let Some(error) = error {
        message.push_str(&format!(" Last error: {}.", ErrorChain(error)));
    }
    match target {
        Some(target) => message.push_str(&format!(
            " If {} comes back, {} may remain under {} with their markers under {}/operator-owners/; remove them with etcdctl.",
            target.endpoints.join(", "),
            records_phrase(&records),
            target.root,
            target.root.trim_end_matches('/'),
        )),
        None => message.push_str(&format!(
            " If the server comes back, {} may remain; remove them with etcdctl.",
            records_phrase(&records)
        )),
    }
    Notice::warning("TopologyCleanupSkipped", message)
}

/// Event reason on the cluster: its backup request completed on every shard.
pub const BACKUP_REQUEST_COMPLETED: &str = "BackupRequestCompleted";
/// Event reason on the cluster: its backup request was answered on every shard, and failed on
/// some.
pub const BACKUP_REQUEST_FAILED: &str = "BackupRequestFailed";

/// `status.backupRequest` of `cluster`: where the request its annotation
/// `multigres.com/backup-request` names stands over `shards` (its Shards); `None` without one.
pub fn backup_request(cluster: &MultigresCluster, shards: &[Shard]) -> Option<BackupRequestRollup> {
    let id = cluster.annotations().get(REQUEST)?;
    Some(backup_request::rollup_of(id, shards))
}

/// The event on the cluster when its request becomes answered on every shard (`stored` is the
/// roll-up as stored, `next` as computed now); none otherwise, so each request is told once.
pub fn backup_request_notice(
    stored: Option<&BackupRequestRollup>,
    next: Option<&BackupRequestRollup>,
) -> Option<Notice> {
    let next = next?;
    let answered = |r: &BackupRequestRollup| {
        matches!(
            r.state,
            BackupRequestPhase::Completed | BackupRequestPhase::Failed
        )
    };
    if !answered(next) || stored.is_some_and(|s| s.id == next.id && answered(s)) {
        return None;
    }
    let id = &next.id;
    Some(match next.state {
        BackupRequestPhase::Completed => Notice::normal(
            BACKUP_REQUEST_COMPLETED,
            format!(
                "request {id}: the backup completed on all {} shards",
                next.shards_total
            ),
        ),
        _ => Notice::warning(
            BACKUP_REQUEST_FAILED,
            format!(
                "request {id}: the backup failed on {} of {} shards: {}",
                next.shards_failed,
                next.shards_total,
                next.message.as_deref().unwrap_or("see the Shards' events")
            ),
        ),
    })
}

#[cfg(test)]
mod tests;
