//! The four handler binaries as real processes against a real kube-apiserver: each serves
//! grpc.health.v1, HandlerInfo and /metrics, exits 0 on SIGTERM, refuses to start without a
//! usable kubeconfig; two controller replicas elect one leader through a Lease, the standby
//! takes over when the leader is killed, and a replica stopping with SIGTERM releases the Lease.
//! Their Kubernetes client speaks HTTP/2 to the API server, one connection for every request.
//!
//! The binaries are built on first use (`cargo build` of the four packages, same profile and
//! target directory as this test), so the test never runs stale executables.

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use multigres_e2e::cluster::LocalCluster;
use multigres_e2e::harness::{HANDLERS, HandlerProcess};
use multigres_proto::operator::v1::handler_info_client::HandlerInfoClient;
use multigres_proto::operator::v1::{GetInfoRequest, GetInfoResponse, LeaderState};
use tokio::net::TcpStream;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// Generous bound for anything that normally takes well under a second.
const WAIT: Duration = Duration::from_secs(30);

async fn cluster() -> &'static LocalCluster {
    multigres_e2e::harness::control_plane().await
}

/// Starts `name` against `kubeconfig` with `extra` flags (the webhook on a free port too).
async fn start(name: &str, kubeconfig: &Path, extra: &[String]) -> HandlerProcess {
    let mut args = extra.to_vec();
    if name == "webhook-server" {
        args.push("--webhook-bind-address=127.0.0.1:0".to_owned());
    }
    HandlerProcess::spawn(name, kubeconfig, &args).await
}

/// What this test asks of a running handler over gRPC, besides the harness's process control.
trait Probed {
    async fn channel(&self) -> Channel;
    async fn health(&self) -> ServingStatus;
    async fn info(&self) -> GetInfoResponse;
    async fn wait_info(
        &self,
        what: &str,
        done: impl Fn(&GetInfoResponse) -> bool,
    ) -> GetInfoResponse;
    async fn terminate(&self);
}

impl Probed for HandlerProcess {
    async fn channel(&self) -> Channel {
        Channel::from_shared(format!("http://{}", self.grpc_addr()))
            .expect("endpoint")
            .connect()
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "{} gRPC at {}: {e}\n{}",
                    self.name(),
                    self.grpc_addr(),
                    self.log()
                )
            })
    }

    async fn health(&self) -> ServingStatus {
        HealthClient::new(self.channel().await)
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .unwrap_or_else(|e| panic!("{} health: {e}", self.name()))
            .into_inner()
            .status()
    }

    async fn info(&self) -> GetInfoResponse {
        HandlerInfoClient::new(self.channel().await)
            .get_info(GetInfoRequest {})
            .await
            .unwrap_or_else(|e| panic!("{} HandlerInfo: {e}", self.name()))
            .into_inner()
    }

    /// Polls HandlerInfo until `done` holds.
    async fn wait_info(
        &self,
        what: &str,
        done: impl Fn(&GetInfoResponse) -> bool,
    ) -> GetInfoResponse {
        let deadline = Instant::now() + WAIT;
        loop {
            let info = self.info().await;
            if done(&info) {
                return info;
            }
            assert!(
                Instant::now() < deadline,
                "{}: {what} not reached; last HandlerInfo {info:?}\n{}",
                self.name(),
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// SIGTERM, then expects a clean exit with code 0.
    async fn terminate(&self) {
        self.signal(libc::SIGTERM);
        let code = self.wait_exit().await;
        assert_eq!(
            code,
            Some(0),
            "{} exit after SIGTERM:\n{}",
            self.name(),
            self.log()
        );
    }
}

#[tokio::test]
async fn every_handler_serves_health_info_and_metrics_and_stops_on_sigterm() {
    let cluster = cluster().await;
    let mut handlers = Vec::new();
    for name in HANDLERS {
        handlers.push(start(name, cluster.kubeconfig(), &[]).await);
    }
    for handler in &handlers {
        let is_webhook = handler.name() == "webhook-server";
        // Controllers serve once their caches sync, the webhook once its certificate is loaded.
        let info = handler
            .wait_info("readiness settled", |info| info.serving)
            .await;
        assert_eq!(info.name, handler.name());
        assert_eq!(info.version, env!("CARGO_PKG_VERSION"));
        assert_eq!(info.leader_state(), LeaderState::NotElected);
        assert!(
            info.lease.is_empty() && info.identity.is_empty(),
            "{info:?}"
        );

        assert_eq!(
            handler.health().await,
            ServingStatus::Serving,
            "{}",
            handler.name()
        );

        let metrics = handler.metrics().await;
        let gauge = format!(
            "multigres_operator_leader{{handler=\"{}\"}} 1",
            handler.name()
        );
        assert!(
            metrics.contains(&gauge),
            "{}: no {gauge} in\n{metrics}",
            handler.name()
        );

        let log = handler.log();
        assert!(
            log.contains("connected to the Kubernetes API server"),
            "{log}"
        );
        if is_webhook {
            assert!(
                log.contains("serving the webhook certificate from the Secret"),
                "{log}"
            );
        }
    }
    for handler in &handlers {
        handler.terminate().await;
        let log = handler.log();
        assert!(log.contains("\"message\":\"stopped\""), "{log}");
        assert!(
            TcpStream::connect(handler.grpc_addr()).await.is_err(),
            "{} still listens after exit",
            handler.name()
        );
    }
}

#[tokio::test]
async fn a_handler_without_a_usable_kubeconfig_exits_with_a_clear_error() {
    let handler = start(
        "resource-handler",
        Path::new("/nonexistent/kubeconfig"),
        &[],
    )
    .await;
    assert_eq!(handler.wait_exit().await, Some(1));
    let log = handler.log();
    assert!(
        log.contains("kubeconfig /nonexistent/kubeconfig is not usable"),
        "{log}"
    );
}

/// Leader election with a 4 s Lease, so a killed leader is replaced within seconds.
fn lease_flags(namespace: &str) -> Vec<String> {
    vec![
        "--leader-elect".to_owned(),
        format!("--leader-election-namespace={namespace}"),
        "--leader-election-lease-duration=4s".to_owned(),
        "--leader-election-renew-deadline=3s".to_owned(),
        "--leader-election-retry-period=500ms".to_owned(),
    ]
}

async fn lease_holder(leases: &Api<Lease>) -> (Option<String>, i32) {
    let lease = leases
        .get("multigres-operator-cluster-handler")
        .await
        .expect("reading the Lease");
    let spec = lease.spec.unwrap_or_default();
    (
        spec.holder_identity.filter(|h| !h.is_empty()),
        spec.lease_transitions.unwrap_or(0),
    )
}

#[tokio::test]
async fn two_replicas_elect_one_leader_and_fail_over() {
    let cluster = cluster().await;
    let namespace = "handlers-leader-election";
    cluster
        .create_namespace(namespace)
        .await
        .unwrap_or_else(|e| panic!("creating namespace: {e}"));
    let leases: Api<Lease> = Api::namespaced(cluster.client().expect("client"), namespace);
    let kubeconfig = cluster.kubeconfig();

    let flags = lease_flags(namespace);
    let first = start("cluster-handler", kubeconfig, &flags).await;
    let second = start("cluster-handler", kubeconfig, &flags).await;
    let deadline = Instant::now() + WAIT;
    let (leader, standby) = loop {
        let (a, b) = (first.info().await, second.info().await);
        match (a.leader_state(), b.leader_state()) {
            (LeaderState::Leader, LeaderState::Leader) => panic!("two leaders: {a:?} {b:?}"),
            (LeaderState::Leader, _) => break (first, second),
            (_, LeaderState::Leader) => break (second, first),
            _ => assert!(Instant::now() < deadline, "no leader elected: {a:?} {b:?}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let leader_info = leader
        .wait_info("leadership and synced caches", |i| {
            i.leader_state() == LeaderState::Leader && i.serving
        })
        .await;
    let standby_info = standby
        .wait_info("standby seeing the leader", |i| {
            i.leader_state() == LeaderState::Standby && !i.lease_holder.is_empty()
        })
        .await;
    assert_eq!(
        leader_info.lease,
        format!("{namespace}/multigres-operator-cluster-handler")
    );
    assert_ne!(leader_info.identity, standby_info.identity);
    assert_eq!(standby_info.lease_holder, leader_info.identity);
    assert_eq!(
        lease_holder(&leases).await.0.as_deref(),
        Some(leader_info.identity.as_str())
    );
    assert_eq!(leader.health().await, ServingStatus::Serving);
    assert_eq!(standby.health().await, ServingStatus::Serving);
    assert!(
        leader
            .metrics()
            .await
            .contains(r#"multigres_operator_leader{handler="cluster-handler"} 1"#)
    );
    assert!(
        standby
            .metrics()
            .await
            .contains(r#"multigres_operator_leader{handler="cluster-handler"} 0"#)
    );

    // Kill the leader without letting it release: the standby takes over once the Lease expires.
    leader.signal(libc::SIGKILL);
    assert_eq!(
        leader.wait_exit().await,
        None,
        "SIGKILL leaves no exit code"
    );
    let (_, transitions_before) = lease_holder(&leases).await;
    let new_leader = standby
        .wait_info("takeover after the leader died", |i| {
            i.leader_state() == LeaderState::Leader
        })
        .await;
    let (holder, transitions) = lease_holder(&leases).await;
    assert_eq!(holder.as_deref(), Some(new_leader.identity.as_str()));
    assert_eq!(transitions, transitions_before + 1);

    // A replica stopped with SIGTERM releases the Lease on its way out: right after it exits the
    // Lease no longer names it, although it was renewed less than a second before.
    let third = start("cluster-handler", kubeconfig, &flags).await;
    third
        .wait_info("standby behind the new leader", |i| {
            i.leader_state() == LeaderState::Standby && i.lease_holder == new_leader.identity
        })
        .await;
    standby.terminate().await;
    let (holder, _) = lease_holder(&leases).await;
    assert_ne!(
        holder.as_deref(),
        Some(new_leader.identity.as_str()),
        "Lease not released"
    );
    let third_info = third
        .wait_info("takeover after a release", |i| {
            i.leader_state() == LeaderState::Leader
        })
        .await;
    assert_eq!(
        lease_holder(&leases).await.0.as_deref(),
        Some(third_info.identity.as_str())
    );

    third.terminate().await;
    assert_eq!(
        lease_holder(&leases).await.0,
        None,
        "Lease not released by the last replica"
    );
}

#[tokio::test]
async fn a_leader_whose_lease_is_taken_stops_and_exits_with_an_error() {
    let cluster = cluster().await;
    let namespace = "handlers-lease-loss";
    cluster
        .create_namespace(namespace)
        .await
        .unwrap_or_else(|e| panic!("creating namespace: {e}"));
    let leases: Api<Lease> = Api::namespaced(cluster.client().expect("client"), namespace);
    let leader = start(
        "data-handler",
        cluster.kubeconfig(),
        &lease_flags(namespace),
    )
    .await;
    leader
        .wait_info("leadership", |i| i.leader_state() == LeaderState::Leader)
        .await;

    // Another party takes the Lease over (as a replica that believed it expired would).
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
        k8s_openapi::jiff::Timestamp::now(),
    );
    let takeover = serde_json::json!({
        "spec": {"holderIdentity": "intruder", "renewTime": now, "leaseDurationSeconds": 60}
    });
    leases
        .patch(
            "multigres-operator-data-handler",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&takeover),
        )
        .await
        .expect("taking the Lease over");

    assert_eq!(leader.wait_exit().await, Some(1), "{}", leader.log());
    let log = leader.log();
    assert!(log.contains("lost leadership"), "{log}");
    assert!(log.contains("intruder"), "{log}");
    let spec = leases
        .get("multigres-operator-data-handler")
        .await
        .expect("reading the Lease")
        .spec
        .unwrap_or_default();
    assert_eq!(spec.holder_identity.as_deref(), Some("intruder"));
}

#[tokio::test]
async fn the_handlers_client_speaks_http2_to_the_api_server() {
    let cluster = cluster().await;
    let config = multigres_common::client::load_config(Some(cluster.kubeconfig()))
        .await
        .unwrap();
    let client = multigres_common::client::counting_client(config).unwrap();
    for path in ["/version", "/api/v1/namespaces/default"] {
        let request = http::Request::get(path)
            .body(kube::client::Body::empty())
            .unwrap();
        let response = client.send(request).await.unwrap();
        assert_eq!(response.status(), http::StatusCode::OK, "{path}");
        assert_eq!(response.version(), http::Version::HTTP_2, "{path}");
    }
}
