//! The Shards of a TableGroup, one per resolved shard entry: pure, no client.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::{Resource, ResourceExt};
use multigres_api::labels::{self, Component, Placement};
use multigres_api::names;
use multigres_api::resolver::shard_spec;
use multigres_api::v1alpha1::{Shard, TableGroup, TableGroupSpec};

/// The TableGroup lacks what its Shards need: it was not read from the API server, or lost
/// the label naming its cluster.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("TableGroup has no {0}")]
pub struct Incomplete(pub &'static str);

/// The identity of a stored TableGroup that Shards are built from.
#[derive(Debug, Clone, PartialEq)]
pub struct Owner {
    /// The cluster the TableGroup belongs to (its `multigres.com/cluster` label).
    pub cluster: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// Controller owner reference to the TableGroup, blocking its foreground deletion until
    /// the Shard is gone.
    pub reference: OwnerReference,
    /// The annotations the cluster-handler copied from the cluster
    /// ([`crate::cluster::build::INHERITED_ANNOTATIONS`]), passed on to the Shards.
    pub inherited: BTreeMap<String, String>,
}

impl Owner {
    /// The identity of `tg`, which must have been read from the API server.
    pub fn of(tg: &TableGroup) -> Result<Self, Incomplete> {
        let cluster = tg
            .meta()
            .labels
            .as_ref()
            .and_then(|l| l.get(labels::CLUSTER))
            .cloned()
            .ok_or(Incomplete("multigres.com/cluster label"))?;
        let namespace = tg
            .meta()
            .namespace
            .clone()
            .ok_or(Incomplete("metadata.namespace"))?;
        let reference = tg
            .controller_owner_ref(&())
            .map(|r| OwnerReference {
                block_owner_deletion: Some(true),
                ..r
            })
            .ok_or(Incomplete("metadata.uid"))?;
        Ok(Self {
            cluster,
            namespace,
            reference,
            inherited: crate::cluster::build::inherited(tg.annotations()),
        })
    }
}

/// One Shard per entry of `spec.shards`.
pub fn shards(owner: &Owner, spec: &TableGroupSpec) -> Vec<Shard> {
    let (database, table_group) = (spec.database_name.as_str(), spec.table_group_name.as_str());
    spec.shards
        .iter()
        .map(|entry| {
            let at = Placement {
                database: Some(database),
                table_group: Some(table_group),
                shard: Some(&entry.name),
                ..Placement::default()
            };
            Shard {
                metadata: ObjectMeta {
                    name: Some(names::shard(
                        &owner.cluster,
                        database,
                        table_group,
                        &entry.name,
                    )),
                    namespace: Some(owner.namespace.clone()),
                    labels: Some(labels::labels(&owner.cluster, Component::Shard, &at)),
                    owner_references: Some(vec![owner.reference.clone()]),
                    annotations: (!owner.inherited.is_empty()).then(|| owner.inherited.clone()),
                    ..ObjectMeta::default()
                },
                spec: shard_spec(spec, entry),
                status: None,
            }
        })
        .collect()
}
