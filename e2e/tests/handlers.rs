//! The four handler binaries as real processes against a real kube-apiserver: each serves
//! grpc.health.v1, HandlerInfo and /metrics, exits 0 on SIGTERM, refuses to start without a
//! usable kubeconfig; two controller replicas elect one leader through a Lease, the standby
//! takes over when the leader is killed, and a replica stopping with SIGTERM releases the Lease.
//!
//! The binaries are built on first use (`cargo build` of the four packages, same profile and
//! target directory as this test), so the test never runs stale executables.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use multigres_e2e::cluster::LocalCluster;
use multigres_e2e::process::Supervised;
use multigres_proto::operator::v1::handler_info_client::HandlerInfoClient;
use multigres_proto::operator::v1::{GetInfoRequest, GetInfoResponse, LeaderState};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

const HANDLERS: [&str; 4] = [
    "cluster-handler",
    "resource-handler",
    "data-handler",
    "webhook-server",
];

/// Generous bound for anything that normally takes well under a second.
const WAIT: Duration = Duration::from_secs(30);

async fn cluster() -> &'static LocalCluster {
    LocalCluster::shared()
        .await
        .unwrap_or_else(|e| panic!("starting the local control plane: {e}"))
}

/// Builds the four binaries once per test process and returns the directory holding them.
fn bin_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        // This test runs as <target>/<profile>/deps/handlers-<hash>.
        let exe = std::env::current_exe().expect("test executable path");
        let profile_dir = exe
            .ancestors()
            .nth(2)
            .expect("profile directory above deps/")
            .to_path_buf();
        let target_dir = profile_dir.parent().expect("target directory");
        let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") | None => "dev".to_owned(),
            Some(other) => other.to_owned(),
        };
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
        let mut command = Command::new(cargo);
        command
            .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
            .args(["build", "--quiet", "--profile", &profile, "--target-dir"])
            .arg(target_dir);
        for handler in HANDLERS {
            command.args(["-p", handler]);
        }
        let status = command.status().expect("running cargo build");
        assert!(
            status.success(),
            "cargo build of the handlers failed: {status}"
        );
        profile_dir
    })
}

/// A handler process and where it listens.
struct Handler {
    name: &'static str,
    /// Declared before the log directory so the process stops before its log is removed.
    process: Supervised,
    _log_dir: tempfile::TempDir,
    grpc: SocketAddr,
    metrics: SocketAddr,
}

/// Reads the JSON log until the "servers listening" line and returns the bound addresses.
fn listening_addrs(log: &str) -> Option<(SocketAddr, SocketAddr)> {
    log.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find(|entry| entry["message"] == "servers listening")
        .map(|entry| {
            let addr = |field: &str| {
                entry[field]
                    .as_str()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or_else(|| panic!("bad {field} in {entry}"))
            };
            (addr("grpc_addr"), addr("metrics_addr"))
        })
}

impl Handler {
    /// Starts `name` on loopback ports chosen by the OS, with `extra` flags.
    async fn start(name: &'static str, kubeconfig: &Path, extra: &[String]) -> Handler {
        let log_dir = tempfile::Builder::new()
            .prefix(&format!("multigres-{name}-"))
            .tempdir()
            .expect("log temp dir");
        let log = log_dir.path().join(format!("{name}.log"));
        let mut args = vec![
            format!("--kubeconfig={}", kubeconfig.display()),
            "--grpc-bind-address=127.0.0.1:0".to_owned(),
            "--metrics-bind-address=127.0.0.1:0".to_owned(),
            "--log-format=json".to_owned(),
            "--log-level=info".to_owned(),
        ];
        if name == "webhook-server" {
            args.push("--webhook-bind-address=127.0.0.1:0".to_owned());
        }
        args.extend_from_slice(extra);
        let process = Supervised::spawn(name, &bin_dir().join(name), &args, &[], &log)
            .unwrap_or_else(|e| panic!("starting {name}: {e}"));
        let deadline = Instant::now() + WAIT;
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if let Some((grpc, metrics)) = listening_addrs(&text) {
                return Handler {
                    name,
                    process,
                    _log_dir: log_dir,
                    grpc,
                    metrics,
                };
            }
            if let Some(status) = process.exit_status() {
                panic!("{name} exited early ({status}):\n{text}");
            }
            assert!(Instant::now() < deadline, "{name} never listened:\n{text}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.process.log_path()).unwrap_or_default()
    }

    async fn channel(&self) -> Channel {
        Channel::from_shared(format!("http://{}", self.grpc))
            .expect("endpoint")
            .connect()
            .await
            .unwrap_or_else(|e| panic!("{} gRPC at {}: {e}\n{}", self.name, self.grpc, self.log()))
    }

    async fn health(&self) -> ServingStatus {
        HealthClient::new(self.channel().await)
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .unwrap_or_else(|e| panic!("{} health: {e}", self.name))
            .into_inner()
            .status()
    }

    async fn info(&self) -> GetInfoResponse {
        HandlerInfoClient::new(self.channel().await)
            .get_info(GetInfoRequest {})
            .await
            .unwrap_or_else(|e| panic!("{} HandlerInfo: {e}", self.name))
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
                self.name,
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn metrics(&self) -> String {
        let mut stream = TcpStream::connect(self.metrics)
            .await
            .expect("metrics connect");
        let request = format!(
            "GET /metrics HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            self.metrics
        );
        stream
            .write_all(request.as_bytes())
            .await
            .expect("metrics request");
        let mut response = String::new();
        stream
            .read_to_string(&mut response)
            .await
            .expect("metrics response");
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        response
    }

    fn signal(&self, signal: libc::c_int) {
        let pid = libc::pid_t::try_from(self.process.pid()).expect("pid fits pid_t");
        // SAFETY: kill(2) only sends a signal to our own child; no memory is involved.
        let rc = unsafe { libc::kill(pid, signal) };
        assert_eq!(rc, 0, "signalling {}", self.name);
    }

    /// Waits for the process to exit and returns its exit code (`None` if killed by a signal).
    async fn wait_exit(&self) -> Option<i32> {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = self.process.exit_status() {
                return status.code();
            }
            assert!(
                Instant::now() < deadline,
                "{} did not exit:\n{}",
                self.name,
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
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
            self.name,
            self.log()
        );
    }
}

#[tokio::test]
async fn every_handler_serves_health_info_and_metrics_and_stops_on_sigterm() {
    let cluster = cluster().await;
    let mut handlers = Vec::new();
    for name in HANDLERS {
        handlers.push(Handler::start(name, cluster.kubeconfig(), &[]).await);
    }
    for handler in &handlers {
        let is_webhook = handler.name == "webhook-server";
        // Controllers serve once their caches sync, the webhook once its certificate is loaded.
        let info = handler
            .wait_info("readiness settled", |info| info.serving)
            .await;
        assert_eq!(info.name, handler.name);
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
            handler.name
        );

        let metrics = handler.metrics().await;
        let gauge = format!(
            "multigres_operator_leader{{handler=\"{}\"}} 1",
            handler.name
        );
        assert!(
            metrics.contains(&gauge),
            "{}: no {gauge} in\n{metrics}",
            handler.name
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
            TcpStream::connect(handler.grpc).await.is_err(),
            "{} still listens after exit",
            handler.name
        );
    }
}

#[tokio::test]
async fn a_handler_without_a_usable_kubeconfig_exits_with_a_clear_error() {
    let handler = Handler::start(
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
    let first = Handler::start("cluster-handler", kubeconfig, &flags).await;
    let second = Handler::start("cluster-handler", kubeconfig, &flags).await;
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
        .wait_info("leadership", |i| i.leader_state() == LeaderState::Leader)
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
    let third = Handler::start("cluster-handler", kubeconfig, &flags).await;
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
    let leader = Handler::start(
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
