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
/// Annotation on a one-pod multigateway or multiorch Deployment (and its pod template) naming
/// the pod the resource-handler last moved off a cordoned node, ahead of the drain, as
/// `<node>/<pod>`.
pub const DRAINED_NODE: &str = "multigres.com/drained-node";

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

#[cfg(test)]
mod tests {
    use super::*;

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
