//! Warnings about accepted fields whose behaviour does not exist yet, so none is silently
//! ignored: one warning per not-yet-implemented field of `multigres_api::field_support` that an
//! object sets to a value that would have had an effect.

use kube::core::DynamicObject;
use multigres_api::field_support::{self, Kind, Support};
use serde_json::Value;

use crate::rules::TemplateKind;
use crate::violation::Findings;

/// The API server may truncate a single warning longer than this.
pub const WARNING_LIMIT: usize = 256;

/// Characters of warnings this rule adds at most, of the API server's 4096 for all warnings of
/// a request, so other rules' warnings still get through.
const BUDGET: usize = 3072;

/// The registry's kind of a template kind.
pub fn template(kind: TemplateKind) -> Kind {
    match kind {
        TemplateKind::Core => Kind::CoreTemplate,
        TemplateKind::Cell => Kind::CellTemplate,
        TemplateKind::Shard => Kind::ShardTemplate,
    }
}

/// Adds a warning for every not-yet-implemented field the spec of a request's `object` sets.
pub fn check_object(findings: &mut Findings, kind: Kind, object: Option<&DynamicObject>) {
    if let Some(spec) = object.and_then(|o| o.data.get("spec")) {
        check(findings, kind, spec);
    }
}

/// Adds a warning for every not-yet-implemented field `spec` sets.
pub fn check(findings: &mut Findings, kind: Kind, spec: &Value) {
    let warnings = field_support::set_unimplemented(kind, spec)
        .into_iter()
        .filter_map(|field| match field.support {
            Support::NotYetImplemented { reason, .. } => Some(message(field.path, reason)),
            Support::Implemented(_) => None,
        })
        .collect();
    findings.warnings.extend(within_budget(warnings));
}

/// The warnings that fit the budget; when some do not, the last one kept says how many were
/// left out (room for it is reserved as the others are added).
fn within_budget(warnings: Vec<String>) -> Vec<String> {
    let total = warnings.len();
    let mut kept = Vec::with_capacity(total);
    let mut used = 0;
    for (index, warning) in warnings.into_iter().enumerate() {
        let left = total - index - 1;
        let reserve = if left > 0 { overflow(left).len() } else { 0 };
        if used + warning.len() + reserve > BUDGET {
            kept.push(overflow(total - index));
            return kept;
        }
        used += warning.len();
        kept.push(warning);
    }
    kept
}

/// The warning about one field.
fn message(path: &str, reason: &str) -> String {
    format!("{path}: accepted but not implemented yet by this operator version: {reason}")
}

/// The closing warning when `count` more fields did not fit.
fn overflow(count: usize) -> String {
    format!(
        "{count} more fields set here are accepted but not implemented yet; see \
         docs/field-support.md"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use multigres_api::field_support::FIELDS;
    use multigres_api::v1alpha1::{MultigresCluster, ShardTemplate};
    use serde_json::json;

    fn cluster_spec(spec: Value) -> Value {
        let cluster: MultigresCluster = serde_json::from_value(json!({
            "apiVersion": "multigres.com/v1alpha1", "kind": "MultigresCluster",
            "metadata": {"name": "demo"}, "spec": spec,
        }))
        .unwrap();
        serde_json::to_value(&cluster.spec).unwrap()
    }

    fn unimplemented(kind: Kind, path: &str) -> bool {
        field_support::fields(kind).any(|f| f.path == path && f.is_unimplemented())
    }

    #[test]
    fn every_warning_fits_the_api_server_limit() {
        for field in FIELDS {
            if let Support::NotYetImplemented { reason, .. } = field.support {
                let warning = message(field.path, reason);
                assert!(
                    warning.len() <= WARNING_LIMIT,
                    "{} characters: {warning}",
                    warning.len()
                );
            }
        }
        assert!(overflow(99).len() <= WARNING_LIMIT);
    }

    #[test]
    fn a_cluster_with_only_implemented_fields_gets_no_warning() {
        let spec = cluster_spec(json!({
            "postgresPasswordSecretRef": {"name": "pw", "key": "password"},
            "cells": [{"name": "zone-a", "zoneId": "zone-a"}],
            "logLevels": {"multigateway": "debug"},
            "internalTLS": {"enabled": false},
            "externalGateway": {"enabled": false},
        }));
        let mut findings = Findings::default();
        check(&mut findings, Kind::MultigresCluster, &spec);
        assert_eq!(findings, Findings::default());
    }

    #[test]
    fn each_unimplemented_field_set_is_named_once() {
        let spec = cluster_spec(json!({
            "postgresPasswordSecretRef": {"name": "pw", "key": "password"},
            "cells": [
                {"name": "zone-a", "zoneId": "zone-a", "metadata": "a"},
                {"name": "zone-b", "zoneId": "zone-b", "metadata": "b"},
            ],
            "internalTLS": {"enabled": true},
            "certCommonName": "db.example.com",
        }));
        let mut findings = Findings::default();
        check(&mut findings, Kind::MultigresCluster, &spec);
        let expected: Vec<&str> = [
            "spec.cells[].metadata",
            "spec.internalTLS",
            "spec.certCommonName",
        ]
        .into_iter()
        .filter(|p| unimplemented(Kind::MultigresCluster, p))
        .collect();
        assert_eq!(findings.warnings.len(), expected.len(), "{findings:?}");
        for path in expected {
            let prefix = format!("{path}: accepted but not implemented yet");
            assert_eq!(
                findings
                    .warnings
                    .iter()
                    .filter(|w| w.starts_with(&prefix))
                    .count(),
                1,
                "{path}: {findings:?}"
            );
        }
        assert!(findings.allowed());
    }

    #[test]
    fn templates_are_checked_against_their_own_fields() {
        let template: ShardTemplate = serde_json::from_value(json!({
            "apiVersion": "multigres.com/v1alpha1", "kind": "ShardTemplate",
            "metadata": {"name": "t"},
            "spec": {"postgresConfig": {"work_mem": "4MB"}, "initdbArgs": "--data-checksums"},
        }))
        .unwrap();
        let spec = serde_json::to_value(&template.spec).unwrap();
        let mut findings = Findings::default();
        check(&mut findings, Kind::ShardTemplate, &spec);
        let expected = usize::from(unimplemented(Kind::ShardTemplate, "spec.postgresConfig"));
        assert_eq!(findings.warnings.len(), expected, "{findings:?}");
    }

    #[test]
    fn warnings_beyond_the_budget_are_summarised() {
        let one = message("spec.a", &"x".repeat(200));
        let fits = within_budget(vec![one.clone(); 5]);
        assert_eq!(fits, vec![one.clone(); 5]);

        let kept = within_budget(vec![one.clone(); 40]);
        let total: usize = kept.iter().map(String::len).sum();
        assert!(total <= BUDGET, "{total}");
        let (last, shown) = kept.split_last().unwrap();
        assert!(shown.iter().all(|w| *w == one));
        assert_eq!(*last, overflow(40 - shown.len()));
        assert!(shown.len() >= 10, "{}", shown.len());
    }
}
