//! Admission rules: small pure functions from the objects of a request (and what was looked up
//! for it) to [`Findings`]. No I/O here, so every rule is unit-tested on its own.
//!
//! The CRD schema and its CEL rules run before these (the API server validates an object before
//! calling validating webhooks), so these rules cover what CEL cannot see: other objects
//! (templates, clusters), resolved values (a template's size under a cluster's override), exact
//! quantity and duration comparisons, and whole-block removals that slip past CEL transition
//! rules. A few CEL checks are repeated to get a message naming the exact field.

pub mod backup_request;
pub mod children;
pub mod cluster;
pub mod expansion;
pub mod pod_metadata;
pub mod postgres;
pub mod switches;
pub mod templates;
pub mod unimplemented;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use multigres_api::v1alpha1::{
    GatewayBufferConfig, GoDuration, PvcDeletionPolicy, PvcRetentionPolicyType,
};

use crate::violation::Findings;
use multigres_api::duration;
use multigres_api::quantity::Quantity;

pub use multigres_api::resolver::{TemplateKind, Templates};

/// multigateway's `--buffer-window` when unset.
const DEFAULT_BUFFER_WINDOW: Duration = Duration::from_secs(10);
/// multigateway's `--buffer-max-failover-duration` when unset.
const DEFAULT_BUFFER_MAX_FAILOVER: Duration = Duration::from_secs(20);

/// Checks every quantity of a resource block and that no limit is below its request.
pub fn resources(findings: &mut Findings, path: &str, resources: Option<&ResourceRequirements>) {
    let Some(resources) = resources else {
        return;
    };
    let requests = quantities(findings, &format!("{path}.requests"), &resources.requests);
    let limits = quantities(findings, &format!("{path}.limits"), &resources.limits);
    for (name, (limit_text, limit)) in &limits {
        if let Some((request_text, request)) = requests.get(name)
            && limit < request
        {
            findings.violation(
                format!("{path}.limits.{name}"),
                format!(
                    "limit {limit_text} is below the request {request_text}; a limit must be at \
                     least the request: raise the limit or lower the request"
                ),
            );
        }
    }
}

/// Parses every quantity of a requests or limits map, reporting the malformed and negative ones.
fn quantities<'a>(
    findings: &mut Findings,
    path: &str,
    map: &'a Option<BTreeMap<String, K8sQuantity>>,
) -> BTreeMap<&'a str, (&'a str, Quantity)> {
    let mut parsed = BTreeMap::new();
    for (name, value) in map.iter().flatten() {
        let field = format!("{path}.{name}");
        match Quantity::parse(&value.0) {
            Ok(q) if q.is_negative() => {
                findings.violation(field, format!("{:?} must not be negative", value.0));
            }
            Ok(q) => {
                parsed.insert(name.as_str(), (value.0.as_str(), q));
            }
            Err(error) => findings.violation(field, error.to_string()),
        }
    }
    parsed
}

/// The smallest volume size admitted. Kubernetes takes a PersistentVolumeClaim of a few bytes,
/// but no etcd member, PGDATA or backup repository fits in less than a mebibyte, and such a size
/// is always a slip (`1M` meant as `1Gi`, `1m` as a milli-something).
pub const MIN_VOLUME: &str = "1Mi";

/// Checks a volume size is a whole number of bytes, at least [`MIN_VOLUME`].
pub fn storage_size(findings: &mut Findings, path: &str, size: Option<&str>) {
    let Some(size) = size else {
        return;
    };
    let minimum = Quantity::parse(MIN_VOLUME).ok();
    match Quantity::parse(size) {
        Ok(q) if q.is_negative() || q.is_zero() => findings.violation(
            path,
            format!("{size:?} must be a positive size such as 10Gi"),
        ),
        Ok(q) if !q.is_whole() => findings.violation(
            path,
            format!(
                "{size:?} is not a whole number of bytes (the suffix m is a thousandth); use a \
                 size such as 10Gi"
            ),
        ),
        Ok(q) if minimum.is_some_and(|m| q < m) => findings.violation(
            path,
            format!(
                "{size:?} is below {MIN_VOLUME}, the smallest volume that can hold any data; \
                 use a size such as 10Gi"
            ),
        ),
        Ok(_) => {}
        Err(error) => findings.violation(path, format!("{error}; use a size such as 10Gi")),
    }
}

/// Refuses a volume that would shrink: Kubernetes can grow a PersistentVolumeClaim but never
/// shrink it, so a smaller size would leave the workload unreconcilable.
pub fn no_shrink(findings: &mut Findings, path: &str, what: &str, old: &str, new: &str) {
    if let (Ok(old_q), Ok(new_q)) = (Quantity::parse(old), Quantity::parse(new))
        && new_q < old_q
    {
        findings.violation(
            path,
            format!(
                "{what} cannot shrink from {old} to {new}: PersistentVolumeClaims can grow but \
                 never shrink; keep at least {old}"
            ),
        );
    }
}

/// Warns about a `whenDeleted: Delete` policy: deleting the owner then deletes the data.
pub fn pvc_policy_warning(findings: &mut Findings, path: &str, policy: Option<&PvcDeletionPolicy>) {
    if policy.and_then(|p| p.when_deleted) == Some(PvcRetentionPolicyType::Delete) {
        findings.warning(
            format!("{path}.whenDeleted"),
            "is Delete: deleting the cluster (or removing this component) deletes its pool and \
             etcd PersistentVolumeClaims and the data on them; a filesystem backup volume is \
             kept unless the cluster's annotation multigres.com/confirm-delete-backups names the \
             cluster (docs/operations.md, \"Changes that delete data\"); use Retain to keep \
             them all",
        );
    }
}

/// One duration field of a gateway buffer and where it is written.
#[derive(Debug, Clone)]
pub struct BufferField {
    /// Field path (or template and field) the value comes from.
    pub path: String,
    /// The duration as written.
    pub text: String,
}

/// The four buffer settings that constrain each other, each with its source.
#[derive(Debug, Clone, Default)]
pub struct BufferSettings {
    /// `enabled`: when false nothing else is used, so nothing else is checked.
    pub enabled: Option<bool>,
    /// `window`.
    pub window: Option<BufferField>,
    /// `maxFailoverDuration`.
    pub max_failover_duration: Option<BufferField>,
    /// `minTimeBetweenFailovers`.
    pub min_time_between_failovers: Option<BufferField>,
}

impl BufferSettings {
    /// The settings written in one buffer block at `path`.
    pub fn written(path: &str, buffer: Option<&GatewayBufferConfig>) -> Self {
        let Some(buffer) = buffer else {
            return Self::default();
        };
        let field = |name: &str, value: &Option<multigres_api::v1alpha1::GoDuration>| {
            value.as_ref().map(|v| BufferField {
                path: format!("{path}.{name}"),
                text: v.as_str().to_owned(),
            })
        };
        Self {
            enabled: buffer.enabled,
            window: field("window", &buffer.window),
            max_failover_duration: field("maxFailoverDuration", &buffer.max_failover_duration),
            min_time_between_failovers: field(
                "minTimeBetweenFailovers",
                &buffer.min_time_between_failovers,
            ),
        }
    }

    /// Lays `upper` over `self`, field by field, as the resolver merges buffers.
    pub fn overlay(&mut self, upper: Self) {
        self.enabled = upper.enabled.or(self.enabled);
        self.window = upper.window.or(self.window.take());
        self.max_failover_duration = upper
            .max_failover_duration
            .or(self.max_failover_duration.take());
        self.min_time_between_failovers = upper
            .min_time_between_failovers
            .or(self.min_time_between_failovers.take());
    }
}

/// Checks buffer durations as multigateway will: a positive window no longer than the maximum
/// failover duration. With `complete`, unset durations take multigateway's defaults (a resolved
/// cell); otherwise the order is checked only when both are written (a template on its own).
pub fn buffer(findings: &mut Findings, settings: &BufferSettings, complete: bool) {
    if settings.enabled == Some(false) {
        return;
    }
    let window = buffer_duration(findings, &settings.window);
    let max = buffer_duration(findings, &settings.max_failover_duration);
    buffer_duration(findings, &settings.min_time_between_failovers);
    for (value, field) in [&window, &max].into_iter().flatten() {
        if value.is_zero() {
            findings.violation(
                &field.path,
                format!("{:?} must be a positive duration", field.text),
            );
        }
    }
    let defaulted = |name: &str, value: Duration| {
        (
            value,
            BufferField {
                path: format!("{name} (multigateway default)"),
                text: format!("{}s", value.as_secs()),
            },
        )
    };
    let ((window, window_field), (max, max_field)) = match (window, max, complete) {
        (Some(w), Some(m), _) => (w, m),
        (Some(w), None, true) => (
            w,
            defaulted("maxFailoverDuration", DEFAULT_BUFFER_MAX_FAILOVER),
        ),
        (None, Some(m), true) => (defaulted("window", DEFAULT_BUFFER_WINDOW), m),
        _ => return,
    };
    if window > max {
        let blame = if settings.window.is_some() {
            &window_field
        } else {
            &max_field
        };
        findings.violation(
            &blame.path,
            format!(
                "buffer window ({}) must not exceed maxFailoverDuration ({}): a request cannot \
                 wait longer than the failover it waits for",
                window_field.text, max_field.text
            ),
        );
    }
}

/// Parses one buffer duration, reporting it when malformed.
fn buffer_duration(
    findings: &mut Findings,
    field: &Option<BufferField>,
) -> Option<(Duration, BufferField)> {
    let field = field.as_ref()?;
    match duration::parse_go(&field.text) {
        Ok(parsed) => Some((parsed, field.clone())),
        Err(error) => {
            findings.violation(&field.path, error.to_string());
            None
        }
    }
}

/// Checks a duration Multigres takes as a flag parses as Go parses it, so the process starts.
pub fn go_duration(
    findings: &mut Findings,
    path: impl FnOnce() -> String,
    value: Option<&GoDuration>,
) {
    if let Some(value) = value
        && let Err(error) = duration::parse_go(value.as_str())
    {
        findings.violation(path(), error.to_string());
    }
}

/// Checks that postgres and multipooler run as the same UID, since both read and write PGDATA.
pub fn run_as_user(
    findings: &mut Findings,
    postgres: Option<(String, i64)>,
    multipooler: Option<(String, i64)>,
) {
    match (postgres, multipooler) {
        (Some((path, p)), Some((_, m))) if p != m => findings.violation(
            path,
            format!(
                "postgres runAsUser {p} differs from multipooler runAsUser {m}: both containers \
                 share PGDATA, so they must run as the same UID"
            ),
        ),
        (Some((path, uid)), None) | (None, Some((path, uid))) => findings.violation(
            path,
            format!(
                "runAsUser {uid} is set on only one of postgres and multipooler: both containers \
                 share PGDATA, so set the same runAsUser on both or on neither"
            ),
        ),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(requests: &[(&str, &str)], limits: &[(&str, &str)]) -> ResourceRequirements {
        let map = |pairs: &[(&str, &str)]| {
            Some(
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), K8sQuantity(v.to_string())))
                    .collect::<BTreeMap<_, _>>(),
            )
        };
        ResourceRequirements {
            requests: map(requests),
            limits: map(limits),
            ..Default::default()
        }
    }

    #[test]
    fn limits_below_requests_are_refused_by_amount() {
        let mut f = Findings::default();
        resources(
            &mut f,
            "spec.x.resources",
            Some(&block(
                &[("cpu", "500m"), ("memory", "1Gi")],
                &[("cpu", "0.5"), ("memory", "1000Mi")],
            )),
        );
        assert_eq!(f.violations.len(), 1, "{f:?}");
        assert_eq!(f.violations[0].field, "spec.x.resources.limits.memory");
        assert!(
            f.violations[0]
                .message
                .contains("limit 1000Mi is below the request 1Gi"),
            "{f:?}"
        );
    }

    #[test]
    fn malformed_and_negative_quantities_are_refused() {
        let mut f = Findings::default();
        resources(
            &mut f,
            "r",
            Some(&block(&[("cpu", "lots")], &[("memory", "-1Gi")])),
        );
        let fields: Vec<_> = f.violations.iter().map(|v| v.field.as_str()).collect();
        assert_eq!(fields, ["r.requests.cpu", "r.limits.memory"]);
    }

    #[test]
    fn storage_sizes_must_be_positive_quantities() {
        let mut f = Findings::default();
        storage_size(&mut f, "a", Some("10Gi"));
        storage_size(&mut f, "b", Some("0Gi"));
        storage_size(&mut f, "c", Some("10GB"));
        storage_size(&mut f, "d", None);
        storage_size(&mut f, "e", Some("1m"));
        storage_size(&mut f, "f", Some("1.5"));
        storage_size(&mut f, "g", Some("1000Ki"));
        storage_size(&mut f, "h", Some("1Mi"));
        storage_size(&mut f, "i", Some("1.5e-2147483648"));
        let fields: Vec<_> = f.violations.iter().map(|v| v.field.as_str()).collect();
        assert_eq!(fields, ["b", "c", "e", "f", "g", "i"]);
        assert!(
            f.violations[2]
                .message
                .contains("not a whole number of bytes")
        );
        assert!(f.violations[4].message.contains("below 1Mi"));
        assert!(f.violations[5].message.contains("out of range"), "{f:?}");
    }

    #[test]
    fn shrinking_compares_amounts() {
        let mut f = Findings::default();
        no_shrink(&mut f, "a", "pool", "1Gi", "1024Mi");
        no_shrink(&mut f, "b", "pool", "1Gi", "2Gi");
        assert!(f.allowed());
        no_shrink(&mut f, "c", "pool", "10Gi", "9Gi");
        assert_eq!(f.violations.len(), 1);
        assert!(
            f.violations[0]
                .message
                .starts_with("pool cannot shrink from 10Gi to 9Gi"),
            "{f:?}"
        );
    }

    fn settings(window: Option<&str>, max: Option<&str>) -> BufferSettings {
        BufferSettings::written(
            "b",
            Some(&GatewayBufferConfig {
                window: window.map(Into::into),
                max_failover_duration: max.map(Into::into),
                ..Default::default()
            }),
        )
    }

    #[test]
    fn buffer_window_must_fit_the_failover_duration() {
        let mut f = Findings::default();
        buffer(&mut f, &settings(Some("10s"), Some("20s")), true);
        buffer(&mut f, &settings(Some("15s"), None), true);
        assert!(f.allowed(), "{f:?}");

        buffer(&mut f, &settings(Some("30s"), None), true);
        assert_eq!(f.violations.len(), 1);
        assert_eq!(f.violations[0].field, "b.window");
        assert!(f.violations[0].message.contains("(20s)"), "{f:?}");

        let mut f = Findings::default();
        buffer(&mut f, &settings(None, Some("5s")), true);
        assert_eq!(f.violations[0].field, "b.maxFailoverDuration");

        let mut partial = Findings::default();
        buffer(&mut partial, &settings(Some("30s"), None), false);
        assert!(
            partial.allowed(),
            "a template alone is checked only where both are set"
        );
    }

    #[test]
    fn buffer_durations_must_parse_and_be_positive() {
        let mut f = Findings::default();
        buffer(&mut f, &settings(Some("0s"), Some("ten seconds")), true);
        let fields: Vec<_> = f.violations.iter().map(|v| v.field.as_str()).collect();
        assert_eq!(fields, ["b.maxFailoverDuration", "b.window"]);

        let mut disabled = settings(Some("0s"), None);
        disabled.enabled = Some(false);
        let mut f = Findings::default();
        buffer(&mut f, &disabled, true);
        assert!(f.allowed());
    }

    #[test]
    fn durations_go_cannot_hold_are_refused() {
        let mut f = Findings::default();
        buffer(&mut f, &settings(Some("3000000h"), Some("3000000h")), true);
        let fields: Vec<_> = f.violations.iter().map(|v| v.field.as_str()).collect();
        assert_eq!(fields, ["b.window", "b.maxFailoverDuration"]);
        assert!(
            f.violations[0].message.contains("2562047h47m16.854775807s"),
            "{f:?}"
        );
        let mut f = Findings::default();
        go_duration(&mut f, || "g".into(), Some(&GoDuration::new("2562048h")));
        go_duration(&mut f, || "ok".into(), Some(&GoDuration::new("2562047h")));
        go_duration(&mut f, || "none".into(), None);
        let fields: Vec<_> = f.violations.iter().map(|v| v.field.as_str()).collect();
        assert_eq!(fields, ["g"]);
    }

    #[test]
    fn run_as_user_pairs() {
        let mut f = Findings::default();
        run_as_user(&mut f, Some(("p".into(), 999)), Some(("m".into(), 999)));
        run_as_user(&mut f, None, None);
        assert!(f.allowed());
        run_as_user(&mut f, Some(("p".into(), 999)), Some(("m".into(), 1000)));
        run_as_user(&mut f, None, Some(("m".into(), 1000)));
        let fields: Vec<_> = f.violations.iter().map(|v| v.field.as_str()).collect();
        assert_eq!(fields, ["p", "m"]);
    }
}
