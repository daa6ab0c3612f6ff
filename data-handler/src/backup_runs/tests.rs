use multigres_proto::topo::{Multipooler, RoutingRole, RoutingState};

use super::*;

fn record(pod: &str, primary: bool, serving: PoolerServingStatus) -> PoolerRecord {
    let role = if primary {
        RoutingRole::Primary
    } else {
        RoutingRole::Replica
    };
    let mut pooler = Multipooler {
        hostname: format!("{pod}.pool"),
        port_map: [("grpc".to_owned(), 15200)].into(),
        shard_key: Some(multigres_proto::topo::ShardKey {
            database: "postgres".into(),
            table_group: "default".into(),
            shard: "0-inf".into(),
        }),
        routing_state: Some(RoutingState {
            role: role as i32,
            ..Default::default()
        }),
        ..Default::default()
    };
    pooler.set_serving_status(serving);
    PoolerRecord {
        key: format!("poolers/{pod}"),
        revision: 0,
        id: format!("multipooler-zone-a-{pod}"),
        pooler,
    }
}

const KEY: ShardKey<'static> = ShardKey {
    database: "postgres",
    table_group: "default",
    shard: "0-inf",
};

fn pods(names: &[&str]) -> Vec<PoolPod> {
    names
        .iter()
        .map(|n| PoolPod {
            name: (*n).to_owned(),
            cell: Some("zone-a".into()),
        })
        .collect()
}

#[test]
fn backups_are_taken_on_a_serving_replica_and_on_the_primary_only_when_it_is_alone() {
    let poolers = |records: Vec<PoolerRecord>| BTreeMap::from([("zone-a".into(), Some(records))]);
    let three = pods(&["p-0", "p-1", "p-2"]);
    let all = poolers(vec![
        record("p-0", true, PoolerServingStatus::Serving),
        record("p-1", false, PoolerServingStatus::Disabled),
        record("p-2", false, PoolerServingStatus::Serving),
    ]);
    let (pod, address, on_primary) = source(KEY, &three, &all).unwrap();
    assert_eq!(
        (pod.name.as_str(), address.as_str(), on_primary),
        ("p-2", "http://p-2.pool:15200", false)
    );
    let no_serving_replica = poolers(vec![
        record("p-0", true, PoolerServingStatus::Serving),
        record("p-1", false, PoolerServingStatus::Disabled),
    ]);
    assert!(
        source(KEY, &three, &no_serving_replica).is_none(),
        "not on the primary while the shard has replicas"
    );
    let alone = pods(&["p-0"]);
    let only = poolers(vec![record("p-0", true, PoolerServingStatus::Serving)]);
    let (pod, _, on_primary) = source(KEY, &alone, &only).unwrap();
    assert_eq!((pod.name.as_str(), on_primary), ("p-0", true));
}

#[test]
fn a_request_into_a_repository_not_marked_as_the_clusters_is_answered_not_taken() {
    let start = || backup_request::Decision::Start {
        id: "before-migration".into(),
        kind: BackupKind::Full,
        again: false,
    };
    let owned = "s3://b/prod/multigres belongs to another cluster";
    match unless_unclaimed(start(), Some(owned)) {
        backup_request::Decision::Refuse { id, message, .. } => {
            assert_eq!(id, "before-migration");
            assert!(message.contains(owned), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        unless_unclaimed(start(), None),
        backup_request::Decision::Start { .. }
    ));
    assert!(matches!(
        unless_unclaimed(backup_request::Decision::Nothing, Some(owned)),
        backup_request::Decision::Nothing
    ));
}
