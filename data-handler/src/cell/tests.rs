use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use multigres_api::v1alpha1::{CellConfig, CellName, TopologyPruningConfig};
use multigres_common::conditions::{FALSE, TRUE, UNKNOWN};

use super::*;

fn check(outcome: Result<CellState, Error>) -> Check {
    Check {
        cluster: "team-a/prod".into(),
        server: Some("etcd at http://127.0.0.1:2379 (root /multigres/global)".into()),
        key: Some("/multigres/global/cells/zone-a/Cell".into()),
        wanted: Some(CellSpec::new("zone-a", vec!["127.0.0.1:2379".into()])),
        outcome,
    }
}

fn shape(c: &[Computed]) -> Vec<(&str, &str, &str)> {
    c.iter().map(|c| (c.type_, c.status, c.reason)).collect()
}

#[test]
fn a_matching_record_is_registered() {
    let c = conditions_of(&check(Ok(CellState::Registered)));
    assert_eq!(
        shape(&c),
        [
            (TOPO_SERVER_REACHABLE, TRUE, "Reachable"),
            (TOPOLOGY_REGISTERED, TRUE, "Registered")
        ]
    );
    assert_eq!(
        c[1].message,
        "The Cell record /multigres/global/cells/zone-a/Cell lists servers 127.0.0.1:2379 and root /multigres/zone-a."
    );
}

#[test]
fn a_missing_or_different_record_points_at_the_cluster() {
    let c = conditions_of(&check(Ok(CellState::Missing)));
    assert_eq!((c[1].status, c[1].reason), (FALSE, "NotRegistered"));
    assert!(
        c[1].message.contains("MultigresCluster team-a/prod"),
        "{}",
        c[1].message
    );

    let mut stored = CellSpec::new("zone-a", vec!["old:2379".into()]).to_record();
    stored.root = "/old".into();
    let c = conditions_of(&check(Ok(CellState::Differs { stored })));
    assert_eq!((c[1].status, c[1].reason), (FALSE, "OutOfDate"));
    assert!(
        c[1].message.contains("lists servers old:2379 and root /old; the spec wants 127.0.0.1:2379 and root /multigres/zone-a"),
        "{}",
        c[1].message
    );
}

#[test]
fn an_outage_leaves_registration_unknown() {
    let down = TopoError::Unavailable {
        operation: "get".into(),
        source: etcd_client::Error::InvalidArgs("connection refused".into()),
    };
    let c = conditions_of(&check(Err(Error::Topo(down))));
    assert_eq!(
        shape(&c),
        [
            (TOPO_SERVER_REACHABLE, FALSE, "Unreachable"),
            (TOPOLOGY_REGISTERED, UNKNOWN, "NotChecked")
        ]
    );
}

#[test]
fn a_missing_cluster_is_named_with_its_label() {
    let mut c = check(Err(Error::ClusterNotFound {
        cluster: "team-a/prod".into(),
    }));
    c.server = None;
    let c = conditions_of(&c);
    assert_eq!(
        shape(&c),
        [
            (TOPO_SERVER_REACHABLE, UNKNOWN, "ClusterNotFound"),
            (TOPOLOGY_REGISTERED, UNKNOWN, "ClusterNotFound")
        ]
    );
    assert!(
        c[0].message.contains("multigres.com/cluster"),
        "{}",
        c[0].message
    );
}

fn cluster(cells: &[&str]) -> MultigresCluster {
    let mut c = MultigresCluster::new("prod", Default::default());
    c.spec.cells = cells
        .iter()
        .map(|n| CellConfig {
            name: CellName::new(*n),
            ..Default::default()
        })
        .collect();
    c
}

#[test]
fn only_a_cell_that_left_its_live_cluster_is_deregistered() {
    assert!(matches!(
        deletion_plan("zone-a", None),
        CellDeletion::Keep(_)
    ));
    let live = cluster(&["zone-a"]);
    assert!(matches!(
        deletion_plan("zone-a", Some(&live)),
        CellDeletion::Keep(why) if why.contains("still has")
    ));
    assert!(matches!(
        deletion_plan("zone-b", Some(&live)),
        CellDeletion::Deregister(_)
    ));
    let mut deleting = live.clone();
    deleting.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
    assert!(matches!(
        deletion_plan("zone-b", Some(&deleting)),
        CellDeletion::Keep(_)
    ));
    let mut no_pruning = live;
    no_pruning.spec.topology_pruning = Some(TopologyPruningConfig {
        enabled: Some(false),
    });
    assert!(matches!(
        deletion_plan("zone-b", Some(&no_pruning)),
        CellDeletion::Keep(why) if why.contains("pruning")
    ));
}

#[test]
fn a_starting_managed_server_leaves_both_unknown() {
    let c = conditions_of(&check(Err(Error::ServerNotReady {
        topo_server: "prod-global-topo".into(),
    })));
    assert_eq!(
        shape(&c),
        [
            (TOPO_SERVER_REACHABLE, UNKNOWN, "TopoServerNotReady"),
            (TOPOLOGY_REGISTERED, UNKNOWN, "TopoServerNotReady")
        ]
    );
}
