use k8s_openapi::jiff::Timestamp;
use multigres_api::managed_roles::{DesiredRole, PasswordSource};

use super::*;

fn app() -> DesiredRole {
    DesiredRole {
        name: "app".into(),
        present: true,
        login: true,
        connection_limit: -1,
        valid_until: None,
        in_roles: Vec::new(),
        password: Some(PasswordSource {
            secret: "c-app".into(),
            key: "password".into(),
            generated: true,
        }),
        owns_schema: true,
        reads: Vec::new(),
    }
}

fn as_planned(role: &DesiredRole, password: &[u8]) -> Observed {
    Observed {
        name: role.name.clone(),
        login: role.login,
        inherit: true,
        connection_limit: role.connection_limit,
        valid_until: role.valid_until.map(|t| t.as_second()),
        password: Some(scram::verifier(password)),
        member_of: role.in_roles.clone(),
        schema_exists: role.owns_schema,
        schema_owned: role.owns_schema,
        reads: role.reads.clone(),
        tables: role.reads.clone(),
        ..Default::default()
    }
}

fn sql(statements: &[Statement]) -> Vec<&str> {
    statements.iter().map(|s| s.sql.as_str()).collect()
}

#[test]
fn a_missing_role_is_created_with_a_verifier_and_its_schema() {
    let statements = plan(&app(), Some(b"pw"), None);
    assert_eq!(statements.len(), 2);
    let create = &statements[0].sql;
    assert!(
        create.starts_with(
            "CREATE ROLE \"app\" WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION \
             NOBYPASSRLS INHERIT CONNECTION LIMIT -1 VALID UNTIL 'infinity' PASSWORD \
             'SCRAM-SHA-256$4096:"
        ),
        "{create}"
    );
    assert!(!create.contains("'pw'"));
    assert_eq!(
        statements[1].sql,
        "CREATE SCHEMA IF NOT EXISTS \"app\" AUTHORIZATION \"app\""
    );
    assert_eq!(statements[0].describe, "created role app with its password");
}

#[test]
fn a_role_as_desired_needs_nothing() {
    let mut role = app();
    role.in_roles = vec!["pg_monitor".into()];
    role.valid_until = Some("2027-01-01T00:00:00Z".parse::<Timestamp>().unwrap());
    role.connection_limit = 5;
    let observed = as_planned(&role, b"pw");
    assert_eq!(plan(&role, Some(b"pw"), Some(&observed)), Vec::new());
}

#[test]
fn a_changed_secret_sets_the_password_and_nothing_else() {
    let observed = as_planned(&app(), b"old");
    let statements = plan(&app(), Some(b"new"), Some(&observed));
    assert_eq!(statements.len(), 1);
    assert!(
        statements[0]
            .sql
            .starts_with("ALTER ROLE \"app\" WITH PASSWORD 'SCRAM-SHA-256$")
    );
    assert_eq!(
        statements[0].describe,
        "set the password of role app from its Secret"
    );
}

#[test]
fn a_role_without_a_password_source_keeps_whatever_password_it_has() {
    let mut role = app();
    role.password = None;
    let observed = as_planned(&role, b"set by hand");
    assert_eq!(plan(&role, None, Some(&observed)), Vec::new());
}

#[test]
fn attributes_memberships_and_schema_are_brought_back() {
    let mut role = app();
    role.in_roles = vec!["pg_monitor".into(), "reporting".into()];
    role.login = false;
    let mut observed = as_planned(&role, b"pw");
    observed.login = true;
    observed.superuser = true;
    observed.member_of = vec!["pg_monitor".into(), "pg_write_all_data".into()];
    observed.schema_owned = false;
    assert_eq!(
        sql(&plan(&role, Some(b"pw"), Some(&observed))),
        [
            "ALTER ROLE \"app\" WITH NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION \
             NOBYPASSRLS INHERIT CONNECTION LIMIT -1 VALID UNTIL 'infinity'",
            "GRANT \"reporting\" TO \"app\"",
            "REVOKE \"pg_write_all_data\" FROM \"app\"",
            "ALTER SCHEMA \"app\" OWNER TO \"app\"",
        ]
    );
}

#[test]
fn an_absent_role_is_dropped_once() {
    let mut role = app();
    role.present = false;
    let observed = as_planned(&app(), b"pw");
    assert_eq!(
        sql(&plan(&role, None, Some(&observed))),
        ["DROP ROLE \"app\""]
    );
    assert_eq!(plan(&role, None, None), Vec::new());
}

#[test]
fn read_grants_wait_for_their_tables() {
    let mut role = app();
    role.owns_schema = false;
    role.reads = vec!["multigres.shard".into(), "multigres.tablegroup".into()];
    let mut observed = as_planned(&role, b"pw");
    observed.reads = Vec::new();
    observed.tables = vec!["multigres.shard".into()];
    assert_eq!(
        sql(&plan(&role, Some(b"pw"), Some(&observed))),
        [
            "GRANT USAGE ON SCHEMA \"multigres\" TO \"app\"",
            "GRANT SELECT ON \"multigres\".\"shard\" TO \"app\"",
        ]
    );
}

#[test]
fn names_and_values_are_quoted() {
    assert_eq!(identifier("we\"ird"), "\"we\"\"ird\"");
    assert_eq!(literal("it's"), "'it''s'");
    let query = observe(["app", "o'neil"], &["multigres.shard".into()]);
    assert!(
        query.ends_with("WHERE r.rolname IN ('app', 'o''neil')"),
        "{query}"
    );
    assert!(query.contains("unnest(ARRAY['multigres.shard']::text[])"));
}

#[test]
fn the_observation_answer_parses() {
    let answer = r#"[{"name":"app","login":true,"superuser":false,"createrole":false,
        "createdb":false,"replication":false,"bypassrls":false,"inherit":true,
        "connection_limit":-1,"valid_until":null,"password":null,"member_of":[],
        "schema_exists":true,"schema_owned":true,"tables":[],"reads":[]}]"#;
    let observed = parse(answer).unwrap();
    assert_eq!(observed[0].name, "app");
    assert_eq!(observed[0].password, None);
    assert_eq!(parse("[]").unwrap(), Vec::new());
}
