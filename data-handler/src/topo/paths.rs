//! Key layout of the Multigres topology in etcd.
//!
//! Multigres builds every key with Go's `path.Join(root, relative)`, which cleans the result
//! (no doubled or trailing slashes, no `.` segments). [`join`] reproduces that so the operator
//! writes exactly the keys Multigres reads.

/// Global root the operator uses when none is configured (the upstream default).
pub const DEFAULT_GLOBAL_ROOT: &str = "/multigres/global";

/// File name of a cell record, below `cells/<cell>/`.
pub const CELL_FILE: &str = "Cell";
/// File name of a database record, below `databases/<db>/`.
pub const DATABASE_FILE: &str = "Database";
/// File name of a pooler record, below `poolers/<pooler id>/` in a cell topology.
pub const POOLER_FILE: &str = "Pooler";

const CELLS_DIR: &str = "cells";
const DATABASES_DIR: &str = "databases";
const POOLERS_DIR: &str = "poolers";
/// Directory of the operator's ownership markers, below the global root. Multigres only reads
/// `cells/`, `databases/` and `backups/` there, so it never sees these keys.
const OWNERS_DIR: &str = "operator-owners";

/// The kinds of global record the operator writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RecordKind {
    /// `cells/<cell>/Cell`.
    Cell,
    /// `databases/<db>/Database`.
    Database,
}

impl RecordKind {
    fn dir(self) -> &'static str {
        match self {
            Self::Cell => CELLS_DIR,
            Self::Database => DATABASES_DIR,
        }
    }

    fn from_dir(dir: &str) -> Option<Self> {
        match dir {
            CELLS_DIR => Some(Self::Cell),
            DATABASES_DIR => Some(Self::Database),
            _ => None,
        }
    }
}

impl std::fmt::Display for RecordKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Cell => "cell",
            Self::Database => "database",
        })
    }
}

/// One global record: its kind and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RecordRef {
    /// Cell or Database.
    pub kind: RecordKind,
    /// The cell or database name.
    pub name: String,
}

impl RecordRef {
    /// The Cell record of `name`.
    pub fn cell(name: impl Into<String>) -> Self {
        Self {
            kind: RecordKind::Cell,
            name: name.into(),
        }
    }

    /// The Database record of `name`.
    pub fn database(name: impl Into<String>) -> Self {
        Self {
            kind: RecordKind::Database,
            name: name.into(),
        }
    }
}

impl std::fmt::Display for RecordRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.kind, self.name)
    }
}

/// Joins path elements the way Go's `path.Join` does: empty elements are ignored, the result is
/// cleaned, and it is empty only when every element is.
pub fn join(elements: &[&str]) -> String {
    let non_empty: Vec<&str> = elements.iter().copied().filter(|e| !e.is_empty()).collect();
    if non_empty.is_empty() {
        return String::new();
    }
    clean(&non_empty.join("/"))
}

/// Go's `path.Clean` for the paths topology keys use.
fn clean(path: &str) -> String {
    let rooted = path.starts_with('/');
    let mut segments: Vec<&str> = Vec::new();
    for segment in path.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                if segments.last().is_some_and(|s| *s != "..") {
                    segments.pop();
                } else if !rooted {
                    segments.push("..");
                }
            }
            other => segments.push(other),
        }
    }
    let body = segments.join("/");
    match (rooted, body.is_empty()) {
        (true, _) => format!("/{body}"),
        (false, true) => ".".to_string(),
        (false, false) => body,
    }
}

/// The per-cell root Multigres' own tooling uses, `/multigres/<cell>`; a distinct root per cell
/// keeps cell data apart from the global records.
pub fn default_cell_root(cell: &str) -> String {
    join(&["/multigres", cell])
}

/// Keys of the records in the global topology.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GlobalPaths {
    root: String,
}

impl GlobalPaths {
    /// Paths below `root` (cleaned like Multigres does).
    pub fn new(root: &str) -> Self {
        Self {
            root: join(&[root]),
        }
    }

    /// The cleaned global root.
    pub fn root(&self) -> &str {
        &self.root
    }

    /// `<root>/cells/<cell>/Cell`.
    pub fn cell(&self, cell: &str) -> String {
        join(&[&self.root, CELLS_DIR, cell, CELL_FILE])
    }

    /// `<root>/databases/<db>/Database`.
    pub fn database(&self, database: &str) -> String {
        join(&[&self.root, DATABASES_DIR, database, DATABASE_FILE])
    }

    /// The key of a record.
    pub fn record(&self, record: &RecordRef) -> String {
        match record.kind {
            RecordKind::Cell => self.cell(&record.name),
            RecordKind::Database => self.database(&record.name),
        }
    }

    /// `<root>/operator-owners/<cells|databases>/<name>`: the ownership marker of a record,
    /// holding the identity of the MultigresCluster that registered it, so clusters sharing a
    /// root never overwrite or prune each other's records.
    pub fn owner(&self, record: &RecordRef) -> String {
        join(&[&self.root, OWNERS_DIR, record.kind.dir(), &record.name])
    }

    /// Prefix listing every ownership marker, `<root>/operator-owners/`.
    pub fn owners_prefix(&self) -> String {
        dir_prefix(&[&self.root, OWNERS_DIR])
    }

    /// The record an ownership marker key stands for.
    pub fn owned_record_of(&self, key: &str) -> Option<RecordRef> {
        let (dir, name) = key.strip_prefix(&self.owners_prefix())?.split_once('/')?;
        let kind = RecordKind::from_dir(dir)?;
        (!name.is_empty() && !name.contains('/')).then(|| RecordRef {
            kind,
            name: name.to_string(),
        })
    }

    /// Prefix listing every cell directory, `<root>/cells/`.
    pub fn cells_prefix(&self) -> String {
        dir_prefix(&[&self.root, CELLS_DIR])
    }

    /// Prefix listing every database directory, `<root>/databases/`.
    pub fn databases_prefix(&self) -> String {
        dir_prefix(&[&self.root, DATABASES_DIR])
    }

    /// The cell name when `key` is a Cell record key.
    pub fn cell_name_of<'k>(&self, key: &'k str) -> Option<&'k str> {
        record_name(key, &self.cells_prefix(), CELL_FILE)
    }

    /// The database name when `key` is exactly a Database record key, `None` for other keys
    /// below `databases/` (shard init claims, locks).
    pub fn database_name_of<'k>(&self, key: &'k str) -> Option<&'k str> {
        record_name(key, &self.databases_prefix(), DATABASE_FILE)
    }
}

/// Prefix listing every pooler record of a cell, `<cell root>/poolers/`.
pub fn poolers_prefix(cell_root: &str) -> String {
    dir_prefix(&[cell_root, POOLERS_DIR])
}

/// The pooler directory name (`multipooler-<cell>-<service id>`) when `key` is a pooler record.
pub fn pooler_id_of<'k>(key: &'k str, cell_root: &str) -> Option<&'k str> {
    record_name(key, &poolers_prefix(cell_root), POOLER_FILE)
}

fn dir_prefix(elements: &[&str]) -> String {
    let dir = join(elements);
    if dir == "/" { dir } else { format!("{dir}/") }
}

/// `<prefix><name>/<file>` → `name`.
fn record_name<'k>(key: &'k str, prefix: &str, file: &str) -> Option<&'k str> {
    let (name, rest) = key.strip_prefix(prefix)?.split_once('/')?;
    (rest == file && !name.is_empty()).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_matches_go_path_join() {
        assert_eq!(
            join(&["/multigres/global", "cells/zone1/Cell"]),
            "/multigres/global/cells/zone1/Cell"
        );
        assert_eq!(
            join(&["/multigres/global/", "/cells//z/"]),
            "/multigres/global/cells/z"
        );
        assert_eq!(join(&["", "cells/z/Cell"]), "cells/z/Cell");
        assert_eq!(join(&["", ""]), "");
        assert_eq!(join(&["/a/./b", "../c"]), "/a/c");
        assert_eq!(join(&["/", ".."]), "/");
        assert_eq!(join(&["a", "../.."]), "..");
    }

    #[test]
    fn global_record_keys() {
        let paths = GlobalPaths::new("/multigres/global/");
        assert_eq!(paths.root(), "/multigres/global");
        assert_eq!(paths.cell("zone-a"), "/multigres/global/cells/zone-a/Cell");
        assert_eq!(
            paths.database("postgres"),
            "/multigres/global/databases/postgres/Database"
        );
        assert_eq!(paths.cells_prefix(), "/multigres/global/cells/");
        assert_eq!(paths.databases_prefix(), "/multigres/global/databases/");
    }

    #[test]
    fn empty_root_gives_relative_keys() {
        let paths = GlobalPaths::new("");
        assert_eq!(paths.cell("z"), "cells/z/Cell");
        assert_eq!(paths.cells_prefix(), "cells/");
        assert_eq!(GlobalPaths::new("/").cells_prefix(), "/cells/");
    }

    #[test]
    fn cell_roots_and_pooler_keys() {
        assert_eq!(default_cell_root("zone-a"), "/multigres/zone-a");
        assert_eq!(
            poolers_prefix("/multigres/zone-a"),
            "/multigres/zone-a/poolers/"
        );
        let key = "/multigres/zone-a/poolers/multipooler-zone-a-p-1/Pooler";
        assert_eq!(
            pooler_id_of(key, "/multigres/zone-a"),
            Some("multipooler-zone-a-p-1")
        );
        assert_eq!(pooler_id_of(key, "/multigres/zone-b"), None);
        assert_eq!(
            pooler_id_of("/multigres/zone-a/poolers/x/Gateway", "/multigres/zone-a"),
            None
        );
    }

    #[test]
    fn ownership_markers_live_outside_what_multigres_reads() {
        let paths = GlobalPaths::new("/multigres/global");
        let cell = RecordRef::cell("zone-a");
        let database = RecordRef::database("postgres");
        assert_eq!(
            paths.owner(&cell),
            "/multigres/global/operator-owners/cells/zone-a"
        );
        assert_eq!(
            paths.owner(&database),
            "/multigres/global/operator-owners/databases/postgres"
        );
        assert_eq!(paths.owners_prefix(), "/multigres/global/operator-owners/");
        for record in [&cell, &database] {
            let marker = paths.owner(record);
            assert!(!marker.starts_with(&paths.cells_prefix()));
            assert!(!marker.starts_with(&paths.databases_prefix()));
            assert_eq!(paths.owned_record_of(&marker).as_ref(), Some(record));
        }
        assert_eq!(paths.record(&cell), paths.cell("zone-a"));
        assert_eq!(paths.record(&database), paths.database("postgres"));
        assert_eq!(
            paths.owned_record_of("/multigres/global/operator-owners/shards/x"),
            None
        );
        assert_eq!(
            paths.owned_record_of("/multigres/global/operator-owners/cells/a/b"),
            None
        );
        assert_eq!(cell.to_string(), "cell zone-a");
    }

    #[test]
    fn database_records_are_told_apart_from_claims_and_locks() {
        let paths = GlobalPaths::new("/g");
        assert_eq!(
            paths.database_name_of("/g/databases/postgres/Database"),
            Some("postgres")
        );
        assert_eq!(
            paths.database_name_of("/g/databases/postgres/default/0-inf/ShardInitClaim"),
            None
        );
        assert_eq!(
            paths.database_name_of("/g/databases/postgres/default/0-inf/locks/7"),
            None
        );
        assert_eq!(paths.database_name_of("/g/cells/postgres/Database"), None);
        assert_eq!(paths.cell_name_of("/g/cells/zone-a/Cell"), Some("zone-a"));
        assert_eq!(paths.cell_name_of("/g/cells/zone-a/Other"), None);
    }
}
