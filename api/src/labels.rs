//! The labels every object the operator creates carries, and the selectors built from them.
//!
//! Standard labels (`app.kubernetes.io/*`) say what an object is; `multigres.com/*` labels place it
//! in the topology. Watches on owned kinds filter on [`MANAGED_BY`] so caches stay small.

use std::collections::BTreeMap;

pub const NAME: &str = "app.kubernetes.io/name";
pub const INSTANCE: &str = "app.kubernetes.io/instance";
pub const COMPONENT: &str = "app.kubernetes.io/component";
pub const PART_OF: &str = "app.kubernetes.io/part-of";
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const CLUSTER: &str = "multigres.com/cluster";
pub const CELL: &str = "multigres.com/cell";
pub const DATABASE: &str = "multigres.com/database";
pub const TABLE_GROUP: &str = "multigres.com/tablegroup";
pub const SHARD: &str = "multigres.com/shard";
pub const POOL: &str = "multigres.com/pool";
/// Role of a pool pod (`primary` / `replica`), published by the data-handler from the topology.
pub const ROLE: &str = "multigres.com/role";
/// [`ROLE`] value of the primary.
pub const ROLE_PRIMARY: &str = "primary";
/// Whether a pool pod takes part in its shard's commits (`member`: the primary, or a member of
/// the consensus cohort streaming from it; `outside` otherwise), published by the data-handler. A recreated pod has none until it is read again, so a restart or scale-down
/// gated on it waits for the new pod.
pub const COHORT: &str = "multigres.com/cohort";
/// [`COHORT`] value of a healthy member.
pub const COHORT_MEMBER: &str = "member";
/// [`COHORT`] value of any other pod.
pub const COHORT_OUTSIDE: &str = "outside";
/// Annotation by which the resource-handler asks for a primary pool pod to hand over before it
/// removes or restarts the pod on purpose; the value (RFC 3339 time) identifies the request.
pub const SWITCHOVER_REQUESTED: &str = "multigres.com/switchover-requested";
/// Annotation by which a person asks for a switchover: set on the primary pool pod (any value),
/// the operator has it hand over to a replica under the same gates as a rollout, and removes the
/// annotation once another pod is the primary.
pub const USER_SWITCHOVER: &str = "multigres.com/switchover";
/// Annotation by which the data-handler records the request (its value) for which the pod's
/// multipooler resigned, so each request resigns once.
pub const SWITCHOVER_RESIGNED: &str = "multigres.com/switchover-resigned";
/// Pool pod annotation: the hot-standby-sensitive settings its PostgreSQL started with
/// (`max_connections=100,max_locks_per_transaction=64,...`), stamped by the resource-handler on
/// pods created from the current template, so a later lowering can be told from a raise.
pub const HOT_STANDBY_SETTINGS: &str = "multigres.com/hot-standby-settings";
/// Annotation on a one-pod multigateway or multiorch Deployment (and its pod template) naming
/// the pod the resource-handler last moved off a cordoned node, ahead of the drain, as
/// `<node>/<pod>`.
pub const DRAINED_NODE: &str = "multigres.com/drained-node";
/// Annotation on a MultigresCluster, passed on to its children: `"true"` stops the operator
/// from changing the cluster's workloads (no apply, restart, scale, switchover request, volume
/// growth or deletion of a child) until it is removed or set to `"false"`; status and
/// conditions keep being reported, and the topology and backups keep being served. For a
/// maintenance window, or to look at a cluster without the operator moving under one's feet.
pub const PAUSED: &str = "multigres.com/paused";

/// Annotation on a MultigresCluster, passed on to its children: `supervised` makes every pool
/// pod restart the operator would start (a template or configuration change) wait until the
/// Shard's [`RELEASE_RESTARTS`] names the revisions waiting; `automatic` (or none) restarts as
/// soon as it is safe.
pub const RESTART_POLICY: &str = "multigres.com/restart-policy";
/// Shard annotation releasing the restarts that wait under a supervised [`RESTART_POLICY`]: the
/// value of the Shard's `status.pendingRestart` when it was written. A later change waits again.
pub const RELEASE_RESTARTS: &str = "multigres.com/release-restarts";

/// Whether `annotations` ask for supervised restarts ([`RESTART_POLICY`] is `supervised`).
pub fn supervised(annotations: &BTreeMap<String, String>) -> bool {
    annotations
        .get(RESTART_POLICY)
        .is_some_and(|v| v == "supervised")
}

/// Annotation on a MultigresCluster, passed on to its children: `"true"` stops every pod of the
/// cluster's data plane (pool pods, multiorch, gateways, multiadmin) while its volumes, topology,
/// backups and Secrets stay; removing it (or `"false"`) starts them again on the same volumes. No
/// scheduled or requested backup runs while it sleeps. The managed etcd keeps running: it holds
/// the topology the woken poolers register in again.
pub const HIBERNATE: &str = "multigres.com/hibernate";

/// Whether `annotations` hibernate the object ([`HIBERNATE`] is `"true"`).
pub fn hibernated(annotations: &BTreeMap<String, String>) -> bool {
    annotations.get(HIBERNATE).is_some_and(|v| v == "true")
}

/// Whether `annotations` pause the object ([`PAUSED`] is `"true"`).
pub fn paused(annotations: &BTreeMap<String, String>) -> bool {
    annotations.get(PAUSED).is_some_and(|v| v == "true")
}

/// A child's annotations with the holds its MultigresCluster asks for ([`PAUSED`], a
/// supervised [`RESTART_POLICY`]) added: a handler acting on the child reads these, so a hold set
/// on the cluster stops the child's restarts before the cluster-handler has copied it there.
/// During an operator upgrade the new resource-handler may meet a pod template its version
/// changes before the new cluster-handler has copied a hold the old one did not know.
pub fn with_cluster_holds(
    child: &BTreeMap<String, String>,
    cluster: Option<&BTreeMap<String, String>>,
) -> BTreeMap<String, String> {
    let mut effective = child.clone();
    if let Some(cluster) = cluster {
        if paused(cluster) {
            effective.insert(PAUSED.to_owned(), "true".to_owned());
        }
        if supervised(cluster) {
            effective.insert(RESTART_POLICY.to_owned(), "supervised".to_owned());
        }
    }
    effective
}

/// Value of `app.kubernetes.io/name` and `part-of`.
pub const APP: &str = "multigres";
/// Value of `app.kubernetes.io/managed-by`.
pub const OPERATOR: &str = "multigres-operator";

/// Selector matching everything this operator manages (for watches of owned kinds).
pub const MANAGED_SELECTOR: &str = "app.kubernetes.io/managed-by=multigres-operator";

/// What a labelled object is (`app.kubernetes.io/component`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Component {
    GlobalTopo,
    LocalTopo,
    Cell,
    TableGroup,
    Shard,
    Multigateway,
    Multiorch,
    Pool,
    Multiadmin,
    MultiadminWeb,
    /// The CA and certificates of mutual TLS between Multigres processes.
    InternalTls,
    /// A shard's pgBackRest CA and certificate.
    PgBackRestTls,
    /// The CA and certificate of the gateways' client TLS, and the published CA.
    GatewayTls,
    /// The CA and certificate postgres_exporter serves its metrics with.
    MetricsTls,
    /// A NetworkPolicy of the cluster's pods.
    NetworkPolicy,
}

impl Component {
    pub fn as_str(self) -> &'static str {
        match self {
            Component::GlobalTopo => "global-topo",
            Component::LocalTopo => "local-topo",
            Component::Cell => "cell",
            Component::TableGroup => "tablegroup",
            Component::Shard => "shard",
            Component::Multigateway => "multigateway",
            Component::Multiorch => "multiorch",
            Component::Pool => "shard-pool",
            Component::Multiadmin => "multiadmin",
            Component::MultiadminWeb => "multiadmin-web",
            Component::InternalTls => "internal-tls",
            Component::PgBackRestTls => "pgbackrest-tls",
            Component::GatewayTls => "gateway-tls",
            Component::MetricsTls => "metrics-tls",
            Component::NetworkPolicy => "network-policy",
        }
    }
}

/// Where in the topology an object sits; `None` parts are left out.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Placement<'a> {
    pub cell: Option<&'a str>,
    pub database: Option<&'a str>,
    pub table_group: Option<&'a str>,
    pub shard: Option<&'a str>,
    pub pool: Option<&'a str>,
}

/// Whether `labels` place an object (a pool pod, or one of its volumes) in the shard `spec`
/// describes, of cluster `cluster`: how every handler finds a shard's pods without a
/// reference from the Shard.
pub fn in_shard(
    labels: &BTreeMap<String, String>,
    cluster: &str,
    spec: &crate::v1alpha1::ShardSpec,
) -> bool {
    let is = |key: &str, value: &str| labels.get(key).map(String::as_str) == Some(value);
    is(CLUSTER, cluster)
        && is(DATABASE, spec.database_name.as_str())
        && is(TABLE_GROUP, spec.table_group_name.as_str())
        && is(SHARD, spec.shard_name.as_str())
}

/// The full label set of an object: standard labels plus its topology placement.
pub fn labels(cluster: &str, component: Component, at: &Placement) -> BTreeMap<String, String> {
    let mut out = selector(cluster, component, at);
    out.insert(NAME.into(), APP.into());
    out.insert(PART_OF.into(), APP.into());
    out.insert(MANAGED_BY.into(), OPERATOR.into());
    out
}

/// The subset of [`labels`] that selects an object's pods or children: only labels that never
/// change over the object's life (selectors of Deployments and StatefulSets are immutable).
pub fn selector(cluster: &str, component: Component, at: &Placement) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    out.insert(INSTANCE.into(), cluster.into());
    out.insert(COMPONENT.into(), component.as_str().into());
    out.insert(CLUSTER.into(), cluster.into());
    let parts = [
        (CELL, at.cell),
        (DATABASE, at.database),
        (TABLE_GROUP, at.table_group),
        (SHARD, at.shard),
        (POOL, at.pool),
    ];
    for (key, value) in parts {
        if let Some(v) = value {
            out.insert(key.into(), v.into());
        }
    }
    out
}

/// Merges user labels under the operator's: a user label never overrides a standard one.
pub fn merge_user(
    ours: BTreeMap<String, String>,
    user: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut out = user.clone();
    out.extend(ours);
    out
}

/// `k=v,k=v` form of a label map, for list and watch selectors.
pub fn to_selector_string(labels: &BTreeMap<String, String>) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Why `key` is not a label or annotation key as the API server accepts one (a qualified
/// name: an optional DNS-subdomain prefix of at most 253 characters and `/`, then a name of 1
/// to 63 letters, digits, `-`, `_` or `.` starting and ending with a letter or digit); `None`
/// when it is one. The API server refuses a workload whose pod template has a bad key, so the
/// component would never be created.
pub fn key_problem(key: &str) -> Option<String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix
        && !is_dns_subdomain(prefix)
    {
        return Some(format!(
            "key {key:?} has a prefix {prefix:?} that is not a DNS subdomain (lowercase \
             letters, digits, `-` and `.`, at most 253 characters)"
        ));
    }
    if name.is_empty() || name.len() > 63 || !is_label_word(name) {
        return Some(format!(
            "key {key:?} is not a valid key: the part after an optional `prefix/` must be 1 to \
             63 letters, digits, `-`, `_` or `.`, starting and ending with a letter or digit"
        ));
    }
    None
}

/// Why `value` is not a label value (at most 63 letters, digits, `-`, `_` or `.`, starting and
/// ending with a letter or digit, or empty); `None` when it is one.
pub fn value_problem(value: &str) -> Option<String> {
    if value.is_empty() || (value.len() <= 63 && is_label_word(value)) {
        return None;
    }
    Some(format!(
        "value {value:?} is not a valid label value: at most 63 letters, digits, `-`, `_` or \
         `.`, starting and ending with a letter or digit (or empty)"
    ))
}

/// Letters, digits, `-`, `_` and `.`, starting and ending with a letter or digit.
fn is_label_word(word: &str) -> bool {
    let bytes = word.as_bytes();
    let edge = |b: Option<&u8>| b.is_some_and(u8::is_ascii_alphanumeric);
    edge(bytes.first())
        && edge(bytes.last())
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// A DNS subdomain (RFC 1123): dot-separated DNS labels, at most 253 characters.
fn is_dns_subdomain(text: &str) -> bool {
    text.len() <= 253
        && text.split('.').all(|label| {
            let bytes = label.as_bytes();
            let edge =
                |b: Option<&u8>| b.is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
            label.len() <= 63
                && edge(bytes.first())
                && edge(bytes.last())
                && bytes
                    .iter()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clusters_holds_reach_its_child_before_they_are_copied() {
        let map = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        let child = map(&[(RELEASE_RESTARTS, "set-abc")]);
        let cluster = map(&[(RESTART_POLICY, "supervised"), (PAUSED, "true")]);
        let effective = with_cluster_holds(&child, Some(&cluster));
        assert!(supervised(&effective) && paused(&effective));
        assert_eq!(effective.get(RELEASE_RESTARTS).unwrap(), "set-abc");
        let automatic = map(&[(RESTART_POLICY, "automatic"), (PAUSED, "false")]);
        let held = map(&[(RESTART_POLICY, "supervised"), (PAUSED, "true")]);
        assert_eq!(
            with_cluster_holds(&held, Some(&automatic)),
            held,
            "a hold the child has stays until the cluster-handler copies its removal"
        );
        assert_eq!(with_cluster_holds(&child, None), child);
    }

    #[test]
    fn label_keys_and_values_as_the_api_server_accepts_them() {
        for good in [
            "team",
            "app.kubernetes.io/name",
            "a",
            "A_b.c-9",
            "example.com/x",
        ] {
            assert_eq!(key_problem(good), None, "{good}");
        }
        for bad in [
            "My Key",
            "",
            "-x",
            "x-",
            "a/b/c",
            "Example.com/x",
            "/x",
            "x/",
            &"k".repeat(64),
        ] {
            assert!(key_problem(bad).is_some(), "{bad:?}");
        }
        for good in ["", "data-platform", "v1.2_3", &"v".repeat(63)] {
            assert_eq!(value_problem(good), None, "{good}");
        }
        for bad in ["data platform", "-x", "x.", "üse", &"v".repeat(64)] {
            assert!(value_problem(bad).is_some(), "{bad:?}");
        }
    }

    #[test]
    fn shard_labels_carry_standard_and_topology_keys() {
        let at = Placement {
            database: Some("postgres"),
            table_group: Some("default"),
            shard: Some("0-inf"),
            ..Default::default()
        };
        let l = labels("prod", Component::Shard, &at);
        assert_eq!(l[NAME], "multigres");
        assert_eq!(l[INSTANCE], "prod");
        assert_eq!(l[COMPONENT], "shard");
        assert_eq!(l[PART_OF], "multigres");
        assert_eq!(l[MANAGED_BY], "multigres-operator");
        assert_eq!(l[CLUSTER], "prod");
        assert_eq!(l[SHARD], "0-inf");
        assert!(!l.contains_key(CELL));
        let s = selector("prod", Component::Shard, &at);
        assert!(
            !s.contains_key(MANAGED_BY),
            "selectors carry only identity labels"
        );
        assert!(s.iter().all(|(k, v)| l.get(k) == Some(v)));
    }

    #[test]
    fn user_labels_never_override_standard_ones() {
        let user = BTreeMap::from([
            (COMPONENT.to_string(), "evil".to_string()),
            ("team".to_string(), "db".to_string()),
        ]);
        let l = merge_user(
            labels("prod", Component::Cell, &Placement::default()),
            &user,
        );
        assert_eq!(l[COMPONENT], "cell");
        assert_eq!(l["team"], "db");
    }

    #[test]
    fn selector_string_is_sorted_and_comma_joined() {
        let s = to_selector_string(&selector("p", Component::Cell, &Placement::default()));
        assert_eq!(
            s,
            "app.kubernetes.io/component=cell,app.kubernetes.io/instance=p,multigres.com/cluster=p"
        );
        assert_eq!(MANAGED_SELECTOR, format!("{MANAGED_BY}={OPERATOR}"));
    }
}
