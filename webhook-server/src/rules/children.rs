//! Cell, TableGroup, Shard and TopoServer are written by the operator from the MultigresCluster;
//! a manual edit would be overwritten at the next reconcile or, worse, act on data before it is.
//! Only the operator's ServiceAccounts may create, change or delete them, plus the Kubernetes
//! controllers that clean up after owners (garbage collector, namespace deletion).

use std::collections::{BTreeMap, BTreeSet};

use kube::core::DynamicObject;
use kube::core::admission::Operation;
use multigres_api::labels::RELEASE_RESTARTS;

use crate::violation::Findings;

/// Kubernetes controllers that delete children when their owner or namespace goes, and update
/// them to drop finalizers during foreground deletion. `system:kube-controller-manager` is the
/// controller manager's own identity when it runs without per-controller credentials.
pub const SYSTEM_CONTROLLERS: &[&str] = &[
    "system:serviceaccount:kube-system:generic-garbage-collector",
    "system:serviceaccount:kube-system:namespace-controller",
    "system:kube-controller-manager",
];

/// A ServiceAccount allowed to write children, as `namespace:name` on the command line.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ServiceAccount {
    /// Namespace of the ServiceAccount.
    pub namespace: String,
    /// Name of the ServiceAccount.
    pub name: String,
}

impl ServiceAccount {
    /// Parses `namespace:name`, or a bare `name` in `default_namespace`.
    pub fn parse(text: &str, default_namespace: &str) -> Result<Self, String> {
        let (namespace, name) = text.split_once(':').unwrap_or((default_namespace, text));
        if namespace.is_empty() || name.is_empty() || name.contains(':') {
            return Err(format!(
                "invalid ServiceAccount {text:?}: expected NAMESPACE:NAME or NAME"
            ));
        }
        Ok(Self {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        })
    }

    /// The username the API server gives requests authenticated as this ServiceAccount.
    pub fn username(&self) -> String {
        format!("system:serviceaccount:{}:{}", self.namespace, self.name)
    }
}

/// Usernames of the operator's ServiceAccounts.
#[derive(Debug, Clone, Default)]
pub struct Operators {
    usernames: BTreeSet<String>,
}

impl Operators {
    /// The operator identities.
    pub fn new<'a>(accounts: impl IntoIterator<Item = &'a ServiceAccount>) -> Self {
        Self {
            usernames: accounts.into_iter().map(ServiceAccount::username).collect(),
        }
    }

    fn contains(&self, username: &str) -> bool {
        self.usernames.contains(username)
    }
}

/// Decides whether `username` may perform `operation` on a child object.
pub fn check(
    kind: &str,
    operation: &Operation,
    username: &str,
    old: Option<&DynamicObject>,
    new: Option<&DynamicObject>,
    operators: &Operators,
) -> Findings {
    let mut findings = Findings::default();
    if operators.contains(username) {
        return findings;
    }
    let system = SYSTEM_CONTROLLERS.contains(&username);
    match operation {
        Operation::Delete | Operation::Update if system => return findings,
        Operation::Update
            if old
                .zip(new)
                .is_some_and(|(o, n)| releases_restarts(kind, o, n)) =>
        {
            return findings;
        }
        Operation::Update if old.zip(new).is_some_and(|(o, n)| releases_finalizers(o, n)) => {
            findings.warning(
                "metadata.finalizers",
                format!(
                    "{kind} finalizers removed by {username:?}: the operator's cleanup for this \
                     object (for example its topology records) is skipped"
                ),
            );
            return findings;
        }
        _ => {}
    }
    let object = new.or(old);
    let name = object
        .and_then(|o| o.metadata.name.as_deref())
        .unwrap_or_default();
    let owner = object
        .and_then(|o| o.metadata.owner_references.as_ref())
        .and_then(|refs| refs.iter().find(|r| r.controller == Some(true)))
        .map(|r| format!("{} {:?}", r.kind, r.name))
        .unwrap_or_else(|| "its MultigresCluster".to_owned());
    let verb = match operation {
        Operation::Create => "created",
        Operation::Delete => "deleted",
        _ => "changed",
    };
    findings.violation(
        "metadata",
        format!(
            "{kind} {name:?} is managed by the operator and cannot be {verb} by {username:?}; \
             edit {owner} instead"
        ),
    );
    findings
}

/// An update of a Shard that only sets its [`RELEASE_RESTARTS`] annotation: what `kubectl
/// multigres restart` writes to let the restarts a supervised cluster holds run. The
/// resource-handler acts on it only when it names exactly the revisions that wait.
fn releases_restarts(kind: &str, old: &DynamicObject, new: &DynamicObject) -> bool {
    let (o, n) = (&old.metadata, &new.metadata);
    let others = |annotations: &Option<BTreeMap<String, String>>| {
        let mut others = annotations.clone().unwrap_or_default();
        others.remove(RELEASE_RESTARTS);
        others
    };
    kind == "Shard"
        && old.data == new.data
        && o.labels == n.labels
        && others(&o.annotations) == others(&n.annotations)
        && o.owner_references == n.owner_references
        && o.finalizers == n.finalizers
        && n.annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(RELEASE_RESTARTS))
}

/// An update of an object already being deleted that only drops finalizers: the escape hatch
/// for a deletion stuck on an operator that is gone.
fn releases_finalizers(old: &DynamicObject, new: &DynamicObject) -> bool {
    let (o, n) = (&old.metadata, &new.metadata);
    let finalizers = |f: &Option<Vec<String>>| f.clone().unwrap_or_default();
    let (before, after) = (finalizers(&o.finalizers), finalizers(&n.finalizers));
    o.deletion_timestamp.is_some()
        && old.data == new.data
        && o.labels == n.labels
        && o.annotations == n.annotations
        && o.owner_references == n.owner_references
        && after.len() < before.len()
        && after.iter().all(|f| before.contains(f))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde_json::json;

    use super::*;

    fn cell(finalizers: &[&str], deleting: bool, replicas: i32) -> DynamicObject {
        let mut object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "multigres.com/v1alpha1",
            "kind": "Cell",
            "metadata": {
                "name": "demo-zone-a",
                "namespace": "db",
                "finalizers": finalizers,
                "ownerReferences": [{
                    "apiVersion": "multigres.com/v1alpha1",
                    "kind": "MultigresCluster",
                    "name": "demo",
                    "uid": "1",
                    "controller": true
                }]
            },
            "spec": {"multigateway": {"replicas": replicas}}
        }))
        .unwrap();
        if deleting {
            object.metadata.deletion_timestamp =
                Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        }
        object
    }

    fn operators() -> Operators {
        Operators::new(&[ServiceAccount::parse("ops:cluster-handler", "x").unwrap()])
    }

    #[test]
    fn service_accounts_parse() {
        let sa = ServiceAccount::parse("handler", "ops").unwrap();
        assert_eq!(sa.username(), "system:serviceaccount:ops:handler");
        assert_eq!(
            ServiceAccount::parse("a:b", "ops").unwrap().username(),
            "system:serviceaccount:a:b"
        );
        for bad in ["", ":x", "a:", "a:b:c"] {
            assert!(ServiceAccount::parse(bad, "ops").is_err(), "{bad:?}");
        }
    }

    #[test]
    fn only_operator_accounts_write_children() {
        let obj = cell(&[], false, 1);
        let operator = "system:serviceaccount:ops:cluster-handler";
        for op in [Operation::Create, Operation::Update, Operation::Delete] {
            assert!(check("Cell", &op, operator, Some(&obj), Some(&obj), &operators()).allowed());
        }
        let denied = check(
            "Cell",
            &Operation::Update,
            "alice",
            Some(&obj),
            Some(&obj),
            &operators(),
        );
        assert_eq!(
            denied.message(),
            "metadata: Cell \"demo-zone-a\" is managed by the operator and cannot be changed by \
             \"alice\"; edit MultigresCluster \"demo\" instead"
        );
        let other_sa = "system:serviceaccount:db:cluster-handler";
        assert!(
            !check(
                "Cell",
                &Operation::Create,
                other_sa,
                None,
                Some(&obj),
                &operators()
            )
            .allowed()
        );
    }

    #[test]
    fn a_person_may_release_a_shards_restarts_and_change_nothing_else() {
        let shard = |annotations: serde_json::Value, replicas: i32| -> DynamicObject {
            let mut object = cell(&[], false, replicas);
            object.types.as_mut().unwrap().kind = "Shard".into();
            object.metadata.annotations = serde_json::from_value(annotations).unwrap();
            object
        };
        let held = shard(json!({"multigres.com/restart-policy": "supervised"}), 1);
        let released = shard(
            json!({"multigres.com/restart-policy": "supervised",
                   RELEASE_RESTARTS: "demo-pool-abc"}),
            1,
        );
        let update = |kind: &str, old: &DynamicObject, new: &DynamicObject| {
            check(
                kind,
                &Operation::Update,
                "alice",
                Some(old),
                Some(new),
                &operators(),
            )
        };
        assert!(update("Shard", &held, &released).allowed());
        assert!(
            update("Shard", &released, &held)
                .message()
                .contains("cannot be changed")
        );
        assert!(
            !update("Cell", &held, &released).allowed(),
            "only on a Shard"
        );
        let with_more = shard(
            json!({"multigres.com/restart-policy": "automatic",
                   RELEASE_RESTARTS: "demo-pool-abc"}),
            1,
        );
        assert!(
            !update("Shard", &held, &with_more).allowed(),
            "another annotation too"
        );
        let resized = shard(
            json!({"multigres.com/restart-policy": "supervised",
                   RELEASE_RESTARTS: "demo-pool-abc"}),
            2,
        );
        assert!(!update("Shard", &held, &resized).allowed(), "the spec too");
    }

    #[test]
    fn garbage_collector_may_delete_but_not_create() {
        let obj = cell(&[], false, 1);
        let gc = SYSTEM_CONTROLLERS[0];
        assert!(
            check(
                "Shard",
                &Operation::Delete,
                gc,
                Some(&obj),
                None,
                &operators()
            )
            .allowed()
        );
        assert!(
            check(
                "Shard",
                &Operation::Update,
                gc,
                Some(&obj),
                Some(&obj),
                &operators()
            )
            .allowed()
        );
        let created = check(
            "Shard",
            &Operation::Create,
            gc,
            None,
            Some(&obj),
            &operators(),
        );
        assert!(
            created.message().contains("cannot be created"),
            "{created:?}"
        );
    }

    #[test]
    fn stuck_finalizers_can_be_released_by_anyone() {
        let old = cell(&["multigres.com/topology"], true, 1);
        let released = cell(&[], true, 1);
        let f = check(
            "Cell",
            &Operation::Update,
            "alice",
            Some(&old),
            Some(&released),
            &operators(),
        );
        assert!(f.allowed());
        assert_eq!(f.warnings.len(), 1);

        let not_deleting = cell(&["multigres.com/topology"], false, 1);
        let f = check(
            "Cell",
            &Operation::Update,
            "alice",
            Some(&not_deleting),
            Some(&cell(&[], false, 1)),
            &operators(),
        );
        assert!(!f.allowed());

        let sneaky = cell(&[], true, 5);
        let f = check(
            "Cell",
            &Operation::Update,
            "alice",
            Some(&old),
            Some(&sneaky),
            &operators(),
        );
        assert!(!f.allowed(), "a spec change rides along");
    }
}
