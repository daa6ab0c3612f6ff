//! The `status` screen: which pod is the primary, whether every replica streams, when the last
//! backup was taken, and every condition that is not as it should be, for one cluster on one
//! screen. Pure: objects in, text out, so it is tested without an API server.

use std::collections::BTreeSet;
use std::fmt::Write;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use multigres_api::labels;
use multigres_api::v1alpha1::{
    CohortStatus, Phase, RecoverableWindow, Replication, Shard, TableGroup, VolumeUsage,
};

use crate::view::ClusterView;

/// Screen width the text wraps to, so it reads in an 80-100 column terminal.
const WIDTH: usize = 96;

/// Condition types whose `True` asks for attention (something is wrong or under way); for
/// every other type `True` is the good state.
const ATTENTION_WHEN_TRUE: [&str; 9] = [
    "Degraded",
    "Progressing",
    "ImageRolloutPending",
    "RollingUpdate",
    "Switchover",
    "Drain",
    "ScaleDown",
    "Paused",
    "Hibernated",
];

/// Whether a condition is in its good state: not worth a line on the screen.
pub fn is_ok(condition: &Condition) -> bool {
    let attention = ATTENTION_WHEN_TRUE.contains(&condition.type_.as_str());
    match condition.status.as_str() {
        "True" => !attention,
        "False" => attention,
        _ => false,
    }
}

/// The whole screen for `view`, with ages counted from `now`.
pub fn render(view: &ClusterView, now: Timestamp) -> String {
    let mut out = String::new();
    let cluster = &view.cluster;
    let status = cluster.status.clone().unwrap_or_default();
    let _ = writeln!(
        out,
        "MultigresCluster {}/{}: {}",
        cluster.namespace().unwrap_or_default(),
        cluster.name_any(),
        phase(status.phase)
    );
    message(&mut out, "  ", status.phase, status.message.as_deref());
    conditions(&mut out, "  ", &status.conditions);
    if let Some(gateway) = &status.gateway {
        let _ = writeln!(out, "  external gateway: {}", gateway.external_endpoint);
    }
    if let Some(request) = &status.backup_request {
        let mut line = format!(
            "backup request {}: {:?}, {}/{} shards completed",
            request.id, request.state, request.shards_completed, request.shards_total
        );
        if let Some(message) = &request.message {
            line.push_str(&format!("; {message}"));
        }
        wrap(&mut out, "  ", &line);
    }

    if !view.topo_servers.is_empty() {
        let _ = writeln!(out, "\nTopology servers");
        for topo in &view.topo_servers {
            let status = topo.status.clone().unwrap_or_default();
            let _ = writeln!(out, "  {}  {}", topo.name_any(), phase(status.phase));
            message(&mut out, "    ", status.phase, status.message.as_deref());
            conditions(&mut out, "    ", &status.conditions);
        }
    }

    let _ = writeln!(out, "\nCells");
    let mut rows = vec![vec![
        "CELL".to_owned(),
        "GATEWAYS READY".to_owned(),
        "PHASE".to_owned(),
    ]];
    let mut notes = Vec::new();
    for cell in &view.cells {
        let status = cell.status.clone().unwrap_or_default();
        let desired = cell
            .spec
            .multigateway
            .stateless
            .replicas
            .or(status.gateway_replicas);
        rows.push(vec![
            cell.spec.name.to_string(),
            format!(
                "{}/{}",
                status.gateway_ready_replicas.unwrap_or(0),
                desired.map_or("?".to_owned(), |d| d.to_string())
            ),
            phase(status.phase),
        ]);
        let mut lines = String::new();
        message(&mut lines, "    ", status.phase, status.message.as_deref());
        conditions(&mut lines, "    ", &status.conditions);
        if !lines.is_empty() {
            notes.push(format!("  cell {}:\n{lines}", cell.spec.name.as_str()));
        }
    }
    if view.cells.is_empty() {
        let _ = writeln!(out, "  none yet");
    } else {
        table(&mut out, "  ", &rows);
        notes.iter().for_each(|n| out.push_str(n));
    }

    let groups: BTreeSet<(&str, &str)> = view
        .shards
        .iter()
        .map(|s| {
            (
                s.spec.database_name.as_str(),
                s.spec.table_group_name.as_str(),
            )
        })
        .chain(view.table_groups.iter().map(|t| {
            (
                t.spec.database_name.as_str(),
                t.spec.table_group_name.as_str(),
            )
        }))
        .collect();
    if groups.is_empty() {
        let _ = writeln!(out, "\nNo table group or shard yet");
    }
    for (database, group) in groups {
        let table_group = view.table_groups.iter().find(|t| {
            t.spec.database_name.as_str() == database && t.spec.table_group_name.as_str() == group
        });
        let _ = writeln!(
            out,
            "\nDatabase {database}, table group {group}{}",
            table_group.map(table_group_summary).unwrap_or_default()
        );
        if let Some(status) = table_group.and_then(|t| t.status.as_ref()) {
            message(&mut out, "  ", status.phase, status.message.as_deref());
            conditions(&mut out, "  ", &status.conditions);
        }
        for shard in view.shards.iter().filter(|s| {
            s.spec.database_name.as_str() == database && s.spec.table_group_name.as_str() == group
        }) {
            render_shard(&mut out, shard, &view.pool_pods, now);
        }
    }
    out
}

fn table_group_summary(table_group: &TableGroup) -> String {
    let Some(status) = &table_group.status else {
        return ": no status yet".to_owned();
    };
    format!(
        ": {}, {}/{} shards ready",
        phase(status.phase),
        status.ready_shards.unwrap_or(0),
        status.total_shards.unwrap_or(0)
    )
}

/// One shard's block of the screen, top to bottom. Long (about 150 lines) on purpose: it is one
/// screen's layout, and read in one place its order is the output's.
fn render_shard(out: &mut String, shard: &Shard, pods: &[Pod], now: Timestamp) {
    let status = shard.status.clone().unwrap_or_default();
    let cohort = status.cohort.as_ref();
    let _ = writeln!(
        out,
        "  Shard {} ({}): {}{}",
        shard.spec.shard_name.as_str(),
        shard.name_any(),
        phase(status.phase),
        cohort.map_or(String::new(), |c| format!(", cohort {}", c.summary))
    );
    message(out, "    ", status.phase, status.message.as_deref());

    let own: Vec<&Pod> = pods.iter().filter(|p| belongs(p, shard)).collect();
    let names: BTreeSet<&str> = own
        .iter()
        .map(|p| p.metadata.name.as_deref().unwrap_or_default())
        .chain(status.pod_roles.keys().map(String::as_str))
        .chain(
            cohort
                .iter()
                .flat_map(|c| c.pods.keys().map(String::as_str)),
        )
        .collect();
    if names.is_empty() {
        let _ = writeln!(out, "    no pool pod yet");
    } else {
        let mut rows = vec![
            ["POD", "READY", "ROLE", "COHORT", "REPLICATION", "LAG"]
                .map(str::to_owned)
                .to_vec(),
        ];
        for name in names {
            let pod = own
                .iter()
                .find(|p| p.metadata.name.as_deref() == Some(name));
            rows.push(vec![
                name.to_owned(),
                pod.map_or("gone", |p| if is_ready(p) { "yes" } else { "no" })
                    .to_owned(),
                status.pod_roles.get(name).cloned().unwrap_or("-".into()),
                cohort.map_or("-".to_owned(), |c| membership(c, name).to_owned()),
                cohort
                    .and_then(|c| c.pods.get(name))
                    .map_or("-".to_owned(), |p| replication(p.replication).to_owned()),
                cohort
                    .and_then(|c| c.pods.get(name))
                    .map_or(String::new(), |p| match (p.replication, p.lag_mebibytes) {
                        (_, Some(mib)) => format!("{mib} MiB"),
                        (Replication::Streaming, None) => "<1 MiB".to_owned(),
                        _ => String::new(),
                    }),
            ]);
        }
        table(out, "    ", &rows);
    }
    match cohort {
        None => {
            let _ = writeln!(
                out,
                "    cohort: not published yet (no multipooler answered, or internalTLS is on)"
            );
        }
        Some(c) if !c.missing.is_empty() => {
            wrap(
                out,
                "    ",
                &format!(
                    "cohort members without a pod (still counted in every quorum): {}",
                    c.missing.join(", ")
                ),
            );
        }
        Some(_) => {}
    }

    for v in &status.volumes {
        wrap(out, "    ", &volume(v, now));
    }

    let backup = match (&status.last_backup_time, status.last_backup_type) {
        (Some(at), kind) => format!(
            "{} at {} ({} ago)",
            kind.map_or("backup".to_owned(), |k| format!("{k:?}").to_lowercase()),
            at.0,
            ago(now, at)
        ),
        (None, _) => "none".to_owned(),
    };
    let retained = match status.retained_backups.len() {
        0 => String::new(),
        n => format!("; {n} retained, newest {}", status.retained_backups[n - 1]),
    };
    wrap(out, "    ", &format!("last backup: {backup}{retained}"));
    if let Some(window) = &status.recoverable_window {
        wrap(out, "    ", &recoverable(window, now));
    }
    if let Some(scheduled) = &status.scheduled_backups {
        let mut parts = Vec::new();
        if let Some(running) = &scheduled.running {
            parts.push(format!(
                "running on {} since {}",
                running.pod, running.start_time.0
            ));
        }
        if let Some(next) = &scheduled.next_time {
            parts.push(format!("next at {}", next.0));
        }
        if let Some(failure) = &scheduled.last_failure {
            let newer_success = scheduled
                .last_success
                .as_ref()
                .is_some_and(|s| s.start_time.0 > failure.start_time.0);
            if !newer_success {
                parts.push(format!(
                    "last one failed at {} on {}: {}",
                    failure.start_time.0,
                    failure.pod,
                    failure.message.as_deref().unwrap_or("no reason given")
                ));
            }
        }
        if !parts.is_empty() {
            wrap(
                out,
                "    ",
                &format!("scheduled backups: {}", parts.join("; ")),
            );
        }
    }
    if let Some(requested) = &status.requested_backup {
        let mut line = format!("requested backup {}: {:?}", requested.id, requested.state);
        if let Some(backup) = &requested.backup {
            line.push_str(&format!(", {backup}"));
        }
        if let Some(pod) = &requested.pod {
            line.push_str(&format!(" on {pod}"));
        }
        if let Some(message) = &requested.message {
            line.push_str(&format!(": {message}"));
        }
        if let Some(queued) = &status.queued_request {
            line.push_str(&format!("; {} queued behind it", queued.id));
        }
        wrap(out, "    ", &line);
    }
    conditions(out, "    ", &status.conditions);
}

/// Whether `pod` is a pool pod of `shard`, by its topology labels.
fn belongs(pod: &Pod, shard: &Shard) -> bool {
    let labels = pod.labels();
    let is = |key: &str, value: &str| labels.get(key).map(String::as_str) == Some(value);
    is(labels::DATABASE, &shard.spec.database_name)
        && is(labels::TABLE_GROUP, &shard.spec.table_group_name)
        && is(labels::SHARD, &shard.spec.shard_name)
}

fn is_ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .iter()
            .flat_map(|s| s.conditions.iter().flatten())
            .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// `member` (of the current rule), `leader` (leads without being a listed member) or
/// `outside`.
fn membership(cohort: &CohortStatus, pod: &str) -> &'static str {
    match (
        cohort.pods.get(pod).is_some_and(|p| p.member),
        cohort.takes_part(pod),
    ) {
        (true, _) => "member",
        (false, true) => "leader",
        (false, false) => "outside",
    }
}

fn replication(replication: Replication) -> &'static str {
    match replication {
        Replication::Primary => "primary",
        Replication::Streaming => "streaming",
        Replication::NotStreaming => "NOT STREAMING",
        Replication::Unreachable => "UNREACHABLE",
    }
}

fn phase(phase: Option<Phase>) -> String {
    phase.map_or("no status yet".to_owned(), |p| format!("{p:?}"))
}

/// The phase's message, when the phase is not Healthy (a healthy object's message adds
/// nothing).
fn message(out: &mut String, indent: &str, phase: Option<Phase>, message: Option<&str>) {
    if let Some(text) = message.filter(|m| !m.is_empty() && phase != Some(Phase::Healthy)) {
        wrap(out, indent, text);
    }
}

/// One `! Type=Status (Reason): message` entry per condition that is not OK.
fn conditions(out: &mut String, indent: &str, conditions: &[Condition]) {
    for c in conditions.iter().filter(|c| !is_ok(c)) {
        let reason = match c.reason.as_str() {
            "" => String::new(),
            reason => format!(" ({reason})"),
        };
        let text = match c.message.as_str() {
            "" => String::new(),
            message => format!(": {message}"),
        };
        wrap(
            out,
            indent,
            &format!("! {}={}{reason}{text}", c.type_, c.status),
        );
    }
}

/// Writes `text` word-wrapped to [`WIDTH`], continuation lines indented two more spaces.
fn wrap(out: &mut String, indent: &str, text: &str) {
    let mut line = indent.to_owned();
    let mut fresh = true;
    for word in text.split_whitespace() {
        if !fresh && line.len() + 1 + word.len() > WIDTH {
            out.push_str(&line);
            out.push('\n');
            line = format!("{indent}  ");
            fresh = true;
        }
        if !fresh {
            line.push(' ');
        }
        line.push_str(word);
        fresh = false;
    }
    out.push_str(&line);
    out.push('\n');
}

/// Left-aligned columns two spaces apart.
fn table(out: &mut String, indent: &str, rows: &[Vec<String>]) {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|i| {
            rows.iter()
                .filter_map(|r| r.get(i))
                .map(String::len)
                .max()
                .unwrap_or(0)
        })
        .collect();
    for row in rows {
        let mut line = indent.to_owned();
        for (cell, width) in row.iter().zip(&widths) {
            let _ = write!(line, "{cell:width$}  ");
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
}

/// How long ago `then` was, in its largest unit and the next: `3d 2h`, `5m 10s`, `42s`.
/// The line of a shard's recoverable window: from the oldest backup's end to the last
/// archived WAL segment, and why it stops there while archiving fails.
fn recoverable(window: &RecoverableWindow, now: Timestamp) -> String {
    let earliest = match (&window.earliest, &window.earliest_backup) {
        (Some(at), Some(label)) => format!("{} (end of backup {label})", at.0),
        (Some(at), None) => at.0.to_string(),
        _ => "no complete backup".to_owned(),
    };
    let latest = match (&window.latest, &window.latest_wal) {
        (Some(at), Some(wal)) => format!("{} ({} ago, WAL {wal})", at.0, ago(now, at)),
        (Some(at), None) => at.0.to_string(),
        _ => "no WAL archived yet".to_owned(),
    };
    let mut line = format!("recoverable: {earliest} to {latest}");
    if let Some(failing) = &window.archive_failing {
        line.push_str(&format!("; ARCHIVING FAILS: {failing}"));
    }
    line
}

fn ago(now: Timestamp, then: &Time) -> String {
    let seconds = (now.as_second() - then.0.as_second()).max(0);
    let units = [("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)];
    let largest = units
        .iter()
        .position(|(_, size)| seconds >= *size)
        .unwrap_or(3);
    let (name, size) = units[largest];
    let mut text = format!("{}{name}", seconds / size);
    if let Some((next, next_size)) = units.get(largest + 1) {
        let rest = seconds % size / next_size;
        if rest > 0 {
            let _ = write!(text, " {rest}{next}");
        }
    }
    text
}

/// One pool pod's volume line: PostgreSQL's data and WAL over what the claim holds.
fn volume(v: &VolumeUsage, now: Timestamp) -> String {
    let mib = |bytes: i64| bytes.div_euclid(1 << 20);
    let capacity = match v.capacity_bytes {
        Some(c) if c > 0 => format!(
            "of {} MiB ({} %)",
            mib(c),
            v.used_bytes().saturating_mul(100) / c
        ),
        _ => "(claim not bound yet)".to_owned(),
    };
    format!(
        "volume of {}: {} MiB used (WAL {} MiB) {capacity}, measured {} ago",
        v.pod,
        mib(v.used_bytes()),
        mib(v.wal_bytes),
        ago(now, &v.measured_at)
    )
}

#[cfg(test)]
pub(crate) mod tests {
    use serde::Deserialize;

    use super::*;

    /// The objects of a multi-document YAML fixture, by kind.
    pub(crate) fn fixture(yaml: &str) -> ClusterView {
        let mut clusters = Vec::new();
        let (mut cells, mut topo_servers, mut table_groups) = (vec![], vec![], vec![]);
        let (mut shards, mut pool_pods) = (vec![], vec![]);
        for doc in serde_yaml::Deserializer::from_str(yaml) {
            let value = serde_yaml::Value::deserialize(doc).expect("YAML document");
            let kind = value["kind"].as_str().expect("kind").to_owned();
            match kind.as_str() {
                "MultigresCluster" => clusters.push(object(&value)),
                "Cell" => cells.push(object(&value)),
                "TopoServer" => topo_servers.push(object(&value)),
                "TableGroup" => table_groups.push(object(&value)),
                "Shard" => shards.push(object(&value)),
                "Pod" => pool_pods.push(object(&value)),
                other => panic!("unexpected kind {other}"),
            }
        }
        ClusterView {
            cluster: clusters.pop().expect("a MultigresCluster"),
            cells,
            topo_servers,
            table_groups,
            shards,
            pool_pods,
        }
    }

    fn object<T: serde::de::DeserializeOwned>(value: &serde_yaml::Value) -> T {
        serde_yaml::from_value(value.clone()).unwrap_or_else(|e| panic!("{value:?}: {e}"))
    }

    fn at(time: &str) -> Timestamp {
        time.parse().unwrap()
    }

    fn degraded() -> ClusterView {
        fixture(include_str!("../fixtures/degraded.yaml"))
    }

    #[test]
    fn the_screen_names_the_primary_the_streaming_replica_the_one_outside_and_the_stale_backup() {
        let screen = render(&degraded(), at("2026-01-10T05:30:00Z"));
        assert_eq!(screen, include_str!("../fixtures/degraded.txt"), "{screen}");
        assert!(screen.lines().all(|l| l.len() <= 100), "fits 100 columns");
    }

    #[test]
    fn only_conditions_that_are_not_ok_are_shown() {
        let screen = render(&degraded(), at("2026-01-10T05:30:00Z"));
        for shown in [
            "Degraded=True",
            "CohortHealthy=False",
            "BackupHealthy=False",
        ] {
            assert!(screen.contains(shown), "{shown} in\n{screen}");
        }
        for hidden in [
            "Available",
            "FailureTolerant",
            "RollingUpdate",
            "TopologyRegistered",
        ] {
            assert!(!screen.contains(hidden), "{hidden} not in\n{screen}");
        }
        let condition = |type_: &str, status: &str| Condition {
            type_: type_.into(),
            status: status.into(),
            reason: String::new(),
            message: String::new(),
            last_transition_time: Time(at("2026-01-10T05:00:00Z")),
            observed_generation: None,
        };
        assert!(is_ok(&condition("Available", "True")));
        assert!(!is_ok(&condition("Available", "Unknown")));
        assert!(is_ok(&condition("Switchover", "False")));
        assert!(!is_ok(&condition("Switchover", "True")));
        assert!(!is_ok(&condition("Paused", "True")));
    }

    #[test]
    fn a_shard_without_cohort_or_backup_says_so() {
        let mut view = degraded();
        let status = view.shards[0].status.as_mut().unwrap();
        status.cohort = None;
        status.last_backup_time = None;
        status.last_backup_type = None;
        status.retained_backups.clear();
        status.scheduled_backups = None;
        view.pool_pods.pop();
        let screen = render(&view, at("2026-01-10T05:30:00Z"));
        assert!(screen.contains("cohort: not published yet"), "{screen}");
        assert!(screen.contains("last backup: none"), "{screen}");
        let zone_b = screen
            .lines()
            .find(|l| l.contains("pool-main-zone-b-0  "))
            .expect("the pod the status still names");
        assert_eq!(
            zone_b.split_whitespace().collect::<Vec<_>>(),
            [
                "prod-postgres-default-0-inf-pool-main-zone-b-0",
                "gone",
                "REPLICA",
                "-",
                "-"
            ]
        );
    }

    #[test]
    fn each_pool_pods_volume_shows_use_wal_and_capacity() {
        let mut view = degraded();
        let status = view.shards[0].status.as_mut().unwrap();
        status.volumes = vec![
            VolumeUsage {
                pod: "p-0".into(),
                data_bytes: 700 << 20,
                wal_bytes: 160 << 20,
                capacity_bytes: Some(1 << 30),
                measured_at: Time(at("2026-01-10T05:29:40Z")),
            },
            VolumeUsage {
                pod: "p-1".into(),
                data_bytes: 10 << 20,
                wal_bytes: 0,
                capacity_bytes: None,
                measured_at: Time(at("2026-01-10T05:29:40Z")),
            },
        ];
        let screen = render(&view, at("2026-01-10T05:30:00Z"));
        for line in [
            "    volume of p-0: 860 MiB used (WAL 160 MiB) of 1024 MiB (83 %), measured 20s ago",
            "    volume of p-1: 10 MiB used (WAL 0 MiB) (claim not bound yet), measured 20s ago",
        ] {
            assert!(screen.lines().any(|l| l == line), "{line} in\n{screen}");
        }
    }

    #[test]
    fn ages_use_the_two_largest_units() {
        let then = Time(at("2026-01-10T05:00:00Z"));
        assert_eq!(ago(at("2026-01-10T05:00:42Z"), &then), "42s");
        assert_eq!(ago(at("2026-01-10T05:03:00Z"), &then), "3m");
        assert_eq!(ago(at("2026-01-12T07:03:00Z"), &then), "2d 2h");
        assert_eq!(ago(at("2026-01-10T04:00:00Z"), &then), "0s", "clock skew");
    }
}
