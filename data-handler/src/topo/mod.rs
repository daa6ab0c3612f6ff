//! The Multigres topology in etcd, as the operator sees it.
//!
//! The operator writes the global `Cell` and `Database` records Multigres components read at
//! start-up, and reads the `Multipooler` records poolers publish in their cell topology. The pure
//! parts (key layout, merging a spec into stored bytes) are in [`paths`] and [`records`]; the
//! etcd I/O is [`TopoStore`].

mod config;
mod durability;
mod error;
pub mod paths;
mod pooler;
pub mod records;
mod store;
mod wire;

pub use config::{
    CellTls, DEFAULT_CONNECT_TIMEOUT, DEFAULT_REQUEST_TIMEOUT, TlsPem, TopoConfig, qualified,
};
pub use durability::DurabilityPolicyName;
pub use error::{RecordError, TopoError};
pub use paths::{RecordKind, RecordRef};
pub use pooler::PoolerRecord;
pub use records::{BackupSpec, CellSpec, DatabaseSpec};
pub use store::{EtcdConnection, Expected, Plan, Registration, TopoStore, WritePlan};
pub use wire::WireError;
