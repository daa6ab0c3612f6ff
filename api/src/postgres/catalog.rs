//! The PostgreSQL 17 settings catalog: every server parameter with its value type and the
//! context in which a change takes effect (`pg_settings.vartype` and `pg_settings.context`).
//! Validation refuses names outside it; the rollout uses the context to tell a reload from a
//! restart.

use std::collections::BTreeMap;
use std::sync::OnceLock;

/// One line per setting: `name<TAB>type<TAB>context`, as `pg_settings` reports them.
const PG_SETTINGS_17: &str = include_str!("pg_settings_17.txt");

/// The value type of a setting (`pg_settings.vartype`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `on`/`off`, `true`/`false`, `yes`/`no`, `1`/`0` and unique prefixes of them.
    Bool,
    /// A whole number, optionally with a memory or time unit (`64MB`, `10s`).
    Integer,
    /// A floating-point number, optionally with a unit.
    Real,
    /// One of a fixed set of words.
    Enum,
    /// Free text.
    String,
}

impl Kind {
    fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "bool" => Kind::Bool,
            "integer" => Kind::Integer,
            "real" => Kind::Real,
            "enum" => Kind::Enum,
            "string" => Kind::String,
            _ => return None,
        })
    }

    /// How messages name the type, with its article.
    pub fn describe(self) -> &'static str {
        match self {
            Kind::Bool => "a boolean (on, off, true, false, yes, no, 1 or 0)",
            Kind::Integer => "an integer, optionally with a unit such as 64MB or 10s",
            Kind::Real => "a number, optionally with a unit",
            Kind::Enum => "a single word",
            Kind::String => "text",
        }
    }
}

/// When a change of a setting takes effect (`pg_settings.context`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Context {
    /// Fixed when the server was built or initialised; cannot be changed at all.
    Internal,
    /// Only at server start: a change needs a restart.
    Postmaster,
    /// On a configuration reload (SIGHUP).
    Sighup,
    /// On reload, for sessions started afterwards.
    Backend,
    /// On reload, for sessions started afterwards (superusers may also set it at connection).
    SuperuserBackend,
    /// On reload; superusers may also set it per session.
    Superuser,
    /// On reload; any user may also set it per session.
    User,
}

impl Context {
    fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "internal" => Context::Internal,
            "postmaster" => Context::Postmaster,
            "sighup" => Context::Sighup,
            "backend" => Context::Backend,
            "superuser-backend" => Context::SuperuserBackend,
            "superuser" => Context::Superuser,
            "user" => Context::User,
            _ => return None,
        })
    }

    /// Whether a changed value in postgresql.conf only takes effect after a server restart.
    pub fn needs_restart(self) -> bool {
        matches!(self, Context::Internal | Context::Postmaster)
    }
}

/// A setting of the catalog.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Setting {
    /// The name as PostgreSQL spells it (`shared_buffers`, `TimeZone`).
    pub name: &'static str,
    /// Value type.
    pub kind: Kind,
    /// When a change takes effect.
    pub context: Context,
}

fn catalog() -> &'static BTreeMap<String, Setting> {
    static CATALOG: OnceLock<BTreeMap<String, Setting>> = OnceLock::new();
    CATALOG.get_or_init(|| {
        PG_SETTINGS_17
            .lines()
            .filter(|line| !line.is_empty())
            .map(|line| {
                let mut fields = line.split('\t');
                let (Some(name), Some(kind), Some(context), None) =
                    (fields.next(), fields.next(), fields.next(), fields.next())
                else {
                    panic!("pg_settings_17.txt: malformed line {line:?}");
                };
                let setting = Setting {
                    name,
                    kind: Kind::parse(kind)
                        .unwrap_or_else(|| panic!("pg_settings_17.txt: type of {line:?}")),
                    context: Context::parse(context)
                        .unwrap_or_else(|| panic!("pg_settings_17.txt: context of {line:?}")),
                };
                (name.to_ascii_lowercase(), setting)
            })
            .collect()
    })
}

/// The setting called `name` (PostgreSQL matches names case-insensitively).
pub fn lookup(name: &str) -> Option<Setting> {
    catalog().get(&name.to_ascii_lowercase()).copied()
}

/// How many settings the catalog knows.
pub fn len() -> usize {
    catalog().len()
}

/// The known name closest to a misspelt `name`, when one is close enough to be a likely typo
/// (at most a third of its characters edited).
pub fn closest(name: &str) -> Option<&'static str> {
    let wanted = name.to_ascii_lowercase();
    let budget = (wanted.chars().count() / 3).max(1);
    catalog()
        .iter()
        .map(|(key, setting)| (edit_distance(&wanted, key), setting.name))
        .filter(|(distance, _)| *distance <= budget)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, name)| name)
}

/// Levenshtein distance over characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitution = diagonal + usize::from(ca != *cb);
            diagonal = row[j + 1];
            row[j + 1] = substitution.min(row[j] + 1).min(diagonal + 1);
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_catalog_holds_every_postgres_17_setting() {
        assert_eq!(len(), 392);
        let shared = lookup("shared_buffers").unwrap();
        assert_eq!(
            (shared.kind, shared.context),
            (Kind::Integer, Context::Postmaster)
        );
        assert!(shared.context.needs_restart());
        let work_mem = lookup("work_mem").unwrap();
        assert_eq!(
            (work_mem.kind, work_mem.context),
            (Kind::Integer, Context::User)
        );
        assert!(!work_mem.context.needs_restart());
        assert!(lookup("block_size").unwrap().context.needs_restart());
        assert!(!lookup("ssl").unwrap().context.needs_restart());
    }

    #[test]
    fn names_match_case_insensitively() {
        assert_eq!(lookup("timezone").unwrap().name, "TimeZone");
        assert_eq!(lookup("Shared_Buffers").unwrap().name, "shared_buffers");
        assert!(lookup("shared_bufers").is_none());
    }

    #[test]
    fn typos_suggest_the_intended_name_and_nonsense_suggests_nothing() {
        assert_eq!(closest("shared_bufers"), Some("shared_buffers"));
        assert_eq!(closest("max_conections"), Some("max_connections"));
        assert_eq!(closest("WORK_MEMORY"), Some("work_mem"));
        assert_eq!(closest("zzzzzzzzzzzzzzzz"), None);
    }

    #[test]
    fn edit_distance_counts_insertions_deletions_and_substitutions() {
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("same", "same"), 0);
    }
}
