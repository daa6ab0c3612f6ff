use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::*;

fn at(text: &str) -> Timestamp {
    text.parse().unwrap()
}

fn daily() -> BackupScheduleConfig {
    BackupScheduleConfig {
        cron: "0 2 * * *".into(),
        type_: None,
        retain_full: None,
        suspend: false,
    }
}

fn attempt(start: &str, end: &str) -> ScheduledBackupAttempt {
    ScheduledBackupAttempt {
        start_time: Time(at(start)),
        end_time: Some(Time(at(end))),
        pod: "pool-1".into(),
        backup: None,
        message: None,
    }
}

#[test]
fn the_first_scheduled_time_after_the_newest_backup_starts_one() {
    let bootstrap = Some(at("2026-11-26T15:00:00Z"));
    assert_eq!(
        decide(&daily(), None, bootstrap, at("2026-11-27T01:59:00Z")),
        Decision::Wait {
            until: Some(at("2026-11-27T02:00:00Z"))
        }
    );
    assert_eq!(
        decide(&daily(), None, bootstrap, at("2026-11-27T02:00:00Z")),
        Decision::Start
    );
    assert_eq!(
        decide(&daily(), None, bootstrap, at("2026-11-29T09:00:00Z")),
        Decision::Start,
        "missed times are made up once, not once each"
    );
}

#[test]
fn before_the_shards_first_backup_nothing_is_scheduled() {
    assert_eq!(
        decide(&daily(), None, None, at("2026-11-27T02:00:00Z")),
        Decision::Wait { until: None }
    );
}

#[test]
fn a_completed_scheduled_backup_counts_even_before_the_repository_check_sees_it() {
    let stored = ScheduledBackupsStatus {
        last_success: Some(attempt("2026-11-27T02:00:00Z", "2026-11-27T02:03:00Z")),
        ..Default::default()
    };
    assert_eq!(
        decide(
            &daily(),
            Some(&stored),
            Some(at("2026-11-26T15:00:00Z")),
            at("2026-11-27T02:04:00Z")
        ),
        Decision::Wait {
            until: Some(at("2026-11-28T02:00:00Z"))
        }
    );
}

#[test]
fn a_failed_backup_of_a_frequent_schedule_is_tried_again_at_its_next_time() {
    let every_five_minutes = BackupScheduleConfig {
        cron: "*/5 * * * *".into(),
        ..daily()
    };
    let stored = ScheduledBackupsStatus {
        last_failure: Some(attempt("2026-11-27T02:00:00Z", "2026-11-27T02:01:00Z")),
        ..Default::default()
    };
    let newest = Some(at("2026-11-27T01:55:30Z"));
    assert_eq!(
        decide(
            &every_five_minutes,
            Some(&stored),
            newest,
            at("2026-11-27T02:02:00Z")
        ),
        Decision::Wait {
            until: Some(at("2026-11-27T02:05:00Z"))
        }
    );
}

#[test]
fn a_failed_backup_is_tried_again_after_the_retry_delay() {
    let stored = ScheduledBackupsStatus {
        last_failure: Some(attempt("2026-11-27T02:00:00Z", "2026-11-27T02:01:00Z")),
        ..Default::default()
    };
    let newest = Some(at("2026-11-26T15:00:00Z"));
    assert_eq!(
        decide(&daily(), Some(&stored), newest, at("2026-11-27T02:05:00Z")),
        Decision::Wait {
            until: Some(at("2026-11-27T02:11:00Z"))
        }
    );
    assert_eq!(
        decide(&daily(), Some(&stored), newest, at("2026-11-27T02:11:00Z")),
        Decision::Start
    );
    let succeeded_since = ScheduledBackupsStatus {
        last_success: Some(attempt("2026-11-27T02:11:00Z", "2026-11-27T02:12:00Z")),
        ..stored
    };
    assert_eq!(
        decide(
            &daily(),
            Some(&succeeded_since),
            newest,
            at("2026-11-27T02:13:00Z")
        ),
        Decision::Wait {
            until: Some(at("2026-11-28T02:00:00Z"))
        },
        "an older failure no longer delays anything"
    );
}

#[test]
fn a_forged_failure_at_the_end_of_time_waits_instead_of_overflowing() {
    let newest = Some(at("2026-11-26T15:00:00Z"));
    let now = at("2026-11-27T02:05:00Z");
    // jiff's last instant is 9999-12-30T22:00:00.999999999Z.
    for end in [
        "9999-12-30T21:55:00Z".to_owned(),
        Timestamp::MAX.to_string(),
    ] {
        let stored = ScheduledBackupsStatus {
            last_failure: Some(attempt("2026-11-27T02:00:00Z", &end)),
            ..Default::default()
        };
        let minute = BackupScheduleConfig {
            cron: "* * * * *".into(),
            ..daily()
        };
        for config in [daily(), minute] {
            assert_eq!(
                decide(&config, Some(&stored), newest, now),
                Decision::Wait {
                    until: Some(Timestamp::MAX)
                },
                "{} failed at {end}",
                config.cron
            );
        }
    }
    let forged_success = ScheduledBackupsStatus {
        last_success: Some(attempt("2026-11-27T02:00:00Z", "9999-12-30T22:00:00Z")),
        last_failure: Some(attempt("2026-11-27T02:00:00Z", "9999-12-30T22:00:00Z")),
        ..Default::default()
    };
    assert_eq!(
        decide(&daily(), Some(&forged_success), newest, now),
        Decision::Wait { until: None },
        "no time comes after the end of time"
    );
}

#[test]
fn a_suspended_or_unparsable_schedule_takes_nothing() {
    let newest = Some(at("2026-11-26T15:00:00Z"));
    let now = at("2026-11-28T00:00:00Z");
    let suspended = BackupScheduleConfig {
        suspend: true,
        ..daily()
    };
    assert_eq!(
        decide(&suspended, None, newest, now),
        Decision::Wait { until: None }
    );
    let bad = BackupScheduleConfig {
        cron: "daily".into(),
        ..daily()
    };
    assert!(matches!(
        decide(&bad, None, newest, now),
        Decision::Invalid(message) if message.contains("five fields")
    ));
}

#[test]
fn a_finished_backup_is_published_with_its_expiry() {
    let mut status = ScheduledBackupsStatus::default();
    let done = (
        attempt("2026-11-27T02:00:00Z", "2026-11-27T02:03:00Z"),
        Ok(Done {
            backup: "20261127-020001F".into(),
            expired: vec!["20261120-020001F".into()],
            expiry_error: None,
        }),
    );
    let notice = finished_notice(&done.0, &done.1);
    assert_eq!(notice.reason, COMPLETED);
    assert_eq!(
        notice.message,
        "scheduled backup 20261127-020001F completed on pod pool-1; expired 20261120-020001F"
    );
    record(&mut status, done.0, done.1);
    let success = status.last_success.as_ref().unwrap();
    assert_eq!(success.backup.as_deref(), Some("20261127-020001F"));
    assert_eq!(success.message.as_deref(), Some("expired 20261120-020001F"));

    let failed = (
        attempt("2026-11-28T02:00:00Z", "2026-11-28T02:00:05Z"),
        Err("Backup at http://p:1 failed: no space left".into()),
    );
    let notice = finished_notice(&failed.0, &failed.1);
    assert_eq!(notice.reason, FAILED);
    assert!(
        notice.message.contains("no space left"),
        "{}",
        notice.message
    );
    record(&mut status, failed.0, failed.1);
    assert!(status.last_success.is_some(), "the last success stays");
    assert_eq!(
        status.last_failure.unwrap().message.as_deref(),
        Some("Backup at http://p:1 failed: no space left")
    );
}
