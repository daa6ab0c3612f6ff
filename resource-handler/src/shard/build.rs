//! Shard → a multiorch Deployment (and Service) per watched cell, and per pool and cell a
//! StatefulSet of PostgreSQL pods (pgctld running PostgreSQL as a native sidecar, multipooler
//! next to it, both on one data volume), its headless Service and a PodDisruptionBudget; plus
//! the shard's filesystem backup volume.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::apps::v1::{
    Deployment, StatefulSet, StatefulSetSpec, StatefulSetUpdateStrategy,
};
use k8s_openapi::api::core::v1::{
    Container, EnvVar, KeyToPath, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PersistentVolumeClaimVolumeSource, PodSpec, PodTemplateSpec, SecretVolumeSource, Service,
    ServiceSpec, Volume, VolumeMount, VolumeResourceRequirements,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;
use multigres_api::confirm;
use multigres_api::labels::{self, Component, Placement, ROLE, ROLE_PRIMARY};
use multigres_api::owner::Owner;
use multigres_api::resolver::defaults;
use multigres_api::v1alpha1::{
    BackupConfig, BackupType, CellName, PoolSpec, PvcDeletionPolicy, PvcRetentionPolicyType, Shard,
    ShardSpec, StorageSpec, VolumeAutoGrow,
};

use crate::contract::{
    LOOPBACK, MULTIORCH_GRPC, MULTIORCH_HTTP, MULTIPOOLER_GRPC, MULTIPOOLER_HTTP, PASSWORD_DIR,
    PASSWORD_FILE, PGBACKREST_CERT_DIR, PGBACKREST_CIPHER_DIR, PGBACKREST_PORT, PGCTLD_BIN,
    PGCTLD_GRPC, PGCTLD_HTTP, PGDATA, POOLER_DIR, POSTGRES_PORT, flag, flag_expanding,
    log_level_flag, multigres_bin, topo_flags,
};
use crate::podspec::{
    POSTGRES_ID, Probes, PullSettings, RunAs, container_port, container_security, env,
    env_from_secret, mount, pod_identity_env, pod_security, service_port,
    spread_across_zones_and_nodes,
};
use crate::stateless::{self, Process, Workload};
use crate::toposerver::build::retention;

/// Data volume claim template of pool pods (PVCs are `data-<pod>`).
pub const DATA_VOLUME: &str = "data";
pub(super) const PASSWORD_VOLUME: &str = "postgres-password";
const BACKUP_VOLUME: &str = "backup";
const SOCKET_VOLUME: &str = "postgres-socket";
const SOCKET_DIR: &str = "/var/run/postgresql";
const CIPHER_VOLUME: &str = "pgbackrest-cipher";
/// Startup budget of the pool processes: pgctld and multipooler listen at once, but PostgreSQL
/// may replay WAL or restore a backup before it is usable.
const POOL_STARTUP_SECONDS: i32 = 600;
/// How long multipooler's graceful shutdown on SIGTERM may take (upstream's default
/// `--onterm-timeout`, which the pool pods keep): it stops serving, leaves the cohort and stops
/// PostgreSQL (fast, then immediate).
pub const MULTIPOOLER_ONTERM_SECONDS: i64 = 30;
/// Grace period of pool pods: twice multipooler's onterm timeout, so that shutdown is never
/// cut short by SIGKILL and the pgctld sidecar (stopped after it) still has time.
pub const POOL_TERMINATION_GRACE_SECONDS: i64 = 2 * MULTIPOOLER_ONTERM_SECONDS;
/// Startup budget of multiorch: it listens right away.
const MULTIORCH_STARTUP_SECONDS: i32 = 300;

/// The multiorch of one cell.
#[derive(Clone, Debug, PartialEq)]
pub struct MultiorchObjects {
    /// Cell of the workload.
    pub cell: String,
    /// The multiorch Deployment.
    pub deployment: Deployment,
    pub service: Service,
    /// Keeps a drain from taking the cell's multiorch (see [`stateless::budget`]).
    pub pdb: Option<PodDisruptionBudget>,
}

/// One pool in one cell.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolObjects {
    /// Pool name.
    pub pool: String,
    /// Cell of the workload.
    pub cell: String,
    /// The pool's StatefulSet in this cell.
    pub statefulset: StatefulSet,
    pub service: Service,
    /// One replica of the pool in this cell down at a time (the primary has its own).
    pub pdb: PodDisruptionBudget,
    /// Labels selecting the pool's pods (and its PVCs).
    pub selector: BTreeMap<String, String>,
    /// Size each data volume should request.
    pub storage_size: String,
    /// The pool's `autoGrow`, as written.
    pub auto_grow: Option<VolumeAutoGrow>,
    /// `whenScaled: Delete`: the handler deletes a scaled-away replica's claims itself, once
    /// its pod is gone and out of the consensus cohort (see [`super::scale::scaled_away`]); the
    /// StatefulSet always retains them, since its controller would delete them with the pod.
    pub delete_scaled_claims: bool,
}

/// Everything a Shard runs.
#[derive(Clone, Debug, PartialEq)]
pub struct ShardObjects {
    /// One multiorch per watched cell.
    pub multiorch: Vec<MultiorchObjects>,
    /// One entry per pool and cell.
    pub pools: Vec<PoolObjects>,
    /// The filesystem backup repository shared by the shard's pods.
    pub backup: Option<PersistentVolumeClaim>,
    /// No voluntary eviction of the primary while another pool pod could take over: a drain
    /// waits until it has handed over (see [`crate::cordon`]). None for a one-pod shard.
    pub primary_pdb: Option<PodDisruptionBudget>,
}

fn placement<'a>(
    spec: &'a ShardSpec,
    cell: Option<&'a str>,
    pool: Option<&'a str>,
) -> Placement<'a> {
    Placement {
        cell,
        database: Some(spec.database_name.as_str()),
        table_group: Some(spec.table_group_name.as_str()),
        shard: Some(spec.shard_name.as_str()),
        pool,
    }
}

pub(super) fn pull(spec: &ShardSpec) -> PullSettings {
    PullSettings::new(
        spec.images.image_pull_policy,
        &spec.images.image_pull_secrets,
    )
}

/// Cells that get a multiorch: the spec's, else every cell a pool uses.
pub fn multiorch_cells(spec: &ShardSpec) -> Vec<String> {
    let cells: BTreeSet<String> = if spec.multiorch.cells.is_empty() {
        spec.pools
            .values()
            .flat_map(|p| p.cells.iter().map(|c| c.as_str().to_owned()))
            .collect()
    } else {
        spec.multiorch
            .cells
            .iter()
            .map(|c| c.as_str().to_owned())
            .collect()
    };
    cells.into_iter().collect()
}

/// Every cell a pool runs in.
pub fn pool_cells(spec: &ShardSpec) -> Vec<CellName> {
    let cells: BTreeSet<&CellName> = spec.pools.values().flat_map(|p| &p.cells).collect();
    cells.into_iter().cloned().collect()
}

/// Whether the owner of a cluster agreed that its filesystem backups go with it.
///
/// The backup volume holds the only copy of a filesystem repository: under
/// `whenDeleted: Delete` it goes with the Shard (and so with the cluster) only when the
/// cluster's annotation `multigres.com/confirm-delete-backups` names the cluster; the
/// cluster-handler copies it onto the Shard. Otherwise it is kept, owned by nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackupDeletion {
    /// The backup volume outlives the Shard.
    Unconfirmed,
    /// The backup volume follows `whenDeleted`.
    Confirmed,
}

impl BackupDeletion {
    /// What the annotations of `shard`, in the cluster of `owner`, say.
    pub fn of(shard: &Shard, owner: &Owner) -> Self {
        if confirm::confirmed(shard.annotations(), confirm::DELETE_BACKUPS, &owner.cluster) {
            Self::Confirmed
        } else {
            Self::Unconfirmed
        }
    }
}

/// `objects` with no pod running: every pool StatefulSet and multiorch Deployment at zero
/// replicas, for a hibernating cluster. Services, budgets and claim templates stay as built.
pub fn hibernate(objects: &mut ShardObjects) {
    let sets = objects
        .pools
        .iter_mut()
        .filter_map(|p| p.statefulset.spec.as_mut());
    for spec in sets {
        spec.replicas = Some(0);
    }
    let orchs = objects
        .multiorch
        .iter_mut()
        .filter_map(|m| m.deployment.spec.as_mut());
    for spec in orchs {
        spec.replicas = Some(0);
    }
}

/// Why a Shard's spec cannot be realised. Each message names the field and what it allows: it
/// is what the Shard's status and events say.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    /// No pool, so no PostgreSQL to run (nor a pool for the Jobs to run as).
    #[error("spec.pools is empty: a shard needs at least one pool")]
    NoPools,
    /// A pool placed in no cell.
    #[error("spec.pools.{pool}.cells is empty: a pool runs in at least one cell")]
    PoolWithoutCells {
        /// The pool's name.
        pool: String,
    },
    /// A recovery whose data would land in a repository that is not S3: the recovered data
    /// becomes the first backup of the shard's own repository.
    #[error(
        "spec.backup.recovery: the recovered data becomes the first backup of this shard's own \
         repository, which must be S3 (spec.backup.type: s3)"
    )]
    RecoveryWithoutS3,
}

/// Builds everything of a Shard, or says why the spec cannot be realised.
pub fn build(
    owner: &Owner,
    spec: &ShardSpec,
    backups: BackupDeletion,
) -> Result<ShardObjects, BuildError> {
    if spec.pools.is_empty() {
        return Err(BuildError::NoPools);
    }
    let mut pools = Vec::new();
    for (name, pool) in &spec.pools {
        if pool.cells.is_empty() {
            return Err(BuildError::PoolWithoutCells {
                pool: name.as_str().to_owned(),
            });
        }
        for cell in &pool.cells {
            pools.push(pool_objects(
                owner,
                spec,
                name.as_str(),
                pool,
                cell.as_str(),
            ));
        }
    }
    let multiorch = multiorch_cells(spec)
        .into_iter()
        .map(|cell| multiorch_objects(owner, spec, cell))
        .collect();
    Ok(ShardObjects {
        multiorch,
        primary_pdb: primary_pdb(owner, spec),
        pools,
        backup: backup_pvc(owner, spec, backups),
    })
}

/// The pool pods of the shard in every pool and cell (a pod's role label picks one of the two
/// disjoint budgets: a pod matching two could not be evicted at all).
fn role_selector(selector: BTreeMap<String, String>, primary: bool) -> LabelSelector {
    LabelSelector {
        match_labels: Some(selector),
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: ROLE.to_owned(),
            operator: if primary { "In" } else { "NotIn" }.to_owned(),
            values: Some(vec![ROLE_PRIMARY.to_owned()]),
        }]),
    }
}

/// The shard's primary PodDisruptionBudget (`maxUnavailable: 0`), when it has more than one
/// pool pod.
fn primary_pdb(owner: &Owner, spec: &ShardSpec) -> Option<PodDisruptionBudget> {
    let pods: i32 = spec
        .pools
        .values()
        .map(|p| {
            let cells = p.cells.len();
            p.replicas_per_cell
                .unwrap_or_else(|| defaults::pool_replicas_per_cell(cells))
                * i32::try_from(cells).unwrap_or(i32::MAX)
        })
        .sum();
    if pods < 2 {
        return None;
    }
    let at = placement(spec, None, None);
    let labels = labels::labels(&owner.cluster, Component::Pool, &at);
    let selector = labels::selector(&owner.cluster, Component::Pool, &at);
    Some(PodDisruptionBudget {
        metadata: stateless::metadata(&crate::names::primary_pdb(&owner.name), owner, &labels),
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(0)),
            selector: Some(role_selector(selector, true)),
            ..Default::default()
        }),
        status: None,
    })
}

/// multiorch's service id: stable across restarts so a claim it made survives it. Several
/// replicas of one cell cannot share an id, so each then uses its pod name.
fn multiorch_service_id(deployment: &str, replicas: i32) -> String {
    if replicas <= 1 {
        deployment.to_owned()
    } else {
        "$(POD_NAME)".to_owned()
    }
}

/// multiorch's wait before it appoints a new primary, as the spec sets it (the resolver fills
/// in the operator's defaults; a Shard written without them gets multiorch's own).
fn multiorch_grace_flags(spec: &ShardSpec) -> Vec<String> {
    let orch = &spec.multiorch;
    [
        (
            "leader-failover-grace-period-base",
            &orch.leader_failover_grace_period_base,
        ),
        (
            "leader-failover-grace-period-max-jitter",
            &orch.leader_failover_grace_period_max_jitter,
        ),
    ]
    .into_iter()
    .filter_map(|(name, value)| value.as_ref().map(|v| flag(name, v.as_str())))
    .collect()
}

fn multiorch_objects(owner: &Owner, spec: &ShardSpec, cell: String) -> MultiorchObjects {
    let at = placement(spec, Some(&cell), None);
    let labels = labels::labels(&owner.cluster, Component::Multiorch, &at);
    let selector = labels::selector(&owner.cluster, Component::Multiorch, &at);
    let name = crate::names::multiorch(&owner.name, &cell);
    let replicas = spec
        .multiorch
        .stateless
        .replicas
        .unwrap_or(defaults::MULTIORCH_REPLICAS);
    let mut args = vec![
        flag("http-port", MULTIORCH_HTTP),
        flag("grpc-port", MULTIORCH_GRPC),
    ];
    args.extend(topo_flags(&spec.global_topo_server));
    args.extend([
        flag("cell", &cell),
        flag(
            "watch-targets",
            format!(
                "{}/{}/{}",
                spec.database_name.as_str(),
                spec.table_group_name.as_str(),
                spec.shard_name.as_str()
            ),
        ),
        flag_expanding("service-id", multiorch_service_id(&name, replicas)),
        flag_expanding("hostname", "$(POD_IP)"),
        log_level_flag(spec.log_levels.as_ref().and_then(|l| l.multiorch)),
    ]);
    args.extend(multiorch_grace_flags(spec));
    let pull = pull(spec);
    let workload = Workload {
        name: name.clone(),
        owner,
        labels: labels.clone(),
        selector: selector.clone(),
        spec: &spec.multiorch.stateless,
        default_replicas: defaults::MULTIORCH_REPLICAS,
        tolerations: spec
            .multiorch
            .placement
            .as_ref()
            .map(|p| p.tolerations.clone())
            .unwrap_or_default(),
        node_selector: cell_node_selector(spec, &cell),
        pull: &pull,
        process: Process {
            name: "multiorch",
            image: spec.images.multiorch.as_str().to_owned(),
            command: multigres_bin("multiorch"),
            args,
            ports: vec![
                container_port("http", MULTIORCH_HTTP),
                container_port("grpc", MULTIORCH_GRPC),
            ],
            probes: Probes::multigres(MULTIORCH_HTTP, MULTIORCH_STARTUP_SECONDS),
        },
        recreate: true,
    };
    let pdb = stateless::budget(&workload, replicas);
    let mut deployment = stateless::deployment(workload);
    crate::tls::mount_process_tls_deployment(
        &mut deployment,
        crate::tls::Process::Multiorch,
        owner,
        spec.internal_tls.as_ref(),
        &spec.global_topo_server,
    );
    let service = stateless::service(
        &name,
        owner,
        &labels,
        &selector,
        vec![
            service_port("http", MULTIORCH_HTTP),
            service_port("grpc", MULTIORCH_GRPC),
        ],
    );
    MultiorchObjects {
        cell,
        deployment,
        service,
        pdb,
    }
}

fn cell_node_selector(spec: &ShardSpec, cell: &str) -> BTreeMap<String, String> {
    spec.cell_topology_labels
        .iter()
        .find(|(name, _)| name.as_str() == cell)
        .map(|(_, labels)| labels.clone())
        .unwrap_or_default()
}

fn backup_path(backup: &BackupConfig) -> String {
    backup
        .filesystem
        .as_ref()
        .and_then(|f| f.path.clone())
        .unwrap_or_else(|| defaults::BACKUP_PATH.to_owned())
}

fn is_filesystem(backup: Option<&BackupConfig>) -> Option<&BackupConfig> {
    backup.filter(|b| b.type_ == BackupType::Filesystem)
}

pub(super) fn storage_request(
    storage: &StorageSpec,
    default_size: &str,
) -> (String, PersistentVolumeClaimSpec) {
    let size = storage
        .size
        .clone()
        .unwrap_or_else(|| default_size.to_owned());
    let access_modes = if storage.access_modes.is_empty() {
        vec![defaults::ACCESS_MODE.to_owned()]
    } else {
        storage.access_modes.clone()
    };
    let spec = PersistentVolumeClaimSpec {
        access_modes: Some(access_modes),
        storage_class_name: storage.class.clone(),
        resources: Some(VolumeResourceRequirements {
            requests: Some(BTreeMap::from([(
                "storage".to_owned(),
                Quantity(size.clone()),
            )])),
            ..Default::default()
        }),
        ..Default::default()
    };
    (size, spec)
}

/// The shared filesystem backup volume (none for S3). Owned by the Shard, so deleted with it,
/// only when the shard's `whenDeleted` is `Delete` and the deletion of backups is confirmed
/// ([`BackupDeletion`]).
pub fn backup_pvc(
    owner: &Owner,
    spec: &ShardSpec,
    backups: BackupDeletion,
) -> Option<PersistentVolumeClaim> {
    let backup = is_filesystem(spec.backup.as_ref())?;
    let storage = backup
        .filesystem
        .as_ref()
        .and_then(|f| f.storage.clone())
        .unwrap_or_default();
    let (_, claim) = storage_request(&storage, defaults::BACKUP_STORAGE);
    let delete = spec
        .pvc_deletion_policy
        .as_ref()
        .and_then(|p| p.when_deleted)
        == Some(PvcRetentionPolicyType::Delete)
        && backups == BackupDeletion::Confirmed;
    Some(PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(crate::names::backup_pvc(&owner.name)),
            namespace: Some(owner.namespace.clone()),
            labels: Some(labels::labels(
                &owner.cluster,
                Component::Shard,
                &placement(spec, None, None),
            )),
            owner_references: delete.then(|| vec![owner.reference.clone()]),
            ..Default::default()
        },
        spec: Some(claim),
        status: None,
    })
}

/// The size the backup volume should request.
pub fn backup_size(spec: &ShardSpec) -> Option<String> {
    let backup = is_filesystem(spec.backup.as_ref())?;
    Some(
        backup
            .filesystem
            .as_ref()
            .and_then(|f| f.storage.as_ref())
            .and_then(|s| s.size.clone())
            .unwrap_or_else(|| defaults::BACKUP_STORAGE.to_owned()),
    )
}

/// Environment shared by pgctld and multipooler: where the data lives, who the superuser is
/// and how to reach S3.
fn postgres_env(spec: &ShardSpec) -> Vec<EnvVar> {
    let mut vars = pod_identity_env();
    vars.extend([
        env("PGDATA", PGDATA),
        env(
            "POSTGRES_USER",
            spec.postgres_superuser
                .clone()
                .unwrap_or_else(|| defaults::POSTGRES_SUPERUSER.to_owned()),
        ),
        env("POSTGRES_PASSWORD_FILE", PASSWORD_FILE),
    ]);
    if let Some(s3) = spec
        .backup
        .as_ref()
        .filter(|b| b.type_ == BackupType::S3)
        .and_then(|b| b.s3.as_ref())
    {
        vars.push(env("AWS_REGION", s3.region.clone()));
        if let Some(secret) = &s3.credentials_secret {
            for key in ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"] {
                vars.push(env_from_secret(key, secret, key));
            }
        }
    }
    vars
}

/// The superuser's password from `postgresPasswordSecretRef`, as the file `password` (mounted
/// at [`PASSWORD_DIR`]).
pub(super) fn password_volume(spec: &ShardSpec) -> Volume {
    let secret = &spec.postgres_password_secret_ref;
    Volume {
        name: PASSWORD_VOLUME.to_owned(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret.name.clone()),
            items: Some(vec![KeyToPath {
                key: secret.key.clone(),
                path: "password".to_owned(),
                ..Default::default()
            }]),
            default_mode: Some(0o440),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Volumes of a pool pod besides the data volume, and their mounts (shared by both
/// containers).
fn pool_volumes(owner: &Owner, spec: &ShardSpec) -> (Vec<Volume>, Vec<VolumeMount>) {
    let mut volumes = vec![
        password_volume(spec),
        Volume {
            name: SOCKET_VOLUME.to_owned(),
            empty_dir: Some(Default::default()),
            ..Default::default()
        },
    ];
    let mut mounts = vec![
        mount(DATA_VOLUME, POOLER_DIR, false),
        mount(PASSWORD_VOLUME, PASSWORD_DIR, true),
        mount(SOCKET_VOLUME, SOCKET_DIR, false),
    ];
    let backup = spec.backup.as_ref();
    if let Some(fs) = is_filesystem(backup) {
        volumes.push(Volume {
            name: BACKUP_VOLUME.to_owned(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: crate::names::backup_pvc(&owner.name),
                ..Default::default()
            }),
            ..Default::default()
        });
        mounts.push(mount(BACKUP_VOLUME, &backup_path(fs), false));
    }
    if let Some(backup) = backup {
        volumes.push(crate::tls::pgbackrest_volume(&owner.name, backup));
        mounts.push(crate::tls::pgbackrest_mount());
    }
    if let Some(encryption) = backup.and_then(|b| b.encryption.as_ref()) {
        volumes.push(Volume {
            name: CIPHER_VOLUME.to_owned(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(encryption.secret_name.clone()),
                default_mode: Some(0o440),
                ..Default::default()
            }),
            ..Default::default()
        });
        mounts.push(mount(CIPHER_VOLUME, PGBACKREST_CIPHER_DIR, true));
    }
    (volumes, mounts)
}

/// pgBackRest always serves TLS when backups are on: from the user's Secret or the
/// certificates the operator issues for the shard.
fn has_pgbackrest_tls(spec: &ShardSpec) -> bool {
    spec.backup.is_some()
}

/// pgctld's command line (`server` plus flags).
pub fn pgctld_args(spec: &ShardSpec) -> Vec<String> {
    let mut args = vec![
        "server".to_owned(),
        flag("pooler-dir", POOLER_DIR),
        flag("grpc-port", PGCTLD_GRPC),
        // pgctld's API (Stop, Restart with extra postgres arguments, InitDataDir, PgRewind) has
        // no authentication, so it listens on loopback only: multipooler, in the same pod, is
        // its only client. Multigres: an empty --grpc-bind-address "listen[s] on all
        // addresses" (go/common/servenv/grpc_server.go:224), the listener is
        // net.Listen("tcp", JoinHostPort(bindAddress, port)) (grpc_server.go:467), and pgctld's
        // `server` registers these flags (go/cmd/pgctld/command/server.go:105).
        flag("grpc-bind-address", LOOPBACK),
        flag("http-port", PGCTLD_HTTP),
        flag("pg-port", POSTGRES_PORT),
        flag("pg-listen-addresses", "*"),
        flag("grpc-socket-file", format!("{POOLER_DIR}/pgctld.sock")),
        log_level_flag(spec.log_levels.as_ref().and_then(|l| l.pgctld)),
    ];
    if has_pgbackrest_tls(spec) {
        args.push(flag("pgbackrest-cert-dir", PGBACKREST_CERT_DIR));
        args.push(flag("pgbackrest-port", PGBACKREST_PORT));
    }
    args
}

/// multipooler's command line for the pods of `service` (the pool's headless Service) in
/// `cell`.
pub fn multipooler_args(
    spec: &ShardSpec,
    namespace: &str,
    service: &str,
    cell: &str,
) -> Vec<String> {
    let mut args = vec![
        flag("http-port", MULTIPOOLER_HTTP),
        flag("grpc-port", MULTIPOOLER_GRPC),
        flag("pooler-dir", POOLER_DIR),
        flag(
            "socket-file",
            format!("{POOLER_DIR}/pg_sockets/.s.PGSQL.{POSTGRES_PORT}"),
        ),
    ];
    args.extend(topo_flags(&spec.global_topo_server));
    args.extend([
        flag("cell", cell),
        flag("database", spec.database_name.as_str()),
        flag("table-group", spec.table_group_name.as_str()),
        flag("shard", spec.shard_name.as_str()),
        flag_expanding("service-id", "$(POD_NAME)"),
        flag_expanding("hostname", format!("$(POD_NAME).{service}.{namespace}.svc")),
        // The loopback address pgctld listens on, not `localhost`, which may resolve to ::1
        // first. Multigres dials it as given (go/services/multipooler/init.go:132-136,
        // internal/manager/manager.go:334-335).
        flag("pgctld-addr", format!("{LOOPBACK}:{PGCTLD_GRPC}")),
        flag("pg-port", POSTGRES_PORT),
        log_level_flag(spec.log_levels.as_ref().and_then(|l| l.multipooler)),
    ]);
    if has_pgbackrest_tls(spec) {
        args.extend([
            flag(
                "pgbackrest-cert-file",
                format!("{PGBACKREST_CERT_DIR}/pgbackrest.crt"),
            ),
            flag(
                "pgbackrest-key-file",
                format!("{PGBACKREST_CERT_DIR}/pgbackrest.key"),
            ),
            flag(
                "pgbackrest-ca-file",
                format!("{PGBACKREST_CERT_DIR}/ca.crt"),
            ),
        ]);
    }
    if spec.backup.as_ref().is_some_and(|b| b.encryption.is_some()) {
        args.push(flag(
            "pgbackrest-cipher-key-file",
            format!("{PGBACKREST_CIPHER_DIR}/keys.json"),
        ));
    }
    args
}

/// Identities of pgctld and multipooler: they share PGDATA, so multipooler runs as the
/// postgres user unless told otherwise.
pub(super) fn pool_identities(pool: &PoolSpec) -> (RunAs, RunAs) {
    let postgres = pool.postgres.as_ref();
    let pg = RunAs {
        user: postgres.and_then(|c| c.run_as_user).unwrap_or(POSTGRES_ID),
        group: postgres.and_then(|c| c.run_as_group).unwrap_or(POSTGRES_ID),
    };
    let pooler = pool.multipooler.as_ref();
    let mp = RunAs {
        user: pooler.and_then(|c| c.run_as_user).unwrap_or(pg.user),
        group: pooler.and_then(|c| c.run_as_group).unwrap_or(pg.group),
    };
    (pg, mp)
}

/// How the objects of one pool in one cell are named and labelled.
struct PoolNames {
    /// Name of the StatefulSet, its headless Service and its PodDisruptionBudget.
    name: String,
    /// Labels of every object of the pool in the cell.
    labels: BTreeMap<String, String>,
    /// The subset of `labels` selecting the pool's pods.
    selector: BTreeMap<String, String>,
}

impl PoolNames {
    /// The names and labels of pool `pool_name` in `cell`.
    fn of(owner: &Owner, spec: &ShardSpec, pool_name: &str, cell: &str) -> Self {
        let at = placement(spec, Some(cell), Some(pool_name));
        Self {
            name: crate::names::pool(&owner.name, pool_name, cell),
            labels: labels::labels(&owner.cluster, Component::Pool, &at),
            selector: labels::selector(&owner.cluster, Component::Pool, &at),
        }
    }

    /// Metadata of an object named [`Self::name`], owned by the Shard.
    fn metadata(&self, owner: &Owner) -> ObjectMeta {
        stateless::metadata(&self.name, owner, &self.labels)
    }

    /// A label selector matching the pool's pods.
    fn match_labels(&self) -> LabelSelector {
        LabelSelector {
            match_labels: Some(self.selector.clone()),
            ..Default::default()
        }
    }
}

/// The StatefulSet, headless Service and PodDisruptionBudget of pool `pool_name` in `cell`.
fn pool_objects(
    owner: &Owner,
    spec: &ShardSpec,
    pool_name: &str,
    pool: &PoolSpec,
    cell: &str,
) -> PoolObjects {
    let names = PoolNames::of(owner, spec, pool_name, cell);
    let pod = pool_pod(owner, spec, pool, &names.name, cell);
    let (storage_size, claim) = data_claim(pool, &names.labels);
    let statefulset = pool_statefulset(owner, spec, pool, &names, pod, claim);
    let service = pool_service(owner, &names);
    let pdb = pool_pdb(owner, &names);
    let delete_scaled_claims = pool_pvc_policy(spec, pool).and_then(|p| p.when_scaled)
        == Some(PvcRetentionPolicyType::Delete);
    PoolObjects {
        pool: pool_name.to_owned(),
        cell: cell.to_owned(),
        statefulset,
        service,
        pdb,
        selector: names.selector,
        storage_size,
        auto_grow: pool.auto_grow.clone(),
        delete_scaled_claims,
    }
}

/// The pod of a pool whose headless Service is `service`, in `cell`: pgctld (a native
/// sidecar) and multipooler sharing the pool volumes, and postgres_exporter (see
/// [`crate::exporter`]), on a node of its own among the shard's pool pods unless the pool
/// gives an affinity.
fn pool_pod(
    owner: &Owner,
    spec: &ShardSpec,
    pool: &PoolSpec,
    service: &str,
    cell: &str,
) -> PodSpec {
    let ns = &owner.namespace;
    let pull = pull(spec);
    let (pg_identity, pooler_identity) = pool_identities(pool);
    let (volumes, mounts) = pool_volumes(owner, spec);
    let pgctld = pgctld_container(spec, pool, &pull, pg_identity, mounts.clone());
    let args = multipooler_args(spec, ns, service, cell);
    let multipooler = multipooler_container(spec, pool, &pull, pooler_identity, mounts, args);
    let mut pod = PodSpec {
        init_containers: Some(vec![pgctld]),
        containers: vec![multipooler],
        volumes: Some(volumes),
        security_context: Some(pod_security(
            pg_identity,
            pool.fs_group.unwrap_or(pg_identity.group),
        )),
        service_account_name: s3_service_account(spec),
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        image_pull_secrets: pull.secrets(),
        affinity: Some(spread_across_zones_and_nodes(
            pool.affinity.clone(),
            &labels::selector(
                &owner.cluster,
                Component::Pool,
                &placement(spec, None, None),
            ),
        )),
        tolerations: (!pool.tolerations.is_empty()).then(|| pool.tolerations.clone()),
        node_selector: Some(cell_node_selector(spec, cell)).filter(|s| !s.is_empty()),
        termination_grace_period_seconds: Some(POOL_TERMINATION_GRACE_SECONDS),
        ..Default::default()
    };
    crate::tls::mount_process_tls(
        &mut pod,
        crate::tls::Process::Multipooler,
        owner,
        spec.internal_tls.as_ref(),
        &spec.global_topo_server,
    );
    let exporter_image = spec.images.postgres_exporter.as_ref().map_or(
        defaults::POSTGRES_EXPORTER_IMAGE,
        multigres_api::v1alpha1::ImageRef::as_str,
    );
    crate::exporter::add_to_pool_pod(
        &mut pod,
        &owner.cluster,
        spec.observability.as_ref(),
        exporter_image,
        pull.policy(),
        pg_identity,
    );
    pod
}

/// The service account of pool pods that reach S3 through their identity.
fn s3_service_account(spec: &ShardSpec) -> Option<String> {
    spec.backup
        .as_ref()
        .filter(|b| b.type_ == BackupType::S3)
        .and_then(|b| b.s3.as_ref())
        .and_then(|s3| s3.service_account_name.clone())
}

/// pgctld, running PostgreSQL as the pool pod's native sidecar.
fn pgctld_container(
    spec: &ShardSpec,
    pool: &PoolSpec,
    pull: &PullSettings,
    identity: RunAs,
    mounts: Vec<VolumeMount>,
) -> Container {
    let mut env_vars = postgres_env(spec);
    if let Some(initdb) = &spec.initdb_args {
        env_vars.push(env("POSTGRES_INITDB_ARGS", initdb.as_str()));
    }
    let probes = Probes::multigres(PGCTLD_HTTP, POOL_STARTUP_SECONDS);
    Container {
        name: "postgres".to_owned(),
        image: Some(spec.images.postgres.as_str().to_owned()),
        image_pull_policy: Some(pull.policy()),
        command: Some(vec![PGCTLD_BIN.to_owned()]),
        args: Some(pgctld_args(spec)),
        env: Some(env_vars),
        ports: Some(vec![
            container_port("pgctld-http", PGCTLD_HTTP),
            container_port("postgres", POSTGRES_PORT),
        ]),
        resources: pool.postgres.as_ref().and_then(|c| c.resources.clone()),
        startup_probe: Some(probes.startup),
        liveness_probe: Some(probes.liveness),
        readiness_probe: Some(probes.readiness),
        // PostgreSQL and pgBackRest write lock, log and spool files outside the volumes.
        security_context: Some(container_security(identity, false)),
        volume_mounts: Some(mounts),
        // A native sidecar: started (and probed) before multipooler, restarted on its own.
        restart_policy: Some("Always".to_owned()),
        ..Default::default()
    }
}

/// multipooler, run with `args` (see [`multipooler_args`]).
fn multipooler_container(
    spec: &ShardSpec,
    pool: &PoolSpec,
    pull: &PullSettings,
    identity: RunAs,
    mounts: Vec<VolumeMount>,
    args: Vec<String>,
) -> Container {
    let probes = Probes::multigres(MULTIPOOLER_HTTP, POOL_STARTUP_SECONDS);
    Container {
        name: "multipooler".to_owned(),
        image: Some(spec.images.multipooler.as_str().to_owned()),
        image_pull_policy: Some(pull.policy()),
        command: Some(vec![multigres_bin("multipooler")]),
        args: Some(args),
        env: Some(postgres_env(spec)),
        ports: Some(vec![
            container_port("http", MULTIPOOLER_HTTP),
            container_port("grpc", MULTIPOOLER_GRPC),
        ]),
        resources: pool.multipooler.as_ref().and_then(|c| c.resources.clone()),
        startup_probe: Some(probes.startup),
        liveness_probe: Some(probes.liveness),
        readiness_probe: Some(probes.readiness),
        // multipooler runs pgBackRest, which writes outside the volumes too.
        security_context: Some(container_security(identity, false)),
        volume_mounts: Some(mounts),
        ..Default::default()
    }
}

/// The data volume claim template of a pool's pods, and the size it requests.
fn data_claim(
    pool: &PoolSpec,
    labels: &BTreeMap<String, String>,
) -> (String, PersistentVolumeClaim) {
    let (size, claim_spec) = storage_request(
        &pool.storage.clone().unwrap_or_default(),
        defaults::POOL_STORAGE,
    );
    let claim = PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(DATA_VOLUME.to_owned()),
            labels: Some(labels.clone()),
            ..Default::default()
        },
        spec: Some(claim_spec),
        status: None,
    };
    (size, claim)
}

/// The volume policy of `pool`: its own, else the shard's.
fn pool_pvc_policy<'a>(spec: &'a ShardSpec, pool: &'a PoolSpec) -> Option<&'a PvcDeletionPolicy> {
    pool.pvc_deletion_policy
        .as_ref()
        .or(spec.pvc_deletion_policy.as_ref())
}

/// The pool's StatefulSet of `pod`s, each with a `claim` volume; pods are replaced only when
/// deleted (by the ordered restart).
fn pool_statefulset(
    owner: &Owner,
    spec: &ShardSpec,
    pool: &PoolSpec,
    names: &PoolNames,
    pod: PodSpec,
    claim: PersistentVolumeClaim,
) -> StatefulSet {
    let mut retention = retention(pool_pvc_policy(spec, pool));
    retention.when_scaled = Some("Retain".to_owned());
    StatefulSet {
        metadata: names.metadata(owner),
        spec: Some(StatefulSetSpec {
            replicas: Some(
                pool.replicas_per_cell
                    .unwrap_or_else(|| defaults::pool_replicas_per_cell(pool.cells.len())),
            ),
            selector: names.match_labels(),
            service_name: Some(names.name.clone()),
            pod_management_policy: Some("Parallel".to_owned()),
            update_strategy: Some(StatefulSetUpdateStrategy {
                type_: Some("OnDelete".to_owned()),
                ..Default::default()
            }),
            persistent_volume_claim_retention_policy: Some(retention),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(names.labels.clone()),
                    ..Default::default()
                }),
                spec: Some(pod),
            },
            volume_claim_templates: Some(vec![claim]),
            ..Default::default()
        }),
        status: None,
    }
}

/// The pool's headless Service, giving its pods stable DNS names (ready or not).
fn pool_service(owner: &Owner, names: &PoolNames) -> Service {
    Service {
        metadata: names.metadata(owner),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".to_owned()),
            publish_not_ready_addresses: Some(true),
            selector: Some(names.selector.clone()),
            ports: Some(vec![
                service_port("http", MULTIPOOLER_HTTP),
                service_port("grpc", MULTIPOOLER_GRPC),
                service_port("postgres", POSTGRES_PORT),
            ]),
            ..Default::default()
        }),
        status: None,
    }
}

/// At most one pod of the pool in the cell down at a time.
fn pool_pdb(owner: &Owner, names: &PoolNames) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: names.metadata(owner),
        spec: Some(PodDisruptionBudgetSpec {
            // How many replicas must stay depends on the pods (see `drain::replica_budget`).
            selector: Some(role_selector(names.selector.clone(), false)),
            ..Default::default()
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests;
