//! Identity of the custom resource a workload belongs to: its namespace, the owner reference
//! its children carry, and the MultigresCluster it is part of.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::{Resource, ResourceExt};
use multigres_api::labels::CLUSTER;

/// Who owns a set of children.
#[derive(Clone, Debug, PartialEq)]
pub struct Owner {
    /// Name of the owning resource.
    pub name: String,
    /// Its namespace, which is also the children's.
    pub namespace: String,
    /// The controller reference the children carry (garbage collection, owner watches).
    pub reference: OwnerReference,
    /// The MultigresCluster the owner belongs to.
    pub cluster: String,
}

/// Why an owner cannot be identified.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OwnerError {
    /// The object has no name, namespace or UID yet (it was never stored).
    #[error("the object has no name, namespace or uid")]
    Unstored,
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

    /// The identity of `obj` as the owner of its own cluster's children (a MultigresCluster).
    pub fn with_cluster<K: Resource<DynamicType = ()>>(
        obj: &K,
        cluster: String,
    ) -> Result<Self, OwnerError> {
        Ok(Self {
            name: obj.meta().name.clone().ok_or(OwnerError::Unstored)?,
            namespace: obj.namespace().ok_or(OwnerError::Unstored)?,
            reference: obj.controller_owner_ref(&()).ok_or(OwnerError::Unstored)?,
            cluster,
        })
    }

    /// The UID children's owner references point at.
    pub fn uid(&self) -> &str {
        &self.reference.uid
    }
}

#[cfg(test)]
mod tests {
    use multigres_api::v1alpha1::TopoServer;
    use serde_json::json;

    use super::*;

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
}
