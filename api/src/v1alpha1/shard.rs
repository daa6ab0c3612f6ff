//! Shard: one shard of a table group, running multiorch and the PostgreSQL pools; plus the
//! multiorch and pool specs users write in the cluster and in ShardTemplates.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{Affinity, Toleration},
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{
    cell::CellTopologyLabels,
    common::{
        BackupConfig, CellName, ComponentLogLevels, ContainerConfig, DatabaseName,
        GlobalTopoServerRef, GoDuration, InitdbArgs, InternalTlsConfig, ObservabilityConfig, Phase,
        PodPlacementSpec, PoolName, PoolType, PostgresConfigRef, PostgresPasswordSecretRef,
        PvcDeletionPolicy, ShardImages, ShardName, StatelessSpec, StorageSpec, TableGroupName,
        TopologyPruningConfig,
    },
    rules,
};
use crate::schema::{embedded, embedded_list};

/// The multiorch of a shard: the stateless settings plus placement and the cells it watches.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct MultiorchSpec {
    /// Replicas (per cell, default 1), resources, affinity, pod annotations and labels.
    #[serde(flatten)]
    pub stateless: StatelessSpec,

    /// Scheduling of the multiorch pods; replaces the template's as a whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<PodPlacementSpec>,

    /// Cells that get a multiorch (at most 50). Empty: every cell the shard's pools use.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 50))]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub cells: Vec<CellName>,

    /// Fixed part of the wait before multiorch appoints a new primary once the current one has
    /// resigned (a planned switchover, a pod shutting down) or failed
    /// (`--leader-failover-grace-period-base`), a duration such as `1s`. Every switchover and
    /// failover waits it, so clients wait it too. Default `1s` (multiorch's own default is
    /// `4s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader_failover_grace_period_base: Option<GoDuration>,

    /// Upper bound of the random part added to that wait
    /// (`--leader-failover-grace-period-max-jitter`, at most `1m`), so that the multiorchs of
    /// several cells do not start competing elections at the same instant. Default `2s`
    /// (multiorch's own default is `8s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader_failover_grace_period_max_jitter: Option<GoDuration>,
}

/// Pools by name. Each spec is boxed: a B-tree node holds eleven entries inline whether used
/// or not, so a map of unboxed specs (several hundred bytes each) took about 7 KB for one or
/// two pools, in every cached Shard, TableGroup, MultigresCluster and ShardTemplate of every
/// handler.
pub type Pools = BTreeMap<PoolName, Box<PoolSpec>>;

/// A pool: one StatefulSet per cell of pods running PostgreSQL (via pgctld) and multipooler.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolSpec {
    /// Pool type; only `readWrite` (the default) exists today.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<PoolType>,

    /// Cells the pool runs in (1 to 10, distinct). Cells can be added but never removed.
    /// Empty: every cell of the cluster.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(min = 1, max = 10))]
    #[x_kube(merge_strategy = ListMerge::Set)]
    #[x_kube(validation = Rule::new("oldSelf.all(c, c in self)")
        .message("Cells cannot be removed from a pool (Append-Only)"))]
    pub cells: Vec<CellName>,

    /// Pods per cell, 1 to 32. Default 2 when the pool spans a single cell (so a primary can be
    /// elected with durability `AT_LEAST_2`), otherwise 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 32))]
    pub replicas_per_cell: Option<i32>,

    /// Data volume of each pod (default 1Gi, ReadWriteOnce). Size, class and access modes merge
    /// one by one over the template's. The size cannot be decreased.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<StorageSpec>,

    /// Grows each pod's data volume before it fills: when the usage the operator measures
    /// (`status.volumes`) passes `threshold` percent of the claim's capacity, the claim grows by
    /// `step`, never past `ceiling`. Needs a StorageClass with `allowVolumeExpansion: true`.
    /// Unset: volumes grow only when `storage.size` is raised.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_grow: Option<VolumeAutoGrow>,

    /// The postgres (pgctld) container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub postgres: Option<ContainerConfig>,

    /// The multipooler container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multipooler: Option<ContainerConfig>,

    /// Node and pod affinity of the pool's pods; replaces the template's as a whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "embedded::<Affinity>")]
    pub affinity: Option<Affinity>,

    /// Tolerations of the pool's pods; replace the template's when not empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "embedded_list::<Toleration>")]
    pub tolerations: Vec<Toleration>,

    /// Pod-level fsGroup (at least 1), for shared volume and socket access between the pool's
    /// containers. Unset: the runtime's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub fs_group: Option<i64>,

    /// PVC lifecycle of this pool's volumes; overrides shard, table group and cluster per field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvc_deletion_policy: Option<PvcDeletionPolicy>,
}

/// Growth of a pool's data volumes before they fill (`pools.<name>.autoGrow`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeAutoGrow {
    /// Percent of a claim's capacity, 50 to 95 (default 80), past which the pod's measured
    /// usage (data and WAL) grows the claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 50, max = 95))]
    pub threshold: Option<i32>,

    /// How much a claim grows each time: a quantity (`2Gi`) or a percent of its current
    /// request (`50%`, 1 to 1000). Default `50%`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = 63),
        regex(pattern = r"^([0-9]+%|[0-9]+(\.[0-9]+)?([KMGTPE]i|[kMGTPE])?)$")
    )]
    pub step: Option<String>,

    /// The largest size a claim is grown to, e.g. `100Gi`: at least `storage.size`. A claim at
    /// its ceiling is reported (`VolumeAutoGrow` condition, `AtCeiling`) and grows no more.
    #[schemars(
        length(max = 63),
        regex(pattern = r"^[0-9]+(\.[0-9]+)?([KMGTPE]i|[kMGTPE])?$")
    )]
    pub ceiling: String,
}

/// Desired state of a Shard: the fully resolved orchestrator and pools of one shard.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[kube(
    group = "multigres.com",
    version = "v1alpha1",
    kind = "Shard",
    namespaced,
    status = "ShardStatus",
    shortname = "srd",
    category = "multigres",
    doc = "Shard is one shard of a table group: its multiorch and PostgreSQL pools. Created and owned by the operator from a TableGroup; do not edit.",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.readyReplicas"
    ),
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type=='Available')].status"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Cohort","type":"string","jsonPath":".status.cohort.summary"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ShardSpec {
    /// Database the shard belongs to.
    pub database_name: DatabaseName,

    /// Table group the shard belongs to.
    pub table_group_name: TableGroupName,

    /// Name of the shard in the topology (`0-inf`).
    pub shard_name: ShardName,

    /// Images and pull settings of the shard's pods.
    pub images: ShardImages,

    /// Where the global topology lives.
    pub global_topo_server: GlobalTopoServerRef,

    /// The resolved multiorch settings.
    pub multiorch: MultiorchSpec,

    /// Extra initdb arguments, used when a pod initializes a new data directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initdb_args: Option<InitdbArgs>,

    /// Deprecated ConfigMap of extra postgresql.conf lines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub postgres_config_ref: Option<PostgresConfigRef>,

    /// Resolved PostgreSQL parameters (at most 200), rendered over the operator's defaults and
    /// `postgresConfigRef`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 200))]
    pub postgres_config: BTreeMap<String, String>,

    /// Resolved pools by name (at most 8).
    #[schemars(extend("maxProperties" = 8))]
    #[x_kube(validation = rules::resolved_pool_name_length())]
    pub pools: Pools,

    /// PVC lifecycle of the pools' volumes, inherited from table group and cluster.
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

    /// Resolved backup configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<BackupConfig>,

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

    /// Node labels of each cell, so pool pods are placed without reading Cell objects.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub cell_topology_labels: CellTopologyLabels,

    /// Total desired pool pods (sum of `replicasPerCell` times cells); read by the scale
    /// subresource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
}

/// Kind of a completed pgBackRest backup.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = crate::schema::field_described)]
#[serde(rename_all = "lowercase")]
pub enum BackupKind {
    /// A full backup.
    Full,
    /// A differential backup (changes since the last full one).
    Diff,
    /// An incremental backup (changes since the last backup).
    Incr,
}

/// Backups taken on the shard's schedule, as the data-handler took them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScheduledBackupsStatus {
    /// When the schedule next asks for a backup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_time: Option<Time>,

    /// The backup running now, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running: Option<ScheduledBackupAttempt>,

    /// The last scheduled backup that completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_success: Option<ScheduledBackupAttempt>,

    /// The last scheduled backup that failed, with the reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure: Option<ScheduledBackupAttempt>,
}

/// One scheduled backup.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScheduledBackupAttempt {
    /// When it started.
    pub start_time: Time,

    /// When it ended (absent while it runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_time: Option<Time>,

    /// The pool pod whose multipooler took it.
    pub pod: String,

    /// The backup's label, once complete.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<String>,

    /// Why it failed, or which backups expired after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Where a backup asked for by the cluster's annotation `multigres.com/backup-request` stands
/// on one shard (see `multigres_api::backup_request`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = crate::schema::field_described)]
pub enum BackupRequestState {
    /// The backup is being taken.
    Running,
    /// The backup completed.
    Completed,
    /// The backup failed, or the request could not be followed; it is not tried again (ask
    /// again with a new id).
    Failed,
}

/// One requested backup of a shard.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RequestedBackupStatus {
    /// The request id, the annotation's value.
    pub id: String,

    /// Kind of backup asked for.
    #[serde(rename = "type")]
    pub type_: BackupKind,

    /// Running, Completed or Failed.
    pub state: BackupRequestState,

    /// When the backup started (absent for a request refused before any start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,

    /// When it completed or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<Time>,

    /// The pool pod whose multipooler takes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,

    /// The pgBackRest label of the backup, once complete (e.g. `20261204-221503F`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<String>,

    /// Why it failed, or what happened to it (taken again after a restart of the
    /// data-handler).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// The moments a restore of the shard can reach, read from its repository and its primary
/// (docs/backups.md, "The recoverable window"). A restore to a time needs a complete backup that
/// ended before the target and the archived WAL from there up to it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RecoverableWindow {
    /// The earliest: when the oldest complete backup the repository holds ended (pgBackRest's
    /// `timestamp.stop`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub earliest: Option<Time>,

    /// The pgBackRest label of that backup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub earliest_backup: Option<String>,

    /// The latest: when the primary last archived a WAL file into the repository
    /// (`pg_stat_archiver.last_archived_time`); transactions committed before it are in the
    /// archive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latest: Option<Time>,

    /// That file: a WAL segment, or the history file a backup ends with (`*.backup`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latest_wal: Option<String>,

    /// Set while archiving fails (a segment failed after the last one archived): the window
    /// stops at `latest` until it succeeds again. Names the segment and when it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub archive_failing: Option<String>,
}

/// A requested backup that arrived while another backup of the shard ran: it is taken as soon
/// as that one ends.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueuedBackupRequest {
    /// The request id.
    pub id: String,

    /// Kind of backup asked for.
    #[serde(rename = "type")]
    pub type_: BackupKind,
}

/// Rollout state of the rendered postgresql.conf.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PostgresConfigStatus {
    /// True while the desired config has not reached every pool pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_progress: Option<bool>,

    /// When the config last settled on every pool pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_applied_at: Option<Time>,

    /// Why the config could not be rendered or read, e.g. a missing ConfigMap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,

    /// Settings asked below the value a server of the shard may already run, and rendered at
    /// that value instead, e.g. `max_connections 60 (asked 40)`. A standby cannot start below
    /// its primary's `max_connections`, `max_worker_processes`, `max_wal_senders`,
    /// `max_prepared_transactions` or `max_locks_per_transaction`, and Multigres starts every
    /// PostgreSQL as a standby, so a lowered value would stop any pod that restarts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub held_settings: Vec<String>,
}

/// The shard's Multigres consensus cohort: the pool pods whose acknowledgements a commit waits
/// for under the durability policy, and that can elect a new primary. Read by the data-handler
/// from each pool pod's multipooler (`Status`), because readiness alone does not tell whether a
/// restarted pod is back in it, and removing or restarting the wrong pod stops every write.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CohortStatus {
    /// At a glance: healthy members (the primary, and standbys streaming from it) of all
    /// members, and the policy, e.g. `3/3 AT_LEAST_2`.
    pub summary: String,

    /// Durability policy of the current rule, e.g. `AT_LEAST_2`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,

    /// Members (cells, for a `MULTI_CELL_` policy) that must acknowledge a commit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub required: Option<i32>,

    /// The pod whose multipooler leads the current rule (the primary).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<String>,

    /// Members with no pool pod (scaled away or deleted): they still count toward every
    /// quorum.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missing: Vec<String>,

    /// Each pool pod of the shard, by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pods: BTreeMap<String, CohortPod>,
}

/// Shard condition (the data-handler's): losing any one healthy cohort member leaves a shard
/// that still accepts writes. The resource-handler lets a drain evict a replica only while it
/// holds.
pub const FAILURE_TOLERANT: &str = "FailureTolerant";

/// Shard condition (the data-handler's): the primary's PostgreSQL accepts client connections.
/// The resource-handler makes the shard Degraded while it is `False`, so the cluster is too:
/// readiness, roles and the cohort all look whole while every client is refused.
pub const PRIMARY_SERVING: &str = "PrimaryServing";

/// Shard condition (the resource-handler's): the shard's own S3 backup repository is marked as
/// its cluster's (a marker object in the bucket names the cluster and the Kubernetes cluster).
/// A new shard starts no pod before it is `True`; the data-handler starts no backup while it is
/// `False`, so no cluster writes into a repository another one owns.
pub const BACKUP_REPOSITORY: &str = "BackupRepository";

impl Shard {
    /// Why no backup may be written into this shard's own repository now (the message of a
    /// `False` [`BACKUP_REPOSITORY`] condition); `None` when nothing stands in the way.
    pub fn unclaimed_repository(&self) -> Option<&str> {
        self.status
            .as_ref()?
            .conditions
            .iter()
            .find(|c| c.type_ == BACKUP_REPOSITORY && c.status == "False")
            .map(|c| c.message.as_str())
    }
}

impl CohortStatus {
    /// Whether `pod` is one of the current rule's participants: a member, or the leader (which
    /// the rule may name without listing it as a member).
    pub fn takes_part(&self, pod: &str) -> bool {
        self.leader.as_deref() == Some(pod) || self.pods.get(pod).is_some_and(|p| p.member)
    }

    /// Whether `pod` takes part in commits now: a participant that is the primary or streams
    /// from it.
    pub fn is_healthy(&self, pod: &str) -> bool {
        self.takes_part(pod)
            && self.pods.get(pod).is_some_and(|p| {
                matches!(p.replication, Replication::Primary | Replication::Streaming)
            })
    }

    /// Whether every pool pod takes part in commits and every member has a pod.
    pub fn is_whole(&self) -> bool {
        self.missing.is_empty() && self.pods.keys().all(|pod| self.is_healthy(pod))
    }
}

/// One pool pod as the cohort sees it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CohortPod {
    /// Whether it is a member of the current rule's cohort.
    pub member: bool,

    /// How it replicates.
    pub replication: Replication,

    /// How far its replay is behind the primary's WAL, in whole MiB; absent below 1 MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag_mebibytes: Option<i64>,
}

/// How a pool pod replicates.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = crate::schema::field_described)]
pub enum Replication {
    /// It is the primary.
    Primary,
    /// Its WAL receiver streams from the primary.
    Streaming,
    /// It answers but does not stream (starting, restoring, or cut off from the primary).
    NotStreaming,
    /// Its multipooler did not answer.
    #[default]
    Unreachable,
}

/// The role `ShardStatus::pod_roles` gives the pod that is the shard's primary (the
/// data-handler publishes it; the resource-handler and the kubectl plugin read it).
pub const POD_ROLE_PRIMARY: &str = "PRIMARY";
/// The role `ShardStatus::pod_roles` gives every other serving pool pod.
pub const POD_ROLE_REPLICA: &str = "REPLICA";
/// The role `ShardStatus::pod_roles` gives a pool pod whose multipooler gave up on its
/// PostgreSQL (`LIFECYCLE_QUARANTINED`): it serves nothing, takes no part in consensus, and the
/// resource-handler replaces its volume (upstream's name for it).
pub const POD_ROLE_QUARANTINED: &str = "QUARANTINED";

/// Observed state of a Shard. Several handlers write it, each its own fields and condition
/// types.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ShardStatus {
    /// The `metadata.generation` this status reflects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Each managed PostgreSQL role's state in this shard's primary, written by the
    /// data-handler.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 34))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub roles: Vec<super::roles::RoleStatus>,

    /// Rollout state of the rendered postgresql.conf.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub postgres_config: Option<PostgresConfigStatus>,

    /// Latest observations (e.g. `Available`, `BackupHealthy`), one per type.
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

    /// Cells the shard runs in (at most 50).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 50))]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub cells: Vec<CellName>,

    /// Whether multiorch is ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub orch_ready: Option<bool>,

    /// Whether every pool is ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pools_ready: Option<bool>,

    /// Under the cluster's `multigres.com/restart-policy: supervised`, the pool revisions whose
    /// restarts wait for a release: copy it into the Shard's annotation
    /// `multigres.com/release-restarts` (what `kubectl multigres restart` does) to let them run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_restart: Option<String>,

    /// When the last backup completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_backup_time: Option<Time>,

    /// Kind of the last completed backup: `full`, `diff` or `incr`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_backup_type: Option<BackupKind>,

    /// Labels of the complete backups the repository holds, oldest first (e.g.
    /// `20261127-020000F`): what a restore can start from.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retained_backups: Vec<String>,

    /// The earliest and the latest moment a restore of the shard can reach.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recoverable_window: Option<RecoverableWindow>,

    /// Backups taken on `spec.backup.schedule`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduled_backups: Option<ScheduledBackupsStatus>,

    /// The newest backup asked for by the cluster's `multigres.com/backup-request` annotation:
    /// running, or answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_backup: Option<RequestedBackupStatus>,

    /// The requested backup answered before [`Self::requested_backup`], kept so that a request
    /// followed closely by another still shows its outcome.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_requested_backup: Option<RequestedBackupStatus>,

    /// A requested backup waiting for the backup running now (scheduled or requested).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queued_request: Option<QueuedBackupRequest>,

    /// Database role of each pod, read from the topology: `PRIMARY`, `REPLICA` or `QUARANTINED`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pod_roles: BTreeMap<String, String>,

    /// The Multigres consensus cohort, as the data-handler last read it; absent until a
    /// multipooler answered (and under `internalTLS`, whose client certificate the data-handler
    /// does not hold).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cohort: Option<CohortStatus>,

    /// Ready pool pods across all pools; read by the scale subresource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i32>,

    /// Each pool pod's volume usage, measured by the data-handler with SQL on the pod's own
    /// multipooler, and its claim's capacity.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 1000))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["pod".into()]))]
    pub volumes: Vec<VolumeUsage>,
}

/// One pool pod's data volume: what PostgreSQL uses of it and what the claim holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeUsage {
    /// The pool pod.
    pub pod: String,
    /// Bytes of the data directory's tablespaces (`pg_default` and `pg_global`): every
    /// database, not the WAL.
    pub data_bytes: i64,
    /// Bytes of WAL segments (`pg_ls_waldir()`).
    pub wal_bytes: i64,
    /// What storage gave the claim (`status.capacity` of `data-<pod>`), in bytes; absent until
    /// it is bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_bytes: Option<i64>,
    /// When PostgreSQL answered.
    pub measured_at: Time,
}

impl VolumeUsage {
    /// Data and WAL together.
    pub fn used_bytes(&self) -> i64 {
        self.data_bytes.saturating_add(self.wal_bytes)
    }
}
