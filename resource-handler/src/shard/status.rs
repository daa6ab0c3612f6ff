//! A Shard's status: why its objects cannot be built, or how its workloads, restart,
//! volumes, TLS and postgresql.conf stand once applied; and when to look again.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};
use multigres_api::v1alpha1::{PRIMARY_SERVING, Phase, Shard, ShardStatus};
use multigres_common::status_pacer;

use super::apply::Outcome;
use super::build::{self, ShardObjects};
use super::rollout::{self, PodView, Step, Wait};
use super::scale::{self, HeldScaleUp};
use super::{
    Desired, Error, Guard, NAME, ROLLING_UPDATE, Rejected, labelled_for, pgconfig, switchover,
};
use super::{recovery, repository};
use crate::conditions::{
    AVAILABLE, Computed, FALSE, NODES_NOT_REPORTING, TRUE, merge, phase, with_lost_pods,
};
use crate::controller::{Ctx, POLL};
use crate::readiness::Counts;
use crate::storage::{STORAGE_SYNCED, VOLUME_AUTO_GROW};
use crate::sync;
use crate::unready;

/// Writes why the Shard's objects cannot be built, before the error is returned: a problem
/// only a change can fix makes the phase Degraded, which is news (never deferred). A failed
/// read of the referenced ConfigMap is transient and writes nothing.
pub(super) async fn reject(
    ctx: &Ctx<Guard>,
    shard: &Shard,
    ns: &str,
    rejected: &Rejected,
) -> Result<(), Error> {
    let previous = shard
        .status
        .as_ref()
        .and_then(|s| s.postgres_config.as_ref());
    let (problem, postgres_config) = match rejected {
        Rejected::Spec(problem) => (problem.to_string(), previous.cloned()),
        Rejected::PostgresConfig(error) if error.is_invalid_spec() => {
            (error.to_string(), Some(pgconfig::failed(previous, error)))
        }
        Rejected::PostgresConfig(_) => return Ok(()),
    };
    let report = Report {
        problem: Some(&problem),
        ..Report::default()
    };
    let mut desired = status(shard, &report, Timestamp::now());
    desired.postgres_config = postgres_config;
    let api: Api<Shard> = Api::namespaced(ctx.client.clone(), ns);
    let stored = shard.status.as_ref();
    sync::ensure_status(NAME, &api, shard, &desired, stored, &ctx.pacer).await?;
    Ok(())
}

/// Writes the status as applying left the shard (`pods` its pool pods as read before), and
/// says when to look again.
pub(super) async fn write(
    ctx: &Ctx<Guard>,
    shard: &Shard,
    ns: &str,
    desired: &Desired,
    pods: &[PodView],
    (outcome, once): (Outcome, Vec<Computed>),
) -> Result<Action, Error> {
    let objects = &desired.objects;
    let held_as_applied = outcome.paused || outcome.hibernating.is_some();
    let (pools, orchs) = outcome.observed.counts(objects, held_as_applied);
    // The pool pods as this reconcile's writes and restarts left them, read once for the
    // status.
    let cached = ctx
        .stores
        .pods
        .state_filter(|pod| pod.namespace().as_deref() == Some(ns) && labelled_for(pod, shard));
    let report = Report {
        pools,
        orchs,
        pool_pods: current_pool_pods(objects, pods),
        rollout: outcome.step.clone(),
        restart_changes: outcome.restart_changes.clone(),
        storage: (!outcome.paused).then(|| outcome.resize.condition()),
        auto_grow: (!outcome.paused)
            .then(|| outcome.resize.auto_grow_condition())
            .flatten(),
        pgbackrest_tls: outcome.tls,
        switchover: switchover::condition(outcome.step.as_ref(), &outcome.downs, &outcome.requests),
        held: outcome.held,
        scale_down: scale::condition(&outcome.cohort_holds),
        drain: outcome.drain,
        claims_waiting: outcome.claims_waiting,
        unready: unready_pool_pods(&cached),
        silent_nodes: cached
            .iter()
            .filter_map(|pod| unready::node_not_reporting(pod).map(str::to_owned))
            .collect(),
        problem: None,
        paused: outcome.paused,
        hibernating: outcome.hibernating,
        once,
    };
    let now = Timestamp::now();
    let mut written = status(shard, &report, now);
    let previous = shard
        .status
        .as_ref()
        .and_then(|s| s.postgres_config.as_ref());
    written.postgres_config = Some(pgconfig::progress(
        previous,
        &desired.postgres_config.1,
        objects,
        cached.iter().map(|p| &**p),
        now,
    ));
    let api: Api<Shard> = Api::namespaced(ctx.client.clone(), ns);
    let stored = shard.status.as_ref();
    let deferred = sync::ensure_status(NAME, &api, shard, &written, stored, &ctx.pacer).await?;
    Ok(status_pacer::action(look_again(&report), deferred))
}

/// When to look again though no watched object changes (`None`: only on a change).
fn look_again(report: &Report<'_>) -> Option<Duration> {
    // A shard whose pods run already while its backup repository is not marked yet: as in
    // `waiting`, the kube-system UID the marker needs may have been unreadable.
    if report.once.iter().any(|c| !c.is_true()) {
        return Some(POLL);
    }
    if let Some(running) = report.hibernating {
        // Pods stopping are watched, but a Deployment's count is read from its status.
        return (running > 0).then_some(POLL);
    }
    let tls = report.pgbackrest_tls.as_ref();
    match report.rollout {
        // A user's Secret that is missing or incomplete is looked at again (it is not watched).
        Some(Step::UpToDate { .. }) if tls.is_some_and(|c| !c.is_true()) => {
            Some(crate::tls::RECHECK)
        }
        // A scale-up held for a leaving volume: its deletion is watched, but the shared watch
        // looks each changed claim up in the cache, and a claim deleted by then is not passed
        // on (seen in data_safety: the scale-up waited for good). Look again soon.
        Some(Step::UpToDate { .. }) if !report.held.is_empty() => Some(POLL),
        // A scale-down waits for the cohort, which the data-handler publishes on its own pace.
        Some(Step::UpToDate { .. }) if report.scale_down.is_some() => Some(POLL),
        // So do a drain and a scaled-away replica's claim that wait for it.
        Some(Step::UpToDate { .. }) if report.drain.is_some() || report.claims_waiting => {
            Some(POLL)
        }
        Some(Step::UpToDate { .. }) => None,
        // A restart is under way (or about to be decided once the StatefulSet controller has
        // caught up): look again soon even if no watched object changes.
        _ => Some(POLL),
    }
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
    /// What the restart changes, while one waits for a release or runs.
    pub restart_changes: Option<String>,
    /// The `StorageSynced` verdict.
    pub storage: Option<Computed>,
    /// The `VolumeAutoGrow` verdict (none without `autoGrow`, or while paused).
    pub auto_grow: Option<Computed>,
    /// The pgBackRest TLS verdict (none without backups).
    pub pgbackrest_tls: Option<Computed>,
    /// The `Switchover` verdict (none while no primary is about to go).
    pub switchover: Option<Computed>,
    /// Pool scale-ups waiting for volumes of scaled-away replicas to go.
    pub held: Vec<HeldScaleUp>,
    /// The `ScaleDown` verdict (none while no scale-down waits for the cohort).
    pub scale_down: Option<Computed>,
    /// The `Drain` verdict (none while no pool pod is on a cordoned node).
    pub drain: Option<Computed>,
    /// Claims of scaled-away replicas wait for the cohort to drop their pods.
    pub claims_waiting: bool,
    /// Pool pods that are not Ready, each with why (`<pod>: <reason>`, by name).
    pub unready: Vec<String>,
    /// Nodes of pool pods that stopped reporting (see [`unready::node_not_reporting`]): the
    /// shard has lost pods it had, which is Degraded, not Progressing.
    pub silent_nodes: BTreeSet<String>,
    /// Why the spec cannot be realised.
    pub problem: Option<&'a str>,
    /// The cluster is paused: nothing was applied, and the verdicts of what was not looked at
    /// (volumes, pgBackRest TLS) stay as they were.
    pub paused: bool,
    /// The cluster hibernates, with this many of the shard's pods still there.
    pub hibernating: Option<i32>,
    /// The verdicts of the steps run once before the pool pods start ([`once`]) reached by
    /// this reconcile.
    pub once: Vec<Computed>,
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

/// The `RollingUpdate` condition for the restart's step, saying what the restart changes
/// (`changes`) while it waits for a release or runs.
fn rolling_condition(step: Option<&Step>, changes: Option<&str>) -> Computed {
    let mut condition = rolling_step_condition(step);
    if let (Some(changes), "Restarting" | "WaitingForRelease") = (changes, condition.reason) {
        condition.message = format!("{}; what changes: {changes}", condition.message);
    }
    condition
}

/// The `RollingUpdate` condition for the restart's step alone.
fn rolling_step_condition(step: Option<&Step>) -> Computed {
    match step {
        None => Computed::new(
            ROLLING_UPDATE,
            TRUE,
            "TemplateChanged",
            "a new pod template was applied; waiting for the StatefulSet controller",
        ),
        Some(Step::UpToDate { pods }) => Computed::new(
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
        }) => Computed::new(
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
        }) => Computed::new(
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

/// The data-handler's `PrimaryServing` among `observed`, when `False`: the primary's
/// PostgreSQL refuses client connections, which no readiness, role or cohort shows.
fn refusing(observed: &[Condition]) -> Option<&Condition> {
    observed
        .iter()
        .find(|c| c.type_ == PRIMARY_SERVING && c.status == FALSE)
}

/// `message` led by why the primary refuses connections, when it does.
fn with_refusal(refusal: Option<&Condition>, message: String) -> String {
    match refusal {
        Some(c) => format!(
            "the primary refuses connections ({PRIMARY_SERVING} {}): {}; {message}",
            c.reason, c.message
        ),
        None => message,
    }
}

/// The status fields and conditions this handler owns on a Shard.
///
/// `Available` means the shard serves SQL: every pool pod and every cell's multiorch is
/// Ready, and a current pool pod is the primary (see [`known_primary`]). With everything
/// Ready but no primary known, `Available` is False with reason `NoPrimary` and the phase
/// stays Progressing: multiorch elects one within seconds of PostgreSQL running. While the
/// data-handler's `PrimaryServing` is False the phase is Degraded, with its message first, so
/// the TableGroup and the MultigresCluster are Degraded too, saying why.
pub fn status(shard: &Shard, report: &Report<'_>, now: Timestamp) -> ShardStatus {
    if let Some(running) = report.hibernating {
        return hibernating(shard, report, running, now);
    }
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
                Computed::new(AVAILABLE, TRUE, "AllReady", message.clone())
            }
            Err(none) => {
                message = format!("{message}; {none}");
                Computed::new(AVAILABLE, FALSE, "NoPrimary", message.clone())
            }
        }
    } else if !report.held.is_empty() {
        let held: Vec<String> = report.held.iter().map(HeldScaleUp::message).collect();
        let message = format!("{message}; {}", held.join("; "));
        Computed::new(AVAILABLE, FALSE, "WaitingForVolumeDeletion", message)
    } else {
        let message = match unready_summary(&report.unready) {
            Some(listed) => format!("{message}; not ready: {listed}"),
            None => message.clone(),
        };
        let reason = if report.silent_nodes.is_empty() {
            "NotReady"
        } else {
            NODES_NOT_REPORTING
        };
        Computed::new(AVAILABLE, FALSE, reason, message)
    };
    let rolling = rolling_condition(report.rollout.as_ref(), report.restart_changes.as_deref());
    let handing_over = report.switchover.as_ref().is_some_and(Computed::is_true);
    let healthy =
        available.is_true() && !rolling.is_true() && !handing_over && report.scale_down.is_none();
    let mut desired = vec![available, rolling];
    desired.extend(report.storage.clone());
    desired.extend(report.auto_grow.clone());
    desired.extend(report.pgbackrest_tls.clone());
    desired.extend(report.switchover.clone());
    desired.extend(report.scale_down.clone());
    desired.extend(report.drain.clone());
    desired.extend(report.paused.then(|| crate::conditions::paused("shard")));
    desired.extend(once(shard, &report.once));
    let observed = shard
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let refusal = refusing(observed);
    let generation = shard.metadata.generation;
    let mut conditions = merge(observed, &desired, generation, now);
    let kept = |type_: &str| {
        ((type_ == STORAGE_SYNCED || type_ == VOLUME_AUTO_GROW) && report.paused)
            || (type_ == STORAGE_SYNCED && report.storage.is_none())
            || (type_ == crate::tls::PGBACKREST_TLS && report.paused)
    };
    conditions.extend(observed.iter().filter(|c| kept(&c.type_)).cloned());
    ShardStatus {
        observed_generation: generation,
        conditions,
        phase: Some(match refusal {
            Some(_) => Phase::Degraded,
            None => phase(healthy, report.problem, &report.silent_nodes),
        }),
        message: Some(match report.problem {
            Some(problem) => problem.to_owned(),
            None => with_refusal(
                refusal,
                with_lost_pods("pool pods", &report.silent_nodes, message),
            ),
        }),
        cells: build::pool_cells(&shard.spec),
        orch_ready: Some(orch_ready),
        pools_ready: Some(pools_ready),
        ready_replicas: Some(pool_ready),
        pending_restart: match &report.rollout {
            Some(Step::Wait {
                wait: Wait::Release { pending },
                ..
            }) => Some(pending.clone()),
            _ => None,
        },
        ..Default::default()
    }
}

/// The conditions of the steps run once before a shard's pool pods start (marking its backup
/// repository as its cluster's, recovering another cluster's data): those `reached` by this
/// reconcile, else the ones stored True, which every status keeps so neither step runs again.
fn once(shard: &Shard, reached: &[Computed]) -> Vec<Computed> {
    let mut all = reached.to_vec();
    for kept in [repository::done(shard), recovery::done(shard)]
        .into_iter()
        .flatten()
    {
        if all.iter().all(|c| c.type_ != kept.type_) {
            all.push(kept);
        }
    }
    all
}

/// Writes the status of a shard whose pool pods wait for a step run once before they start
/// (`verdict`, not True): not Available, with the step's message; Degraded once it `failed`.
/// A Job's changes wake the shard; it is also looked at again every [`POLL`], for what no watch
/// reports (the kube-system UID the marker needs, when it could not be read).
pub(super) async fn waiting(
    ctx: &Ctx<Guard>,
    shard: &Shard,
    ns: &str,
    verdict: Computed,
    failed: bool,
) -> Result<Action, Error> {
    let desired = waiting_status(shard, verdict, failed, Timestamp::now());
    let api: Api<Shard> = Api::namespaced(ctx.client.clone(), ns);
    let deferred = sync::ensure_status(
        NAME,
        &api,
        shard,
        &desired,
        shard.status.as_ref(),
        &ctx.pacer,
    )
    .await?;
    Ok(status_pacer::action(Some(POLL), deferred))
}

fn waiting_status(shard: &Shard, verdict: Computed, failed: bool, now: Timestamp) -> ShardStatus {
    let phase = if failed {
        Phase::Degraded
    } else {
        Phase::Progressing
    };
    let available = Computed::new(AVAILABLE, FALSE, verdict.reason, verdict.message.clone());
    let message = verdict.message.clone();
    let mut desired = vec![available];
    desired.extend(once(shard, &[verdict]));
    without_pods(shard, &desired, (phase, message), now)
}

/// The status of a hibernating shard with `running` of its pods still there: not Available,
/// and Hibernated once none is. The verdicts of what hibernation does not do (a restart, a
/// hand-over, a scale-down, a drain, a volume's growth) are dropped; they come back on waking.
fn hibernating(shard: &Shard, report: &Report<'_>, running: i32, now: Timestamp) -> ShardStatus {
    let (hibernated, phase) = crate::conditions::hibernation("shard", running);
    let available = Computed::new(
        AVAILABLE,
        FALSE,
        hibernated.reason,
        hibernated.message.clone(),
    );
    let message = hibernated.message.clone();
    let mut desired = vec![available, hibernated];
    desired.extend(report.pgbackrest_tls.clone());
    desired.extend(once(shard, &[]));
    let mut status = without_pods(shard, &desired, (phase, message), now);
    status.ready_replicas = Some(report.pools.iter().map(|c| c.ready).sum());
    status
}

/// The status of a shard whose pool pods are not meant to serve (hibernating, or waiting for
/// its recovery): only `desired` conditions, nothing ready.
fn without_pods(
    shard: &Shard,
    desired: &[Computed],
    (phase, message): (Phase, String),
    now: Timestamp,
) -> ShardStatus {
    let observed = shard
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let generation = shard.metadata.generation;
    ShardStatus {
        observed_generation: generation,
        conditions: merge(observed, desired, generation, now),
        phase: Some(phase),
        message: Some(message),
        cells: build::pool_cells(&shard.spec),
        orch_ready: Some(false),
        pools_ready: Some(false),
        ready_replicas: Some(0),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;
    use crate::shard::scale::{self, ScaleDown};
    use multigres_api::v1alpha1::BACKUP_REPOSITORY;
    use rollout::Wait;

    fn shard() -> Shard {
        serde_yaml::from_str(include_str!("../../fixtures/shard.yaml")).unwrap()
    }

    fn counts(desired: i32, ready: i32) -> Counts {
        Counts {
            desired,
            ready,
            observed: true,
            running: ready,
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
    fn pool_pods_lost_with_their_node_make_the_shard_degraded() {
        let report = Report {
            pools: vec![counts(1, 1), counts(1, 0), counts(1, 1)],
            orchs: vec![counts(1, 1), counts(1, 0), counts(1, 1)],
            unready: vec!["pool-main-z2-0: its node node-b stopped reporting".into()],
            silent_nodes: BTreeSet::from(["node-b".to_owned()]),
            ..Report::default()
        };
        let st = status(&shard(), &report, Timestamp::from_second(1).unwrap());
        assert_eq!(st.phase, Some(Phase::Degraded));
        assert_eq!(available_of(&st).reason, NODES_NOT_REPORTING);
        assert_eq!(
            st.message.as_deref(),
            Some(
                "pool pods lost with their nodes, which stopped reporting: node-b; pool pods 2/3 \
                 ready; multiorch ready in 2/3 cells"
            )
        );
    }

    #[test]
    fn a_primary_refusing_connections_makes_the_shard_degraded_saying_why() {
        let report = Report {
            pools: vec![counts(3, 3)],
            orchs: vec![counts(1, 1)],
            pool_pods: pods(3),
            rollout: Some(Step::UpToDate { pods: 3 }),
            ..Report::default()
        };
        let elected = with_roles(shard(), &[("zone-a-0", "PRIMARY")]);
        let now = Timestamp::from_second(1).unwrap();
        let st = status(&elected, &report, now);
        assert_eq!(st.phase, Some(Phase::Healthy));
        let serving = |status: &str| Condition {
            type_: PRIMARY_SERVING.into(),
            status: status.into(),
            reason: if status == FALSE {
                "ConnectionSlotsExhausted"
            } else {
                "PrimaryAcceptsConnections"
            }
            .into(),
            message: "primary p-0 refuses connections: every connection slot is taken".into(),
            observed_generation: Some(3),
            last_transition_time: Time(now),
        };
        let mut refused = elected.clone();
        let stored = refused.status.as_mut().unwrap();
        stored.conditions.push(serving(FALSE));
        let st = status(&refused, &report, now);
        assert_eq!(st.phase, Some(Phase::Degraded));
        assert_eq!(
            available_of(&st).status,
            TRUE,
            "the pods serve; their primary refuses"
        );
        assert!(
            st.message.as_deref().unwrap().starts_with(
                "the primary refuses connections (PrimaryServing ConnectionSlotsExhausted): \
                 primary p-0 refuses connections: every connection slot is taken; pool pods 3/3"
            ),
            "{:?}",
            st.message
        );
        assert!(
            !st.conditions.iter().any(|c| c.type_ == PRIMARY_SERVING),
            "the condition stays the data-handler's"
        );
        let mut accepting = elected.clone();
        let stored = accepting.status.as_mut().unwrap();
        stored.conditions.push(serving(TRUE));
        assert_eq!(status(&accepting, &report, now).phase, Some(Phase::Healthy));
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
    fn steps_run_once_stay_in_every_status_so_they_never_run_again() {
        let now = Timestamp::from_second(9).unwrap();
        let mut recovered = shard();
        recovered.spec.backup = Some(
            serde_yaml::from_str(
                "{type: s3, s3: {bucket: b, region: r, keyPrefix: new}, \
                 recovery: {source: {bucket: b, region: r, keyPrefix: old}}}",
            )
            .unwrap(),
        );
        let succeeded: k8s_openapi::api::batch::v1::Job =
            serde_yaml::from_str("metadata: {name: j}\nstatus: {succeeded: 1}").unwrap();
        let own = repository::own(&recovered.spec).unwrap();
        let marked = repository::verdict(own, &succeeded, None).message;
        recovered.status = Some(
            serde_json::from_value(serde_json::json!({"conditions": [
                {"type": "Recovery", "status": "True", "reason": "Restored", "message": "m",
                 "lastTransitionTime": "1970-01-01T00:00:01Z"},
                {"type": "BackupRepository", "status": "True", "reason": "Marked",
                 "message": marked, "lastTransitionTime": "1970-01-01T00:00:01Z"},
            ]}))
            .unwrap(),
        );
        let kept = |st: &ShardStatus, type_: &str| {
            st.conditions
                .iter()
                .find(|c| c.type_ == type_)
                .map(|c| (c.status.clone(), c.message.clone()))
        };
        let serving = Report {
            pools: vec![counts(1, 1)],
            orchs: vec![counts(1, 1)],
            ..Default::default()
        };
        let hibernated = Report {
            hibernating: Some(0),
            ..Default::default()
        };
        let refused = Report {
            problem: Some("spec.pools is empty"),
            ..Default::default()
        };
        for report in [serving, hibernated, refused] {
            let st = status(&recovered, &report, now);
            assert_eq!(
                kept(&st, recovery::RECOVERY),
                Some((TRUE.to_owned(), "m".to_owned())),
                "{report:?}"
            );
            assert_eq!(
                kept(&st, BACKUP_REPOSITORY),
                Some((TRUE.to_owned(), marked.clone())),
                "{report:?}"
            );
        }
        let failed = Computed::new(recovery::RECOVERY, FALSE, recovery::FAILED, "no backup");
        let st = waiting_status(&recovered, failed, true, now);
        assert_eq!(st.phase, Some(Phase::Degraded));
        assert_eq!(available_of(&st).reason, recovery::FAILED);
        assert_eq!(
            kept(&st, BACKUP_REPOSITORY),
            Some((TRUE.to_owned(), marked.clone()))
        );
        let marking = Computed::new(BACKUP_REPOSITORY, FALSE, "Marking", "Job j marks");
        let st = waiting_status(&shard(), marking, false, now);
        assert_eq!(st.phase, Some(Phase::Progressing));
        assert_eq!(available_of(&st).reason, "Marking");
    }

    #[test]
    fn a_hibernating_shard_is_hibernated_once_its_pods_are_gone() {
        let now = Timestamp::from_second(9).unwrap();
        let stopping = Report {
            pools: vec![counts(0, 1)],
            orchs: vec![counts(0, 0)],
            hibernating: Some(2),
            ..Default::default()
        };
        let st = status(&shard(), &stopping, now);
        assert_eq!(st.phase, Some(Phase::Progressing));
        let available = available_of(&st);
        assert_eq!(
            (available.status.as_str(), available.reason.as_str()),
            (FALSE, "Hibernating")
        );
        assert_eq!(look_again(&stopping), Some(POLL));
        let stopped = Report {
            pools: vec![counts(0, 0)],
            hibernating: Some(0),
            ..stopping
        };
        let st = status(&shard(), &stopped, now);
        assert_eq!(st.phase, Some(Phase::Hibernated));
        let types: Vec<&str> = st.conditions.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(
            types,
            [AVAILABLE, "Hibernated"],
            "no restart or hand-over verdict"
        );
        assert!(st.message.unwrap().contains("kubectl multigres wake"));
        assert_eq!(look_again(&stopped), None);
    }

    #[test]
    fn a_paused_shard_says_so_and_keeps_the_verdicts_it_did_not_look_at() {
        let now = Timestamp::from_second(9).unwrap();
        let mut s = shard();
        let stored = |type_: &str, reason: &str| Condition {
            type_: type_.into(),
            status: TRUE.into(),
            reason: reason.into(),
            message: "as it was".into(),
            observed_generation: Some(1),
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now),
        };
        s.status = Some(ShardStatus {
            conditions: vec![
                stored(STORAGE_SYNCED, "UpToDate"),
                stored(crate::tls::PGBACKREST_TLS, "Ready"),
            ],
            ..Default::default()
        });
        let report = Report {
            pools: vec![counts(3, 3)],
            orchs: vec![counts(1, 1)],
            rollout: Some(Step::UpToDate { pods: 3 }),
            paused: true,
            ..Default::default()
        };
        let st = status(&s, &report, now);
        let types: Vec<&str> = st.conditions.iter().map(|c| c.type_.as_str()).collect();
        for kept in [STORAGE_SYNCED, crate::tls::PGBACKREST_TLS, "Paused"] {
            assert!(types.contains(&kept), "{kept} in {types:?}");
        }
        let paused = st.conditions.iter().find(|c| c.type_ == "Paused").unwrap();
        assert_eq!(paused.reason, "PausedByAnnotation");
        // Resumed: the condition goes.
        let resumed = status(
            &s,
            &Report {
                paused: false,
                ..report
            },
            now,
        );
        assert!(resumed.conditions.iter().all(|c| c.type_ != "Paused"));
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
            restart_changes: None,
            storage: None,
            auto_grow: None,
            pgbackrest_tls: None,
            switchover: None,
            held: Vec::new(),
            scale_down: None,
            drain: None,
            claims_waiting: false,
            unready: Vec::new(),
            silent_nodes: BTreeSet::new(),
            problem: None,
            paused: false,
            hibernating: None,
            once: Vec::new(),
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
        let restart = rolling_condition(
            Some(&Step::Restart {
                pod: "p-1".into(),
                uid: "u".into(),
                primary: false,
                outdated: 3,
                total: 4,
            }),
            None,
        );
        assert_eq!((restart.status, restart.reason), (TRUE, "Restarting"));
        assert_eq!(
            restart.message,
            "restarting replica p-1; 1 of 4 pods updated"
        );
        let wait = rolling_condition(
            Some(&Step::Wait {
                wait: Wait::RolesUnknown,
                outdated: 4,
                total: 4,
            }),
            None,
        );
        assert_eq!(wait.reason, "WaitingForRoles");
        assert!(wait.message.contains("no pod is known to be the primary"));
        let primary = rolling_condition(
            Some(&Step::Restart {
                pod: "p-0".into(),
                uid: "u".into(),
                primary: true,
                outdated: 1,
                total: 4,
            }),
            None,
        );
        assert_eq!(
            primary.message,
            "restarting the primary p-0 without a switchover; 3 of 4 pods updated"
        );
        let handover = rolling_condition(
            Some(&Step::Wait {
                wait: Wait::Switchover("p-0".into()),
                outdated: 1,
                total: 4,
            }),
            None,
        );
        assert_eq!(
            (handover.reason, handover.message.as_str()),
            (
                "WaitingForSwitchover",
                "waiting for the primary p-0 to hand over to a replica before its restart; 3 \
                 of 4 pods updated"
            )
        );
        let done = rolling_condition(Some(&Step::UpToDate { pods: 4 }), None);
        assert_eq!((done.status, done.reason), (FALSE, "UpToDate"));
        let changes = Some("multipooler image multigres:1 -> multigres:2");
        let released = rolling_condition(
            Some(&Step::Wait {
                wait: Wait::Release {
                    pending: "pool-a-v2".into(),
                },
                outdated: 2,
                total: 2,
            }),
            changes,
        );
        assert!(
            released
                .message
                .ends_with("; what changes: multipooler image multigres:1 -> multigres:2"),
            "{}",
            released.message
        );
        let roles = rolling_condition(
            Some(&Step::Wait {
                wait: Wait::RolesUnknown,
                outdated: 2,
                total: 2,
            }),
            changes,
        );
        assert!(
            !roles.message.contains("what changes"),
            "only a release wait or a restart says it"
        );
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
            switchover: switchover::condition(None, &[down], &Default::default()),
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
}
