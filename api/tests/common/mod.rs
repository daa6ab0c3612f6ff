//! Helpers shared by the integration tests: repository paths, YAML documents, and local CEL
//! evaluation against the generated (post-processed) CRD schemas.

#![allow(dead_code)] // each test binary uses a different subset

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{Arc, LazyLock, Mutex},
};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::core::cel::{CompiledSchema, Validator, compile_schema};
use multigres_api::crd::all_crds;
use serde_json::Value;

/// The repository root (the workspace directory).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("api/ has a parent")
        .to_path_buf()
}

/// The `.yaml` files of a repository directory, sorted.
pub fn yaml_files(relative: &str) -> Vec<PathBuf> {
    let dir = repo_root().join(relative);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml"))
        .collect();
    files.sort();
    files
}

/// Every non-empty YAML document of a multi-document text, as JSON values.
pub fn yaml_docs(text: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|doc| {
            let value: serde_yaml::Value =
                serde::Deserialize::deserialize(doc).expect("valid YAML");
            serde_json::to_value(value).expect("YAML document converts to JSON")
        })
        .filter(|doc| !doc.is_null())
        .collect()
}

/// Every CRD, generated once per test process: generating them (schemars, then our post-processing)
/// is most of a debug build's time in a CEL test, and the test harness runs each test on a thread
/// of its own.
pub fn crds() -> &'static [CustomResourceDefinition] {
    static CRDS: LazyLock<Vec<CustomResourceDefinition>> = LazyLock::new(all_crds);
    &CRDS
}

/// The openAPIV3Schema of the CRD serving `kind`.
pub fn schema_of(kind: &str) -> Value {
    let crd = crds()
        .iter()
        .find(|crd| crd.spec.names.kind == kind)
        .unwrap_or_else(|| panic!("no CRD for kind {kind}"));
    let schema = crd.spec.versions[0]
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .expect("CRD has a schema");
    serde_json::to_value(schema).expect("schema serializes")
}

/// Evaluates the CEL rules of the object's CRD locally, as the API server would on create
/// (`old` is `None`) or update. Returns the failure messages, each prefixed by its field path.
pub fn cel_errors(object: &Value, old: Option<&Value>) -> Vec<String> {
    // Compiled once per kind and process, shared by the tests' threads.
    static COMPILED: LazyLock<Mutex<HashMap<String, Arc<CompiledSchema>>>> =
        LazyLock::new(Mutex::default);
    let kind = object["kind"].as_str().expect("object has a kind");
    let schema = COMPILED
        .lock()
        .expect("no test panicked while compiling")
        .entry(kind.to_owned())
        .or_insert_with(|| Arc::new(compile_schema(&schema_of(kind))))
        .clone();
    match Validator::new().validate_compiled(&schema, object, old) {
        Ok(()) => Vec::new(),
        Err(errors) => errors.iter().map(ToString::to_string).collect(),
    }
}

/// [`cel_errors`] for YAML text.
pub fn cel_errors_yaml(object: &str, old: Option<&str>) -> Vec<String> {
    let object = single_doc(object);
    let old = old.map(single_doc);
    cel_errors(&object, old.as_ref())
}

fn single_doc(text: &str) -> Value {
    let mut docs = yaml_docs(text);
    assert_eq!(docs.len(), 1, "expected one YAML document");
    docs.remove(0)
}

/// Asserts that no JSON `null` appears anywhere in `value`.
pub fn assert_no_nulls(value: &Value, path: &str) {
    match value {
        Value::Null => panic!("null serialized at {path}"),
        Value::Object(map) => map
            .iter()
            .for_each(|(key, child)| assert_no_nulls(child, &format!("{path}.{key}"))),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .for_each(|(i, child)| assert_no_nulls(child, &format!("{path}[{i}]"))),
        _ => {}
    }
}
