//! The broken manifests in `e2e/fixtures/invalid/`: well-formed, with an expectation header, and
//! (for CEL rules) refused locally by exactly the rule their header names.

mod common;

use serde_json::Value;

/// Error types the API server reports for schema (non-CEL) violations.
const SCHEMA_ERRORS: [&str; 6] = [
    "Required value",
    "Unsupported value",
    "should match",
    "should be greater than or equal to",
    "should be less than or equal to",
    "Invalid value",
];
const SCHEMA_ERRORS_WITH_PATH: [&str; 2] = [": Too long", ": Too many"];

/// Schema fixtures that cannot avoid a CEL rule too: a second database necessarily has another
/// name than `postgres`.
const SCHEMA_AND_CEL: [&str; 1] = ["databases-too-many.yaml"];

struct Fixture {
    name: String,
    expect: String,
    update: bool,
    docs: Vec<Value>,
}

fn fixtures() -> Vec<Fixture> {
    let files = common::yaml_files("e2e/fixtures/invalid");
    assert!(
        files.len() >= 40,
        "expected a fixture per rule, found {}",
        files.len()
    );
    files
        .iter()
        .map(|path| {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let text = std::fs::read_to_string(path).expect("readable fixture");
            let first = text.lines().next().unwrap_or_default();
            let (update, expect) = if let Some(e) = first.strip_prefix("# expect-update: ") {
                (true, e)
            } else if let Some(e) = first.strip_prefix("# expect: ") {
                (false, e)
            } else {
                panic!("{name}: first line must be `# expect: ...` or `# expect-update: ...`");
            };
            assert!(!expect.trim().is_empty(), "{name}: empty expectation");
            Fixture {
                name,
                expect: expect.to_owned(),
                update,
                docs: common::yaml_docs(&text),
            }
        })
        .collect()
}

fn is_schema_expectation(expect: &str) -> bool {
    SCHEMA_ERRORS.iter().any(|e| expect.contains(e))
        || SCHEMA_ERRORS_WITH_PATH.iter().any(|e| expect.contains(e))
}

#[test]
fn every_fixture_has_a_header_and_the_right_number_of_documents() {
    for fixture in fixtures() {
        let expected = if fixture.update { 2 } else { 1 };
        assert_eq!(fixture.docs.len(), expected, "{}", fixture.name);
        for doc in &fixture.docs {
            assert_eq!(
                doc["apiVersion"],
                multigres_api::API_VERSION,
                "{}",
                fixture.name
            );
            let name = doc["metadata"]["name"].as_str().expect("named");
            assert!(!name.is_empty(), "{}", fixture.name);
        }
        if fixture.update {
            assert_eq!(
                fixture.docs[0]["kind"], fixture.docs[1]["kind"],
                "{}",
                fixture.name
            );
            assert_eq!(
                fixture.docs[0]["metadata"]["name"], fixture.docs[1]["metadata"]["name"],
                "{}: an update must target the same object",
                fixture.name
            );
        }
    }
}

#[test]
fn fixture_object_names_are_unique() {
    let mut seen = std::collections::BTreeMap::new();
    for fixture in fixtures() {
        let doc = &fixture.docs[0];
        let key = format!("{}/{}", doc["kind"], doc["metadata"]["name"]);
        if let Some(other) = seen.insert(key.clone(), fixture.name.clone()) {
            panic!("{key} is used by both {other} and {}", fixture.name);
        }
    }
}

#[test]
fn cel_fixtures_are_refused_locally_by_exactly_their_rule() {
    let mut checked = 0;
    for fixture in fixtures() {
        if is_schema_expectation(&fixture.expect) {
            continue;
        }
        let (object, old) = if fixture.update {
            let original = &fixture.docs[0];
            assert!(
                common::cel_errors(original, None).is_empty(),
                "{}: the original object must be valid",
                fixture.name
            );
            (&fixture.docs[1], Some(original))
        } else {
            (&fixture.docs[0], None)
        };
        let errors = common::cel_errors(object, old);
        assert!(!errors.is_empty(), "{}: accepted locally", fixture.name);
        for error in &errors {
            assert!(
                error.contains(&fixture.expect),
                "{}: expected only `{}`, got {errors:?}",
                fixture.name,
                fixture.expect
            );
        }
        checked += 1;
    }
    println!("{checked} CEL fixtures refused locally");
    assert!(checked >= 35, "only {checked} CEL fixtures");
}

#[test]
fn schema_fixtures_pass_every_cel_rule() {
    for fixture in fixtures() {
        if !is_schema_expectation(&fixture.expect)
            || SCHEMA_AND_CEL.contains(&fixture.name.as_str())
        {
            continue;
        }
        let errors = common::cel_errors(fixture.docs.last().unwrap(), None);
        assert!(
            errors.is_empty(),
            "{}: a schema fixture must fail only its schema bound, but CEL refuses it: {errors:?}",
            fixture.name
        );
    }
}
