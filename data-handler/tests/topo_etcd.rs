//! The topology store against a real etcd (the toolchain's, or `$MULTIGRES_ETCD_BIN`).
//!
//! Records are checked through a separate raw etcd client, the way Multigres reads them.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use data_handler::topo::{
    BackupSpec, CellSpec, CellTls, DatabaseSpec, DurabilityPolicyName, Expected, Plan,
    Registration, TlsPem, TopoConfig, TopoError, TopoStore,
};
use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};
use multigres_e2e::etcd::{EtcdConfig, EtcdProcess, EtcdTls};
use multigres_e2e::pki::Pki;
use multigres_proto::topo::{
    Cell, Database, Id, Multipooler, PoolerLifecycleStatus, RoutingRole, RoutingState, ShardKey, id,
};
use prost::Message;

/// The §1.6 example Database record as Multigres' Go code encodes it.
const POSTGRES_DATABASE_HEX: &str = "0a08706f737467726573120c0a0a0a082f6261636b7570731a067a6f6e652d61\
                                     22100a0a41545f4c454153545f3218032002";

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
        .collect()
}

async fn etcd() -> EtcdProcess {
    EtcdProcess::start(EtcdConfig::default())
        .await
        .expect("etcd starts")
}

async fn store(etcd: &EtcdProcess) -> TopoStore {
    TopoStore::connect(TopoConfig::new(vec![etcd.client_addr()]))
        .await
        .expect("store connects")
}

async fn raw(etcd: &EtcdProcess) -> Client {
    Client::connect([etcd.client_url()], None)
        .await
        .expect("raw client")
}

/// Value and mod revision of a key, read by an independent client.
async fn read(raw: &mut Client, key: &str) -> Option<(Vec<u8>, i64)> {
    let response = raw.get(key, None).await.expect("raw get");
    response
        .kvs()
        .first()
        .map(|kv| (kv.value().to_vec(), kv.mod_revision()))
}

fn postgres(cells: &[&str]) -> DatabaseSpec {
    DatabaseSpec {
        name: "postgres".into(),
        cells: cells.iter().map(|c| c.to_string()).collect(),
        backup: BackupSpec::Filesystem {
            path: "/backups".into(),
        },
        require_initial_repo_encryption: false,
        durability: DurabilityPolicyName::AtLeast2,
    }
}

fn cell(name: &str, etcd: &EtcdProcess) -> CellSpec {
    CellSpec::new(name, vec![etcd.client_addr()])
}

#[tokio::test]
async fn create_then_reregister_is_idempotent() {
    let etcd = etcd().await;
    let store = store(&etcd).await;
    let mut raw = raw(&etcd).await;

    let zone_a = CellSpec::new(
        "zone-a",
        vec!["mycluster-global-topo.default.svc:2379".into()],
    );
    assert_eq!(
        store.register_cell(&zone_a).await.unwrap(),
        Registration::Created
    );
    let (bytes, cell_revision) = read(&mut raw, "/multigres/global/cells/zone-a/Cell")
        .await
        .expect("Cell record written at the upstream key");
    assert_eq!(
        Cell::decode(bytes.as_slice()).unwrap(),
        Cell {
            name: "zone-a".into(),
            server_addresses: vec!["mycluster-global-topo.default.svc:2379".into()],
            root: "/multigres/zone-a".into(),
        }
    );

    let db = postgres(&["zone-a"]);
    assert_eq!(
        store.register_database(&db).await.unwrap(),
        Registration::Created
    );
    let (bytes, db_revision) = read(&mut raw, "/multigres/global/databases/postgres/Database")
        .await
        .expect("Database record written at the upstream key");
    assert_eq!(bytes, unhex(POSTGRES_DATABASE_HEX), "same bytes as Go");

    assert_eq!(
        store.register_cell(&zone_a).await.unwrap(),
        Registration::Unchanged
    );
    assert_eq!(
        store.register_database(&db).await.unwrap(),
        Registration::Unchanged
    );
    let (_, after) = read(&mut raw, "/multigres/global/cells/zone-a/Cell")
        .await
        .unwrap();
    assert_eq!(after, cell_revision, "no write for an unchanged cell");
    let (_, after) = read(&mut raw, "/multigres/global/databases/postgres/Database")
        .await
        .unwrap();
    assert_eq!(after, db_revision, "no write for an unchanged database");

    assert_eq!(store.list_cells().await.unwrap(), ["zone-a"]);
    assert_eq!(store.list_databases().await.unwrap(), ["postgres"]);
    assert_eq!(
        store.get_database("postgres").await.unwrap(),
        Some(db.to_record())
    );
}

#[tokio::test]
async fn update_keeps_fields_multigres_wrote() {
    let etcd = etcd().await;
    let store = store(&etcd).await;
    let mut raw = raw(&etcd).await;
    let key = "/multigres/global/databases/postgres/Database";

    // As written by Multigres after bumping the backup generation, plus a field from a newer
    // Multigres this build does not know (number 15, a string).
    let mut multigres = postgres(&["zone-a"]).to_record();
    multigres
        .backup_location
        .as_mut()
        .unwrap()
        .authoritative_generation = 1;
    let mut bytes = multigres.encode_to_vec();
    bytes.extend([0x7a, 6]);
    bytes.extend(b"future");
    raw.put(key, bytes, None).await.unwrap();

    let wanted = postgres(&["zone-a", "zone-b"]);
    assert_eq!(
        store.register_database(&wanted).await.unwrap(),
        Registration::Updated
    );
    let (stored, _) = read(&mut raw, key).await.unwrap();
    let db = Database::decode(stored.as_slice()).unwrap();
    assert_eq!(db.cells, ["zone-a", "zone-b"]);
    assert_eq!(db.backup_location.unwrap().authoritative_generation, 1);
    assert!(stored.ends_with(b"\x7a\x06future"), "unknown field kept");
    assert_eq!(
        store.register_database(&wanted).await.unwrap(),
        Registration::Unchanged
    );
}

#[tokio::test]
async fn compare_and_swap_conflicts_are_detected_and_retried() {
    let etcd = etcd().await;
    let store = store(&etcd).await;
    let mut raw = raw(&etcd).await;
    let key = "/multigres/global/databases/postgres/Database";
    store
        .register_database(&postgres(&["zone-a"]))
        .await
        .unwrap();

    // The operator reads, then Multigres writes before the operator's write lands.
    let wanted = postgres(&["zone-a", "zone-b"]);
    let Plan::Write(plan) = store.plan_database(&wanted).await.unwrap() else {
        panic!("a changed spec plans a write");
    };
    assert!(matches!(plan.expected, Expected::ModRevision(_)));
    let mut multigres = postgres(&["zone-a"]).to_record();
    multigres
        .backup_location
        .as_mut()
        .unwrap()
        .authoritative_generation = 2;
    raw.put(key, multigres.encode_to_vec(), None).await.unwrap();

    let err = store
        .apply(&plan)
        .await
        .expect_err("stale plan must not land");
    assert!(matches!(err, TopoError::Conflict { .. }), "{err}");
    assert!(err.is_transient());
    let (stored, _) = read(&mut raw, key).await.unwrap();
    assert_eq!(
        Database::decode(stored.as_slice()).unwrap(),
        multigres,
        "Multigres' write survives"
    );

    assert_eq!(
        store.register_database(&wanted).await.unwrap(),
        Registration::Updated
    );
    let (stored, _) = read(&mut raw, key).await.unwrap();
    let db = Database::decode(stored.as_slice()).unwrap();
    assert_eq!(db.cells, ["zone-a", "zone-b"]);
    assert_eq!(db.backup_location.unwrap().authoritative_generation, 2);

    // A stale create: the key appeared after the plan saw it absent.
    let Plan::Write(create) = store.plan_cell(&cell("zone-c", &etcd)).await.unwrap() else {
        panic!("a missing cell plans a write");
    };
    assert_eq!(create.expected, Expected::Absent);
    raw.put("/multigres/global/cells/zone-c/Cell", Vec::new(), None)
        .await
        .unwrap();
    assert!(matches!(
        store.apply(&create).await,
        Err(TopoError::Conflict { .. })
    ));
}

#[tokio::test]
async fn concurrent_writers_lose_no_update() {
    const BUMPS: i64 = 30;
    let etcd = etcd().await;
    let store = std::sync::Arc::new(store(&etcd).await);
    let key = "/multigres/global/databases/postgres/Database";
    store
        .register_database(&postgres(&["zone-a"]))
        .await
        .unwrap();

    // "Multigres" increments authoritative_generation with its own compare-and-swap loop while
    // the operator flips the cell list back and forth.
    let mut raw = raw(&etcd).await;
    let bumper = tokio::spawn(async move {
        for _ in 0..BUMPS {
            loop {
                let (bytes, revision) = read(&mut raw, key).await.unwrap();
                let mut db = Database::decode(bytes.as_slice()).unwrap();
                db.backup_location
                    .as_mut()
                    .unwrap()
                    .authoritative_generation += 1;
                let txn = Txn::new()
                    .when([Compare::mod_revision(key, CompareOp::Equal, revision)])
                    .and_then([TxnOp::put(key, db.encode_to_vec(), None)]);
                if raw.txn(txn).await.unwrap().succeeded() {
                    break;
                }
            }
        }
        raw
    });
    let specs = [postgres(&["zone-a"]), postgres(&["zone-a", "zone-b"])];
    let mut operators = Vec::new();
    for worker in 0..2 {
        let store = store.clone();
        let specs = specs.clone();
        operators.push(tokio::spawn(async move {
            for round in 0..BUMPS as usize {
                let spec = &specs[(round + worker) % 2];
                loop {
                    match store.register_database(spec).await {
                        Ok(_) => break,
                        Err(e) if e.is_transient() => continue,
                        Err(e) => panic!("permanent error: {e}"),
                    }
                }
            }
        }));
    }
    for operator in operators {
        operator.await.unwrap();
    }
    let mut raw = bumper.await.unwrap();
    let (bytes, _) = read(&mut raw, key).await.unwrap();
    let db = Database::decode(bytes.as_slice()).unwrap();
    assert_eq!(
        db.backup_location.unwrap().authoritative_generation,
        BUMPS,
        "every Multigres increment survived the operator's writes"
    );
    assert!(specs.iter().any(|s| s.cells == db.cells), "{:?}", db.cells);
}

#[tokio::test]
async fn deregistering_a_referenced_cell_is_refused() {
    let etcd = etcd().await;
    let store = store(&etcd).await;
    let mut raw = raw(&etcd).await;
    for name in ["zone-a", "zone-b"] {
        store.register_cell(&cell(name, &etcd)).await.unwrap();
    }
    store
        .register_database(&postgres(&["zone-a", "zone-b"]))
        .await
        .unwrap();
    // Multigres' own keys below the database directory are not Database records.
    raw.put(
        "/multigres/global/databases/postgres/default/0-inf/ShardInitClaim",
        vec![0x0a, 0],
        None,
    )
    .await
    .unwrap();

    let err = store.deregister_cell("zone-b").await.unwrap_err();
    match &err {
        TopoError::CellReferenced { cell, databases } => {
            assert_eq!(cell, "zone-b");
            assert_eq!(databases, &["postgres"]);
        }
        other => panic!("unexpected error: {other}"),
    }
    assert!(!err.is_transient());
    assert_eq!(store.list_cells().await.unwrap(), ["zone-a", "zone-b"]);

    store
        .register_database(&postgres(&["zone-a"]))
        .await
        .unwrap();
    assert!(store.deregister_cell("zone-b").await.unwrap());
    assert!(
        !store.deregister_cell("zone-b").await.unwrap(),
        "absent is fine"
    );
    assert_eq!(store.list_cells().await.unwrap(), ["zone-a"]);
    assert_eq!(store.list_databases().await.unwrap(), ["postgres"]);

    assert!(store.deregister_database("postgres").await.unwrap());
    assert!(!store.deregister_database("postgres").await.unwrap());
    assert!(
        store.list_databases().await.unwrap().is_empty(),
        "a leftover claim is not a database"
    );
    assert!(store.deregister_cell("zone-a").await.unwrap());
    assert!(store.list_cells().await.unwrap().is_empty());
}

fn pooler(cell: &str, name: &str, role: RoutingRole) -> Multipooler {
    Multipooler {
        id: Some(Id {
            component: id::ComponentType::Multipooler as i32,
            cell: cell.into(),
            name: name.into(),
        }),
        shard_key: Some(ShardKey {
            database: "postgres".into(),
            table_group: "default".into(),
            shard: "0-inf".into(),
        }),
        hostname: format!("{name}.pods"),
        port_map: [("grpc".to_string(), 15270)].into_iter().collect(),
        routing_state: Some(RoutingState {
            role: role as i32,
            rule: None,
        }),
        ..Default::default()
    }
}

#[tokio::test]
async fn poolers_are_listed_from_the_cell_topology() {
    let global = etcd().await;
    // zone-b keeps its records on its own etcd, like a cell with a managed local topology.
    let local = etcd().await;
    let store = store(&global).await;
    let mut raw_global = raw(&global).await;
    let mut raw_local = raw(&local).await;
    store.register_cell(&cell("zone-a", &global)).await.unwrap();
    store.register_cell(&cell("zone-b", &local)).await.unwrap();

    let records = [("p-1", RoutingRole::Replica), ("p-2", RoutingRole::Primary)];
    for (name, role) in records {
        raw_global
            .put(
                format!("/multigres/zone-a/poolers/multipooler-zone-a-{name}/Pooler"),
                pooler("zone-a", name, role).encode_to_vec(),
                None,
            )
            .await
            .unwrap();
    }
    // Not poolers, or not zone-a's.
    raw_global
        .put(
            "/multigres/zone-a/gateways/multigateway-zone-a-g/Gateway",
            vec![],
            None,
        )
        .await
        .unwrap();
    raw_global
        .put(
            "/multigres/zone-ab/poolers/multipooler-zone-ab-x/Pooler",
            vec![],
            None,
        )
        .await
        .unwrap();
    raw_local
        .put(
            "/multigres/zone-b/poolers/multipooler-zone-b-q/Pooler",
            pooler("zone-b", "q", RoutingRole::Primary).encode_to_vec(),
            None,
        )
        .await
        .unwrap();

    let zone_a = store
        .list_poolers("zone-a", &CellTls::Global)
        .await
        .unwrap();
    let ids: Vec<&str> = zone_a.iter().map(|p| p.id.as_str()).collect();
    assert_eq!(ids, ["multipooler-zone-a-p-1", "multipooler-zone-a-p-2"]);
    assert_eq!(
        zone_a[0].pooler,
        pooler("zone-a", "p-1", RoutingRole::Replica)
    );
    assert!(!zone_a[0].is_primary());
    assert!(zone_a[1].is_primary());

    let zone_b = store
        .list_poolers("zone-b", &CellTls::Global)
        .await
        .unwrap();
    assert_eq!(zone_b.len(), 1);
    assert_eq!(zone_b[0].pooler.hostname, "q.pods");

    let missing = store
        .list_poolers("zone-x", &CellTls::Global)
        .await
        .unwrap_err();
    assert!(
        matches!(missing, TopoError::CellNotRegistered { .. }),
        "{missing}"
    );

    raw_global
        .put(
            "/multigres/zone-a/poolers/multipooler-zone-a-bad/Pooler",
            vec![0x0a, 0x7f],
            None,
        )
        .await
        .unwrap();
    let malformed = store
        .list_poolers("zone-a", &CellTls::Global)
        .await
        .unwrap_err();
    assert!(
        matches!(malformed, TopoError::Malformed { .. }),
        "{malformed}"
    );
    assert!(!malformed.is_transient());
    assert!(malformed.to_string().contains("multipooler-zone-a-bad"));
}

#[tokio::test]
async fn a_stale_pooler_record_is_marked_shut_down_unless_rewritten() {
    let global = etcd().await;
    let local = etcd().await;
    let store = store(&global).await;
    let mut raw_local = raw(&local).await;
    store.register_cell(&cell("zone-b", &local)).await.unwrap();
    let key = "/multigres/zone-b/poolers/multipooler-zone-b-q/Pooler";
    let written = pooler("zone-b", "q", RoutingRole::Primary);
    raw_local
        .put(key, written.encode_to_vec(), None)
        .await
        .unwrap();
    let read = store
        .list_poolers("zone-b", &CellTls::Global)
        .await
        .unwrap();
    // Its pooler rewrites it first: the mark is not written.
    let mut rewritten = read[0].clone();
    rewritten.revision -= 1;
    let reason = "operator: stale";
    assert_eq!(
        store
            .mark_shut_down("zone-b", &CellTls::Global, &rewritten, reason)
            .await
            .unwrap(),
        None
    );
    let marked = store
        .mark_shut_down("zone-b", &CellTls::Global, &read[0], reason)
        .await
        .unwrap();
    let after = store
        .list_poolers("zone-b", &CellTls::Global)
        .await
        .unwrap();
    assert_eq!(
        marked.as_ref(),
        Some(&after[0].pooler),
        "what it wrote is returned"
    );
    let lifecycle = after[0].pooler.lifecycle_status.clone().unwrap();
    assert_eq!(lifecycle.status(), PoolerLifecycleStatus::LifecycleShutdown);
    assert_eq!(lifecycle.reason, reason);
    assert!(lifecycle.updated.is_some());
    // Nothing else of the record changed.
    let mut unchanged = after[0].pooler.clone();
    unchanged.lifecycle_status = None;
    assert_eq!(unchanged, written);
}

#[tokio::test]
async fn outage_gives_a_transient_error_within_the_timeout_then_recovers() {
    let mut etcd = etcd().await;
    let request_timeout = Duration::from_secs(2);
    let config = TopoConfig {
        request_timeout,
        connect_timeout: Duration::from_secs(1),
        ..TopoConfig::new(vec![etcd.client_addr()])
    };
    let store = TopoStore::connect(config).await.unwrap();
    let zone_a = cell("zone-a", &etcd);
    store.register_cell(&zone_a).await.unwrap();

    etcd.stop();
    for attempt in 0..3 {
        let started = Instant::now();
        let err = store
            .register_cell(&cell("zone-b", &etcd))
            .await
            .expect_err("etcd is down");
        let elapsed = started.elapsed();
        assert!(err.is_transient(), "attempt {attempt}: {err}");
        assert!(
            elapsed < request_timeout + Duration::from_secs(1),
            "attempt {attempt} took {elapsed:?}: {err}"
        );
    }
    assert!(store.list_cells().await.unwrap_err().is_transient());

    etcd.restart().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let outcome = loop {
        match store.register_cell(&cell("zone-b", &etcd)).await {
            Ok(outcome) => break outcome,
            Err(e) if e.is_transient() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("no recovery after restart: {e}"),
        }
    };
    assert_eq!(outcome, Registration::Created);
    assert_eq!(
        store.register_cell(&zone_a).await.unwrap(),
        Registration::Unchanged,
        "data survived the restart"
    );
    assert_eq!(store.list_cells().await.unwrap(), ["zone-a", "zone-b"]);
}

#[tokio::test]
async fn connecting_while_etcd_is_down_defers_the_failure_to_requests() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    drop(listener);
    let config = TopoConfig {
        request_timeout: Duration::from_secs(1),
        ..TopoConfig::new(vec![address])
    };
    let store = TopoStore::connect(config)
        .await
        .expect("no connection is needed to build the store");
    let started = Instant::now();
    let err = store.list_databases().await.unwrap_err();
    assert!(err.is_transient(), "{err}");
    assert!(started.elapsed() < Duration::from_secs(3), "{err}");
}

#[tokio::test]
async fn tls_with_client_certificates() {
    let dir = tempfile::tempdir().unwrap();
    // A CA-signed serving certificate for 127.0.0.1 and a client certificate from the same CA.
    let pki = Pki::generate(dir.path(), &[Ipv4Addr::LOCALHOST]).unwrap();
    let etcd = EtcdProcess::start(EtcdConfig {
        tls: Some(EtcdTls {
            cert_file: pki.apiserver_cert.clone(),
            key_file: pki.apiserver_key.clone(),
            client_ca_file: Some(pki.ca_cert.clone()),
        }),
        ..EtcdConfig::default()
    })
    .await
    .unwrap();
    let pem = |path: &std::path::Path| std::fs::read(path).unwrap();
    let tls = TlsPem {
        ca: pem(&pki.ca_cert),
        client_cert: Some(pem(&pki.admin_cert)),
        client_key: Some(pem(&pki.admin_key)),
        server_name: None,
    };
    let config = |tls: TlsPem| TopoConfig {
        tls: Some(tls),
        request_timeout: Duration::from_secs(3),
        ..TopoConfig::new(vec![etcd.client_addr()])
    };

    let store = TopoStore::connect(config(tls.clone())).await.unwrap();
    assert_eq!(
        store.register_cell(&cell("zone-a", &etcd)).await.unwrap(),
        Registration::Created
    );
    assert_eq!(store.list_cells().await.unwrap(), ["zone-a"]);

    let anonymous = TopoStore::connect(config(TlsPem {
        client_cert: None,
        client_key: None,
        ..tls.clone()
    }))
    .await
    .unwrap();
    assert!(
        anonymous.list_cells().await.is_err(),
        "etcd requires a client certificate"
    );

    let half = TopoStore::connect(config(TlsPem {
        client_key: None,
        ..tls.clone()
    }))
    .await
    .unwrap_err();
    assert!(matches!(half, TopoError::Config(_)), "{half}");

    let plaintext = TopoStore::connect(TopoConfig {
        endpoints: vec![etcd.client_url().replace("https://", "http://")],
        ..config(tls)
    })
    .await
    .unwrap_err();
    assert!(matches!(plaintext, TopoError::Config(_)), "{plaintext}");
}

#[tokio::test]
async fn a_cell_on_its_own_tls_etcd_is_read_with_its_own_tls_settings() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::generate(dir.path(), &[Ipv4Addr::LOCALHOST]).unwrap();
    // The global topology is plaintext; zone-b keeps its records on its own etcd, which serves
    // TLS and requires a client certificate.
    let global = etcd().await;
    let local = EtcdProcess::start(EtcdConfig {
        tls: Some(EtcdTls {
            cert_file: pki.apiserver_cert.clone(),
            key_file: pki.apiserver_key.clone(),
            client_ca_file: Some(pki.ca_cert.clone()),
        }),
        ..EtcdConfig::default()
    })
    .await
    .unwrap();
    let pem = |path: &std::path::Path| std::fs::read(path).unwrap();
    let cell_tls = TlsPem {
        ca: pem(&pki.ca_cert),
        client_cert: Some(pem(&pki.admin_cert)),
        client_key: Some(pem(&pki.admin_key)),
        server_name: None,
    };
    let store = TopoStore::connect(TopoConfig {
        request_timeout: Duration::from_secs(3),
        ..TopoConfig::new(vec![global.client_addr()])
    })
    .await
    .unwrap();
    store.register_cell(&cell("zone-b", &local)).await.unwrap();
    let mut raw_local = Client::connect(
        [local.client_url()],
        Some(
            etcd_client::ConnectOptions::new().with_tls(
                etcd_client::TlsOptions::new()
                    .ca_certificate(etcd_client::Certificate::from_pem(&cell_tls.ca))
                    .identity(etcd_client::Identity::from_pem(
                        cell_tls.client_cert.clone().unwrap(),
                        cell_tls.client_key.clone().unwrap(),
                    )),
            ),
        ),
    )
    .await
    .unwrap();
    raw_local
        .put(
            "/multigres/zone-b/poolers/multipooler-zone-b-q/Pooler",
            pooler("zone-b", "q", RoutingRole::Primary).encode_to_vec(),
            None,
        )
        .await
        .unwrap();

    let own = store
        .list_poolers("zone-b", &CellTls::Own(Some(cell_tls.clone())))
        .await
        .unwrap();
    assert_eq!(own.len(), 1);
    assert_eq!(own[0].pooler.hostname, "q.pods");

    let with_global_settings = store.list_poolers("zone-b", &CellTls::Global).await;
    assert!(
        with_global_settings.is_err(),
        "the global (plaintext) settings cannot read a TLS cell etcd"
    );
    let anonymous = store
        .list_poolers(
            "zone-b",
            &CellTls::Own(Some(TlsPem {
                client_cert: None,
                client_key: None,
                ..cell_tls
            })),
        )
        .await;
    assert!(
        anonymous.is_err(),
        "the cell's etcd requires its client certificate"
    );
}
