//! The Shard roles controller: reads the pooler records of the shard's cells and publishes each
//! pool pod's role on `Shard.status.podRoles` (`PRIMARY` / `REPLICA`) and as the pod label
//! `multigres.com/role` (`primary` / `replica`). The resource-handler orders restarts with it:
//! replicas first, the primary last.
//!
//! It also delivers reload-class PostgreSQL configuration changes (see [`crate::reload`]): each
//! pool pod whose PostgreSQL has not confirmed the rendered file's reload-class settings is
//! asked, through its multipooler, to reload; a confirmed reload is stamped on the pod.
//!
//! It also answers the resource-handler's switchover requests (see [`crate::switchover`]): a
//! requested primary's multipooler is asked to resign leadership.
//!
//! It also publishes the shard's backup health (see [`crate::backup_health`]):
//! `status.lastBackupTime`, `status.lastBackupType` and the condition `BackupHealthy`, from the
//! primary's multipooler, at most once a minute; and takes the backups the schedule and the
//! cluster's `multigres.com/backup-request` annotation ask for (see [`crate::backup_runs`]).
//!
//! It also publishes the shard's consensus cohort (see [`consensus`]): `status.cohort`, the
//! conditions `CohortHealthy` and `FailureTolerant`, and the pod label `multigres.com/cohort`,
//! read from each pool pod's multipooler; every [`consensus::POLL`] while the cohort is not
//! healthy, since restarts and scale-downs wait for it.
//!
//! It also publishes whether the primary's PostgreSQL accepts client connections (see
//! [`serving`]): the condition `PrimaryServing`, probed through the primary's multipooler on
//! every pass; every [`serving::POLL`] while it refuses them.
//!
//! Its status fields (`podRoles`, the cohort and the backup ones) are written together, by a
//! server-side apply with the data-handler's field manager: an apply drops the manager's fields
//! it leaves out.
//!
//! etcd changes make no Kubernetes event, so each Shard is read again every `roles_period`.
//! Nothing is written when the published roles, labels and stamps already match.
//!
//! The work is done in steps that return what they found: [`cohort`] (the pooler records),
//! [`consensus`] (the multipoolers' view of the consensus cohort), [`crate::roles`] and
//! [`marks`] (the roles and the pods' marks), [`crate::backup_health`], [`serving`],
//! [`reloads`] and [`crate::switchover`]; only this module writes (status, pods, events).

pub mod cohort;
pub mod consensus;
pub mod marks;
pub mod reloads;
pub mod serving;
pub mod volumes;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference, PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};
use multigres_api::labels::{self, Component, SWITCHOVER_RESIGNED};
use multigres_api::v1alpha1::{Cell, MultigresCluster, RoleStatus, Shard, TopoServer, VolumeUsage};
use multigres_api::{managed_roles, names};
use multigres_common::apply::ApplyError;
use multigres_common::controller::{self, Category, Classify, Ctx};
use multigres_common::events::Notice;
use multigres_common::status_metrics::StatusGauges;
use serde_json::json;

use crate::Settings;
use crate::backup_health::{self, Published};
use crate::backup_runs;
use crate::conditions;
use crate::dial::{Credentials, Dial};
use crate::postgres_roles;
use crate::reload::{self, DesiredError};
use crate::roles::{self, PoolPod, ShardKey};
use crate::switchover;
use crate::target::{ConnectError, Connections, Target, TargetError};
use crate::topo::{PoolerRecord, TopoError, TopoStore};
use crate::watch::{Guarded, full_name, valid, valid_in};
use crate::writes::{self, Writer};

/// Name of this controller in metrics and `HandlerInfo`.
pub const CONTROLLER: &str = "shard-roles";

/// Why a Shard's roles could not be published.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The stored object does not match the API types.
    #[error("Shard {name} cannot be read: {message}")]
    Malformed { name: String, message: String },
    /// The Shard names no MultigresCluster that exists (yet).
    #[error("MultigresCluster {cluster} of this Shard is not found")]
    ClusterNotFound { cluster: String },
    /// The topology server settings cannot be used.
    #[error(transparent)]
    Target(#[from] TargetError),
    /// The connection could not be prepared (TLS Secrets).
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// A cell's pooler records could not be read; the other cells' roles were published.
    #[error("cannot read the pooler records of cell {cell}")]
    Poolers {
        cell: String,
        #[source]
        source: TopoError,
    },
    /// A cell's own topology settings cannot be used; the other cells' roles were published,
    /// and the Shard is read again periodically, since only that cell needs a change.
    #[error("cell {cell}")]
    CellTarget {
        cell: String,
        #[source]
        source: TargetError,
    },
    /// A cell's own topology connection could not be prepared (its TLS Secrets).
    #[error("cell {cell}")]
    CellConnect {
        cell: String,
        #[source]
        source: ConnectError,
    },
    /// Writing `status.podRoles` failed.
    #[error("cannot write the status")]
    Status(#[source] ApplyError),
    /// The rendered postgresql.conf cannot be read back; reloads wait for it to be rewritten.
    #[error(transparent)]
    Config(#[from] DesiredError),
    /// Writing a pod's role label or reload stamp failed.
    #[error("cannot label pod {pod}")]
    Label {
        pod: String,
        #[source]
        source: kube::Error,
    },
}

impl Classify for Error {
    fn category(&self) -> Category {
        match self {
            Error::Malformed { .. } => Category::Malformed,
            Error::ClusterNotFound { .. } => Category::Waiting,
            Error::Target(_) | Error::CellTarget { .. } | Error::Config(_) => Category::InvalidSpec,
            Error::Connect(e) | Error::CellConnect { source: e, .. } => e.category(),
            Error::Poolers { .. } => Category::DataPlane,
            Error::Status(_) | Error::Label { .. } => Category::KubeApi,
        }
    }

    /// Whether only a change can fix this (no periodic retry). A cell's settings are not: the
    /// other cells' roles are published, and the Shard is read again periodically.
    fn is_invalid_spec(&self) -> bool {
        matches!(
            self,
            Error::Malformed { .. } | Error::Target(_) | Error::Config(_)
        )
    }

    /// The topology settings and connections are the conditions of the cluster
    /// (`TopoServerReachable`) and of each Cell.
    fn on_conditions(&self) -> bool {
        matches!(
            self,
            Error::Target(_)
                | Error::Connect(_)
                | Error::CellTarget { .. }
                | Error::CellConnect { .. }
        )
    }
}

impl From<cohort::CellError> for Error {
    fn from(error: cohort::CellError) -> Self {
        match error {
            cohort::CellError::Target { cell, source } => Error::CellTarget { cell, source },
            cohort::CellError::Connect { cell, source } => Error::CellConnect { cell, source },
            cohort::CellError::Poolers { cell, source } => Error::Poolers { cell, source },
        }
    }
}

/// What this controller reads and writes with, besides the kit.
pub struct Inputs {
    /// MultigresClusters, for each Shard's connection settings.
    pub clusters: Store<Guarded<MultigresCluster>>,
    /// Cells, for the settings of a cell's own topology server.
    pub cells: Store<Guarded<Cell>>,
    /// Pool pods managed by the operator.
    pub pods: Store<Guarded<Pod>>,
    /// The shards' rendered postgresql.conf ConfigMaps.
    pub config_maps: Store<Guarded<ConfigMap>>,
    /// Pool pods' data claims, for what storage gave each.
    pub claims: Store<Guarded<PersistentVolumeClaim>>,
    /// When each shard's volume usage was last measured.
    pub volume_pacer: volumes::Pacer,
    /// Managed TopoServers: a server still starting is not read yet.
    pub topo_servers: Store<Guarded<TopoServer>>,
    /// Open topology connections.
    pub connections: Arc<Connections>,
    /// The client certificates for multipoolers that require them (internal TLS).
    pub credentials: Credentials,
    /// Where its writes go.
    pub writer: Writer,
    /// Why each pod's reload is waiting, as last reported, so a waiting reload is announced
    /// once, not on every retry.
    pub reload_waits: reloads::Waits,
    /// Pending switchover requests' attempts (backoff, events announced).
    pub switchovers: switchover::Attempts,
    /// When each shard's backups were last checked.
    pub backup_checks: backup_health::Checks,
    /// The backups running now, scheduled or requested.
    pub backup_runs: backup_runs::Runs,
    /// When each shard's PostgreSQL roles were last checked.
    pub role_checks: backup_health::Checks,
    /// The roles' password Secrets, as last read.
    pub passwords: postgres_roles::Passwords,
    /// Periods and timeouts.
    pub settings: Settings,
}

/// This controller's context.
pub type Context = Ctx<Guarded<Shard>, Inputs>;

/// Reconciles one Shard.
pub async fn reconcile(obj: Arc<Guarded<Shard>>, ctx: Arc<Context>) -> Result<Action, Error> {
    controller::reconcile(&ctx, &obj, reconcile_shard(&obj, &ctx)).await
}

/// The Shard a pool pod belongs to, from its labels, for mapping pod changes.
pub fn shard_of(pod: &Pod) -> Option<ObjectRef<Guarded<Shard>>> {
    let l = pod.labels();
    let name = names::shard(
        l.get(labels::CLUSTER)?,
        l.get(labels::DATABASE)?,
        l.get(labels::TABLE_GROUP)?,
        l.get(labels::SHARD)?,
    );
    Some(ObjectRef::new(&name).within(&pod.namespace()?))
}

/// Whether `pod` is a pool pod of `shard` (of cluster `cluster`).
pub fn is_pool_pod_of(pod: &Pod, shard: &Shard, cluster: &str) -> bool {
    let l = pod.labels();
    l.get(labels::COMPONENT).map(String::as_str) == Some(Component::Pool.as_str())
        && labels::in_shard(l, cluster, &shard.spec)
}

/// Reads the shard's cohort ([`look`]), runs each step over it ([`steps`]), and writes what
/// they found: the status, the events ([`announce`]), the pods' marks and switchover records
/// ([`hand_over`]).
async fn reconcile_shard(obj: &Guarded<Shard>, ctx: &Context) -> Result<Action, Error> {
    let shard = obj.0.as_ref().map_err(|invalid| Error::Malformed {
        name: full_name(obj),
        message: invalid.error.clone(),
    })?;
    // A hibernating cluster has no pooler to ask: no backup, probe, reload or switchover runs,
    // and the status stays as the cluster went to sleep. Its pods' return wakes this up.
    if shard.meta().deletion_timestamp.is_some() || labels::hibernated(shard.annotations()) {
        return Ok(Action::await_change());
    }
    let namespace = shard.namespace().unwrap_or_default();
    let cluster = shard
        .labels()
        .get(labels::CLUSTER)
        .cloned()
        .unwrap_or_default();
    let Some(store) = open_topology(ctx, shard, &namespace, &cluster).await? else {
        // No pooler can have registered before the topology server serves.
        return Ok(Action::requeue(ctx.settings.roles_period));
    };
    let seen = look(ctx, shard, namespace, cluster, &store).await;
    let stored = Stored::of(shard);
    let found = steps(ctx, shard, &seen, &stored).await;
    write_status(ctx, shard, &statuses(&stored, &found)).await?;
    announce(ctx, shard, &seen, &stored, &found).await;
    hand_over(ctx, shard, seen, &found).await
}

/// What a pass reads before any step: the shard's pool pods, the pooler records of its cells
/// and what the poolers answer.
struct Seen {
    namespace: String,
    cluster: String,
    pods: Vec<Pod>,
    pool_pods: Vec<PoolPod>,
    dial: Dial,
    answers: Option<Vec<consensus::Answer>>,
    /// The records as the poolers answer now: a stale PRIMARY record is neither published as
    /// the primary nor asked for backups, reloads or switchovers.
    poolers: BTreeMap<String, Option<Vec<PoolerRecord>>>,
    /// The pods whose stale record this pass marked shut down.
    retired: Vec<String>,
    /// The first cell whose records could not be read.
    failure: Option<cohort::CellError>,
}

/// Reads the pool pods of `shard` (of `cluster` in `namespace`) from the cache, the pooler
/// records of its cells from `store`, and asks every pooler for its status.
async fn look(
    ctx: &Context,
    shard: &Shard,
    namespace: String,
    cluster: String,
    store: &TopoStore,
) -> Seen {
    let sources = cohort::Sources {
        cells: &ctx.cells,
        connections: &ctx.connections,
    };
    let pods: Vec<Pod> = valid_in(&ctx.pods, &namespace, |p| {
        is_pool_pod_of(p, shard, &cluster)
    });
    let created: BTreeMap<String, i64> = pods
        .iter()
        .filter_map(|p| {
            Some((
                p.name_any(),
                p.metadata.creation_timestamp.as_ref()?.0.as_second(),
            ))
        })
        .collect();
    let key = shard_key(shard);
    let cohort = cohort::read(
        &sources,
        store,
        (shard, key),
        (&namespace, &cluster),
        &created,
    )
    .await;
    let pool_pods: Vec<PoolPod> = pods.iter().map(pool_pod).collect();
    let dial = ctx.credentials.dial(shard, &namespace, &cluster).await;
    let answers = consensus::read(&dial, key, &pool_pods, &cohort.poolers).await;
    let poolers = match &answers {
        Some(answers) => roles::as_answered(key, &cohort.poolers, &consensus::not_primary(answers)),
        None => cohort.poolers,
    };
    Seen {
        namespace,
        cluster,
        pods,
        pool_pods,
        dial,
        answers,
        poolers,
        retired: cohort.retired,
        failure: cohort.failure,
    }
}

/// What this handler's status fields of a Shard hold now.
struct Stored {
    roles: BTreeMap<String, String>,
    cohort: consensus::Published,
    backups: Published,
    serving: Vec<Condition>,
    postgres_roles: Vec<RoleStatus>,
    volumes: Vec<VolumeUsage>,
}

impl Stored {
    fn of(shard: &Shard) -> Self {
        let status = shard.status.as_ref();
        Self {
            roles: status.map(|s| s.pod_roles.clone()).unwrap_or_default(),
            cohort: consensus::Published::of(status),
            backups: Published::of(status),
            serving: serving::stored(status),
            postgres_roles: status.map(|s| s.roles.clone()).unwrap_or_default(),
            volumes: status.map(|s| s.volumes.clone()).unwrap_or_default(),
        }
    }
}

/// What the steps found: the values to publish, and what each step did.
struct Found {
    /// Pod roles.
    roles: BTreeMap<String, String>,
    /// The cohort and its conditions.
    cohort: consensus::Published,
    /// The scheduled and requested backups started or ended.
    backups: backup_runs::Outcome,
    /// The backup values with the schedule step's news.
    scheduled_backups: Published,
    /// A backup check made now.
    checked: Option<backup_health::Outcome>,
    /// The PostgreSQL roles' check.
    postgres_roles: postgres_roles::Outcome,
    /// `PrimaryServing`.
    serving: Vec<Condition>,
    /// Volume usage.
    volumes: Vec<VolumeUsage>,
}

/// Runs each step over what the pass saw: roles, consensus, scheduled and requested backups,
/// backup health, PostgreSQL roles, the primary's probe and volume usage.
async fn steps(ctx: &Context, shard: &Shard, seen: &Seen, stored: &Stored) -> Found {
    let key = shard_key(shard);
    let roles = roles::roles(key, &seen.pool_pods, &seen.poolers, &stored.roles);
    let now = Timestamp::now();
    let generation = shard.metadata.generation;
    let cohort = match &seen.answers {
        Some(answers) => consensus::next(&stored.cohort, answers, now, generation),
        None => stored.cohort.clone(),
    };
    // Roles, cohort, scheduled and requested backups and backup health go out in one apply: a
    // new primary or a finished backup also triggers a backup check.
    let newest = stored.backups.time.as_ref().map(|t| t.0);
    let owner = ctx
        .clusters
        .get(&ObjectRef::new(&seen.cluster).within(&seen.namespace));
    let owner = owner.as_deref().and_then(|c| c.0.as_ref().ok());
    let superuser = owner.map(|cluster| managed_roles::superuser(&cluster.spec));
    let reach = backup_runs::Reach {
        dial: &seen.dial,
        key,
        pods: &seen.pool_pods,
        poolers: &seen.poolers,
    };
    let backups = backup_runs::run(&ctx.backup_runs, &reach, shard, owner, newest);
    if backups.finished {
        ctx.backup_checks.forget(&backup_health::slot(shard));
    }
    let scheduled_backups = Published {
        schedule: backups.schedule.clone(),
        requests: backups.requests.clone(),
        ..stored.backups.clone()
    };
    let checked = backup_health::run(
        &ctx.backup_checks,
        &reach,
        shard,
        &scheduled_backups,
        superuser,
    )
    .await;
    let lent = postgres_roles::StepInputs {
        checks: &ctx.role_checks,
        passwords: &ctx.passwords,
        dial: &seen.dial,
    };
    let postgres_roles =
        postgres_roles::run(&lent, shard, owner, key, &seen.pool_pods, &seen.poolers).await;
    let serving = match superuser {
        Some(superuser) => {
            let probe =
                serving::probe(&seen.dial, key, superuser, &seen.pool_pods, &seen.poolers).await;
            serving::next(&stored.serving, &probe, now, generation)
        }
        None => stored.serving.clone(),
    };
    let volumes = match superuser {
        Some(superuser) if ctx.volume_pacer.due(&full_name(shard), Instant::now()) => {
            let claims: Vec<PersistentVolumeClaim> = valid_in(&ctx.claims, &seen.namespace, |c| {
                c.labels().get(labels::CLUSTER) == Some(&seen.cluster)
            });
            let (pods, poolers) = (&seen.pool_pods, &seen.poolers);
            let measured =
                volumes::measure(&seen.dial, key, superuser, pods, poolers, &claims).await;
            volumes::next(
                &stored.volumes,
                &seen.pool_pods,
                &measured,
                Timestamp::now(),
            )
        }
        _ => stored.volumes.clone(),
    };
    Found {
        roles,
        cohort,
        backups,
        scheduled_backups,
        checked,
        postgres_roles,
        serving,
        volumes,
    }
}

/// The status fields as stored and as found.
fn statuses<'a>(stored: &'a Stored, found: &'a Found) -> Statuses<'a> {
    Statuses {
        roles: (&stored.roles, &found.roles),
        postgres_roles: (
            &stored.postgres_roles,
            found
                .postgres_roles
                .statuses
                .as_ref()
                .unwrap_or(&stored.postgres_roles),
        ),
        cohort: (&stored.cohort, &found.cohort),
        serving: (&stored.serving, &found.serving),
        volumes: (&stored.volumes, &found.volumes),
        backups: (
            &stored.backups,
            found
                .checked
                .as_ref()
                .map_or(&found.scheduled_backups, |c| &c.next),
            found.checked.is_some(),
        ),
    }
}

/// Publishes the events of what the pass found: the cohort's and the primary's probe's
/// transitions, stale records retired, pods quarantined, a new primary, backups and roles.
async fn announce(ctx: &Context, shard: &Shard, seen: &Seen, stored: &Stored, found: &Found) {
    let reference = shard.object_ref(&());
    let namespace = &seen.namespace;
    for notice in conditions::transitions(&stored.cohort.conditions, &found.cohort.conditions) {
        publish(ctx, &reference, &notice, "Cohort", None).await;
    }
    for notice in conditions::transitions(&stored.serving, &found.serving) {
        publish(ctx, &reference, &notice, "ProbePrimary", None).await;
    }
    for pod in &seen.retired {
        let notice = Notice::normal(
            "StalePoolerRecord",
            format!(
                "marked the pooler record of pod {pod} shut down: an earlier pod of that name \
                 wrote it (before this pod was created), and gateways must not dial it before \
                 the pod's own multipooler registers, which rewrites it"
            ),
        );
        let about = pod_reference(namespace, pod.clone());
        publish(ctx, &reference, &notice, "Roles", Some(about)).await;
    }
    let key = shard_key(shard);
    let (pods, poolers) = (&seen.pool_pods, &seen.poolers);
    for (pod, notice) in roles::quarantined(key, pods, poolers, &stored.roles, &found.roles) {
        let about = pod_reference(namespace, pod);
        publish(ctx, &reference, &notice, "Roles", Some(about)).await;
    }
    if let Some((pod, notice)) = roles::primary_change(&stored.roles, &found.roles) {
        // The pod as the related object: events about different pods form their own series,
        // so a repeated reason never shows an earlier pod's message.
        let about = pod_reference(namespace, pod);
        publish(ctx, &reference, &notice, "Roles", Some(about)).await;
    }
    for notice in &found.backups.notices {
        publish(ctx, &reference, notice, "Backup", None).await;
    }
    if let Some(notice) = found.checked.as_ref().and_then(|c| c.notice.as_ref()) {
        publish(ctx, &reference, notice, "BackupHealth", None).await;
    }
    for notice in &found.postgres_roles.notices {
        publish(ctx, &reference, notice, "PostgresRoles", None).await;
    }
}

/// Delivers reloads, marks the pods (role, cohort, reload stamps), answers switchover
/// requests, and says when to look again.
async fn hand_over(
    ctx: &Context,
    shard: &Shard,
    seen: Seen,
    found: &Found,
) -> Result<Action, Error> {
    let key = shard_key(shard);
    let reference = shard.object_ref(&());
    let (namespace, pods, poolers) = (&seen.namespace, &seen.pods, &seen.poolers);
    let lent = reloads::StepInputs {
        config_maps: &ctx.config_maps,
        pods: &ctx.pods,
        waits: &ctx.reload_waits,
        dial: &seen.dial,
    };
    let delivery = reloads::deliver(&lent, shard, key, pods, poolers).await;
    let stamped = write_marks(ctx, pods, &found.roles, &found.cohort, &delivery.stamps).await?;
    let lent = switchover::StepInputs {
        switchovers: &ctx.switchovers,
        pods: &ctx.pods,
        dial: &seen.dial,
    };
    let handover = switchover::run(&lent, shard, key, pods, poolers).await;
    let unrecorded = write_answers(ctx, namespace, &reference, handover.answers).await;
    publish_reloads(ctx, namespace, &reference, stamped, delivery.notices).await;
    let pending = Pending {
        reload: delivery.retry,
        switchover: handover.pending,
        cohort: !found.cohort.healthy(),
        serving: serving::refusing(&found.serving),
        backup: found.backups.running,
        postgres_roles: found.postgres_roles.again_soon,
    };
    let period = period(&ctx.settings, shard, pending);
    match (seen.failure.map(Error::from))
        .or(delivery.error.map(Error::from))
        .or(unrecorded)
    {
        Some(error) => Err(error),
        None => Ok(Action::requeue(period)),
    }
}

/// The topology of `shard` (of cluster `cluster` in `namespace`), opened; `None` while its
/// managed topology server does not serve yet.
async fn open_topology(
    ctx: &Context,
    shard: &Shard,
    namespace: &str,
    cluster: &str,
) -> Result<Option<Arc<TopoStore>>, Error> {
    let resource =
        valid(&ctx.clusters, namespace, cluster).ok_or_else(|| Error::ClusterNotFound {
            cluster: format!("{namespace}/{cluster}"),
        })?;
    let target = Target::new(&resource, &shard.spec.global_topo_server)?;
    let topo_server = valid(
        &ctx.topo_servers,
        namespace,
        &names::global_topo_server(cluster),
    );
    if crate::target::waiting_for(&target, topo_server.as_ref()).is_some() {
        return Ok(None);
    }
    Ok(Some(ctx.connections.open(namespace, &target).await?))
}

/// The shard `shard` stands for in the topology.
fn shard_key(shard: &Shard) -> ShardKey<'_> {
    ShardKey {
        database: shard.spec.database_name.as_str(),
        table_group: shard.spec.table_group_name.as_str(),
        shard: shard.spec.shard_name.as_str(),
    }
}

/// `pod` as a member of the pool: its name and cell.
fn pool_pod(pod: &Pod) -> PoolPod {
    PoolPod {
        name: pod.name_any(),
        cell: pod.labels().get(labels::CELL).cloned(),
    }
}

/// What this handler publishes in a Shard's status, as stored and as found now.
struct Statuses<'a> {
    /// Pod roles: stored, published now.
    roles: (&'a BTreeMap<String, String>, &'a BTreeMap<String, String>),
    /// The cohort and its conditions: stored, published now.
    cohort: (&'a consensus::Published, &'a consensus::Published),
    /// `PrimaryServing`: stored, published now.
    serving: (&'a [Condition], &'a [Condition]),
    /// Backups: stored, published now, and whether a backup check was made now.
    backups: (&'a Published, &'a Published, bool),
    /// PostgreSQL roles: stored, published now.
    postgres_roles: (&'a [RoleStatus], &'a [RoleStatus]),
    /// Volume usage: stored, published now.
    volumes: (&'a [VolumeUsage], &'a [VolumeUsage]),
}

/// Applies the status fields of this handler when the roles, the cohort or the backup health
/// changed them. A failed apply forgets the backup check.
async fn write_status(ctx: &Context, shard: &Shard, statuses: &Statuses<'_>) -> Result<(), Error> {
    let (backups, next_backups, checked) = statuses.backups;
    let (previous, published) = statuses.roles;
    let (stored_cohort, cohort) = statuses.cohort;
    let (stored_roles, postgres_roles) = statuses.postgres_roles;
    let (stored_serving, serving) = statuses.serving;
    let (stored_volumes, volumes) = statuses.volumes;
    if published == previous
        && next_backups == backups
        && cohort == stored_cohort
        && serving == stored_serving
        && postgres_roles == stored_roles
        && volumes == stored_volumes
    {
        return Ok(());
    }
    let body = status_body(
        published,
        cohort,
        serving,
        next_backups,
        (postgres_roles, volumes),
    );
    ctx.writer
        .apply_status(shard, &body)
        .await
        .map_err(|source| {
            if checked {
                // Checked again at the next reconcile rather than in a minute.
                ctx.backup_checks.forget(&backup_health::slot(shard));
            }
            Error::Status(source)
        })?;
    Ok(())
}

/// Writes the role label and reload stamp of every pool pod whose marks change; returns the
/// pods stamped now.
async fn write_marks(
    ctx: &Context,
    pods: &[Pod],
    published: &BTreeMap<String, String>,
    cohort: &consensus::Published,
    stamps: &BTreeMap<String, String>,
) -> Result<Vec<String>, Error> {
    let marks = marks::marks(pods, published, |pod| cohort.label(pod), stamps);
    for mark in &marks {
        writes::apply_pod_marks(&ctx.writer, mark.pod, &mark.labels(), mark.stamp)
            .await
            .map_err(|source| Error::Label {
                pod: mark.pod.name_any(),
                source,
            })?;
    }
    Ok(marks
        .into_iter()
        .filter(|m| m.stamped)
        .map(|m| m.pod.name_any())
        .collect())
}

/// Writes what the switchover step answered, pod by pod: its record of the request its
/// multipooler resigned for, and its event. Returns the first record that could not be
/// written.
async fn write_answers(
    ctx: &Context,
    namespace: &str,
    reference: &ObjectReference,
    answers: Vec<switchover::Answer<'_>>,
) -> Option<Error> {
    let mut failure = None;
    for answer in answers {
        let pod = answer.pod;
        if let Some(value) = &answer.record {
            let written =
                writes::annotate_pod(&ctx.writer, pod, SWITCHOVER_RESIGNED, value.as_deref()).await;
            if let Err(source) = written {
                failure.get_or_insert(Error::Label {
                    pod: pod.name_any(),
                    source,
                });
            }
        }
        if let Some(notice) = answer.notice {
            let about = ObjectReference {
                uid: pod.uid(),
                ..pod_reference(namespace, pod.name_any())
            };
            publish(ctx, reference, &notice, "Switchover", Some(about)).await;
        }
    }
    failure
}

/// Publishes the reload events: each pod `stamped` now (its wait forgotten), then the waiting
/// ones.
async fn publish_reloads(
    ctx: &Context,
    namespace: &str,
    reference: &ObjectReference,
    stamped: Vec<String>,
    waiting: Vec<(String, Notice)>,
) {
    for pod in &stamped {
        ctx.reload_waits.forget(namespace, pod);
    }
    let reloaded = stamped.into_iter().map(|pod| {
        let notice = Notice::normal(
            "ConfigReloaded",
            format!("pod {pod}: PostgreSQL reloaded postgresql.conf without a restart"),
        );
        (pod, notice)
    });
    for (pod, notice) in reloaded.chain(waiting) {
        // The pod as the related object: each pod's events form their own series.
        let about = pod_reference(namespace, pod);
        publish(ctx, reference, &notice, "Reload", Some(about)).await;
    }
}

/// Publishes `notice` on the Shard (`reference`) as the outcome of `action`, with the pod
/// `about` as the related object when given.
async fn publish(
    ctx: &Context,
    reference: &ObjectReference,
    notice: &Notice,
    action: &str,
    about: Option<ObjectReference>,
) {
    let mut event = notice.event(action);
    event.secondary = about;
    ctx.kit.publish_event(&event, reference).await;
}

/// What is still under way after a pass.
struct Pending {
    /// A reload waits to be retried.
    reload: bool,
    /// A switchover request waits for its answer.
    switchover: bool,
    /// The cohort is not healthy: restarts and scale-downs wait for it.
    cohort: bool,
    /// The primary refuses connections: its recovery is published soon.
    serving: bool,
    /// A backup runs: its end is published when seen.
    backup: bool,
    /// PostgreSQL roles changed (to be confirmed) or could not be checked.
    postgres_roles: bool,
}

/// When to read the Shard again: after `roles_period`, sooner while something is `pending`, or
/// backups are checked.
fn period(settings: &Settings, shard: &Shard, pending: Pending) -> Duration {
    let mut period = if pending.reload {
        settings.roles_period.min(reload::RETRY)
    } else {
        settings.roles_period
    };
    if pending.switchover {
        period = period.min(switchover::POLL);
    }
    if pending.cohort {
        period = period.min(consensus::POLL);
    }
    if pending.serving {
        period = period.min(serving::POLL);
    }
    if pending.backup {
        period = period.min(backup_runs::POLL);
    }
    if pending.postgres_roles {
        period = period.min(postgres_roles::RETRY);
    }
    if shard.spec.backup.is_some() {
        period = period.min(backup_health::PACE);
    }
    period
}

/// Sets the conditions gauge of every Shard in `shards`: each condition on its status, whichever
/// handler wrote it (the alert on `PrimaryServing` reads it).
pub fn collect(gauges: &mut StatusGauges, shards: &Store<Guarded<Shard>>) {
    for shard in shards.state() {
        let Ok(shard) = &shard.0 else { continue };
        let Some(status) = &shard.status else {
            continue;
        };
        let namespace = shard.namespace().unwrap_or_default();
        let name = shard.name_any();
        for c in &status.conditions {
            gauges.set_shard_condition(&namespace, &name, &c.type_, &c.status, &c.reason);
        }
        volumes::collect(gauges, &namespace, &name, &status.volumes);
    }
}

/// A reference to pod `name`, the related object of an event about it.
fn pod_reference(namespace: &str, name: String) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".to_owned()),
        kind: Some("Pod".to_owned()),
        name: Some(name),
        namespace: Some(namespace.to_owned()),
        ..Default::default()
    }
}

/// The status fields this handler owns on a Shard, for one server-side apply: `podRoles`, the
/// cohort and the backup health ones, with the conditions of all three and `PrimaryServing`.
fn status_body(
    pod_roles: &BTreeMap<String, String>,
    cohort: &consensus::Published,
    serving: &[Condition],
    backups: &Published,
    (postgres_roles, volumes): (&[RoleStatus], &[VolumeUsage]),
) -> serde_json::Value {
    let mut body = backups.fields();
    if !postgres_roles.is_empty() {
        body.insert("roles".to_owned(), json!(postgres_roles));
    }
    if !volumes.is_empty() {
        body.insert("volumes".to_owned(), json!(volumes));
    }
    let mut conditions: Vec<serde_json::Value> = match body.remove("conditions") {
        Some(serde_json::Value::Array(list)) => list,
        _ => Vec::new(),
    };
    conditions.extend(cohort.conditions.iter().map(|c| json!(c)));
    conditions.extend(serving.iter().map(|c| json!(c)));
    body.extend(cohort.fields());
    if !conditions.is_empty() {
        body.insert("conditions".to_owned(), json!(conditions));
    }
    body.insert("podRoles".to_owned(), json!(pod_roles));
    serde_json::Value::Object(body)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use multigres_api::v1alpha1::{DatabaseName, ShardName, ShardSpec, TableGroupName};

    use super::*;

    fn pod(labels: &[(&str, &str)]) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some("prod-postgres-default-0-inf-pool-default-zone-a-0".into());
        p.metadata.namespace = Some("team-a".into());
        p.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect::<BTreeMap<_, _>>(),
        );
        p
    }

    fn pool_labels() -> Vec<(&'static str, &'static str)> {
        vec![
            (labels::CLUSTER, "prod"),
            (labels::COMPONENT, "shard-pool"),
            (labels::DATABASE, "postgres"),
            (labels::TABLE_GROUP, "default"),
            (labels::SHARD, "0-inf"),
            (labels::CELL, "zone-a"),
        ]
    }

    #[test]
    fn pool_pods_map_to_their_shard() {
        let r = shard_of(&pod(&pool_labels())).unwrap();
        assert_eq!(r.name, "prod-postgres-default-0-inf");
        assert_eq!(r.namespace.as_deref(), Some("team-a"));
        assert!(shard_of(&pod(&[(labels::CLUSTER, "prod")])).is_none());
    }

    #[test]
    fn the_status_body_carries_every_field_of_this_handler() {
        let roles = BTreeMap::from([("p-0".to_owned(), roles::PRIMARY.to_owned())]);
        let none = consensus::Published::default();
        let body = status_body(&roles, &none, &[], &Published::default(), (&[], &[]));
        assert_eq!(body, json!({ "podRoles": { "p-0": "PRIMARY" } }));
        let backups = Published {
            kind: Some(multigres_api::v1alpha1::BackupKind::Full),
            condition: Some(condition(backup_health::BACKUP_HEALTHY)),
            ..Default::default()
        };
        let cohort = consensus::Published {
            cohort: Some(multigres_api::v1alpha1::CohortStatus {
                summary: "2/2 AT_LEAST_2".into(),
                ..Default::default()
            }),
            conditions: vec![condition(consensus::COHORT_HEALTHY)],
        };
        let serving = [condition(serving::PRIMARY_SERVING)];
        let body = status_body(&BTreeMap::new(), &cohort, &serving, &backups, (&[], &[]));
        assert_eq!(
            (
                &body["podRoles"],
                &body["lastBackupType"],
                &body["cohort"]["summary"]
            ),
            (&json!({}), &json!("full"), &json!("2/2 AT_LEAST_2")),
            "the roles go along with a backup or cohort change, or the apply would drop them"
        );
        let types: Vec<&str> = body["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["type"].as_str().unwrap())
            .collect();
        assert_eq!(
            types,
            [
                backup_health::BACKUP_HEALTHY,
                consensus::COHORT_HEALTHY,
                serving::PRIMARY_SERVING
            ]
        );
    }

    fn condition(type_: &str) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
            type_: type_.into(),
            status: "True".into(),
            reason: "R".into(),
            message: "m".into(),
            observed_generation: None,
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                Timestamp::from_second(0).unwrap(),
            ),
        }
    }

    #[test]
    fn only_the_shards_pool_pods_are_considered() {
        let shard = Shard::new(
            "prod-postgres-default-0-inf",
            ShardSpec {
                database_name: DatabaseName::new("postgres"),
                table_group_name: TableGroupName::new("default"),
                shard_name: ShardName::new("0-inf"),
                ..Default::default()
            },
        );
        assert!(is_pool_pod_of(&pod(&pool_labels()), &shard, "prod"));
        assert!(!is_pool_pod_of(&pod(&pool_labels()), &shard, "other"));
        let mut orch = pool_labels();
        orch[1] = (labels::COMPONENT, "multiorch");
        assert!(!is_pool_pod_of(&pod(&orch), &shard, "prod"));
        let mut other_tg = pool_labels();
        other_tg[3] = (labels::TABLE_GROUP, "orders");
        assert!(!is_pool_pod_of(&pod(&other_tg), &shard, "prod"));
    }
}
