//! How a shard's `max_connections` is shared: multipooler's pools must never ask PostgreSQL for
//! more connections than it allows, or a burst of clients takes every slot and the pooler's
//! own health and consensus calls fail with `sorry, too many clients already` (Multigres
//! defaults to a pool of 100 plus 5 admin connections,
//! `go/services/multipooler/internal/connpoolmanager/config.go`, whatever the server allows).

use std::collections::BTreeMap;

/// multipooler's admin pool (`--connpool-admin-capacity`, Multigres' default): its health
/// checks, replication and consensus calls.
pub const POOLER_ADMIN_CONNECTIONS: u64 = 5;
/// Connections kept out of multipooler's pools for everything else that logs in: pgBackRest,
/// pg_rewind, postgres_exporter (at most two during a scrape), the operator's checks and a
/// person with psql on the pod.
pub const OUTSIDE_POOLER_CONNECTIONS: u64 = 5;
/// PostgreSQL's default `superuser_reserved_connections`.
const SUPERUSER_RESERVED_DEFAULT: u64 = 3;
/// The baseline `max_connections` (see the rendered defaults).
const MAX_CONNECTIONS_DEFAULT: u64 = 60;

/// The capacities multipooler is given for a server's effective settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolCapacity {
    /// `--connpool-global-capacity`: every user pool together.
    pub global: u64,
    /// `--connpool-admin-capacity`.
    pub admin: u64,
}

impl PoolCapacity {
    /// multipooler's flags.
    pub fn flags(self) -> [String; 2] {
        [
            format!("--connpool-global-capacity={}", self.global),
            format!("--connpool-admin-capacity={}", self.admin),
        ]
    }
}

/// An integer setting as PostgreSQL reads it (decimal or `0x` hexadecimal), if set.
fn integer(settings: &BTreeMap<String, String>, name: &str) -> Option<u64> {
    let value = settings.get(name)?.trim().trim_matches('\'');
    match value.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => value.parse().ok(),
    }
}

/// The pools of a server with `settings` (effective, or the user's map over the defaults):
/// `max_connections` less the slots only superusers may take (`superuser_reserved_connections`,
/// `reserved_connections`), the admin pool and [`OUTSIDE_POOLER_CONNECTIONS`]. An error, naming
/// the smallest `max_connections` allowed, when nothing is left for the pools.
pub fn pool_capacity(settings: &BTreeMap<String, String>) -> Result<PoolCapacity, String> {
    let max = integer(settings, "max_connections").unwrap_or(MAX_CONNECTIONS_DEFAULT);
    let reserved = integer(settings, "superuser_reserved_connections")
        .unwrap_or(SUPERUSER_RESERVED_DEFAULT)
        + integer(settings, "reserved_connections").unwrap_or(0);
    let kept = reserved + POOLER_ADMIN_CONNECTIONS + OUTSIDE_POOLER_CONNECTIONS;
    match max.checked_sub(kept).filter(|left| *left > 0) {
        Some(global) => Ok(PoolCapacity {
            global,
            admin: POOLER_ADMIN_CONNECTIONS,
        }),
        None => Err(format!(
            "max_connections = {max} leaves no connection for multipooler's pool: it must be at \
             least {} ({reserved} reserved for superusers, {POOLER_ADMIN_CONNECTIONS} for \
             multipooler's admin pool, {OUTSIDE_POOLER_CONNECTIONS} for backups, rewinds and \
             maintenance, and 1 for clients)",
            kept + 1
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(entries: &[(&str, &str)]) -> BTreeMap<String, String> {
        entries
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn the_pools_get_what_postgresql_allows_less_what_others_need() {
        let default = pool_capacity(&settings(&[])).unwrap();
        assert_eq!(
            default,
            PoolCapacity {
                global: 47,
                admin: 5
            }
        );
        assert_eq!(
            default.flags(),
            [
                "--connpool-global-capacity=47",
                "--connpool-admin-capacity=5"
            ]
        );
        let big = settings(&[("max_connections", "0xc8"), ("reserved_connections", "2")]);
        assert_eq!(pool_capacity(&big).unwrap().global, 200 - 3 - 2 - 5 - 5);
        assert_eq!(
            pool_capacity(&settings(&[("max_connections", "'14'")]))
                .unwrap()
                .global,
            1
        );
    }

    #[test]
    fn a_max_connections_that_leaves_the_pools_nothing_is_refused_with_the_minimum() {
        let error = pool_capacity(&settings(&[("max_connections", "13")])).unwrap_err();
        assert!(
            error.starts_with("max_connections = 13 leaves no connection"),
            "{error}"
        );
        assert!(error.contains("at least 14"), "{error}");
        let reserved = settings(&[
            ("max_connections", "20"),
            ("superuser_reserved_connections", "10"),
        ]);
        assert!(
            pool_capacity(&reserved)
                .unwrap_err()
                .contains("at least 21")
        );
    }
}
