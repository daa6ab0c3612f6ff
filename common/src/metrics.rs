//! Prometheus metrics: the recorder, the `/metrics` HTTP endpoint, and the metrics every
//! controller reports.
//!
//! Names follow Prometheus conventions (`_total` counters, `_seconds` histograms) under the
//! `multigres_operator_` prefix the seed's dashboards and alerts use. Per-object gauges (cluster
//! phase, replica counts) live in [`crate::status_metrics`] and are served on the same endpoint.

use std::time::Duration;

use axum::Router;
use axum::routing::get;
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;

/// Reconciles per controller and result (`success` or `error`).
pub const RECONCILE_TOTAL: &str = "multigres_operator_reconcile_total";
/// Failed reconciles per controller and error category.
pub const RECONCILE_ERRORS_TOTAL: &str = "multigres_operator_reconcile_errors_total";
/// Reconcile latency per controller.
pub const RECONCILE_DURATION_SECONDS: &str = "multigres_operator_reconcile_duration_seconds";
/// 1 while this replica acts (leader, or leader election off), 0 while it stands by.
pub const LEADER: &str = "multigres_operator_leader";
/// Admission requests per `operation` (`DEFAULT` for the mutating webhook, `VALIDATE` for the
/// validating ones), `resource` (lowercase kind) and `result` (`allowed`, `denied`, `invalid`
/// for an unreadable request, `error` when the webhook itself failed).
pub const WEBHOOK_REQUEST_TOTAL: &str = "multigres_operator_webhook_request_total";
/// Admission latency per `operation` and `resource`.
pub const WEBHOOK_REQUEST_DURATION_SECONDS: &str =
    "multigres_operator_webhook_request_duration_seconds";

/// Writes a controller made, per `controller`, `kind` and `verb` (`apply`, `apply-status`,
/// `patch`, `delete`, `event`): what each write was for.
pub const API_WRITES_TOTAL: &str = "multigres_operator_api_writes_total";
/// Every mutating request the handler's Kubernetes client sent, per `verb` (`create`,
/// `update`, `patch`, `delete`), `resource` (plural) and `subresource` (empty for the object
/// itself). Counted in the client itself ([`crate::client`]), so no write path can bypass it:
/// the idle-cost tests rely on it.
pub const KUBE_WRITE_REQUESTS_TOTAL: &str = "multigres_operator_kube_write_requests_total";

/// Histogram buckets for reconcile latency, up to the 30 s of the seed's slow-reconcile alert
/// and beyond.
const DURATION_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// How often histogram windows are maintained; the exporter leaves this to the caller.
const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

/// A recorder builder with the operator's histogram buckets, so latencies render as real
/// Prometheus histograms rather than summaries.
pub fn builder() -> Result<PrometheusBuilder, BuildError> {
    PrometheusBuilder::new().set_buckets_for_metric(
        Matcher::Suffix("_duration_seconds".to_owned()),
        DURATION_BUCKETS,
    )
}

/// Installs the process-wide recorder and describes the operator's metrics. Once per process.
pub fn install() -> Result<PrometheusHandle, BuildError> {
    let handle = builder()?.install_recorder()?;
    describe();
    Ok(handle)
}

/// Registers HELP text for the operator's metrics with the current recorder.
pub fn describe() {
    metrics::describe_counter!(RECONCILE_TOTAL, "Reconciles per controller and result.");
    metrics::describe_counter!(
        RECONCILE_ERRORS_TOTAL,
        "Failed reconciles per controller and error category."
    );
    metrics::describe_histogram!(
        RECONCILE_DURATION_SECONDS,
        metrics::Unit::Seconds,
        "Reconcile latency per controller."
    );
    metrics::describe_gauge!(
        LEADER,
        "1 while this replica acts (leader or leader election off), 0 while it stands by."
    );
    metrics::describe_counter!(
        API_WRITES_TOTAL,
        "Writes to the Kubernetes API per controller, kind and verb."
    );
    metrics::describe_counter!(
        KUBE_WRITE_REQUESTS_TOTAL,
        "Mutating requests the Kubernetes client sent, per verb, resource and subresource."
    );
    metrics::describe_counter!(
        WEBHOOK_REQUEST_TOTAL,
        "Admission requests per operation (DEFAULT or VALIDATE), resource and result."
    );
    metrics::describe_histogram!(
        WEBHOOK_REQUEST_DURATION_SECONDS,
        metrics::Unit::Seconds,
        "Admission latency per operation and resource."
    );
}

/// Records one reconcile: `Ok(())` on success, `Err(category)` with a short, bounded error
/// category (for example `invalid_spec`, `kube_api`) on failure.
pub fn record_reconcile(controller: &str, outcome: Result<(), &str>, elapsed: Duration) {
    let controller = controller.to_owned();
    let result = if outcome.is_ok() { "success" } else { "error" };
    metrics::counter!(RECONCILE_TOTAL, "controller" => controller.clone(), "result" => result)
        .increment(1);
    if let Err(category) = outcome {
        metrics::counter!(
            RECONCILE_ERRORS_TOTAL,
            "controller" => controller.clone(),
            "error" => category.to_owned()
        )
        .increment(1);
    }
    metrics::histogram!(RECONCILE_DURATION_SECONDS, "controller" => controller)
        .record(elapsed.as_secs_f64());
}

/// Counts one write of `controller`; see [`API_WRITES_TOTAL`].
pub fn record_api_write(controller: &'static str, kind: &str, verb: &'static str) {
    metrics::counter!(
        API_WRITES_TOTAL,
        "controller" => controller,
        "kind" => kind.to_owned(),
        "verb" => verb
    )
    .increment(1);
}

/// Records one admission request; see [`WEBHOOK_REQUEST_TOTAL`] for the label values.
pub fn record_webhook_request(operation: &str, resource: &str, result: &str, elapsed: Duration) {
    metrics::counter!(
        WEBHOOK_REQUEST_TOTAL,
        "operation" => operation.to_owned(),
        "resource" => resource.to_owned(),
        "result" => result.to_owned()
    )
    .increment(1);
    metrics::histogram!(
        WEBHOOK_REQUEST_DURATION_SECONDS,
        "operation" => operation.to_owned(),
        "resource" => resource.to_owned()
    )
    .record(elapsed.as_secs_f64());
}

/// Publishes whether this replica acts.
pub fn set_leader(handler: &str, acting: bool) {
    metrics::gauge!(LEADER, "handler" => handler.to_owned()).set(if acting { 1.0 } else { 0.0 });
}

/// The HTTP router serving, on `/metrics`, the recorder's metrics followed by the per-object
/// gauges of [`crate::status_metrics`].
pub fn router(handle: PrometheusHandle) -> Router {
    Router::new().route(
        "/metrics",
        get(move || {
            let handle = handle.clone();
            async move {
                let mut text = handle.render();
                text.push_str(&crate::status_metrics::render());
                text
            }
        }),
    )
}

/// Serves `/metrics` on `listener` until `shutdown` resolves, running the exporter's upkeep
/// meanwhile.
pub async fn serve(
    listener: TcpListener,
    handle: PrometheusHandle,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let upkeep_handle = handle.clone();
    let upkeep = tokio::spawn(async move {
        let mut interval = tokio::time::interval(UPKEEP_INTERVAL);
        loop {
            interval.tick().await;
            upkeep_handle.run_upkeep();
        }
    });
    let result = axum::serve(listener, router(handle))
        .with_graceful_shutdown(shutdown)
        .await;
    upkeep.abort();
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render_with(record: impl FnOnce()) -> String {
        let recorder = builder().unwrap().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            describe();
            record();
        });
        handle.render()
    }

    #[test]
    fn reconcile_metrics_render_with_names_and_labels() {
        let text = render_with(|| {
            record_reconcile("cell", Ok(()), Duration::from_millis(20));
            record_reconcile("cell", Ok(()), Duration::from_millis(30));
            record_reconcile("cell", Err("kube_api"), Duration::from_secs(2));
        });
        assert!(
            text.contains(
                r#"multigres_operator_reconcile_total{controller="cell",result="success"} 2"#
            ),
            "{text}"
        );
        assert!(
            text.contains(
                r#"multigres_operator_reconcile_total{controller="cell",result="error"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(
                r#"multigres_operator_reconcile_errors_total{controller="cell",error="kube_api"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains("# TYPE multigres_operator_reconcile_duration_seconds histogram"),
            "{text}"
        );
        assert!(
            text.contains(
                r#"multigres_operator_reconcile_duration_seconds_bucket{controller="cell",le="0.05"} 2"#
            ),
            "{text}"
        );
        assert!(
            text.contains(
                r#"multigres_operator_reconcile_duration_seconds_count{controller="cell"} 3"#
            ),
            "{text}"
        );
        assert!(
            text.contains("# HELP multigres_operator_reconcile_total Reconciles per controller"),
            "{text}"
        );
    }

    #[test]
    fn webhook_metrics_render_with_the_seed_names_and_labels() {
        let text = render_with(|| {
            record_webhook_request(
                "VALIDATE",
                "multigrescluster",
                "denied",
                Duration::from_millis(3),
            );
            record_webhook_request(
                "DEFAULT",
                "multigrescluster",
                "allowed",
                Duration::from_millis(4),
            );
        });
        assert!(
            text.contains(
                r#"multigres_operator_webhook_request_total{operation="VALIDATE",resource="multigrescluster",result="denied"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(
                r#"multigres_operator_webhook_request_duration_seconds_bucket{operation="DEFAULT",resource="multigrescluster",le="0.005"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains("# HELP multigres_operator_webhook_request_total Admission requests"),
            "{text}"
        );
    }

    #[test]
    fn leader_gauge_follows_the_latest_state() {
        let text = render_with(|| {
            set_leader("data-handler", true);
            set_leader("data-handler", false);
        });
        assert!(
            text.contains(r#"multigres_operator_leader{handler="data-handler"} 0"#),
            "{text}"
        );
        let text = render_with(|| set_leader("data-handler", true));
        assert!(
            text.contains(r#"multigres_operator_leader{handler="data-handler"} 1"#),
            "{text}"
        );
    }
}
