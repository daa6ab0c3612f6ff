//! OpenTelemetry environment of the Multigres processes (multigateway, multiorch, multipooler,
//! pgctld, multiadmin), from a cluster's `spec.observability` with the operator's own `OTEL_*`
//! environment as the fallback for every unset field. Pure: the caller reads its environment
//! once at start and passes it in.

use std::collections::BTreeMap;

use crate::resolver::defaults::SAMPLING_CONFIG_KEY;
use crate::v1alpha1::{
    HistogramAggregation, MetricsTemporality, ObservabilityConfig, OtlpProtocol, TelemetryExporter,
};

/// `otlpEndpoint` value that turns every process's telemetry off, whatever the operator's own
/// settings.
pub const DISABLED: &str = "disabled";
/// Where the sampling ConfigMap is mounted in each container.
pub const SAMPLING_MOUNT_PATH: &str = "/etc/otel";
/// Name of the sampling ConfigMap volume.
pub const SAMPLING_VOLUME: &str = "otel-sampling-config";
/// Cluster annotation naming the project a cluster belongs to, copied into the resource
/// attributes so telemetry of several clusters can be told apart.
pub const PROJECT_REF_ANNOTATION: &str = "multigres.com/project-ref";

const ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
const METRICS_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT";
const PROTOCOL: &str = "OTEL_EXPORTER_OTLP_PROTOCOL";
const TRACES_EXPORTER: &str = "OTEL_TRACES_EXPORTER";
const METRICS_EXPORTER: &str = "OTEL_METRICS_EXPORTER";
const LOGS_EXPORTER: &str = "OTEL_LOGS_EXPORTER";
const EXPORT_INTERVAL: &str = "OTEL_METRIC_EXPORT_INTERVAL";
const TEMPORALITY: &str = "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE";
const HISTOGRAM: &str = "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION";
const SAMPLER: &str = "OTEL_TRACES_SAMPLER";
const SAMPLER_CONFIG: &str = "OTEL_TRACES_SAMPLER_CONFIG";
const RESOURCE_ATTRIBUTES: &str = "OTEL_RESOURCE_ATTRIBUTES";

/// The `OTEL_*` variables of the operator's own environment (non-empty values only).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InheritedEnv(BTreeMap<String, String>);

impl InheritedEnv {
    /// Keeps the `OTEL_*` variables of `vars` (e.g. `std::env::vars()`) with a non-empty value.
    pub fn from_vars(vars: impl IntoIterator<Item = (String, String)>) -> Self {
        Self(
            vars.into_iter()
                .filter(|(name, value)| name.starts_with("OTEL_") && !value.trim().is_empty())
                .map(|(name, value)| (name, value.trim().to_owned()))
                .collect(),
        )
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }
}

/// A Multigres process, as named in `multigres.component`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Process {
    /// The PostgreSQL front door of a cell.
    Multigateway,
    /// The failover orchestrator of a shard.
    Multiorch,
    /// The connection pooler next to PostgreSQL.
    Multipooler,
    /// The PostgreSQL controller (pgctld runs PostgreSQL).
    Pgctld,
    /// The admin API.
    Multiadmin,
}

impl Process {
    /// The component name in resource attributes.
    pub fn as_str(self) -> &'static str {
        match self {
            Process::Multigateway => "multigateway",
            Process::Multiorch => "multiorch",
            Process::Multipooler => "multipooler",
            Process::Pgctld => "pgctld",
            Process::Multiadmin => "multiadmin",
        }
    }
}

/// Who emits the telemetry: becomes `OTEL_RESOURCE_ATTRIBUTES`.
#[derive(Clone, Copy, Debug)]
pub struct Identity<'a> {
    /// `multigres.project`, from the cluster's project-ref annotation when present.
    pub project: Option<&'a str>,
    /// `multigres.cluster`.
    pub cluster: &'a str,
    /// `multigres.component`.
    pub process: Process,
}

/// The sampling configuration file a container reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SamplingFile {
    /// ConfigMap holding it, mounted at [`SAMPLING_MOUNT_PATH`].
    pub config_map: String,
    /// Its key in the ConfigMap.
    pub key: String,
}

/// What a container gets: its environment and, when sampling is file-based, the ConfigMap to
/// mount.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Telemetry {
    /// `(name, value)` pairs, in a fixed order so pod templates are stable.
    pub env: Vec<(String, String)>,
    /// The sampling file to mount.
    pub sampling: Option<SamplingFile>,
}

fn protocol(p: OtlpProtocol) -> &'static str {
    match p {
        OtlpProtocol::HttpProtobuf => "http/protobuf",
        OtlpProtocol::Grpc => "grpc",
    }
}

fn exporter(e: TelemetryExporter) -> &'static str {
    match e {
        TelemetryExporter::Otlp => "otlp",
        TelemetryExporter::Disabled => "none",
        TelemetryExporter::Console => "console",
    }
}

fn temporality(t: MetricsTemporality) -> &'static str {
    match t {
        MetricsTemporality::Cumulative => "cumulative",
        MetricsTemporality::Delta => "delta",
    }
}

fn histogram(h: HistogramAggregation) -> &'static str {
    match h {
        HistogramAggregation::Base2ExponentialBucketHistogram => {
            "base2_exponential_bucket_histogram"
        }
        HistogramAggregation::ExplicitBucketHistogram => "explicit_bucket_histogram",
    }
}

/// The telemetry of one process. Each field comes from `config`, else from `inherited`. No
/// endpoint at all (or `otlpEndpoint: disabled`) means no variable and no mount: the process's
/// own defaults (no export) apply.
pub fn telemetry(
    config: Option<&ObservabilityConfig>,
    inherited: &InheritedEnv,
    identity: Identity<'_>,
) -> Telemetry {
    let own = config.cloned().unwrap_or_default();
    let pick = |set: Option<String>, name: &str| {
        set.filter(|v| !v.is_empty())
            .or_else(|| inherited.get(name).map(str::to_owned))
    };
    let endpoint = pick(own.otlp_endpoint.clone(), ENDPOINT);
    if endpoint.as_deref() == Some(DISABLED) {
        return Telemetry::default();
    }
    let metrics_endpoint = pick(own.otlp_metrics_endpoint.clone(), METRICS_ENDPOINT);
    if endpoint.is_none() && metrics_endpoint.is_none() {
        return Telemetry::default();
    }
    let fields = [
        (ENDPOINT, endpoint),
        (METRICS_ENDPOINT, metrics_endpoint),
        (
            PROTOCOL,
            pick(own.otlp_protocol.map(|p| protocol(p).to_owned()), PROTOCOL),
        ),
        (
            TRACES_EXPORTER,
            pick(
                own.traces_exporter.map(|e| exporter(e).to_owned()),
                TRACES_EXPORTER,
            ),
        ),
        (
            METRICS_EXPORTER,
            pick(
                own.metrics_exporter.map(|e| exporter(e).to_owned()),
                METRICS_EXPORTER,
            ),
        ),
        (
            LOGS_EXPORTER,
            pick(
                own.logs_exporter.map(|e| exporter(e).to_owned()),
                LOGS_EXPORTER,
            ),
        ),
        (
            EXPORT_INTERVAL,
            pick(own.metric_export_interval.clone(), EXPORT_INTERVAL),
        ),
        (
            TEMPORALITY,
            pick(
                own.metrics_temporality.map(|t| temporality(t).to_owned()),
                TEMPORALITY,
            ),
        ),
        (
            HISTOGRAM,
            pick(
                own.histogram_aggregation.map(|h| histogram(h).to_owned()),
                HISTOGRAM,
            ),
        ),
        (SAMPLER, pick(own.traces_sampler.clone(), SAMPLER)),
        (
            RESOURCE_ATTRIBUTES,
            Some(resource_attributes(
                inherited.get(RESOURCE_ATTRIBUTES),
                identity,
            )),
        ),
    ];
    let mut env: Vec<(String, String)> = fields
        .into_iter()
        .filter_map(|(name, value)| Some((name.to_owned(), value?)))
        .collect();
    let sampling = own.sampling_config_ref.map(|r| SamplingFile {
        config_map: r.name,
        key: r.key.unwrap_or_else(|| SAMPLING_CONFIG_KEY.to_owned()),
    });
    if let Some(file) = &sampling {
        env.push((
            SAMPLER_CONFIG.to_owned(),
            format!("{SAMPLING_MOUNT_PATH}/{}", file.key),
        ));
    }
    Telemetry { env, sampling }
}

/// The operator's resource attributes without the keys generated here, then the generated
/// `multigres.project`, `multigres.cluster` and `multigres.component`.
fn resource_attributes(inherited: Option<&str>, identity: Identity<'_>) -> String {
    let generated: Vec<(&str, &str)> = [
        ("multigres.project", identity.project),
        ("multigres.cluster", Some(identity.cluster)),
        ("multigres.component", Some(identity.process.as_str())),
    ]
    .into_iter()
    .filter_map(|(k, v)| Some((k, v.filter(|v| !v.is_empty())?)))
    .collect();
    let kept = split_attributes(inherited.unwrap_or_default())
        .into_iter()
        .map(str::trim)
        .filter(|part| !part.is_empty())
        .filter(|part| {
            let key = part.split_once('=').map_or(*part, |(k, _)| k).trim();
            !generated.iter().any(|(g, _)| *g == key)
        })
        .map(str::to_owned);
    kept.chain(generated.iter().map(|(k, v)| format!("{k}={v}")))
        .collect::<Vec<_>>()
        .join(",")
}

/// Splits `key=value` pairs at commas not escaped with a backslash.
fn split_attributes(raw: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut start, mut escaped) = (0, false);
    for (i, c) in raw.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            ',' => {
                parts.push(&raw[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&raw[start..]);
    parts
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1alpha1::SamplingConfigRef;

    fn id(process: Process) -> Identity<'static> {
        Identity {
            project: None,
            cluster: "prod",
            process,
        }
    }

    fn inherited(vars: &[(&str, &str)]) -> InheritedEnv {
        InheritedEnv::from_vars(
            vars.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<Vec<_>>(),
        )
    }

    fn pairs(t: &Telemetry) -> Vec<(&str, &str)> {
        t.env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect()
    }

    #[test]
    fn every_field_maps_to_its_variable_in_a_fixed_order() {
        let config = ObservabilityConfig {
            otlp_endpoint: Some("http://collector:4318".into()),
            otlp_metrics_endpoint: Some("http://metrics:4318".into()),
            otlp_protocol: Some(OtlpProtocol::Grpc),
            traces_exporter: Some(TelemetryExporter::Otlp),
            metrics_exporter: Some(TelemetryExporter::Disabled),
            logs_exporter: Some(TelemetryExporter::Console),
            metric_export_interval: Some("15000".into()),
            metrics_temporality: Some(MetricsTemporality::Delta),
            histogram_aggregation: Some(HistogramAggregation::Base2ExponentialBucketHistogram),
            traces_sampler: Some("multigres_custom".into()),
            sampling_config_ref: Some(SamplingConfigRef {
                name: "sampling".into(),
                key: None,
            }),
            postgres_exporter: None,
        };
        let t = telemetry(Some(&config), &InheritedEnv::default(), id(Process::Pgctld));
        assert_eq!(
            pairs(&t),
            [
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
                ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://metrics:4318"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                ("OTEL_TRACES_EXPORTER", "otlp"),
                ("OTEL_METRICS_EXPORTER", "none"),
                ("OTEL_LOGS_EXPORTER", "console"),
                ("OTEL_METRIC_EXPORT_INTERVAL", "15000"),
                ("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "delta"),
                (
                    "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION",
                    "base2_exponential_bucket_histogram"
                ),
                ("OTEL_TRACES_SAMPLER", "multigres_custom"),
                (
                    "OTEL_RESOURCE_ATTRIBUTES",
                    "multigres.cluster=prod,multigres.component=pgctld"
                ),
                (
                    "OTEL_TRACES_SAMPLER_CONFIG",
                    "/etc/otel/sampling-config.yaml"
                ),
            ]
        );
        assert_eq!(
            t.sampling,
            Some(SamplingFile {
                config_map: "sampling".into(),
                key: "sampling-config.yaml".into()
            })
        );
    }

    #[test]
    fn disabled_suppresses_everything_including_the_operator_env() {
        let config = ObservabilityConfig {
            otlp_endpoint: Some(DISABLED.into()),
            traces_sampler: Some("always_on".into()),
            sampling_config_ref: Some(SamplingConfigRef {
                name: "s".into(),
                key: Some("k".into()),
            }),
            ..Default::default()
        };
        let env = inherited(&[("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://m:4318")]);
        assert_eq!(
            telemetry(Some(&config), &env, id(Process::Multigateway)),
            Telemetry::default()
        );
    }

    #[test]
    fn unset_config_inherits_the_operator_env_per_field() {
        let env = inherited(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://op:4317"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_TRACES_SAMPLER_CONFIG", "/operator/only.yaml"),
            ("OTEL_SERVICE_NAME", "multigres-operator"),
            ("OTEL_TRACES_EXPORTER", " "),
            ("HOME", "/root"),
        ]);
        assert_eq!(
            pairs(&telemetry(None, &env, id(Process::Multiorch))),
            [
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://op:4317"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                (
                    "OTEL_RESOURCE_ATTRIBUTES",
                    "multigres.cluster=prod,multigres.component=multiorch"
                ),
            ]
        );
        let config = ObservabilityConfig {
            otlp_protocol: Some(OtlpProtocol::HttpProtobuf),
            ..Default::default()
        };
        let t = telemetry(Some(&config), &env, id(Process::Multiorch));
        assert_eq!(
            t.env[1],
            ("OTEL_EXPORTER_OTLP_PROTOCOL".into(), "http/protobuf".into())
        );
    }

    #[test]
    fn no_endpoint_anywhere_means_no_telemetry() {
        let config = ObservabilityConfig {
            traces_sampler: Some("always_on".into()),
            ..Default::default()
        };
        assert_eq!(
            telemetry(
                Some(&config),
                &InheritedEnv::default(),
                id(Process::Multiadmin)
            ),
            Telemetry::default()
        );
        let metrics_only = inherited(&[("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://m")]);
        assert_eq!(
            pairs(&telemetry(None, &metrics_only, id(Process::Multiadmin)))[0],
            ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://m")
        );
    }

    #[test]
    fn resource_attributes_keep_the_operators_others_and_replace_generated_keys() {
        let env = inherited(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://op:4317"),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "deployment.environment=prod, multigres.cluster=operator ,team=a\\,b,",
            ),
        ]);
        let identity = Identity {
            project: Some("proj-1"),
            cluster: "c1",
            process: Process::Multipooler,
        };
        let t = telemetry(None, &env, identity);
        assert_eq!(
            t.env.last().unwrap().1,
            "deployment.environment=prod,team=a\\,b,multigres.project=proj-1,\
             multigres.cluster=c1,multigres.component=multipooler"
        );
    }
}
