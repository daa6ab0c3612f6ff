//! Allowed values of common PostgreSQL 17 settings: the words an enum setting takes and the
//! range (in the setting's own unit) of a numeric one, as `pg_settings` reports them
//! (`enumvals`, `min_val`, `max_val`, `unit`), plus the aliases PostgreSQL accepts without
//! listing them. PostgreSQL refuses a value outside them and, in postgresql.conf, then refuses
//! to start or ignores the whole file on reload, so the webhook refuses it first. Settings not
//! in [`LIMITS`] are checked for their type only.

/// The unit a numeric setting is stored in (`pg_settings.unit`); a value may name another unit
/// of the same kind and is converted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// No unit: a value must not name one.
    None,
    /// Bytes.
    Bytes,
    /// Kilobytes.
    Kb,
    /// 8 kB blocks (`shared_buffers`, `wal_buffers`, ...).
    Blocks,
    /// Megabytes.
    Mb,
    /// Milliseconds.
    Ms,
    /// Seconds.
    S,
    /// Minutes.
    Min,
}

impl Unit {
    /// How `pg_settings` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Unit::None => "",
            Unit::Bytes => "B",
            Unit::Kb => "kB",
            Unit::Blocks => "8kB",
            Unit::Mb => "MB",
            Unit::Ms => "ms",
            Unit::S => "s",
            Unit::Min => "min",
        }
    }

    /// The unit's size in bytes or microseconds, and whether it measures memory.
    fn scale(self) -> Option<(f64, bool)> {
        match self {
            Unit::None => None,
            Unit::Bytes => Some((1.0, true)),
            Unit::Kb => Some((KB, true)),
            Unit::Blocks => Some((8.0 * KB, true)),
            Unit::Mb => Some((KB * KB, true)),
            Unit::Ms => Some((1e3, false)),
            Unit::S => Some((1e6, false)),
            Unit::Min => Some((60e6, false)),
        }
    }
}

const KB: f64 = 1024.0;

/// Units a value may name: memory ones in bytes, time ones in microseconds.
const MEMORY_UNITS: [(&str, f64); 5] = [
    ("B", 1.0),
    ("kB", KB),
    ("MB", KB * KB),
    ("GB", KB * KB * KB),
    ("TB", KB * KB * KB * KB),
];
const TIME_UNITS: [(&str, f64); 6] = [
    ("us", 1.0),
    ("ms", 1e3),
    ("s", 1e6),
    ("min", 60e6),
    ("h", 3600e6),
    ("d", 86400e6),
];

/// What a setting accepts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Limit {
    /// One of `values` or `aliases`, matched case-insensitively. `aliases` are accepted but
    /// not listed by PostgreSQL (nor in messages), such as `true` for `synchronous_commit`.
    Enum {
        /// The documented values.
        values: &'static [&'static str],
        /// Values accepted without being listed.
        aliases: &'static [&'static str],
    },
    /// A whole number (after converting units and rounding) in `min..=max` of `unit`.
    Integer {
        /// Smallest value.
        min: i64,
        /// Largest value.
        max: i64,
        /// The unit the bounds are in.
        unit: Unit,
    },
    /// A number in `min..=max` of `unit`.
    Real {
        /// Smallest value.
        min: f64,
        /// Largest value.
        max: f64,
        /// The unit the bounds are in.
        unit: Unit,
    },
}

/// The limits of the settings the operator renders and of common tuning settings, from
/// PostgreSQL 17's `pg_settings` (the same as 15's and 16's for every one listed).
pub const LIMITS: &[(&str, Limit)] = &[
    (
        "archive_mode",
        Limit::Enum {
            values: &["always", "on", "off"],
            aliases: &["true", "false", "yes", "no", "1", "0"],
        },
    ),
    (
        "archive_timeout",
        Limit::Integer {
            min: 0,
            max: 1073741823,
            unit: Unit::S,
        },
    ),
    (
        "authentication_timeout",
        Limit::Integer {
            min: 1,
            max: 600,
            unit: Unit::S,
        },
    ),
    (
        "autovacuum_analyze_scale_factor",
        Limit::Real {
            min: 0.0,
            max: 100.0,
            unit: Unit::None,
        },
    ),
    (
        "autovacuum_analyze_threshold",
        Limit::Integer {
            min: 0,
            max: 2147483647,
            unit: Unit::None,
        },
    ),
    (
        "autovacuum_freeze_max_age",
        Limit::Integer {
            min: 100000,
            max: 2000000000,
            unit: Unit::None,
        },
    ),
    (
        "autovacuum_max_workers",
        Limit::Integer {
            min: 1,
            max: 262143,
            unit: Unit::None,
        },
    ),
    (
        "autovacuum_naptime",
        Limit::Integer {
            min: 1,
            max: 2147483,
            unit: Unit::S,
        },
    ),
    (
        "autovacuum_vacuum_cost_delay",
        Limit::Real {
            min: -1.0,
            max: 100.0,
            unit: Unit::Ms,
        },
    ),
    (
        "autovacuum_vacuum_cost_limit",
        Limit::Integer {
            min: -1,
            max: 10000,
            unit: Unit::None,
        },
    ),
    (
        "autovacuum_vacuum_insert_scale_factor",
        Limit::Real {
            min: 0.0,
            max: 100.0,
            unit: Unit::None,
        },
    ),
    (
        "autovacuum_vacuum_insert_threshold",
        Limit::Integer {
            min: -1,
            max: 2147483647,
            unit: Unit::None,
        },
    ),
    (
        "autovacuum_vacuum_scale_factor",
        Limit::Real {
            min: 0.0,
            max: 100.0,
            unit: Unit::None,
        },
    ),
    (
        "autovacuum_vacuum_threshold",
        Limit::Integer {
            min: 0,
            max: 2147483647,
            unit: Unit::None,
        },
    ),
    (
        "autovacuum_work_mem",
        Limit::Integer {
            min: -1,
            max: 2147483647,
            unit: Unit::Kb,
        },
    ),
    (
        "bgwriter_delay",
        Limit::Integer {
            min: 10,
            max: 10000,
            unit: Unit::Ms,
        },
    ),
    (
        "bgwriter_lru_maxpages",
        Limit::Integer {
            min: 0,
            max: 1073741823,
            unit: Unit::None,
        },
    ),
    (
        "bgwriter_lru_multiplier",
        Limit::Real {
            min: 0.0,
            max: 10.0,
            unit: Unit::None,
        },
    ),
    (
        "bytea_output",
        Limit::Enum {
            values: &["escape", "hex"],
            aliases: &[],
        },
    ),
    (
        "checkpoint_completion_target",
        Limit::Real {
            min: 0.0,
            max: 1.0,
            unit: Unit::None,
        },
    ),
    (
        "checkpoint_flush_after",
        Limit::Integer {
            min: 0,
            max: 256,
            unit: Unit::Blocks,
        },
    ),
    (
        "checkpoint_timeout",
        Limit::Integer {
            min: 30,
            max: 86400,
            unit: Unit::S,
        },
    ),
    (
        "checkpoint_warning",
        Limit::Integer {
            min: 0,
            max: 2147483647,
            unit: Unit::S,
        },
    ),
    (
        "client_min_messages",
        Limit::Enum {
            values: &[
                "debug5", "debug4", "debug3", "debug2", "debug1", "log", "notice", "warning",
                "error",
            ],
            aliases: &["debug"],
        },
    ),
    (
        "commit_delay",
        Limit::Integer {
            min: 0,
            max: 100000,
            unit: Unit::None,
        },
    ),
    (
        "commit_siblings",
        Limit::Integer {
            min: 0,
            max: 1000,
            unit: Unit::None,
        },
    ),
    (
        "compute_query_id",
        Limit::Enum {
            values: &["auto", "regress", "on", "off"],
            aliases: &["true", "false", "yes", "no", "1", "0"],
        },
    ),
    (
        "constraint_exclusion",
        Limit::Enum {
            values: &["partition", "on", "off"],
            aliases: &["true", "false", "yes", "no", "1", "0"],
        },
    ),
    (
        "cpu_index_tuple_cost",
        Limit::Real {
            min: 0.0,
            max: f64::MAX,
            unit: Unit::None,
        },
    ),
    (
        "cpu_operator_cost",
        Limit::Real {
            min: 0.0,
            max: f64::MAX,
            unit: Unit::None,
        },
    ),
    (
        "cpu_tuple_cost",
        Limit::Real {
            min: 0.0,
            max: f64::MAX,
            unit: Unit::None,
        },
    ),
    (
        "deadlock_timeout",
        Limit::Integer {
            min: 1,
            max: 2147483647,
            unit: Unit::Ms,
        },
    ),
    (
        "default_statistics_target",
        Limit::Integer {
            min: 1,
            max: 10000,
            unit: Unit::None,
        },
    ),
    (
        "default_toast_compression",
        Limit::Enum {
            values: &["pglz", "lz4"],
            aliases: &[],
        },
    ),
    (
        "default_transaction_isolation",
        Limit::Enum {
            values: &[
                "serializable",
                "repeatable read",
                "read committed",
                "read uncommitted",
            ],
            aliases: &[],
        },
    ),
    (
        "effective_cache_size",
        Limit::Integer {
            min: 1,
            max: 2147483647,
            unit: Unit::Blocks,
        },
    ),
    (
        "effective_io_concurrency",
        Limit::Integer {
            min: 0,
            max: 1000,
            unit: Unit::None,
        },
    ),
    (
        "from_collapse_limit",
        Limit::Integer {
            min: 1,
            max: 2147483647,
            unit: Unit::None,
        },
    ),
    (
        "geqo_threshold",
        Limit::Integer {
            min: 2,
            max: 2147483647,
            unit: Unit::None,
        },
    ),
    (
        "gin_pending_list_limit",
        Limit::Integer {
            min: 64,
            max: 2147483647,
            unit: Unit::Kb,
        },
    ),
    (
        "hash_mem_multiplier",
        Limit::Real {
            min: 1.0,
            max: 1000.0,
            unit: Unit::None,
        },
    ),
    (
        "huge_pages",
        Limit::Enum {
            values: &["off", "on", "try"],
            aliases: &["true", "false", "yes", "no", "1", "0"],
        },
    ),
    (
        "idle_in_transaction_session_timeout",
        Limit::Integer {
            min: 0,
            max: 2147483647,
            unit: Unit::Ms,
        },
    ),
    (
        "idle_session_timeout",
        Limit::Integer {
            min: 0,
            max: 2147483647,
            unit: Unit::Ms,
        },
    ),
    (
        "jit_above_cost",
        Limit::Real {
            min: -1.0,
            max: f64::MAX,
            unit: Unit::None,
        },
    ),
    (
        "join_collapse_limit",
        Limit::Integer {
            min: 1,
            max: 2147483647,
            unit: Unit::None,
        },
    ),
    (
        "lock_timeout",
        Limit::Integer {
            min: 0,
            max: 2147483647,
            unit: Unit::Ms,
        },
    ),
    (
        "log_autovacuum_min_duration",
        Limit::Integer {
            min: -1,
            max: 2147483647,
            unit: Unit::Ms,
        },
    ),
    (
        "log_error_verbosity",
        Limit::Enum {
            values: &["terse", "default", "verbose"],
            aliases: &[],
        },
    ),
    (
        "log_min_duration_statement",
        Limit::Integer {
            min: -1,
            max: 2147483647,
            unit: Unit::Ms,
        },
    ),
    (
        "log_min_error_statement",
        Limit::Enum {
            values: &[
                "debug5", "debug4", "debug3", "debug2", "debug1", "info", "notice", "warning",
                "error", "log", "fatal", "panic",
            ],
            aliases: &["debug"],
        },
    ),
    (
        "log_min_messages",
        Limit::Enum {
            values: &[
                "debug5", "debug4", "debug3", "debug2", "debug1", "info", "notice", "warning",
                "error", "log", "fatal", "panic",
            ],
            aliases: &["debug"],
        },
    ),
    (
        "log_parameter_max_length",
        Limit::Integer {
            min: -1,
            max: 1073741823,
            unit: Unit::Bytes,
        },
    ),
    (
        "log_parameter_max_length_on_error",
        Limit::Integer {
            min: -1,
            max: 1073741823,
            unit: Unit::Bytes,
        },
    ),
    (
        "log_rotation_age",
        Limit::Integer {
            min: 0,
            max: 35791394,
            unit: Unit::Min,
        },
    ),
    (
        "log_rotation_size",
        Limit::Integer {
            min: 0,
            max: 2097151,
            unit: Unit::Kb,
        },
    ),
    (
        "log_statement",
        Limit::Enum {
            values: &["none", "ddl", "mod", "all"],
            aliases: &[],
        },
    ),
    (
        "log_temp_files",
        Limit::Integer {
            min: -1,
            max: 2147483647,
            unit: Unit::Kb,
        },
    ),
    (
        "maintenance_io_concurrency",
        Limit::Integer {
            min: 0,
            max: 1000,
            unit: Unit::None,
        },
    ),
    (
        "maintenance_work_mem",
        Limit::Integer {
            min: 1024,
            max: 2147483647,
            unit: Unit::Kb,
        },
    ),
    (
        "max_connections",
        Limit::Integer {
            min: 1,
            max: 262143,
            unit: Unit::None,
        },
    ),
    (
        "max_files_per_process",
        Limit::Integer {
            min: 64,
            max: 2147483647,
            unit: Unit::None,
        },
    ),
    (
        "max_locks_per_transaction",
        Limit::Integer {
            min: 10,
            max: 2147483647,
            unit: Unit::None,
        },
    ),
    (
        "max_logical_replication_workers",
        Limit::Integer {
            min: 0,
            max: 262143,
            unit: Unit::None,
        },
    ),
    (
        "max_parallel_maintenance_workers",
        Limit::Integer {
            min: 0,
            max: 1024,
            unit: Unit::None,
        },
    ),
    (
        "max_parallel_workers",
        Limit::Integer {
            min: 0,
            max: 1024,
            unit: Unit::None,
        },
    ),
    (
        "max_parallel_workers_per_gather",
        Limit::Integer {
            min: 0,
            max: 1024,
            unit: Unit::None,
        },
    ),
    (
        "max_pred_locks_per_transaction",
        Limit::Integer {
            min: 10,
            max: 2147483647,
            unit: Unit::None,
        },
    ),
    (
        "max_prepared_transactions",
        Limit::Integer {
            min: 0,
            max: 262143,
            unit: Unit::None,
        },
    ),
    (
        "max_replication_slots",
        Limit::Integer {
            min: 0,
            max: 262143,
            unit: Unit::None,
        },
    ),
    (
        "max_slot_wal_keep_size",
        Limit::Integer {
            min: -1,
            max: 2147483647,
            unit: Unit::Mb,
        },
    ),
    (
        "max_standby_archive_delay",
        Limit::Integer {
            min: -1,
            max: 2147483647,
            unit: Unit::Ms,
        },
    ),
    (
        "max_standby_streaming_delay",
        Limit::Integer {
            min: -1,
            max: 2147483647,
            unit: Unit::Ms,
        },
    ),
    (
        "max_sync_workers_per_subscription",
        Limit::Integer {
            min: 0,
            max: 262143,
            unit: Unit::None,
        },
    ),
    (
        "max_wal_senders",
        Limit::Integer {
            min: 0,
            max: 262143,
            unit: Unit::None,
        },
    ),
    (
        "max_wal_size",
        Limit::Integer {
            min: 2,
            max: 2147483647,
            unit: Unit::Mb,
        },
    ),
    (
        "max_worker_processes",
        Limit::Integer {
            min: 0,
            max: 262143,
            unit: Unit::None,
        },
    ),
    (
        "min_wal_size",
        Limit::Integer {
            min: 2,
            max: 2147483647,
            unit: Unit::Mb,
        },
    ),
    (
        "parallel_setup_cost",
        Limit::Real {
            min: 0.0,
            max: f64::MAX,
            unit: Unit::None,
        },
    ),
    (
        "parallel_tuple_cost",
        Limit::Real {
            min: 0.0,
            max: f64::MAX,
            unit: Unit::None,
        },
    ),
    (
        "password_encryption",
        Limit::Enum {
            values: &["md5", "scram-sha-256"],
            aliases: &[],
        },
    ),
    (
        "plan_cache_mode",
        Limit::Enum {
            values: &["auto", "force_generic_plan", "force_custom_plan"],
            aliases: &[],
        },
    ),
    (
        "random_page_cost",
        Limit::Real {
            min: 0.0,
            max: f64::MAX,
            unit: Unit::None,
        },
    ),
    (
        "seq_page_cost",
        Limit::Real {
            min: 0.0,
            max: f64::MAX,
            unit: Unit::None,
        },
    ),
    (
        "session_replication_role",
        Limit::Enum {
            values: &["origin", "replica", "local"],
            aliases: &[],
        },
    ),
    (
        "shared_buffers",
        Limit::Integer {
            min: 16,
            max: 1073741823,
            unit: Unit::Blocks,
        },
    ),
    (
        "ssl_min_protocol_version",
        Limit::Enum {
            values: &["TLSv1", "TLSv1.1", "TLSv1.2", "TLSv1.3"],
            aliases: &[],
        },
    ),
    (
        "statement_timeout",
        Limit::Integer {
            min: 0,
            max: 2147483647,
            unit: Unit::Ms,
        },
    ),
    (
        "stats_fetch_consistency",
        Limit::Enum {
            values: &["none", "cache", "snapshot"],
            aliases: &[],
        },
    ),
    (
        "synchronous_commit",
        Limit::Enum {
            values: &["local", "remote_write", "remote_apply", "on", "off"],
            aliases: &["true", "false", "yes", "no", "1", "0"],
        },
    ),
    (
        "tcp_keepalives_count",
        Limit::Integer {
            min: 0,
            max: 2147483647,
            unit: Unit::None,
        },
    ),
    (
        "tcp_keepalives_idle",
        Limit::Integer {
            min: 0,
            max: 2147483647,
            unit: Unit::S,
        },
    ),
    (
        "tcp_keepalives_interval",
        Limit::Integer {
            min: 0,
            max: 2147483647,
            unit: Unit::S,
        },
    ),
    (
        "temp_buffers",
        Limit::Integer {
            min: 100,
            max: 1073741823,
            unit: Unit::Blocks,
        },
    ),
    (
        "temp_file_limit",
        Limit::Integer {
            min: -1,
            max: 2147483647,
            unit: Unit::Kb,
        },
    ),
    (
        "track_activity_query_size",
        Limit::Integer {
            min: 100,
            max: 1048576,
            unit: Unit::Bytes,
        },
    ),
    (
        "track_functions",
        Limit::Enum {
            values: &["none", "pl", "all"],
            aliases: &[],
        },
    ),
    (
        "vacuum_cost_delay",
        Limit::Real {
            min: 0.0,
            max: 100.0,
            unit: Unit::Ms,
        },
    ),
    (
        "vacuum_cost_limit",
        Limit::Integer {
            min: 1,
            max: 10000,
            unit: Unit::None,
        },
    ),
    (
        "vacuum_freeze_min_age",
        Limit::Integer {
            min: 0,
            max: 1000000000,
            unit: Unit::None,
        },
    ),
    (
        "vacuum_freeze_table_age",
        Limit::Integer {
            min: 0,
            max: 2000000000,
            unit: Unit::None,
        },
    ),
    (
        "wal_buffers",
        Limit::Integer {
            min: -1,
            max: 262143,
            unit: Unit::Blocks,
        },
    ),
    (
        "wal_compression",
        Limit::Enum {
            values: &["pglz", "lz4", "zstd", "on", "off"],
            aliases: &["true", "false", "yes", "no", "1", "0"],
        },
    ),
    (
        "wal_keep_size",
        Limit::Integer {
            min: 0,
            max: 2147483647,
            unit: Unit::Mb,
        },
    ),
    (
        "wal_level",
        Limit::Enum {
            values: &["minimal", "replica", "logical"],
            aliases: &["archive", "hot_standby"],
        },
    ),
    (
        "wal_receiver_timeout",
        Limit::Integer {
            min: 0,
            max: 2147483647,
            unit: Unit::Ms,
        },
    ),
    (
        "wal_retrieve_retry_interval",
        Limit::Integer {
            min: 1,
            max: 2147483647,
            unit: Unit::Ms,
        },
    ),
    (
        "wal_sender_timeout",
        Limit::Integer {
            min: 0,
            max: 2147483647,
            unit: Unit::Ms,
        },
    ),
    (
        "wal_writer_delay",
        Limit::Integer {
            min: 1,
            max: 10000,
            unit: Unit::Ms,
        },
    ),
    (
        "wal_writer_flush_after",
        Limit::Integer {
            min: 0,
            max: 2147483647,
            unit: Unit::Blocks,
        },
    ),
    (
        "work_mem",
        Limit::Integer {
            min: 64,
            max: 2147483647,
            unit: Unit::Kb,
        },
    ),
    (
        "xmloption",
        Limit::Enum {
            values: &["content", "document"],
            aliases: &[],
        },
    ),
];

/// The limit of the setting `name` (case-insensitive), when known.
pub fn limit(name: &str) -> Option<Limit> {
    LIMITS
        .iter()
        .find(|(known, _)| known.eq_ignore_ascii_case(name))
        .map(|(_, limit)| *limit)
}

/// Checks `value` against `limit`; the error says what is allowed. A value of the wrong type
/// altogether is left to the type check, which runs first.
pub fn check(limit: Limit, value: &str) -> Result<(), String> {
    let value = value.trim();
    match limit {
        Limit::Enum { values, aliases } => {
            if values
                .iter()
                .chain(aliases)
                .any(|v| v.eq_ignore_ascii_case(value))
            {
                Ok(())
            } else {
                Err(format!("{value:?} is not one of {}", values.join(", ")))
            }
        }
        Limit::Integer { min, max, unit } => {
            let amount = in_unit(value, unit)?.round_ties_even();
            let (low, high) = (min as f64, max as f64);
            if (low..=high).contains(&amount) {
                Ok(())
            } else {
                Err(out_of_range(
                    value,
                    amount,
                    min.to_string(),
                    max.to_string(),
                    unit,
                ))
            }
        }
        Limit::Real { min, max, unit } => {
            let amount = in_unit(value, unit)?;
            if (min..=max).contains(&amount) {
                Ok(())
            } else {
                // A maximum of f64::MAX means no maximum.
                let max = if max == f64::MAX {
                    "any larger number".to_owned()
                } else {
                    max.to_string()
                };
                Err(out_of_range(value, amount, min.to_string(), max, unit))
            }
        }
    }
}

/// The bytes a memory setting (`shared_buffers`, `wal_buffers`, ...) asks for, when `value`
/// is a size: `None` for a setting that is not a memory one, a value that does not parse, or a
/// negative one (`wal_buffers = -1` means sized from `shared_buffers`).
pub fn memory_bytes(name: &str, value: &str) -> Option<f64> {
    let Limit::Integer { unit, .. } = limit(name)? else {
        return None;
    };
    let (scale, true) = unit.scale()? else {
        return None;
    };
    let amount = in_unit(value.trim(), unit).ok()?;
    (amount >= 0.0).then_some(amount * scale)
}

fn out_of_range(value: &str, amount: f64, min: String, max: String, unit: Unit) -> String {
    match unit {
        Unit::None => format!("{value:?} is out of range: allowed are {min} to {max}"),
        unit => format!(
            "{value:?} is out of range: it is {amount} in units of {}, and allowed are {min} to \
             {max} (in units of {})",
            unit.name(),
            unit.name()
        ),
    }
}

/// `value` (a number, optionally with a unit, or a `0x` hexadecimal integer) in `unit`.
fn in_unit(value: &str, unit: Unit) -> Result<f64, String> {
    if let Some(hex) = value.strip_prefix("0x") {
        return i64::from_str_radix(hex, 16)
            .map(|n| n as f64)
            .map_err(|_| format!("{value:?} is not a hexadecimal number"));
    }
    let split = value
        .rfind(|c: char| !c.is_ascii_alphabetic())
        .map_or(0, |i| i + 1);
    let (number, suffix) = value.split_at(split);
    let number: f64 = number
        .trim_end()
        .parse()
        .map_err(|_| format!("{value:?} is not a number"))?;
    if suffix.is_empty() {
        return Ok(number);
    }
    let Some((base, memory)) = unit.scale() else {
        return Err(format!(
            "{value:?} names a unit, but this setting takes none"
        ));
    };
    let (units, kind) = if memory {
        (&MEMORY_UNITS[..], "memory units B, kB, MB, GB, TB")
    } else {
        (&TIME_UNITS[..], "time units us, ms, s, min, h, d")
    };
    let scale = units
        .iter()
        .find(|(name, _)| *name == suffix)
        .map(|(_, scale)| *scale)
        .ok_or_else(|| format!("{value:?}: this setting takes {kind}"))?;
    Ok(number * scale / base)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_limited_setting_is_a_postgres_17_setting_of_the_same_type() {
        use super::super::catalog::{self, Kind};
        for (name, limit) in LIMITS {
            let setting = catalog::lookup(name).unwrap_or_else(|| panic!("{name}"));
            let kind = match limit {
                Limit::Enum { .. } => Kind::Enum,
                Limit::Integer { .. } => Kind::Integer,
                Limit::Real { .. } => Kind::Real,
            };
            assert_eq!(setting.kind, kind, "{name}");
        }
    }

    #[test]
    fn enums_take_their_values_and_aliases_in_any_case() {
        let wal_level = limit("wal_level").unwrap();
        assert_eq!(check(wal_level, "LOGICAL"), Ok(()));
        assert_eq!(
            check(wal_level, "hot_standby"),
            Ok(()),
            "an alias of replica"
        );
        assert_eq!(
            check(wal_level, "foo"),
            Err("\"foo\" is not one of minimal, replica, logical".to_owned())
        );
        let isolation = limit("default_transaction_isolation").unwrap();
        assert_eq!(check(isolation, "repeatable read"), Ok(()));
        assert_eq!(check(limit("synchronous_commit").unwrap(), "yes"), Ok(()));
    }

    #[test]
    fn numbers_are_converted_to_the_settings_unit_before_the_range_check() {
        assert_eq!(
            memory_bytes("shared_buffers", "8GB"),
            Some(8.0 * KB * KB * KB)
        );
        assert_eq!(
            memory_bytes("shared_buffers", "16384"),
            Some(128.0 * KB * KB)
        );
        assert_eq!(memory_bytes("wal_buffers", "-1"), None);
        assert_eq!(memory_bytes("wal_buffers", "16MB"), Some(16.0 * KB * KB));
        assert_eq!(memory_bytes("max_connections", "100"), None);
        assert_eq!(memory_bytes("statement_timeout", "10s"), None);
        let shared_buffers = limit("shared_buffers").unwrap();
        assert_eq!(check(shared_buffers, "128kB"), Ok(()), "16 blocks");
        assert_eq!(check(shared_buffers, "1GB"), Ok(()));
        assert_eq!(
            check(shared_buffers, "64kB"),
            Err(
                "\"64kB\" is out of range: it is 8 in units of 8kB, and allowed are 16 to \
                 1073741823 (in units of 8kB)"
                    .to_owned()
            )
        );
        assert_eq!(
            check(shared_buffers, "10s"),
            Err("\"10s\": this setting takes memory units B, kB, MB, GB, TB".to_owned())
        );
        let timeout = limit("statement_timeout").unwrap();
        assert_eq!(check(timeout, "1.5min"), Ok(()));
        assert_eq!(check(timeout, "30000"), Ok(()));
        assert!(check(timeout, "-1").is_err());
        assert!(check(timeout, "30s").is_ok());
        assert!(check(limit("authentication_timeout").unwrap(), "11min").is_err());
        assert_eq!(check(limit("max_wal_size").unwrap(), "1GB"), Ok(()));
    }

    #[test]
    fn unitless_settings_refuse_units_and_check_their_range() {
        let max_connections = limit("max_connections").unwrap();
        assert_eq!(check(max_connections, "200"), Ok(()));
        assert_eq!(check(max_connections, "0x40"), Ok(()));
        assert_eq!(
            check(max_connections, "0"),
            Err("\"0\" is out of range: allowed are 1 to 262143".to_owned())
        );
        assert_eq!(
            check(max_connections, "300000"),
            Err("\"300000\" is out of range: allowed are 1 to 262143".to_owned())
        );
        assert_eq!(
            check(max_connections, "100MB"),
            Err("\"100MB\" names a unit, but this setting takes none".to_owned())
        );
        let target = limit("checkpoint_completion_target").unwrap();
        assert_eq!(check(target, "0.9"), Ok(()));
        assert_eq!(
            check(target, "1.5"),
            Err("\"1.5\" is out of range: allowed are 0 to 1".to_owned())
        );
        assert_eq!(check(limit("random_page_cost").unwrap(), "1e10"), Ok(()));
        assert_eq!(
            check(limit("random_page_cost").unwrap(), "-1"),
            Err("\"-1\" is out of range: allowed are 0 to any larger number".to_owned())
        );
    }
}
