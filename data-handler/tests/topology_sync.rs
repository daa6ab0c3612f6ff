//! Registration, pruning and deregistration of whole clusters ([`data_handler::sync`]) against a
//! real etcd (the toolchain's, or `$MULTIGRES_ETCD_BIN`): ownership markers keep clusters that
//! share a root apart, pruning never removes a cell a Database record still names, and deletion
//! works with the server up, and gives up by the rule of [`data_handler::deletion`] without it.
//!
//! Records are read back through a separate raw etcd client, the way Multigres reads them.

use std::time::{Duration, Instant};

use data_handler::deletion::{self, ServerState, Verdict};
use data_handler::desired::Topology;
use data_handler::sync;
use data_handler::topo::{
    BackupSpec, CellSpec, DatabaseSpec, DurabilityPolicyName, RecordRef, Registration, TopoConfig,
    TopoError, TopoStore,
};
use etcd_client::{Client, GetOptions};
use k8s_openapi::jiff::Timestamp;
use multigres_e2e::etcd::{EtcdConfig, EtcdProcess};
use multigres_proto::topo::{Cell, Database};
use prost::Message;

const ROOT: &str = "/multigres/global";
const TEAM_A: &str = "team-a/prod";
const TEAM_B: &str = "team-b/prod";

async fn etcd() -> EtcdProcess {
    EtcdProcess::start(EtcdConfig::default())
        .await
        .expect("etcd starts")
}

async fn store(etcd: &EtcdProcess) -> TopoStore {
    let config = TopoConfig {
        request_timeout: Duration::from_secs(2),
        connect_timeout: Duration::from_secs(1),
        ..TopoConfig::new(vec![etcd.client_addr()])
    };
    TopoStore::connect(config).await.expect("store connects")
}

async fn raw(etcd: &EtcdProcess) -> Client {
    Client::connect([etcd.client_url()], None)
        .await
        .expect("raw client")
}

/// Every key under `prefix`, sorted.
async fn keys(raw: &mut Client, prefix: &str) -> Vec<String> {
    let options = GetOptions::new().with_prefix().with_keys_only();
    let response = raw.get(prefix, Some(options)).await.expect("raw list");
    let mut out: Vec<String> = response
        .kvs()
        .iter()
        .map(|kv| kv.key_str().unwrap().to_owned())
        .collect();
    out.sort();
    out
}

async fn value(raw: &mut Client, key: &str) -> Option<Vec<u8>> {
    let response = raw.get(key, None).await.expect("raw get");
    response.kvs().first().map(|kv| kv.value().to_vec())
}

/// The store's current revision: unchanged means nothing was written.
async fn revision(raw: &mut Client) -> i64 {
    raw.get("/", None)
        .await
        .expect("raw get")
        .header()
        .expect("header")
        .revision()
}

/// One registration pass, reading the markers first as the controller does.
async fn register(
    store: &TopoStore,
    owner: &str,
    topology: &Topology,
) -> Result<sync::Registered, TopoError> {
    let owners = store.owners().await?;
    sync::register(store, owner, topology, &owners).await
}

fn database(name: &str, cells: &[&str]) -> DatabaseSpec {
    DatabaseSpec {
        name: name.into(),
        cells: cells.iter().map(|c| (*c).to_owned()).collect(),
        backup: BackupSpec::Filesystem {
            path: "/backups".into(),
        },
        require_initial_repo_encryption: false,
        durability: DurabilityPolicyName::AtLeast2,
    }
}

fn topology(cells: &[&str], databases: &[&str], etcd: &EtcdProcess) -> Topology {
    Topology {
        cells: cells
            .iter()
            .map(|c| CellSpec::new(*c, vec![etcd.client_addr()]))
            .collect(),
        databases: databases.iter().map(|d| database(d, cells)).collect(),
        pruning: true,
    }
}

#[tokio::test]
async fn registration_writes_records_with_markers_and_nothing_when_unchanged() {
    let etcd = etcd().await;
    let store = store(&etcd).await;
    let mut raw = raw(&etcd).await;
    let wanted = topology(&["zone-a", "zone-b"], &["postgres"], &etcd);

    let done = register(&store, TEAM_A, &wanted).await.unwrap();
    assert_eq!(
        done.records,
        [
            (RecordRef::cell("zone-a"), Registration::Created),
            (RecordRef::cell("zone-b"), Registration::Created),
            (RecordRef::database("postgres"), Registration::Created),
        ]
    );
    let cell = Cell::decode(
        value(&mut raw, "/multigres/global/cells/zone-b/Cell")
            .await
            .unwrap()
            .as_slice(),
    )
    .unwrap();
    assert_eq!(cell, wanted.cells[1].to_record());
    let db = Database::decode(
        value(&mut raw, "/multigres/global/databases/postgres/Database")
            .await
            .unwrap()
            .as_slice(),
    )
    .unwrap();
    assert_eq!(db, wanted.databases[0].to_record());
    assert_eq!(
        keys(&mut raw, "/multigres/global/operator-owners/").await,
        [
            "/multigres/global/operator-owners/cells/zone-a",
            "/multigres/global/operator-owners/cells/zone-b",
            "/multigres/global/operator-owners/databases/postgres",
        ]
    );
    assert_eq!(
        value(&mut raw, "/multigres/global/operator-owners/cells/zone-a").await,
        Some(TEAM_A.as_bytes().to_vec())
    );

    let before = revision(&mut raw).await;
    let again = register(&store, TEAM_A, &wanted).await.unwrap();
    assert!(again.written().next().is_none(), "{again:?}");
    assert_eq!(
        revision(&mut raw).await,
        before,
        "no etcd write when nothing changed"
    );
}

#[tokio::test]
async fn clusters_sharing_a_root_neither_overwrite_nor_prune_each_other() {
    let etcd = etcd().await;
    let store = store(&etcd).await;
    let mut raw = raw(&etcd).await;
    register(&store, TEAM_A, &topology(&["zone-a"], &["postgres"], &etcd))
        .await
        .unwrap();

    // Team B wants the same database name: refused before anything is written.
    let before = revision(&mut raw).await;
    let err = register(&store, TEAM_B, &topology(&["zone-b"], &["postgres"], &etcd))
        .await
        .unwrap_err();
    match &err {
        TopoError::OwnedByOther { record, owner } => {
            assert_eq!(record, "database postgres");
            assert_eq!(owner, TEAM_A);
        }
        other => panic!("unexpected error: {other}"),
    }
    assert_eq!(
        revision(&mut raw).await,
        before,
        "nothing of team B was written"
    );

    // Distinct names coexist; an empty spec for team B prunes only team B's records.
    register(&store, TEAM_B, &topology(&["zone-b"], &[], &etcd))
        .await
        .unwrap();
    assert_eq!(store.list_cells().await.unwrap(), ["zone-a", "zone-b"]);
    let done = register(&store, TEAM_B, &topology(&[], &[], &etcd))
        .await
        .unwrap();
    assert_eq!(done.pruned, [RecordRef::cell("zone-b")]);
    assert_eq!(store.list_cells().await.unwrap(), ["zone-a"]);
    assert_eq!(store.list_databases().await.unwrap(), ["postgres"]);

    // A record nobody claimed (written by other tooling) is never pruned either.
    store
        .register_cell(&CellSpec::new("zone-legacy", vec![etcd.client_addr()]))
        .await
        .unwrap();
    let done = register(&store, TEAM_A, &topology(&["zone-a"], &["postgres"], &etcd))
        .await
        .unwrap();
    assert!(done.pruned.is_empty(), "{done:?}");
    assert_eq!(store.list_cells().await.unwrap(), ["zone-a", "zone-legacy"]);
}

#[tokio::test]
async fn pruning_removes_stale_records_but_keeps_a_cell_a_database_still_names() {
    let etcd = etcd().await;
    let store = store(&etcd).await;
    let mut raw = raw(&etcd).await;
    register(
        &store,
        TEAM_A,
        &topology(&["zone-a", "zone-b", "zone-c"], &["postgres"], &etcd),
    )
    .await
    .unwrap();
    // A Database record of someone else's still lists zone-c.
    store
        .register_database(&database("analytics", &["zone-c"]))
        .await
        .unwrap();

    let done = register(&store, TEAM_A, &topology(&["zone-a"], &["postgres"], &etcd))
        .await
        .unwrap();
    assert_eq!(
        done.records[1],
        (RecordRef::database("postgres"), Registration::Updated),
        "the Database record first drops the stale cells"
    );
    assert_eq!(done.pruned, [RecordRef::cell("zone-b")]);
    assert_eq!(done.kept.len(), 1);
    assert_eq!(done.kept[0].0, RecordRef::cell("zone-c"));
    assert!(done.kept[0].1.contains("analytics"), "{}", done.kept[0].1);
    assert_eq!(store.list_cells().await.unwrap(), ["zone-a", "zone-c"]);
    assert_eq!(
        keys(&mut raw, "/multigres/global/operator-owners/cells/").await,
        [
            "/multigres/global/operator-owners/cells/zone-a",
            "/multigres/global/operator-owners/cells/zone-c",
        ],
        "the pruned cell's marker went with it; the kept one's stays"
    );

    // Once nothing names it, the next pass removes it.
    store.deregister_database("analytics").await.unwrap();
    let done = register(&store, TEAM_A, &topology(&["zone-a"], &["postgres"], &etcd))
        .await
        .unwrap();
    assert_eq!(done.pruned, [RecordRef::cell("zone-c")]);

    // With pruning off nothing is removed.
    let mut no_pruning = topology(&[], &[], &etcd);
    no_pruning.pruning = false;
    let done = register(&store, TEAM_A, &no_pruning).await.unwrap();
    assert!(done.pruned.is_empty());
    assert_eq!(store.list_cells().await.unwrap(), ["zone-a"]);
}

#[tokio::test]
async fn deregistering_with_the_server_removes_exactly_the_clusters_records() {
    let etcd = etcd().await;
    let store = store(&etcd).await;
    let mut raw = raw(&etcd).await;
    register(
        &store,
        TEAM_A,
        &topology(&["zone-a", "zone-b"], &["postgres"], &etcd),
    )
    .await
    .unwrap();
    register(&store, TEAM_B, &topology(&["zone-x"], &[], &etcd))
        .await
        .unwrap();
    // Multigres' own keys below the database are not the operator's to remove.
    raw.put(
        "/multigres/global/databases/postgres/default/0-inf/ShardInitClaim",
        vec![0x0a, 0],
        None,
    )
    .await
    .unwrap();

    let removed = sync::deregister(&store, TEAM_A).await.unwrap();
    assert_eq!(
        removed,
        [
            RecordRef::database("postgres"),
            RecordRef::cell("zone-a"),
            RecordRef::cell("zone-b")
        ],
        "databases before the cells they name"
    );
    assert_eq!(
        keys(&mut raw, ROOT).await,
        [
            "/multigres/global/cells/zone-x/Cell",
            "/multigres/global/databases/postgres/default/0-inf/ShardInitClaim",
            "/multigres/global/operator-owners/cells/zone-x",
        ]
    );
    assert!(
        sync::deregister(&store, TEAM_A).await.unwrap().is_empty(),
        "a second pass finds nothing"
    );
}

#[tokio::test]
async fn deregistering_without_the_server_fails_fast_then_gives_up_by_the_timeout() {
    let mut etcd = etcd().await;
    let store = store(&etcd).await;
    register(&store, TEAM_A, &topology(&["zone-a"], &["postgres"], &etcd))
        .await
        .unwrap();

    etcd.stop();
    let started = Instant::now();
    let err = sync::deregister(&store, TEAM_A).await.unwrap_err();
    assert!(err.is_transient(), "{err}");
    assert!(started.elapsed() < Duration::from_secs(4), "{err}");

    // The finalizer's rule: retried while young, released once deletion is older than the
    // timeout (the server never came back).
    let timeout = Duration::from_secs(120);
    let now = Timestamp::now();
    let young = now - Duration::from_secs(10);
    let old = now - Duration::from_secs(121);
    assert_eq!(
        deletion::after_failure(&ServerState::Present, Some(young), now, timeout),
        Verdict::Retry
    );
    assert!(matches!(
        deletion::after_failure(&ServerState::Present, Some(old), now, timeout),
        Verdict::GiveUp { .. }
    ));

    // Had it come back in time, the records would still be there to remove.
    etcd.restart().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let removed = loop {
        match sync::deregister(&store, TEAM_A).await {
            Ok(removed) => break removed,
            Err(e) if e.is_transient() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("no recovery after restart: {e}"),
        }
    };
    assert_eq!(
        removed,
        [RecordRef::database("postgres"), RecordRef::cell("zone-a")]
    );
}

#[tokio::test]
async fn concurrent_claims_have_one_winner() {
    let etcd = etcd().await;
    let store = std::sync::Arc::new(store(&etcd).await);
    let record = RecordRef::cell("zone-a");
    let mut tasks = Vec::new();
    for i in 0..8 {
        let store = store.clone();
        let record = record.clone();
        tasks.push(tokio::spawn(async move {
            store.claim(&record, &format!("ns/cluster-{i}")).await
        }));
    }
    let mut winners = 0;
    let mut refused = 0;
    for task in tasks {
        match task.await.unwrap() {
            Ok(true) => winners += 1,
            Err(TopoError::OwnedByOther { .. }) => refused += 1,
            other => panic!("unexpected claim outcome: {other:?}"),
        }
    }
    assert_eq!((winners, refused), (1, 7));
    let holder = store.owners().await.unwrap().remove(&record).unwrap();
    assert!(
        !store.claim(&record, &holder).await.unwrap(),
        "the holder's claim is a no-op"
    );
    let err = store.release(&record, "ns/someone-else").await.unwrap_err();
    assert!(matches!(err, TopoError::OwnedByOther { .. }), "{err}");
    assert!(
        !store
            .release(&RecordRef::cell("zone-z"), &holder)
            .await
            .unwrap(),
        "no marker: nothing of ours to release"
    );
}
