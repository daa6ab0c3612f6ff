//! `podLabels` and `podAnnotations`, wherever a spec has them (the stateless components of a
//! cluster, its cells and shards, and of the templates): keys must be label keys, label values
//! label values. The API server refuses a Deployment whose pod template breaks either, so the
//! component would never run and its handler would retry forever. Checked here rather than by
//! CEL: a map key has no length bound in a CRD schema, so a CEL `matches` over the keys would
//! exceed the API server's cost budget for the CRD.

use multigres_api::labels::{key_problem, value_problem};
use serde::Serialize;
use serde_json::Value;

use crate::violation::Findings;

/// Reports every bad key or value of a `podLabels` or `podAnnotations` map of `spec` (a
/// cluster's or a template's), each at its path under `base`, e.g.
/// `spec.cells[0].spec.multigateway.podLabels["My Key"]`.
pub fn pod_metadata(findings: &mut Findings, base: &str, spec: &impl Serialize) {
    if let Ok(value) = serde_json::to_value(spec) {
        walk(findings, &value, base);
    }
}

fn walk(findings: &mut Findings, value: &Value, path: &str) {
    match value {
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                walk(findings, item, &format!("{path}[{i}]"));
            }
        }
        Value::Object(fields) => {
            for (key, child) in fields {
                let child_path = format!("{path}.{key}");
                match (key.as_str(), child) {
                    ("podLabels", Value::Object(map)) => check(findings, &child_path, map, true),
                    ("podAnnotations", Value::Object(map)) => {
                        check(findings, &child_path, map, false);
                    }
                    _ => walk(findings, child, &child_path),
                }
            }
        }
        _ => {}
    }
}

fn check(findings: &mut Findings, path: &str, map: &serde_json::Map<String, Value>, labels: bool) {
    for (key, value) in map {
        let field = format!("{path}[{key:?}]");
        if let Some(problem) = key_problem(key) {
            findings.violation(&field, problem);
        }
        if labels && let Some(problem) = value.as_str().and_then(value_problem) {
            findings.violation(&field, problem);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use multigres_api::v1alpha1::CoreTemplateSpec;

    #[test]
    fn bad_keys_and_label_values_are_refused_at_their_path() {
        let spec: CoreTemplateSpec = serde_json::from_value(serde_json::json!({
            "multiadmin": {
                "podLabels": {"team": "data platform", "ok": "yes"},
                "podAnnotations": {"My Key": "any value at all", "example.com/fine": "x y"}
            }
        }))
        .unwrap();
        let mut findings = Findings::default();
        pod_metadata(&mut findings, "spec", &spec);
        let fields: Vec<_> = findings
            .violations
            .iter()
            .map(|v| v.field.as_str())
            .collect();
        assert_eq!(
            fields,
            [
                "spec.multiadmin.podAnnotations[\"My Key\"]",
                "spec.multiadmin.podLabels[\"team\"]"
            ]
        );
        assert!(
            findings.violations[1]
                .message
                .starts_with("value \"data platform\" is not a valid label value"),
            "{findings:?}"
        );
    }
}
