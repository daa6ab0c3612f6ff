//! PostgreSQL parameters (`postgresConfig`) in clusters and ShardTemplates: refused at
//! admission when PostgreSQL would not accept them (an unknown name, a value of the wrong
//! type, a parameter the operator sets itself), so a typo never reaches a running shard and
//! stops its servers from starting.

use std::collections::BTreeMap;

use multigres_api::postgres::validate;

use crate::violation::Findings;

/// Reports every refused entry of the `postgresConfig` map at `path`, each as
/// `<path>[<parameter>]`, and warns when statement logging would log passwords.
pub fn postgres_config(findings: &mut Findings, path: &str, config: &BTreeMap<String, String>) {
    for problem in validate(config) {
        findings.violation(format!("{path}[{}]", problem.name), problem.message);
    }
    for (name, value) in config {
        let logs_ddl = ["ddl", "mod", "all"]
            .iter()
            .any(|level| value.trim().eq_ignore_ascii_case(level));
        if name.eq_ignore_ascii_case("log_statement") && logs_ddl {
            findings.warning(
                format!("{path}[{name}]"),
                "logs CREATE ROLE and ALTER ROLE statements with their PASSWORD in clear text \
                 into the container log; the operator's default is none",
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(entries: &[(&str, &str)]) -> Findings {
        let config = entries
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let mut findings = Findings::default();
        postgres_config(&mut findings, "spec.postgresConfig", &config);
        findings
    }

    #[test]
    fn unknown_managed_and_mistyped_parameters_are_refused_naming_each() {
        let findings = check(&[
            ("Port", "5433"),
            ("shared_bufers", "1GB"),
            ("work_mem", "4MB"),
            ("wal_level", "replica"),
            ("hot_standby_feedback", "sometimes"),
        ]);
        assert_eq!(
            findings.message(),
            "4 problems: \
             spec.postgresConfig[Port]: cannot be set: pgctld sets it on the postgres command \
             line or in its template; \
             spec.postgresConfig[hot_standby_feedback]: expects a boolean (on, off, true, \
             false, yes, no, 1 or 0), got \"sometimes\"; \
             spec.postgresConfig[shared_bufers]: unknown PostgreSQL 17 parameter; did you mean \
             `shared_buffers`?; \
             spec.postgresConfig[wal_level]: cannot be set: Multigres needs the value the \
             operator sets (logical WAL with hint bits, hot standbys, full page writes)"
        );
    }

    #[test]
    fn commands_and_unshipped_libraries_are_refused_and_statement_logging_warns() {
        let findings = check(&[
            ("archive_command", "curl x | sh"),
            ("shared_preload_libraries", "pg_stat_statement"),
            ("log_statement", "ddl"),
        ]);
        assert_eq!(
            findings.message(),
            "2 problems: \
             spec.postgresConfig[archive_command]: cannot be set: runs a shell command as the \
             postgres user, which can read the superuser password, S3 keys and backup cipher \
             keys; Multigres sets archive_command and restore_command itself (pgBackRest); \
             spec.postgresConfig[shared_preload_libraries]: \"pg_stat_statement\" is not a \
             library the pgctld image ships for preloading; allowed are auth_delay, \
             auto_explain, passwordcheck, pg_prewarm, pg_stat_statements (by name, without a \
             path)"
        );
        assert_eq!(findings.warnings.len(), 1, "{:?}", findings.warnings);
        assert!(findings.warnings[0].contains("spec.postgresConfig[log_statement]"));
    }

    #[test]
    fn a_max_connections_too_small_for_the_pools_is_refused_with_the_minimum() {
        let findings = check(&[("max_connections", "10")]);
        assert_eq!(
            findings.message(),
            "spec.postgresConfig[max_connections]: max_connections = 10 leaves no connection \
             for multipooler's pool: it must be at least 14 (3 reserved for superusers, 5 for \
             multipooler's admin pool, 5 for backups, rewinds and maintenance, and 1 for \
             clients)"
        );
    }

    #[test]
    fn known_and_extension_parameters_pass() {
        let findings = check(&[
            ("work_mem", "4MB"),
            ("max_connections", "200"),
            ("pg_stat_statements.track", "all"),
        ]);
        assert!(findings.allowed(), "{}", findings.message());
        assert!(findings.warnings.is_empty());
    }
}
