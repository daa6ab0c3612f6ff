//! Trace export against a real OTLP/gRPC receiver on loopback (the collector's TraceService,
//! served by tonic from the opentelemetry-proto definitions): spans arrive with the handler's
//! resource attributes, and the log line written inside a span names that span's trace.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use multigres_common::cli::LogFormat;
use multigres_common::telemetry::{self, ServiceInfo};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};
use tracing_subscriber::EnvFilter;

/// Forwards every export request to the test.
struct Receiver(mpsc::UnboundedSender<ExportTraceServiceRequest>);

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        let _ = self.0.send(request.into_inner());
        Ok(Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_reach_an_otlp_receiver_and_logs_name_their_trace() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (sent, mut received) = mpsc::unbounded_channel();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(Receiver(sent)))
            .serve_with_incoming(TcpIncoming::from(listener)),
    );

    let provider = telemetry::otlp_tracer_provider(
        ServiceInfo {
            name: "test-handler",
            version: "1.2.3",
        },
        Some(&format!("http://{addr}")),
    )
    .unwrap();
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = telemetry::subscriber(
        LogFormat::Json,
        EnvFilter::new("info"),
        Some(&provider),
        move || writer.clone(),
        false,
    );
    tracing::subscriber::with_default(subscriber, || {
        let span = tracing::info_span!("reconcile", object = "db/main");
        let _entered = span.enter();
        tracing::info!("applied the StatefulSet");
    });
    let flushing = provider.clone();
    tokio::task::spawn_blocking(move || flushing.force_flush())
        .await
        .unwrap()
        .unwrap();

    let request = tokio::time::timeout(Duration::from_secs(10), received.recv())
        .await
        .expect("an export within 10 s")
        .expect("the receiver is running");
    let resource_spans = &request.resource_spans[0];
    let attributes: Vec<(String, String)> = resource_spans
        .resource
        .as_ref()
        .expect("a resource")
        .attributes
        .iter()
        .filter_map(|kv| match kv.value.as_ref()?.value.as_ref()? {
            Value::StringValue(s) => Some((kv.key.clone(), s.clone())),
            _ => None,
        })
        .collect();
    for expected in [
        ("service.name", "test-handler"),
        ("service.namespace", "multigres-operator"),
        ("service.version", "1.2.3"),
    ] {
        assert!(
            attributes
                .iter()
                .any(|(k, v)| (k.as_str(), v.as_str()) == expected),
            "{expected:?} not in {attributes:?}"
        );
    }
    let span = &resource_spans.scope_spans[0].spans[0];
    assert_eq!(span.name, "reconcile");

    let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let line: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(line["message"], "applied the StatefulSet");
    assert_eq!(line["trace_id"], hex(&span.trace_id).as_str(), "{text}");
    assert_eq!(line["span_id"], hex(&span.span_id).as_str(), "{text}");

    tokio::task::spawn_blocking(move || provider.shutdown())
        .await
        .unwrap()
        .unwrap();
    server.abort();
}
