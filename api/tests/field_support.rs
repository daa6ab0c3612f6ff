//! The field-support registry against the generated CRDs and its documentation: every field a
//! user can set on MultigresCluster, CoreTemplate, CellTemplate and ShardTemplate is classified
//! by exactly one entry, no entry names a field that no longer exists, and
//! `docs/field-support.md` shows the registry as it is.

mod common;

use multigres_api::field_support::{
    self, CoverageProblem, DOC_MARKERS, FIELDS, Kind, schema_leaves,
};
use serde_json::Value;

fn object_schema(kind: Kind) -> Value {
    let crd = common::crds()
        .iter()
        .find(|crd| crd.spec.names.kind == kind.name())
        .unwrap_or_else(|| panic!("no CRD for {}", kind.name()));
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
fn every_spec_field_is_classified_by_exactly_one_entry() {
    let problems: Vec<CoverageProblem> = Kind::ALL
        .into_iter()
        .flat_map(|kind| field_support::coverage_problems(kind, &object_schema(kind)))
        .collect();
    let listed: Vec<String> = problems.iter().map(ToString::to_string).collect();
    assert!(listed.is_empty(), "{}", listed.join("\n"));
    let leaves = schema_leaves(&object_schema(Kind::MultigresCluster));
    assert!(
        leaves.len() > 200,
        "the MultigresCluster schema walk found only {} leaves",
        leaves.len()
    );
}

#[test]
fn a_new_or_renamed_field_is_reported() {
    let mut schema = object_schema(Kind::ShardTemplate);
    let spec = schema
        .pointer_mut("/properties/spec/properties")
        .and_then(Value::as_object_mut)
        .expect("spec properties");
    let moved = spec.remove("initdbArgs").expect("initdbArgs");
    spec.insert("initdbArguments".to_owned(), moved);
    let problems = field_support::coverage_problems(Kind::ShardTemplate, &schema);
    assert_eq!(
        problems,
        [
            CoverageProblem::Unclassified {
                kind: Kind::ShardTemplate,
                path: "spec.initdbArguments".to_owned(),
            },
            CoverageProblem::Stale {
                kind: Kind::ShardTemplate,
                path: "spec.initdbArgs",
            },
        ]
    );
}

#[test]
fn unimplemented_entries_explain_themselves() {
    for field in FIELDS {
        let text = match field.support {
            field_support::Support::Implemented(note) => note,
            field_support::Support::NotYetImplemented { reason, .. } => reason,
        };
        assert!(
            !text.trim().is_empty() && !text.contains('|') && !text.contains('\n'),
            "{:?} {}: the note must be one non-empty table cell",
            field.kind,
            field.path
        );
    }
}

#[test]
fn the_documentation_shows_the_registry() {
    let path = common::repo_root().join("docs/field-support.md");
    let text = std::fs::read_to_string(&path).expect("docs/field-support.md");
    let (begin, end) = DOC_MARKERS;
    let start = text.find(begin).expect("begin marker") + begin.len();
    let stop = text.find(end).expect("end marker");
    let expected = field_support::markdown();
    if text[start..stop] == expected {
        return;
    }
    if std::env::var_os("UPDATE_FIELD_SUPPORT_DOC").is_some() {
        let updated = format!("{}{expected}{}", &text[..start], &text[stop..]);
        std::fs::write(&path, updated).expect("write docs/field-support.md");
        return;
    }
    panic!(
        "docs/field-support.md is out of date with api/src/field_support.rs: run \
         `UPDATE_FIELD_SUPPORT_DOC=1 cargo test -p multigres-api --test field_support` and commit \
         the result"
    );
}
