//! The recoverable window of a shard: the earliest and the latest moment a restore can reach,
//! published as `status.recoverableWindow` with the backup check ([`crate::backup_health`]).
//!
//! - The earliest is when the oldest complete backup ended (pgBackRest's `timestamp.stop`, which
//!   `GetBackups` passes on as `stop_timestamp`): a restore to a time replays WAL from a backup
//!   that ended before the target, so nothing before that end can be reached.
//! - The latest is when the primary last archived a WAL file (a segment, or the `.backup`
//!   history file a backup ends with) into the repository, as
//!   PostgreSQL's archiver reports it (`pg_stat_archiver`: the multipooler's `archive_command`
//!   is pgBackRest's `archive-push`, so a segment counts as archived only once pgBackRest took it).
//!   While a segment failed after the last one archived, the window stops there, and says so.
//!
//! The primary is asked through its multipooler as the superuser (`ExecuteQuery`, like
//! [`crate::shard::serving`]); the statement reads one statistics view and nothing else. The
//! reading is pure ([`earliest`], [`parse`], [`window`]); [`read_archiver`] asks.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use multigres_api::v1alpha1::RecoverableWindow;
use multigres_proto::multipooler::multipoolermanagerdata::BackupMetadata;
use multigres_proto::multipooler::multipoolermanagerdata::backup_metadata::Status;

use crate::backup_health::completed_at;
use crate::dial::Dial;
use crate::postgres_roles::Session;

/// The archiver's last archived and last failed segments with their times (epoch seconds), as
/// one line of four space-separated fields, empty where PostgreSQL has none.
pub const ARCHIVER: &str = "SELECT coalesce(last_archived_wal, '') || ' ' || \
                            coalesce(extract(epoch FROM last_archived_time)::bigint::text, '') \
                            || ' ' || coalesce(last_failed_wal, '') || ' ' || \
                            coalesce(extract(epoch FROM last_failed_time)::bigint::text, '') \
                            FROM pg_stat_archiver";
/// Time allowed for the statement, connection included.
const TIMEOUT: Duration = Duration::from_secs(5);

/// The oldest complete backup among `backups`: when it ended, and its label.
pub fn earliest(backups: &[BackupMetadata]) -> Option<(Timestamp, String)> {
    backups
        .iter()
        .filter(|b| b.status() == Status::Complete)
        .filter_map(|b| Some((completed_at(b)?, b.backup_id.clone())))
        .min()
}

/// What the archiver reported.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Archiver {
    /// The last segment archived, and when.
    pub archived: Option<(String, Timestamp)>,
    /// The last segment that failed to be archived, and when.
    pub failed: Option<(String, Timestamp)>,
}

/// Reads the answer to [`ARCHIVER`]; `None` when it is not four fields.
pub fn parse(answer: &str) -> Option<Archiver> {
    let fields: Vec<&str> = answer.split(' ').collect();
    let [archived, archived_at, failed, failed_at] = fields.as_slice() else {
        return None;
    };
    let pair = |wal: &str, at: &str| -> Option<(String, Timestamp)> {
        let at = Timestamp::from_second(at.parse().ok()?).ok()?;
        (!wal.is_empty()).then(|| (wal.to_owned(), at))
    };
    Some(Archiver {
        archived: pair(archived, archived_at),
        failed: pair(failed, failed_at),
    })
}

/// The window from the oldest complete backup `oldest` and the `archiver`'s report. Without a
/// report (the primary did not answer), or one that names no archived segment (a primary just
/// promoted, or one whose statistics a crash reset), the latest end is the `stored` one.
pub fn window(
    oldest: Option<&(Timestamp, String)>,
    archiver: Option<&Archiver>,
    stored: Option<&RecoverableWindow>,
) -> Option<RecoverableWindow> {
    let (latest, latest_wal, archive_failing) = match archiver {
        Some(report) if report.archived.is_some() => {
            let failing = report.failed.as_ref().filter(|(_, failed)| {
                report
                    .archived
                    .as_ref()
                    .is_none_or(|(_, archived)| failed > archived)
            });
            (
                report.archived.as_ref().map(|(_, at)| Time(*at)),
                report.archived.as_ref().map(|(wal, _)| wal.clone()),
                failing.map(|(wal, at)| format!("segment {wal} failed to archive at {at}")),
            )
        }
        _ => stored.map_or((None, None, None), |s| {
            (
                s.latest.clone(),
                s.latest_wal.clone(),
                s.archive_failing.clone(),
            )
        }),
    };
    let window = RecoverableWindow {
        earliest: oldest.map(|(at, _)| Time(*at)),
        earliest_backup: oldest.map(|(_, label)| label.clone()),
        latest,
        latest_wal,
        archive_failing,
    };
    (window != RecoverableWindow::default()).then_some(window)
}

/// Asks the primary behind `session` for its archiver's report.
pub(crate) async fn read_archiver(dial: &Dial, session: &Session<'_>) -> Result<Archiver, String> {
    let line = session
        .ask(dial, session.request(ARCHIVER), TIMEOUT)
        .await?;
    parse(&line).ok_or_else(|| format!("pg_stat_archiver answered {line:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backup(label: &str, stop: i64, status: Status) -> BackupMetadata {
        let mut b = BackupMetadata {
            backup_id: label.to_owned(),
            stop_timestamp: Some(prost_types::Timestamp {
                seconds: stop,
                nanos: 0,
            }),
            ..Default::default()
        };
        b.set_status(status);
        b
    }

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    #[test]
    fn the_earliest_is_the_end_of_the_oldest_complete_backup() {
        let backups = [
            backup("20261204-010000F", 1_000, Status::Incomplete),
            backup("20261204-020000F", 2_000, Status::Complete),
            backup("20261204-030000F_20261204-030000I", 3_000, Status::Complete),
        ];
        assert_eq!(
            earliest(&backups),
            Some((at(2_000), "20261204-020000F".to_owned()))
        );
        assert_eq!(earliest(&backups[..1]), None);
    }

    #[test]
    fn the_archivers_answer_is_read_field_by_field() {
        assert_eq!(
            parse("000000010000000000000007 1764900000  "),
            Some(Archiver {
                archived: Some(("000000010000000000000007".to_owned(), at(1_764_900_000))),
                failed: None,
            })
        );
        assert_eq!(parse("   "), Some(Archiver::default()));
        assert_eq!(parse("one two"), None);
        assert_eq!(parse("w notanumber  "), Some(Archiver::default()));
    }

    #[test]
    fn the_window_runs_from_the_oldest_backup_to_the_last_archived_segment() {
        let oldest = (at(2_000), "20261204-020000F".to_owned());
        let report = Archiver {
            archived: Some(("0000000100000000000000A1".to_owned(), at(5_000))),
            failed: Some(("0000000100000000000000A0".to_owned(), at(4_000))),
        };
        let w = window(Some(&oldest), Some(&report), None).unwrap();
        assert_eq!(w.earliest, Some(Time(at(2_000))));
        assert_eq!(w.earliest_backup.as_deref(), Some("20261204-020000F"));
        assert_eq!(w.latest, Some(Time(at(5_000))));
        assert_eq!(w.archive_failing, None, "an older failure is over");

        let failing = Archiver {
            failed: Some(("0000000100000000000000A2".to_owned(), at(6_000))),
            ..report
        };
        let w = window(Some(&oldest), Some(&failing), None).unwrap();
        assert!(
            w.archive_failing
                .as_deref()
                .is_some_and(|m| m.contains("0000000100000000000000A2")),
            "{w:?}"
        );
        // No answer from the primary, or a new primary that archived nothing yet: the latest
        // end stays as published.
        let kept = window(None, None, Some(&w)).unwrap();
        assert_eq!((kept.latest, kept.earliest), (w.latest.clone(), None));
        let promoted = window(Some(&oldest), Some(&Archiver::default()), Some(&w)).unwrap();
        assert_eq!(promoted.latest_wal, w.latest_wal);
        assert_eq!(window(None, None, None), None);
    }
}
