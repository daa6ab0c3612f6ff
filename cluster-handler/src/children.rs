//! What both controllers do with their children: decide whether a cached child already matches
//! what would be applied (so an unchanged child costs no write), find the children an owner
//! controls, and read the health a child's own handler reported.

use std::fmt::Debug;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::{Resource, ResourceExt};
use multigres_api::v1alpha1::{
    Cell, CellSpec, Phase, Shard, ShardSpec, TableGroup, TableGroupSpec, TopoServer, TopoServerSpec,
};
use multigres_common::apply::Applicable;
use multigres_common::guard::Guarded;

use multigres_api::owner::INHERITED_ANNOTATIONS;

/// A child custom resource: applied whole by its owner's controller, status written by
/// another handler.
pub trait Child: Applicable {
    /// The spec type, compared to decide whether an apply is needed.
    type Spec: PartialEq;

    /// The child's spec.
    fn spec(&self) -> &Self::Spec;

    /// What the child's handler last reported, if anything.
    fn report(&self) -> Option<Report<'_>>;
}

/// The status fields every child kind shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Report<'a> {
    /// Generation the status was computed from.
    pub observed_generation: Option<i64>,
    /// Lifecycle phase.
    pub phase: Option<Phase>,
    /// Details of the phase.
    pub message: Option<&'a str>,
}

macro_rules! child {
    ($kind:ty, $spec:ty) => {
        impl Child for $kind {
            type Spec = $spec;

            fn spec(&self) -> &$spec {
                &self.spec
            }

            fn report(&self) -> Option<Report<'_>> {
                self.status.as_ref().map(|s| Report {
                    observed_generation: s.observed_generation,
                    phase: s.phase,
                    message: s.message.as_deref(),
                })
            }
        }
    };
}

child!(TopoServer, TopoServerSpec);
child!(Cell, CellSpec);
child!(TableGroup, TableGroupSpec);
child!(Shard, ShardSpec);

/// Whether `observed` already holds everything an apply of `desired` would set: the same
/// spec, every desired label with its value, every desired owner reference, and the same
/// inherited annotations (the only annotations a child is given; compared both ways so
/// removing one from the cluster removes it from the children). Extra labels or owners added
/// by others do not count (an apply would not remove them either).
pub fn up_to_date<K: Child>(desired: &K, observed: &K) -> bool {
    desired.spec() == observed.spec()
        && INHERITED_ANNOTATIONS
            .iter()
            .all(|k| desired.annotations().get(*k) == observed.annotations().get(*k))
        && desired
            .labels()
            .iter()
            .all(|(k, v)| observed.labels().get(k) == Some(v))
        && desired
            .owner_references()
            .iter()
            .all(|o| observed.owner_references().contains(o))
}

/// Whether `obj` has an owner reference to `uid`.
pub fn owned_by(obj: &impl Resource, uid: &str) -> bool {
    obj.meta()
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.uid == uid)
}

/// Whether the cluster's controller deletes `child`: labelled with the cluster `cluster`, not
/// `wanted` by its spec, and not already terminating. The guard asks the same question before
/// the controller acts on it.
pub fn is_orphan(child: &impl Resource, cluster: &str, wanted: impl Fn(&str) -> bool) -> bool {
    child.meta().deletion_timestamp.is_none()
        && child
            .labels()
            .get(multigres_api::labels::CLUSTER)
            .map(String::as_str)
            == Some(cluster)
        && !wanted(&child.name_any())
}

/// The controller owner of `obj`, if any.
pub fn controller_of(obj: &impl Resource) -> Option<&OwnerReference> {
    obj.meta()
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
}

/// What the cache holds under the name a desired child takes.
#[derive(Debug)]
pub enum Slot<'a, K> {
    /// Nothing, an unreadable object (an apply repairs it), or an object this owner controls
    /// or nobody controls (an apply adopts it).
    Free(Option<&'a K>),
    /// An object of that name is being deleted; apply once it is gone.
    Terminating,
    /// Another owner controls an object of that name.
    Taken(&'a OwnerReference),
}

/// The slot of a desired child of the owner `owner_uid`, given its cached object.
pub fn slot<'a, K: Child>(cached: Option<&'a Guarded<K>>, owner_uid: &str) -> Slot<'a, K> {
    let Some(observed) = cached.and_then(|c| c.0.as_ref().ok()) else {
        return Slot::Free(None);
    };
    if observed.meta().deletion_timestamp.is_some() {
        return Slot::Terminating;
    }
    match controller_of(observed) {
        Some(controller) if controller.uid != owner_uid => Slot::Taken(controller),
        _ => Slot::Free(Some(observed)),
    }
}

/// How a child is doing, from its own handler's point of view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    /// Healthy at its current generation.
    Healthy,
    /// Reported Degraded at its current generation, with the child's message.
    Degraded(String),
    /// Stopped on request (annotation `multigres.com/hibernate`) at its current generation.
    Hibernated,
    /// Anything else; the reason says what is awaited.
    Pending(String),
}

/// The health of `observed` (the cached child named `name`, if it exists), and whether the
/// child has started: its handler reported a phase past Initializing.
pub fn health<K: Child>(name: &str, observed: Option<&K>) -> (Health, bool) {
    let kind = K::kind(&());
    let Some(child) = observed else {
        return (
            Health::Pending(format!("{kind} {name} does not exist yet")),
            false,
        );
    };
    let Some((report, phase)) = child.report().and_then(|r| r.phase.map(|p| (r, p))) else {
        return (
            Health::Pending(format!("{kind} {name} has not reported status")),
            false,
        );
    };
    let started = phase != Phase::Initializing;
    if report.observed_generation != child.meta().generation {
        return (
            Health::Pending(format!(
                "{kind} {name} has not observed its latest spec yet"
            )),
            started,
        );
    }
    let health = match phase {
        Phase::Healthy => Health::Healthy,
        Phase::Hibernated => Health::Hibernated,
        Phase::Degraded => Health::Degraded(match report.message {
            Some(message) if !message.is_empty() => format!("{kind} {name}: {message}"),
            _ => format!("{kind} {name} is degraded"),
        }),
        phase => Health::Pending(format!("{kind} {name} is {phase:?}")),
    };
    (health, started)
}

/// How a set of children is doing as a whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Aggregate {
    /// Degraded if any child is; Healthy if all are; Hibernated if all are Healthy or
    /// Hibernated and one is Hibernated; Initializing while none has started; Progressing
    /// otherwise.
    pub phase: Phase,
    /// What the phase is about, naming the first few children that hold it back.
    pub message: String,
    /// Children that are Healthy.
    pub healthy: usize,
    /// Whether some child reports Degraded.
    pub degraded: bool,
}

/// How many children a status message names before summarizing the rest.
const LISTED: usize = 3;

/// Aggregates `healths` (one per desired child, with whether it started) for a status; `noun`
/// names the children in messages (`components`, `shards`).
pub fn aggregate(healths: &[(Health, bool)], noun: &str) -> Aggregate {
    let total = healths.len();
    let healthy = healths
        .iter()
        .filter(|(h, _)| *h == Health::Healthy)
        .count();
    let degraded: Vec<&str> = healths
        .iter()
        .filter_map(|(h, _)| match h {
            Health::Degraded(m) => Some(m.as_str()),
            _ => None,
        })
        .collect();
    if !degraded.is_empty() {
        return Aggregate {
            phase: Phase::Degraded,
            message: crate::notice::list(&degraded, LISTED),
            healthy,
            degraded: true,
        };
    }
    let hibernated = healths
        .iter()
        .filter(|(h, _)| *h == Health::Hibernated)
        .count();
    if hibernated > 0 && healthy + hibernated == total {
        return Aggregate {
            phase: Phase::Hibernated,
            message: format!(
                "{hibernated} of {total} {noun} hibernated (no pod runs), the others healthy"
            ),
            healthy,
            degraded: false,
        };
    }
    if healthy == total {
        return Aggregate {
            phase: Phase::Healthy,
            message: format!("All {total} {noun} are healthy"),
            healthy,
            degraded: false,
        };
    }
    let waiting: Vec<&str> = healths
        .iter()
        .filter_map(|(h, _)| match h {
            Health::Pending(m) => Some(m.as_str()),
            _ => None,
        })
        .collect();
    let phase = if healths.iter().any(|(_, started)| *started) {
        Phase::Progressing
    } else {
        Phase::Initializing
    };
    Aggregate {
        phase,
        message: format!(
            "{healthy}/{total} {noun} healthy; {}",
            crate::notice::list(&waiting, LISTED)
        ),
        healthy,
        degraded: false,
    }
}

/// The health of every desired child, looked up by name among the observed ones.
pub fn healths<K: Child>(
    desired: &[K],
    observed: &std::collections::BTreeMap<String, K>,
) -> Vec<(Health, bool)> {
    desired
        .iter()
        .map(|child| {
            let name = child.name_any();
            health(&name, observed.get(&name))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use multigres_api::observability::PROJECT_REF_ANNOTATION;
    use serde_json::json;

    use super::*;

    fn cell(value: serde_json::Value) -> Cell {
        serde_json::from_value(value).unwrap()
    }

    fn base() -> serde_json::Value {
        json!({
            "apiVersion": "multigres.com/v1alpha1",
            "kind": "Cell",
            "metadata": {
                "name": "prod-zone-a",
                "namespace": "ns",
                "generation": 3,
                "labels": {"app.kubernetes.io/component": "cell"},
                "ownerReferences": [{
                    "apiVersion": "multigres.com/v1alpha1", "kind": "MultigresCluster",
                    "name": "prod", "uid": "u-1", "controller": true, "blockOwnerDeletion": true,
                }],
            },
            "spec": {
                "name": "zone-a", "zoneId": "zone-a",
                "images": {"multigateway": "img:1"},
                "multigateway": {"replicas": 1},
                "globalTopoServer": {"address": "a:2379", "rootPath": "/r", "implementation": "etcd"},
            },
        })
    }

    #[test]
    fn extra_labels_and_owners_do_not_need_an_apply() {
        let desired = cell(base());
        let mut observed = base();
        observed["metadata"]["labels"]["team"] = json!("db");
        observed["metadata"]["ownerReferences"]
            .as_array_mut()
            .unwrap()
            .push(json!({"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "u-2"}));
        observed["status"] = json!({"phase": "Healthy"});
        assert!(up_to_date(&desired, &cell(observed)));
    }

    #[test]
    fn a_changed_spec_label_owner_or_project_needs_an_apply() {
        let desired = cell(base());
        let mut project = base();
        project["metadata"]["annotations"] = json!({PROJECT_REF_ANNOTATION: "proj"});
        assert!(!up_to_date(&desired, &cell(project.clone())), "removed");
        assert!(!up_to_date(&cell(project.clone()), &desired), "added");
        assert!(up_to_date(&cell(project.clone()), &cell(project)));
        let mut spec = base();
        spec["spec"]["multigateway"]["replicas"] = json!(5);
        let mut label = base();
        label["metadata"]["labels"]["app.kubernetes.io/component"] = json!("other");
        let mut owner = base();
        owner["metadata"]["ownerReferences"][0]["uid"] = json!("u-9");
        for observed in [spec, label, owner] {
            assert!(!up_to_date(&desired, &cell(observed)));
        }
    }

    #[test]
    fn ownership_is_by_uid() {
        let c = cell(base());
        assert!(owned_by(&c, "u-1"));
        assert!(!owned_by(&c, "u-2"));
        assert_eq!(controller_of(&c).map(|o| o.name.as_str()), Some("prod"));
    }

    #[test]
    fn health_needs_a_current_healthy_report() {
        let (missing, started) = health::<Cell>("prod-zone-a", None);
        assert!(
            matches!(missing, Health::Pending(m) if m == "Cell prod-zone-a does not exist yet")
        );
        assert!(!started);

        let silent = cell(base());
        let (h, started) = health("prod-zone-a", Some(&silent));
        assert!(matches!(h, Health::Pending(m) if m.contains("has not reported status")));
        assert!(!started);

        let mut initializing = base();
        initializing["status"] = json!({"phase": "Initializing", "observedGeneration": 3});
        let (h, started) = health("prod-zone-a", Some(&cell(initializing)));
        assert_eq!(
            h,
            Health::Pending("Cell prod-zone-a is Initializing".into())
        );
        assert!(!started);

        let mut stale = base();
        stale["status"] = json!({"phase": "Healthy", "observedGeneration": 2});
        let (h, started) = health("prod-zone-a", Some(&cell(stale)));
        assert!(matches!(h, Health::Pending(m) if m.contains("latest spec")));
        assert!(started);

        let mut healthy = base();
        healthy["status"] = json!({"phase": "Healthy", "observedGeneration": 3});
        assert_eq!(
            health("prod-zone-a", Some(&cell(healthy))).0,
            Health::Healthy
        );

        let mut degraded = base();
        degraded["status"] =
            json!({"phase": "Degraded", "observedGeneration": 3, "message": "0/1 gateways ready"});
        assert_eq!(
            health("prod-zone-a", Some(&cell(degraded))).0,
            Health::Degraded("Cell prod-zone-a: 0/1 gateways ready".into())
        );

        let mut progressing = base();
        progressing["status"] = json!({"phase": "Progressing", "observedGeneration": 3});
        assert_eq!(
            health("prod-zone-a", Some(&cell(progressing))).0,
            Health::Pending("Cell prod-zone-a is Progressing".into())
        );
    }

    #[test]
    fn aggregate_orders_degraded_healthy_initializing_progressing() {
        let healthy = (Health::Healthy, true);
        let pending = |m: &str, started| (Health::Pending(m.to_owned()), started);
        let degraded = (Health::Degraded("Shard s: pool down".to_owned()), true);

        let a = aggregate(&[healthy.clone(), degraded, pending("x", true)], "shards");
        assert_eq!(
            (a.phase, a.message.as_str(), a.degraded),
            (Phase::Degraded, "Shard s: pool down", true)
        );

        let a = aggregate(&[healthy.clone(), healthy.clone()], "shards");
        assert_eq!(
            (a.phase, a.message.as_str(), a.healthy),
            (Phase::Healthy, "All 2 shards are healthy", 2)
        );

        let asleep = (Health::Hibernated, true);
        let a = aggregate(
            &[healthy.clone(), asleep.clone(), asleep.clone()],
            "components",
        );
        assert_eq!(
            (a.phase, a.message.as_str()),
            (
                Phase::Hibernated,
                "2 of 3 components hibernated (no pod runs), the others healthy"
            )
        );
        let a = aggregate(&[asleep, pending("waking", true)], "components");
        assert_eq!(a.phase, Phase::Progressing);

        let a = aggregate(&[pending("a", false), pending("b", false)], "components");
        assert_eq!(
            (a.phase, a.message.as_str()),
            (Phase::Initializing, "0/2 components healthy; a; b")
        );

        let many: Vec<_> = ["a", "b", "c", "d", "e"]
            .iter()
            .map(|m| pending(m, false))
            .collect();
        let a = aggregate(
            &[vec![healthy, pending("z", true)], many].concat(),
            "components",
        );
        assert_eq!(
            (a.phase, a.message.as_str()),
            (
                Phase::Progressing,
                "1/7 components healthy; z; a; b; and 3 more"
            )
        );
    }

    #[test]
    fn a_slot_is_free_unless_terminating_or_controlled_by_another_owner() {
        use multigres_common::guard::InvalidObject;

        assert!(matches!(slot::<Cell>(None, "u-1"), Slot::Free(None)));
        let broken = Guarded::<Cell>(Err(InvalidObject {
            error: "unknown variant".into(),
            metadata: Default::default(),
        }));
        assert!(matches!(slot(Some(&broken), "u-1"), Slot::Free(None)));

        let ours = Guarded(Ok(cell(base())));
        assert!(matches!(slot(Some(&ours), "u-1"), Slot::Free(Some(_))));
        assert!(matches!(slot(Some(&ours), "u-2"), Slot::Taken(o) if o.name == "prod"));

        let mut orphan = base();
        orphan["metadata"]["ownerReferences"] = json!([]);
        let orphan = Guarded(Ok(cell(orphan)));
        assert!(
            matches!(slot(Some(&orphan), "u-2"), Slot::Free(Some(_))),
            "adopted"
        );

        let mut going = base();
        going["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        going["metadata"]["finalizers"] = json!(["multigres.com/topology"]);
        let going = Guarded(Ok(cell(going)));
        assert!(matches!(slot(Some(&going), "u-1"), Slot::Terminating));
    }
}
