use super::*;
use crate::v1alpha1::QueuedBackupRequest;

fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn taken(id: &str, state: BackupRequestState, message: Option<&str>) -> RequestedBackupStatus {
    RequestedBackupStatus {
        id: id.into(),
        type_: BackupKind::Full,
        state,
        started_at: None,
        completed_at: None,
        pod: None,
        backup: None,
        message: message.map(Into::into),
    }
}

fn shard(status: &str) -> ShardStatus {
    serde_yaml::from_str(status).unwrap()
}

#[test]
fn ids_are_label_value_like_tokens() {
    for good in [
        "20261204T221500Z",
        "before-migration_2.1",
        "a",
        &"x".repeat(63),
    ] {
        assert!(valid_id(good), "{good}");
    }
    for bad in ["", "-x", "x-", "with space", "a/b", "é", &"x".repeat(64)] {
        assert!(!valid_id(bad), "{bad}");
    }
}

#[test]
fn the_annotations_state_the_request_or_say_what_is_wrong() {
    assert_eq!(requested(&annotations(&[])), None);
    assert_eq!(
        requested(&annotations(&[(REQUEST, "r1")])),
        Some(Ok(Request {
            id: "r1".into(),
            kind: None
        }))
    );
    assert_eq!(
        requested(&annotations(&[(REQUEST, "r1"), (REQUEST_TYPE, "incr")])),
        Some(Ok(Request {
            id: "r1".into(),
            kind: Some(BackupKind::Incr)
        }))
    );
    let Some(Err((id, error))) = requested(&annotations(&[
        (REQUEST, "r1"),
        (REQUEST_TYPE, "differential"),
    ])) else {
        panic!("a type outside full, diff and incr is an error");
    };
    assert_eq!(id, "r1");
    assert_eq!(
        error.to_string(),
        "multigres.com/backup-request-type: \"differential\" is not a backup type: use full, \
         diff or incr"
    );
    let Some(Err((_, error))) = requested(&annotations(&[(REQUEST, "now please")])) else {
        panic!("an id with a space is an error");
    };
    assert!(error.to_string().starts_with(REQUEST), "{error}");
}

#[test]
fn a_fresh_id_is_the_utc_time_to_the_second() {
    let at: Timestamp = "2026-12-04T22:15:00.731Z".parse().unwrap();
    assert_eq!(id_at(at), "20261204T221500Z");
    assert!(valid_id(&id_at(at)));
}

#[test]
fn the_rollup_counts_the_shards_answers() {
    let done =
        shard("requestedBackup: {id: r1, type: full, state: Completed, backup: 20261204-221503F}");
    let running = shard("requestedBackup: {id: r1, type: full, state: Running}");
    let failed = ShardStatus {
        requested_backup: Some(taken("r1", BackupRequestState::Failed, Some("no space"))),
        ..Default::default()
    };
    let rollup_of = |shards: &[(&str, Option<&ShardStatus>)]| rollup("r1", shards);

    let all_done = rollup_of(&[("a", Some(&done)), ("b", Some(&done))]);
    assert_eq!(
        (
            all_done.state,
            all_done.shards_completed,
            all_done.shards_total
        ),
        (BackupRequestPhase::Completed, 2, 2)
    );
    assert_eq!(all_done.message, None);

    let half = rollup_of(&[("a", Some(&done)), ("b", Some(&running))]);
    assert_eq!(
        (half.state, half.shards_completed, half.shards_total),
        (BackupRequestPhase::Running, 1, 2)
    );

    let one_failed = rollup_of(&[("a", Some(&done)), ("b", Some(&failed))]);
    assert_eq!(
        (one_failed.state, one_failed.shards_failed),
        (BackupRequestPhase::Failed, 1)
    );
    assert_eq!(one_failed.message.as_deref(), Some("shard b: no space"));

    let failed_while_another_runs = rollup_of(&[("a", Some(&running)), ("b", Some(&failed))]);
    assert_eq!(
        failed_while_another_runs.state,
        BackupRequestPhase::Running,
        "Failed only once every shard answered"
    );

    assert_eq!(rollup_of(&[("a", None)]).state, BackupRequestPhase::Pending);
    assert_eq!(rollup_of(&[]).state, BackupRequestPhase::Pending);
}

#[test]
fn a_request_behind_another_backup_is_queued_and_the_previous_one_still_answers() {
    let behind = ShardStatus {
        requested_backup: Some(taken("r1", BackupRequestState::Running, None)),
        queued_request: Some(QueuedBackupRequest {
            id: "r2".into(),
            type_: BackupKind::Full,
        }),
        ..Default::default()
    };
    let queued = rollup("r2", &[("a", Some(&behind))]);
    assert_eq!(queued.state, BackupRequestPhase::Queued);
    assert_eq!(
        queued.message.as_deref(),
        Some("waiting for the backup running before it on a")
    );
    let taken_next = ShardStatus {
        requested_backup: Some(taken("r2", BackupRequestState::Running, None)),
        previous_requested_backup: Some(taken("r1", BackupRequestState::Completed, None)),
        ..Default::default()
    };
    assert_eq!(
        rollup("r1", &[("a", Some(&taken_next))]).state,
        BackupRequestPhase::Completed,
        "the first request's outcome stays readable after the second starts"
    );
}
