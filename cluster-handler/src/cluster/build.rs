//! The children of a MultigresCluster, built from its resolved spec: pure, no client.
//!
//! Every child gets a deterministic name ([`multigres_api::names`]), the standard labels plus
//! its topology placement ([`multigres_api::labels`]), and a controller owner reference to the
//! cluster, so deleting the cluster garbage-collects it.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::{Resource, ResourceExt};
use multigres_api::confirm;
use multigres_api::labels::{self, Component, Placement};
use multigres_api::names;
use multigres_api::observability::PROJECT_REF_ANNOTATION;
use multigres_api::resolver::{GlobalTopo, ResolvedCluster};
use multigres_api::v1alpha1::{Cell, MultigresCluster, TableGroup, TopoServer};

/// Every child custom resource a cluster should have.
#[derive(Debug, Clone)]
pub struct Children {
    /// The global TopoServer (when managed) and each cell's local one (when configured).
    pub topo_servers: Vec<TopoServer>,
    /// One Cell per `spec.cells` entry.
    pub cells: Vec<Cell>,
    /// One TableGroup per table group of every database.
    pub table_groups: Vec<TableGroup>,
}

/// The cluster lacks what children need to point back at it (it was never stored).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("MultigresCluster has no metadata.{0}")]
pub struct Incomplete(pub &'static str);

/// The identity of a stored cluster that children are built from.
#[derive(Debug, Clone, PartialEq)]
pub struct Owner {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// Controller owner reference to the cluster, blocking its foreground deletion until the
    /// child is gone.
    pub reference: OwnerReference,
    /// The cluster's annotations copied onto every child ([`INHERITED_ANNOTATIONS`]).
    pub inherited: BTreeMap<String, String>,
}

/// The annotations of a cluster its children carry too, and pass on to theirs:
/// `multigres.com/project-ref`, which the resource-handler reads from the Cell and the Shard to
/// label their telemetry, and `multigres.com/confirm-delete-backups`, which it reads from the
/// Shard to decide whether the filesystem backup volume goes with the cluster, and
/// `multigres.com/paused`, which holds every handler's hands off the children's workloads,
/// `multigres.com/restart-policy`, which makes the Shards' pool pod restarts wait for a release,
/// and `multigres.com/hibernate`, which stops the children's pods.
pub const INHERITED_ANNOTATIONS: [&str; 5] = [
    PROJECT_REF_ANNOTATION,
    confirm::DELETE_BACKUPS,
    multigres_api::labels::PAUSED,
    multigres_api::labels::RESTART_POLICY,
    multigres_api::labels::HIBERNATE,
];

/// The [`INHERITED_ANNOTATIONS`] among `annotations`.
pub fn inherited(annotations: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    INHERITED_ANNOTATIONS
        .iter()
        .filter_map(|k| annotations.get_key_value(*k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

impl Owner {
    /// The identity of `cluster`, which must have been read from the API server.
    pub fn of(cluster: &MultigresCluster) -> Result<Self, Incomplete> {
        let name = cluster.meta().name.clone().ok_or(Incomplete("name"))?;
        let namespace = cluster
            .meta()
            .namespace
            .clone()
            .ok_or(Incomplete("namespace"))?;
        let reference = cluster
            .controller_owner_ref(&())
            .map(|r| OwnerReference {
                block_owner_deletion: Some(true),
                ..r
            })
            .ok_or(Incomplete("uid"))?;
        Ok(Self {
            name,
            namespace,
            reference,
            inherited: inherited(cluster.annotations()),
        })
    }

    fn metadata(&self, name: String, component: Component, at: &Placement) -> ObjectMeta {
        ObjectMeta {
            name: Some(name),
            namespace: Some(self.namespace.clone()),
            labels: Some(labels::labels(&self.name, component, at)),
            owner_references: Some(vec![self.reference.clone()]),
            annotations: (!self.inherited.is_empty()).then(|| self.inherited.clone()),
            ..ObjectMeta::default()
        }
    }
}

/// The children of the cluster `owner` for its resolved spec.
pub fn children(owner: &Owner, resolved: &ResolvedCluster) -> Children {
    let mut topo_servers = Vec::new();
    if let GlobalTopo::Managed(spec) = &resolved.global_topo {
        topo_servers.push(TopoServer {
            metadata: owner.metadata(
                names::global_topo_server(&owner.name),
                Component::GlobalTopo,
                &Placement::default(),
            ),
            spec: (**spec).clone(),
            status: None,
        });
    }
    let mut cells = Vec::new();
    for cell in &resolved.cells {
        let cell_name = cell.spec.name.as_str();
        let at = Placement {
            cell: Some(cell_name),
            ..Placement::default()
        };
        if let Some(local) = &cell.local_topo {
            topo_servers.push(TopoServer {
                metadata: owner.metadata(
                    names::local_topo_server(&owner.name, cell_name),
                    Component::LocalTopo,
                    &at,
                ),
                spec: local.clone(),
                status: None,
            });
        }
        cells.push(Cell {
            metadata: owner.metadata(names::cell(&owner.name, cell_name), Component::Cell, &at),
            spec: cell.spec.clone(),
            status: None,
        });
    }
    let table_groups = resolved
        .table_groups
        .iter()
        .map(|tg| {
            let (database, table_group) = (tg.database_name.as_str(), tg.table_group_name.as_str());
            TableGroup {
                metadata: owner.metadata(
                    names::table_group(&owner.name, database, table_group),
                    Component::TableGroup,
                    &Placement {
                        database: Some(database),
                        table_group: Some(table_group),
                        ..Placement::default()
                    },
                ),
                spec: tg.clone(),
                status: None,
            }
        })
        .collect();
    Children {
        topo_servers,
        cells,
        table_groups,
    }
}
