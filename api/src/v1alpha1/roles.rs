//! PostgreSQL roles the operator keeps in every shard: the application role each cluster gets
//! by default, and the roles a user declares. The superuser stays the operator's.

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::DNS_SUBDOMAIN_PATTERN;

/// What a role name may be: a lowercase PostgreSQL identifier, so it needs no quoting in a
/// connection string and means the same in every client. Names starting with `pg_` are
/// PostgreSQL's own.
pub const ROLE_NAME_PATTERN: &str = "^[a-z_][a-z0-9_]{0,62}$";

/// The role the web UI reads the topology tables as; the operator keeps it, so no declared
/// role may take its name.
pub const WEB_UI_ROLE: &str = "multiadmin_web";

/// The role postgres_exporter logs in as: a member of `pg_monitor` (reads every statistics
/// view and setting, no data); the operator keeps it, so no declared role may take its name.
pub const MONITOR_ROLE: &str = "multigres_monitor";

/// The predefined role whose members read PostgreSQL's statistics.
pub const PG_MONITOR: &str = "pg_monitor";

/// The application role's name when `applicationRole.name` is unset.
pub const DEFAULT_APPLICATION_ROLE: &str = "app";

/// Predefined roles that read or write the server's files or run programs as the server's
/// operating-system user, which is as much as a superuser may: never granted to a declared role.
pub const SUPERUSER_EQUIVALENT_ROLES: [&str; 3] = [
    "pg_execute_server_program",
    "pg_read_server_files",
    "pg_write_server_files",
];

/// The application role: a login role that is no superuser and owns the schema of its own
/// name in database `postgres` (first on PostgreSQL's default `search_path`, so an
/// application's tables land there).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApplicationRoleConfig {
    /// Whether the cluster has an application role. Default true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,

    /// Name of the role (and of its schema). Default `app`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63), regex(pattern = ROLE_NAME_PATTERN))]
    #[x_kube(validation = Rule::new("!self.startsWith('pg_') && self != 'multiadmin_web'")
        .message("spec.applicationRole.name: names starting with pg_ are PostgreSQL's and multiadmin_web is the operator's; choose another"))]
    pub name: Option<String>,

    /// Secret, in the cluster's namespace, with the role's password. Unset: the operator
    /// generates one, once, in Secret `<cluster>-app`, which also holds the connection
    /// settings (`username`, `password`, `host`, `port`, `dbname`, `uri`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_secret: Option<RolePasswordSecret>,
}

impl ApplicationRoleConfig {
    /// The application role's name, unless the cluster has none.
    pub fn role_name(config: Option<&Self>) -> Option<&str> {
        match config {
            Some(c) if c.enabled == Some(false) => None,
            Some(Self { name: Some(n), .. }) => Some(n),
            _ => Some(DEFAULT_APPLICATION_ROLE),
        }
    }
}

/// A key of a Secret in the cluster's namespace that holds a role's password. The operator
/// only reads it; edit it to change the password (no restart).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolePasswordSecret {
    /// Name of the Secret (a DNS subdomain).
    #[schemars(length(min = 1, max = 253), regex(pattern = DNS_SUBDOMAIN_PATTERN))]
    pub name: String,

    /// Key of the password in the Secret. Default `password`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), regex(pattern = "^[-._a-zA-Z0-9]+$"))]
    pub key: Option<String>,
}

impl RolePasswordSecret {
    /// The key holding the password.
    pub fn key(&self) -> &str {
        self.key.as_deref().unwrap_or("password")
    }
}

/// Whether a declared role should exist.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum RoleEnsure {
    /// Created if missing and kept as declared (the default).
    #[default]
    #[serde(rename = "present")]
    Present,
    /// Dropped. Removing a role from the list leaves it in PostgreSQL, untouched; only this
    /// drops it. A role that owns objects is not dropped: the error is reported.
    #[serde(rename = "absent")]
    Absent,
}

/// A PostgreSQL role the operator keeps in every shard: created when missing, altered when
/// this or its password Secret changes. It is never a superuser and never may create roles,
/// replicate or bypass row security.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!self.name.startsWith('pg_') && self.name != 'multiadmin_web'")
    .message("spec.roles[].name: names starting with pg_ are PostgreSQL's and multiadmin_web is the operator's; choose another"))]
#[x_kube(validation = Rule::new("!has(self.inRoles) || !(self.name in self.inRoles)")
    .message("spec.roles[].inRoles: a role cannot be a member of itself"))]
#[x_kube(validation = Rule::new("!has(self.inRoles) || self.inRoles.all(r, !(r in ['pg_execute_server_program', 'pg_read_server_files', 'pg_write_server_files']))")
    .message("spec.roles[].inRoles: pg_execute_server_program, pg_read_server_files and pg_write_server_files give a superuser's access to the server; they are not granted"))]
pub struct ManagedRole {
    /// Role name: a lowercase identifier, not starting with `pg_`.
    #[schemars(length(max = 63), regex(pattern = ROLE_NAME_PATTERN))]
    pub name: String,

    /// `present` (default) or `absent` (drop it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ensure: Option<RoleEnsure>,

    /// Whether the role may log in. Default true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub login: Option<bool>,

    /// Most concurrent connections of the role to one shard; -1 (default) is no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = -1))]
    pub connection_limit: Option<i32>,

    /// When the role's password stops working (RFC 3339, e.g. `2027-01-01T00:00:00Z`).
    /// Unset: never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("format" = "date-time"))]
    pub valid_until: Option<String>,

    /// Roles this role is a member of (at most 16), e.g. `pg_read_all_data`; memberships not
    /// listed are revoked.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(max = 63), regex(pattern = ROLE_NAME_PATTERN)))]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub in_roles: Vec<String>,

    /// Secret with the role's password. Unset: the role has no password and cannot log in
    /// through the gateway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_secret: Option<RolePasswordSecret>,
}

impl ManagedRole {
    /// Whether the role should exist.
    pub fn present(&self) -> bool {
        self.ensure.unwrap_or_default() == RoleEnsure::Present
    }
}

/// How a role stands in the cluster's shards.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum RoleState {
    /// As declared in every shard.
    Reconciled,
    /// Dropped from every shard (`ensure: absent`).
    Dropped,
    /// Not yet in every shard: a shard has no primary yet, or its password Secret is missing.
    Pending,
    /// PostgreSQL refused a statement; the message says which.
    Failed,
}

/// A role's state, as the operator last applied it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RoleStatus {
    /// Role name.
    pub name: String,
    /// `Reconciled`, `Dropped`, `Pending` or `Failed`.
    pub state: RoleState,
    /// What is waiting or what failed, and where.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}
