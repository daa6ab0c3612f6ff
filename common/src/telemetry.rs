//! Process-wide setup that must happen before anything else: the rustls crypto provider, the
//! tracing subscriber (JSON or text logs on stdout) and, when `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set, OpenTelemetry trace export over OTLP/gRPC.
//!
//! With tracing on, every log line written inside a span carries that span's `trace_id` and
//! `span_id`, so a log line leads to its trace and back. The standard `OTEL_*` variables
//! (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER`,
//! `OTEL_EXPORTER_OTLP_INSECURE`, `OTEL_EXPORTER_OTLP_HEADERS`, ...) are honoured.

use std::io::IsTerminal;

use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_otlp::{ExporterBuildError, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::Subscriber;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::ParseError;
use tracing_subscriber::fmt::format::{self, FormatEvent, FormatFields, JsonFields, Writer};
use tracing_subscriber::fmt::{FmtContext, MakeWriter};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{Layer, Registry};

use crate::cli::LogFormat;
/// Why logging could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// `--log-level` or RUST_LOG is not a valid filter.
    #[error("invalid log filter {filter:?}")]
    InvalidFilter {
        /// The filter as given.
        filter: String,
        /// What the parser said.
        #[source]
        source: ParseError,
    },
    /// A global subscriber was already installed in this process.
    #[error("a tracing subscriber is already installed: {0}")]
    AlreadyInstalled(String),
    /// The OTLP exporter could not be built from the `OTEL_EXPORTER_OTLP_*` settings.
    #[error("cannot set up OTLP trace export")]
    Tracing(#[source] ExporterBuildError),
}

/// Displays an error with its sources, `outer: inner: root`, so one log line says everything.
/// A source whose message the line already contains (many errors repeat their source in their
/// own message) is skipped.
#[derive(Debug, Clone, Copy)]
pub struct ErrorChain<'a>(pub &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut line = self.0.to_string();
        let mut source = self.0.source();
        while let Some(error) = source {
            let message = error.to_string();
            if !line.contains(&message) {
                line.push_str(": ");
                line.push_str(&message);
            }
            source = error.source();
        }
        f.write_str(&line)
    }
}

/// Installs ring as the process-wide rustls provider.
///
/// kube's TLS client needs exactly one default provider; when two are compiled in (ring and
/// aws-lc-rs through some dependency) it panics on client creation unless one was installed.
/// Installing it again is harmless, so this may be called more than once.
pub fn install_crypto_provider() {
    // An Err only means a provider is already installed, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Builds the log filter: `--log-level` when given, else RUST_LOG, else `info`.
pub fn build_filter(
    log_level: Option<&str>,
    rust_log: Option<&str>,
) -> Result<EnvFilter, TelemetryError> {
    let filter = log_level
        .or(rust_log.filter(|s| !s.trim().is_empty()))
        .unwrap_or("info");
    EnvFilter::try_new(filter).map_err(|source| TelemetryError::InvalidFilter {
        filter: filter.to_owned(),
        source,
    })
}

/// Environment variables that switch trace export on (the OpenTelemetry SDK's names).
pub const OTLP_ENDPOINT_VARS: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
];

/// Who emits the traces: `service.name` (unless `OTEL_SERVICE_NAME` is set) and
/// `service.version`, under `service.namespace` `multigres-operator`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServiceInfo<'a> {
    /// Binary name, e.g. `cluster-handler`.
    pub name: &'a str,
    /// Its version.
    pub version: &'a str,
}

/// Whether trace export is configured in this environment (any of [`OTLP_ENDPOINT_VARS`] set
/// and non-empty).
pub fn otlp_configured() -> bool {
    OTLP_ENDPOINT_VARS
        .iter()
        .any(|var| std::env::var(var).is_ok_and(|v| !v.trim().is_empty()))
}

/// A tracer provider exporting in batches over OTLP/gRPC to `endpoint`, or, when `None`, to
/// where the `OTEL_EXPORTER_OTLP_*` variables say. Must be called inside a Tokio runtime (the
/// gRPC channel lives on it).
pub fn otlp_tracer_provider(
    service: ServiceInfo<'_>,
    endpoint: Option<&str>,
) -> Result<SdkTracerProvider, TelemetryError> {
    let mut builder = opentelemetry_otlp::SpanExporter::builder().with_tonic();
    if let Some(endpoint) = endpoint {
        builder = builder.with_endpoint(endpoint);
    }
    let exporter = builder.build().map_err(TelemetryError::Tracing)?;
    let mut resource = Resource::builder().with_attributes([
        opentelemetry::KeyValue::new("service.namespace", "multigres-operator"),
        opentelemetry::KeyValue::new("service.version", service.version.to_owned()),
    ]);
    if std::env::var("OTEL_SERVICE_NAME").map_or(true, |v| v.trim().is_empty()) {
        resource = resource.with_service_name(service.name.to_owned());
    }
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build())
}

/// The subscriber: `filter`, then (with `tracer`) span export, then log lines in `format` on
/// `writer` (text lines coloured when `ansi`), carrying trace and span ids when inside an
/// exported span.
pub fn subscriber<W>(
    format: LogFormat,
    filter: EnvFilter,
    tracer: Option<&SdkTracerProvider>,
    writer: W,
    ansi: bool,
) -> impl Subscriber + Send + Sync + for<'a> LookupSpan<'a>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    type Boxed =
        Box<dyn Layer<tracing_subscriber::layer::Layered<EnvFilter, Registry>> + Send + Sync>;
    let mut layers: Vec<Boxed> = Vec::new();
    if let Some(provider) = tracer {
        layers.push(Box::new(
            tracing_opentelemetry::layer().with_tracer(provider.tracer("multigres-operator")),
        ));
    }
    let logs: Boxed = match format {
        LogFormat::Json => Box::new(
            tracing_subscriber::fmt::layer()
                .fmt_fields(JsonFields::new())
                .event_format(WithTraceIds(
                    format::format()
                        .json()
                        .flatten_event(true)
                        .with_current_span(true),
                ))
                .with_ansi(false)
                .with_writer(writer),
        ),
        LogFormat::Text => Box::new(
            tracing_subscriber::fmt::layer()
                .event_format(WithTraceIds(format::format()))
                .with_ansi(ansi)
                .with_writer(writer),
        ),
    };
    layers.push(logs);
    tracing_subscriber::registry().with(filter).with(layers)
}

/// What [`init`] set up; [`Telemetry::shutdown`] sends the spans still buffered.
#[derive(Debug)]
#[must_use = "dropping it loses the spans still buffered; call shutdown"]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Whether spans are exported.
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }

    /// Exports the buffered spans and stops the exporter (blocking work, run off the async
    /// workers).
    pub async fn shutdown(self) {
        let Some(provider) = self.provider else {
            return;
        };
        let flushed = tokio::task::spawn_blocking(move || provider.shutdown()).await;
        match flushed {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::warn!(%error, "trace export did not shut down cleanly"),
            Err(error) => tracing::warn!(%error, "trace export shutdown task failed"),
        }
    }
}

/// Installs the crypto provider and the global tracing subscriber (JSON or text on stdout),
/// exporting spans when [`otlp_configured`]. Call once, inside the Tokio runtime.
pub fn init(
    service: ServiceInfo<'_>,
    format: LogFormat,
    log_level: Option<&str>,
) -> Result<Telemetry, TelemetryError> {
    install_crypto_provider();
    let rust_log = std::env::var(EnvFilter::DEFAULT_ENV).ok();
    let filter = build_filter(log_level, rust_log.as_deref())?;
    let provider = if otlp_configured() {
        Some(otlp_tracer_provider(service, None)?)
    } else {
        None
    };
    let ansi = std::io::stdout().is_terminal();
    subscriber(format, filter, provider.as_ref(), std::io::stdout, ansi)
        .try_init()
        .map_err(|e| TelemetryError::AlreadyInstalled(e.to_string()))?;
    if provider.is_some() {
        tracing::info!("exporting traces over OTLP");
    }
    Ok(Telemetry { provider })
}

/// An event formatter that adds the OpenTelemetry `trace_id` and `span_id` of the current span
/// to what `F` writes: as two more fields of the JSON object, or `key=value` pairs at the end
/// of a text line. Lines outside exported spans are left as they are.
#[derive(Debug, Clone)]
pub struct WithTraceIds<F>(pub F);

/// The trace and span ids (lowercase hex) of the span an event is logged in, if it is exported.
///
/// The OpenTelemetry layer attaches a span's context to the thread while the span is entered,
/// so the current OpenTelemetry context is the event's span for events logged inside it.
fn trace_ids(event: &tracing::Event<'_>) -> Option<(String, String)> {
    if !event.is_contextual() {
        return None;
    }
    let context = opentelemetry::Context::current();
    let span = context.span();
    let span_context = span.span_context();
    span_context.is_valid().then(|| {
        (
            span_context.trace_id().to_string(),
            span_context.span_id().to_string(),
        )
    })
}

impl<S, N, F> FormatEvent<S, N> for WithTraceIds<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let Some((trace_id, span_id)) = trace_ids(event) else {
            return self.0.format_event(ctx, writer, event);
        };
        let mut line = String::new();
        self.0.format_event(ctx, Writer::new(&mut line), event)?;
        let body_end = line.trim_end_matches('\n').len();
        let (body, newline) = line.split_at(body_end);
        match body.strip_suffix('}') {
            Some(object) if body.starts_with('{') => write!(
                writer,
                "{object},\"trace_id\":\"{trace_id}\",\"span_id\":\"{span_id}\"}}{newline}"
            ),
            _ => write!(
                writer,
                "{body} trace_id={trace_id} span_id={span_id}{newline}"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// A writer collecting everything logged, for assertions.
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

    impl Captured {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    /// Logs one line outside any span and one inside a span; returns the output and the span's
    /// trace and span ids as OpenTelemetry sees them.
    fn log_in_and_out_of_a_span(
        format: LogFormat,
        tracer: Option<&SdkTracerProvider>,
    ) -> (String, Option<(String, String)>) {
        use tracing_opentelemetry::OpenTelemetrySpanExt;
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = subscriber(
            format,
            EnvFilter::new("info"),
            tracer,
            move || writer.clone(),
            false,
        );
        let ids = tracing::subscriber::with_default(subscriber, || {
            tracing::info!(outside = true, "before the span");
            let span = tracing::info_span!("reconcile", object = "db/main");
            let _entered = span.enter();
            tracing::info!(inside = true, "in the span");
            let context = span.context();
            let span_context = context.span().span_context().clone();
            span_context.is_valid().then(|| {
                (
                    span_context.trace_id().to_string(),
                    span_context.span_id().to_string(),
                )
            })
        });
        (captured.text(), ids)
    }

    #[test]
    fn json_lines_in_an_exported_span_carry_its_ids() {
        let provider = SdkTracerProvider::builder().build();
        let (text, ids) = log_in_and_out_of_a_span(LogFormat::Json, Some(&provider));
        let (trace_id, span_id) = ids.expect("the span is sampled");
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert_eq!(lines[0]["message"], "before the span");
        assert!(lines[0].get("trace_id").is_none(), "{text}");
        assert_eq!(lines[1]["message"], "in the span");
        assert_eq!(lines[1]["inside"], true);
        assert_eq!(lines[1]["span"]["name"], "reconcile");
        assert_eq!(lines[1]["trace_id"], trace_id.as_str());
        assert_eq!(lines[1]["span_id"], span_id.as_str());
        assert_eq!(trace_id.len(), 32, "{trace_id}");
        assert_eq!(span_id.len(), 16, "{span_id}");
    }

    #[test]
    fn text_lines_in_an_exported_span_end_with_its_ids() {
        let provider = SdkTracerProvider::builder().build();
        let (text, ids) = log_in_and_out_of_a_span(LogFormat::Text, Some(&provider));
        let (trace_id, span_id) = ids.expect("the span is sampled");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(!lines[0].contains("trace_id"), "{text}");
        assert!(
            lines[1].ends_with(&format!(" trace_id={trace_id} span_id={span_id}")),
            "{text}"
        );
    }

    #[test]
    fn without_export_lines_carry_no_ids() {
        let (text, ids) = log_in_and_out_of_a_span(LogFormat::Json, None);
        assert!(ids.is_none());
        assert!(!text.contains("trace_id"), "{text}");
        assert_eq!(text.lines().count(), 2, "{text}");
    }

    #[test]
    fn flag_wins_over_env() {
        let filter = build_filter(Some("debug"), Some("error")).unwrap();
        assert_eq!(filter.to_string(), "debug");
    }

    #[test]
    fn env_is_used_without_flag() {
        let filter = build_filter(None, Some("warn,kube=debug"))
            .unwrap()
            .to_string();
        let mut directives: Vec<_> = filter.split(',').collect();
        directives.sort_unstable();
        assert_eq!(directives, ["kube=debug", "warn"]);
    }

    #[test]
    fn info_without_flag_or_env() {
        assert_eq!(build_filter(None, None).unwrap().to_string(), "info");
        assert_eq!(build_filter(None, Some(" ")).unwrap().to_string(), "info");
    }

    #[test]
    fn invalid_filter_is_reported() {
        let err = build_filter(Some("kube=notalevel"), None).unwrap_err();
        assert!(err.to_string().contains("kube=notalevel"), "{err}");
    }

    #[test]
    fn error_chain_shows_every_source() {
        let err = build_filter(Some("kube=notalevel"), None).unwrap_err();
        let source = std::error::Error::source(&err).unwrap().to_string();
        assert!(
            !err.to_string().contains(&source),
            "source repeated in {err}"
        );
        assert_eq!(
            ErrorChain(&err).to_string(),
            format!("invalid log filter \"kube=notalevel\": {source}")
        );
    }
}
