//! TableGroup: a group of tables sharded together, holding the resolved specs of its shards.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::{
    cell::CellTopologyLabels,
    common::{
        BackupConfig, ComponentLogLevels, DatabaseName, GlobalTopoServerRef, InitdbArgs,
        InternalTlsConfig, ObservabilityConfig, Phase, PostgresConfigRef,
        PostgresPasswordSecretRef, PvcDeletionPolicy, ShardImages, TableGroupName,
        TopologyPruningConfig,
    },
    rules,
    shard::{MultiorchSpec, Pools},
};
use crate::schema::{embedded_list, is_false};

/// The fully resolved spec of one shard, pushed down to its TableGroup.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ShardResolvedSpec {
    /// Name of the shard (`0-inf`).
    #[schemars(length(max = 63))]
    pub name: String,

    /// The resolved multiorch settings.
    pub multiorch: MultiorchSpec,

    /// Extra initdb arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initdb_args: Option<InitdbArgs>,

    /// Deprecated ConfigMap of extra postgresql.conf lines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub postgres_config_ref: Option<PostgresConfigRef>,

    /// Resolved PostgreSQL parameters (at most 200).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 200))]
    pub postgres_config: BTreeMap<String, String>,

    /// Resolved pools by name (at most 8).
    #[schemars(extend("maxProperties" = 8))]
    #[x_kube(validation = rules::resolved_pool_name_length())]
    pub pools: Pools,

    /// PVC lifecycle of the shard's pool volumes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvc_deletion_policy: Option<PvcDeletionPolicy>,

    /// Resolved backup configuration of the shard.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<BackupConfig>,
}

/// Desired state of a TableGroup: its identity, shared settings and the resolved shards.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[kube(
    group = "multigres.com",
    version = "v1alpha1",
    kind = "TableGroup",
    namespaced,
    status = "TableGroupStatus",
    shortname = "tbg",
    category = "multigres",
    doc = "TableGroup is a group of tables sharded together within a database; it owns one Shard per shard entry. Created and owned by the operator from a MultigresCluster; do not edit.",
    printcolumn = r#"{"name":"Shards","type":"integer","jsonPath":".status.readyShards"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct TableGroupSpec {
    /// Database the table group belongs to.
    pub database_name: DatabaseName,

    /// Name of the table group in the topology.
    pub table_group_name: TableGroupName,

    /// Whether this is the database's default (unsharded) table group.
    #[serde(default, skip_serializing_if = "is_false")]
    pub default: bool,

    /// Images and pull settings of the shards' pods.
    pub images: ShardImages,

    /// Where the global topology lives.
    pub global_topo_server: GlobalTopoServerRef,

    /// Resolved shards, keyed by name (at most 32).
    #[schemars(length(max = 32))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub shards: Vec<ShardResolvedSpec>,

    /// PVC lifecycle of the shards' volumes, inherited from the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvc_deletion_policy: Option<PvcDeletionPolicy>,

    /// Internal mutual TLS, inherited from the cluster.
    #[serde(
        default,
        rename = "internalTLS",
        skip_serializing_if = "Option::is_none"
    )]
    pub internal_tls: Option<InternalTlsConfig>,

    /// OpenTelemetry settings, inherited from the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observability: Option<ObservabilityConfig>,

    /// Log levels, inherited from the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_levels: Option<ComponentLogLevels>,

    /// Backup configuration inherited from cluster, database and table group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<BackupConfig>,

    /// Node labels of each cell, so pool pods are placed without reading Cell objects.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub cell_topology_labels: CellTopologyLabels,

    /// Topology pruning, inherited from the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology_pruning: Option<TopologyPruningConfig>,

    /// Resolved durability policy of the database, e.g. `AT_LEAST_2`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub durability_policy: Option<String>,

    /// Postgres superuser name, inherited from the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub postgres_superuser: Option<String>,

    /// Secret with the Postgres superuser password, inherited from the cluster.
    pub postgres_password_secret_ref: PostgresPasswordSecretRef,
}

/// Observed state of a TableGroup.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct TableGroupStatus {
    /// The `metadata.generation` this status reflects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Latest observations (e.g. `Available`), one per type.
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

    /// Shards that reached the Healthy phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_shards: Option<i32>,

    /// Shards declared for this table group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_shards: Option<i32>,
}
