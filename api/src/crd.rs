//! The CustomResourceDefinitions of the API, post-processed into the exact form that is committed
//! under `deploy/crds/` and installed into clusters.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use serde_json::Value;

use crate::v1alpha1::{
    Cell, CellTemplate, CoreTemplate, MultigresCluster, Shard, ShardTemplate, TableGroup,
    TopoServer,
};

/// Failure to turn a generated CRD into its final form.
#[derive(Debug, thiserror::Error)]
pub enum CrdError {
    /// The CRD did not round-trip through JSON after post-processing.
    #[error("CRD {name} does not round-trip through JSON: {source}")]
    Json {
        /// Name of the CRD.
        name: String,
        /// The serde error.
        source: serde_json::Error,
    },
    /// The CRD could not be written as YAML.
    #[error("CRD {name} cannot be written as YAML: {source}")]
    Yaml {
        /// Name of the CRD.
        name: String,
        /// The serde error.
        source: serde_yaml::Error,
    },
}

/// Every CRD of the API, in a fixed order, ready to install.
pub fn all_crds() -> Vec<CustomResourceDefinition> {
    [
        MultigresCluster::crd(),
        CoreTemplate::crd(),
        CellTemplate::crd(),
        ShardTemplate::crd(),
        Cell::crd(),
        TableGroup::crd(),
        Shard::crd(),
        TopoServer::crd(),
    ]
    .into_iter()
    .map(|crd| finalize(crd).expect("generated CRDs always round-trip through JSON"))
    .collect()
}

/// File name of a CRD under `deploy/crds/`: `<plural>.<group>.yaml`.
pub fn file_name(crd: &CustomResourceDefinition) -> String {
    format!("{}.yaml", crd.metadata.name.as_deref().unwrap_or_default())
}

/// The committed YAML form of a CRD: a comment header, then the object.
pub fn to_yaml(crd: &CustomResourceDefinition) -> Result<String, CrdError> {
    let name = || crd.metadata.name.clone().unwrap_or_default();
    let mut value = serde_json::to_value(crd).map_err(|source| CrdError::Json {
        name: name(),
        source,
    })?;
    integral_numbers(&mut value);
    let body = serde_yaml::to_string(&value).map_err(|source| CrdError::Yaml {
        name: name(),
        source,
    })?;
    // Each file starts a YAML document, so the files concatenate into one valid stream
    // (`helm show crds | kubectl apply -f -`, `cat deploy/crds/*.yaml`).
    Ok(format!(
        "---\n# Generated from the Rust types in api/ by `cargo run -p multigres-api --bin crdgen`.\n\
         # Do not edit: change the types and regenerate.\n{body}"
    ))
}

/// Applies the schema post-processing to one generated CRD.
fn finalize(crd: CustomResourceDefinition) -> Result<CustomResourceDefinition, CrdError> {
    let name = crd.metadata.name.clone().unwrap_or_default();
    let mut value = serde_json::to_value(crd).map_err(|source| CrdError::Json {
        name: name.clone(),
        source,
    })?;
    if let Some(versions) = value
        .pointer_mut("/spec/versions")
        .and_then(Value::as_array_mut)
    {
        for version in versions {
            if let Some(schema) = version.pointer_mut("/schema/openAPIV3Schema") {
                strip_nullable(schema);
                map_pattern_properties(schema);
                unwrap_descriptions(schema);
                describe_root(schema);
            }
        }
    }
    serde_json::from_value(value).map_err(|source| CrdError::Json { name, source })
}

/// Removes `nullable: true` and `null` enum members that schemars adds for `Option` fields.
///
/// Optional fields are never serialized as `null`, and a nullable field would make `has()` true
/// for an explicit `null` in CEL rules; without `nullable` the API server drops such nulls, as
/// it does for the upstream Go operator's CRDs.
fn strip_nullable(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.remove("nullable");
            if let Some(Value::Array(members)) = map.get_mut("enum") {
                members.retain(|member| !member.is_null());
            }
            map.values_mut().for_each(strip_nullable);
        }
        Value::Array(items) => items.iter_mut().for_each(strip_nullable),
        _ => {}
    }
}

/// Turns the `patternProperties` schemars emits for maps keyed by a constrained name into plain
/// `additionalProperties`: structural schemas cannot constrain map keys (CEL rules on the map do
/// that where it matters).
fn map_pattern_properties(value: &mut Value) {
    match value {
        Value::Object(map) => {
            if let Some(Value::Object(patterns)) = map.remove("patternProperties")
                && let Some(values) = patterns.into_iter().map(|(_, schema)| schema).next()
            {
                map.insert("additionalProperties".to_owned(), values);
            }
            map.values_mut().for_each(map_pattern_properties);
        }
        Value::Array(items) => items.iter_mut().for_each(map_pattern_properties),
        _ => {}
    }
}

/// Joins the hard-wrapped lines of doc comments, keeping blank-line paragraph breaks, so
/// `kubectl explain` can wrap descriptions to the terminal.
fn unwrap_descriptions(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (key, child) in map.iter_mut() {
                match child {
                    Value::String(text) if key == "description" => *text = unwrap_lines(text),
                    _ => unwrap_descriptions(child),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(unwrap_descriptions),
        _ => {}
    }
}

/// `text` with single line breaks replaced by spaces and paragraphs kept.
fn unwrap_lines(text: &str) -> String {
    text.split("\n\n")
        .map(|paragraph| {
            paragraph
                .split('\n')
                .map(str::trim)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect::<Vec<_>>()
        .join("\n\n")
}

/// Rewrites whole floating-point numbers (e.g. `minimum: 1.0`) as integers, as controller-gen
/// writes them, for readable YAML.
fn integral_numbers(value: &mut Value) {
    match value {
        Value::Number(number) => {
            if let Some(float) = number
                .as_f64()
                .filter(|f| number.is_f64() && f.fract() == 0.0)
            {
                *value = Value::from(float as i64);
            }
        }
        Value::Object(map) => map.values_mut().for_each(integral_numbers),
        Value::Array(items) => items.iter_mut().for_each(integral_numbers),
        _ => {}
    }
}

/// Gives the standard top-level fields a description, so `kubectl explain <kind>` documents
/// every field.
fn describe_root(schema: &mut Value) {
    let standard = [
        (
            "apiVersion",
            "Versioned schema of this object: multigres.com/v1alpha1.",
        ),
        ("kind", "Kind of this object."),
        ("metadata", "Standard object metadata."),
        (
            "spec",
            "Desired state, written by the user or the operator.",
        ),
        ("status", "Observed state, written by the operator."),
    ];
    let Some(properties) = schema.get_mut("properties").and_then(Value::as_object_mut) else {
        return;
    };
    for (field, description) in standard {
        if let Some(Value::Object(property)) = properties.get_mut(field) {
            property
                .entry("description")
                .or_insert_with(|| Value::String(description.to_owned()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strip_nullable_removes_nullable_and_null_enum_members() {
        let mut schema = json!({
            "type": "object",
            "properties": {
                "phase": {"type": "string", "enum": ["A", null], "nullable": true},
                "nested": {"type": "object", "nullable": true, "properties": {
                    "x": {"type": "integer", "nullable": true}
                }}
            }
        });
        strip_nullable(&mut schema);
        assert_eq!(
            schema,
            json!({
                "type": "object",
                "properties": {
                    "phase": {"type": "string", "enum": ["A"]},
                    "nested": {"type": "object", "properties": {"x": {"type": "integer"}}}
                }
            })
        );
    }

    #[test]
    fn pattern_properties_become_additional_properties() {
        let mut schema = json!({"type": "object", "additionalProperties": false,
            "patternProperties": {"^a$": {"type": "string"}}});
        map_pattern_properties(&mut schema);
        assert_eq!(
            schema,
            json!({"type": "object", "additionalProperties": {"type": "string"}})
        );
    }

    #[test]
    fn unwrap_lines_joins_lines_and_keeps_paragraphs() {
        assert_eq!(
            unwrap_lines("one\ntwo\n\nthree\n four"),
            "one two\n\nthree four"
        );
    }

    #[test]
    fn integral_numbers_become_integers() {
        let mut value = json!({"minimum": 1.0, "maximum": 2.5, "n": 3});
        integral_numbers(&mut value);
        assert_eq!(value.to_string(), r#"{"maximum":2.5,"minimum":1,"n":3}"#);
    }

    #[test]
    fn describe_root_keeps_existing_descriptions() {
        let mut schema = json!({"properties": {
            "kind": {"type": "string"},
            "spec": {"type": "object", "description": "Mine."}
        }});
        describe_root(&mut schema);
        assert_eq!(
            schema["properties"]["kind"]["description"],
            "Kind of this object."
        );
        assert_eq!(schema["properties"]["spec"]["description"], "Mine.");
    }
}
