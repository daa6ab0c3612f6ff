//! The topology records a cluster should have, computed from its resolved spec: pure, no I/O.
//!
//! The Cell controller and the MultigresCluster controller both use [`cell_record`], from the
//! same resolved Cell spec, so they agree on what a cell's record says.

use multigres_api::names;
use multigres_api::resolver::{ResolvedCluster, defaults};
use multigres_api::v1alpha1::{
    BackupConfig, BackupType, CellSpec as CellResource, GlobalTopoServerRef, MultigresCluster,
    TableGroupSpec,
};

use crate::target::split_addresses;
use crate::topo::{BackupSpec, CellSpec, DatabaseSpec, DurabilityPolicyName, TopoError};

/// Everything a cluster registers in its global topology.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    /// Cell records, in the order of `spec.cells`.
    pub cells: Vec<CellSpec>,
    /// Database records, in the order of `spec.databases`.
    pub databases: Vec<DatabaseSpec>,
    /// Whether records the cluster owns but no longer wants are removed.
    pub pruning: bool,
}

/// The identity written in ownership markers: `namespace/name` of the MultigresCluster.
pub fn owner_id(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// The Cell record of a cell of cluster `cluster` in `namespace`: its own root, and the
/// addresses of its local topology server when it has one (the managed etcd's client Service, or
/// the external endpoints), else of the global one. Addresses are `host:port`, as the cell's
/// pods dial them.
pub fn cell_record(cluster: &str, namespace: &str, cell: &CellResource) -> CellSpec {
    let name = cell.name.as_str();
    let local = cell.topo_server.as_ref();
    let managed = local.and_then(|t| t.etcd.as_ref());
    let external = local.and_then(|t| t.external.as_ref());
    let (server_addresses, root) = match (managed, external) {
        (Some(etcd), _) => (
            vec![names::topo_client_address(
                &names::local_topo_server(cluster, name),
                namespace,
            )],
            etcd.root_path.clone(),
        ),
        (None, Some(external)) => (
            external
                .endpoints
                .iter()
                .map(|e| host_port(e.as_str()))
                .collect(),
            external.root_path.clone(),
        ),
        (None, None) => (global_addresses(&cell.global_topo_server), None),
    };
    CellSpec {
        name: name.to_owned(),
        server_addresses,
        root: root.unwrap_or_else(|| defaults::cell_root(name)),
    }
}

fn global_addresses(topo_ref: &GlobalTopoServerRef) -> Vec<String> {
    split_addresses(&topo_ref.address)
}

fn host_port(url: &str) -> String {
    url.strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
        .unwrap_or(url)
        .trim_end_matches('/')
        .to_owned()
}

/// Every record `cluster` (resolved as `resolved`) should have: a Cell record per cell, and per
/// database a Database record listing every cell, with the backup location and durability
/// policy of its default table group (the one Multigres serves). Fails when a record would be
/// unusable by Multigres (for example a relative backup path).
pub fn topology(
    cluster: &MultigresCluster,
    resolved: &ResolvedCluster,
) -> Result<Topology, TopoError> {
    let name = cluster.metadata.name.as_deref().unwrap_or_default();
    let namespace = cluster.metadata.namespace.as_deref().unwrap_or_default();
    let cells: Vec<CellSpec> = resolved
        .cells
        .iter()
        .map(|c| cell_record(name, namespace, &c.spec))
        .collect();
    let cell_names: Vec<String> = cells.iter().map(|c| c.name.clone()).collect();
    let mut databases: Vec<DatabaseSpec> = Vec::new();
    for tg in &resolved.table_groups {
        let database = tg.database_name.as_str();
        if databases.iter().any(|d| d.name == database) {
            continue;
        }
        let chosen = resolved
            .table_groups
            .iter()
            .filter(|t| t.database_name.as_str() == database)
            .find(|t| t.default)
            .unwrap_or(tg);
        databases.push(database_record(chosen, &cell_names)?);
    }
    for spec in &cells {
        spec.validate()?;
    }
    for spec in &databases {
        spec.validate()?;
    }
    let pruning = cluster
        .spec
        .topology_pruning
        .as_ref()
        .and_then(|p| p.enabled)
        .unwrap_or(true);
    Ok(Topology {
        cells,
        databases,
        pruning,
    })
}

fn database_record(tg: &TableGroupSpec, cells: &[String]) -> Result<DatabaseSpec, TopoError> {
    let durability = tg
        .durability_policy
        .as_deref()
        .unwrap_or(defaults::DURABILITY_POLICY)
        .parse::<DurabilityPolicyName>()?;
    let backup = tg.backup.as_ref();
    Ok(DatabaseSpec {
        name: tg.database_name.as_str().to_owned(),
        cells: cells.to_vec(),
        backup: backup.map_or_else(default_backup, backup_spec),
        require_initial_repo_encryption: backup.is_some_and(|b| b.encryption.is_some()),
        durability,
    })
}

fn default_backup() -> BackupSpec {
    BackupSpec::Filesystem {
        path: defaults::BACKUP_PATH.to_owned(),
    }
}

fn backup_spec(backup: &BackupConfig) -> BackupSpec {
    match (backup.type_, &backup.s3) {
        (BackupType::S3, Some(s3)) => BackupSpec::S3 {
            bucket: s3.bucket.clone(),
            region: s3.region.clone(),
            endpoint: s3.endpoint.clone().unwrap_or_default(),
            key_prefix: s3.key_prefix.clone().unwrap_or_default(),
            // Multigres hands pgBackRest the AWS_* variables only when the record says so;
            // a credentials Secret arrives as exactly those variables.
            use_env_credentials: s3.use_env_credentials || s3.credentials_secret.is_some(),
        },
        _ => BackupSpec::Filesystem {
            path: backup
                .filesystem
                .as_ref()
                .and_then(|f| f.path.clone())
                .unwrap_or_else(|| defaults::BACKUP_PATH.to_owned()),
        },
    }
}

#[cfg(test)]
mod tests;
