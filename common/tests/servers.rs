//! The gRPC and metrics servers, started in process on loopback and queried as Kubernetes
//! probes, tests and Prometheus would: grpc.health.v1, HandlerInfo, GET /metrics, then shutdown.

use std::net::SocketAddr;
use std::time::Duration;

use multigres_common::servers::Servers;
use multigres_common::state::{HandlerState, LeaderState};
use multigres_proto::operator::v1::GetInfoRequest;
use multigres_proto::operator::v1::handler_info_client::HandlerInfoClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

async fn http_get(addr: SocketAddr, path: &str) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    response
}

async fn overall_health(client: &mut HealthClient<tonic::transport::Channel>) -> ServingStatus {
    let response = client
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap();
    response.into_inner().status()
}

#[tokio::test]
async fn servers_report_health_info_and_metrics_then_stop() {
    let handle = multigres_common::metrics::install().unwrap();
    let state = HandlerState::new("test-handler", "9.9.9").await;
    let loopback: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let servers = Servers::start(loopback, Some((loopback, handle)), state.clone())
        .await
        .unwrap();
    let grpc_addr = servers.grpc_addr();
    let metrics_addr = servers.metrics_addr().unwrap();
    assert_ne!(grpc_addr.port(), 0);
    assert_ne!(metrics_addr.port(), 0);

    let endpoint = format!("http://{grpc_addr}");
    let channel = tonic::transport::Channel::from_shared(endpoint)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel.clone());
    assert_eq!(overall_health(&mut health).await, ServingStatus::NotServing);

    state.set_ready(true).await;
    assert_eq!(overall_health(&mut health).await, ServingStatus::Serving);

    state.mark_synced("Cell");
    state.record_reconcile("cell", Ok(()), Duration::from_millis(12));
    state.record_reconcile("cell", Err("kube_api"), Duration::from_millis(40));
    state.set_leader_state(LeaderState::Standby).await;
    state.set_lease_reachable(true).await;
    multigres_common::status_metrics::register(|gauges| {
        gauges.set_cluster("db", "main", "Healthy", 1, 1)
    });

    let mut info_client = HandlerInfoClient::new(channel);
    let info = info_client
        .get_info(GetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "test-handler");
    assert_eq!(info.version, "9.9.9");
    assert_eq!(info.leader_state(), LeaderState::Standby);
    assert_eq!(info.synced_kinds, ["Cell"]);
    assert_eq!(info.controllers.len(), 1);
    assert_eq!(
        (info.controllers[0].reconciles, info.controllers[0].errors),
        (2, 1)
    );
    assert!(info.serving);

    let response = http_get(metrics_addr, "/metrics").await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    for expected in [
        r#"multigres_operator_reconcile_total{controller="cell",result="success"} 1"#,
        r#"multigres_operator_reconcile_total{controller="cell",result="error"} 1"#,
        r#"multigres_operator_reconcile_errors_total{controller="cell",error="kube_api"} 1"#,
        r#"multigres_operator_reconcile_duration_seconds_bucket{controller="cell",le="0.025"} 1"#,
        r#"multigres_operator_leader{handler="test-handler"} 0"#,
        r#"multigres_operator_cluster_info{name="main",namespace="db",phase="Healthy"} 1"#,
    ] {
        assert!(
            response.contains(expected),
            "missing {expected} in:\n{response}"
        );
    }
    assert!(
        http_get(metrics_addr, "/nothing")
            .await
            .starts_with("HTTP/1.1 404")
    );

    state.stop().await;
    assert_eq!(overall_health(&mut health).await, ServingStatus::NotServing);

    tokio::time::timeout(Duration::from_secs(10), servers.stop())
        .await
        .expect("servers stop within 10 s")
        .unwrap();
    for addr in [grpc_addr, metrics_addr] {
        let refused = TcpStream::connect(addr).await;
        assert!(refused.is_err(), "{addr} still accepts connections");
    }
}

#[tokio::test]
async fn busy_port_is_reported() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let state = HandlerState::new("test-handler", "9.9.9").await;
    let error = Servers::start(addr, None, state).await.unwrap_err();
    let message = error.to_string();
    assert!(
        message.contains(&addr.to_string()) && message.contains("gRPC"),
        "{message}"
    );
}
