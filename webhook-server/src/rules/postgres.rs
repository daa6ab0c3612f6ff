//! PostgreSQL parameters (`postgresConfig`) in clusters and ShardTemplates: refused at
//! admission when PostgreSQL would not accept them (an unknown name, a value of the wrong
//! type, a parameter the operator sets itself), so a typo never reaches a running shard and
//! stops its servers from starting.

use std::collections::BTreeMap;

use multigres_api::postgres::validate;

use crate::violation::Findings;

/// Reports every refused entry of the `postgresConfig` map at `path`, each as
/// `<path>[<parameter>]`.
pub fn postgres_config(findings: &mut Findings, path: &str, config: &BTreeMap<String, String>) {
    for problem in validate(config) {
        findings.violation(format!("{path}[{}]", problem.name), problem.message);
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
             spec.postgresConfig[Port]: managed by the operator and cannot be set: pgctld sets \
             it on its command line; \
             spec.postgresConfig[hot_standby_feedback]: expects a boolean (on, off, true, \
             false, yes, no, 1 or 0), got \"sometimes\"; \
             spec.postgresConfig[shared_bufers]: unknown PostgreSQL 17 parameter; did you mean \
             `shared_buffers`?; \
             spec.postgresConfig[wal_level]: managed by the operator and cannot be set: \
             Multigres requires wal_level = logical"
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
