//! Gauges that describe the objects the operator manages (the seed README's table): cluster
//! phase and size, gateway, pool and topology-server replicas.
//!
//! They live outside the `metrics` facade because they are per object: when a cluster changes
//! phase or a cell is deleted, its old series must disappear from `/metrics` (as Prometheus
//! client libraries' `DeletePartialMatch` does), otherwise alerts such as "no ready gateway"
//! would fire forever for objects that no longer exist. The facade cannot remove a series.
//!
//! A handler sets an object's gauges after computing its status and removes them when the
//! object is gone; [`render`] appends them to the `/metrics` output.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{LazyLock, Mutex, MutexGuard};

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

/// Every family, with its HELP text, in the order rendered.
pub const FAMILIES: [(&str, &str); 6] = [
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
];

/// Desired and ready replica counts, as reported in status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Replicas {
    /// Replicas the spec asks for.
    pub desired: i64,
    /// Replicas ready now.
    pub ready: i64,
}

/// The object a set of series belongs to: kind, namespace, name.
type Owner = (&'static str, String, String);
/// Label pairs of one series, in output order.
type Labels = Vec<(&'static str, String)>;
/// Series per (family, owning object).
type SeriesMap = BTreeMap<(&'static str, Owner), Vec<(Labels, f64)>>;

/// Current series per family and owning object.
#[derive(Debug, Default)]
pub struct StatusGauges {
    series: Mutex<SeriesMap>,
}

/// The process-wide gauges rendered on `/metrics`.
pub fn global() -> &'static StatusGauges {
    static GLOBAL: LazyLock<StatusGauges> = LazyLock::new(StatusGauges::default);
    &GLOBAL
}

/// [`StatusGauges::render`] of the process-wide gauges.
pub fn render() -> String {
    global().render()
}

fn owner(kind: &'static str, namespace: &str, name: &str) -> Owner {
    (kind, namespace.to_owned(), name.to_owned())
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
    fn lock(&self) -> MutexGuard<'_, SeriesMap> {
        // Nothing panics while holding the lock; keep the data if something ever does.
        self.series.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn replace(&self, family: &'static str, owner: Owner, series: Vec<(Labels, f64)>) {
        self.lock().insert((family, owner), series);
    }

    fn remove(&self, kind: &'static str, namespace: &str, name: &str) {
        let gone = owner(kind, namespace, name);
        self.lock().retain(|(_, owner), _| *owner != gone);
    }

    /// Sets a MultigresCluster's phase (the previous phase's series goes away) and its cell and
    /// shard counts.
    pub fn set_cluster(&self, namespace: &str, name: &str, phase: &str, cells: u64, shards: u64) {
        let who = owner("MultigresCluster", namespace, name);
        let info = vec![(
            vec![
                ("name", name.to_owned()),
                ("namespace", namespace.to_owned()),
                ("phase", phase.to_owned()),
            ],
            1.0,
        )];
        let by_cluster = vec![
            ("cluster", name.to_owned()),
            ("namespace", namespace.to_owned()),
        ];
        self.replace(CLUSTER_INFO, who.clone(), info);
        self.replace(
            CLUSTER_CELLS_TOTAL,
            who.clone(),
            vec![(by_cluster.clone(), cells as f64)],
        );
        self.replace(CLUSTER_SHARDS_TOTAL, who, vec![(by_cluster, shards as f64)]);
    }

    /// Drops every series of a deleted MultigresCluster.
    pub fn remove_cluster(&self, namespace: &str, name: &str) {
        self.remove("MultigresCluster", namespace, name);
    }

    /// Sets a Cell's gateway replicas.
    pub fn set_cell_gateway(&self, namespace: &str, cell: &str, replicas: Replicas) {
        let labels = vec![
            ("cell", cell.to_owned()),
            ("namespace", namespace.to_owned()),
        ];
        self.replace(
            CELL_GATEWAY_REPLICAS,
            owner("Cell", namespace, cell),
            replica_series(&labels, replicas),
        );
    }

    /// Drops every series of a deleted Cell.
    pub fn remove_cell(&self, namespace: &str, cell: &str) {
        self.remove("Cell", namespace, cell);
    }

    /// Sets the replicas of every pool of a Shard; pools not listed lose their series.
    pub fn set_shard_pools<'a>(
        &self,
        namespace: &str,
        shard: &str,
        pools: impl IntoIterator<Item = (&'a str, Replicas)>,
    ) {
        let series = pools
            .into_iter()
            .flat_map(|(pool, replicas)| {
                let labels = vec![
                    ("shard", shard.to_owned()),
                    ("pool", pool.to_owned()),
                    ("namespace", namespace.to_owned()),
                ];
                replica_series(&labels, replicas)
            })
            .collect();
        self.replace(
            SHARD_POOL_REPLICAS,
            owner("Shard", namespace, shard),
            series,
        );
    }

    /// Drops every series of a deleted Shard.
    pub fn remove_shard(&self, namespace: &str, shard: &str) {
        self.remove("Shard", namespace, shard);
    }

    /// Sets a TopoServer's replicas.
    pub fn set_toposerver(&self, namespace: &str, name: &str, replicas: Replicas) {
        let labels = vec![
            ("name", name.to_owned()),
            ("namespace", namespace.to_owned()),
        ];
        self.replace(
            TOPOSERVER_REPLICAS,
            owner("TopoServer", namespace, name),
            replica_series(&labels, replicas),
        );
    }

    /// Drops every series of a deleted TopoServer.
    pub fn remove_toposerver(&self, namespace: &str, name: &str) {
        self.remove("TopoServer", namespace, name);
    }

    /// The current series in the Prometheus text format; families without series are left out.
    pub fn render(&self) -> String {
        let series = self.lock();
        let mut out = String::new();
        for (family, help) in FAMILIES {
            let mut lines: Vec<String> = series
                .iter()
                .filter(|((name, _), _)| *name == family)
                .flat_map(|(_, samples)| samples)
                .map(|(labels, value)| sample_line(family, labels, *value))
                .collect();
            if lines.is_empty() {
                continue;
            }
            lines.sort_unstable();
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
    fn cluster_phase_change_replaces_the_old_series() {
        let gauges = StatusGauges::default();
        gauges.set_cluster("db", "main", "Initializing", 1, 1);
        gauges.set_cluster("db", "main", "Healthy", 2, 3);
        let text = gauges.render();
        assert_eq!(
            lines(&text),
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
    fn removing_an_object_removes_only_its_series() {
        let gauges = StatusGauges::default();
        let replicas = Replicas {
            desired: 2,
            ready: 1,
        };
        gauges.set_cell_gateway("db", "zone-a", replicas);
        gauges.set_cell_gateway("db", "zone-b", replicas);
        gauges.set_toposerver("db", "zone-a", replicas);
        gauges.remove_cell("db", "zone-a");
        let text = gauges.render();
        assert!(!text.contains(r#"cell="zone-a""#), "{text}");
        assert!(
            text.contains(
                r#"multigres_operator_cell_gateway_replicas{cell="zone-b",namespace="db",state="ready"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(
                r#"multigres_operator_toposerver_replicas{name="zone-a",namespace="db",state="desired"} 2"#
            ),
            "a TopoServer named like the removed Cell keeps its series:\n{text}"
        );

        gauges.remove_cell("db", "zone-b");
        gauges.remove_toposerver("db", "zone-a");
        assert_eq!(gauges.render(), "");
    }

    #[test]
    fn shard_pools_are_replaced_as_a_set() {
        let gauges = StatusGauges::default();
        let two = Replicas {
            desired: 2,
            ready: 2,
        };
        gauges.set_shard_pools(
            "db",
            "main-postgres-default-0-inf",
            [("a", two), ("b", two)],
        );
        gauges.set_shard_pools(
            "db",
            "main-postgres-default-0-inf",
            [(
                "b",
                Replicas {
                    desired: 3,
                    ready: 0,
                },
            )],
        );
        let text = gauges.render();
        assert_eq!(
            lines(&text)[2..],
            [
                r#"multigres_operator_shard_pool_replicas{shard="main-postgres-default-0-inf",pool="b",namespace="db",state="desired"} 3"#,
                r#"multigres_operator_shard_pool_replicas{shard="main-postgres-default-0-inf",pool="b",namespace="db",state="ready"} 0"#,
            ]
        );
        gauges.remove_shard("db", "main-postgres-default-0-inf");
        assert_eq!(gauges.render(), "");
    }

    #[test]
    fn label_values_are_escaped() {
        let gauges = StatusGauges::default();
        gauges.set_cluster("db", "main", "say \"hi\"\\\n", 0, 0);
        assert!(
            gauges.render().contains(r#"phase="say \"hi\"\\\n"} 1"#),
            "{}",
            gauges.render()
        );
    }
}
