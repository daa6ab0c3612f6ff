//! CoreTemplate, CellTemplate and ShardTemplate: reusable configuration that clusters reference
//! by name. Templates are read by the resolver and never reconciled on their own.

use std::collections::BTreeMap;

use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::{
    cell::MultigatewaySpec,
    common::{
        InitdbArgs, PodPlacementSpec, PoolName, PostgresConfigRef, PvcDeletionPolicy, StatelessSpec,
    },
    rules,
    shard::{MultiorchSpec, PoolSpec},
    toposerver::{LocalTopoServerSpec, TopoServerSpec},
};

/// Reusable settings of a cluster's global components.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[kube(
    group = "multigres.com",
    version = "v1alpha1",
    kind = "CoreTemplate",
    namespaced,
    shortname = "cot",
    category = "multigres",
    doc = "CoreTemplate holds reusable settings of a MultigresCluster's global components: the global topology server (etcd) and multiadmin. Referenced by name from clusters in the same namespace; the one named 'default' applies when a cluster names none."
)]
#[serde(rename_all = "camelCase")]
pub struct CoreTemplateSpec {
    /// Global topology server; templates can only describe a managed etcd.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global_topo_server: Option<TopoServerSpec>,

    /// multiadmin settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multiadmin: Option<StatelessSpec>,

    /// Scheduling of the multiadmin pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multiadmin_placement: Option<PodPlacementSpec>,

    /// multiadmin web UI settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multiadmin_web: Option<StatelessSpec>,
}

/// Reusable settings of a cell.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[kube(
    group = "multigres.com",
    version = "v1alpha1",
    kind = "CellTemplate",
    namespaced,
    shortname = "cet",
    category = "multigres",
    doc = "CellTemplate holds reusable settings of a cell: its multigateway and optional local topology server. Referenced by name from clusters in the same namespace; the one named 'default' applies when a cell names none."
)]
#[serde(rename_all = "camelCase")]
pub struct CellTemplateSpec {
    /// multigateway settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multigateway: Option<MultigatewaySpec>,

    /// Scheduling of the multigateway pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multigateway_placement: Option<PodPlacementSpec>,

    /// A cell-local topology server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_topo_server: Option<LocalTopoServerSpec>,
}

/// Reusable settings of a shard.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[kube(
    group = "multigres.com",
    version = "v1alpha1",
    kind = "ShardTemplate",
    namespaced,
    shortname = "sht",
    category = "multigres",
    doc = "ShardTemplate holds reusable settings of a shard: multiorch, PostgreSQL pools, storage and resources. Referenced by name from clusters in the same namespace; the one named 'default' applies when a shard names none."
)]
#[serde(rename_all = "camelCase")]
pub struct ShardTemplateSpec {
    /// multiorch settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multiorch: Option<MultiorchSpec>,

    /// Extra initdb arguments (e.g. `--locale-provider=icu --icu-locale=en_US.UTF-8`), used
    /// when a pod initializes a new data directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initdb_args: Option<InitdbArgs>,

    /// Deprecated ConfigMap of extra postgresql.conf lines; prefer `postgresConfig`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub postgres_config_ref: Option<PostgresConfigRef>,

    /// PostgreSQL parameters (at most 200), rendered over the operator's defaults.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 200))]
    pub postgres_config: BTreeMap<String, String>,

    /// Pools by name, at most 8. Pools cannot be removed or renamed.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 8))]
    #[x_kube(validation = rules::pool_name_length())]
    #[x_kube(validation = rules::pool_name_pattern())]
    #[x_kube(validation = rules::pools_append_only())]
    pub pools: BTreeMap<PoolName, PoolSpec>,

    /// PVC lifecycle of the pools' volumes for shards using this template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvc_deletion_policy: Option<PvcDeletionPolicy>,
}
