//! What to run in a shard's PostgreSQL so its roles are as desired: pure.
//!
//! [`OBSERVE`] reads the managed roles as they are (one JSON row); [`plan`] compares them with
//! [`DesiredRole`]s and gives the statements, each with a description that holds no secret.
//! Role names are quoted as identifiers and every literal is quoted too; passwords go as
//! SCRAM verifiers ([`super::scram`]).

use std::collections::BTreeSet;

use multigres_api::managed_roles::DesiredRole;
use serde::Deserialize;

use super::scram;

/// A role as PostgreSQL holds it, from [`observe`].
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct Observed {
    pub name: String,
    pub login: bool,
    pub superuser: bool,
    pub createrole: bool,
    pub createdb: bool,
    pub replication: bool,
    pub bypassrls: bool,
    pub inherit: bool,
    pub connection_limit: i32,
    /// Seconds since the epoch; `None`: never expires.
    pub valid_until: Option<i64>,
    /// `rolpassword`: a verifier, or none.
    pub password: Option<String>,
    pub member_of: Vec<String>,
    /// Whether a schema of the role's name exists, and whether the role owns it.
    pub schema_exists: bool,
    pub schema_owned: bool,
    /// Which of the tables asked about exist and the role may read.
    pub reads: Vec<String>,
    /// Which of the tables asked about exist.
    pub tables: Vec<String>,
}

/// One statement and what it does, in words with no secret in them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Statement {
    pub sql: String,
    pub describe: String,
}

/// The query reading `roles` (and, for the read grants, `tables`), answering one row with one
/// JSON array of [`Observed`].
pub fn observe<'a>(roles: impl IntoIterator<Item = &'a str>, tables: &[String]) -> String {
    let names = roles
        .into_iter()
        .map(literal)
        .collect::<Vec<_>>()
        .join(", ");
    let tables = if tables.is_empty() {
        "ARRAY[]::text[]".to_owned()
    } else {
        format!(
            "ARRAY[{}]::text[]",
            tables
                .iter()
                .map(|t| literal(t))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    format!(
        "SELECT coalesce(json_agg(json_build_object(\
         'name', r.rolname, 'login', r.rolcanlogin, 'superuser', r.rolsuper, \
         'createrole', r.rolcreaterole, 'createdb', r.rolcreatedb, \
         'replication', r.rolreplication, 'bypassrls', r.rolbypassrls, \
         'inherit', r.rolinherit, 'connection_limit', r.rolconnlimit, \
         'valid_until', CASE WHEN r.rolvaliduntil IS NULL OR r.rolvaliduntil = 'infinity' \
         THEN NULL ELSE floor(extract(epoch FROM r.rolvaliduntil))::bigint END, \
         'password', r.rolpassword, \
         'member_of', (SELECT coalesce(json_agg(DISTINCT g.rolname), '[]'::json) \
         FROM pg_auth_members m JOIN pg_roles g ON g.oid = m.roleid WHERE m.member = r.oid), \
         'schema_exists', EXISTS (SELECT 1 FROM pg_namespace n WHERE n.nspname = r.rolname), \
         'schema_owned', EXISTS (SELECT 1 FROM pg_namespace n \
         WHERE n.nspname = r.rolname AND n.nspowner = r.oid), \
         'tables', (SELECT coalesce(json_agg(t), '[]'::json) FROM unnest({tables}) t \
         WHERE to_regclass(t) IS NOT NULL), \
         'reads', (SELECT coalesce(json_agg(t), '[]'::json) FROM unnest({tables}) t \
         WHERE to_regclass(t) IS NOT NULL \
         AND has_schema_privilege(r.oid, split_part(t, '.', 1), 'USAGE') \
         AND has_table_privilege(r.oid, t, 'SELECT')))), '[]'::json)::text \
         FROM pg_authid r WHERE r.rolname IN ({names})"
    )
}

/// The answer of [`observe`], parsed.
pub fn parse(answer: &str) -> Result<Vec<Observed>, serde_json::Error> {
    serde_json::from_str(answer)
}

/// The statements that make `observed` (`None`: no such role) into `desired`, whose password
/// (when it has a source) is `password`.
pub fn plan(
    desired: &DesiredRole,
    password: Option<&[u8]>,
    observed: Option<&Observed>,
) -> Vec<Statement> {
    let name = identifier(&desired.name);
    let role = &desired.name;
    let Some(observed) = observed else {
        if !desired.present {
            return Vec::new();
        }
        let mut create = Statement {
            sql: format!("CREATE ROLE {name} WITH {}", attributes(desired)),
            describe: format!("created role {role}"),
        };
        if let Some(password) = password {
            create.sql.push_str(&format!(
                " PASSWORD {}",
                literal(&scram::verifier(password))
            ));
            create.describe.push_str(" with its password");
        }
        let mut statements = vec![create];
        statements.extend(desired.in_roles.iter().map(|g| grant(role, g)));
        statements.extend(schema(desired, None));
        statements.extend(reads(desired, None));
        return statements;
    };
    if !desired.present {
        return vec![Statement {
            sql: format!("DROP ROLE {name}"),
            describe: format!("dropped role {role}"),
        }];
    }
    let mut statements = Vec::new();
    if !attributes_match(desired, observed) {
        statements.push(Statement {
            sql: format!("ALTER ROLE {name} WITH {}", attributes(desired)),
            describe: format!("set the attributes of role {role}"),
        });
    }
    if let Some(password) = password
        && !observed
            .password
            .as_deref()
            .is_some_and(|stored| scram::matches(stored, password))
    {
        statements.push(Statement {
            sql: format!(
                "ALTER ROLE {name} WITH PASSWORD {}",
                literal(&scram::verifier(password))
            ),
            describe: format!("set the password of role {role} from its Secret"),
        });
    }
    let held: BTreeSet<&str> = observed.member_of.iter().map(String::as_str).collect();
    let wanted: BTreeSet<&str> = desired.in_roles.iter().map(String::as_str).collect();
    statements.extend(wanted.difference(&held).map(|g| grant(role, g)));
    statements.extend(held.difference(&wanted).map(|g| Statement {
        sql: format!("REVOKE {} FROM {name}", identifier(g)),
        describe: format!("revoked membership of role {role} in {g}"),
    }));
    statements.extend(schema(desired, Some(observed)));
    statements.extend(reads(desired, Some(observed)));
    statements
}

fn attributes(desired: &DesiredRole) -> String {
    let login = if desired.login { "LOGIN" } else { "NOLOGIN" };
    let until = desired
        .valid_until
        .map_or_else(|| "infinity".to_owned(), |t| t.to_string());
    format!(
        "{login} NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS INHERIT \
         CONNECTION LIMIT {} VALID UNTIL {}",
        desired.connection_limit,
        literal(&until)
    )
}

fn attributes_match(desired: &DesiredRole, observed: &Observed) -> bool {
    observed.login == desired.login
        && !observed.superuser
        && !observed.createdb
        && !observed.createrole
        && !observed.replication
        && !observed.bypassrls
        && observed.inherit
        && observed.connection_limit == desired.connection_limit
        && observed.valid_until == desired.valid_until.map(|t| t.as_second())
}

fn grant(role: &str, group: &str) -> Statement {
    Statement {
        sql: format!("GRANT {} TO {}", identifier(group), identifier(role)),
        describe: format!("granted role {role} membership in {group}"),
    }
}

fn schema(desired: &DesiredRole, observed: Option<&Observed>) -> Option<Statement> {
    if !desired.owns_schema || observed.is_some_and(|o| o.schema_owned) {
        return None;
    }
    let (role, name) = (&desired.name, identifier(&desired.name));
    Some(if observed.is_some_and(|o| o.schema_exists) {
        Statement {
            sql: format!("ALTER SCHEMA {name} OWNER TO {name}"),
            describe: format!("gave role {role} the schema {role}"),
        }
    } else {
        Statement {
            sql: format!("CREATE SCHEMA IF NOT EXISTS {name} AUTHORIZATION {name}"),
            describe: format!("created schema {role}, owned by role {role}"),
        }
    })
}

/// Read grants on the tables that exist (a shard's Multigres tables appear once its first
/// primary has run).
fn reads(desired: &DesiredRole, observed: Option<&Observed>) -> Vec<Statement> {
    let Some(observed) = observed else {
        // Created now: the grants come with the check that follows at once, which sees which
        // tables exist.
        return Vec::new();
    };
    desired
        .reads
        .iter()
        .filter(|t| observed.tables.contains(t) && !observed.reads.contains(t))
        .flat_map(|table| {
            let (schema, name) = table.split_once('.').unwrap_or(("public", table));
            let (s, r) = (identifier(schema), identifier(&desired.name));
            [
                Statement {
                    sql: format!("GRANT USAGE ON SCHEMA {s} TO {r}"),
                    describe: format!("let role {} use schema {schema}", desired.name),
                },
                Statement {
                    sql: format!("GRANT SELECT ON {s}.{} TO {r}", identifier(name)),
                    describe: format!("let role {} read {table}", desired.name),
                },
            ]
        })
        .collect()
}

/// `name` as a quoted SQL identifier.
pub fn identifier(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `value` as a quoted SQL string literal (standard-conforming strings, the default).
pub fn literal(value: &str) -> String {
    format!("'{}'", value.replace('\'', "''"))
}

#[cfg(test)]
mod tests;
