//! The generated CRDs: committed YAML up to date, structural schemas, size, descriptions,
//! names, subresources and CEL rules that compile within cost.

mod common;

use std::collections::BTreeSet;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::core::cel::compile_schema;
use multigres_api::crd::{file_name, to_yaml};
use serde::Deserialize;
use serde_json::Value;

fn schema(crd: &CustomResourceDefinition) -> Value {
    serde_json::to_value(
        crd.spec.versions[0]
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .expect("schema"),
    )
    .expect("schema serializes")
}

#[test]
fn committed_crds_match_the_rust_types() {
    let dir = common::repo_root().join("deploy/crds");
    let mut stale = Vec::new();
    for crd in common::crds() {
        let path = dir.join(file_name(crd));
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        if committed != to_yaml(crd).expect("YAML") {
            stale.push(path.display().to_string());
        }
    }
    assert!(
        stale.is_empty(),
        "deploy/crds is out of date with the Rust types: run `just crds` \
         (or `cargo run -q -p multigres-api --bin crdgen`) and commit the result. Stale: {stale:?}"
    );
}

#[test]
fn deploy_crds_holds_exactly_the_generated_files() {
    let expected: BTreeSet<String> = common::crds().iter().map(file_name).collect();
    let present: BTreeSet<String> = common::yaml_files("deploy/crds")
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        present, expected,
        "unexpected or missing files in deploy/crds"
    );
}

#[test]
fn the_crd_files_concatenate_into_one_stream_of_every_crd() {
    // What `helm show crds` and `cat deploy/crds/*.yaml | kubectl apply -f -` produce.
    let stream: String = common::yaml_files("deploy/crds")
        .iter()
        .map(|p| std::fs::read_to_string(p).expect("CRD file"))
        .collect();
    let names: BTreeSet<String> = serde_yaml::Deserializer::from_str(&stream)
        .map(|doc| {
            let crd = CustomResourceDefinition::deserialize(doc).expect("a CRD per document");
            crd.metadata.name.expect("CRD name")
        })
        .collect();
    let expected: BTreeSet<String> = common::crds()
        .iter()
        .filter_map(|c| c.metadata.name.clone())
        .collect();
    assert_eq!(names, expected);
}

/// Walks a schema node, collecting structural-schema violations.
fn structural_violations(node: &Value, path: &str, out: &mut Vec<String>) {
    let Value::Object(map) = node else { return };
    if map.contains_key("$ref") {
        out.push(format!("{path}: $ref"));
    }
    for forbidden in ["patternProperties", "nullable", "definitions", "$defs"] {
        if map.contains_key(forbidden) {
            out.push(format!("{path}: {forbidden}"));
        }
    }
    let untyped_ok = map.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true))
        || map.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
    if !map.contains_key("type") && !untyped_ok {
        out.push(format!("{path}: no type"));
    }
    for combinator in ["anyOf", "oneOf", "allOf"] {
        if let Some(Value::Array(branches)) = map.get(combinator) {
            for (i, branch) in branches.iter().enumerate() {
                for key in ["type", "description", "default", "additionalProperties"] {
                    if branch.get(key).is_some() {
                        out.push(format!("{path}.{combinator}[{i}]: {key}"));
                    }
                }
            }
        }
    }
    if let Some(Value::Object(properties)) = map.get("properties") {
        for (name, child) in properties {
            structural_violations(child, &format!("{path}.{name}"), out);
        }
    }
    if let Some(items) = map.get("items") {
        structural_violations(items, &format!("{path}[]"), out);
    }
    if let Some(values @ Value::Object(_)) = map.get("additionalProperties") {
        structural_violations(values, &format!("{path}{{}}"), out);
    }
}

#[test]
fn schemas_are_structural() {
    let mut violations = Vec::new();
    for crd in common::crds() {
        structural_violations(&schema(crd), &crd.spec.names.kind, &mut violations);
    }
    assert!(
        violations.is_empty(),
        "non-structural schema: {violations:#?}"
    );
}

#[test]
fn structural_check_catches_violations() {
    let bad = serde_json::json!({
        "type": "object",
        "properties": {
            "a": {"$ref": "#/x"},
            "b": {"anyOf": [{"type": "string"}], "type": "string"},
            "c": {"description": "no type"}
        }
    });
    let mut violations = Vec::new();
    structural_violations(&bad, "X", &mut violations);
    assert_eq!(
        violations,
        [
            "X.a: $ref",
            "X.a: no type",
            "X.b.anyOf[0]: type",
            "X.c: no type"
        ]
    );
}

#[test]
fn every_crd_is_far_below_the_object_size_limit() {
    const LIMIT: usize = 1024 * 1024;
    for crd in common::crds() {
        let size = serde_json::to_vec(&crd).expect("JSON").len();
        println!(
            "{}: {size} bytes of JSON",
            crd.metadata.name.as_deref().unwrap()
        );
        assert!(size < LIMIT / 2, "{} is {size} bytes", crd.spec.names.kind);
    }
}

fn undescribed(node: &Value, path: &str, out: &mut Vec<String>) {
    let Value::Object(map) = node else { return };
    if let Some(Value::Object(properties)) = map.get("properties") {
        for (name, child) in properties {
            let here = format!("{path}.{name}");
            let described = child
                .get("description")
                .and_then(Value::as_str)
                .is_some_and(|d| !d.trim().is_empty());
            if !described {
                out.push(here.clone());
            }
            undescribed(child, &here, out);
        }
    }
    if let Some(items) = map.get("items") {
        undescribed(items, &format!("{path}[]"), out);
    }
    if let Some(values @ Value::Object(_)) = map.get("additionalProperties") {
        undescribed(values, &format!("{path}{{}}"), out);
    }
}

#[test]
fn every_field_has_a_description() {
    let mut missing = Vec::new();
    for crd in common::crds() {
        undescribed(&schema(crd), &crd.spec.names.kind, &mut missing);
    }
    assert!(
        missing.is_empty(),
        "fields without description: {missing:#?}"
    );
}

#[test]
fn names_categories_and_subresources_match_upstream() {
    let expected = [
        ("MultigresCluster", "multigresclusters", "mgc", true),
        ("CoreTemplate", "coretemplates", "cot", false),
        ("CellTemplate", "celltemplates", "cet", false),
        ("ShardTemplate", "shardtemplates", "sht", false),
        ("Cell", "cells", "cel", true),
        ("TableGroup", "tablegroups", "tbg", true),
        ("Shard", "shards", "srd", true),
        ("TopoServer", "toposervers", "tps", true),
    ];
    let crds = common::crds();
    assert_eq!(crds.len(), expected.len());
    for (crd, (kind, plural, short, has_status)) in crds.iter().zip(expected) {
        assert_eq!(crd.spec.names.kind, kind);
        assert_eq!(crd.spec.group, multigres_api::GROUP);
        assert_eq!(crd.spec.scope, "Namespaced");
        assert_eq!(crd.spec.names.plural, plural);
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some(format!("{plural}.multigres.com").as_str())
        );
        assert_eq!(
            crd.spec.names.short_names.as_deref(),
            Some(&[short.to_owned()][..])
        );
        assert_eq!(
            crd.spec.names.categories.as_deref(),
            Some(&[multigres_api::CATEGORY.to_owned()][..])
        );
        let version = &crd.spec.versions[0];
        assert_eq!(version.name, multigres_api::VERSION);
        assert!(version.served && version.storage);
        let subresources = version.subresources.as_ref();
        assert_eq!(
            subresources.and_then(|s| s.status.as_ref()).is_some(),
            has_status,
            "{kind}"
        );
        let scale = subresources.and_then(|s| s.scale.as_ref());
        if kind == "Shard" {
            let scale = scale.expect("Shard has a scale subresource");
            assert_eq!(scale.spec_replicas_path, ".spec.replicas");
            assert_eq!(scale.status_replicas_path, ".status.readyReplicas");
        } else {
            assert!(scale.is_none(), "{kind} has no scale subresource");
        }
    }
}

#[test]
fn printer_columns_follow_upstream() {
    let columns = |kind: &str| -> Vec<(String, String)> {
        let crd = common::crds()
            .iter()
            .find(|c| c.spec.names.kind == kind)
            .unwrap();
        crd.spec.versions[0]
            .additional_printer_columns
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|c| (c.name, c.json_path))
            .collect()
    };
    let available = ".status.conditions[?(@.type=='Available')].status";
    let cluster = columns("MultigresCluster");
    assert!(cluster.contains(&("Available".into(), available.into())));
    assert!(cluster.contains(&("Images".into(), ".status.images.appliedRevision".into())));
    assert!(columns("Cell").contains(&("Gateway".into(), ".status.gatewayReadyReplicas".into())));
    assert!(columns("TableGroup").contains(&("Shards".into(), ".status.readyShards".into())));
    for kind in ["Cell", "Shard", "TopoServer"] {
        assert!(
            columns(kind).contains(&("Ready".into(), available.into())),
            "{kind}"
        );
    }
    for kind in [
        "MultigresCluster",
        "Cell",
        "TableGroup",
        "Shard",
        "TopoServer",
    ] {
        assert!(
            columns(kind).contains(&("Phase".into(), ".status.phase".into())),
            "{kind}"
        );
    }
}

/// Collects every `(path, rule, message)` of a schema.
fn rules(node: &Value, path: &str, out: &mut Vec<(String, String, Option<String>)>) {
    let Value::Object(map) = node else { return };
    if let Some(Value::Array(validations)) = map.get("x-kubernetes-validations") {
        for v in validations {
            out.push((
                path.to_owned(),
                v["rule"].as_str().unwrap_or_default().to_owned(),
                v.get("message").and_then(Value::as_str).map(str::to_owned),
            ));
        }
    }
    if let Some(Value::Object(properties)) = map.get("properties") {
        for (name, child) in properties {
            rules(child, &format!("{path}.{name}"), out);
        }
    }
    if let Some(items) = map.get("items") {
        rules(items, &format!("{path}[]"), out);
    }
    if let Some(values @ Value::Object(_)) = map.get("additionalProperties") {
        rules(values, &format!("{path}{{}}"), out);
    }
}

/// Cost estimates are checked by the real API server when the CRDs are installed (the e2e
/// tests); kube-cel's static analysis is too coarse for that (it cannot see comprehension
/// variables), so here every rule must compile and carry a one-line message.
#[test]
fn cel_rules_compile_and_have_messages() {
    let mut total = 0;
    for crd in common::crds() {
        let schema = schema(crd);
        let compiled = compile_schema(&schema);
        let mut found = Vec::new();
        rules(&schema, &crd.spec.names.kind, &mut found);
        total += found.len();
        for (path, rule, message) in found {
            let message = message.unwrap_or_default();
            assert!(!message.is_empty(), "{path}: rule {rule} has no message");
            assert!(!message.contains('\n'), "{path}: message has a line break");
        }
        assert_no_compile_errors(&compiled, &crd.spec.names.kind);
    }
    println!("{total} CEL rules across all CRDs");
    assert!(total > 40, "expected the upstream rules, found {total}");
}

fn assert_no_compile_errors(compiled: &kube::core::cel::CompiledSchema, path: &str) {
    let errors = compiled.compilation_errors();
    assert!(errors.is_empty(), "{path}: {errors:?}");
    for (name, child) in &compiled.properties {
        assert_no_compile_errors(child, &format!("{path}.{name}"));
    }
    if let Some(items) = &compiled.items {
        assert_no_compile_errors(items, &format!("{path}[]"));
    }
    if let Some(values) = &compiled.additional_properties {
        assert_no_compile_errors(values, &format!("{path}{{}}"));
    }
}

#[test]
fn schema_defaults_are_only_the_fixed_ones() {
    fn defaults(node: &Value, path: &str, out: &mut Vec<(String, Value)>) {
        let Value::Object(map) = node else { return };
        if let Some(default) = map.get("default") {
            out.push((path.to_owned(), default.clone()));
        }
        if let Some(Value::Object(properties)) = map.get("properties") {
            for (name, child) in properties {
                defaults(child, &format!("{path}.{name}"), out);
            }
        }
        for key in ["items", "additionalProperties"] {
            if let Some(child) = map.get(key) {
                defaults(child, &format!("{path}[{key}]"), out);
            }
        }
    }
    let mut found = Vec::new();
    for crd in common::crds() {
        defaults(&schema(crd), &crd.spec.names.kind, &mut found);
    }
    for (path, value) in &found {
        let allowed = (path.ends_with(".postgresSuperuser") && value == "postgres")
            || (path.ends_with(".implementation") && value == "etcd")
            || (path.ends_with(".samplingConfigRef.key") && value == "sampling-config.yaml")
            || (path.ends_with(".customQueries.key") && value == "queries.yaml")
            || (path.ends_with("Template.spec") && *value == serde_json::json!({}));
        assert!(allowed, "unexpected schema default at {path}: {value}");
    }
    assert!(found.iter().any(|(p, _)| p.ends_with(".postgresSuperuser")));
    assert!(
        !found.iter().any(|(p, _)| p.contains("pvcDeletionPolicy")),
        "pvcDeletionPolicy is resolved hierarchically, so it has no schema default"
    );
}
