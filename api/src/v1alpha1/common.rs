//! Types shared by several kinds: names, stateless and storage specs, PVC policy, backups,
//! logging, observability and lifecycle phase.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, LocalObjectReference, ResourceRequirements, Toleration, TopologySpreadConstraint,
};
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::schema::{constrained_string, embedded, embedded_list};
use crate::v1alpha1::BackupKind;

/// Pattern of a DNS label (RFC 1123): lowercase letters, digits and `-`, starting and ending with a
/// letter or digit. Multigres names (cells, databases, tablegroups, shards, pools) use it; it also
/// keeps `_` out of cell names, which Multigres uses as a separator in pooler IDs.
pub const DNS_LABEL_PATTERN: &str = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";

/// Pattern of a Kubernetes label value (at most 63 characters): letters, digits, `-`, `_` and
/// `.`, starting and ending with a letter or digit. Zone IDs and regions become node-selector
/// values, which the API server refuses in a workload otherwise.
pub const LABEL_VALUE_PATTERN: &str = "^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$";

/// Pattern of a DNS subdomain (RFC 1123), the names of most Kubernetes objects.
pub const DNS_SUBDOMAIN_PATTERN: &str =
    "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";

/// Pattern of a Go duration string such as `10s`, `1m30s` or `250ms`.
pub const DURATION_PATTERN: &str = "^([0-9]+(\\.[0-9]+)?(ns|us|µs|μs|ms|s|m|h))+$";

constrained_string! {
    /// Name of a logical database (DNS label, 1 to 30 characters). Only `postgres` is supported
    /// in v1alpha1.
    DatabaseName { min: 1, max: 30, pattern: DNS_LABEL_PATTERN }
}

constrained_string! {
    /// Name of a table group within a database (DNS label, 1 to 25 characters).
    TableGroupName { min: 1, max: 25, pattern: DNS_LABEL_PATTERN }
}

constrained_string! {
    /// Name of a shard within a table group (DNS label, 1 to 25 characters).
    ShardName { min: 1, max: 25, pattern: DNS_LABEL_PATTERN }
}

constrained_string! {
    /// Name of a pool within a shard. Used as a map key, where the schema cannot bound it; CEL
    /// rules on the maps check length and pattern instead.
    PoolName { min: 1, max: 25, pattern: DNS_LABEL_PATTERN }
}

constrained_string! {
    /// Name of a cell, a failure domain such as an availability zone (DNS label, 1 to 30
    /// characters, so never containing `_`).
    CellName { min: 1, max: 30, pattern: DNS_LABEL_PATTERN }
}

constrained_string! {
    /// Extra arguments passed to initdb, as one string (at most 512 characters, no `$(`).
    InitdbArgs {
        min: 0,
        max: 512,
        rule: crate::expansion::NO_REFERENCE_RULE,
        message: crate::expansion::NO_REFERENCE_MESSAGE,
    }
}

constrained_string! {
    /// Zone as Kubernetes names it in the well-known node label `topology.kubernetes.io/zone`,
    /// e.g. `us-east-1a` or `europe-west1-b` (a label value: 1 to 63 letters, digits, `-`, `_`
    /// or `.`).
    Zone { min: 1, max: 63, pattern: LABEL_VALUE_PATTERN }
}

constrained_string! {
    /// Cloud availability zone ID, e.g. `use1-az1` (a label value: 1 to 63 letters, digits,
    /// `-`, `_` or `.`).
    ZoneId { min: 1, max: 63, pattern: LABEL_VALUE_PATTERN }
}

constrained_string! {
    /// Cloud region, e.g. `us-east-1` (a label value: 1 to 63 letters, digits, `-`, `_` or
    /// `.`).
    Region { min: 1, max: 63, pattern: LABEL_VALUE_PATTERN }
}

constrained_string! {
    /// Name of a CoreTemplate, CellTemplate or ShardTemplate in the cluster's namespace
    /// (1 to 63 characters).
    TemplateRef { min: 1, max: 63 }
}

constrained_string! {
    /// Container image reference (1 to 512 characters).
    ImageRef { min: 1, max: 512 }
}

constrained_string! {
    /// IPv4 or IPv6 address.
    IpAddress {
        min: 3,
        max: 45,
        pattern: "^(([0-9]{1,3}\\.){3}[0-9]{1,3})$|^(([0-9a-fA-F]{0,4}:){2,7}[0-9a-fA-F]{0,4})$",
    }
}

constrained_string! {
    /// IPv4 or IPv6 address range in CIDR notation, e.g. `203.0.113.0/24` or `2001:db8::/32`.
    Cidr {
        min: 3,
        max: 49,
        pattern: "^[0-9a-fA-F:.]+/[0-9]{1,3}$",
    }
}

constrained_string! {
    /// Client URL of an external topology server, `http://` or `https://` (at most 2048
    /// characters, which keeps CEL cost estimates bounded).
    EndpointUrl { min: 1, max: 2048 }
}

constrained_string! {
    /// Go-style duration such as `10s`, `1m30s` or `250ms`.
    GoDuration { min: 1, max: 64, pattern: DURATION_PATTERN }
}

/// Desired state of a scalable, stateless component (multiadmin, multiadmin-web, multiorch,
/// multigateway).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct StatelessSpec {
    /// Desired number of pods, 0 to 128. Default 1 (per cell for multigateway and multiorch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 128))]
    pub replicas: Option<i32>,

    /// Compute resources of the component's container. When overriding a template, this block
    /// replaces the template's block as a whole. Defaults depend on the component (e.g.
    /// multigateway requests 100m CPU and 128Mi memory, limit 256Mi).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "embedded::<ResourceRequirements>")]
    pub resources: Option<ResourceRequirements>,

    /// Scheduling constraints of the pods (node and pod affinity). Replaces the template's
    /// affinity as a whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "embedded::<Affinity>")]
    pub affinity: Option<Affinity>,

    /// Annotations added to the pods (at most 20; keys under 64 and values under 256
    /// characters). Merged per key over the template's.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 20))]
    #[x_kube(validation = Rule::new("self.all(k, size(k) < 64 && size(self[k]) < 256)")
        .message("annotation keys must be <64 chars and values <256 chars"))]
    pub pod_annotations: BTreeMap<String, String>,

    /// Extra labels added to the pods (at most 20; keys and values under 64 characters). Merged
    /// per key over the template's.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 20))]
    #[x_kube(validation = Rule::new("self.all(k, size(k) < 64 && size(self[k]) < 64)")
        .message("label keys and values must be <64 chars"))]
    pub pod_labels: BTreeMap<String, String>,
}

/// Scheduling knobs exposed only for components that need them; separate from
/// [`StatelessSpec`] so other components do not inherit them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodPlacementSpec {
    /// Tolerations that let the pods schedule onto tainted nodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "embedded_list::<Toleration>")]
    pub tolerations: Vec<Toleration>,
}

/// Scheduling constraints of topology-server (etcd) pods.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TopoServerPlacementSpec {
    /// Node labels the etcd pods must match.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,

    /// Node and pod affinity of the etcd pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "embedded::<Affinity>")]
    pub affinity: Option<Affinity>,

    /// Tolerations that let the etcd pods schedule onto tainted nodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "embedded_list::<Toleration>")]
    pub tolerations: Vec<Toleration>,

    /// How the etcd pods are spread across topology domains such as zones.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "embedded_list::<TopologySpreadConstraint>")]
    pub topology_spread_constraints: Vec<TopologySpreadConstraint>,
}

/// Persistent volume settings.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StorageSpec {
    /// Volume size as a Kubernetes quantity with a unit, e.g. `10Gi`. Default 1Gi for etcd and
    /// pool data, 10Gi for filesystem backups. Cannot be decreased.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63), regex(pattern = "^([0-9]+)(.+)$"))]
    pub size: Option<String>,

    /// StorageClass name. Default: the cluster's default StorageClass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub class: Option<String>,

    /// Access modes of the volume: `ReadWriteOnce` (the default), `ReadOnlyMany`,
    /// `ReadWriteMany` or `ReadWriteOncePod`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("items" = {
        "type": "string",
        "enum": ["ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod"]
    }))]
    pub access_modes: Vec<String>,
}

/// What happens to PVCs when their owner is deleted or scaled down.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = crate::schema::field_described)]
pub enum PvcRetentionPolicyType {
    /// Keep the PVCs.
    Retain,
    /// Delete the PVCs.
    Delete,
}

/// PVC lifecycle of a stateful component. Resolved per field from the most specific level
/// (pool, shard, table group, cluster; or etcd, global topo server, cluster); a level that sets
/// only one field inherits the other. Absent everywhere means Retain/Retain: data is never deleted
/// unless asked for.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PvcDeletionPolicy {
    /// `Retain` or `Delete`: whether PVCs are deleted with the cluster (or component). Inherited
    /// from the enclosing level when unset; `Retain` if set nowhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when_deleted: Option<PvcRetentionPolicyType>,

    /// `Retain` or `Delete`: whether PVCs of removed replicas are deleted on scale-down.
    /// Inherited from the enclosing level when unset; `Retain` if set nowhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when_scaled: Option<PvcRetentionPolicyType>,
}

/// Whether stale topology entries are pruned.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TopologyPruningConfig {
    /// When true (the default), poolers registered in the topology without a backing pod are
    /// marked shut down so multiorch drops them. When false, entries are registered but never
    /// removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

/// Mutual TLS between Multigres components.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InternalTlsConfig {
    /// Enables mutual TLS between internal components (gRPC). The webhook sets it to true on a
    /// cluster created without it; a cluster stored without it has it off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,

    /// The etcd servers the operator runs (the global one and every cell's own) serve clients
    /// and peers over TLS with a certificate of the cluster's internal CA and accept only
    /// clients presenting one; every Multigres process and the operator dial them with their
    /// internal certificate. Multigres takes one TLS setting for every etcd a process dials, so
    /// it needs every topology server of the cluster to be one the operator runs. The webhook
    /// sets it on a new cluster (true when no topology server is external); it cannot change
    /// afterwards, since etcd members keep the peer URLs they were created with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<bool>,
}

/// TLS between PostgreSQL clients and multigateway. The certificate comes from the cluster's
/// gateway CA (the default), from cert-manager (`spec.issuerName`) or from the user's own
/// Secret (`secretName`); the CA that signed it is published in ConfigMap
/// `<cluster>-gateway-ca`, key `ca.crt`, when the operator knows it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!(has(self.secretName) && has(self.enabled) && !self.enabled)")
    .message("spec.gatewayTLS.secretName: a gateway certificate needs TLS enabled; remove enabled: false or secretName"))]
pub struct GatewayTlsConfig {
    /// multigateway offers TLS to clients. Default true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,

    /// multigateway refuses plaintext client connections (a CancelRequest is still accepted).
    /// Default false: clients choose, as `sslmode=prefer` does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub required: Option<bool>,

    /// The user's own `kubernetes.io/tls` Secret in the cluster's namespace (keys `tls.crt`,
    /// `tls.key`, optionally `ca.crt`), served instead of a certificate the operator issues.
    /// The operator only reads it, and rolls the gateways when its certificate changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), regex(pattern = DNS_SUBDOMAIN_PATTERN))]
    pub secret_name: Option<String>,
}

impl InternalTlsConfig {
    /// Whether internal mutual TLS is on: a stored cluster without a value has it off (the
    /// webhook sets it on for a new cluster).
    pub fn is_enabled(config: Option<&Self>) -> bool {
        config.and_then(|c| c.enabled) == Some(true)
    }

    /// Whether the managed etcd servers serve TLS: a stored cluster without a value has it off.
    pub fn topology_enabled(config: Option<&Self>) -> bool {
        config.and_then(|c| c.topology) == Some(true)
    }

    /// Whether the cluster needs its internal CA and certificates (for gRPC or for etcd).
    pub fn needs_certificates(config: Option<&Self>) -> bool {
        Self::is_enabled(config) || Self::topology_enabled(config)
    }
}

impl GatewayTlsConfig {
    /// Whether multigateway serves TLS (unset means yes).
    pub fn is_enabled(config: Option<&Self>) -> bool {
        config.and_then(|c| c.enabled) != Some(false)
    }

    /// Whether plaintext clients are refused.
    pub fn is_required(config: Option<&Self>) -> bool {
        Self::is_enabled(config) && config.and_then(|c| c.required) == Some(true)
    }

    /// The Secret multigateway serves: the named one, or the one the operator issues.
    pub fn served_secret(config: Option<&Self>, cluster: &str) -> String {
        config
            .and_then(|c| c.secret_name.clone())
            .unwrap_or_else(|| crate::names::gateway_tls(cluster))
    }
}

/// Settings of one container of a pool pod.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContainerConfig {
    /// Compute resources of the container; replaces the template's block as a whole. Default for
    /// postgres: requests 100m CPU, 256Mi memory, limit 512Mi; for multipooler: 100m, 128Mi,
    /// limit 256Mi.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "embedded::<ResourceRequirements>")]
    pub resources: Option<ResourceRequirements>,

    /// UID of the container process (at least 1). Unset: the image's user. postgres and
    /// multipooler share PGDATA, so set both or neither.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub run_as_user: Option<i64>,

    /// Primary GID of the container process (at least 0). Unset: the runtime's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub run_as_group: Option<i64>,
}

/// Backup storage backend of pgBackRest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = crate::schema::field_described)]
pub enum BackupType {
    /// A PVC shared by the shard's pods.
    #[serde(rename = "filesystem")]
    Filesystem,
    /// S3-compatible object storage.
    #[serde(rename = "s3")]
    S3,
}

/// pgBackRest backup configuration. Set at cluster, database, table group or shard level; a
/// level with the same `type` merges field by field over its parent, a different `type` replaces
/// it. Default: filesystem at `/backups` on a 10Gi PVC.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.type != 's3' || has(self.s3)")
    .message("s3 config is required when type is 's3'"))]
#[x_kube(validation = Rule::new("self.type != 'filesystem' || has(self.filesystem)")
    .message("filesystem config is required when type is 'filesystem'"))]
#[x_kube(validation = Rule::new(
    "has(self.encryption) == has(oldSelf.encryption) && (!has(self.encryption) || self.encryption == oldSelf.encryption)")
    .message("encryption is immutable and cannot be added, removed, or changed after creation"))]
pub struct BackupConfig {
    /// Storage backend: `filesystem` (requires `filesystem`) or `s3` (requires `s3`).
    #[serde(rename = "type")]
    pub type_: BackupType,

    /// Filesystem (PVC) backup settings; required when type is `filesystem`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filesystem: Option<FilesystemBackupConfig>,

    /// S3 backup settings; required when type is `s3`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<S3BackupConfig>,

    /// TLS for pgBackRest traffic between pods (standbys fetch from the primary's pgBackRest
    /// server). Without a Secret name the operator generates and rotates certificates.
    #[serde(
        default,
        rename = "pgbackrestTLS",
        skip_serializing_if = "Option::is_none"
    )]
    pub pgbackrest_tls: Option<PgBackRestTlsConfig>,

    /// Client-side encryption of backups. Immutable: cannot be added, removed or changed after
    /// creation, since existing backups would become unreadable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<BackupEncryptionConfig>,

    /// Backups taken on a schedule. Multigres itself takes one backup, when a shard is
    /// created; without a schedule no other backup is ever taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<BackupScheduleConfig>,

    /// Start a new cluster from another cluster's S3 repository, restored to a chosen moment,
    /// instead of an empty database. Read once, before the shard's first pod starts: the
    /// restored data becomes the first backup of this cluster's own repository, and the source
    /// is only read. Cannot be added to, or changed on, an existing cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery: Option<RecoveryConfig>,
}

/// Where a new cluster's data comes from, and up to which moment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RecoveryConfig {
    /// The S3 repository of the cluster to recover (its `backup.s3` settings). Only read,
    /// with its own credentials.
    pub source: S3BackupConfig,

    /// The moment to restore to. Absent: everything the source's WAL archive holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<RecoveryTarget>,
}

/// One moment in a source repository: a time, a WAL position, or the end of one backup.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("[has(self.time), has(self.lsn), has(self.backup)].filter(x, x).size() == 1")
    .message("a recovery target names exactly one of time, lsn and backup"))]
pub struct RecoveryTarget {
    /// A time (RFC 3339, e.g. `2026-12-05T14:02:59Z`): every transaction committed before it
    /// is kept, none after. Needs a backup that ended before it and archived WAL up to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,

    /// A WAL position (LSN, e.g. `0/3000060`), as `pg_current_wal_lsn()` prints it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = "^[0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}$"))]
    pub lsn: Option<String>,

    /// A backup's label (e.g. `20261205-094009F`, as the Shard status lists them): the
    /// database as that backup left it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = "^[0-9]{8}-[0-9]{6}F(_[0-9]{8}-[0-9]{6}[DI])?$"))]
    pub backup: Option<String>,
}

/// A recurring backup of each shard the backup configuration applies to, taken on a replica
/// through Multigres (`MultipoolerManager.Backup`), then old backups expired by `retainFull`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupScheduleConfig {
    /// When, as a five-field cron expression in UTC (minute, hour, day of month, month, day of
    /// week), e.g. `0 2 * * *` for 02:00 every day.
    #[schemars(length(min = 1, max = 100))]
    pub cron: String,

    /// Kind of backup: `full` (default), `diff` (changes since the last full backup) or `incr`
    /// (changes since the last backup).
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<BackupKind>,

    /// Full backups to keep, 1 to 7 (default 7); after each scheduled backup, older full
    /// backups expire with the differential and incremental backups built on them. At most 7:
    /// Multigres's pgBackRest expires down to 7 full backups after every backup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 7))]
    pub retain_full: Option<u32>,

    /// Take no scheduled backup while true; the schedule and its status stay.
    #[serde(default, skip_serializing_if = "crate::schema::is_false")]
    pub suspend: bool,
}

/// Client-side pgBackRest encryption.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupEncryptionConfig {
    /// Existing Secret holding key `keys.json`: a JSON map from repository generation to
    /// passphrase, e.g. `{"1": "<passphrase>"}`.
    #[schemars(length(min = 1, max = 253))]
    pub secret_name: String,
}

/// Filesystem (PVC) backups.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FilesystemBackupConfig {
    /// Directory of the backup repository inside the pods. Default `/backups`. Absolute and
    /// normalized, and neither one of the pods' own directories (PGDATA under
    /// `/var/lib/pooler`, `/etc`, `/tmp`, ...) nor inside or above one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::backup_path::schema")]
    pub path: Option<String>,

    /// The shard-wide backup PVC (default 10Gi). More than one pod mounting it needs
    /// `ReadWriteMany`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<StorageSpec>,
}

/// S3-compatible backup storage.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(
    "!(has(self.serviceAccountName) && size(self.serviceAccountName) > 0 && has(self.credentialsSecret) && size(self.credentialsSecret) > 0)")
    .message("serviceAccountName and credentialsSecret are mutually exclusive"))]
#[x_kube(validation = Rule::new(
    "!(has(self.serviceAccountName) && size(self.serviceAccountName) > 0 && has(self.useEnvCredentials) && self.useEnvCredentials)")
    .message("serviceAccountName and useEnvCredentials are mutually exclusive — IRSA credentials are handled automatically"))]
pub struct S3BackupConfig {
    /// Bucket name.
    #[schemars(length(min = 1))]
    pub bucket: String,

    /// Bucket region, e.g. `us-east-1`.
    #[schemars(length(min = 1))]
    pub region: String,

    /// Endpoint of an S3-compatible service; empty means AWS S3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,

    /// Prefix of every object key in the bucket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_prefix: Option<String>,

    /// Take credentials from the pods' environment (e.g. node roles). Exclusive with
    /// `serviceAccountName`.
    #[serde(default, skip_serializing_if = "crate::schema::is_false")]
    pub use_env_credentials: bool,

    /// Secret holding `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY`. Exclusive with
    /// `serviceAccountName`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret: Option<String>,

    /// Existing ServiceAccount annotated for IRSA (`eks.amazonaws.com/role-arn`); the operator
    /// does not create it. Exclusive with `credentialsSecret` and `useEnvCredentials`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_name: Option<String>,
}

/// TLS for pgBackRest traffic between pods.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PgBackRestTlsConfig {
    /// Existing Secret with `ca.crt`, `tls.crt` and `tls.key` (cert-manager compatible). Empty:
    /// the operator generates and rotates the certificates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_name: Option<String>,
}

/// Reference to a Secret, in the cluster's namespace, holding the Postgres superuser password.
/// The operator only reads it; it never creates, changes or deletes it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PostgresPasswordSecretRef {
    /// Name of the Secret (a DNS subdomain).
    #[schemars(length(min = 1, max = 253), regex(pattern = DNS_SUBDOMAIN_PATTERN))]
    pub name: String,

    /// Key of the password inside the Secret's data.
    #[schemars(length(min = 1, max = 253), regex(pattern = "^[-._a-zA-Z0-9]+$"))]
    pub key: String,
}

/// Reference to a ConfigMap whose postgresql.conf lines are merged into the rendered config.
/// Deprecated in favour of the inline `postgresConfig` map.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PostgresConfigRef {
    /// Name of the ConfigMap, in the cluster's namespace.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,

    /// Key of the postgresql.conf content inside the ConfigMap.
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

/// Log level of a Multigres component.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = crate::schema::field_described)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    /// Verbose diagnostics.
    Debug,
    /// Normal operation (the default).
    Info,
    /// Warnings and errors only.
    Warn,
    /// Errors only.
    Error,
}

/// `--log-level` of each data-plane component; unset fields mean `info`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ComponentLogLevels {
    /// Log level of pgctld: `debug`, `info` (default), `warn` or `error`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pgctld: Option<LogLevel>,

    /// Log level of multipooler: `debug`, `info` (default), `warn` or `error`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multipooler: Option<LogLevel>,

    /// Log level of multiorch: `debug`, `info` (default), `warn` or `error`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multiorch: Option<LogLevel>,

    /// Log level of multiadmin: `debug`, `info` (default), `warn` or `error`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multiadmin: Option<LogLevel>,

    /// Log level of multigateway: `debug`, `info` (default), `warn` or `error`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multigateway: Option<LogLevel>,
}

/// Access pattern of a pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = crate::schema::field_described)]
pub enum PoolType {
    /// Primary plus replicas serving reads and writes (the only type today).
    #[serde(rename = "readWrite")]
    ReadWrite,
}

/// Lifecycle state of a resource, aggregated from its conditions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = crate::schema::field_described)]
pub enum Phase {
    /// Being created.
    Initializing,
    /// Converging towards the desired state (e.g. a rolling update).
    Progressing,
    /// Desired state reached.
    Healthy,
    /// Failing or partly unavailable.
    Degraded,
    /// Stopped on request (annotation `multigres.com/hibernate`): no pod runs, the data stays.
    Hibernated,
    /// Not observed yet.
    Unknown,
}

/// Image pull policy applied to every pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = crate::schema::field_described)]
pub enum ImagePullPolicy {
    /// Always pull.
    Always,
    /// Never pull; the image must be present on the node.
    Never,
    /// Pull only when missing (the default).
    IfNotPresent,
}

/// Images and pull settings of a Cell's pods.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CellImages {
    /// Image pull policy: `Always`, `Never` or `IfNotPresent`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<ImagePullPolicy>,

    /// Secrets used to pull the images, in the same namespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "embedded_list::<LocalObjectReference>")]
    pub image_pull_secrets: Vec<LocalObjectReference>,

    /// Image of multigateway.
    pub multigateway: ImageRef,
}

/// Images and pull settings of a Shard's pods.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ShardImages {
    /// Image pull policy: `Always`, `Never` or `IfNotPresent`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<ImagePullPolicy>,

    /// Secrets used to pull the images, in the same namespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "embedded_list::<LocalObjectReference>")]
    pub image_pull_secrets: Vec<LocalObjectReference>,

    /// Image of multiorch.
    pub multiorch: ImageRef,

    /// Image of multipooler.
    pub multipooler: ImageRef,

    /// Image of pgctld with PostgreSQL and pgBackRest.
    pub postgres: ImageRef,

    /// Image of postgres_exporter (unset in a Shard written by an older operator: the
    /// operator's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub postgres_exporter: Option<ImageRef>,
}

/// OTLP transport protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = crate::schema::field_described)]
pub enum OtlpProtocol {
    /// OTLP over HTTP with protobuf bodies.
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
    /// OTLP over gRPC.
    #[serde(rename = "grpc")]
    Grpc,
}

/// OpenTelemetry exporter of one signal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = crate::schema::field_described)]
pub enum TelemetryExporter {
    /// Export over OTLP.
    #[serde(rename = "otlp")]
    Otlp,
    /// Do not export (upstream's default).
    #[serde(rename = "none")]
    Disabled,
    /// Print to the console.
    #[serde(rename = "console")]
    Console,
}

/// Metrics temporality preference.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = crate::schema::field_described)]
#[serde(rename_all = "lowercase")]
pub enum MetricsTemporality {
    /// Cumulative sums.
    Cumulative,
    /// Deltas between exports.
    Delta,
}

/// Default histogram aggregation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = crate::schema::field_described)]
#[serde(rename_all = "snake_case")]
pub enum HistogramAggregation {
    /// Native exponential histograms, compact and accurate.
    Base2ExponentialBucketHistogram,
    /// Fixed bucket boundaries.
    ExplicitBucketHistogram,
}

/// OpenTelemetry settings of data-plane pods. Unset fields fall back to the operator's own
/// `OTEL_*` environment at reconcile time.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObservabilityConfig {
    /// Collector endpoint URL (`OTEL_EXPORTER_OTLP_ENDPOINT`), e.g. `http://otel-collector:4318`;
    /// `disabled` turns telemetry off whatever the operator's settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub otlp_endpoint: Option<String>,

    /// Collector endpoint URL for metrics (`OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub otlp_metrics_endpoint: Option<String>,

    /// Transport (`OTEL_EXPORTER_OTLP_PROTOCOL`): `http/protobuf` or `grpc`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub otlp_protocol: Option<OtlpProtocol>,

    /// Trace exporter (`OTEL_TRACES_EXPORTER`): `otlp`, `none` (upstream default) or `console`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traces_exporter: Option<TelemetryExporter>,

    /// Metrics exporter (`OTEL_METRICS_EXPORTER`): `otlp`, `none` (upstream default) or
    /// `console`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_exporter: Option<TelemetryExporter>,

    /// Logs exporter (`OTEL_LOGS_EXPORTER`): `otlp`, `none` (upstream default) or `console`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logs_exporter: Option<TelemetryExporter>,

    /// Metric export interval in milliseconds (`OTEL_METRIC_EXPORT_INTERVAL`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric_export_interval: Option<String>,

    /// Temporality preference: `cumulative` or `delta`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_temporality: Option<MetricsTemporality>,

    /// Default histogram aggregation: `base2_exponential_bucket_histogram` or
    /// `explicit_bucket_histogram`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub histogram_aggregation: Option<HistogramAggregation>,

    /// Sampler (`OTEL_TRACES_SAMPLER`): e.g. `always_on`, `always_off`,
    /// `parentbased_traceidratio`, or `multigres_custom` with `samplingConfigRef`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traces_sampler: Option<String>,

    /// ConfigMap with the sampling configuration, used when `tracesSampler` is
    /// `multigres_custom`; mounted at `/etc/otel/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampling_config_ref: Option<SamplingConfigRef>,

    /// PostgreSQL's own metrics: postgres_exporter beside PostgreSQL in every pool pod, on
    /// port 9187 (`pg-metrics`, TLS), scraped through the cluster's PodMonitor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub postgres_exporter: Option<PostgresExporterConfig>,
}

/// postgres_exporter of the pool pods.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PostgresExporterConfig {
    /// Whether pool pods run the exporter. The admission webhook sets `true` on a cluster
    /// created without a value; unset (a cluster created before the exporter existed) means
    /// `false`, so an operator upgrade restarts no pool to add it. A change rolls the pool pods
    /// in order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,

    /// ConfigMap key holding user-defined queries in postgres_exporter's queries.yaml format,
    /// run besides the default collectors. Read at every scrape: an edit applies without a
    /// restart. A missing ConfigMap or key never stops PostgreSQL: the exporter then reports
    /// `pg_exporter_user_queries_load_error`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom_queries: Option<CustomQueriesRef>,

    /// Resources of the exporter container. Default: requests 10m CPU and 32Mi memory, limit
    /// 128Mi memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "embedded::<ResourceRequirements>")]
    pub resources: Option<ResourceRequirements>,
}

impl PostgresExporterConfig {
    /// Whether the exporter runs under `config`: only when turned on (see `enabled`).
    pub fn enabled(config: Option<&ObservabilityConfig>) -> bool {
        config
            .and_then(|c| c.postgres_exporter.as_ref())
            .and_then(|e| e.enabled)
            .unwrap_or(false)
    }
}

/// Reference to a ConfigMap key holding postgres_exporter queries.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CustomQueriesRef {
    /// Name of the ConfigMap, in the cluster's namespace.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,

    /// Key of the queries file inside the ConfigMap. Default `queries.yaml`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        extend("default" = "queries.yaml"),
        length(min = 1, max = 253),
        regex(pattern = "^[-._a-zA-Z0-9]+$")
    )]
    pub key: Option<String>,
}

/// Reference to a ConfigMap holding a trace sampling configuration file.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SamplingConfigRef {
    /// Name of the ConfigMap, in the same namespace.
    pub name: String,

    /// Key of the file inside the ConfigMap. Default `sampling-config.yaml`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = "sampling-config.yaml"))]
    pub key: Option<String>,
}

/// Reference from a child resource to the global topology server.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GlobalTopoServerRef {
    /// Client address of the topology server, `host:port`.
    #[schemars(length(min = 1, max = 512))]
    pub address: String,

    /// Key prefix of the cluster's global topology, e.g. `/multigres/global`.
    #[schemars(length(min = 1, max = 512))]
    pub root_path: String,

    /// Topology client implementation, e.g. `etcd`.
    #[schemars(length(min = 1, max = 63))]
    pub implementation: String,

    /// An external server's CA Secret (`ca.crt`): every Multigres process mounts it and
    /// verifies etcd with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub ca_secret: Option<String>,

    /// An external server's client certificate Secret (`tls.crt`, `tls.key`): every Multigres
    /// process mounts it and presents it to etcd, which turns on TLS to the topology.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub client_cert_secret: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_tls_is_off_unless_enabled_and_gateway_tls_on_unless_disabled() {
        let internal = |enabled| InternalTlsConfig {
            enabled,
            topology: None,
        };
        assert!(!InternalTlsConfig::is_enabled(None));
        assert!(!InternalTlsConfig::is_enabled(Some(&internal(None))));
        assert!(!InternalTlsConfig::is_enabled(Some(&internal(Some(false)))));
        assert!(InternalTlsConfig::is_enabled(Some(&internal(Some(true)))));
        assert!(GatewayTlsConfig::is_enabled(None));
        let off = GatewayTlsConfig {
            enabled: Some(false),
            required: Some(true),
            secret_name: None,
        };
        assert!(!GatewayTlsConfig::is_enabled(Some(&off)));
        assert!(!GatewayTlsConfig::is_required(Some(&off)));
    }
}
