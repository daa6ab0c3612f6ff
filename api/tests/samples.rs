//! The samples in `deploy/samples/`: every document parses into its typed kind, serializes back
//! without loss or nulls, passes every CEL rule, and each cluster ships the Secret it references.

mod common;

use k8s_openapi::api::core::v1::Secret;
use multigres_api::v1alpha1::{CellTemplate, CoreTemplate, MultigresCluster, ShardTemplate};
use serde::{Serialize, de::DeserializeOwned};
use serde_json::Value;

const SAMPLES: [&str; 5] = [
    "external-topo.yaml",
    "inline.yaml",
    "minimal.yaml",
    "overrides.yaml",
    "templated.yaml",
];

/// Parses `doc` as `T` and checks the typed value serializes back to the same JSON.
fn round_trip<T: Serialize + DeserializeOwned>(doc: &Value, what: &str) -> T {
    let typed: T = serde_json::from_value(doc.clone())
        .unwrap_or_else(|e| panic!("{what} does not parse: {e}"));
    let back = serde_json::to_value(&typed).expect("serializes");
    common::assert_no_nulls(&back, what);
    assert_eq!(
        &back, doc,
        "{what} changes when parsed and serialized again"
    );
    typed
}

#[test]
fn the_expected_samples_exist() {
    let present: Vec<String> = common::yaml_files("deploy/samples")
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(present, SAMPLES);
}

#[test]
fn every_sample_document_parses_into_its_kind_and_passes_cel() {
    for file in common::yaml_files("deploy/samples") {
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&file).expect("readable");
        assert!(
            text.starts_with('#'),
            "{name}: start with comments explaining the sample"
        );
        let docs = common::yaml_docs(&text);
        let mut secrets = Vec::new();
        let mut clusters = Vec::new();
        for (i, doc) in docs.iter().enumerate() {
            let what = format!("{name} document {i}");
            assert!(
                doc["metadata"].get("namespace").is_none(),
                "{what}: leave the namespace to the user"
            );
            match doc["kind"].as_str().unwrap_or_default() {
                "Secret" => secrets.push(round_trip::<Secret>(doc, &what)),
                "MultigresCluster" => clusters.push(round_trip::<MultigresCluster>(doc, &what)),
                "CoreTemplate" => drop(round_trip::<CoreTemplate>(doc, &what)),
                "CellTemplate" => drop(round_trip::<CellTemplate>(doc, &what)),
                "ShardTemplate" => drop(round_trip::<ShardTemplate>(doc, &what)),
                other => panic!("{what}: unexpected kind {other}"),
            }
            if doc["apiVersion"] == multigres_api::API_VERSION {
                let errors = common::cel_errors(doc, None);
                assert!(errors.is_empty(), "{what} is refused: {errors:?}");
            }
        }
        assert_eq!(clusters.len(), 1, "{name}: one MultigresCluster per sample");
        let reference = &clusters[0].spec.postgres_password_secret_ref;
        let secret = secrets
            .iter()
            .find(|s| s.metadata.name.as_deref() == Some(reference.name.as_str()))
            .unwrap_or_else(|| panic!("{name}: the Secret {} is missing", reference.name));
        let has_key = secret
            .string_data
            .as_ref()
            .is_some_and(|d| d.contains_key(&reference.key))
            || secret
                .data
                .as_ref()
                .is_some_and(|d| d.contains_key(&reference.key));
        assert!(has_key, "{name}: the Secret lacks key {}", reference.key);
    }
}
