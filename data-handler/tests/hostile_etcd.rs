//! The topology store against an endpoint that answers, but not as etcd does.
//!
//! A cluster's `spec.globalTopoServer.external.endpoints` may name any address, so a tenant can
//! point the shared data-handler at a server of its own. Each test here serves the etcd KV
//! service with canned broken answers (a transaction that succeeded with no results, results of
//! no kind or of the wrong kind, garbage keys and values, extreme revisions) and checks that
//! every call returns an error or a value: the release build aborts on a panic, which would
//! stop the data-handler for every tenant.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use data_handler::topo::{CellSpec, CellTls, RecordRef, TopoConfig, TopoError, TopoStore};
use etcd_client::proto::{
    PbCompactionRequest, PbCompactionResponse, PbDeleteRequest, PbDeleteResponse, PbKeyValue,
    PbKvServer, PbKvService, PbPutRequest, PbPutResponse, PbRangeRequest, PbRangeResponse,
    PbRangeStreamResponse, PbResponseHeader, PbResponseOp, PbTxnOpResponse, PbTxnRequest,
    PbTxnResponse,
};
use multigres_proto::topo::Cell;
use prost::Message;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

/// What the hostile server answers to every Range and every Txn.
#[derive(Clone, Default)]
struct Answers {
    range: PbRangeResponse,
    txn: PbTxnResponse,
}

struct Hostile(Arc<Answers>);

#[tonic::async_trait]
impl PbKvService for Hostile {
    async fn range(&self, _: Request<PbRangeRequest>) -> Result<Response<PbRangeResponse>, Status> {
        Ok(Response::new(self.0.range.clone()))
    }

    type RangeStreamStream = futures::stream::Empty<Result<PbRangeStreamResponse, Status>>;

    /// Not used by the store (etcd 3.7's streamed range): refused, as an older etcd does.
    async fn range_stream(
        &self,
        _: Request<PbRangeRequest>,
    ) -> Result<Response<Self::RangeStreamStream>, Status> {
        Err(Status::unimplemented("RangeStream"))
    }

    async fn put(&self, _: Request<PbPutRequest>) -> Result<Response<PbPutResponse>, Status> {
        Ok(Response::new(PbPutResponse::default()))
    }

    async fn delete_range(
        &self,
        _: Request<PbDeleteRequest>,
    ) -> Result<Response<PbDeleteResponse>, Status> {
        Ok(Response::new(PbDeleteResponse::default()))
    }

    async fn txn(&self, _: Request<PbTxnRequest>) -> Result<Response<PbTxnResponse>, Status> {
        Ok(Response::new(self.0.txn.clone()))
    }

    async fn compact(
        &self,
        _: Request<PbCompactionRequest>,
    ) -> Result<Response<PbCompactionResponse>, Status> {
        Ok(Response::new(PbCompactionResponse::default()))
    }
}

/// A store whose global topology is a hostile server giving `answers`, and that server's
/// address.
async fn hostile(answers: Answers) -> (TopoStore, String) {
    let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address").to_string();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(PbKvServer::new(Hostile(Arc::new(answers))))
            .serve_with_incoming(TcpIncoming::from(listener)),
    );
    let mut config = TopoConfig::new(vec![address.clone()]);
    config.request_timeout = Duration::from_secs(5);
    let store = TopoStore::connect(config).await.expect("store");
    (store, address)
}

fn txn(succeeded: bool, results: Vec<Option<PbTxnOpResponse>>) -> PbTxnResponse {
    PbTxnResponse {
        succeeded,
        responses: results
            .into_iter()
            .map(|response| PbResponseOp { response })
            .collect(),
        ..Default::default()
    }
}

/// Asserts `result` is the transient `BadAnswer` naming the endpoint.
fn bad_answer<T: std::fmt::Debug>(what: &str, result: Result<T, TopoError>, address: &str) {
    match result {
        Err(error @ TopoError::BadAnswer { .. }) => {
            assert!(error.is_transient(), "{what}: {error}");
            let message = error.to_string();
            assert!(message.contains(address), "{what}: {message}");
        }
        other => panic!("{what}: expected BadAnswer, got {other:?}"),
    }
}

const OWNER: &str = "team-a/prod";

/// Every call of the store that makes a transaction, against the same server.
async fn every_transaction(store: &TopoStore, address: &str, cases: &[&str]) {
    for case in cases {
        let result = match *case {
            "claim" => store
                .claim(&RecordRef::cell("zone-a"), OWNER)
                .await
                .map(drop),
            "release cell" => store
                .release(&RecordRef::cell("zone-a"), OWNER)
                .await
                .map(drop),
            "release database" => store
                .release(&RecordRef::database("postgres"), OWNER)
                .await
                .map(drop),
            "deregister cell" => store.deregister_cell("zone-a").await.map(drop),
            "register cell" => store
                .register_cell(&CellSpec::new("zone-a", vec![address.to_owned()]))
                .await
                .map(drop),
            other => unreachable!("{other}"),
        };
        bad_answer(case, result, address);
    }
}

#[tokio::test]
async fn a_transaction_that_succeeded_with_no_results_is_an_error_not_a_panic() {
    let (store, address) = hostile(Answers {
        txn: txn(true, Vec::new()),
        ..Default::default()
    })
    .await;
    every_transaction(
        &store,
        &address,
        &[
            "claim",
            "release cell",
            "release database",
            "deregister cell",
            "register cell",
        ],
    )
    .await;
}

#[tokio::test]
async fn a_result_of_no_kind_is_an_error_not_a_panic() {
    for succeeded in [true, false] {
        let (store, address) = hostile(Answers {
            txn: txn(succeeded, vec![None, None]),
            ..Default::default()
        })
        .await;
        // The failure branch of deregister_cell and register_cell reads nothing: a conflict.
        let cases: &[&str] = if succeeded {
            &[
                "claim",
                "release cell",
                "release database",
                "deregister cell",
                "register cell",
            ]
        } else {
            &["claim", "release cell", "release database"]
        };
        every_transaction(&store, &address, cases).await;
    }
}

#[tokio::test]
async fn a_result_of_the_wrong_kind_or_count_is_an_error() {
    let put = || Some(PbTxnOpResponse::ResponsePut(PbPutResponse::default()));
    let (store, address) = hostile(Answers {
        txn: txn(false, vec![put()]),
        ..Default::default()
    })
    .await;
    every_transaction(&store, &address, &["claim", "release cell"]).await;
    let deleted = || {
        Some(PbTxnOpResponse::ResponseDeleteRange(PbDeleteResponse {
            deleted: 1,
            ..Default::default()
        }))
    };
    let (store, address) = hostile(Answers {
        txn: txn(true, vec![deleted()]),
        ..Default::default()
    })
    .await;
    // A release deletes the record and its marker: one result is one too few.
    every_transaction(&store, &address, &["release database", "claim"]).await;
    let (store, address) = hostile(Answers {
        txn: txn(true, vec![deleted(), deleted(), deleted()]),
        ..Default::default()
    })
    .await;
    every_transaction(&store, &address, &["deregister cell", "release database"]).await;
}

#[tokio::test]
async fn garbage_keys_values_and_revisions_are_errors_or_skipped_not_panics() {
    let probe = TopoStore::connect(TopoConfig::new(vec!["127.0.0.1:1".into()]))
        .await
        .expect("store");
    let paths = probe.paths();
    let unusable_cell = Cell {
        name: "zone-a".into(),
        server_addresses: vec!["\u{7f} not a uri".into(), String::new()],
        root: String::new(),
    };
    let entry = |key: Vec<u8>, value: Vec<u8>| PbKeyValue {
        key,
        value,
        create_revision: i64::MAX,
        mod_revision: i64::MIN,
        version: -1,
        lease: i64::MAX,
    };
    let range = PbRangeResponse {
        header: Some(PbResponseHeader {
            revision: i64::MAX,
            ..Default::default()
        }),
        kvs: vec![
            entry(vec![0xff, 0xfe, b'/'], vec![0xff; 7]),
            entry(
                paths.database("postgres").into_bytes(),
                vec![0x0a, 0xff, 0xff],
            ),
            entry(
                paths.cell("zone-a").into_bytes(),
                unusable_cell.encode_to_vec(),
            ),
            entry(
                paths.owner(&RecordRef::cell("zone-a")).into_bytes(),
                vec![0xc3],
            ),
        ],
        more: true,
        count: -1,
    };
    let (store, _) = hostile(Answers {
        range,
        txn: txn(true, Vec::new()),
    })
    .await;

    // Every Range answers the same entries: the first, unreadable one is the record asked for.
    assert!(matches!(
        store.get_cell("zone-a").await,
        Err(TopoError::Malformed { .. })
    ));
    assert!(matches!(
        store.get_database("postgres").await,
        Err(TopoError::Malformed { .. })
    ));
    assert!(matches!(
        store.deregister_cell("zone-a").await,
        Err(TopoError::Malformed { .. })
    ));
    assert!(matches!(
        store
            .register_cell(&CellSpec::new("zone-a", vec!["etcd:2379".into()]))
            .await,
        Err(TopoError::Malformed { .. })
    ));
    assert_eq!(store.list_cells().await.expect("cells"), ["zone-a"]);
    assert_eq!(
        store.list_databases().await.expect("databases"),
        ["postgres"]
    );
    let owners = store.owners().await.expect("owners");
    assert_eq!(owners.len(), 1, "{owners:?}");
    assert!(
        store
            .list_poolers("zone-a", &CellTls::Global)
            .await
            .is_err()
    );
}

#[tokio::test]
async fn a_cell_record_naming_unusable_endpoints_is_an_error_not_a_panic() {
    for addresses in [
        vec!["\u{7f} not a uri".to_owned()],
        vec![String::new()],
        Vec::new(),
        vec!["http://[::1".to_owned()],
    ] {
        let cell = Cell {
            name: "zone-a".into(),
            server_addresses: addresses.clone(),
            root: "\u{0}".into(),
        };
        let probe = TopoStore::connect(TopoConfig::new(vec!["127.0.0.1:1".into()]))
            .await
            .expect("store");
        let range = PbRangeResponse {
            kvs: vec![PbKeyValue {
                key: probe.paths().cell("zone-a").into_bytes(),
                value: cell.encode_to_vec(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let (store, _) = hostile(Answers {
            range,
            ..Default::default()
        })
        .await;
        let poolers = store.list_poolers("zone-a", &CellTls::Global).await;
        assert!(poolers.is_err(), "{addresses:?}: {poolers:?}");
    }
}
