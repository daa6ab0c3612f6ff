//! The etcd side of a cluster's topology: claim, register, prune and release its records. No
//! Kubernetes here; the controllers call these with a connected [`TopoStore`].
//!
//! Every record a cluster registers carries an ownership marker naming the cluster
//! ([`TopoStore::claim`]). A cluster only ever overwrites, prunes or deletes records it holds,
//! so clusters sharing a topology root (an external etcd with the same `rootPath`) cannot
//! remove each other's entries, and a second cluster naming the same cell or database is
//! refused instead of fighting over the record.

use std::collections::BTreeMap;

use multigres_proto::topo::Cell;

use crate::desired::Topology;
use crate::topo::{CellSpec, RecordKind, RecordRef, Registration, TopoError, TopoStore};

/// What a registration pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Registered {
    /// Every wanted record and what registering it did.
    pub records: Vec<(RecordRef, Registration)>,
    /// Records removed because the spec no longer has them.
    pub pruned: Vec<RecordRef>,
    /// Records the spec no longer has but that had to stay, and why.
    pub kept: Vec<(RecordRef, String)>,
}

impl Registered {
    /// The records that were created or rewritten (not those already matching).
    pub fn written(&self) -> impl Iterator<Item = &(RecordRef, Registration)> {
        self.records
            .iter()
            .filter(|(_, r)| *r != Registration::Unchanged)
    }
}

/// The records of `topology`, cells first: a Database record names cells, so they exist
/// before it does.
pub fn wanted(topology: &Topology) -> Vec<RecordRef> {
    topology
        .cells
        .iter()
        .map(|c| RecordRef::cell(&c.name))
        .chain(
            topology
                .databases
                .iter()
                .map(|d| RecordRef::database(&d.name)),
        )
        .collect()
}

/// Records `owner` holds (per `owners`) in removal order: Database records first, since a
/// Cell record cannot go while a Database record names it.
pub fn held_by(owners: &BTreeMap<RecordRef, String>, owner: &str) -> Vec<RecordRef> {
    let mut held: Vec<RecordRef> = owners
        .iter()
        .filter(|(_, holder)| *holder == owner)
        .map(|(record, _)| record.clone())
        .collect();
    held.sort_by_key(|r| (r.kind != RecordKind::Database, r.name.clone()));
    held
}

/// Records `owner` holds that `topology` no longer wants, in removal order. Records held by
/// other clusters, and records without a marker (written by someone else), are never listed.
pub fn prune_plan(
    owners: &BTreeMap<RecordRef, String>,
    owner: &str,
    topology: &Topology,
) -> Vec<RecordRef> {
    let wanted = wanted(topology);
    held_by(owners, owner)
        .into_iter()
        .filter(|r| !wanted.contains(r))
        .collect()
}

/// Claims and registers every record of `topology` for `owner`, then, when pruning is on,
/// removes the records `owner` holds that it no longer wants. `owners` is what
/// [`TopoStore::owners`] returned just before. A wanted record held by another cluster stops
/// the pass before anything is written. A stale cell that a Database record still names is kept
/// and reported, not an error.
pub async fn register(
    store: &TopoStore,
    owner: &str,
    topology: &Topology,
    owners: &BTreeMap<RecordRef, String>,
) -> Result<Registered, TopoError> {
    let wanted = wanted(topology);
    for record in &wanted {
        if let Some(holder) = owners.get(record).filter(|h| *h != owner) {
            return Err(TopoError::OwnedByOther {
                record: record.to_string(),
                owner: holder.clone(),
            });
        }
    }
    for record in wanted.iter().filter(|r| !owners.contains_key(r)) {
        store.claim(record, owner).await?;
    }
    let mut done = Registered::default();
    for cell in &topology.cells {
        let outcome = store.register_cell(cell).await?;
        done.records.push((RecordRef::cell(&cell.name), outcome));
    }
    for database in &topology.databases {
        let outcome = store.register_database(database).await?;
        done.records
            .push((RecordRef::database(&database.name), outcome));
    }
    if topology.pruning {
        for record in prune_plan(owners, owner, topology) {
            match store.release(&record, owner).await {
                Ok(_) => done.pruned.push(record),
                Err(TopoError::CellReferenced { databases, .. }) => {
                    let why = format!("database record(s) {} still list it", databases.join(", "));
                    done.kept.push((record, why));
                }
                Err(error) => return Err(error),
            }
        }
    }
    Ok(done)
}

/// Removes every record `owner` holds, with its markers; returns the records removed.
pub async fn deregister(store: &TopoStore, owner: &str) -> Result<Vec<RecordRef>, TopoError> {
    let owners = store.owners().await?;
    let mut removed = Vec::new();
    for record in held_by(&owners, owner) {
        if store.release(&record, owner).await? {
            removed.push(record);
        }
    }
    Ok(removed)
}

/// How a stored Cell record compares with what a Cell wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CellState {
    /// The record says what the spec says.
    Registered,
    /// No record.
    Missing,
    /// The record says something else.
    Differs {
        /// What is stored.
        stored: Cell,
    },
}

/// Compares a stored record (`None` when absent) with `spec` on the fields the operator
/// manages.
pub fn cell_state(stored: Option<Cell>, spec: &CellSpec) -> CellState {
    let Some(stored) = stored else {
        return CellState::Missing;
    };
    let wanted = spec.to_record();
    if stored.name == wanted.name
        && stored.server_addresses == wanted.server_addresses
        && stored.root == wanted.root
    {
        CellState::Registered
    } else {
        CellState::Differs { stored }
    }
}

/// Reads the Cell record of `spec` and compares it (no write).
pub async fn check_cell(store: &TopoStore, spec: &CellSpec) -> Result<CellState, TopoError> {
    Ok(cell_state(store.get_cell(&spec.name).await?, spec))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topo::{BackupSpec, DatabaseSpec, DurabilityPolicyName};

    fn topology(cells: &[&str], databases: &[&str]) -> Topology {
        Topology {
            cells: cells
                .iter()
                .map(|c| CellSpec::new(*c, vec!["etcd:2379".into()]))
                .collect(),
            databases: databases
                .iter()
                .map(|d| DatabaseSpec {
                    name: (*d).into(),
                    cells: cells.iter().map(|c| (*c).to_owned()).collect(),
                    backup: BackupSpec::Filesystem {
                        path: "/backups".into(),
                    },
                    require_initial_repo_encryption: false,
                    durability: DurabilityPolicyName::AtLeast2,
                })
                .collect(),
            pruning: true,
        }
    }

    fn owners(entries: &[(RecordRef, &str)]) -> BTreeMap<RecordRef, String> {
        entries
            .iter()
            .map(|(r, o)| (r.clone(), (*o).to_owned()))
            .collect()
    }

    #[test]
    fn wanted_lists_cells_before_databases() {
        assert_eq!(
            wanted(&topology(&["b", "a"], &["postgres"])),
            [
                RecordRef::cell("b"),
                RecordRef::cell("a"),
                RecordRef::database("postgres")
            ]
        );
    }

    #[test]
    fn prune_plan_takes_only_our_stale_records_databases_first() {
        let me = "team-a/prod";
        let held = owners(&[
            (RecordRef::cell("zone-a"), me),
            (RecordRef::cell("zone-old"), me),
            (RecordRef::database("postgres"), me),
            (RecordRef::database("legacy"), me),
            // Same root, another cluster: never ours to prune.
            (RecordRef::cell("zone-x"), "team-b/other"),
            (RecordRef::database("other-db"), "team-b/other"),
        ]);
        let plan = prune_plan(&held, me, &topology(&["zone-a"], &["postgres"]));
        assert_eq!(
            plan,
            [RecordRef::database("legacy"), RecordRef::cell("zone-old")]
        );
        let other = prune_plan(&held, "team-b/other", &topology(&[], &[]));
        assert_eq!(
            other,
            [RecordRef::database("other-db"), RecordRef::cell("zone-x")]
        );
        assert!(prune_plan(&held, "nobody/else", &topology(&[], &[])).is_empty());
    }

    #[test]
    fn cell_state_compares_managed_fields() {
        let spec = CellSpec::new("zone-a", vec!["a:1".into()]);
        assert_eq!(cell_state(None, &spec), CellState::Missing);
        assert_eq!(
            cell_state(Some(spec.to_record()), &spec),
            CellState::Registered
        );
        let mut moved = spec.to_record();
        moved.server_addresses = vec!["b:2".into()];
        assert_eq!(
            cell_state(Some(moved.clone()), &spec),
            CellState::Differs { stored: moved }
        );
    }

    #[test]
    fn only_writes_count_as_written() {
        let done = Registered {
            records: vec![
                (RecordRef::cell("a"), Registration::Unchanged),
                (RecordRef::cell("b"), Registration::Created),
                (RecordRef::database("postgres"), Registration::Updated),
            ],
            ..Default::default()
        };
        let written: Vec<_> = done.written().map(|(r, _)| r.name.as_str()).collect();
        assert_eq!(written, ["b", "postgres"]);
    }
}
