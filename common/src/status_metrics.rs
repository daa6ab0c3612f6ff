//! Gauges that describe the objects the operator manages (the seed README's table): cluster
//! phase and size, gateway, pool and topology-server replicas, and a Shard's conditions.
//!
//! They are computed at scrape time from what a handler already caches, the way a Prometheus
//! client library's custom collector works: a handler [`register`]s a collector that fills a
//! fresh [`StatusGauges`] from its watch caches, and `/metrics` renders the result. A deleted
//! object, or a cluster that changed phase, is simply no longer there, so no stale series is
//! left behind for alerts to fire on (the `metrics` facade cannot remove a series). A standby's
//! caches are empty, so only the acting replica reports.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Mutex, MutexGuard};

/// Cluster phase: 1 for the current phase (`name`, `namespace`, `phase`).
pub const CLUSTER_INFO: &str = "multigres_operator_cluster_info";
/// Cells of a cluster (`cluster`, `namespace`).
pub const CLUSTER_CELLS_TOTAL: &str = "multigres_operator_cluster_cells_total";
/// Shards of a cluster (`cluster`, `namespace`).
pub const CLUSTER_SHARDS_TOTAL: &str = "multigres_operator_cluster_shards_total";
/// Gateway replicas of a cell (`cell`, `namespace`, `state` = `desired` or `ready`).
pub const CELL_GATEWAY_REPLICAS: &str = "multigres_operator_cell_gateway_replicas";
/// Replicas of a shard's pool, over all its cells (`shard`, `pool`, `namespace`, `state`).
pub const SHARD_POOL_REPLICAS: &str = "multigres_operator_shard_pool_replicas";
/// Replicas of a topology server (`name`, `namespace`, `state`).
pub const TOPOSERVER_REPLICAS: &str = "multigres_operator_toposerver_replicas";
/// A shard's consensus cohort (`shard`, `namespace`, `state` = `members`, `healthy`,
/// `required`, `pods`).
pub const SHARD_COHORT_MEMBERS: &str = "multigres_operator_shard_cohort_members";
/// Pool pods serving as a shard's primary (`shard`, `namespace`): 0 means no pod takes writes,
/// which no replica count shows; set alongside the cohort gauges.
pub const SHARD_PRIMARIES: &str = "multigres_operator_shard_primaries";
/// How far a pool pod's replay is behind its primary (`shard`, `namespace`, `pod`), in whole
/// MiB as the Shard status publishes it (0 below 1 MiB).
pub const SHARD_REPLICATION_LAG_BYTES: &str = "multigres_operator_shard_replication_lag_bytes";
/// When a shard's newest complete backup completed, in seconds since the epoch (`shard`,
/// `namespace`): an alert takes its age as `time() - ...`.
pub const SHARD_LAST_BACKUP_TIMESTAMP: &str =
    "multigres_operator_shard_last_backup_timestamp_seconds";
/// Bytes of a pool pod's data volume PostgreSQL uses (`shard`, `namespace`, `pod`, `kind` =
/// `data` or `wal`), as the Shard's `status.volumes` publishes them.
pub const SHARD_VOLUME_USED_BYTES: &str = "multigres_operator_shard_volume_used_bytes";
/// Bytes storage gave a pool pod's data volume (`shard`, `namespace`, `pod`).
pub const SHARD_VOLUME_CAPACITY_BYTES: &str = "multigres_operator_shard_volume_capacity_bytes";
/// A Shard's conditions, whichever handler wrote them: 1 for each condition's current status and
/// reason (`shard`, `namespace`, `condition`, `status`, `reason`), so an alert can fire on a
/// condition that no count shows, saying why.
pub const SHARD_CONDITION: &str = "multigres_operator_shard_condition";

/// Every family, with its HELP text, in the order rendered.
pub const FAMILIES: [(&str, &str); 13] = [
    (
        CLUSTER_INFO,
        "MultigresCluster phase: 1 for the cluster's current phase.",
    ),
    (CLUSTER_CELLS_TOTAL, "Cells of a MultigresCluster."),
    (CLUSTER_SHARDS_TOTAL, "Shards of a MultigresCluster."),
    (
        CELL_GATEWAY_REPLICAS,
        "multigateway replicas of a Cell, desired and ready.",
    ),
    (
        SHARD_POOL_REPLICAS,
        "PostgreSQL pool replicas of a Shard over all its cells, desired and ready.",
    ),
    (
        TOPOSERVER_REPLICAS,
        "etcd replicas of a TopoServer, desired and ready.",
    ),
    (
        SHARD_COHORT_MEMBERS,
        "Consensus cohort of a Shard: members, healthy members (the primary and standbys streaming from it), members a commit needs, and pool pods.",
    ),
    (
        SHARD_PRIMARIES,
        "Pool pods of a Shard serving as its primary: named primary by the topology and answering as the primary.",
    ),
    (
        SHARD_REPLICATION_LAG_BYTES,
        "How far a pool pod's replay is behind the primary, in whole MiB (0 below 1 MiB).",
    ),
    (
        SHARD_LAST_BACKUP_TIMESTAMP,
        "When the newest complete backup of a Shard completed, in seconds since the epoch.",
    ),
    (
        SHARD_VOLUME_USED_BYTES,
        "Bytes of a pool pod's data volume used by PostgreSQL: its databases (kind data) and its WAL (kind wal).",
    ),
    (
        SHARD_VOLUME_CAPACITY_BYTES,
        "Bytes storage gave a pool pod's data volume claim.",
    ),
    (
        SHARD_CONDITION,
        "A Shard's condition: 1 for its current status and reason.",
    ),
];

/// A shard's cohort counts, as its status publishes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cohort {
    /// Members of the current rule, with or without a pod.
    pub members: i64,
    /// Members that are the primary or stream from it.
    pub healthy: i64,
    /// Members (or cells) a commit needs.
    pub required: i64,
    /// Pool pods of the shard.
    pub pods: i64,
}

/// Desired and ready replica counts, as reported in status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Replicas {
    /// Replicas the spec asks for.
    pub desired: i64,
    /// Replicas ready now.
    pub ready: i64,
}

/// Label pairs of one series, in output order.
type Labels = Vec<(&'static str, String)>;

/// A collector: fills the gauges from the handler's caches at every scrape.
type Collector = Box<dyn Fn(&mut StatusGauges) + Send + Sync>;

static COLLECTORS: Mutex<Vec<Collector>> = Mutex::new(Vec::new());

fn collectors() -> MutexGuard<'static, Vec<Collector>> {
    // Collectors only read caches; keep the list if one ever panicked.
    COLLECTORS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Adds a collector run at every scrape of `/metrics`; it sets the gauges of the objects the
/// handler currently knows.
pub fn register(collector: impl Fn(&mut StatusGauges) + Send + Sync + 'static) {
    collectors().push(Box::new(collector));
}

/// The gauges of every registered collector, in the Prometheus text format.
pub fn render() -> String {
    let mut gauges = StatusGauges::default();
    for collector in collectors().iter() {
        collector(&mut gauges);
    }
    gauges.render()
}

/// The series of one scrape, per family.
#[derive(Debug, Default)]
pub struct StatusGauges {
    series: BTreeMap<&'static str, Vec<(Labels, f64)>>,
}

fn replica_series(labels: &Labels, replicas: Replicas) -> Vec<(Labels, f64)> {
    [("desired", replicas.desired), ("ready", replicas.ready)]
        .into_iter()
        .map(|(state, value)| {
            let mut labels = labels.clone();
            labels.push(("state", state.to_owned()));
            (labels, value as f64)
        })
        .collect()
}

impl StatusGauges {
    fn add(&mut self, family: &'static str, series: impl IntoIterator<Item = (Labels, f64)>) {
        self.series.entry(family).or_default().extend(series);
    }

    /// A MultigresCluster: its phase (`Unknown` before it has one) and its cell and shard
    /// counts.
    pub fn set_cluster(
        &mut self,
        namespace: &str,
        name: &str,
        phase: &str,
        cells: u64,
        shards: u64,
    ) {
        let info = vec![
            ("name", name.to_owned()),
            ("namespace", namespace.to_owned()),
            ("phase", phase.to_owned()),
        ];
        let by_cluster = vec![
            ("cluster", name.to_owned()),
            ("namespace", namespace.to_owned()),
        ];
        self.add(CLUSTER_INFO, [(info, 1.0)]);
        self.add(CLUSTER_CELLS_TOTAL, [(by_cluster.clone(), cells as f64)]);
        self.add(CLUSTER_SHARDS_TOTAL, [(by_cluster, shards as f64)]);
    }

    /// A Cell's gateway replicas.
    pub fn set_cell_gateway(&mut self, namespace: &str, cell: &str, replicas: Replicas) {
        let labels = vec![
            ("cell", cell.to_owned()),
            ("namespace", namespace.to_owned()),
        ];
        self.add(CELL_GATEWAY_REPLICAS, replica_series(&labels, replicas));
    }

    /// The replicas of one pool of a Shard, over all its cells.
    pub fn set_shard_pool(&mut self, namespace: &str, shard: &str, pool: &str, replicas: Replicas) {
        let labels = vec![
            ("shard", shard.to_owned()),
            ("pool", pool.to_owned()),
            ("namespace", namespace.to_owned()),
        ];
        self.add(SHARD_POOL_REPLICAS, replica_series(&labels, replicas));
    }

    /// A Shard's cohort counts, and each pool pod's replication lag (`lag`: pod, bytes).
    pub fn set_shard_cohort(
        &mut self,
        namespace: &str,
        shard: &str,
        cohort: Cohort,
        lag: impl IntoIterator<Item = (String, i64)>,
    ) {
        let labels = vec![
            ("shard", shard.to_owned()),
            ("namespace", namespace.to_owned()),
        ];
        let counts = [
            ("members", cohort.members),
            ("healthy", cohort.healthy),
            ("required", cohort.required),
            ("pods", cohort.pods),
        ]
        .map(|(state, value)| {
            let mut labels = labels.clone();
            labels.push(("state", state.to_owned()));
            (labels, value as f64)
        });
        self.add(SHARD_COHORT_MEMBERS, counts);
        let lag = lag.into_iter().map(|(pod, bytes)| {
            let mut labels = labels.clone();
            labels.push(("pod", pod));
            (labels, bytes as f64)
        });
        self.add(SHARD_REPLICATION_LAG_BYTES, lag);
    }

    /// How many pool pods of a Shard serve as its primary.
    pub fn set_shard_primaries(&mut self, namespace: &str, shard: &str, primaries: i64) {
        let labels = vec![
            ("shard", shard.to_owned()),
            ("namespace", namespace.to_owned()),
        ];
        self.add(SHARD_PRIMARIES, [(labels, primaries as f64)]);
    }

    /// When a Shard's newest complete backup completed (seconds since the epoch).
    pub fn set_shard_last_backup(&mut self, namespace: &str, shard: &str, completed: i64) {
        let labels = vec![
            ("shard", shard.to_owned()),
            ("namespace", namespace.to_owned()),
        ];
        self.add(SHARD_LAST_BACKUP_TIMESTAMP, [(labels, completed as f64)]);
    }

    /// A pool pod's volume: data and WAL bytes used, and the claim's capacity once bound.
    pub fn set_shard_volume(
        &mut self,
        namespace: &str,
        shard: &str,
        pod: &str,
        (data, wal): (i64, i64),
        capacity: Option<i64>,
    ) {
        let labels = vec![
            ("shard", shard.to_owned()),
            ("namespace", namespace.to_owned()),
            ("pod", pod.to_owned()),
        ];
        let used = [("data", data), ("wal", wal)].map(|(kind, bytes)| {
            let mut labels = labels.clone();
            labels.push(("kind", kind.to_owned()));
            (labels, bytes as f64)
        });
        self.add(SHARD_VOLUME_USED_BYTES, used);
        if let Some(capacity) = capacity {
            self.add(SHARD_VOLUME_CAPACITY_BYTES, [(labels, capacity as f64)]);
        }
    }

    /// One condition of a Shard: its type, status and reason.
    pub fn set_shard_condition(
        &mut self,
        namespace: &str,
        shard: &str,
        condition: &str,
        status: &str,
        reason: &str,
    ) {
        let labels = vec![
            ("shard", shard.to_owned()),
            ("namespace", namespace.to_owned()),
            ("condition", condition.to_owned()),
            ("status", status.to_owned()),
            ("reason", reason.to_owned()),
        ];
        self.add(SHARD_CONDITION, [(labels, 1.0)]);
    }

    /// A TopoServer's replicas.
    pub fn set_toposerver(&mut self, namespace: &str, name: &str, replicas: Replicas) {
        let labels = vec![
            ("name", name.to_owned()),
            ("namespace", namespace.to_owned()),
        ];
        self.add(TOPOSERVER_REPLICAS, replica_series(&labels, replicas));
    }

    /// The series in the Prometheus text format; families without series are left out.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for (family, help) in FAMILIES {
            let Some(series) = self.series.get(family).filter(|s| !s.is_empty()) else {
                continue;
            };
            let mut lines: Vec<String> = series
                .iter()
                .map(|(labels, value)| sample_line(family, labels, *value))
                .collect();
            lines.sort_unstable();
            lines.dedup();
            let _ = writeln!(out, "# HELP {family} {help}");
            let _ = writeln!(out, "# TYPE {family} gauge");
            for line in lines {
                out.push_str(&line);
                out.push('\n');
            }
        }
        out
    }
}

fn sample_line(family: &str, labels: &Labels, value: f64) -> String {
    let labels = labels
        .iter()
        .map(|(key, value)| format!("{key}=\"{}\"", escape(value)))
        .collect::<Vec<_>>()
        .join(",");
    format!("{family}{{{labels}}} {value}")
}

/// Escapes a label value as the text exposition format requires.
fn escape(value: &str) -> String {
    value
        .replace('\\', r"\\")
        .replace('"', r#"\""#)
        .replace('\n', r"\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str) -> Vec<&str> {
        text.lines().collect()
    }

    #[test]
    fn nothing_set_renders_nothing() {
        assert_eq!(StatusGauges::default().render(), "");
    }

    #[test]
    fn a_cluster_renders_its_three_families() {
        let mut gauges = StatusGauges::default();
        gauges.set_cluster("db", "main", "Healthy", 2, 3);
        assert_eq!(
            lines(&gauges.render()),
            [
                "# HELP multigres_operator_cluster_info MultigresCluster phase: 1 for the cluster's current phase.",
                "# TYPE multigres_operator_cluster_info gauge",
                r#"multigres_operator_cluster_info{name="main",namespace="db",phase="Healthy"} 1"#,
                "# HELP multigres_operator_cluster_cells_total Cells of a MultigresCluster.",
                "# TYPE multigres_operator_cluster_cells_total gauge",
                r#"multigres_operator_cluster_cells_total{cluster="main",namespace="db"} 2"#,
                "# HELP multigres_operator_cluster_shards_total Shards of a MultigresCluster.",
                "# TYPE multigres_operator_cluster_shards_total gauge",
                r#"multigres_operator_cluster_shards_total{cluster="main",namespace="db"} 3"#,
            ]
        );
    }

    #[test]
    fn replicas_render_desired_and_ready_per_object() {
        let mut gauges = StatusGauges::default();
        let replicas = Replicas {
            desired: 3,
            ready: 1,
        };
        gauges.set_toposerver("db", "main-global", replicas);
        gauges.set_cell_gateway("db", "main-zone-a", replicas);
        gauges.set_shard_pool("db", "main-postgres-default-0-inf", "default", replicas);
        let text = gauges.render();
        for expected in [
            r#"multigres_operator_cell_gateway_replicas{cell="main-zone-a",namespace="db",state="desired"} 3"#,
            r#"multigres_operator_cell_gateway_replicas{cell="main-zone-a",namespace="db",state="ready"} 1"#,
            r#"multigres_operator_shard_pool_replicas{shard="main-postgres-default-0-inf",pool="default",namespace="db",state="ready"} 1"#,
            r#"multigres_operator_toposerver_replicas{name="main-global",namespace="db",state="desired"} 3"#,
        ] {
            assert!(text.contains(expected), "{expected} missing in:\n{text}");
        }
        assert_eq!(text.matches("# TYPE").count(), 3, "{text}");
    }

    #[test]
    fn a_shard_cohort_renders_its_counts_and_each_pods_lag() {
        let mut gauges = StatusGauges::default();
        let cohort = Cohort {
            members: 3,
            healthy: 2,
            required: 2,
            pods: 3,
        };
        gauges.set_shard_cohort("db", "s", cohort, [("s-1".to_owned(), 3 << 20)]);
        let text = gauges.render();
        for expected in [
            r#"multigres_operator_shard_cohort_members{shard="s",namespace="db",state="members"} 3"#,
            r#"multigres_operator_shard_cohort_members{shard="s",namespace="db",state="healthy"} 2"#,
            r#"multigres_operator_shard_cohort_members{shard="s",namespace="db",state="required"} 2"#,
            r#"multigres_operator_shard_cohort_members{shard="s",namespace="db",state="pods"} 3"#,
            r#"multigres_operator_shard_replication_lag_bytes{shard="s",namespace="db",pod="s-1"} 3145728"#,
        ] {
            assert!(text.contains(expected), "{expected} missing in:\n{text}");
        }
    }

    #[test]
    fn a_shard_without_a_primary_renders_zero_primaries() {
        let mut gauges = StatusGauges::default();
        gauges.set_shard_primaries("db", "lost", 0);
        gauges.set_shard_primaries("db", "whole", 1);
        assert_eq!(
            lines(&gauges.render()),
            [
                "# HELP multigres_operator_shard_primaries Pool pods of a Shard serving as its primary: named primary by the topology and answering as the primary.",
                "# TYPE multigres_operator_shard_primaries gauge",
                r#"multigres_operator_shard_primaries{shard="lost",namespace="db"} 0"#,
                r#"multigres_operator_shard_primaries{shard="whole",namespace="db"} 1"#,
            ]
        );
    }

    #[test]
    fn a_shards_last_backup_renders_as_a_timestamp() {
        let mut gauges = StatusGauges::default();
        gauges.set_shard_last_backup("db", "s", 1_795_629_420);
        assert!(gauges.render().contains(
            r#"multigres_operator_shard_last_backup_timestamp_seconds{shard="s",namespace="db"} 1795629420"#
        ));
    }

    #[test]
    fn a_pool_pods_volume_renders_data_wal_and_capacity() {
        let mut gauges = StatusGauges::default();
        gauges.set_shard_volume("db", "s", "s-0", (3 << 20, 1 << 20), Some(1 << 30));
        gauges.set_shard_volume("db", "s", "s-1", (3 << 20, 1 << 20), None);
        let text = gauges.render();
        for expected in [
            r#"multigres_operator_shard_volume_used_bytes{shard="s",namespace="db",pod="s-0",kind="data"} 3145728"#,
            r#"multigres_operator_shard_volume_used_bytes{shard="s",namespace="db",pod="s-0",kind="wal"} 1048576"#,
            r#"multigres_operator_shard_volume_capacity_bytes{shard="s",namespace="db",pod="s-0"} 1073741824"#,
        ] {
            assert!(text.contains(expected), "{expected} missing in:\n{text}");
        }
        assert!(!text.contains(r#"capacity_bytes{shard="s",namespace="db",pod="s-1"}"#));
    }

    #[test]
    fn a_shards_conditions_render_with_status_and_reason() {
        let mut gauges = StatusGauges::default();
        gauges.set_shard_condition(
            "db",
            "s",
            "PrimaryServing",
            "False",
            "ConnectionSlotsExhausted",
        );
        gauges.set_shard_condition("db", "s", "CohortHealthy", "True", "CohortComplete");
        assert_eq!(
            lines(&gauges.render()),
            [
                "# HELP multigres_operator_shard_condition A Shard's condition: 1 for its current status and reason.",
                "# TYPE multigres_operator_shard_condition gauge",
                r#"multigres_operator_shard_condition{shard="s",namespace="db",condition="CohortHealthy",status="True",reason="CohortComplete"} 1"#,
                r#"multigres_operator_shard_condition{shard="s",namespace="db",condition="PrimaryServing",status="False",reason="ConnectionSlotsExhausted"} 1"#,
            ]
        );
    }

    #[test]
    fn registered_collectors_run_at_every_render() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicU64, Ordering};
        let cells = Arc::new(AtomicU64::new(1));
        let seen = cells.clone();
        register(move |gauges| {
            gauges.set_cluster(
                "collector-test",
                "c",
                "Progressing",
                seen.load(Ordering::SeqCst),
                1,
            );
        });
        assert!(render().contains(
            r#"multigres_operator_cluster_cells_total{cluster="c",namespace="collector-test"} 1"#
        ));
        cells.store(4, Ordering::SeqCst);
        assert!(render().contains(
            r#"multigres_operator_cluster_cells_total{cluster="c",namespace="collector-test"} 4"#
        ));
    }

    #[test]
    fn label_values_are_escaped() {
        let mut gauges = StatusGauges::default();
        gauges.set_cluster("db", "main", "say \"hi\"\\\n", 0, 0);
        assert!(
            gauges.render().contains(r#"phase="say \"hi\"\\\n"} 1"#),
            "{}",
            gauges.render()
        );
    }
}
