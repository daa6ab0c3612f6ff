//! Applying what a Shard asks for: its postgresql.conf, pgBackRest TLS, workloads and
//! volumes, pruning what it no longer wants, then the next step of the ordered restart and
//! the switchovers that restart or a scale-down needs.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolumeClaim, Pod, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Preconditions};
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use multigres_api::owner::Owner;
use multigres_api::v1alpha1::{CohortStatus, Shard};
use multigres_api::volumes::AutoGrow;

use super::build::{self, ShardObjects};
use super::drain::{self, Evictions};
use super::rollout::{self, PodView, Step, Wait};
use super::scale::{self, CohortHold, HeldScaleUp, ScaleDown};
use super::template_changes;
use super::{Desired, Error, Guard, NAME, pgconfig, quarantine, switchover};
use crate::conditions::Computed;
use crate::controller::{Ctx, owned};
use crate::readiness::{self, Counts};
use crate::storage::{self, ResizeOutcome};
use crate::sync::{self, SyncError};
use crate::toposerver::keep_claim_templates;
use multigres_common::telemetry::ErrorChain;

/// What applying did, for the status.
pub(super) struct Outcome {
    /// The shard's workloads as cached once they were applied.
    pub observed: Observed,
    /// The pgBackRest TLS verdict (none without backups).
    pub tls: Option<Computed>,
    /// What growing the volumes did.
    pub resize: ResizeOutcome,
    /// The ordered restart's step (`None` while a new template is being applied).
    pub step: Option<Step>,
    /// What the restart of the outdated pods changes, while one waits or runs
    /// ([`template_changes`]).
    pub restart_changes: Option<String>,
    /// Pool scale-ups applied only in part, for volumes still leaving.
    pub held: Vec<HeldScaleUp>,
    /// Pool scale-downs that remove the primary.
    pub downs: Vec<ScaleDown>,
    /// Pool scale-downs held or stepped for the consensus cohort.
    pub cohort_holds: Vec<CohortHold>,
    /// Hand-overs asked for by people and by drains.
    pub requests: switchover::Requests,
    /// The `Drain` verdict (none while no pool pod is on a cordoned node).
    pub drain: Option<Computed>,
    /// Claims of scaled-away replicas wait for the cohort to drop their pods.
    pub claims_waiting: bool,
    /// The cluster is paused: nothing above was applied.
    pub paused: bool,
    /// The cluster hibernates: the workloads were applied at zero replicas, and this many
    /// pods (pool pods and multiorch) are still there.
    pub hibernating: Option<i32>,
}

impl Outcome {
    /// The workloads as `observed`, with nothing else done: no restart step, hold, hand-over,
    /// drain verdict or claim waiting.
    fn untouched(observed: Observed) -> Self {
        Self {
            observed,
            tls: None,
            resize: ResizeOutcome::default(),
            step: None,
            restart_changes: None,
            held: Vec::new(),
            downs: Vec::new(),
            cohort_holds: Vec::new(),
            requests: switchover::Requests::default(),
            drain: None,
            claims_waiting: false,
            paused: false,
            hibernating: None,
        }
    }
}

/// Applies `desired`, in order: the postgresql.conf ConfigMap (before the pool StatefulSets,
/// so new pods mount the current file), pgBackRest TLS, the workloads, volume growth and
/// pruning; then restarts the next outdated pool pod (unless a template was just written)
/// and asks for the switchovers needed. `pods` are the shard's pool pods and `cordoned` the
/// cordoned nodes, both as read before.
pub(super) async fn run(
    ctx: &Ctx<Guard>,
    guard: &Guard,
    (shard, annotations): (&Shard, &BTreeMap<String, String>),
    owner: &Owner,
    desired: &Desired,
    (pods, cordoned): (&[PodView], &BTreeSet<String>),
) -> Result<Outcome, Error> {
    let ns = owner.namespace.as_str();
    let objects = &desired.objects;
    pgconfig::apply(ctx, guard, &desired.postgres_config).await?;
    let observed_conditions = shard.status.as_ref().map(|s| s.conditions.as_slice());
    let tls = crate::tls::reconcile_pgbackrest(ctx, guard, owner, &shard.spec).await?;
    crate::tls::warn_if_new(ctx, guard, observed_conditions, tls.as_ref()).await;
    let cohort = shard.status.as_ref().and_then(|s| s.cohort.as_ref());
    let gates = Gates {
        cohort,
        evictions: Evictions::of(shard),
        hibernating: false,
        cordoned,
    };
    let Applied {
        templates_changed,
        held,
        downs,
        cohort_holds,
        moving,
    } = apply_workloads(ctx, owner, objects, pods, &gates).await?;
    for (deployment, moved) in moving {
        let note = format!(
            "moving multiorch {deployment} off its cordoned node ({moved}) now that no primary \
             is left there: its pod starts again on another node, and a drain may then go on"
        );
        ctx.kit
            .event(guard, EventType::Normal, "MovingOffCordonedNode", note)
            .await;
    }
    let observed = Observed::read(ctx, ns, objects);
    let resize = resize(ctx, guard, shard, ns, objects).await?;
    prune(ctx, owner, objects).await?;

    let rendered = &desired.postgres_config.1;
    pgconfig::stamp_standby(ctx, ns, pods, rendered).await;
    let sets = set_views(objects, &observed);
    let (step, restart_changes) = if templates_changed {
        (None, None)
    } else {
        let step = rollout::plan(&sets, pods, gates.cohort.is_some(), released(annotations));
        let changes = restart_changes(ctx, ns, &sets, pods, &step).await;
        announce_pending(ctx, guard, shard, &step, changes.as_deref()).await;
        restart(ctx, guard, ns, &step, changes.as_deref()).await?;
        (Some(step), changes)
    };
    let mut requests = switchover::user_requests(pods, cohort.is_some());
    let drains = switchover::drain_requests(pods, cohort.is_some());
    requests.ask.extend(drains.ask);
    requests.waiting.extend(drains.waiting);
    let mut asked = switchover::needed(step.as_ref(), &downs);
    asked.extend(requests.ask.clone());
    asked.extend(scale::leaders_to_hand_over(&cohort_holds));
    switchover::answer_users(ctx, guard, ns, pods, &requests.answered).await;
    let changes = switchover::changes(pods, &asked, step.is_some(), Timestamp::now());
    switchover::request(ctx, guard, ns, &changes).await;
    let claims_waiting =
        delete_scaled_away_claims(ctx, guard, ns, objects, &observed, pods, cohort).await;
    let restarting = matches!(step, None | Some(Step::Restart { .. }));
    replace_quarantined(ctx, guard, shard, ns, objects, pods, restarting).await;
    Ok(Outcome {
        observed,
        tls,
        resize,
        step,
        restart_changes,
        held,
        downs,
        cohort_holds,
        requests,
        drain: drain::condition(pods, gates.evictions, cohort),
        claims_waiting,
        paused: false,
        hibernating: None,
    })
}

/// What a paused shard reports (annotation `multigres.com/paused`): its workloads as cached,
/// against the templates they were last applied with, and the `Paused` verdict; nothing is
/// written, restarted or deleted.
pub(super) fn paused(
    ctx: &Ctx<Guard>,
    shard: &Shard,
    annotations: &BTreeMap<String, String>,
    ns: &str,
    objects: &ShardObjects,
    pods: &[PodView],
) -> Outcome {
    let observed = Observed::read(ctx, ns, objects);
    let cohort = shard.status.as_ref().and_then(|s| s.cohort.as_ref());
    let sets = set_views(objects, &observed);
    let step = rollout::plan(&sets, pods, cohort.is_some(), released(annotations));
    Outcome {
        step: Some(step),
        drain: drain::condition(pods, Evictions::of(shard), cohort),
        paused: true,
        ..Outcome::untouched(observed)
    }
}

/// Applies a hibernating shard (annotation `multigres.com/hibernate`): its postgresql.conf and
/// pgBackRest TLS as usual, and its workloads at zero replicas, all at once and with no gate
/// (no pod stays to hand over to, and a pooler with nobody left to replicate to loses nothing:
/// its volume stays). Nothing is pruned, grown, restarted or asked to switch over, and no claim
/// is deleted: a stopped pod's claim is not a scaled-away replica's.
pub(super) async fn hibernate(
    ctx: &Ctx<Guard>,
    guard: &Guard,
    shard: &Shard,
    owner: &Owner,
    desired: &Desired,
    pods: &[PodView],
) -> Result<Outcome, Error> {
    let ns = owner.namespace.as_str();
    pgconfig::apply(ctx, guard, &desired.postgres_config).await?;
    let tls = crate::tls::reconcile_pgbackrest(ctx, guard, owner, &shard.spec).await?;
    let mut objects = desired.objects.clone();
    build::hibernate(&mut objects);
    let no_moves = BTreeSet::new();
    let gates = Gates {
        cohort: None,
        evictions: Evictions::of(shard),
        hibernating: true,
        cordoned: &no_moves,
    };
    apply_workloads(ctx, owner, &objects, pods, &gates).await?;
    let observed = Observed::read(ctx, ns, &objects);
    let orchs: i32 = observed
        .orchs
        .values()
        .map(|d| readiness::deployment(Some(d)).running)
        .sum();
    let pool_pods = i32::try_from(pods.len()).unwrap_or(i32::MAX);
    Ok(Outcome {
        tls,
        hibernating: Some(pool_pods.saturating_add(orchs)),
        ..Outcome::untouched(observed)
    })
}

/// Under supervised restarts (`multigres.com/restart-policy` of the Shard or its cluster, see
/// [`multigres_api::labels::with_cluster_holds`]), what the Shard's release annotation names
/// (empty without one); `None` when restarts are automatic.
fn released(annotations: &BTreeMap<String, String>) -> Option<&str> {
    multigres_api::labels::supervised(annotations).then(|| {
        annotations
            .get(multigres_api::labels::RELEASE_RESTARTS)
            .map_or("", String::as_str)
    })
}

/// What the shard's disruptive steps wait for.
struct Gates<'a> {
    /// The consensus cohort, when the data-handler publishes it.
    cohort: Option<&'a CohortStatus>,
    /// Whether a drain may evict a replica.
    evictions: Evictions,
    /// The cluster hibernates: every workload goes to zero at once, with no gate.
    hibernating: bool,
    /// The cordoned nodes the pool pods were seen against: a multiorch moves off one only as
    /// the pods' view of the drain says it may.
    cordoned: &'a BTreeSet<String>,
}

/// Observed state of the shard's workloads, read from the caches.
pub(super) struct Observed {
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
    /// held scale-up, or a cache not yet showing the last write) has not reached; while the
    /// cluster is `paused`, against what is applied, which is what the pause holds.
    pub(super) fn counts(
        &self,
        objects: &ShardObjects,
        paused: bool,
    ) -> (Vec<Counts>, Vec<Counts>) {
        let pools = objects
            .pools
            .iter()
            .map(|p| {
                let found = self.sets.get(&p.statefulset.name_any());
                let counts = readiness::statefulset(found.map(|s| &**s));
                let wanted = p.statefulset.spec.as_ref().and_then(|s| s.replicas);
                match (found, wanted) {
                    (Some(_), Some(wanted)) if !paused => Counts {
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

/// What applying the workloads did.
struct Applied {
    /// A pool StatefulSet was written (its pods' revisions are then not comparable until its
    /// controller catches up).
    templates_changed: bool,
    /// Pool scale-ups applied only in part, for volumes still leaving.
    held: Vec<HeldScaleUp>,
    /// Pool scale-downs that remove the primary.
    downs: Vec<ScaleDown>,
    /// Pool scale-downs held or stepped for the consensus cohort.
    cohort_holds: Vec<CohortHold>,
    /// multiorch Deployments whose only pod starts leaving a cordoned node, with its
    /// `<node>/<pod>`.
    moving: Vec<(String, String)>,
}

/// Applies every workload that changed. `pods` (the shard's pool pods) and the `gates` decide
/// whether a scale-down waits for the cohort and for the primary.
async fn apply_workloads(
    ctx: &Ctx<Guard>,
    owner: &Owner,
    objects: &ShardObjects,
    pods: &[PodView],
    gates: &Gates<'_>,
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
    // multiorch appoints the primary a drain's hand-over asks for: it moves only once the
    // primary is known and on a node not cordoned. A primary not known yet (roles published a
    // moment after the cordon reached this handler) may be the one the drain strands.
    let primary_settled = pods
        .iter()
        .any(|p| p.role == rollout::Role::Primary && !p.terminating)
        && !pods
            .iter()
            .any(|p| p.role == rollout::Role::Primary && p.cordoned && !p.terminating);
    let multiorch = objects.multiorch.iter().map(|m| async {
        let mut deployment = m.deployment.clone();
        let name = deployment.name_any();
        let observed = stores.deployments.get(&ObjectRef::new(&name).within(ns));
        let moving = if gates.hibernating {
            None
        } else {
            crate::cordon::move_single_pod(
                &stores.other_pods,
                gates.cordoned,
                &mut deployment,
                observed.as_deref(),
                primary_settled,
            )
        };
        let budget = sync::ensure_wanted(NAME, &pdbs, &stores.pdbs, m.pdb.clone());
        futures::try_join!(
            sync::ensure(NAME, &services, &stores.services, m.service.clone()),
            sync::ensure(NAME, &deployments, &stores.deployments, deployment),
            budget,
        )?;
        Ok::<_, SyncError>(moving.map(|node| (name, node)))
    });
    let pools = objects.pools.iter().map(|p| async {
        let mut set = p.statefulset.clone();
        let current = stores
            .statefulsets
            .get(&ObjectRef::new(&set.name_any()).within(ns));
        let claim = |name: &str| stores.pvcs.get(&ObjectRef::new(name).within(ns));
        let (held, cohort_hold, down) = if gates.hibernating {
            (None, None, None)
        } else {
            let held = scale::hold(&mut set, current.as_deref(), claim);
            let cohort_hold =
                scale::hold_for_cohort(&mut set, current.as_deref(), pods, gates.cohort);
            // A scale-down held for the cohort asks nobody to hand over yet.
            let down = match &cohort_hold {
                Some(CohortHold {
                    waiting: Some(_), ..
                }) => None,
                _ => scale::hold_down(&mut set, current.as_deref(), pods),
            };
            (held, cohort_hold, down)
        };
        let (_, _, set_written) = futures::try_join!(
            sync::ensure(NAME, &services, &stores.services, p.service.clone()),
            sync::ensure(
                NAME,
                &pdbs,
                &stores.pdbs,
                drain::replica_budget(&p.pdb, &p.statefulset.name_any(), pods, gates.evictions)
            ),
            sync::ensure_with(NAME, &sets, &stores.statefulsets, set, keep_claim_templates),
        )?;
        Ok::<_, SyncError>((set_written, held, down, cohort_hold))
    });
    let primary = sync::ensure_wanted(NAME, &pdbs, &stores.pdbs, objects.primary_pdb.clone());
    let (moving, pools, ()) = futures::try_join!(
        futures::future::try_join_all(multiorch),
        futures::future::try_join_all(pools),
        primary,
    )?;
    let templates_changed = pools.iter().any(|(written, ..)| *written);
    let mut applied = Applied {
        templates_changed,
        held: Vec::new(),
        downs: Vec::new(),
        cohort_holds: Vec::new(),
        moving: moving.into_iter().flatten().collect(),
    };
    for (_, held, down, cohort_hold) in pools {
        applied.held.extend(held);
        applied.downs.extend(down);
        applied.cohort_holds.extend(cohort_hold);
    }
    Ok(applied)
}

/// Grows pool and backup volumes to their requested sizes, and pool volumes past their
/// `autoGrow` threshold by its step.
async fn resize(
    ctx: &Ctx<Guard>,
    guard: &Guard,
    shard: &Shard,
    ns: &str,
    objects: &ShardObjects,
) -> Result<ResizeOutcome, Error> {
    let api = Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), ns);
    let status = shard.status.as_ref();
    let volumes = status.map(|s| s.volumes.as_slice()).unwrap_or_default();
    let stored = status.map(|s| s.conditions.as_slice()).unwrap_or_default();
    let mut outcome = ResizeOutcome::default();
    let mut groups = Vec::new();
    let mut auto_plans = Vec::new();
    for p in &objects.pools {
        let pvcs = ctx.stores.pvcs.state_filter(|pvc| {
            pvc.namespace().as_deref() == Some(ns)
                && p.selector
                    .iter()
                    .all(|(k, v)| pvc.labels().get(k) == Some(v))
        });
        let mut plan = storage::plan_resize(&p.storage_size, pvcs.iter().map(|p| &**p));
        if let Some(spec) = &p.auto_grow {
            match AutoGrow::of(spec) {
                Ok(auto) => {
                    // A claim auto-grown past the spec's size is no shrink, up to the ceiling.
                    plan.shrink_refused.retain(|s| {
                        storage::parse_bytes(&s.current).is_none_or(|b| b > auto.ceiling)
                    });
                    auto_plans.push(storage::plan_auto_grow(
                        &auto,
                        &spec.ceiling,
                        pvcs.iter().map(|p| &**p),
                        volumes,
                        &plan.grow,
                    ));
                }
                Err((field, why)) => outcome.extend(ResizeOutcome {
                    auto_grow: true,
                    auto_invalid: Some(format!("pools.{}.autoGrow.{field}: {why}", p.pool)),
                    ..Default::default()
                }),
            }
        }
        groups.push(plan);
    }
    if let (Some(pvc), Some(size)) = (&objects.backup, build::backup_size(&shard.spec)) {
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
    for plan in auto_plans {
        outcome.extend(
            storage::apply_auto_grow(NAME, &api, plan)
                .await
                .map_err(Error::Resize)?,
        );
    }
    storage::report(ctx, guard, &outcome, stored).await;
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
    let budget_names: BTreeSet<String> = pool_names
        .iter()
        .cloned()
        .chain(objects.primary_pdb.iter().map(ResourceExt::name_any))
        .chain(
            objects
                .multiorch
                .iter()
                .filter_map(|m| m.pdb.as_ref().map(ResourceExt::name_any)),
        )
        .collect();
    sync::prune(
        NAME,
        &Api::<PodDisruptionBudget>::namespaced(client.clone(), ns),
        &owned(&stores.pdbs, ns, uid),
        &budget_names,
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

/// Deletes the claims of scaled-away replicas of pools under `whenScaled: Delete`, each once
/// its pod is gone and out of the consensus cohort (see [`scale::scaled_away`]); whether some
/// wait for the cohort. A failed deletion is announced and retried at the next reconcile: it
/// holds back nothing else.
async fn delete_scaled_away_claims(
    ctx: &Ctx<Guard>,
    guard: &Guard,
    ns: &str,
    objects: &ShardObjects,
    observed: &Observed,
    pods: &[PodView],
    cohort: Option<&CohortStatus>,
) -> bool {
    let api = Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), ns);
    let mut waiting = false;
    for p in objects.pools.iter().filter(|p| p.delete_scaled_claims) {
        let name = p.statefulset.name_any();
        let Some(replicas) = observed
            .sets
            .get(&name)
            .and_then(|s| s.spec.as_ref()?.replicas)
        else {
            continue;
        };
        let templates: Vec<String> = p
            .statefulset
            .spec
            .iter()
            .flat_map(|s| s.volume_claim_templates.iter().flatten())
            .map(ResourceExt::name_any)
            .collect();
        let claims = ctx.stores.pvcs.state_filter(|pvc| {
            pvc.namespace().as_deref() == Some(ns)
                && p.selector
                    .iter()
                    .all(|(k, v)| pvc.labels().get(k) == Some(v))
        });
        let found = scale::scaled_away(
            &name,
            &templates,
            replicas,
            claims.iter().map(|c| &**c),
            pods,
            cohort,
        );
        waiting |= !found.waiting.is_empty();
        for (claim, pod) in &found.waiting {
            tracing::debug!(%claim, %pod, "keeping a scaled-away replica's claim while the cohort counts its pod");
        }
        for (claim, uid) in found.delete {
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: Some(uid),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            crate::sync::count(NAME, "PersistentVolumeClaim", "delete");
            let (type_, reason, note) = match api.delete(&claim, &params).await {
                Ok(_) => (
                    EventType::Normal,
                    "ScaledAwayVolumeDeleted",
                    format!(
                        "deleted PersistentVolumeClaim {claim} of a scaled-away replica of \
                         {name} (whenScaled: Delete): its pod is gone and out of the consensus \
                         cohort"
                    ),
                ),
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => continue,
                Err(error) => {
                    tracing::warn!(%claim, error = %ErrorChain(&error), "cannot delete a scaled-away replica's claim");
                    (
                        EventType::Warning,
                        "ScaledAwayVolumeNotDeleted",
                        format!(
                            "cannot delete PersistentVolumeClaim {claim} of a scaled-away \
                             replica of {name} (whenScaled: Delete): {error}; retried at the \
                             next reconcile"
                        ),
                    )
                }
            };
            ctx.kit.event(guard, type_, reason, note).await;
        }
    }
    waiting
}

/// Replaces the next quarantined pool pod (see [`quarantine`]), unless a pod template was just
/// written or a pod was just restarted: one disruption at a time.
async fn replace_quarantined(
    ctx: &Ctx<Guard>,
    guard: &Guard,
    shard: &Shard,
    ns: &str,
    objects: &ShardObjects,
    pods: &[PodView],
    restarting: bool,
) {
    let Some(status) = shard.status.as_ref() else {
        return;
    };
    let cached = ctx.stores.pods.state_filter(|p| {
        p.namespace().as_deref() == Some(ns) && pods.iter().any(|v| v.name == p.name_any())
    });
    let quarantined = quarantine::quarantined(&status.pod_roles, cached.iter().map(|p| &**p));
    if quarantined.is_empty() {
        return;
    }
    let plan = if restarting {
        quarantine::Plan::Deferred {
            pod: quarantined.iter().next().cloned().unwrap_or_default(),
            why: "a pool pod is being restarted or a new pod template applied".to_owned(),
        }
    } else {
        let cohort = status.cohort.is_some();
        quarantine::plan(
            pods,
            &quarantined,
            quarantine::backups_healthy(shard),
            cohort,
        )
    };
    let claims = match &plan {
        quarantine::Plan::Replace { pod, .. } => {
            let set = pods.iter().find(|v| &v.name == pod).map(|v| v.set.as_str());
            let templates: Vec<String> = objects
                .pools
                .iter()
                .filter(|p| Some(p.statefulset.name_any().as_str()) == set)
                .flat_map(|p| p.statefulset.spec.iter())
                .flat_map(|s| s.volume_claim_templates.iter().flatten())
                .map(ResourceExt::name_any)
                .collect();
            let pvcs = ctx
                .stores
                .pvcs
                .state_filter(|c| c.namespace().as_deref() == Some(ns));
            quarantine::claims_of(pod, &templates, pvcs.iter().map(|c| &**c))
        }
        _ => BTreeMap::new(),
    };
    quarantine::replace(ctx, guard, ns, &plan, &claims).await;
}

/// The pool StatefulSets as the ordered restart sees them.
fn set_views(objects: &ShardObjects, observed: &Observed) -> Vec<rollout::SetView> {
    objects
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
        .collect()
}

/// What restarting the outdated pool pods changes, read while a restart waits for a release or
/// runs (see [`template_changes`]); `None` otherwise or while a revision cannot be read.
async fn restart_changes(
    ctx: &Ctx<Guard>,
    ns: &str,
    sets: &[rollout::SetView],
    pods: &[PodView],
    step: &Step,
) -> Option<String> {
    let pending = matches!(
        step,
        Step::Restart { .. }
            | Step::Wait {
                wait: Wait::Release { .. },
                ..
            }
    );
    if !pending {
        return None;
    }
    let api = Api::namespaced(ctx.client.clone(), ns);
    template_changes::read(&api, &ctx.revisions, ns, sets, pods).await
}

/// Says once, with an event, that a restart waits for a release and what it will change: the
/// first time the Shard's `status.pendingRestart` would name these revisions.
async fn announce_pending(
    ctx: &Ctx<Guard>,
    guard: &Guard,
    shard: &Shard,
    step: &Step,
    changes: Option<&str>,
) {
    let Step::Wait {
        wait: Wait::Release { pending },
        outdated,
        ..
    } = step
    else {
        return;
    };
    let announced = shard
        .status
        .as_ref()
        .and_then(|s| s.pending_restart.as_deref());
    if announced == Some(pending.as_str()) {
        return;
    }
    let note = format!(
        "{outdated} pool pod(s) will restart, one at a time with the primary last, once \
         released: {}; run `kubectl multigres restart <cluster>` or annotate this Shard with \
         multigres.com/release-restarts={pending}",
        changes.map_or_else(
            || "the pod template changed".to_owned(),
            |c| format!("what changes: {c}")
        )
    );
    ctx.kit
        .event(guard, EventType::Normal, "RestartPending", note)
        .await;
}

/// Carries out a [`Step::Restart`]: deletes the pod (if it is still the one planned) so its
/// StatefulSet recreates it from the current template.
async fn restart(
    ctx: &Ctx<Guard>,
    guard: &Guard,
    ns: &str,
    step: &Step,
    changes: Option<&str>,
) -> Result<(), Error> {
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
        "restarting pod {pod} ({which}) to apply the new pod template{}; {outdated} of {total} \
         pods were outdated",
        changes.map_or_else(String::new, |c| format!(" ({c})"))
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
    ctx.kit
        .event_about(
            guard,
            Some(related),
            EventType::Normal,
            "RestartingPod",
            note,
        )
        .await;
    Ok(())
}
