//! Validation of PostgreSQL settings before they reach PostgreSQL, the `postgresConfig` map and
//! the content of a `postgresConfigRef` ConfigMap alike: a parameter PostgreSQL does not know,
//! one [`policy`] refuses (fixed by the operator or Multigres, or a way to run commands or load
//! code), a library the image does not ship, or a value of the wrong type would stop the server
//! from starting, be ignored, or hand out a shell, so each is refused with the parameter it
//! concerns and what is allowed.

use std::collections::BTreeMap;
use std::fmt;

use super::catalog::{self, Context, Kind};
use super::conf::is_valid_name;
use super::limits::{self, Limit};
use super::policy;

/// One refused entry of a `postgresConfig` map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// The parameter, as the user wrote it.
    pub name: String,
    /// What is wrong and what is allowed.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "postgresConfig.{}: {}", self.name, self.message)
    }
}

/// Every problem of a `postgresConfig` map, in name order, then a `max_connections` that
/// leaves multipooler's pools nothing (see [`super::connections`]); empty when PostgreSQL
/// accepts it and the pools fit.
pub fn validate(config: &BTreeMap<String, String>) -> Vec<Problem> {
    let mut problems: Vec<Problem> = config
        .iter()
        .filter_map(|(name, value)| {
            check(name, value).err().map(|message| Problem {
                name: name.clone(),
                message,
            })
        })
        .collect();
    let lowered: BTreeMap<String, String> = config
        .iter()
        .map(|(name, value)| (name.to_ascii_lowercase(), value.clone()))
        .collect();
    let sizes = [
        "max_connections",
        "superuser_reserved_connections",
        "reserved_connections",
    ];
    let set = sizes.iter().find(|name| lowered.contains_key(**name));
    if let (Some(name), true) = (set, problems.is_empty())
        && let Err(message) = super::connections::pool_capacity(&lowered)
    {
        problems.push(Problem {
            name: (*name).to_owned(),
            message,
        });
    }
    problems
}

fn check(name: &str, value: &str) -> Result<(), String> {
    if !is_valid_name(name) {
        return Err(
            "not a PostgreSQL parameter name: use letters, digits, `_` and `$`, \
             starting with a letter or `_`, optionally after an extension name and a dot \
             (`pg_stat_statements.max`)"
                .to_owned(),
        );
    }
    if let Some(reason) = policy::refused(name) {
        return Err(format!("cannot be set: {}", reason.message()));
    }
    if value.chars().any(char::is_control) {
        return Err("the value must not contain control characters such as newlines".to_owned());
    }
    if name.eq_ignore_ascii_case("shared_preload_libraries") {
        return policy::preload_libraries(value);
    }
    if name.contains('.') {
        // An extension's parameter: PostgreSQL checks it once the extension is loaded.
        return Ok(());
    }
    let Some(setting) = catalog::lookup(name) else {
        return Err(match catalog::closest(name) {
            Some(near) => format!("unknown PostgreSQL 17 parameter; did you mean `{near}`?"),
            None => "unknown PostgreSQL 17 parameter (the names `SELECT name FROM pg_settings` \
                     lists, or an extension's `<extension>.<name>`)"
                .to_owned(),
        });
    };
    if setting.context == Context::Internal {
        return Err(
            "fixed when PostgreSQL is built or its data directory initialised; it \
             cannot be set in postgresql.conf"
                .to_owned(),
        );
    }
    // The type first, then a known setting's allowed words or range. An enum with known words
    // is checked against them alone (some have spaces: `repeatable read`).
    let limit = limits::limit(name);
    let words = matches!(limit, Some(Limit::Enum { .. }));
    if !words && !value_fits(setting.kind, value) {
        return Err(format!(
            "expects {}, got {value:?}",
            setting.kind.describe()
        ));
    }
    limit.map_or(Ok(()), |limit| limits::check(limit, value))
}

/// Units PostgreSQL accepts after a number: memory, then time.
const UNITS: [&str; 11] = [
    "B", "kB", "MB", "GB", "TB", "us", "ms", "s", "min", "h", "d",
];

fn value_fits(kind: Kind, value: &str) -> bool {
    let value = value.trim();
    match kind {
        Kind::Bool => [
            "on", "off", "true", "false", "yes", "no", "1", "0", "t", "f", "y", "n",
        ]
        .iter()
        .any(|b| value.eq_ignore_ascii_case(b)),
        Kind::Integer => number_with_unit(value, false),
        Kind::Real => number_with_unit(value, true),
        Kind::Enum => {
            !value.is_empty()
                && value
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_-.+".contains(c))
        }
        Kind::String => true,
    }
}

/// A number, optionally followed by a unit. PostgreSQL rounds a fraction given to an integer
/// parameter (`1.5GB`) and reads `0x` integers as hexadecimal; reals accept an exponent too.
fn number_with_unit(value: &str, real: bool) -> bool {
    if !real && let Some(hex) = value.strip_prefix("0x") {
        return !hex.is_empty() && hex.chars().all(|c| c.is_ascii_hexdigit());
    }
    let split = value
        .rfind(|c: char| !c.is_ascii_alphabetic())
        .map_or(0, |i| i + 1);
    let (number, unit) = value.split_at(split);
    let number = number.trim_end();
    let parses = if real {
        number.parse::<f64>().is_ok_and(f64::is_finite)
    } else {
        let digits = number.strip_prefix(['-', '+']).unwrap_or(number);
        digits.chars().any(|c| c.is_ascii_digit())
            && digits.chars().all(|c| c.is_ascii_digit() || c == '.')
            && digits.chars().filter(|c| *c == '.').count() <= 1
    };
    parses && (unit.is_empty() || UNITS.contains(&unit))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(entries: &[(&str, &str)]) -> Vec<String> {
        let map = entries
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        validate(&map).iter().map(ToString::to_string).collect()
    }

    #[test]
    fn known_parameters_with_fitting_values_pass() {
        let ok = problems(&[
            ("shared_buffers", "256MB"),
            ("work_mem", "4096"),
            ("max_wal_senders", "0x40"),
            ("temp_buffers", "1.5MB"),
            ("default_transaction_isolation", "repeatable read"),
            ("max_connections", "200"),
            ("statement_timeout", "30s"),
            ("max_slot_wal_keep_size", "-1"),
            ("maintenance_work_mem", "1.5GB"),
            ("random_page_cost", "1.1"),
            ("autovacuum_vacuum_scale_factor", "2e-2"),
            ("checkpoint_completion_target", "0.9"),
            ("hot_standby_feedback", "on"),
            ("jit", "FALSE"),
            ("log_statement", "ddl"),
            ("password_encryption", "scram-sha-256"),
            ("log_line_prefix", "%m [%p] it's "),
            ("TimeZone", "Europe/Paris"),
            ("pg_stat_statements.max", "10000"),
        ]);
        assert!(ok.is_empty(), "{ok:?}");
    }

    #[test]
    fn unknown_parameters_are_refused_with_a_suggestion_when_one_is_close() {
        assert_eq!(
            problems(&[("shared_bufers", "1GB")]),
            [
                "postgresConfig.shared_bufers: unknown PostgreSQL 17 parameter; did you mean \
              `shared_buffers`?"
            ]
        );
        let far = problems(&[("not_a_real_setting_at_all", "1")]);
        assert_eq!(far.len(), 1);
        assert!(
            far[0].starts_with(
                "postgresConfig.not_a_real_setting_at_all: unknown PostgreSQL 17 parameter (the \
                 names `SELECT name FROM pg_settings` lists"
            ),
            "{far:?}"
        );
    }

    #[test]
    fn managed_and_internal_parameters_are_refused_with_the_reason() {
        assert_eq!(
            problems(&[("port", "5433"), ("wal_level", "replica")]),
            [
                "postgresConfig.port: cannot be set: pgctld sets it on the postgres command \
                 line or in its template",
                "postgresConfig.wal_level: cannot be set: Multigres needs the value the \
                 operator sets (logical WAL with hint bits, hot standbys, full page writes)",
            ]
        );
        assert_eq!(
            problems(&[("multigres.config_reload_marker", "x")]),
            [
                "postgresConfig.multigres.config_reload_marker: cannot be set: the operator \
                 writes it (cluster_name names the shard's servers, \
                 multigres.config_reload_marker tracks configuration reloads)"
            ]
        );
        assert_eq!(
            problems(&[("block_size", "16384")]),
            [
                "postgresConfig.block_size: fixed when PostgreSQL is built or its data \
                 directory initialised; it cannot be set in postgresql.conf"
            ]
        );
    }

    #[test]
    fn commands_code_loading_and_includes_are_refused_before_any_other_check() {
        let refused = problems(&[
            (
                "archive_command",
                "sh -c 'cat /etc/postgres-password/password'",
            ),
            ("RESTORE_COMMAND", "x"),
            ("ssl_passphrase_command", "x"),
            ("dynamic_library_path", "/tmp"),
            ("session_preload_libraries", "x"),
            ("include", "/etc/postgres-password/password"),
            ("ssl", "on"),
            ("hot_standby", "off"),
            ("unix_socket_permissions", "0000"),
        ]);
        assert_eq!(refused.len(), 9, "{refused:?}");
        assert!(
            refused.iter().all(|p| p.contains(": cannot be set: ")),
            "{refused:?}"
        );
        assert_eq!(
            problems(&[("shared_preload_libraries", "pg_stat_statement")]),
            [
                "postgresConfig.shared_preload_libraries: \"pg_stat_statement\" is not a library \
                 the pgctld image ships for preloading; allowed are auth_delay, auto_explain, \
                 passwordcheck, pg_prewarm, pg_stat_statements (by name, without a path)"
            ]
        );
        assert!(
            problems(&[(
                "shared_preload_libraries",
                "pg_stat_statements,auto_explain"
            )])
            .is_empty()
        );
    }

    #[test]
    fn values_of_the_wrong_type_are_refused_naming_the_type() {
        assert_eq!(
            problems(&[
                ("shared_buffers", "lots"),
                ("hot_standby_feedback", "maybe"),
                ("random_page_cost", "cheap"),
                ("work_mem", "64XB"),
                ("max_connections", "ten"),
                ("log_statement", "two words"),
            ]),
            [
                "postgresConfig.hot_standby_feedback: expects a boolean (on, off, true, false, \
                 yes, no, 1 or 0), got \"maybe\"",
                "postgresConfig.log_statement: \"two words\" is not one of none, ddl, mod, all",
                "postgresConfig.max_connections: expects an integer, optionally with a unit \
                 such as 64MB or 10s, got \"ten\"",
                "postgresConfig.random_page_cost: expects a number, optionally with a unit, \
                 got \"cheap\"",
                "postgresConfig.shared_buffers: expects an integer, optionally with a unit such \
                 as 64MB or 10s, got \"lots\"",
                "postgresConfig.work_mem: expects an integer, optionally with a unit such as \
                 64MB or 10s, got \"64XB\"",
            ]
        );
    }

    #[test]
    fn enum_words_and_numeric_ranges_are_checked_naming_the_parameter() {
        assert_eq!(
            problems(&[
                ("track_functions", "sometimes"),
                ("max_connections", "0"),
                ("shared_buffers", "64kB"),
                ("statement_timeout", "5MB"),
            ]),
            [
                "postgresConfig.max_connections: \"0\" is out of range: allowed are 1 to 262143",
                "postgresConfig.shared_buffers: \"64kB\" is out of range: it is 8 in units of \
                 8kB, and allowed are 16 to 1073741823 (in units of 8kB)",
                "postgresConfig.statement_timeout: \"5MB\": this setting takes time units us, \
                 ms, s, min, h, d",
                "postgresConfig.track_functions: \"sometimes\" is not one of none, pl, all",
            ]
        );
        assert!(problems(&[("wal_compression", "zstd"), ("track_functions", "PL")]).is_empty());
    }

    #[test]
    fn names_and_values_that_would_break_the_file_are_refused() {
        assert_eq!(
            problems(&[("log_line_prefix", "a\nshared_buffers = 1TB")]),
            [
                "postgresConfig.log_line_prefix: the value must not contain control \
                 characters such as newlines"
            ]
        );
        let bad_name = problems(&[("work mem", "1MB")]);
        assert_eq!(bad_name.len(), 1);
        assert!(
            bad_name[0].starts_with("postgresConfig.work mem: not a PostgreSQL parameter name"),
            "{bad_name:?}"
        );
    }
}
