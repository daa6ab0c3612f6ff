//! The settings a standby must run at least at its primary's value, and the floor that keeps
//! a rendered file from lowering them.
//!
//! A standby whose value is below the one its primary last recorded (pg_control,
//! `XLOG_PARAMETER_CHANGE`) aborts recovery at start ("recovery aborted because of insufficient
//! parameter settings", PostgreSQL's `CheckRequiredParameterValues`). Multigres starts every
//! PostgreSQL as a standby (pgctld writes `standby.signal` unless asked for a primary start,
//! which only the first backup does), the restarted primary included, against its own control
//! file. So whichever pod starts first with a lower value never starts again (seen on real pods:
//! "max_connections = 40 is a lower setting than on the primary server, where its value was
//! 60"), and a file that holds a lower value breaks any pod that merely restarts. A lowering is
//! therefore never written: the value is held at what the servers may already run.

use std::collections::BTreeMap;
use std::fmt;

/// The hot-standby-sensitive settings, with PostgreSQL's default (a file without one runs the
/// default). `max_worker_processes` is derived from the postgres CPU, so resizing the pods can
/// lower it too.
pub const HOT_STANDBY_SENSITIVE: [(&str, u64); 5] = [
    ("max_connections", 100),
    ("max_locks_per_transaction", 64),
    ("max_prepared_transactions", 0),
    ("max_wal_senders", 10),
    ("max_worker_processes", 8),
];

/// Values of the [`HOT_STANDBY_SENSITIVE`] settings, by name.
pub type StandbySettings = BTreeMap<String, u64>;

/// The hot-standby-sensitive values among `settings` (a value that is not a plain number is
/// left out: it cannot be compared).
pub fn standby_settings(settings: &BTreeMap<String, String>) -> StandbySettings {
    HOT_STANDBY_SENSITIVE
        .iter()
        .filter_map(|(name, default)| {
            let value = match settings.get(*name) {
                Some(v) => v.trim().trim_matches('\'').parse().ok()?,
                None => *default,
            };
            Some(((*name).to_owned(), value))
        })
        .collect()
}

/// The annotation value of `settings` (`name=value`, comma-separated).
pub fn format_standby(settings: &StandbySettings) -> String {
    settings
        .iter()
        .map(|(name, value)| format!("{name}={value}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Reads an annotation value written by [`format_standby`] (`None` when malformed).
pub fn parse_standby(value: &str) -> Option<StandbySettings> {
    value
        .split(',')
        .filter(|part| !part.is_empty())
        .map(|part| {
            let (name, value) = part.split_once('=')?;
            Some((name.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// The highest value of each setting among `known`: what some server of the shard may run.
pub fn floor<'a>(known: impl IntoIterator<Item = &'a StandbySettings>) -> StandbySettings {
    let mut floor = StandbySettings::new();
    for settings in known {
        for (name, value) in settings {
            let at = floor.entry(name.clone()).or_default();
            *at = (*at).max(*value);
        }
    }
    floor
}

/// A setting asked below its floor, rendered at the floor instead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    /// The setting.
    pub name: String,
    /// The value the spec and its sources ask for.
    pub asked: u64,
    /// The value rendered: what a server of the shard may already run.
    pub held: u64,
}

impl fmt::Display for Held {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} (asked {})", self.name, self.held, self.asked)
    }
}

/// The settings of `effective` (the file's settings, later lines applied) below `floor`.
pub fn below(effective: &BTreeMap<String, String>, floor: &StandbySettings) -> Vec<Held> {
    let asked = standby_settings(effective);
    floor
        .iter()
        .filter_map(|(name, held)| {
            let asked = *asked.get(name)?;
            (asked < *held).then(|| Held {
                name: name.clone(),
                asked,
                held: *held,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn values_default_parse_and_round_trip() {
        let values = standby_settings(&conf(&[
            ("max_connections", "200"),
            ("max_locks_per_transaction", "'128'"),
            ("max_wal_senders", "ten"),
        ]));
        assert_eq!(
            format_standby(&values),
            "max_connections=200,max_locks_per_transaction=128,max_prepared_transactions=0,\
             max_worker_processes=8"
        );
        assert_eq!(parse_standby(&format_standby(&values)), Some(values));
        assert_eq!(parse_standby("max_connections=x"), None);
    }

    #[test]
    fn the_floor_is_the_highest_value_anyone_runs() {
        let a = parse_standby("max_connections=60,max_worker_processes=8").unwrap();
        let b = parse_standby("max_connections=100,max_worker_processes=4").unwrap();
        assert_eq!(
            format_standby(&floor([&a, &b])),
            "max_connections=100,max_worker_processes=8"
        );
        assert!(floor([]).is_empty());
    }

    #[test]
    fn only_settings_below_the_floor_are_held() {
        let floor = parse_standby("max_connections=60,max_worker_processes=8").unwrap();
        let lowered = conf(&[("max_connections", "40"), ("max_worker_processes", "16")]);
        let held = below(&lowered, &floor);
        assert_eq!(held.len(), 1);
        assert_eq!(held[0].to_string(), "max_connections 60 (asked 40)");
        assert!(below(&conf(&[("max_connections", "60")]), &floor).is_empty());
        // A default counts as asked: PostgreSQL's 8 workers against a floor of 16.
        let workers = parse_standby("max_worker_processes=16").unwrap();
        assert_eq!(below(&conf(&[]), &workers)[0].asked, 8);
    }
}
