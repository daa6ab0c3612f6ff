//! The `multigres.com/v1alpha1` API: CRD types, generated CustomResourceDefinitions and the
//! well-known names Multigres imposes. Pure: no I/O.

pub mod backup_path;
pub mod backup_request;
pub mod backup_schedule;
pub mod confirm;
pub mod crd;
pub mod duration;
pub mod expansion;
pub mod field_support;
pub mod labels;
pub mod managed_roles;
pub mod names;
pub mod network;
pub mod observability;
pub mod owner;
pub mod postgres;
pub mod quantity;
pub mod resolver;
mod schema;
pub mod v1alpha1;
pub mod volumes;

/// API group of every kind.
pub const GROUP: &str = "multigres.com";

/// The only API version, served and stored.
pub const VERSION: &str = "v1alpha1";

/// `apiVersion` of every object of this API.
pub const API_VERSION: &str = "multigres.com/v1alpha1";

/// Category of every kind, so `kubectl get multigres` lists them all.
pub const CATEGORY: &str = "multigres";

/// The only database Multigres supports today.
pub const DEFAULT_DATABASE: &str = "postgres";

/// The only table group Multigres supports today (the database's default one).
pub const DEFAULT_TABLEGROUP: &str = "default";

/// The only shard Multigres supports today: the whole key range.
pub const DEFAULT_SHARD: &str = "0-inf";

/// Name of the pool created when a shard defines none.
pub const DEFAULT_POOL: &str = "default";

/// Name of the namespace template (Core, Cell or Shard) used when a cluster names none.
pub const DEFAULT_TEMPLATE: &str = "default";
