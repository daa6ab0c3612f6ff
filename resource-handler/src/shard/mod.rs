//! Shard controller: runs a shard's multiorch and PostgreSQL pools, restarts pool pods in a
//! safe order when their template changes, has the primary hand over before it restarts or is
//! scaled away, grows their volumes, and reports readiness and rollout progress (the
//! data-handler publishes pod roles and backup health next to them). A shard is `Available`
//! once it serves SQL: its pods are Ready and the roles name a primary among them.

pub mod build;
pub mod pgconfig;
pub mod rollout;
pub mod scale;
pub mod switchover;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use futures::Future;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{
    ConfigMap, ObjectReference, PersistentVolumeClaim, Pod, Secret, Service,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Preconditions};
use kube::runtime::Controller;
use kube::runtime::controller::{Action, Config};
use kube::runtime::events::EventType;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, ResourceExt};
use multigres_api::labels::{CLUSTER, DATABASE, SHARD, TABLE_GROUP};
use multigres_api::observability::PROJECT_REF_ANNOTATION;
use multigres_api::v1alpha1::{Shard, ShardSpec, ShardStatus};
use multigres_common::guard::Guarded;
use multigres_common::guard::InvalidObject;
use multigres_common::shared_watch::{Changes, SharedWatch};
use multigres_common::shutdown::Shutdown;
use multigres_common::status_pacer;

use crate::conditions::{AVAILABLE, Cond, FALSE, TRUE, merge, phase};
use crate::controller::{Classify, Ctx, POLL, error_policy, observe, owned};
use crate::owner::{Owner, OwnerError};
use crate::readiness::{self, Counts};
use crate::storage::{self, ResizeOutcome, STORAGE_SYNCED};
use crate::sync::{self, SyncError};
use crate::toposerver::keep_claim_templates;
use crate::unready;
use build::ShardObjects;
use rollout::{PodView, Step};
use scale::{HeldScaleUp, ScaleDown};

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
    #[error("{0}")]
    InvalidSpec(String),
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
    /// Deleting a pod for its restart failed.
    #[error("restarting pod {pod}")]
    Restart {
        pod: String,
        #[source]
        source: kube::Error,
    },
}

impl Classify for Error {
    fn is_invalid_spec(&self) -> bool {
        match self {
            Error::Malformed(_) | Error::Owner(_) | Error::InvalidSpec(_) => true,
            Error::PostgresConfig(e) => e.is_invalid_spec(),
            _ => false,
        }
    }

    fn category(&self) -> &'static str {
        if self.is_invalid_spec() {
            "invalid_spec"
        } else {
            "kube_api"
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
}

/// Whether `object` (a pool pod or volume, by its labels) belongs to `shard`.
fn labelled_for<K: ResourceExt>(object: &K, shard: &Shard) -> bool {
    let labels = object.labels();
    let is = |key: &str, value: &str| labels.get(key).map(String::as_str) == Some(value);
    object.namespace() == shard.namespace()
        && Owner::of(shard).is_ok_and(|o| is(CLUSTER, &o.cluster))
        && is(DATABASE, shard.spec.database_name.as_str())
        && is(TABLE_GROUP, shard.spec.table_group_name.as_str())
        && is(SHARD, shard.spec.shard_name.as_str())
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
    let shards = shards.store();
    // A referenced postgresql.conf ConfigMap belongs to the user: map it by name.
    let referenced = pgconfig::reference_changes(&ctx.client, &ctx.scope);
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
    let shutdown = futures::FutureExt::shared(futures::FutureExt::boxed(shutdown.wait()));
    let results = controller
        .owns_shared_stream(triggers.statefulsets)
        .owns_shared_stream(triggers.deployments)
        .owns_shared_stream(triggers.services)
        .owns_shared_stream(triggers.pdbs)
        .owns_shared_stream(triggers.secrets)
        .owns_shared_stream(triggers.config_maps)
        .watches_stream(referenced, referencing)
        .watches_shared_stream(triggers.pods, pods_of)
        .watches_shared_stream(triggers.pvcs, volumes_of)
        .with_config(Config::default().concurrency(4))
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx);
    multigres_common::controller::drive(NAME, results)
}

async fn reconcile(obj: Arc<Guard>, ctx: Arc<Ctx<Guard>>) -> Result<Action, Error> {
    observe(&ctx, &obj, reconcile_inner(&obj, &ctx)).await
}

/// Observed state of the shard's workloads, read from the caches.
struct Observed {
    sets: BTreeMap<String, Arc<StatefulSet>>,
    orchs: BTreeMap<String, Arc<Deployment>>,
}

impl Observed {
    fn read(ctx: &Ctx<Guard>, ns: &str, objects: &ShardObjects) -> Self {
        let get_set = |name: String| {
            let found = ctx
                .stores
                .statefulsets
                .get(&ObjectRef::new(&name).within(ns));
            found.map(|s| (name, s))
        };
        let get_orch = |name: String| {
            let found = ctx
                .stores
                .deployments
                .get(&ObjectRef::new(&name).within(ns));
            found.map(|d| (name, d))
        };
        Self {
            sets: objects
                .pools
                .iter()
                .filter_map(|p| get_set(p.statefulset.name_any()))
                .collect(),
            orchs: objects
                .multiorch
                .iter()
                .filter_map(|m| get_orch(m.deployment.name_any()))
                .collect(),
        }
    }

    /// Counts against the replicas the spec asks for, which a pool applied with fewer (a
    /// held scale-up, or a cache not yet showing the last write) has not reached.
    fn counts(&self, objects: &ShardObjects) -> (Vec<Counts>, Vec<Counts>) {
        let pools = objects
            .pools
            .iter()
            .map(|p| {
                let found = self.sets.get(&p.statefulset.name_any());
                let counts = readiness::statefulset(found.map(|s| &**s));
                let wanted = p.statefulset.spec.as_ref().and_then(|s| s.replicas);
                match (found, wanted) {
                    (Some(_), Some(wanted)) => Counts {
                        desired: counts.desired.max(wanted),
                        ..counts
                    },
                    _ => counts,
                }
            })
            .collect();
        let orchs = objects
            .multiorch
            .iter()
            .map(|m| readiness::deployment(self.orchs.get(&m.deployment.name_any()).map(|d| &**d)))
            .collect();
        (pools, orchs)
    }
}

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
    let api: Api<Shard> = Api::namespaced(ctx.client.clone(), ns);
    let mut objects = match build::build(&owner, &shard.spec) {
        Ok(objects) => objects,
        Err(problem) => {
            let report = Report {
                problem: Some(&problem),
                ..Report::default()
            };
            let mut desired = status(shard, &report, Timestamp::now());
            desired.postgres_config = shard
                .status
                .as_ref()
                .and_then(|s| s.postgres_config.clone());
            // A problem makes the phase Degraded, which is news: never deferred.
            let stored = shard.status.as_ref();
            sync::ensure_status(NAME, &api, shard, &desired, stored, &ctx.pacer).await?;
            return Err(Error::InvalidSpec(problem));
        }
    };
    crate::env::add_to_shard(
        &mut objects,
        crate::env::Source {
            config: shard.spec.observability.as_ref(),
            inherited: &ctx.telemetry,
            cluster: &owner.cluster,
            project: shard
                .annotations()
                .get(PROJECT_REF_ANNOTATION)
                .map(String::as_str),
        },
    );
    let pg_status = shard
        .status
        .as_ref()
        .and_then(|s| s.postgres_config.as_ref());
    let pg_config = match pgconfig::desired(&ctx.client, &owner, shard, &mut objects).await {
        Ok(desired) => desired,
        Err(error) => {
            if error.is_invalid_spec() {
                let problem = error.to_string();
                let report = Report {
                    problem: Some(&problem),
                    ..Report::default()
                };
                let mut desired = status(shard, &report, Timestamp::now());
                desired.postgres_config = Some(pgconfig::failed(pg_status, &error));
                let stored = shard.status.as_ref();
                sync::ensure_status(NAME, &api, shard, &desired, stored, &ctx.pacer).await?;
            }
            return Err(error.into());
        }
    };
    pgconfig::apply(ctx, guard, &pg_config).await?;
    let observed_conditions = shard.status.as_ref().map(|s| s.conditions.as_slice());
    let tls = crate::tls::reconcile_pgbackrest(ctx, guard, &owner, &shard.spec).await?;
    crate::tls::warn_if_new(ctx, guard, observed_conditions, tls.as_ref()).await;
    let handover = switchover::possible(shard);
    let pods = pod_views(ctx, shard, ns);
    let Applied {
        templates_changed,
        held,
        downs,
    } = apply_workloads(ctx, &owner, &objects, &pods, handover).await?;
    let observed = Observed::read(ctx, ns, &objects);
    let resize = resize(ctx, guard, &shard.spec, ns, &objects).await?;
    prune(ctx, &owner, &objects).await?;

    let step = if templates_changed {
        None
    } else {
        let step = plan_restart(&objects, &observed, &pods, handover);
        restart(ctx, guard, ns, &step).await?;
        Some(step)
    };
    let asked = switchover::needed(step.as_ref(), &downs);
    let changes = switchover::changes(&pods, &asked, step.is_some(), Timestamp::now());
    switchover::request(ctx, guard, ns, &changes).await;
    let (pools, orchs) = observed.counts(&objects);
    // The pool pods as this reconcile's writes and restarts left them, read once for the
    // status.
    let cached = ctx
        .stores
        .pods
        .state_filter(|pod| pod.namespace().as_deref() == Some(ns) && labelled_for(pod, shard));
    let report = Report {
        pools,
        orchs,
        pool_pods: current_pool_pods(&objects, &pods),
        rollout: step.clone(),
        storage: Some(resize.condition()),
        pgbackrest_tls: tls.clone(),
        switchover: switchover::condition(step.as_ref(), &downs, handover),
        held,
        unready: unready_pool_pods(&cached),
        problem: None,
    };
    let now = Timestamp::now();
    let mut desired = status(shard, &report, now);
    desired.postgres_config = Some(pgconfig::progress(
        pg_status,
        &pg_config.1,
        &objects,
        cached.iter().map(|p| &**p),
        now,
    ));
    let stored = shard.status.as_ref();
    let deferred = sync::ensure_status(NAME, &api, shard, &desired, stored, &ctx.pacer).await?;
    let planned = match step {
        // A user's Secret that is missing or incomplete is looked at again (it is not watched).
        Some(Step::UpToDate { .. }) if tls.is_some_and(|c| !c.is_true()) => {
            Some(crate::tls::RECHECK)
        }
        // A scale-up held for a leaving volume: its deletion is watched, but the shared watch
        // looks each changed claim up in the cache, and a claim deleted by then is not passed
        // on (seen in data_safety: the scale-up waited for good). Look again soon.
        Some(Step::UpToDate { .. }) if !report.held.is_empty() => Some(POLL),
        Some(Step::UpToDate { .. }) => None,
        // A restart is under way (or about to be decided once the StatefulSet controller has
        // caught up): look again soon even if no watched object changes.
        _ => Some(POLL),
    };
    Ok(status_pacer::action(planned, deferred))
}

/// What applying the workloads did.
struct Applied {
    /// A pool StatefulSet was written (its pods' revisions are then not comparable until its
    /// controller catches up).
    templates_changed: bool,
    /// Pool scale-ups applied only in part, for volumes still leaving.
    held: Vec<HeldScaleUp>,
    /// Pool scale-downs that remove the primary.
    downs: Vec<ScaleDown>,
}

/// Applies every workload that changed. `pods` (the shard's pool pods) and `handover` (whether
/// a switchover can be asked for) decide whether a scale-down waits for the primary.
async fn apply_workloads(
    ctx: &Ctx<Guard>,
    owner: &Owner,
    objects: &ShardObjects,
    pods: &[PodView],
    handover: bool,
) -> Result<Applied, Error> {
    let ns = owner.namespace.as_str();
    let client = &ctx.client;
    let stores = &ctx.stores;
    let services = Api::<Service>::namespaced(client.clone(), ns);
    if let Some(pvc) = objects.backup.clone() {
        let api = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns);
        // Size, class and access modes of an existing claim change only through the resize
        // path (or not at all).
        let keep = |desired: &mut PersistentVolumeClaim, existing: &PersistentVolumeClaim| {
            if let (Some(spec), Some(current)) = (desired.spec.as_mut(), existing.spec.as_ref()) {
                spec.resources = current.resources.clone();
                spec.access_modes = current.access_modes.clone();
                spec.storage_class_name = current.storage_class_name.clone();
            }
        };
        sync::ensure_with(NAME, &api, &stores.pvcs, pvc, keep).await?;
    }
    let deployments = Api::<Deployment>::namespaced(client.clone(), ns);
    let pdbs = Api::<PodDisruptionBudget>::namespaced(client.clone(), ns);
    let sets = Api::<StatefulSet>::namespaced(client.clone(), ns);
    // Independent objects are applied together: under load each write (a Service's above
    // all, which allocates a cluster IP) takes a round trip and a watch event to settle, and
    // one after another they would add up for every shard.
    let multiorch = objects.multiorch.iter().map(|m| async {
        futures::try_join!(
            sync::ensure(NAME, &services, &stores.services, m.service.clone()),
            sync::ensure(
                NAME,
                &deployments,
                &stores.deployments,
                m.deployment.clone()
            ),
        )
    });
    let pools = objects.pools.iter().map(|p| async {
        let mut set = p.statefulset.clone();
        let current = stores
            .statefulsets
            .get(&ObjectRef::new(&set.name_any()).within(ns));
        let claim = |name: &str| stores.pvcs.get(&ObjectRef::new(name).within(ns));
        let held = scale::hold(&mut set, current.as_deref(), claim);
        let down = scale::hold_down(&mut set, current.as_deref(), pods, handover);
        let (_, _, set_written) = futures::try_join!(
            sync::ensure(NAME, &services, &stores.services, p.service.clone()),
            sync::ensure(NAME, &pdbs, &stores.pdbs, p.pdb.clone()),
            sync::ensure_with(NAME, &sets, &stores.statefulsets, set, keep_claim_templates),
        )?;
        Ok::<_, SyncError>((set_written, held, down))
    });
    let (_, pools) = futures::try_join!(
        futures::future::try_join_all(multiorch),
        futures::future::try_join_all(pools),
    )?;
    let templates_changed = pools.iter().any(|(written, _, _)| *written);
    let (held, downs) = pools
        .into_iter()
        .map(|(_, held, down)| (held, down))
        .unzip::<_, _, Vec<_>, Vec<_>>();
    Ok(Applied {
        templates_changed,
        held: held.into_iter().flatten().collect(),
        downs: downs.into_iter().flatten().collect(),
    })
}

/// Grows pool and backup volumes to their requested sizes.
async fn resize(
    ctx: &Ctx<Guard>,
    guard: &Guard,
    spec: &ShardSpec,
    ns: &str,
    objects: &ShardObjects,
) -> Result<ResizeOutcome, Error> {
    let api = Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), ns);
    let mut outcome = ResizeOutcome::default();
    let mut groups = Vec::new();
    for p in &objects.pools {
        let pvcs = ctx.stores.pvcs.state_filter(|pvc| {
            pvc.namespace().as_deref() == Some(ns)
                && p.selector
                    .iter()
                    .all(|(k, v)| pvc.labels().get(k) == Some(v))
        });
        groups.push(storage::plan_resize(
            &p.storage_size,
            pvcs.iter().map(|p| &**p),
        ));
    }
    if let (Some(pvc), Some(size)) = (&objects.backup, build::backup_size(spec)) {
        let existing = ctx
            .stores
            .pvcs
            .get(&ObjectRef::new(&pvc.name_any()).within(ns));
        groups.push(storage::plan_resize(&size, existing.as_deref()));
    }
    for plan in groups {
        outcome.extend(
            storage::apply_resize(NAME, &api, plan)
                .await
                .map_err(Error::Resize)?,
        );
    }
    storage::report(ctx, guard, &outcome).await;
    Ok(outcome)
}

/// Deletes workloads the Shard no longer wants (e.g. the multiorch of a cell it stopped
/// watching).
async fn prune(ctx: &Ctx<Guard>, owner: &Owner, objects: &ShardObjects) -> Result<(), Error> {
    let ns = owner.namespace.as_str();
    let uid = owner.uid();
    let client = &ctx.client;
    let pool_names: BTreeSet<String> = objects
        .pools
        .iter()
        .map(|p| p.statefulset.name_any())
        .collect();
    let orch_names: BTreeSet<String> = objects
        .multiorch
        .iter()
        .map(|m| m.deployment.name_any())
        .collect();
    let service_names: BTreeSet<String> = pool_names.union(&orch_names).cloned().collect();
    let stores = &ctx.stores;
    sync::prune(
        NAME,
        &Api::<StatefulSet>::namespaced(client.clone(), ns),
        &owned(&stores.statefulsets, ns, uid),
        &pool_names,
    )
    .await?;
    sync::prune(
        NAME,
        &Api::<PodDisruptionBudget>::namespaced(client.clone(), ns),
        &owned(&stores.pdbs, ns, uid),
        &pool_names,
    )
    .await?;
    sync::prune(
        NAME,
        &Api::<Deployment>::namespaced(client.clone(), ns),
        &owned(&stores.deployments, ns, uid),
        &orch_names,
    )
    .await?;
    sync::prune(
        NAME,
        &Api::<Service>::namespaced(client.clone(), ns),
        &owned(&stores.services, ns, uid),
        &service_names,
    )
    .await?;
    Ok(())
}

/// The shard's pool pods, with their roles from the Shard status (else their labels).
fn pod_views(ctx: &Ctx<Guard>, shard: &Shard, ns: &str) -> Vec<PodView> {
    let roles = shard
        .status
        .as_ref()
        .map(|s| s.pod_roles.clone())
        .unwrap_or_default();
    ctx.stores
        .pods
        .state_filter(|pod| pod.namespace().as_deref() == Some(ns) && labelled_for(pod, shard))
        .iter()
        .filter_map(|pod| rollout::pod_view(pod, &roles))
        .collect()
}

/// The pool pods among `pods` that are not Ready, each with why (see [`crate::unready`]).
fn unready_pool_pods(pods: &[Arc<Pod>]) -> Vec<String> {
    let mut unready: Vec<String> = pods
        .iter()
        .filter_map(|pod| Some(format!("{}: {}", pod.name_any(), unready::reason(pod)?)))
        .collect();
    unready.sort();
    unready
}

/// Names of the shard's current pool pods: those of the pool StatefulSets it wants, not being
/// deleted.
fn current_pool_pods(objects: &ShardObjects, pods: &[PodView]) -> BTreeSet<String> {
    let sets: BTreeSet<String> = objects
        .pools
        .iter()
        .map(|p| p.statefulset.name_any())
        .collect();
    pods.iter()
        .filter(|p| !p.terminating && sets.contains(&p.set))
        .map(|p| p.name.clone())
        .collect()
}

fn plan_restart(
    objects: &ShardObjects,
    observed: &Observed,
    pods: &[PodView],
    handover: bool,
) -> Step {
    let sets: Vec<_> = objects
        .pools
        .iter()
        .map(|p| match observed.sets.get(&p.statefulset.name_any()) {
            Some(sts) => rollout::set_view(sts),
            None => rollout::SetView {
                name: p.statefulset.name_any(),
                update_revision: None,
                observed: false,
                replicas: 0,
            },
        })
        .collect();
    rollout::plan(&sets, pods, handover)
}

/// Carries out a [`Step::Restart`]: deletes the pod (if it is still the one planned) so its
/// StatefulSet recreates it from the current template.
async fn restart(ctx: &Ctx<Guard>, guard: &Guard, ns: &str, step: &Step) -> Result<(), Error> {
    let Step::Restart {
        pod,
        uid,
        primary,
        outdated,
        total,
    } = step
    else {
        return Ok(());
    };
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.to_owned()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    let pods = Api::<Pod>::namespaced(ctx.client.clone(), ns);
    crate::sync::count(NAME, "Pod", "delete");
    match pods.delete(pod, &params).await {
        Ok(_) => {}
        // Already gone or replaced: the next reconcile sees the new pod.
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => return Ok(()),
        Err(source) => {
            return Err(Error::Restart {
                pod: pod.to_owned(),
                source,
            });
        }
    }
    let which = if *primary {
        "the primary, last, without a switchover"
    } else {
        "a replica"
    };
    let note = format!(
        "restarting pod {pod} ({which}) to apply the new pod template; {outdated} of {total} \
         pods were outdated"
    );
    tracing::info!(%pod, primary, outdated, total, "restarting pool pod");
    let related = ObjectReference {
        api_version: Some("v1".to_owned()),
        kind: Some("Pod".to_owned()),
        name: Some(pod.clone()),
        namespace: Some(ns.to_owned()),
        uid: Some(uid.clone()),
        ..Default::default()
    };
    ctx.event_about(
        guard,
        Some(related),
        EventType::Normal,
        "RestartingPod",
        note,
    )
    .await;
    Ok(())
}

/// What the status is computed from.
#[derive(Clone, Debug, Default)]
pub struct Report<'a> {
    /// Counts of each pool StatefulSet.
    pub pools: Vec<Counts>,
    /// Counts of each multiorch Deployment.
    pub orchs: Vec<Counts>,
    /// Names of the shard's current pool pods (see [`current_pool_pods`]): the primary named in
    /// `status.podRoles` must be one of them for the shard to be Available.
    pub pool_pods: BTreeSet<String>,
    /// The ordered restart's step (`None` while a new template is being applied).
    pub rollout: Option<Step>,
    /// The `StorageSynced` verdict.
    pub storage: Option<Cond>,
    /// The pgBackRest TLS verdict (none without backups).
    pub pgbackrest_tls: Option<Cond>,
    /// The `Switchover` verdict (none while no primary is about to go).
    pub switchover: Option<Cond>,
    /// Pool scale-ups waiting for volumes of scaled-away replicas to go.
    pub held: Vec<HeldScaleUp>,
    /// Pool pods that are not Ready, each with why (`<pod>: <reason>`, by name).
    pub unready: Vec<String>,
    /// Why the spec cannot be realised.
    pub problem: Option<&'a str>,
}

/// Pods listed by name in a condition message, at most; the rest are counted.
const UNREADY_LISTED: usize = 3;

/// `unready`, the first [`UNREADY_LISTED`] of them spelled out (`None` when empty).
fn unready_summary(unready: &[String]) -> Option<String> {
    let (listed, rest) = unready.split_at(unready.len().min(UNREADY_LISTED));
    let mut summary = listed.join("; ");
    if !rest.is_empty() {
        summary = format!("{summary}; and {} more", rest.len());
    }
    (!listed.is_empty()).then_some(summary)
}

fn rolling_condition(step: Option<&Step>) -> Cond {
    match step {
        None => Cond::new(
            ROLLING_UPDATE,
            TRUE,
            "TemplateChanged",
            "a new pod template was applied; waiting for the StatefulSet controller",
        ),
        Some(Step::UpToDate { pods }) => Cond::new(
            ROLLING_UPDATE,
            FALSE,
            "UpToDate",
            format!("all {pods} pool pods run the current pod template"),
        ),
        Some(Step::Restart {
            pod,
            primary,
            outdated,
            total,
            ..
        }) => Cond::new(
            ROLLING_UPDATE,
            TRUE,
            "Restarting",
            format!(
                "restarting {}; {} of {total} pods updated",
                if *primary {
                    format!("the primary {pod} without a switchover")
                } else {
                    format!("replica {pod}")
                },
                total - outdated
            ),
        ),
        Some(Step::Wait {
            wait,
            outdated,
            total,
        }) => Cond::new(
            ROLLING_UPDATE,
            TRUE,
            wait.reason(),
            format!(
                "{}; {} of {total} pods updated",
                wait.message(),
                total.saturating_sub(*outdated)
            ),
        ),
    }
}

/// The current pool pod (one of `pods`) that `status.podRoles` names as the primary, or why
/// none is known. The roles are the data-handler's, read from the pooler records multipoolers
/// write to the topology: the only sign that multiorch has elected a primary, without which
/// the gateways answer no query (`no writable primary is currently available`).
fn known_primary<'s>(shard: &'s Shard, pods: &BTreeSet<String>) -> Result<&'s str, String> {
    let named: Vec<&str> = shard
        .status
        .iter()
        .flat_map(|s| &s.pod_roles)
        .filter(|(_, role)| rollout::Role::parse(role) == rollout::Role::Primary)
        .map(|(pod, _)| pod.as_str())
        .collect();
    if let Some(pod) = named.iter().find(|pod| pods.contains(**pod)) {
        return Ok(pod);
    }
    Err(if named.is_empty() {
        "no primary yet: multiorch elects one once PostgreSQL runs in the pool pods; roles \
         come from the topology (data-handler)"
            .to_owned()
    } else {
        format!(
            "no primary among the pool pods: the roles name {} as primary, not a current pool \
             pod; multiorch elects a new one, and the data-handler publishes it from the \
             topology",
            named.join(", ")
        )
    })
}

/// The status fields and conditions this handler owns on a Shard.
///
/// `Available` means the shard serves SQL: every pool pod and every cell's multiorch is
/// Ready, and a current pool pod is the primary (see [`known_primary`]). With everything
/// Ready but no primary known, `Available` is False with reason `NoPrimary` and the phase
/// stays Progressing: multiorch elects one within seconds of PostgreSQL running.
pub fn status(shard: &Shard, report: &Report<'_>, now: Timestamp) -> ShardStatus {
    let pool_ready: i32 = report.pools.iter().map(|c| c.ready).sum();
    let pool_desired: i32 = report.pools.iter().map(|c| c.desired).sum();
    let pools_ready = !report.pools.is_empty() && report.pools.iter().all(Counts::all_ready);
    let orchs_ready = report.orchs.iter().filter(|c| c.all_ready()).count();
    let orch_ready = !report.orchs.is_empty() && orchs_ready == report.orchs.len();
    let mut message = format!(
        "pool pods {pool_ready}/{pool_desired} ready; multiorch ready in {orchs_ready}/{} cells",
        report.orchs.len()
    );
    let available = if pools_ready && orch_ready {
        match known_primary(shard, &report.pool_pods) {
            Ok(primary) => {
                message = format!("{message}; primary {primary}");
                Cond::new(AVAILABLE, TRUE, "AllReady", message.clone())
            }
            Err(none) => {
                message = format!("{message}; {none}");
                Cond::new(AVAILABLE, FALSE, "NoPrimary", message.clone())
            }
        }
    } else if !report.held.is_empty() {
        let held: Vec<String> = report.held.iter().map(HeldScaleUp::message).collect();
        let message = format!("{message}; {}", held.join("; "));
        Cond::new(AVAILABLE, FALSE, "WaitingForVolumeDeletion", message)
    } else {
        let message = match unready_summary(&report.unready) {
            Some(listed) => format!("{message}; not ready: {listed}"),
            None => message.clone(),
        };
        Cond::new(AVAILABLE, FALSE, "NotReady", message)
    };
    let rolling = rolling_condition(report.rollout.as_ref());
    let handing_over = report.switchover.as_ref().is_some_and(Cond::is_true);
    let healthy = available.is_true() && !rolling.is_true() && !handing_over;
    let mut desired = vec![available, rolling];
    desired.extend(report.storage.clone());
    desired.extend(report.pgbackrest_tls.clone());
    desired.extend(report.switchover.clone());
    let observed = shard
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let generation = shard.metadata.generation;
    let mut conditions = merge(observed, &desired, generation, now);
    if report.storage.is_none() {
        conditions.extend(
            observed
                .iter()
                .filter(|c| c.type_ == STORAGE_SYNCED)
                .cloned(),
        );
    }
    ShardStatus {
        observed_generation: generation,
        conditions,
        phase: Some(phase(healthy, report.problem)),
        message: Some(report.problem.map_or(message, str::to_owned)),
        cells: build::pool_cells(&shard.spec),
        orch_ready: Some(orch_ready),
        pools_ready: Some(pools_ready),
        ready_replicas: Some(pool_ready),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
    use multigres_api::v1alpha1::Phase;

    use super::*;
    use rollout::Wait;

    fn shard() -> Shard {
        serde_yaml::from_str(include_str!("../../fixtures/shard.yaml")).unwrap()
    }

    fn counts(desired: i32, ready: i32) -> Counts {
        Counts {
            desired,
            ready,
            observed: true,
        }
    }

    /// Pool pods `<set>-0` .. `<set>-<n-1>` of pool `main` in zone-a.
    fn pods(n: usize) -> BTreeSet<String> {
        (0..n)
            .map(|i| format!("prod-postgres-default-0-inf-pool-main-zone-a-{i}"))
            .collect()
    }

    /// `shard` with `status.podRoles` as the data-handler writes them.
    fn with_roles(mut shard: Shard, roles: &[(&str, &str)]) -> Shard {
        let status = shard.status.get_or_insert_with(ShardStatus::default);
        status.pod_roles = roles
            .iter()
            .map(|(pod, role)| {
                (
                    format!("prod-postgres-default-0-inf-pool-main-{pod}"),
                    (*role).to_owned(),
                )
            })
            .collect();
        shard
    }

    fn available_of(st: &ShardStatus) -> &Condition {
        st.conditions.iter().find(|c| c.type_ == AVAILABLE).unwrap()
    }

    #[test]
    fn pods_holding_the_shard_back_are_named_with_why() {
        let unready: Vec<String> = (0..5)
            .map(|i| format!("pool-main-z1-{i}: unschedulable: 0/3 nodes are available"))
            .collect();
        let report = Report {
            pools: vec![counts(5, 0)],
            orchs: vec![counts(1, 1)],
            unready: unready[..1].to_vec(),
            ..Report::default()
        };
        let st = status(&shard(), &report, Timestamp::from_second(1).unwrap());
        let available = available_of(&st);
        assert_eq!(
            (available.reason.as_str(), available.message.as_str()),
            (
                "NotReady",
                "pool pods 0/5 ready; multiorch ready in 1/1 cells; not ready: pool-main-z1-0: \
                 unschedulable: 0/3 nodes are available"
            )
        );
        let many = Report { unready, ..report };
        let st = status(&shard(), &many, Timestamp::from_second(1).unwrap());
        let available = available_of(&st);
        assert!(available.message.contains("pool-main-z1-2: unschedulable"));
        assert!(!available.message.contains("pool-main-z1-3"));
        assert!(
            available.message.ends_with("; and 2 more"),
            "{}",
            available.message
        );
    }

    #[test]
    fn status_climbs_to_available_once_pools_and_multiorch_are_ready_and_a_primary_is_known() {
        let now = Timestamp::from_second(9).unwrap();
        let s = shard();
        let mut report = Report {
            pools: vec![counts(2, 2), counts(2, 1)],
            orchs: vec![counts(1, 1), counts(1, 0)],
            pool_pods: pods(3),
            rollout: Some(Step::UpToDate { pods: 3 }),
            storage: None,
            pgbackrest_tls: None,
            switchover: None,
            held: Vec::new(),
            unready: Vec::new(),
            problem: None,
        };
        let st = status(&s, &report, now);
        let available = st.conditions.iter().find(|c| c.type_ == AVAILABLE).unwrap();
        assert_eq!(available.status, FALSE);
        assert_eq!(
            available.message,
            "pool pods 3/4 ready; multiorch ready in 1/2 cells"
        );
        assert_eq!(st.ready_replicas, Some(3));
        assert_eq!((st.pools_ready, st.orch_ready), (Some(false), Some(false)));
        assert_eq!(st.phase, Some(Phase::Progressing));
        assert_eq!(st.cells.len(), 2);
        assert_eq!(st.observed_generation, Some(3));

        // Everything Ready, but multiorch has not elected a primary yet.
        report.pools = vec![counts(2, 2), counts(2, 2)];
        report.orchs = vec![counts(1, 1), counts(1, 1)];
        report.pool_pods = pods(2);
        let st = status(&s, &report, now);
        let c = available_of(&st);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
            (
                FALSE,
                "NoPrimary",
                "pool pods 4/4 ready; multiorch ready in 2/2 cells; no primary yet: multiorch \
                 elects one once PostgreSQL runs in the pool pods; roles come from the topology \
                 (data-handler)"
            )
        );
        assert_eq!((st.pools_ready, st.orch_ready), (Some(true), Some(true)));
        assert_eq!(st.phase, Some(Phase::Progressing), "waiting, not degraded");
        assert_eq!(st.message.as_deref(), Some(c.message.as_str()));

        // Replicas alone are no primary either.
        let replicas = with_roles(
            s.clone(),
            &[("zone-a-0", "REPLICA"), ("zone-a-1", "REPLICA")],
        );
        assert_eq!(
            available_of(&status(&replicas, &report, now)).reason,
            "NoPrimary"
        );

        // The data-handler publishes the primary it read from the topology.
        let elected = with_roles(
            s.clone(),
            &[("zone-a-0", "REPLICA"), ("zone-a-1", "PRIMARY")],
        );
        let st = status(&elected, &report, now);
        let c = available_of(&st);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
            (
                TRUE,
                "AllReady",
                "pool pods 4/4 ready; multiorch ready in 2/2 cells; primary \
                 prod-postgres-default-0-inf-pool-main-zone-a-1"
            )
        );
        assert_eq!(st.phase, Some(Phase::Healthy));
        let written = serde_json::to_value(&st).unwrap();
        assert!(
            written.get("podRoles").is_none(),
            "roles belong to the data-handler: this handler's apply must not claim them: \
             {written}"
        );

        // A primary that is no current pool pod (scaled away, or its pool removed) is none.
        report.pool_pods = pods(1);
        let st = status(&elected, &report, now);
        let c = available_of(&st);
        assert_eq!((c.status.as_str(), c.reason.as_str()), (FALSE, "NoPrimary"));
        assert!(
            c.message.contains(
                "the roles name prod-postgres-default-0-inf-pool-main-zone-a-1 as primary, not a \
                 current pool pod"
            ),
            "{}",
            c.message
        );
        assert_eq!(st.phase, Some(Phase::Progressing));
    }

    #[test]
    fn a_held_scale_up_says_which_volume_it_waits_for() {
        let held = HeldScaleUp {
            statefulset: "pool-main-z1".into(),
            replicas: 2,
            wanted: 3,
            claim: "data-pool-main-z1-2".into(),
        };
        let report = Report {
            pools: vec![counts(3, 2)],
            orchs: vec![counts(1, 1)],
            held: vec![held],
            ..Report::default()
        };
        let st = status(&shard(), &report, Timestamp::from_second(1).unwrap());
        let available = st.conditions.iter().find(|c| c.type_ == AVAILABLE).unwrap();
        assert_eq!(
            (available.status.as_str(), available.reason.as_str()),
            (FALSE, "WaitingForVolumeDeletion")
        );
        assert_eq!(
            available.message,
            "pool pods 2/3 ready; multiorch ready in 1/1 cells; pool-main-z1 stays at 2 of 3 \
             replicas until PersistentVolumeClaim data-pool-main-z1-2 of a scaled-away replica \
             is deleted (whenScaled: Delete)"
        );
        assert_eq!(st.phase, Some(Phase::Progressing));
    }

    #[test]
    fn rolling_update_condition_reports_progress_and_waits() {
        let restart = rolling_condition(Some(&Step::Restart {
            pod: "p-1".into(),
            uid: "u".into(),
            primary: false,
            outdated: 3,
            total: 4,
        }));
        assert_eq!((restart.status, restart.reason), (TRUE, "Restarting"));
        assert_eq!(
            restart.message,
            "restarting replica p-1; 1 of 4 pods updated"
        );
        let wait = rolling_condition(Some(&Step::Wait {
            wait: Wait::RolesUnknown,
            outdated: 4,
            total: 4,
        }));
        assert_eq!(wait.reason, "WaitingForRoles");
        assert!(wait.message.contains("no pod is known to be the primary"));
        let primary = rolling_condition(Some(&Step::Restart {
            pod: "p-0".into(),
            uid: "u".into(),
            primary: true,
            outdated: 1,
            total: 4,
        }));
        assert_eq!(
            primary.message,
            "restarting the primary p-0 without a switchover; 3 of 4 pods updated"
        );
        let handover = rolling_condition(Some(&Step::Wait {
            wait: Wait::Switchover("p-0".into()),
            outdated: 1,
            total: 4,
        }));
        assert_eq!(
            (handover.reason, handover.message.as_str()),
            (
                "WaitingForSwitchover",
                "waiting for the primary p-0 to hand over to a replica before its restart; 3 \
                 of 4 pods updated"
            )
        );
        let done = rolling_condition(Some(&Step::UpToDate { pods: 4 }));
        assert_eq!((done.status, done.reason), (FALSE, "UpToDate"));
        let rolling = status(
            &shard(),
            &Report {
                pools: vec![counts(2, 2)],
                orchs: vec![counts(1, 1)],
                rollout: Some(Step::Wait {
                    wait: Wait::RolesUnknown,
                    outdated: 2,
                    total: 2,
                }),
                ..Report::default()
            },
            Timestamp::from_second(1).unwrap(),
        );
        assert_eq!(
            rolling.phase,
            Some(Phase::Progressing),
            "a rollout is progress"
        );
    }

    #[test]
    fn a_scale_down_waiting_for_a_switchover_is_progress() {
        let down = ScaleDown {
            statefulset: "pool-main-z1".into(),
            from: 3,
            replicas: 3,
            wanted: 2,
            primary: "pool-main-z1-2".into(),
            handover: scale::Handover::Requested,
        };
        let report = Report {
            pools: vec![counts(3, 3)],
            orchs: vec![counts(1, 1)],
            pool_pods: pods(3),
            rollout: Some(Step::UpToDate { pods: 3 }),
            switchover: switchover::condition(None, &[down], true),
            ..Report::default()
        };
        let s = with_roles(shard(), &[("zone-a-2", "PRIMARY")]);
        let st = status(&s, &report, Timestamp::from_second(1).unwrap());
        let c = st
            .conditions
            .iter()
            .find(|c| c.type_ == switchover::SWITCHOVER)
            .unwrap();
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            (TRUE, "WaitingForSwitchover")
        );
        assert!(c.message.contains("pool-main-z1-2"));
        assert_eq!(st.phase, Some(Phase::Progressing));
        let idle = Report {
            switchover: None,
            ..report
        };
        let st = status(&s, &idle, Timestamp::from_second(2).unwrap());
        assert_eq!(st.phase, Some(Phase::Healthy));
        assert!(
            st.conditions
                .iter()
                .all(|c| c.type_ != switchover::SWITCHOVER)
        );
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
}
