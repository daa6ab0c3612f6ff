//! Admission latency of the real webhook server over HTTPS on loopback, at a steady request
//! rate: p50/p90/p99/max per webhook. Requests are sent open-loop on a schedule (the next one
//! never waits for the previous answer) over a small pool of keep-alive connections, as the API
//! server sends them; latency counts from the moment a request is due to go out, including any
//! wait for a free connection, so a slow answer holding up later ones is not hidden. The template and cluster
//! lookups go to a real local API server (`LocalCluster`), through the webhook's template cache
//! (a name it lacks is read with a GET); the certificate is the webhook's own, self-managed in a
//! Secret there.
//!
//! `cargo bench -p webhook-server --bench admission`. Bounded: a fixed number of requests per
//! scenario at a fixed rate (about 25 s in all, plus control-plane start-up).

#[path = "../tests/support/mod.rs"]
mod support;

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use multigres_common::pki::webhook::{Lifetimes, Sans};
use multigres_common::state::HandlerState;
use tokio::sync::{Mutex, Semaphore};
use webhook_server::server::{RunningWebhook, WebhookOptions};
use webhook_server::tls::manager::{CertificateSource, ManagedCertificates};

/// Requests per second of each steady scenario.
const RATE: u32 = 200;
/// Measured requests per scenario.
const REQUESTS: u32 = 1000;
/// Unmeasured requests before each scenario (connections, caches, allocator).
const WARM_UP: u32 = 50;
/// Keep-alive connections in the pool.
const CONNECTIONS: usize = 8;
/// New-connection requests of the handshake scenario.
const HANDSHAKES: u32 = 200;
/// Longest a scenario may take before the benchmark gives up.
const SCENARIO_LIMIT: Duration = Duration::from_secs(60);

struct Scenario {
    name: &'static str,
    path: &'static str,
    body: Arc<String>,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn millis(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

fn report(name: &str, mut latencies: Vec<Duration>, elapsed: Duration) {
    latencies.sort();
    println!(
        "  {name:<44} p50 {:>9}  p90 {:>9}  p99 {:>9}  max {:>9}  ({} requests, {:.0} req/s achieved)",
        millis(percentile(&latencies, 0.50)),
        millis(percentile(&latencies, 0.90)),
        millis(percentile(&latencies, 0.99)),
        millis(*latencies.last().unwrap()),
        latencies.len(),
        latencies.len() as f64 / elapsed.as_secs_f64(),
    );
}

async fn connect(address: SocketAddr, ca: &str) -> support::HttpsConnection {
    support::HttpsConnection::connect(address, ca, "127.0.0.1")
        .await
        .expect("connecting to the webhook")
}

/// Sends `count` requests at `RATE` per second over the pool; returns each latency, measured
/// from when the request was due (the timer's wake-up, which can trail the schedule by up to a
/// millisecond of timer granularity that is the client's, not the server's).
async fn steady(
    pool: &Arc<Mutex<Vec<support::HttpsConnection>>>,
    scenario: &Scenario,
    count: u32,
) -> (Vec<Duration>, Duration) {
    let permits = Arc::new(Semaphore::new(CONNECTIONS));
    let interval = Duration::from_secs(1) / RATE;
    let began = Instant::now();
    let start = tokio::time::Instant::now() + Duration::from_millis(10);
    let mut tasks = Vec::with_capacity(count as usize);
    for i in 0..count {
        let scheduled = start + interval * i;
        tokio::time::sleep_until(scheduled).await;
        let (pool, permits, body, path) = (
            pool.clone(),
            permits.clone(),
            scenario.body.clone(),
            scenario.path,
        );
        let due = Instant::now();
        tasks.push(tokio::spawn(async move {
            let _permit = permits.acquire().await.unwrap();
            let mut connection = pool.lock().await.pop().expect("a pooled connection");
            let (status, response) = connection.post(path, body.as_bytes()).await.unwrap();
            pool.lock().await.push(connection);
            assert_eq!(status, 200, "{}", String::from_utf8_lossy(&response));
            let review: serde_json::Value = serde_json::from_slice(&response).unwrap();
            assert!(review["response"]["uid"].is_string(), "{review}");
            due.elapsed()
        }));
    }
    let mut latencies = Vec::with_capacity(count as usize);
    for task in tasks {
        latencies.push(task.await.unwrap());
    }
    (latencies, began.elapsed())
}

#[tokio::main]
async fn main() {
    let cluster = support::control_plane().await;
    let ns = support::namespace(cluster, "bench").await;
    let state = HandlerState::new("webhook-server", "bench").await;
    let webhook = RunningWebhook::start(
        WebhookOptions {
            bind_address: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            certificates: CertificateSource::Managed(ManagedCertificates {
                namespace: ns.clone(),
                secret_name: "webhook-certs".to_owned(),
                sans: Sans::for_service("hooks", &ns, &["127.0.0.1".to_owned()]),
                lifetimes: Lifetimes::default(),
                check_interval: Duration::from_secs(60),
                mutating_configurations: Vec::new(),
                validating_configurations: Vec::new(),
            }),
            operators: support::operators(),
        },
        cluster.client().unwrap(),
        state.clone(),
    )
    .await
    .expect("starting the webhook");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !state.is_serving() {
        assert!(
            Instant::now() < deadline,
            "the webhook never loaded a certificate"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> =
        kube::Api::namespaced(cluster.client().unwrap(), &ns);
    let secret = secrets.get("webhook-certs").await.unwrap();
    let ca = String::from_utf8(secret.data.unwrap()["ca.crt"].0.clone()).unwrap();
    let address = webhook.local_addr();
    // A namespace where every kind has its `default` template, so the cluster's lookups all hit
    // the webhook's template cache, against `ns` where all three miss and are read with GETs.
    let templated = support::namespace(cluster, "bench-templated").await;
    for kind in ["CoreTemplate", "CellTemplate", "ShardTemplate"] {
        let template = serde_json::json!({
            "apiVersion": "multigres.com/v1alpha1", "kind": kind,
            "metadata": {"name": "default", "namespace": templated}, "spec": {},
        });
        let object: kube::core::DynamicObject = serde_json::from_value(template).unwrap();
        let resource = kube::core::ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(
            "multigres.com",
            "v1alpha1",
            kind,
        ));
        kube::Api::<kube::core::DynamicObject>::namespaced_with(
            cluster.client().unwrap(),
            &templated,
            &resource,
        )
        .create(&Default::default(), &object)
        .await
        .unwrap();
    }

    let scenarios = [
        Scenario {
            name: "validate Cell (no lookups)",
            path: "/validate-multigres-com-v1alpha1-cell",
            body: Arc::new(support::fixture("cell-update-by-operator", &ns)),
        },
        Scenario {
            name: "validate MultigresCluster (3 template GETs)",
            path: "/validate-multigres-com-v1alpha1-multigrescluster",
            body: Arc::new(support::fixture("cluster-update-grown", &ns)),
        },
        Scenario {
            name: "validate MultigresCluster (3 cached templates)",
            path: "/validate-multigres-com-v1alpha1-multigrescluster",
            body: Arc::new(support::fixture("cluster-update-grown", &templated)),
        },
        Scenario {
            name: "mutate MultigresCluster (3 template GETs)",
            path: "/mutate-multigres-com-v1alpha1-multigrescluster",
            body: Arc::new(support::fixture("cluster-mutate-defaults", &ns)),
        },
    ];

    println!(
        "webhook-server admission latency, HTTPS on {address}, {CONNECTIONS} keep-alive \
         connections, {RATE} req/s open-loop, {REQUESTS} requests per webhook after {WARM_UP} \
         warm-up:"
    );
    let mut pool = Vec::with_capacity(CONNECTIONS);
    for _ in 0..CONNECTIONS {
        pool.push(connect(address, &ca).await);
    }
    let pool = Arc::new(Mutex::new(pool));
    for scenario in &scenarios {
        let run = async {
            steady(&pool, scenario, WARM_UP).await;
            steady(&pool, scenario, REQUESTS).await
        };
        let (latencies, elapsed) = tokio::time::timeout(SCENARIO_LIMIT, run)
            .await
            .unwrap_or_else(|_| panic!("{} took longer than {SCENARIO_LIMIT:?}", scenario.name));
        report(scenario.name, latencies, elapsed);
    }

    // What a request costs when the API server opens a new connection for it.
    let body = &scenarios[0].body;
    let began = Instant::now();
    let mut latencies = Vec::with_capacity(HANDSHAKES as usize);
    for _ in 0..HANDSHAKES {
        let sent = Instant::now();
        let mut connection = connect(address, &ca).await;
        let (status, _) = connection
            .post(scenarios[0].path, body.as_bytes())
            .await
            .unwrap();
        assert_eq!(status, 200);
        latencies.push(sent.elapsed());
    }
    report(
        "validate Cell on a new TLS connection each",
        latencies,
        began.elapsed(),
    );
    webhook.stop().await.unwrap();
}
