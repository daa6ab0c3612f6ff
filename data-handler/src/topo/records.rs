//! What the operator wants in the Cell and Database records, and how that is merged into what is
//! stored: pure functions, no I/O.
//!
//! The operator manages `Cell.{name, server_addresses, root}` and `Database.{name, cells,
//! backup_location (location and require_initial_repo_encryption), bootstrap_durability_policy}`.
//! Everything else in a stored record (`BackupLocation.authoritative_generation`, fields a newer
//! Multigres adds) belongs to Multigres and is carried over untouched.

use std::str::FromStr;

use multigres_proto::topo::{
    BackupLocation, Cell, Database, DurabilityPolicy, FilesystemBackup, S3Backup, backup_location,
};
use prost::Message;

// Re-exported so `topo::records::DurabilityPolicyName` keeps working since the type moved out.
pub use super::durability::DurabilityPolicyName;
use super::error::{RecordError, TopoError};
use super::paths::default_cell_root;
use super::wire;

// Field numbers from Multigres' clustermetadata.proto.
const CELL_MANAGED: &[u64] = &[1, 2, 3];
const DATABASE_NAME: u64 = 1;
const DATABASE_BACKUP_LOCATION: u64 = 2;
const DATABASE_CELLS: u64 = 3;
const DATABASE_POLICY: u64 = 4;
/// `filesystem`, `s3` and `require_initial_repo_encryption`; not `authoritative_generation`.
const BACKUP_LOCATION_MANAGED: &[u64] = &[1, 2, 3];

/// The Cell record the operator wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CellSpec {
    /// Cell name; also the key segment.
    pub name: String,
    /// etcd addresses (`host:port`) of the cell topology, as reachable from the cell's pods.
    pub server_addresses: Vec<String>,
    /// Key prefix of the cell's records in that etcd.
    pub root: String,
}

impl CellSpec {
    /// A cell whose records live under the upstream default root `/multigres/<cell>`.
    pub fn new(name: impl Into<String>, server_addresses: Vec<String>) -> Self {
        let name = name.into();
        let root = default_cell_root(&name);
        Self {
            name,
            server_addresses,
            root,
        }
    }

    /// Rejects specs Multigres could not use.
    pub fn validate(&self) -> Result<(), TopoError> {
        validate_name("cell", &self.name)?;
        if self.name.contains('_') {
            return Err(invalid(
                "cell",
                &self.name,
                "must not contain '_' (Multigres uses it as a separator in component ids)",
            ));
        }
        if self.server_addresses.is_empty() {
            return Err(invalid(
                "cell",
                &self.name,
                "needs at least one server address",
            ));
        }
        if let Some(bad) = self.server_addresses.iter().find(|a| !is_host_port(a)) {
            return Err(invalid(
                "cell",
                &self.name,
                &format!("server address {bad:?} is not host:port (no scheme)"),
            ));
        }
        if self.root.is_empty() {
            return Err(invalid("cell", &self.name, "needs a non-empty root"));
        }
        Ok(())
    }

    /// The record as it would be written to an empty key.
    pub fn to_record(&self) -> Cell {
        Cell {
            name: self.name.clone(),
            server_addresses: self.server_addresses.clone(),
            root: self.root.clone(),
        }
    }
}

/// Where a database's backups live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackupSpec {
    /// A filesystem path shared by every pooler of a shard.
    Filesystem { path: String },
    /// An S3 (or compatible) bucket.
    S3 {
        bucket: String,
        region: String,
        endpoint: String,
        key_prefix: String,
        use_env_credentials: bool,
    },
}

impl BackupSpec {
    fn validate(&self, database: &str) -> Result<(), TopoError> {
        match self {
            Self::Filesystem { path } if !path.starts_with('/') => Err(invalid(
                "database",
                database,
                &format!("filesystem backup path {path:?} must be absolute"),
            )),
            Self::S3 { bucket, region, .. } if bucket.is_empty() || region.is_empty() => {
                Err(invalid(
                    "database",
                    database,
                    "S3 backups need a bucket and a region",
                ))
            }
            _ => Ok(()),
        }
    }

    fn to_location(&self) -> backup_location::Location {
        match self {
            Self::Filesystem { path } => {
                backup_location::Location::Filesystem(FilesystemBackup { path: path.clone() })
            }
            Self::S3 {
                bucket,
                region,
                endpoint,
                key_prefix,
                use_env_credentials,
            } => backup_location::Location::S3(S3Backup {
                bucket: bucket.clone(),
                region: region.clone(),
                endpoint: endpoint.clone(),
                key_prefix: key_prefix.clone(),
                use_env_credentials: *use_env_credentials,
            }),
        }
    }
}

// Parsing lives here rather than in `durability` because its error is a `TopoError`.
impl FromStr for DurabilityPolicyName {
    type Err = TopoError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "AT_LEAST_2" => Ok(Self::AtLeast2),
            "MULTI_CELL_AT_LEAST_2" => Ok(Self::MultiCellAtLeast2),
            other => Err(TopoError::UnknownDurabilityPolicy {
                given: other.to_string(),
            }),
        }
    }
}

/// The Database record the operator wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatabaseSpec {
    /// Database name; also the key segment and the name clients connect to.
    pub name: String,
    /// Cells serving the database, in the order the cluster lists them.
    pub cells: Vec<String>,
    /// The backup repository.
    pub backup: BackupSpec,
    /// Whether the first backup repository must be created encrypted.
    pub require_initial_repo_encryption: bool,
    /// Quorum rule for bootstrapping shards.
    pub durability: DurabilityPolicyName,
}

impl DatabaseSpec {
    /// Rejects specs Multigres could not use.
    pub fn validate(&self) -> Result<(), TopoError> {
        validate_name("database", &self.name)?;
        for cell in &self.cells {
            validate_name("cell", cell)?;
        }
        self.backup.validate(&self.name)
    }

    /// The record as it would be written to an empty key.
    pub fn to_record(&self) -> Database {
        Database {
            name: self.name.clone(),
            backup_location: Some(BackupLocation {
                location: Some(self.backup.to_location()),
                require_initial_repo_encryption: self.require_initial_repo_encryption,
                authoritative_generation: 0,
            }),
            cells: self.cells.clone(),
            bootstrap_durability_policy: Some(self.durability.to_record()),
        }
    }
}

/// Outcome of merging a spec into the stored bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Merge {
    /// The stored record already says what the spec says: nothing to write.
    Unchanged,
    /// These bytes should be written.
    Write(Vec<u8>),
}

/// Merges `spec` into the stored Cell bytes (`None` when the key is absent).
pub fn merge_cell(existing: Option<&[u8]>, spec: &CellSpec) -> Result<Merge, RecordError> {
    let desired = spec.to_record();
    let Some(existing) = existing else {
        return Ok(Merge::Write(desired.encode_to_vec()));
    };
    let current = Cell::decode(existing)?;
    if current.name == desired.name
        && current.server_addresses == desired.server_addresses
        && current.root == desired.root
    {
        return Ok(Merge::Unchanged);
    }
    Ok(Merge::Write(wire::splice(
        existing,
        &desired.encode_to_vec(),
        CELL_MANAGED,
    )?))
}

/// Merges `spec` into the stored Database bytes (`None` when the key is absent).
///
/// `backup_location.authoritative_generation` and unknown fields are kept. The durability policy
/// is kept as stored (with any description or version) while its name, quorum type and count match
/// the spec, and replaced as a whole when they differ.
pub fn merge_database(existing: Option<&[u8]>, spec: &DatabaseSpec) -> Result<Merge, RecordError> {
    let desired = spec.to_record();
    let Some(existing) = existing else {
        return Ok(Merge::Write(desired.encode_to_vec()));
    };
    let current = Database::decode(existing)?;
    let desired_location = desired.backup_location.clone().unwrap_or_default();
    let current_location = current.backup_location.clone().unwrap_or_default();
    let desired_policy = desired
        .bootstrap_durability_policy
        .clone()
        .unwrap_or_default();
    let policy_matches = current
        .bootstrap_durability_policy
        .as_ref()
        .is_some_and(|p| same_policy(p, &desired_policy));
    let location_matches = current.backup_location.is_some()
        && current_location.location == desired_location.location
        && current_location.require_initial_repo_encryption
            == desired_location.require_initial_repo_encryption;
    if current.name == desired.name
        && current.cells == desired.cells
        && location_matches
        && policy_matches
    {
        return Ok(Merge::Unchanged);
    }

    let location = wire::splice(
        &wire::embedded(existing, DATABASE_BACKUP_LOCATION)?,
        &desired_location.encode_to_vec(),
        BACKUP_LOCATION_MANAGED,
    )?;
    let policy = if policy_matches {
        wire::embedded(existing, DATABASE_POLICY)?
    } else {
        desired_policy.encode_to_vec()
    };
    let mut replacement = Database {
        backup_location: None,
        bootstrap_durability_policy: None,
        ..desired
    }
    .encode_to_vec();
    replacement.extend(wire::encode_embedded(DATABASE_BACKUP_LOCATION, &location));
    replacement.extend(wire::encode_embedded(DATABASE_POLICY, &policy));
    Ok(Merge::Write(wire::splice(
        existing,
        &replacement,
        &[
            DATABASE_NAME,
            DATABASE_BACKUP_LOCATION,
            DATABASE_CELLS,
            DATABASE_POLICY,
        ],
    )?))
}

/// Multigres routes only on quorum type and count; the name identifies the policy.
fn same_policy(a: &DurabilityPolicy, b: &DurabilityPolicy) -> bool {
    a.policy_name == b.policy_name
        && a.quorum_type == b.quorum_type
        && a.required_count == b.required_count
}

/// A single key segment: non-empty, no `/`, not `.` or `..`.
pub(crate) fn validate_name(kind: &str, name: &str) -> Result<(), TopoError> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') {
        return Err(invalid(
            kind,
            name,
            "must be a non-empty key segment without '/'",
        ));
    }
    Ok(())
}

fn is_host_port(address: &str) -> bool {
    !address.contains("://")
        && address
            .rsplit_once(':')
            .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok())
}

fn invalid(kind: &str, name: &str, reason: &str) -> TopoError {
    TopoError::InvalidSpec {
        what: format!("{kind} {name:?}"),
        reason: reason.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use multigres_proto::topo::QuorumType;

    use super::*;

    const DATABASE_HEX: &str = "0a08706f737467726573120c0a0a0a082f6261636b7570731a067a6f6e652d61\
                                22100a0a41545f4c454153545f3218032002";

    fn unhex(text: &str) -> Vec<u8> {
        (0..text.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
            .collect()
    }

    fn postgres() -> DatabaseSpec {
        DatabaseSpec {
            name: "postgres".into(),
            cells: vec!["zone-a".into()],
            backup: BackupSpec::Filesystem {
                path: "/backups".into(),
            },
            require_initial_repo_encryption: false,
            durability: DurabilityPolicyName::AtLeast2,
        }
    }

    fn written(merge: Merge) -> Vec<u8> {
        match merge {
            Merge::Write(bytes) => bytes,
            Merge::Unchanged => panic!("expected a write"),
        }
    }

    #[test]
    fn new_database_is_the_upstream_bytes() {
        assert_eq!(
            written(merge_database(None, &postgres()).unwrap()),
            unhex(DATABASE_HEX)
        );
    }

    #[test]
    fn new_cell_uses_the_default_root() {
        let spec = CellSpec::new("zone-a", vec!["10.0.0.1:2379".into()]);
        let cell = Cell::decode(written(merge_cell(None, &spec).unwrap()).as_slice()).unwrap();
        assert_eq!(cell.root, "/multigres/zone-a");
        assert_eq!(cell.name, "zone-a");
    }

    #[test]
    fn matching_records_are_unchanged() {
        let db = unhex(DATABASE_HEX);
        assert_eq!(
            merge_database(Some(&db), &postgres()).unwrap(),
            Merge::Unchanged
        );
        let spec = CellSpec::new("zone-a", vec!["h:1".into()]);
        let cell = spec.to_record().encode_to_vec();
        assert_eq!(merge_cell(Some(&cell), &spec).unwrap(), Merge::Unchanged);
    }

    #[test]
    fn update_keeps_authoritative_generation_and_unknown_fields() {
        let mut stored = postgres().to_record();
        stored
            .backup_location
            .as_mut()
            .unwrap()
            .authoritative_generation = 1;
        let mut bytes = stored.encode_to_vec();
        // A field a newer Multigres might add: number 15, string "future".
        bytes.extend([0x7a, 6]);
        bytes.extend(b"future");

        let mut spec = postgres();
        spec.cells.push("zone-b".into());
        spec.backup = BackupSpec::Filesystem {
            path: "/other".into(),
        };
        let merged = written(merge_database(Some(&bytes), &spec).unwrap());
        let db = Database::decode(merged.as_slice()).unwrap();
        assert_eq!(db.cells, ["zone-a", "zone-b"]);
        let location = db.backup_location.unwrap();
        assert_eq!(location.authoritative_generation, 1);
        assert_eq!(
            location.location,
            Some(backup_location::Location::Filesystem(FilesystemBackup {
                path: "/other".into()
            }))
        );
        assert!(merged.ends_with(b"\x7a\x06future"), "{merged:02x?}");
        // Re-merging the result is a no-op.
        assert_eq!(
            merge_database(Some(&merged), &spec).unwrap(),
            Merge::Unchanged
        );
    }

    #[test]
    fn switching_backup_kind_replaces_the_oneof() {
        let bytes = postgres().to_record().encode_to_vec();
        let mut spec = postgres();
        spec.backup = BackupSpec::S3 {
            bucket: "b".into(),
            region: "r".into(),
            endpoint: String::new(),
            key_prefix: "p/".into(),
            use_env_credentials: true,
        };
        spec.require_initial_repo_encryption = true;
        let merged = written(merge_database(Some(&bytes), &spec).unwrap());
        assert_eq!(
            Database::decode(merged.as_slice()).unwrap(),
            spec.to_record()
        );
    }

    #[test]
    fn policy_description_is_kept_while_the_policy_is_the_same() {
        let mut stored = postgres().to_record();
        let policy = stored.bootstrap_durability_policy.as_mut().unwrap();
        policy.description = "At least 2 nodes must acknowledge".into();
        policy.policy_version = 1;
        let bytes = stored.encode_to_vec();
        assert_eq!(
            merge_database(Some(&bytes), &postgres()).unwrap(),
            Merge::Unchanged
        );

        let mut spec = postgres();
        spec.cells.push("zone-b".into());
        let merged = written(merge_database(Some(&bytes), &spec).unwrap());
        let kept = Database::decode(merged.as_slice()).unwrap();
        assert_eq!(
            kept.bootstrap_durability_policy,
            stored.bootstrap_durability_policy
        );

        spec.durability = DurabilityPolicyName::MultiCellAtLeast2;
        let merged = written(merge_database(Some(&bytes), &spec).unwrap());
        let replaced = Database::decode(merged.as_slice()).unwrap();
        let policy = replaced.bootstrap_durability_policy.unwrap();
        assert_eq!(policy, DurabilityPolicyName::MultiCellAtLeast2.to_record());
        assert_eq!(policy.quorum_type(), QuorumType::MultiCellAtLeastN);
        assert!(policy.description.is_empty(), "stale description dropped");
    }

    #[test]
    fn cell_update_keeps_unknown_fields() {
        let spec = CellSpec::new("zone-a", vec!["a:1".into()]);
        let mut bytes = spec.to_record().encode_to_vec();
        bytes.extend([0x20, 5]); // field 4, varint 5
        let mut changed = spec.clone();
        changed.server_addresses = vec!["b:2".into(), "c:3".into()];
        let merged = written(merge_cell(Some(&bytes), &changed).unwrap());
        assert_eq!(
            Cell::decode(merged.as_slice()).unwrap(),
            changed.to_record()
        );
        assert!(merged.ends_with(&[0x20, 5]));
    }

    #[test]
    fn malformed_records_are_errors() {
        assert!(
            merge_cell(
                Some(&[0x0a, 9, b'x']),
                &CellSpec::new("z", vec!["a:1".into()])
            )
            .is_err()
        );
        assert!(merge_database(Some(&[0xff]), &postgres()).is_err());
    }

    #[test]
    fn durability_policy_names() {
        assert_eq!(
            "AT_LEAST_2".parse::<DurabilityPolicyName>().unwrap(),
            DurabilityPolicyName::AtLeast2
        );
        let err = "AT_LEAST_3".parse::<DurabilityPolicyName>().unwrap_err();
        let text = err.to_string();
        assert!(text.contains("AT_LEAST_3"), "{text}");
        for allowed in DurabilityPolicyName::ALLOWED {
            assert!(text.contains(allowed), "{text}");
            assert_eq!(
                allowed.parse::<DurabilityPolicyName>().unwrap().as_str(),
                *allowed
            );
        }
        assert!(!err.is_transient());
    }

    #[test]
    fn specs_are_validated() {
        assert!(
            CellSpec::new("zone-a", vec!["h:2379".into()])
                .validate()
                .is_ok()
        );
        assert!(
            CellSpec::new("zone_a", vec!["h:2379".into()])
                .validate()
                .is_err()
        );
        assert!(
            CellSpec::new("a/b", vec!["h:2379".into()])
                .validate()
                .is_err()
        );
        assert!(CellSpec::new("zone-a", vec![]).validate().is_err());
        assert!(
            CellSpec::new("zone-a", vec!["http://h:2379".into()])
                .validate()
                .is_err()
        );
        assert!(
            CellSpec::new("zone-a", vec!["h".into()])
                .validate()
                .is_err()
        );
        assert!(postgres().validate().is_ok());
        let mut relative = postgres();
        relative.backup = BackupSpec::Filesystem {
            path: "backups".into(),
        };
        assert!(relative.validate().is_err());
        let mut no_region = postgres();
        no_region.backup = BackupSpec::S3 {
            bucket: "b".into(),
            region: String::new(),
            endpoint: String::new(),
            key_prefix: String::new(),
            use_env_credentials: false,
        };
        assert!(no_region.validate().is_err());
    }
}
