//! The children of a MultigresCluster, built from its resolved spec: pure, no client.
//!
//! Every child gets a deterministic name ([`multigres_api::names`]), the standard labels plus
//! its topology placement ([`multigres_api::labels`]), and a controller owner reference to the
//! cluster, so deleting the cluster garbage-collects it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use multigres_api::labels::{self, Component, Placement};
use multigres_api::names;
use multigres_api::owner::{Owner, OwnerError};
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

/// `cluster` as the owner of its children, which block its foreground deletion until they are
/// gone.
pub fn owner(cluster: &MultigresCluster) -> Result<Owner, OwnerError> {
    Owner::of_cluster(cluster).map(Owner::blocking_deletion)
}

/// The metadata of a child named `name`: the owner's namespace, its cluster's labels, its
/// inherited annotations, and a controller reference to it.
pub(crate) fn metadata(
    owner: &Owner,
    name: String,
    component: Component,
    at: &Placement,
) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: Some(owner.namespace.clone()),
        labels: Some(labels::labels(&owner.cluster, component, at)),
        owner_references: Some(vec![owner.reference.clone()]),
        annotations: (!owner.inherited.is_empty()).then(|| owner.inherited.clone()),
        ..ObjectMeta::default()
    }
}

/// The children of the cluster `owner` for its resolved spec.
pub fn children(owner: &Owner, resolved: &ResolvedCluster) -> Children {
    let mut topo_servers = Vec::new();
    if let GlobalTopo::Managed(spec) = &resolved.global_topo {
        topo_servers.push(TopoServer {
            metadata: metadata(
                owner,
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
                metadata: metadata(
                    owner,
                    names::local_topo_server(&owner.name, cell_name),
                    Component::LocalTopo,
                    &at,
                ),
                spec: local.clone(),
                status: None,
            });
        }
        cells.push(Cell {
            metadata: metadata(
                owner,
                names::cell(&owner.name, cell_name),
                Component::Cell,
                &at,
            ),
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
                metadata: metadata(
                    owner,
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
