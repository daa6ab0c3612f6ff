//! The topology records must encode to exactly the bytes Multigres' Go code produces. The two
//! vectors were produced with `protoc --encode` against upstream's `clustermetadata.proto`.

use multigres_proto::topo::{
    BackupLocation, Cell, Database, DurabilityPolicy, FilesystemBackup, Multipooler,
    PoolerLifecycle, PoolerLifecycleStatus, PoolerServingStatus, QuorumType, RoutingRole,
    RoutingState, RuleNumber, ShardKey, backup_location, id,
};
use prost::Message;

const CELL_HEX: &str = "0a067a6f6e652d6112266d79636c75737465722d676c6f62616c2d746f706f2e6465\
                        6661756c742e7376633a323337391a112f6d756c7469677265732f676c6f62616c";
const DATABASE_HEX: &str = "0a08706f737467726573120c0a0a0a082f6261636b7570731a067a6f6e652d61\
                            22100a0a41545f4c454153545f3218032002";

fn unhex(text: &str) -> Vec<u8> {
    assert!(text.len().is_multiple_of(2), "odd-length hex");
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex digit"))
        .collect()
}

fn example_cell() -> Cell {
    Cell {
        name: "zone-a".into(),
        server_addresses: vec!["mycluster-global-topo.default.svc:2379".into()],
        root: "/multigres/global".into(),
    }
}

fn example_database() -> Database {
    Database {
        name: "postgres".into(),
        backup_location: Some(BackupLocation {
            location: Some(backup_location::Location::Filesystem(FilesystemBackup {
                path: "/backups".into(),
            })),
            ..Default::default()
        }),
        cells: vec!["zone-a".into()],
        bootstrap_durability_policy: Some(DurabilityPolicy {
            policy_name: "AT_LEAST_2".into(),
            quorum_type: QuorumType::AtLeastN as i32,
            required_count: 2,
            ..Default::default()
        }),
    }
}

/// Field numbers of the top-level fields in encoding order (varint and length-delimited only).
fn top_level_field_numbers(mut bytes: &[u8]) -> Vec<u64> {
    fn varint(bytes: &mut &[u8]) -> u64 {
        let mut value = 0;
        for shift in (0..64).step_by(7) {
            let (byte, rest) = bytes.split_first().expect("truncated varint");
            *bytes = rest;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                break;
            }
        }
        value
    }
    let mut numbers = Vec::new();
    while !bytes.is_empty() {
        let key = varint(&mut bytes);
        numbers.push(key >> 3);
        match key & 7 {
            0 => {
                varint(&mut bytes);
            }
            2 => {
                let len = usize::try_from(varint(&mut bytes)).expect("length fits");
                bytes = &bytes[len..];
            }
            other => panic!("unexpected wire type {other}"),
        }
    }
    numbers
}

#[test]
fn cell_encodes_to_upstream_bytes() {
    assert_eq!(example_cell().encode_to_vec(), unhex(CELL_HEX));
}

#[test]
fn cell_decodes_from_upstream_bytes() {
    let cell = Cell::decode(unhex(CELL_HEX).as_slice()).expect("valid Cell bytes");
    assert_eq!(cell, example_cell());
}

#[test]
fn database_encodes_to_upstream_bytes() {
    assert_eq!(example_database().encode_to_vec(), unhex(DATABASE_HEX));
}

#[test]
fn database_decodes_from_upstream_bytes() {
    let db = Database::decode(unhex(DATABASE_HEX).as_slice()).expect("valid Database bytes");
    assert_eq!(db, example_database());
    let policy = db.bootstrap_durability_policy.expect("policy present");
    assert_eq!(policy.quorum_type(), QuorumType::AtLeastN);
}

#[test]
fn quorum_type_values_match_upstream() {
    assert_eq!(QuorumType::Unknown as i32, 0);
    assert_eq!(QuorumType::AtLeastN as i32, 3);
    assert_eq!(QuorumType::MultiCellAtLeastN as i32, 4);
    assert_eq!(
        QuorumType::from_str_name("QUORUM_TYPE_MULTI_CELL_AT_LEAST_N"),
        Some(QuorumType::MultiCellAtLeastN)
    );
    assert_eq!(QuorumType::try_from(1).ok(), None, "1 is not a quorum type");
}

#[test]
fn multipooler_fields_use_upstream_numbers() {
    let pooler = Multipooler {
        id: Some(multigres_proto::topo::Id {
            component: id::ComponentType::Multipooler as i32,
            cell: "zone-a".into(),
            name: "p-1".into(),
        }),
        shard_key: Some(ShardKey {
            database: "postgres".into(),
            table_group: "default".into(),
            shard: "0-inf".into(),
        }),
        serving_status: PoolerServingStatus::Draining as i32,
        hostname: "pod-0.svc".into(),
        port_map: [("grpc".to_string(), 15270)].into_iter().collect(),
        lifecycle_status: Some(PoolerLifecycle {
            status: PoolerLifecycleStatus::LifecycleQuarantined as i32,
            reason: "r".into(),
            updated: Some(prost_types::Timestamp {
                seconds: 1,
                nanos: 0,
            }),
        }),
        routing_state: Some(RoutingState {
            role: RoutingRole::Primary as i32,
            rule: Some(RuleNumber {
                coordinator_term: 7,
                leader_subterm: 1,
            }),
        }),
        ..Default::default()
    };
    let bytes = pooler.encode_to_vec();
    assert_eq!(top_level_field_numbers(&bytes), [1, 2, 7, 8, 9, 12, 13]);
    // serving_status DRAINING is 4 on the wire.
    assert!(bytes.windows(2).any(|w| w == [7 << 3, 4]));
    // routing_state{role: PRIMARY(1), rule{7, 1}}.
    let routing = [(13 << 3) | 2, 8, 0x08, 1, 0x12, 4, 0x08, 7, 0x10, 1];
    assert!(bytes.windows(routing.len()).any(|w| w == routing));
    assert_eq!(
        Multipooler::decode(bytes.as_slice()).expect("round trip"),
        pooler
    );
}
