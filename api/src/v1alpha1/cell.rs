//! Cell: one failure domain of a cluster, running the multigateway; plus the gateway specs users
//! write in the cluster and in CellTemplates.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{
    common::{
        CellImages, CellName, ComponentLogLevels, GatewayTlsConfig, GlobalTopoServerRef,
        GoDuration, InternalTlsConfig, ObservabilityConfig, Phase, PodPlacementSpec, Region,
        StatelessSpec, Zone, ZoneId,
    },
    rules,
    toposerver::LocalTopoServerSpec,
};
use crate::schema::embedded_list;

/// The multigateway of a cell: the stateless settings plus failover buffering.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MultigatewaySpec {
    /// Replicas, resources, affinity, pod annotations and labels.
    #[serde(flatten)]
    pub stateless: StatelessSpec,

    /// Request buffering during planned failovers. Merged field by field over the template's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buffer: Option<GatewayBufferConfig>,
}

/// Buffering of client requests while a shard has no serving primary, so a planned failover is
/// invisible to clients. Unset fields emit no flag, so multigateway's own defaults apply.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewayBufferConfig {
    /// Enables buffering (`--buffer-enabled`). Clusters built by the operator default to true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,

    /// Longest time one request stays buffered (`--buffer-window`), a duration such as `10s`
    /// (multigateway default). Must be positive and at most `maxFailoverDuration`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<GoDuration>,

    /// Longest time one failover keeps requests buffered (`--buffer-max-failover-duration`),
    /// e.g. `20s` (multigateway default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_failover_duration: Option<GoDuration>,

    /// Minimum interval between two buffering events of a shard
    /// (`--buffer-min-time-between-failovers`), e.g. `1m` (multigateway default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_time_between_failovers: Option<GoDuration>,

    /// Most requests buffered at once (`--buffer-size`, 1 to 100000; multigateway default
    /// 1000). Each buffered request holds its client's query and a goroutine (8 KiB of stack at
    /// least) in the gateway's memory until the new primary serves; 100000 of them already take
    /// about a GiB, beyond any gateway memory limit, so a larger buffer only turns a failover
    /// into an out-of-memory kill.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100000))]
    pub size: Option<i32>,

    /// Buffered requests replayed in parallel once the new primary serves
    /// (`--buffer-drain-concurrency`, at least 1; multigateway default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub drain_concurrency: Option<i32>,
}

/// Topology registration switches of a cell.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TopologyReconciliation {
    /// Register the cell in the global topology.
    pub register_cell: bool,

    /// Mark poolers without a backing pod as shut down so multiorch drops them.
    pub prune_poolers: bool,
}

/// Desired state of a Cell: the fully resolved gateway and topology settings of one failure
/// domain.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[kube(
    group = "multigres.com",
    version = "v1alpha1",
    kind = "Cell",
    namespaced,
    status = "CellStatus",
    shortname = "cel",
    category = "multigres",
    doc = "Cell is one failure domain (e.g. an availability zone) of a MultigresCluster, running its multigateway. Created and owned by the operator; do not edit.",
    printcolumn = r#"{"name":"Gateway","type":"integer","jsonPath":".status.gatewayReadyReplicas"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type=='Available')].status"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = rules::zone_or_region_exclusive())]
#[x_kube(validation = rules::zone_or_region_required())]
pub struct CellSpec {
    /// Logical name of the cell in the topology.
    pub name: CellName,

    /// Zone the cell's pods run in (node label `topology.kubernetes.io/zone`); exclusive with
    /// `zoneId` and `region`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<Zone>,

    /// Availability zone ID the cell's pods run in (node label `topology.k8s.aws/zone-id`);
    /// exclusive with `zone` and `region`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone_id: Option<ZoneId>,

    /// Region the cell's pods run in (node label `topology.kubernetes.io/region`); exclusive
    /// with `zone` and `zoneId`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<Region>,

    /// Opaque document copied verbatim into the cell's topology record (at most 4096
    /// characters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096))]
    pub metadata: Option<String>,

    /// Images and pull settings of the cell's pods.
    pub images: CellImages,

    /// The resolved multigateway settings.
    pub multigateway: MultigatewaySpec,

    /// Scheduling of the multigateway pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multigateway_placement: Option<PodPlacementSpec>,

    /// Where the global topology lives.
    pub global_topo_server: GlobalTopoServerRef,

    /// The cell's local topology server, when it has its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topo_server: Option<LocalTopoServerSpec>,

    /// Every cell of the cluster, for discovery (at most 50).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 50))]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub all_cells: Vec<CellName>,

    /// Topology registration switches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology_reconciliation: Option<TopologyReconciliation>,

    /// OpenTelemetry settings, inherited from the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observability: Option<ObservabilityConfig>,

    /// Log levels, inherited from the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_levels: Option<ComponentLogLevels>,

    /// Internal mutual TLS, inherited from the cluster.
    #[serde(
        default,
        rename = "internalTLS",
        skip_serializing_if = "Option::is_none"
    )]
    pub internal_tls: Option<InternalTlsConfig>,

    /// DNS name of the public PostgreSQL TLS certificate served by multigateway, inherited from
    /// the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_common_name: Option<String>,

    /// Client TLS of the gateways, inherited from the cluster.
    #[serde(
        default,
        rename = "gatewayTLS",
        skip_serializing_if = "Option::is_none"
    )]
    pub gateway_tls: Option<GatewayTlsConfig>,
}

/// Observed state of a Cell. Several handlers write it, each its own fields and condition types.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct CellStatus {
    /// The `metadata.generation` this status reflects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Latest observations (e.g. `Available`, `Ready`), one per type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "embedded_list::<Condition>")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,

    /// Lifecycle state: Initializing, Progressing, Healthy, Degraded or Unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,

    /// Details about the phase, e.g. what is wrong.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,

    /// Number of multigateway pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway_replicas: Option<i32>,

    /// Number of ready multigateway pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway_ready_replicas: Option<i32>,

    /// Name of the multigateway Service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub gateway_service_name: Option<String>,
}

/// Labels selecting the nodes of each cell, keyed by cell name; used by shards to place pool
/// pods.
pub type CellTopologyLabels = BTreeMap<CellName, BTreeMap<String, String>>;
