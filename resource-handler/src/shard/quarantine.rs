//! Replacing a pool pod whose multipooler quarantined itself. A multipooler whose PostgreSQL
//! keeps failing to start, rewind or restore for longer than `--postgres-unrecoverable-timeout`
//! marks its own topology record `LIFECYCLE_QUARANTINED`, leaves the consensus cohort and stops
//! restarting PostgreSQL (Multigres `go/services/multipooler/internal/manager/quarantine.go`);
//! the data-handler publishes the pod's role as `QUARANTINED`. Its data directory cannot serve
//! again, so the handler deletes the pod's claims and then the pod: the StatefulSet makes both
//! again, and the new pod's multipooler restores the newest backup and streams from the primary.
//!
//! The gates, checked from the caches: one pod at a time; only a pod both the Shard status and
//! the pod's own `multigres.com/role` label call quarantined (so never the primary, and never
//! the new pod of the same name, which carries no role label until the data-handler has read
//! its own pooler's record); only while every other pool pod of the shard is Ready
//! and, once the cohort is published, a cohort member (the shard can spare nothing else while the
//! volume is rebuilt); and only while `BackupHealthy` is `True` (the new pod restores from a
//! backup, and without one it could not start). Deciding is pure ([`plan`]); [`replace`] writes.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolumeClaim, Pod};
use kube::api::{DeleteParams, Preconditions};
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};
use multigres_api::labels::ROLE;
use multigres_api::v1alpha1::{POD_ROLE_QUARANTINED, Shard};

use super::build::ShardObjects;
use super::rollout::PodView;
use super::{Guard, NAME};
use crate::controller::Ctx;

/// The condition type the data-handler reports backups with.
const BACKUP_HEALTHY: &str = "BackupHealthy";

/// `--postgres-unrecoverable-timeout` of every multipooler when the handler is not told
/// otherwise: Multigres' suggestion (`go/services/multipooler/init.go:44-50`), long enough for a
/// transient fault to heal first.
pub const DEFAULT_UNRECOVERABLE_TIMEOUT: Duration = Duration::from_secs(300);

/// The multipooler flag that lets a pooler quarantine itself; `0s` disables quarantine, and with
/// it the replacement.
pub fn unrecoverable_timeout_flag(timeout: Duration) -> String {
    format!("--postgres-unrecoverable-timeout={}s", timeout.as_secs())
}

/// Gives the multipooler of every pool of `objects` the quarantine flag: an operator setting,
/// not a field of the spec.
pub fn add_to_shard(objects: &mut ShardObjects, timeout: Duration) {
    let containers = objects
        .pools
        .iter_mut()
        .filter_map(|p| p.statefulset.spec.as_mut()?.template.spec.as_mut())
        .flat_map(|pod| pod.containers.iter_mut())
        .filter(|c| c.name == "multipooler");
    for container in containers {
        container
            .args
            .get_or_insert_with(Vec::new)
            .push(unrecoverable_timeout_flag(timeout));
    }
}

/// What to do about quarantined pool pods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// No pod is quarantined.
    Nothing,
    /// Delete the claims of `pod`, then the pod (if it is still `uid`).
    Replace { pod: String, uid: String },
    /// `pod` is quarantined and waits: `why`.
    Deferred { pod: String, why: String },
}

/// The pods of `pods` (pool pods as cached) that the Shard's published `roles` and their own
/// role label both call quarantined.
pub fn quarantined<'a>(
    roles: &BTreeMap<String, String>,
    pods: impl IntoIterator<Item = &'a Pod>,
) -> BTreeSet<String> {
    let label = POD_ROLE_QUARANTINED.to_ascii_lowercase();
    pods.into_iter()
        .filter(|p| p.labels().get(ROLE) == Some(&label))
        .map(ResourceExt::name_any)
        .filter(|name| roles.get(name).map(String::as_str) == Some(POD_ROLE_QUARANTINED))
        .collect()
}

/// The next step for the `quarantined` pods among `pods`, given whether backups are healthy and
/// whether the cohort is published.
pub fn plan(
    pods: &[PodView],
    quarantined: &BTreeSet<String>,
    backups_healthy: bool,
    cohort_published: bool,
) -> Plan {
    let mut sick: Vec<&PodView> = pods
        .iter()
        .filter(|p| quarantined.contains(&p.name))
        .collect();
    sick.sort_by(|a, b| a.name.cmp(&b.name));
    if let Some(going) = sick.iter().find(|p| p.terminating) {
        return Plan::Deferred {
            pod: going.name.clone(),
            why: format!("pod {} is being replaced", going.name),
        };
    }
    let Some(pod) = sick.first() else {
        return Plan::Nothing;
    };
    let deferred = |why: String| Plan::Deferred {
        pod: pod.name.clone(),
        why,
    };
    for other in pods.iter().filter(|p| p.name != pod.name) {
        if !other.ready || other.terminating {
            return deferred(format!("pod {} is not Ready", other.name));
        }
        if cohort_published && !other.in_cohort {
            return deferred(format!(
                "pod {} is not a healthy member of the consensus cohort",
                other.name
            ));
        }
    }
    if !backups_healthy {
        return deferred(format!(
            "{BACKUP_HEALTHY} is not True: the new pod would have no backup to restore from"
        ));
    }
    Plan::Replace {
        pod: pod.name.clone(),
        uid: pod.uid.clone(),
    }
}

/// Whether the Shard's `BackupHealthy` condition is `True`.
pub fn backups_healthy(shard: &Shard) -> bool {
    shard.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == BACKUP_HEALTHY && c.status == "True")
    })
}

/// Carries out `plan`: for [`Plan::Replace`], deletes the pod's claims (`claims`: name to UID,
/// each only if it is still that claim), then the pod (only if it is still the one planned), and
/// says so; for [`Plan::Deferred`], says what it waits for.
pub async fn replace(
    ctx: &Ctx<Guard>,
    guard: &Guard,
    ns: &str,
    plan: &Plan,
    claims: &BTreeMap<String, String>,
) {
    let (pod, uid) = match plan {
        Plan::Nothing => return,
        Plan::Deferred { pod, why } => {
            let note = format!(
                "pod {pod} is quarantined (its PostgreSQL cannot recover); its volume is \
                 replaced once nothing holds it back: {why}"
            );
            ctx.kit
                .event_about(
                    guard,
                    Some(pod_reference(ns, pod, None)),
                    EventType::Warning,
                    "QuarantinedPodWaiting",
                    note,
                )
                .await;
            return;
        }
        Plan::Replace { pod, uid } => (pod, uid),
    };
    let precondition = |uid: &str| DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.to_owned()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    let pvcs = Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), ns);
    for (claim, claim_uid) in claims {
        crate::sync::count(NAME, "PersistentVolumeClaim", "delete");
        match pvcs.delete(claim, &precondition(claim_uid)).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
            Err(error) => {
                let note = format!(
                    "cannot delete PersistentVolumeClaim {claim} of quarantined pod {pod}: \
                     {error}; retried at the next reconcile"
                );
                ctx.kit
                    .event(guard, EventType::Warning, "QuarantinedPodNotReplaced", note)
                    .await;
                return;
            }
        }
    }
    crate::sync::count(NAME, "Pod", "delete");
    let pods = Api::<Pod>::namespaced(ctx.client.clone(), ns);
    match pods.delete(pod, &precondition(uid)).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => return,
        Err(error) => {
            let note = format!(
                "cannot delete quarantined pod {pod}: {error}; retried at the next reconcile"
            );
            ctx.kit
                .event(guard, EventType::Warning, "QuarantinedPodNotReplaced", note)
                .await;
            return;
        }
    }
    let names: Vec<&str> = claims.keys().map(String::as_str).collect();
    let note = format!(
        "replacing quarantined pod {pod}: deleted its claims {names:?} and the pod; its \
         StatefulSet makes both again and the new pod restores the newest backup, then streams \
         from the primary"
    );
    tracing::warn!(%pod, claims = ?names, "replacing a quarantined pool pod");
    ctx.kit
        .event_about(
            guard,
            Some(pod_reference(ns, pod, Some(uid))),
            EventType::Warning,
            "ReplacingQuarantinedPod",
            note,
        )
        .await;
}

fn pod_reference(ns: &str, pod: &str, uid: Option<&str>) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".to_owned()),
        kind: Some("Pod".to_owned()),
        name: Some(pod.to_owned()),
        namespace: Some(ns.to_owned()),
        uid: uid.map(str::to_owned),
        ..Default::default()
    }
}

/// The claims of `pod` among `pvcs`: for each claim template of its StatefulSet,
/// `<template>-<pod>`, with its UID.
pub fn claims_of<'a>(
    pod: &str,
    templates: &[String],
    pvcs: impl IntoIterator<Item = &'a PersistentVolumeClaim>,
) -> BTreeMap<String, String> {
    let names: Vec<String> = templates.iter().map(|t| format!("{t}-{pod}")).collect();
    pvcs.into_iter()
        .filter(|c| names.contains(&c.name_any()))
        .filter_map(|c| Some((c.name_any(), c.uid()?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use kube::api::ObjectMeta;
    use multigres_api::v1alpha1::{POD_ROLE_PRIMARY, POD_ROLE_REPLICA};

    use super::*;
    use crate::shard::rollout::Role;

    fn shard_of(roles: &[(&str, &str)]) -> BTreeMap<String, String> {
        roles
            .iter()
            .map(|(p, r)| ((*p).to_owned(), (*r).to_owned()))
            .collect()
    }

    fn three() -> Vec<PodView> {
        let mut sick = PodView::ready("db-pool-2", Role::Unknown);
        sick.ready = false;
        sick.in_cohort = false;
        vec![
            PodView::ready("db-pool-0", Role::Primary),
            PodView::ready("db-pool-1", Role::Replica),
            sick,
        ]
    }

    fn roles() -> BTreeSet<String> {
        BTreeSet::from(["db-pool-2".to_owned()])
    }

    fn labelled(name: &str, role: Option<&str>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: role.map(|r| BTreeMap::from([(ROLE.to_owned(), r.to_owned())])),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        }
    }

    #[test]
    fn quarantined_takes_the_status_and_the_pods_own_label() {
        let published = shard_of(&[
            ("db-pool-0", POD_ROLE_PRIMARY),
            ("db-pool-1", POD_ROLE_REPLICA),
            ("db-pool-2", POD_ROLE_QUARANTINED),
            ("db-pool-3", POD_ROLE_QUARANTINED),
        ]);
        let pods = [
            labelled("db-pool-0", Some("primary")),
            labelled("db-pool-1", Some("quarantined")),
            labelled("db-pool-2", Some("quarantined")),
            // Recreated under the same name: no label of its own yet.
            labelled("db-pool-3", None),
        ];
        assert_eq!(
            quarantined(&published, &pods),
            BTreeSet::from(["db-pool-2".to_owned()])
        );
    }

    #[test]
    fn a_quarantined_replica_is_replaced_when_the_rest_is_whole_and_a_backup_exists() {
        assert_eq!(
            plan(&three(), &roles(), true, true),
            Plan::Replace {
                pod: "db-pool-2".into(),
                uid: "uid-db-pool-2".into()
            }
        );
    }

    #[test]
    fn nothing_quarantined_means_nothing_to_do() {
        assert_eq!(plan(&three(), &BTreeSet::new(), true, true), Plan::Nothing);
    }

    #[test]
    fn it_waits_for_every_other_pod_and_for_a_backup() {
        let mut pods = three();
        pods[1].ready = false;
        assert!(matches!(
            plan(&pods, &roles(), true, true),
            Plan::Deferred { ref pod, ref why } if pod == "db-pool-2" && why.contains("db-pool-1 is not Ready")
        ));

        let mut pods = three();
        pods[1].in_cohort = false;
        assert!(matches!(
            plan(&pods, &roles(), true, true),
            Plan::Deferred { ref why, .. } if why.contains("cohort")
        ));
        // Without a published cohort, readiness alone is the gate.
        assert!(matches!(
            plan(&pods, &roles(), true, false),
            Plan::Replace { .. }
        ));

        assert!(matches!(
            plan(&three(), &roles(), false, true),
            Plan::Deferred { ref why, .. } if why.contains("BackupHealthy")
        ));
    }

    #[test]
    fn one_at_a_time() {
        let mut pods = three();
        pods[2].terminating = true;
        let mut roles = roles();
        roles.insert("db-pool-1".into());
        assert!(matches!(
            plan(&pods, &roles, true, true),
            Plan::Deferred { ref pod, .. } if pod == "db-pool-2"
        ));
    }

    #[test]
    fn claims_are_the_pods_own_by_template() {
        let pvc = |name: &str| PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some(name.into()),
                uid: Some(format!("u-{name}")),
                ..ObjectMeta::default()
            },
            ..PersistentVolumeClaim::default()
        };
        let all = [
            pvc("data-db-pool-2"),
            pvc("data-db-pool-1"),
            pvc("backup-db"),
        ];
        assert_eq!(
            claims_of("db-pool-2", &["data".to_owned()], &all),
            BTreeMap::from([("data-db-pool-2".to_owned(), "u-data-db-pool-2".to_owned())])
        );
    }

    #[test]
    fn the_flag_is_in_whole_seconds() {
        assert_eq!(
            unrecoverable_timeout_flag(DEFAULT_UNRECOVERABLE_TIMEOUT),
            "--postgres-unrecoverable-timeout=300s"
        );
        assert_eq!(
            unrecoverable_timeout_flag(Duration::ZERO),
            "--postgres-unrecoverable-timeout=0s"
        );
    }
}
