use kube::runtime::events::EventType;
use multigres_api::resolver::{MissingTemplate, ResolveError, TemplateKind};
use multigres_api::v1alpha1::{CellConfig, CellName, MultigresCluster};
use multigres_common::conditions::{FALSE, TRUE, UNKNOWN};

use super::*;
use crate::target::Server;

fn target() -> Target {
    Target {
        endpoints: vec!["http://127.0.0.1:2379".into()],
        root: "/multigres/global".into(),
        tls: None,
        server: Server::External,
    }
}

fn unavailable() -> TopoError {
    TopoError::Unavailable {
        operation: "list owners".into(),
        source: etcd_client::Error::InvalidArgs("connection refused".into()),
    }
}

fn done(records: &[(RecordRef, Registration)]) -> Registered {
    Registered {
        records: records.to_vec(),
        ..Default::default()
    }
}

fn shape(c: &[Computed]) -> Vec<(&str, &str, &str)> {
    c.iter().map(|c| (c.type_, c.status, c.reason)).collect()
}

#[test]
fn registered_cluster_names_its_records_and_server() {
    let result = Ok(done(&[
        (RecordRef::cell("zone-a"), Registration::Unchanged),
        (RecordRef::cell("zone-b"), Registration::Created),
        (RecordRef::database("postgres"), Registration::Unchanged),
    ]));
    let c = conditions(Some(&target()), &result);
    assert_eq!(
        shape(&c),
        [
            (TOPO_SERVER_REACHABLE, TRUE, "Reachable"),
            (TOPOLOGY_REGISTERED, TRUE, "Registered")
        ]
    );
    assert_eq!(
        c[1].message,
        "Registered cells zone-a, zone-b and database postgres in etcd at http://127.0.0.1:2379 (root /multigres/global)."
    );
}

#[test]
fn a_kept_stale_cell_is_explained() {
    let mut registered = done(&[(RecordRef::cell("zone-a"), Registration::Unchanged)]);
    registered.kept.push((
        RecordRef::cell("zone-old"),
        "database record(s) legacy still list it".into(),
    ));
    let c = conditions(Some(&target()), &Ok(registered));
    assert!(
        c[1].message
            .ends_with("Kept cell zone-old, which the spec no longer has: database record(s) legacy still list it."),
        "{}",
        c[1].message
    );
}

#[test]
fn an_outage_is_reported_on_both_conditions() {
    let c = conditions(Some(&target()), &Err(Error::Topo(unavailable())));
    assert_eq!(
        shape(&c),
        [
            (TOPO_SERVER_REACHABLE, FALSE, "Unreachable"),
            (TOPOLOGY_REGISTERED, FALSE, "TopoServerUnreachable")
        ]
    );
    assert!(c[0].message.contains("127.0.0.1:2379"), "{}", c[0].message);
}

#[test]
fn a_record_of_another_cluster_says_whose_and_what_to_change() {
    let err = TopoError::OwnedByOther {
        record: "database postgres".into(),
        owner: "team-b/other".into(),
    };
    let c = conditions(Some(&target()), &Err(Error::Topo(err)));
    assert_eq!(
        shape(&c),
        [
            (TOPO_SERVER_REACHABLE, TRUE, "Reachable"),
            (TOPOLOGY_REGISTERED, FALSE, "OwnedByAnotherCluster")
        ]
    );
    assert!(c[1].message.contains("team-b/other"), "{}", c[1].message);
    assert!(c[1].message.contains("rootPath"), "{}", c[1].message);
}

#[test]
fn spec_problems_leave_reachability_unknown() {
    let err = ResolveError::MissingTemplates(vec![MissingTemplate {
        kind: TemplateKind::Cell,
        name: "big".into(),
        field: "spec.cells[0].cellTemplate".into(),
    }]);
    let c = conditions(None, &Err(Error::Resolve(err)));
    assert_eq!(
        shape(&c),
        [
            (TOPO_SERVER_REACHABLE, UNKNOWN, "NotChecked"),
            (TOPOLOGY_REGISTERED, FALSE, "InvalidSpec")
        ]
    );
    assert!(
        c[1].message.contains("spec.cells[0].cellTemplate"),
        "{}",
        c[1].message
    );
}

#[test]
fn a_missing_tls_secret_is_named() {
    let err = ConnectError::SecretMissing {
        namespace: "team-a".into(),
        name: "etcd-ca".into(),
        field: "spec.globalTopoServer.external.caSecret".into(),
    };
    let c = conditions(Some(&target()), &Err(Error::Connect(err)));
    assert_eq!(
        shape(&c),
        [
            (TOPO_SERVER_REACHABLE, FALSE, "SecretNotFound"),
            (TOPOLOGY_REGISTERED, FALSE, "NotConnected")
        ]
    );
    assert!(c[0].message.contains("team-a/etcd-ca"), "{}", c[0].message);
}

#[test]
fn notices_report_only_writes_and_prunes() {
    let mut registered = done(&[
        (RecordRef::cell("zone-a"), Registration::Unchanged),
        (RecordRef::cell("zone-b"), Registration::Created),
        (RecordRef::database("postgres"), Registration::Updated),
    ]);
    let notices = registration_notices(&target(), &registered);
    assert_eq!(notices.len(), 1);
    assert_eq!(notices[0].reason, "TopologyRegistered");
    assert!(
        notices[0].message.starts_with(
            "Registered cell zone-b (created), database postgres (updated) in etcd at"
        ),
        "{}",
        notices[0].message
    );
    registered.records.truncate(1);
    registered.pruned.push(RecordRef::cell("zone-old"));
    let notices = registration_notices(&target(), &registered);
    assert_eq!(notices.len(), 1);
    assert_eq!(notices[0].reason, "TopologyPruned");
    assert!(registration_notices(&target(), &done(&[])).is_empty());
}

#[test]
fn skipped_cleanup_warns_with_what_may_remain() {
    let mut cluster = MultigresCluster::new("prod", Default::default());
    cluster.spec.cells = vec![
        CellConfig {
            name: CellName::new("zone-a"),
            ..Default::default()
        },
        CellConfig {
            name: CellName::new("zone-b"),
            ..Default::default()
        },
    ];
    let error = Error::Topo(unavailable());
    let notice = cleanup_skipped_notice(&cluster, Some(&target()), "gone for 2m0s", Some(&error));
    assert_eq!(notice.type_, EventType::Warning);
    assert_eq!(notice.reason, "TopologyCleanupSkipped");
    for part in [
        "gone for 2m0s",
        "connection refused",
        "cells zone-a, zone-b and database postgres",
        "/multigres/global/operator-owners/",
    ] {
        assert!(notice.message.contains(part), "{part}: {}", notice.message);
    }
    let done = deregistered_notice(&target(), &[RecordRef::database("postgres")]);
    assert_eq!(done.type_, EventType::Normal);
    assert!(
        done.message
            .starts_with("Removed database postgres from etcd at")
    );
}

#[test]
fn a_failed_finalizer_update_blocks_registration_but_not_reachability() {
    let err = Error::Finalizer(kube::Error::Api(
        kube::core::Status::failure("the object has been modified", "Conflict")
            .with_code(409)
            .boxed(),
    ));
    let c = conditions(Some(&target()), &Err(err));
    assert_eq!(
        shape(&c),
        [
            (TOPO_SERVER_REACHABLE, TRUE, "Reachable"),
            (TOPOLOGY_REGISTERED, FALSE, "RegistrationFailed")
        ]
    );
    assert!(c[1].message.contains("finalizer"), "{}", c[1].message);
}

#[test]
fn a_starting_managed_server_is_waited_for_without_alarm() {
    let err = Error::ServerNotReady {
        topo_server: "prod-global-topo".into(),
    };
    let c = conditions(Some(&target()), &Err(err));
    assert_eq!(
        shape(&c),
        [
            (TOPO_SERVER_REACHABLE, UNKNOWN, "TopoServerNotReady"),
            (TOPOLOGY_REGISTERED, UNKNOWN, "TopoServerNotReady")
        ]
    );
    assert!(
        c[0].message.contains("prod-global-topo"),
        "{}",
        c[0].message
    );
}

fn shard_with(name: &str, status: &str) -> Shard {
    let mut shard = Shard::new(name, Default::default());
    shard.status = Some(serde_yaml::from_str(status).unwrap());
    shard
}

#[test]
fn the_backup_request_is_rolled_up_over_the_clusters_shards() {
    let mut cluster = MultigresCluster::new("prod", Default::default());
    let done = shard_with(
        "prod-postgres-default-0-80",
        "requestedBackup: {id: r1, type: full, state: Completed, backup: 20261204-221503F}",
    );
    let running = shard_with(
        "prod-postgres-default-80-inf",
        "requestedBackup: {id: r1, type: full, state: Running, pod: p-1}",
    );
    assert_eq!(backup_request(&cluster, std::slice::from_ref(&done)), None);
    cluster.metadata.annotations = Some([(REQUEST.to_owned(), "r1".to_owned())].into());
    let half = backup_request(&cluster, &[done.clone(), running]).unwrap();
    assert_eq!(
        (half.state, half.shards_completed, half.shards_total),
        (BackupRequestPhase::Running, 1, 2)
    );
    let other = shard_with(
        "prod-postgres-default-80-inf",
        "requestedBackup: {id: r1, type: full, state: Completed}",
    );
    let all = backup_request(&cluster, &[done, other]).unwrap();
    assert_eq!(all.state, BackupRequestPhase::Completed);

    let notice = backup_request_notice(Some(&half), Some(&all)).unwrap();
    assert_eq!(notice.reason, BACKUP_REQUEST_COMPLETED);
    assert_eq!(
        notice.message,
        "request r1: the backup completed on all 2 shards"
    );
    assert_eq!(
        backup_request_notice(Some(&all), Some(&all)),
        None,
        "told once"
    );
    assert_eq!(backup_request_notice(None, Some(&half)), None);
}

#[test]
fn a_failed_backup_request_is_told_with_the_shards_reasons() {
    let mut cluster = MultigresCluster::new("prod", Default::default());
    cluster.metadata.annotations = Some([(REQUEST.to_owned(), "r2".to_owned())].into());
    let failed = shard_with(
        "prod-postgres-default-0-inf",
        "requestedBackup: {id: r2, type: full, state: Failed, message: lease held}",
    );
    let rollup = backup_request(&cluster, &[failed]).unwrap();
    let notice = backup_request_notice(None, Some(&rollup)).unwrap();
    assert_eq!(notice.type_, EventType::Warning);
    assert_eq!(
        notice.message,
        "request r2: the backup failed on 1 of 1 shards: shard prod-postgres-default-0-inf: lease held"
    );
}
