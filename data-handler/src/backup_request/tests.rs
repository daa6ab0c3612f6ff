use multigres_api::backup_request::{REQUEST, REQUEST_TYPE};
use multigres_api::v1alpha1::{MultigresClusterSpec, ShardSpec};

use super::*;

/// The requests' fields of a Shard status written as YAML.
fn stored(yaml: &str) -> Requests {
    let status: ShardStatus = serde_yaml::from_str(yaml).unwrap();
    Requests::of(Some(&status))
}

fn asking(id: &str) -> Asked {
    Asked {
        id: id.into(),
        kind: BackupKind::Full,
        problem: None,
    }
}

fn start(id: &str) -> Decision {
    Decision::Start {
        id: id.into(),
        kind: BackupKind::Full,
        again: false,
    }
}

fn requested(id: &str) -> Purpose {
    Purpose::Requested {
        id: id.into(),
        kind: BackupKind::Full,
    }
}

#[test]
fn a_new_request_is_taken() {
    assert_eq!(
        decide(Some(&asking("r1")), &Requests::default(), None),
        start("r1")
    );
    let answered_before =
        stored("requestedBackup: {id: r0, type: full, state: Completed, backup: 20261203-101500F}");
    assert_eq!(
        decide(Some(&asking("r1")), &answered_before, None),
        start("r1")
    );
    assert_eq!(decide(None, &answered_before, None), Decision::Nothing);
}

#[test]
fn the_same_id_again_takes_nothing() {
    for answered in [
        "requestedBackup: {id: r1, type: full, state: Completed, backup: 20261204-221503F}",
        "requestedBackup: {id: r1, type: full, state: Failed, message: no space}",
        "requestedBackup: {id: r2, type: full, state: Completed}\n\
         previousRequestedBackup: {id: r1, type: full, state: Completed}",
    ] {
        assert_eq!(
            decide(Some(&asking("r1")), &stored(answered), None),
            Decision::Nothing,
            "{answered}"
        );
    }
    let running = stored("requestedBackup: {id: r1, type: full, state: Running, pod: p-1}");
    assert_eq!(
        decide(Some(&asking("r1")), &running, Some(&requested("r1"))),
        Decision::Nothing,
        "the request running now is not queued behind itself"
    );
}

#[test]
fn a_new_id_while_one_runs_is_queued_once_then_taken_right_after() {
    let running = stored("requestedBackup: {id: r1, type: full, state: Running, pod: p-1}");
    let queued = QueuedBackupRequest {
        id: "r2".into(),
        type_: BackupKind::Full,
    };
    assert_eq!(
        decide(Some(&asking("r2")), &running, Some(&requested("r1"))),
        Decision::Queue(queued.clone())
    );
    let waiting = stored(
        "requestedBackup: {id: r1, type: full, state: Running, pod: p-1}\n\
         queuedRequest: {id: r2, type: full}",
    );
    assert_eq!(
        decide(Some(&asking("r2")), &waiting, Some(&requested("r1"))),
        Decision::Nothing,
        "queued once"
    );
    assert_eq!(
        decide(Some(&asking("r3")), &waiting, Some(&requested("r1"))),
        Decision::Nothing,
        "a third id waits in the annotation until the queued one starts"
    );
    // r1 ended (collected into requestedBackup); nothing runs: the queued one goes next, even
    // once the annotation names a later id.
    let r1_done = stored(
        "requestedBackup: {id: r1, type: full, state: Completed, backup: 20261204-221503F}\n\
         queuedRequest: {id: r2, type: full}",
    );
    assert_eq!(decide(Some(&asking("r3")), &r1_done, None), start("r2"));
    assert_eq!(decide(None, &r1_done, None), start("r2"), "never lost");
}

#[test]
fn a_request_while_a_scheduled_backup_runs_is_queued_behind_it() {
    let quiet =
        stored("scheduledBackups: {running: {startTime: '2026-12-04T02:00:00Z', pod: p-2}}");
    let incremental = Asked {
        kind: BackupKind::Incr,
        ..asking("r1")
    };
    assert_eq!(
        decide(Some(&incremental), &quiet, Some(&Purpose::Scheduled)),
        Decision::Queue(QueuedBackupRequest {
            id: "r1".into(),
            type_: BackupKind::Incr,
        })
    );
    let notice = queued_notice("r1", &Purpose::Scheduled, "p-2");
    assert_eq!(notice.reason, QUEUED);
    assert_eq!(
        notice.message,
        "request r1 waits for a scheduled backup running on pod p-2; it is taken right after"
    );
}

#[test]
fn a_request_shown_running_after_a_restart_is_taken_again() {
    let abandoned = stored(
        "requestedBackup: {id: r1, type: diff, state: Running, pod: p-1, \
         startedAt: '2026-12-04T22:15:01Z'}",
    );
    let again = Decision::Start {
        id: "r1".into(),
        kind: BackupKind::Diff,
        again: true,
    };
    assert_eq!(decide(Some(&asking("r1")), &abandoned, None), again);
    assert_eq!(
        decide(Some(&asking("r2")), &abandoned, None),
        again,
        "before a newer id"
    );
    assert_eq!(
        decide(Some(&asking("r1")), &abandoned, Some(&Purpose::Scheduled)),
        Decision::Nothing,
        "not queued twice: it is taken again once the running backup ends"
    );
}

#[test]
fn a_request_that_cannot_be_followed_is_answered_failed_once_nothing_runs() {
    let bad = Asked {
        problem: Some("multigres.com/backup-request-type: \"weekly\" is not a backup type".into()),
        ..asking("r1")
    };
    assert_eq!(
        decide(Some(&bad), &Requests::default(), Some(&Purpose::Scheduled)),
        Decision::Nothing
    );
    let Decision::Refuse { id, message, .. } = decide(Some(&bad), &Requests::default(), None)
    else {
        panic!("refused");
    };
    let answered = refused(&id, BackupKind::Full, message, Timestamp::UNIX_EPOCH);
    let notice = finished_notice(&answered);
    assert_eq!(notice.reason, FAILED);
    assert!(
        notice
            .message
            .starts_with("request r1 cannot be followed: "),
        "{}",
        notice.message
    );
    let mut requests = Requests::default();
    requests.answer(answered);
    assert_eq!(decide(Some(&bad), &requests, None), Decision::Nothing);
}

#[test]
fn the_status_keeps_the_running_request_the_previous_answer_and_the_queue() {
    let mut requests = stored(
        "requestedBackup: {id: r1, type: full, state: Running, pod: p-1, \
         startedAt: '2026-12-04T22:15:01Z'}\n\
         queuedRequest: {id: r2, type: incr}",
    );
    let attempt = ScheduledBackupAttempt {
        start_time: Time("2026-12-04T22:15:01Z".parse().unwrap()),
        end_time: Some(Time("2026-12-04T22:16:30Z".parse().unwrap())),
        pod: "p-1".into(),
        backup: None,
        message: None,
    };
    let done = Done {
        backup: "20261204-221503F".into(),
        expired: Vec::new(),
        expiry_error: None,
    };
    let answered = finished("r1", BackupKind::Full, attempt.clone(), Ok(done));
    assert_eq!(
        finished_notice(&answered).message,
        "request r1: backup 20261204-221503F completed on pod p-1"
    );
    requests.answer(answered);
    assert_eq!(requests.previous, None, "r1 replaces its own running entry");
    assert!(requests.queued.is_some(), "r2 still waits");
    let second = started("r2", BackupKind::Incr, &attempt, false);
    assert_eq!(
        started_notice(&second).message,
        "request r2: taking a backup (incremental) on pod p-1"
    );
    requests.start(second);
    assert_eq!(requests.queued, None);
    assert_eq!(
        requests.previous.as_ref().map(|r| r.id.as_str()),
        Some("r1")
    );
    assert_eq!(
        requests.fields()["requestedBackup"]["state"],
        serde_json::json!("Running")
    );
    let failed = finished("r2", BackupKind::Incr, attempt, Err("lease held".into()));
    let notice = finished_notice(&failed);
    assert_eq!(notice.reason, FAILED);
    assert!(
        notice.message.contains("not tried again"),
        "{}",
        notice.message
    );
}

#[test]
fn the_request_is_read_from_the_clusters_annotations_with_the_schedules_type() {
    let mut cluster = MultigresCluster::new("prod", MultigresClusterSpec::default());
    let backup =
        serde_yaml::from_str("{type: filesystem, schedule: {cron: '0 2 * * *', type: diff}}")
            .unwrap();
    let shard = Shard::new(
        "prod-postgres-default-0-inf",
        ShardSpec {
            backup: Some(backup),
            ..Default::default()
        },
    );
    assert_eq!(asked(&cluster, &shard), None);
    cluster.metadata.annotations = Some(
        [(REQUEST.to_owned(), "20261204T221500Z".to_owned())]
            .into_iter()
            .collect(),
    );
    assert_eq!(
        asked(&cluster, &shard),
        Some(Asked {
            id: "20261204T221500Z".into(),
            kind: BackupKind::Diff,
            problem: None,
        })
    );
    cluster
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(REQUEST_TYPE.to_owned(), "full".to_owned());
    assert_eq!(asked(&cluster, &shard).unwrap().kind, BackupKind::Full);
}

#[test]
fn a_shard_without_backups_answers_that_it_cannot_take_one() {
    let mut cluster = MultigresCluster::new("prod", MultigresClusterSpec::default());
    cluster.metadata.annotations = Some([(REQUEST.to_owned(), "r1".to_owned())].into());
    let shard = Shard::new("prod-postgres-default-0-inf", ShardSpec::default());
    assert_eq!(
        asked(&cluster, &shard).unwrap().problem.as_deref(),
        Some("the shard has no backup configuration")
    );
}
