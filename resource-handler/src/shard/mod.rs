//! Shard controller: runs a shard's multiorch and PostgreSQL pools, restarts pool pods in a
//! safe order when their template changes, has the primary hand over before it restarts or is
//! scaled away, grows their volumes, and reports readiness and rollout progress (the
//! data-handler publishes pod roles and backup health next to them). A shard is `Available`
//! once it serves SQL: its pods are Ready and the roles name a primary among them.
//!
//! A reconcile reads what the Shard refers to, builds what it asks for ([`build`],
//! [`pgconfig`]) without a client, applies it (`apply`) and writes its status ([`status`]).

mod apply;
pub mod build;
pub mod drain;
pub mod pgconfig;
pub mod prestart;
pub mod quarantine;
pub mod recovery;
pub mod repository;
pub mod rollout;
pub mod scale;
pub mod status;
pub mod switchover;
pub mod template_changes;

use std::collections::BTreeSet;
use std::sync::Arc;

use futures::Future;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt;
use kube::runtime::Controller;
use kube::runtime::controller::{Action, Config};
use kube::runtime::reflector::{ObjectRef, Store};
use multigres_api::observability::{InheritedEnv, PROJECT_REF_ANNOTATION};
use multigres_api::owner::{Owner, OwnerError};
use multigres_api::postgres::Rendered;
use multigres_api::postgres::standby::StandbySettings;
use multigres_api::v1alpha1::Shard;
use multigres_common::controller as kit;
use multigres_common::guard::{Guarded, InvalidObject};
use multigres_common::shared_watch::{Changes, SharedWatch};
use multigres_common::shutdown::Shutdown;

use crate::controller::{Category, Classify, Ctx};
use crate::sync::SyncError;
use build::ShardObjects;
use rollout::PodView;

/// Controller name in metrics and HandlerInfo.
pub const NAME: &str = "shard";

/// Condition type reporting the ordered restart of pool pods.
pub const ROLLING_UPDATE: &str = "RollingUpdate";

type Guard = Guarded<Shard>;

/// Why a Shard could not be reconciled.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The stored object does not match the schema this binary knows.
    #[error("the Shard cannot be read: {0}")]
    Malformed(#[source] Box<InvalidObject>),
    /// The Shard does not say which cluster it belongs to.
    #[error(transparent)]
    Owner(#[from] OwnerError),
    /// The spec cannot be realised as it is.
    #[error(transparent)]
    InvalidSpec(#[from] build::BuildError),
    /// A write to the API server failed.
    #[error(transparent)]
    Sync(#[from] SyncError),
    /// Growing a volume failed.
    #[error("growing the pool volumes")]
    Resize(#[source] kube::Error),
    /// The pgBackRest TLS Secrets could not be issued, stored or read.
    #[error("pgBackRest TLS")]
    Tls(#[from] crate::tls::PgBackRestError),
    /// The postgresql.conf cannot be rendered, or its referenced ConfigMap read.
    #[error(transparent)]
    PostgresConfig(#[from] pgconfig::ConfigError),
    /// Reading or creating the recovery Job failed.
    #[error("the recovery Job")]
    Recovery(#[source] kube::Error),
    /// Reading or creating the Job marking the backup repository failed.
    #[error("the Job marking the backup repository")]
    Repository(#[source] kube::Error),
    /// Deleting a pod for its restart failed.
    #[error("restarting pod {pod}")]
    Restart {
        pod: String,
        #[source]
        source: kube::Error,
    },
}

impl Classify for Error {
    fn category(&self) -> Category {
        match self {
            Error::Malformed(_) | Error::Owner(_) => Category::Malformed,
            Error::InvalidSpec(_) => Category::InvalidSpec,
            Error::PostgresConfig(e) if e.is_invalid_spec() => Category::InvalidSpec,
            Error::Sync(_)
            | Error::Resize(_)
            | Error::Tls(_)
            | Error::PostgresConfig(_)
            | Error::Recovery(_)
            | Error::Repository(_)
            | Error::Restart { .. } => Category::KubeApi,
        }
    }
}

/// The change streams the Shard controller is triggered by.
pub struct Triggers {
    /// Owned pool StatefulSets (readiness, revisions).
    pub statefulsets: Changes<StatefulSet>,
    /// Owned multiorch Deployments.
    pub deployments: Changes<Deployment>,
    /// Owned Services.
    pub services: Changes<Service>,
    /// Owned PodDisruptionBudgets.
    pub pdbs: Changes<PodDisruptionBudget>,
    /// Pool pods (readiness and role labels drive restarts).
    pub pods: Changes<Pod>,
    /// Owned postgresql.conf ConfigMaps (a deleted or edited one is written again).
    pub config_maps: Changes<ConfigMap>,
    /// Owned TLS Secrets (a deleted one is issued again).
    pub secrets: Changes<Secret>,
    /// Pool volumes (a held scale-up continues once a scaled-away replica's claim is gone).
    pub pvcs: Changes<PersistentVolumeClaim>,
    /// Owned Jobs (marking the backup repository, recovery): their end lets the pods start.
    pub jobs: Changes<Job>,
    /// A change of the cordoned nodes (a drain may have begun).
    pub cordons: futures::channel::mpsc::UnboundedReceiver<()>,
}

/// Whether `object` (a pool pod or volume, by its labels) belongs to `shard`.
fn labelled_for<K: ResourceExt>(object: &K, shard: &Shard) -> bool {
    object.namespace() == shard.namespace()
        && Owner::of(shard).is_ok_and(|o| {
            multigres_api::labels::in_shard(object.labels(), &o.cluster, &shard.spec)
        })
}

/// The shards `object` belongs to (by its labels).
fn shards_of<K: ResourceExt>(shards: &Store<Guard>, object: &K) -> Vec<ObjectRef<Guard>> {
    shards
        .state()
        .into_iter()
        .filter(|s| s.0.as_ref().is_ok_and(|shard| labelled_for(object, shard)))
        .map(|s| ObjectRef::from_obj(&*s))
        .collect()
}

/// The controller, ready to be polled until shutdown.
///
/// Every change of a Shard wakes it, status-only changes included: the Shard stream is not
/// filtered by generation (no `predicate_filter`). That matters for `status.podRoles`, which
/// the data-handler writes when multiorch elects or changes the primary: the shard turns
/// Available (or stops being Available) on that write alone, with no spec change and no pod
/// event. The data-handler's role labels on the pool pods wake it too, through the pod watch.
/// Its own status writes also come back as changes; they find nothing to do and write nothing.
pub fn run(
    ctx: Arc<Ctx<Guard>>,
    shards: SharedWatch<Guard>,
    triggers: Triggers,
    shutdown: &Shutdown,
) -> impl Future<Output = ()> + Send + 'static {
    let controller = Controller::for_shared_stream(shards.changes(), shards.store());
    // A referenced postgresql.conf ConfigMap belongs to the user: map it by name.
    let referenced = pgconfig::reference_changes(&ctx.client, &shards);
    let shards = shards.store();
    let referencing = {
        let shards = shards.clone();
        move |config_map| pgconfig::referencing(&shards, &config_map)
    };
    // Pool pods and volumes belong to StatefulSets, not to the Shard: map them by their
    // labels, so readiness and role changes reach the ordered restart at once, and a
    // scale-up held for a leaving volume continues as soon as it is gone.
    let pods_of = {
        let shards = shards.clone();
        move |pod: Arc<Pod>| shards_of(&shards, &*pod)
    };
    // Only claims on their way out matter (and are few): binding and resizing do not wake a
    // shard.
    let volumes_of = move |pvc: Arc<PersistentVolumeClaim>| {
        if scale::leaving(&pvc) {
            shards_of(&shards, &*pvc)
        } else {
            Vec::new()
        }
    };
    let controller = controller
        .owns_shared_stream(triggers.statefulsets)
        .owns_shared_stream(triggers.deployments)
        .owns_shared_stream(triggers.services)
        .owns_shared_stream(triggers.pdbs)
        .owns_shared_stream(triggers.secrets)
        .owns_shared_stream(triggers.config_maps)
        .owns_shared_stream(triggers.jobs)
        .watches_stream(referenced, referencing)
        .watches_shared_stream(triggers.pods, pods_of)
        .watches_shared_stream(triggers.pvcs, volumes_of)
        .reconcile_all_on(triggers.cordons);
    kit::run(
        controller,
        Config::default().concurrency(4),
        shutdown,
        reconcile,
        ctx,
    )
}

async fn reconcile(obj: Arc<Guard>, ctx: Arc<Ctx<Guard>>) -> Result<Action, Error> {
    kit::reconcile(&ctx, &obj, reconcile_inner(&obj, &ctx)).await
}

/// Reads what the Shard refers to, builds what it asks for, applies it and reports.
async fn reconcile_inner(guard: &Guard, ctx: &Ctx<Guard>) -> Result<Action, Error> {
    let shard = guard
        .0
        .as_ref()
        .map_err(|e| Error::Malformed(Box::new(e.clone())))?;
    if shard.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let owner = Owner::of(shard)?;
    let ns = owner.namespace.as_str();
    let read = Dereferenced::read(ctx, &owner, shard).await;
    let mut desired = match desire(
        &owner,
        shard,
        &ctx.telemetry,
        read.postgres_config,
        &read.floor,
    ) {
        Ok(desired) => desired,
        Err(rejected) => {
            status::reject(ctx, shard, ns, &rejected).await?;
            return Err(rejected.into());
        }
    };
    quarantine::add_to_shard(&mut desired.objects, ctx.unrecoverable_timeout);
    let annotations = ctx.stores.holds(&owner, shard);
    let paused = multigres_api::labels::paused(&annotations);
    // Steps run once before the pool pods start: the backup repository is marked as this
    // cluster's ([`repository`]), then another cluster's data is recovered into it.
    let mut once = Vec::new();
    if let Some(s3) = repository::pending(shard).filter(|_| !paused) {
        let verdict = repository::mark(ctx, guard, shard, &owner, s3).await?;
        // A shard whose pods run already keeps them (see `repository`).
        if !verdict.is_true() && !has_pool_statefulsets(ctx, &desired.objects) {
            let failed = repository::failed(&verdict);
            return status::waiting(ctx, shard, ns, verdict, failed).await;
        }
        once.push(verdict);
    }
    if let Some(recovery) = recovery::pending(shard).filter(|_| !paused) {
        // The Job runs PostgreSQL with the shard's own postgresql.conf.
        pgconfig::apply(ctx, guard, &desired.postgres_config).await?;
        let verdict = recovery::run(ctx, guard, shard, &owner, recovery).await?;
        if !verdict.is_true() {
            let failed = verdict.reason == recovery::FAILED;
            return status::waiting(ctx, shard, ns, verdict, failed).await;
        }
        once.push(verdict);
    }
    let outcome = if paused {
        apply::paused(ctx, shard, &annotations, ns, &desired.objects, &read.pods)
    } else if multigres_api::labels::hibernated(&annotations) {
        apply::hibernate(ctx, guard, shard, &owner, &desired, &read.pods).await?
    } else {
        apply::run(
            ctx,
            guard,
            (shard, &annotations),
            &owner,
            &desired,
            (&read.pods, &read.cordoned),
        )
        .await?
    };
    status::write(ctx, shard, ns, &desired, &read.pods, (outcome, once)).await
}

/// Whether any of the shard's pool StatefulSets exists (from the cache).
fn has_pool_statefulsets(ctx: &Ctx<Guard>, objects: &ShardObjects) -> bool {
    objects.pools.iter().any(|pool| {
        ctx.stores
            .statefulsets
            .get(&ObjectRef::from_obj(&pool.statefulset))
            .is_some()
    })
}

/// What a Shard refers to, read before anything is built.
struct Dereferenced {
    /// The content of the `postgresConfigRef` ConfigMap (none without a reference), or why
    /// there is none; judged only once the spec itself builds.
    postgres_config: Result<Option<String>, pgconfig::ConfigError>,
    /// The cordoned nodes, read once for the whole reconcile.
    cordoned: BTreeSet<String>,
    /// The shard's pool pods, from the cache.
    pods: Vec<PodView>,
    /// The hot-standby-sensitive values the rendered file may not go below.
    floor: StandbySettings,
}

impl Dereferenced {
    /// Reads the referenced ConfigMap (from the API server), the pool pods and the rendered
    /// ConfigMap as stored (from the caches).
    async fn read(ctx: &Ctx<Guard>, owner: &Owner, shard: &Shard) -> Self {
        let ns = owner.namespace.as_str();
        let cordoned = ctx.stores.cordoned.snapshot();
        let pods = pod_views(ctx, shard, ns, &cordoned);
        let rendered = ObjectRef::new(&crate::names::postgres_config(&owner.name)).within(ns);
        let floor = pgconfig::floor(ctx.stores.config_maps.get(&rendered).as_deref(), &pods);
        Self {
            postgres_config: pgconfig::referenced(&ctx.client, ns, shard).await,
            cordoned,
            pods,
            floor,
        }
    }
}

/// Everything a Shard asks for.
struct Desired {
    /// Its workloads and volumes, with their telemetry environment and postgresql.conf mount.
    objects: ShardObjects,
    /// The postgresql.conf ConfigMap, and what was rendered into it.
    postgres_config: (ConfigMap, Rendered),
}

/// Why a Shard's objects cannot be built.
#[derive(Debug)]
enum Rejected {
    /// The spec cannot be realised as it is.
    Spec(build::BuildError),
    /// The postgresql.conf cannot be produced (or its referenced ConfigMap read).
    PostgresConfig(pgconfig::ConfigError),
}

impl From<Rejected> for Error {
    fn from(rejected: Rejected) -> Self {
        match rejected {
            Rejected::Spec(problem) => Error::InvalidSpec(problem),
            Rejected::PostgresConfig(error) => Error::PostgresConfig(error),
        }
    }
}

/// Builds what `shard` asks for from its spec and `reference` (the referenced
/// postgresql.conf content as read): the spec's own problems first, then the config's.
fn desire(
    owner: &Owner,
    shard: &Shard,
    inherited: &InheritedEnv,
    reference: Result<Option<String>, pgconfig::ConfigError>,
    floor: &StandbySettings,
) -> Result<Desired, Rejected> {
    let backups = build::BackupDeletion::of(shard, owner);
    let mut objects = build::build(owner, &shard.spec, backups).map_err(Rejected::Spec)?;
    crate::env::add_to_shard(
        &mut objects,
        crate::env::Source {
            config: shard.spec.observability.as_ref(),
            inherited,
            cluster: &owner.cluster,
            project: shard
                .annotations()
                .get(PROJECT_REF_ANNOTATION)
                .map(String::as_str),
        },
    );
    let postgres_config = reference
        .and_then(|content| {
            pgconfig::desired(owner, shard, content.as_deref(), floor, &mut objects)
        })
        .map_err(Rejected::PostgresConfig)?;
    Ok(Desired {
        objects,
        postgres_config,
    })
}

/// The shard's pool pods, with their roles from the Shard status (else their labels), on
/// `cordoned` nodes or not.
fn pod_views(
    ctx: &Ctx<Guard>,
    shard: &Shard,
    ns: &str,
    cordoned: &BTreeSet<String>,
) -> Vec<PodView> {
    let roles = shard
        .status
        .as_ref()
        .map(|s| s.pod_roles.clone())
        .unwrap_or_default();
    ctx.stores
        .pods
        .state_filter(|pod| pod.namespace().as_deref() == Some(ns) && labelled_for(pod, shard))
        .iter()
        .filter_map(|pod| rollout::pod_view(pod, &roles, |node| cordoned.contains(node)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard() -> Shard {
        serde_yaml::from_str(include_str!("../../fixtures/shard.yaml")).unwrap()
    }

    fn missing() -> pgconfig::ConfigError {
        pgconfig::ConfigError::MissingConfigMap {
            name: "pg".into(),
            key: "postgresql.conf".into(),
            namespace: "db".into(),
        }
    }

    #[test]
    fn pods_map_to_their_shard_by_labels() {
        let s = shard();
        let pod = |db: &str| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p", "namespace": "db", "labels": {
                    "multigres.com/cluster": "prod", "multigres.com/database": db,
                    "multigres.com/tablegroup": "default", "multigres.com/shard": "0-inf"}},
            }))
            .unwrap()
        };
        assert!(labelled_for(&pod("postgres"), &s));
        assert!(!labelled_for(&pod("other"), &s));
    }

    #[test]
    fn every_pool_pod_mount_is_a_directory_a_backup_path_may_not_take() {
        let mut s = shard();
        s.spec.internal_tls = Some(multigres_api::v1alpha1::InternalTlsConfig {
            enabled: Some(true),
            topology: Some(true),
        });
        if let Some(backup) = s.spec.backup.as_mut() {
            backup.encryption = Some(multigres_api::v1alpha1::BackupEncryptionConfig {
                secret_name: "cipher".into(),
            });
        }
        let owner = Owner::of(&s).unwrap();
        let env = InheritedEnv::default();
        let built = desire(&owner, &s, &env, Ok(None), &StandbySettings::new()).unwrap();
        let backups = s
            .spec
            .backup
            .as_ref()
            .and_then(|b| b.filesystem.as_ref())
            .and_then(|f| f.path.clone())
            .unwrap();
        let mut mounts = Vec::new();
        for pool in &built.objects.pools {
            let pod = pool
                .statefulset
                .spec
                .as_ref()
                .unwrap()
                .template
                .spec
                .as_ref()
                .unwrap();
            let containers = pod
                .containers
                .iter()
                .chain(pod.init_containers.iter().flatten());
            for container in containers {
                for mount in container.volume_mounts.iter().flatten() {
                    mounts.push(mount.mount_path.clone());
                }
            }
        }
        assert!(mounts.contains(&backups), "{mounts:?}");
        assert!(mounts.len() > 5, "{mounts:?}");
        for mount in mounts.iter().filter(|m| **m != backups) {
            assert!(
                multigres_api::backup_path::problem(mount).is_some(),
                "a backup path of {mount} would be admitted: add it to backup_path::RESERVED"
            );
        }
    }

    #[test]
    fn the_spec_builds_before_its_referenced_config_is_judged() {
        let s = shard();
        let owner = Owner::of(&s).unwrap();
        let env = InheritedEnv::default();
        let built = desire(&owner, &s, &env, Ok(None), &StandbySettings::new()).unwrap();
        assert_eq!(
            built.postgres_config.0.name_any(),
            crate::names::postgres_config(&owner.name)
        );
        assert!(matches!(
            desire(&owner, &s, &env, Err(missing()), &StandbySettings::new()),
            Err(Rejected::PostgresConfig(
                pgconfig::ConfigError::MissingConfigMap { .. }
            ))
        ));
        let mut empty = s.clone();
        empty.spec.pools.clear();
        assert!(matches!(
            desire(
                &owner,
                &empty,
                &env,
                Err(missing()),
                &StandbySettings::new()
            ),
            Err(Rejected::Spec(build::BuildError::NoPools))
        ));
        let refused = Error::from(build::BuildError::NoPools);
        assert_eq!(refused.category(), Category::InvalidSpec);
        assert_eq!(refused.to_string(), build::BuildError::NoPools.to_string());
    }
}
