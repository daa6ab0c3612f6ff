//! The identity of a stored custom resource whose children are built from it, one type for
//! every handler: the cluster-handler's children of a MultigresCluster or a TableGroup, and the
//! resource-handler's workloads of a TopoServer, Cell, Shard or MultigresCluster.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::{Resource, ResourceExt};

use crate::labels::{CLUSTER, HIBERNATE, PAUSED, RESTART_POLICY};
use crate::observability::PROJECT_REF_ANNOTATION;
use crate::v1alpha1::MultigresCluster;

/// The annotations of a cluster its child custom resources carry too, and pass on to theirs:
/// `multigres.com/project-ref`, which the resource-handler reads from the Cell and the Shard to
/// label their telemetry, `multigres.com/confirm-delete-backups`, which it reads from the Shard
/// to decide whether the filesystem backup volume goes with the cluster,
/// `multigres.com/paused`, which holds every handler's hands off the children's workloads,
/// `multigres.com/restart-policy`, which makes the Shards' pool pod restarts wait for a release,
/// and `multigres.com/hibernate`, which stops the children's pods.
pub const INHERITED_ANNOTATIONS: [&str; 5] = [
    PROJECT_REF_ANNOTATION,
    crate::confirm::DELETE_BACKUPS,
    PAUSED,
    RESTART_POLICY,
    HIBERNATE,
];

/// The [`INHERITED_ANNOTATIONS`] among `annotations`.
pub fn inherited(annotations: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    INHERITED_ANNOTATIONS
        .iter()
        .filter_map(|k| annotations.get_key_value(*k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Who owns a set of children.
#[derive(Clone, Debug, PartialEq)]
pub struct Owner {
    /// Name of the owning resource.
    pub name: String,
    /// Its namespace, which is also the children's.
    pub namespace: String,
    /// The controller reference the children carry (garbage collection, owner watches).
    pub reference: OwnerReference,
    /// The MultigresCluster the owner belongs to (its own name, for a cluster).
    pub cluster: String,
    /// The owner's [`INHERITED_ANNOTATIONS`], which child custom resources carry too.
    pub inherited: BTreeMap<String, String>,
}

/// Why an owner cannot be identified.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OwnerError {
    /// The object lacks a field only the API server sets (it was never stored).
    #[error("the object has no metadata.{0}: only a stored object owns children")]
    Unstored(&'static str),
    /// Neither the cluster label nor a MultigresCluster owner says which cluster it is in.
    #[error(
        "cannot tell which MultigresCluster this belongs to: set the {CLUSTER} label or a \
         controller owner reference to the MultigresCluster"
    )]
    NoCluster,
}

impl Owner {
    /// The identity of `obj`, whose cluster comes from its `multigres.com/cluster` label, else
    /// from its controller owner reference when that is a MultigresCluster.
    pub fn of<K: Resource<DynamicType = ()>>(obj: &K) -> Result<Self, OwnerError> {
        let cluster = obj
            .labels()
            .get(CLUSTER)
            .filter(|c| !c.is_empty())
            .cloned()
            .or_else(|| {
                obj.owner_references()
                    .iter()
                    .find(|o| o.controller == Some(true) && o.kind == "MultigresCluster")
                    .map(|o| o.name.clone())
            })
            .ok_or(OwnerError::NoCluster)?;
        Self::with_cluster(obj, cluster)
    }

    /// The identity of `cluster` as the owner of its own children.
    pub fn of_cluster(cluster: &MultigresCluster) -> Result<Self, OwnerError> {
        let name = cluster
            .meta()
            .name
            .clone()
            .ok_or(OwnerError::Unstored("name"))?;
        Self::with_cluster(cluster, name)
    }

    /// The identity of `obj`, part of `cluster`.
    pub fn with_cluster<K: Resource<DynamicType = ()>>(
        obj: &K,
        cluster: String,
    ) -> Result<Self, OwnerError> {
        Ok(Self {
            name: obj
                .meta()
                .name
                .clone()
                .ok_or(OwnerError::Unstored("name"))?,
            namespace: obj.namespace().ok_or(OwnerError::Unstored("namespace"))?,
            reference: obj
                .controller_owner_ref(&())
                .ok_or(OwnerError::Unstored("uid"))?,
            cluster,
            inherited: inherited(obj.annotations()),
        })
    }

    /// The same owner, whose children block its foreground deletion until they are gone: the
    /// cluster-handler's child custom resources, so a cluster's deletion waits for its cells,
    /// table groups and shards to finish theirs.
    pub fn blocking_deletion(mut self) -> Self {
        self.reference.block_owner_deletion = Some(true);
        self
    }

    /// The UID children's owner references point at.
    pub fn uid(&self) -> &str {
        &self.reference.uid
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::v1alpha1::TopoServer;

    fn topo(metadata: serde_json::Value) -> TopoServer {
        serde_json::from_value(json!({
            "apiVersion": "multigres.com/v1alpha1",
            "kind": "TopoServer",
            "metadata": metadata,
            "spec": {},
        }))
        .unwrap()
    }

    #[test]
    fn cluster_comes_from_the_label_then_the_owner() {
        let labelled = topo(json!({
            "name": "t", "namespace": "ns", "uid": "u1",
            "labels": {"multigres.com/cluster": "prod"},
        }));
        let owner = Owner::of(&labelled).unwrap();
        assert_eq!(owner.cluster, "prod");
        assert_eq!(owner.reference.kind, "TopoServer");
        assert_eq!(owner.reference.controller, Some(true));
        assert_eq!(owner.reference.block_owner_deletion, None);
        assert_eq!(owner.uid(), "u1");

        let owned = topo(json!({
            "name": "t", "namespace": "ns", "uid": "u1",
            "ownerReferences": [{"apiVersion": "multigres.com/v1alpha1",
                "kind": "MultigresCluster", "name": "staging", "uid": "c1", "controller": true}],
        }));
        assert_eq!(Owner::of(&owned).unwrap().cluster, "staging");

        let orphan = topo(json!({"name": "t", "namespace": "ns", "uid": "u1"}));
        assert_eq!(Owner::of(&orphan), Err(OwnerError::NoCluster));
    }

    #[test]
    fn only_a_stored_object_owns_children() {
        let unstored = topo(json!({
            "name": "t", "namespace": "ns",
            "labels": {"multigres.com/cluster": "prod"},
        }));
        let error = Owner::of(&unstored).unwrap_err();
        assert_eq!(error, OwnerError::Unstored("uid"));
        assert_eq!(
            error.to_string(),
            "the object has no metadata.uid: only a stored object owns children"
        );
    }

    #[test]
    fn a_cluster_owns_its_children_and_passes_on_only_the_inherited_annotations() {
        let cluster: MultigresCluster = serde_json::from_value(json!({
            "apiVersion": "multigres.com/v1alpha1",
            "kind": "MultigresCluster",
            "metadata": {"name": "prod", "namespace": "ns", "uid": "c1",
                "annotations": {"multigres.com/paused": "true", "team": "payments"}},
            "spec": {"postgresPasswordSecretRef": {"name": "pg", "key": "password"}},
        }))
        .unwrap();
        let owner = Owner::of_cluster(&cluster).unwrap().blocking_deletion();
        assert_eq!(
            (owner.name.as_str(), owner.cluster.as_str()),
            ("prod", "prod")
        );
        assert_eq!(owner.reference.block_owner_deletion, Some(true));
        assert_eq!(
            owner.inherited,
            BTreeMap::from([("multigres.com/paused".to_owned(), "true".to_owned())])
        );
    }
}
