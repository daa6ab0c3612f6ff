//! Built-in defaults: the last level of the resolution chain, used for anything no template,
//! override or inline spec sets. Values follow the upstream operator so manifests mean the same.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::v1alpha1::PvcRetentionPolicyType;

pub const POSTGRES_IMAGE: &str = "ghcr.io/multigres/pgctld:sha-66d2310";
pub const MULTIGRES_IMAGE: &str = "ghcr.io/multigres/multigres:sha-66d2310";
pub const MULTIADMIN_WEB_IMAGE: &str = "ghcr.io/multigres/multiadmin-web:sha-64da1ab";
/// postgres_exporter beside PostgreSQL in every pool pod (e2e/images/postgres-exporter.sh tags
/// its local build with this reference).
pub const POSTGRES_EXPORTER_IMAGE: &str = "quay.io/prometheuscommunity/postgres-exporter:v0.17.1";
/// Key of the custom queries file in its ConfigMap (the CRD schema default).
pub const EXPORTER_QUERIES_KEY: &str = "queries.yaml";
pub const ETCD_IMAGE: &str = "gcr.io/etcd-development/etcd:v3.6.7";

pub const ETCD_REPLICAS: i32 = 3;
pub const MULTIADMIN_REPLICAS: i32 = 1;
pub const MULTIADMIN_WEB_REPLICAS: i32 = 1;
pub const MULTIGATEWAY_REPLICAS: i32 = 1;
pub const MULTIORCH_REPLICAS: i32 = 1;

/// multiorch's wait before it appoints a new primary: 1 s plus up to 2 s at random (multiorch's
/// own 4 s plus up to 8 s made switchovers take 6-14 s, longer than multigateway's 10 s buffer
/// window; docs/performance.md). The random part keeps the multiorchs of several cells apart.
pub const MULTIORCH_FAILOVER_GRACE_BASE: &str = "1s";
pub const MULTIORCH_FAILOVER_GRACE_MAX_JITTER: &str = "2s";

/// multigateway buffers every primary change, however soon after the previous one
/// (multigateway's default, `1m`, let a switchover within a minute of a failover reach clients
/// as errors).
pub const GATEWAY_BUFFER_MIN_TIME_BETWEEN_FAILOVERS: &str = "0s";

/// Pool replicas per cell when a pool names none: the fewest that survive the loss of any one
/// pod (3 in one cell, 2 per cell in two cells, 1 per cell in three or more; [`super::cohort`]).
/// An explicit `replicasPerCell` may ask for less; the webhook then warns.
pub use super::cohort::pool_replicas_per_cell;

pub const ETCD_STORAGE: &str = "1Gi";
pub const POOL_STORAGE: &str = "1Gi";
pub const BACKUP_STORAGE: &str = "10Gi";
pub const BACKUP_PATH: &str = "/backups";
pub const ACCESS_MODE: &str = "ReadWriteOnce";

pub const GLOBAL_ROOT: &str = "/multigres/global";
/// Root of a cell's records: `/multigres/<cell>`.
pub fn cell_root(cell: &str) -> String {
    format!("/multigres/{cell}")
}
pub const TOPO_IMPLEMENTATION: &str = "etcd";
/// Key of the trace sampling file in its ConfigMap (the CRD schema default).
pub const SAMPLING_CONFIG_KEY: &str = "sampling-config.yaml";
pub const ETCD_CLIENT_PORT: u16 = 2379;

pub const DURABILITY_POLICY: &str = "AT_LEAST_2";
/// Durability policies Multigres accepts at bootstrap.
pub const DURABILITY_POLICIES: [&str; 2] = ["AT_LEAST_2", "MULTI_CELL_AT_LEAST_2"];
pub const POSTGRES_SUPERUSER: &str = "postgres";

/// PVCs are kept unless the user says otherwise, on cluster deletion and on scale-down alike.
pub const PVC_WHEN_DELETED: PvcRetentionPolicyType = PvcRetentionPolicyType::Retain;
pub const PVC_WHEN_SCALED: PvcRetentionPolicyType = PvcRetentionPolicyType::Retain;

/// Requests and limits: `(cpu request, memory request, memory limit)`. No CPU limit, to avoid
/// throttling latency-sensitive processes.
fn resources(cpu: &str, memory: &str, memory_limit: &str) -> ResourceRequirements {
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".to_string(), Quantity(cpu.to_string())),
            ("memory".to_string(), Quantity(memory.to_string())),
        ])),
        limits: Some(BTreeMap::from([(
            "memory".to_string(),
            Quantity(memory_limit.to_string()),
        )])),
        ..Default::default()
    }
}

pub fn multiadmin_resources() -> ResourceRequirements {
    resources("100m", "128Mi", "256Mi")
}
pub fn etcd_resources() -> ResourceRequirements {
    resources("100m", "256Mi", "512Mi")
}
pub fn multigateway_resources() -> ResourceRequirements {
    resources("100m", "128Mi", "256Mi")
}
pub fn multiorch_resources() -> ResourceRequirements {
    resources("50m", "64Mi", "128Mi")
}
pub fn postgres_resources() -> ResourceRequirements {
    resources("100m", "256Mi", "512Mi")
}
pub fn multipooler_resources() -> ResourceRequirements {
    resources("100m", "128Mi", "256Mi")
}
pub fn multiadmin_web_resources() -> ResourceRequirements {
    resources("50m", "64Mi", "128Mi")
}
