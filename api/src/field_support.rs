//! Which user-settable spec fields of MultigresCluster, CoreTemplate, CellTemplate and
//! ShardTemplate have behaviour in this operator, and which are accepted (for manifest
//! compatibility with the upstream operator) but not acted on yet.
//!
//! The registry exists so no accepted field is silently ignored: the webhook warns about every
//! not-yet-implemented field an object sets, a test checks every field of the generated CRDs is
//! classified by exactly one entry, and `docs/field-support.md` is rendered from it.
//!
//! Paths start at `spec`; `[]` stands for every item of a list and `{}` for every value of a
//! map. An entry covers its path and everything below it.

use std::fmt;

use serde_json::Value;

/// The four kinds users write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// MultigresCluster.
    MultigresCluster,
    /// CoreTemplate.
    CoreTemplate,
    /// CellTemplate.
    CellTemplate,
    /// ShardTemplate.
    ShardTemplate,
}

impl Kind {
    /// Every user-written kind, in documentation order.
    pub const ALL: [Kind; 4] = [
        Kind::MultigresCluster,
        Kind::CoreTemplate,
        Kind::CellTemplate,
        Kind::ShardTemplate,
    ];

    /// The kind's name as in `kind:`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::MultigresCluster => "MultigresCluster",
            Kind::CoreTemplate => "CoreTemplate",
            Kind::CellTemplate => "CellTemplate",
            Kind::ShardTemplate => "ShardTemplate",
        }
    }
}

/// Which values of a not-yet-implemented field would have had an effect, and so deserve a
/// warning; the others (unset, empty, disabled) mean the same as leaving the field out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    /// Any value but null, `false`, `""` or an empty list or map (recursively).
    Set,
    /// A block whose `enabled` is `true`.
    Enabled,
    /// A block set without the named field (or with it empty).
    Without(&'static str),
    /// A string other than the given one.
    Other(&'static str),
}

impl When {
    /// Whether `value` would have had an effect.
    fn matches(self, value: &Value) -> bool {
        match self {
            When::Set => meaningful(value),
            When::Enabled => value.get("enabled") == Some(&Value::Bool(true)),
            When::Without(field) => value.is_object() && !value.get(field).is_some_and(meaningful),
            When::Other(expected) => value.as_str().is_some_and(|s| s != expected),
        }
    }
}

impl fmt::Display for When {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            When::Set => write!(f, "when set"),
            When::Enabled => write!(f, "when `enabled: true`"),
            When::Without(field) => write!(f, "when set without `{field}`"),
            When::Other(value) => write!(f, "when not `{value}`"),
        }
    }
}

/// Whether a field has behaviour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Support {
    /// Acted on; the note says where.
    Implemented(&'static str),
    /// Accepted but not acted on yet.
    NotYetImplemented {
        /// What happens instead, shown to the user in the admission warning.
        reason: &'static str,
        /// Which values are worth a warning.
        when: When,
    },
}

/// One registry entry: a field (or a whole subtree) of one kind and its support.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field {
    /// The kind the path belongs to.
    pub kind: Kind,
    /// Path from `spec`, e.g. `spec.cells[].metadata`.
    pub path: &'static str,
    /// Its support.
    pub support: Support,
}

impl Field {
    /// Whether the field has no behaviour yet.
    pub fn is_unimplemented(&self) -> bool {
        matches!(self.support, Support::NotYetImplemented { .. })
    }

    /// Whether this entry covers `path` (the path itself or anything below it).
    pub fn covers(&self, path: &str) -> bool {
        path.strip_prefix(self.path)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[', '{']))
    }
}

/// A difference between the registry and a kind's schema.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CoverageProblem {
    /// A schema field no entry classifies.
    #[error("{kind:?} field {path} is not classified in api/src/field_support.rs")]
    Unclassified {
        /// The kind.
        kind: Kind,
        /// The schema path.
        path: String,
    },
    /// A schema field classified by several entries.
    #[error("{kind:?} field {path} is classified by several entries: {entries:?}")]
    Ambiguous {
        /// The kind.
        kind: Kind,
        /// The schema path.
        path: String,
        /// The overlapping entries.
        entries: Vec<&'static str>,
    },
    /// An entry naming no field of the schema.
    #[error("{kind:?} registry entry {path} names no field of the schema; remove or rename it")]
    Stale {
        /// The kind.
        kind: Kind,
        /// The entry's path.
        path: &'static str,
    },
}

const RESOURCE_HANDLER_PODS: &str = "resource-handler: pod specs";
const TOPO_SERVER: &str = "resource-handler: the TopoServer etcd StatefulSet";
const TOPO_CLIENT: &str = "data-handler and pod --topo-* flags";
const BACKUP: &str =
    "resource-handler: backup volume and env; data-handler: topology backup_location";
const BACKUP_SCHEDULE: &str = "data-handler: MultipoolerManager.Backup on a replica when due, \
     then ExpireBackups with retainFull; status.scheduledBackups (docs/backups.md)";
const BACKUP_RECOVERY: &str = "resource-handler: a recovery Job restores the source to the \
     target and writes it as the shard's first backup before any pool pod starts; webhook: \
     target checked against the source's recoverable window (docs/backups.md)";
const TEMPLATES: &str = "resolver: template selection";
const CELL: &str = "resource-handler: the cell's multigateway Deployment";
const SHARD: &str = "resource-handler: the shard's multiorch and pool pods";
const POOL_PVC: &str = "resource-handler: pool PVC retention";
const PLACEMENT: &str =
    "resource-handler: pod nodeSelector from the cell's zone, zone ID or region";

const POSTGRES_CONFIG: &str = "webhook: checked against the PostgreSQL 17 catalog and the \
     fixed and refused parameters (no commands, libraries or includes); \
     resource-handler: rendered into `<shard>-postgres-config` for pgctld; a restart-class change \
     restarts pods replicas first; data-handler: a reload-class change is reloaded through each \
     pod's multipooler (ReloadConfig) and stamped on the pod (docs/postgresql-configuration.md)";
const POSTGRES_CONFIG_REF: &str = "resource-handler: the ConfigMap key checked with the rules \
     of postgresConfig and rendered into `<shard>-postgres-config`, re-rendered when it changes; \
     a refused one is reported on the Shard and not rendered (docs/postgresql-configuration.md)";
const PGBACKREST_TLS: &str = "resource-handler: the named Secret checked and mounted, or a \
     per-shard CA and certificate issued and mounted (docs/tls.md)";
const INTERNAL_TLS: &str = "resource-handler: a CA and per-process certificates, mounted with \
     the gRPC TLS flags of multiadmin, multigateway, multiorch and multipooler (enabled) and \
     their --topo-etcd-tls-* flags (topology), a certificate for the managed etcd members, \
     which then serve clients and peers over TLS and require client certificates, and the \
     data-handler's client certificate, so reloads, the cohort, switchovers, backups and the \
     topology records work the same (docs/tls.md)";
const MULTIADMIN_WEB: &str = "resource-handler: the multiadmin-web Deployment and Service";
const TOPO_IMPLEMENTATION: &str = "Multigres only implements etcd; other values are ignored";
const GLOBAL_TOPO_TLS: &str = "data-handler: its etcd client's TLS; resource-handler: mounted \
     into multiadmin, multigateway, multiorch and multipooler with --topo-etcd-tls-* (a \
     clientCertSecret is required with caSecret, docs/tls.md)";
const LOCAL_TOPO_TLS: &str = "data-handler: its client's TLS to the cell's etcd; the data plane \
     dials every etcd with the global server's Secrets, so a cell's must name the same ones";

const fn done(kind: Kind, path: &'static str, note: &'static str) -> Field {
    Field {
        kind,
        path,
        support: Support::Implemented(note),
    }
}

const fn todo(kind: Kind, path: &'static str, reason: &'static str, when: When) -> Field {
    Field {
        kind,
        path,
        support: Support::NotYetImplemented { reason, when },
    }
}

use Kind::{
    CellTemplate as Cet, CoreTemplate as Cot, MultigresCluster as Mgc, ShardTemplate as Sht,
};

/// Every user-settable spec field of the four user-written kinds, with its support.
pub static FIELDS: &[Field] = &[
    // MultigresCluster: images and cluster-wide settings.
    done(Mgc, "spec.images.imagePullPolicy", RESOURCE_HANDLER_PODS),
    done(Mgc, "spec.images.imagePullSecrets", RESOURCE_HANDLER_PODS),
    done(
        Mgc,
        "spec.images.multigateway",
        "resolver: the Cell's image",
    ),
    done(Mgc, "spec.images.multiorch", "resolver: the Shard's images"),
    done(
        Mgc,
        "spec.images.multipooler",
        "resolver: the Shard's images",
    ),
    done(
        Mgc,
        "spec.images.multiadmin",
        "resource-handler: the multiadmin Deployment",
    ),
    done(Mgc, "spec.images.postgres", "resolver: the Shard's images"),
    done(
        Mgc,
        "spec.images.postgresExporter",
        "resolver: the Shard's images; resource-handler: the pool pods' postgres-exporter",
    ),
    done(
        Mgc,
        "spec.images.multiadminWeb",
        "resource-handler: the multiadmin-web Deployment",
    ),
    done(
        Mgc,
        "spec.imageUpdatePolicy",
        "cluster-handler: which default image set the children get (status.images)",
    ),
    done(
        Mgc,
        "spec.logLevels",
        "resource-handler: --log-level of every component",
    ),
    done(Mgc, "spec.templateDefaults", TEMPLATES),
    done(Mgc, "spec.pvcDeletionPolicy", POOL_PVC),
    done(
        Mgc,
        "spec.topologyPruning",
        "data-handler: pruning of stale poolers",
    ),
    done(
        Mgc,
        "spec.durabilityPolicy",
        "data-handler: the topology Database record",
    ),
    done(
        Mgc,
        "spec.postgresSuperuser",
        "resource-handler: POSTGRES_USER of pgctld",
    ),
    done(
        Mgc,
        "spec.postgresPasswordSecretRef",
        "resource-handler: the password volume",
    ),
    done(
        Mgc,
        "spec.applicationRole",
        "resource-handler: Secret <cluster>-app (generated password, connection settings); \
         data-handler: the role and its schema in every shard's PostgreSQL",
    ),
    done(
        Mgc,
        "spec.roles",
        "data-handler: CREATE, ALTER and DROP ROLE in every shard's PostgreSQL; each Shard's \
         status.roles and its RolesChanged and RoleFailed events",
    ),
    done(
        Mgc,
        "spec.observability",
        "resource-handler: OTEL_* environment of every Multigres container; postgresExporter: \
         the pool pods' postgres-exporter container and the cluster's PodMonitor",
    ),
    done(Mgc, "spec.internalTLS", INTERNAL_TLS),
    done(
        Mgc,
        "spec.gatewayTLS",
        "resource-handler: the gateway certificate (from the cluster's gateway CA, cert-manager \
         or the user's Secret), multigateway's --pg-tls-* and --pg-require-ssl flags, ConfigMap \
         <cluster>-gateway-ca",
    ),
    done(
        Mgc,
        "spec.certCommonName",
        "resource-handler: the common name and an extra DNS name of the gateway certificate, \
         whoever issues it",
    ),
    done(
        Mgc,
        "spec.issuerName",
        "resource-handler: cert-manager Certificate <cluster>-gateway-cert signed by this \
         ClusterIssuer; multigateway serves the Secret cert-manager writes",
    ),
    done(
        Mgc,
        "spec.externalGateway",
        "resource-handler: the cluster-wide multigateway Service (LoadBalancer, externalIPs, \
         loadBalancerSourceRanges, annotations), status.gateway and GatewayExternalReady",
    ),
    done(
        Mgc,
        "spec.externalAdminWeb",
        "resource-handler: the multiadmin-web Service (LoadBalancer, externalIPs, \
         loadBalancerSourceRanges, annotations), status.adminWeb and AdminWebExternalReady",
    ),
    done(
        Mgc,
        "spec.networkPolicy",
        "resource-handler: the cluster's NetworkPolicies, deleted when disabled \
         (docs/security.md)",
    ),
    // MultigresCluster: global components.
    done(Mgc, "spec.globalTopoServer.etcd", TOPO_SERVER),
    done(Mgc, "spec.globalTopoServer.templateRef", TEMPLATES),
    done(Mgc, "spec.globalTopoServer.pvcDeletionPolicy", TOPO_SERVER),
    done(Mgc, "spec.globalTopoServer.placement", TOPO_SERVER),
    done(Mgc, "spec.globalTopoServer.external.endpoints", TOPO_CLIENT),
    done(Mgc, "spec.globalTopoServer.external.rootPath", TOPO_CLIENT),
    todo(
        Mgc,
        "spec.globalTopoServer.external.implementation",
        TOPO_IMPLEMENTATION,
        When::Other("etcd"),
    ),
    done(
        Mgc,
        "spec.globalTopoServer.external.caSecret",
        GLOBAL_TOPO_TLS,
    ),
    done(
        Mgc,
        "spec.globalTopoServer.external.clientCertSecret",
        GLOBAL_TOPO_TLS,
    ),
    done(
        Mgc,
        "spec.multiadmin",
        "resource-handler: the multiadmin Deployment",
    ),
    done(Mgc, "spec.multiadminWeb", MULTIADMIN_WEB),
    // MultigresCluster: cells.
    done(Mgc, "spec.cells[].name", "cluster-handler: the Cell child"),
    done(Mgc, "spec.cells[].zone", PLACEMENT),
    done(Mgc, "spec.cells[].zoneId", PLACEMENT),
    done(Mgc, "spec.cells[].region", PLACEMENT),
    done(Mgc, "spec.cells[].cellTemplate", TEMPLATES),
    done(Mgc, "spec.cells[].overrides", CELL),
    done(Mgc, "spec.cells[].spec.multigateway", CELL),
    done(Mgc, "spec.cells[].spec.multigatewayPlacement", CELL),
    done(Mgc, "spec.cells[].spec.localTopoServer.etcd", TOPO_SERVER),
    done(
        Mgc,
        "spec.cells[].spec.localTopoServer.external.endpoints",
        TOPO_CLIENT,
    ),
    done(
        Mgc,
        "spec.cells[].spec.localTopoServer.external.rootPath",
        TOPO_CLIENT,
    ),
    todo(
        Mgc,
        "spec.cells[].spec.localTopoServer.external.implementation",
        TOPO_IMPLEMENTATION,
        When::Other("etcd"),
    ),
    done(
        Mgc,
        "spec.cells[].spec.localTopoServer.external.caSecret",
        LOCAL_TOPO_TLS,
    ),
    done(
        Mgc,
        "spec.cells[].spec.localTopoServer.external.clientCertSecret",
        LOCAL_TOPO_TLS,
    ),
    todo(
        Mgc,
        "spec.cells[].metadata",
        "not written into the cell's topology record yet",
        When::Set,
    ),
    // MultigresCluster: backups, at every level.
    done(Mgc, "spec.backup.type", BACKUP),
    done(Mgc, "spec.backup.filesystem", BACKUP),
    done(Mgc, "spec.backup.s3", BACKUP),
    done(Mgc, "spec.backup.encryption", BACKUP),
    done(Mgc, "spec.backup.pgbackrestTLS", PGBACKREST_TLS),
    done(Mgc, "spec.backup.schedule", BACKUP_SCHEDULE),
    done(Mgc, "spec.backup.recovery", BACKUP_RECOVERY),
    done(Mgc, "spec.databases[].backup.type", BACKUP),
    done(Mgc, "spec.databases[].backup.filesystem", BACKUP),
    done(Mgc, "spec.databases[].backup.s3", BACKUP),
    done(Mgc, "spec.databases[].backup.encryption", BACKUP),
    done(Mgc, "spec.databases[].backup.pgbackrestTLS", PGBACKREST_TLS),
    done(Mgc, "spec.databases[].backup.schedule", BACKUP_SCHEDULE),
    done(Mgc, "spec.databases[].backup.recovery", BACKUP_RECOVERY),
    done(Mgc, "spec.databases[].tablegroups[].backup.type", BACKUP),
    done(
        Mgc,
        "spec.databases[].tablegroups[].backup.filesystem",
        BACKUP,
    ),
    done(Mgc, "spec.databases[].tablegroups[].backup.s3", BACKUP),
    done(
        Mgc,
        "spec.databases[].tablegroups[].backup.encryption",
        BACKUP,
    ),
    done(
        Mgc,
        "spec.databases[].tablegroups[].backup.pgbackrestTLS",
        PGBACKREST_TLS,
    ),
    done(
        Mgc,
        "spec.databases[].tablegroups[].backup.schedule",
        BACKUP_SCHEDULE,
    ),
    done(
        Mgc,
        "spec.databases[].tablegroups[].backup.recovery",
        BACKUP_RECOVERY,
    ),
    done(
        Mgc,
        "spec.databases[].tablegroups[].shards[].backup.type",
        BACKUP,
    ),
    done(
        Mgc,
        "spec.databases[].tablegroups[].shards[].backup.filesystem",
        BACKUP,
    ),
    done(
        Mgc,
        "spec.databases[].tablegroups[].shards[].backup.s3",
        BACKUP,
    ),
    done(
        Mgc,
        "spec.databases[].tablegroups[].shards[].backup.encryption",
        BACKUP,
    ),
    done(
        Mgc,
        "spec.databases[].tablegroups[].shards[].backup.pgbackrestTLS",
        PGBACKREST_TLS,
    ),
    done(
        Mgc,
        "spec.databases[].tablegroups[].shards[].backup.schedule",
        BACKUP_SCHEDULE,
    ),
    done(
        Mgc,
        "spec.databases[].tablegroups[].shards[].backup.recovery",
        BACKUP_RECOVERY,
    ),
    // MultigresCluster: databases, table groups and shards.
    done(
        Mgc,
        "spec.databases[].name",
        "cluster-handler: the TableGroup and Shard children",
    ),
    done(
        Mgc,
        "spec.databases[].default",
        "validation: marks the system database",
    ),
    done(
        Mgc,
        "spec.databases[].durabilityPolicy",
        "data-handler: the topology Database record",
    ),
    done(
        Mgc,
        "spec.databases[].tablegroups[].name",
        "cluster-handler: the TableGroup child",
    ),
    done(
        Mgc,
        "spec.databases[].tablegroups[].default",
        "validation: marks the default table group",
    ),
    done(
        Mgc,
        "spec.databases[].tablegroups[].pvcDeletionPolicy",
        POOL_PVC,
    ),
    done(
        Mgc,
        "spec.databases[].tablegroups[].shards[].name",
        "cluster-handler: the Shard child",
    ),
    done(
        Mgc,
        "spec.databases[].tablegroups[].shards[].shardTemplate",
        TEMPLATES,
    ),
    done(
        Mgc,
        "spec.databases[].tablegroups[].shards[].overrides.multiorch",
        SHARD,
    ),
    done(
        Mgc,
        "spec.databases[].tablegroups[].shards[].overrides.initdbArgs",
        "resource-handler: POSTGRES_INITDB_ARGS of pgctld",
    ),
    done(
        Mgc,
        "spec.databases[].tablegroups[].shards[].overrides.pools",
        SHARD,
    ),
    done(
        Mgc,
        "spec.databases[].tablegroups[].shards[].overrides.postgresConfig",
        POSTGRES_CONFIG,
    ),
    done(
        Mgc,
        "spec.databases[].tablegroups[].shards[].overrides.postgresConfigRef",
        POSTGRES_CONFIG_REF,
    ),
    done(
        Mgc,
        "spec.databases[].tablegroups[].shards[].spec.multiorch",
        SHARD,
    ),
    done(
        Mgc,
        "spec.databases[].tablegroups[].shards[].spec.initdbArgs",
        "resource-handler: POSTGRES_INITDB_ARGS of pgctld",
    ),
    done(
        Mgc,
        "spec.databases[].tablegroups[].shards[].spec.pools",
        SHARD,
    ),
    done(
        Mgc,
        "spec.databases[].tablegroups[].shards[].spec.pvcDeletionPolicy",
        POOL_PVC,
    ),
    done(
        Mgc,
        "spec.databases[].tablegroups[].shards[].spec.postgresConfig",
        POSTGRES_CONFIG,
    ),
    done(
        Mgc,
        "spec.databases[].tablegroups[].shards[].spec.postgresConfigRef",
        POSTGRES_CONFIG_REF,
    ),
    // CoreTemplate.
    done(Cot, "spec.globalTopoServer", TOPO_SERVER),
    done(
        Cot,
        "spec.multiadmin",
        "resource-handler: the multiadmin Deployment",
    ),
    done(
        Cot,
        "spec.multiadminPlacement",
        "resource-handler: the multiadmin Deployment",
    ),
    done(Cot, "spec.multiadminWeb", MULTIADMIN_WEB),
    // CellTemplate.
    done(Cet, "spec.multigateway", CELL),
    done(Cet, "spec.multigatewayPlacement", CELL),
    done(Cet, "spec.localTopoServer.etcd", TOPO_SERVER),
    done(Cet, "spec.localTopoServer.external.endpoints", TOPO_CLIENT),
    done(Cet, "spec.localTopoServer.external.rootPath", TOPO_CLIENT),
    todo(
        Cet,
        "spec.localTopoServer.external.implementation",
        TOPO_IMPLEMENTATION,
        When::Other("etcd"),
    ),
    done(
        Cet,
        "spec.localTopoServer.external.caSecret",
        LOCAL_TOPO_TLS,
    ),
    done(
        Cet,
        "spec.localTopoServer.external.clientCertSecret",
        LOCAL_TOPO_TLS,
    ),
    // ShardTemplate.
    done(Sht, "spec.multiorch", SHARD),
    done(
        Sht,
        "spec.initdbArgs",
        "resource-handler: POSTGRES_INITDB_ARGS of pgctld",
    ),
    done(Sht, "spec.pools", SHARD),
    done(Sht, "spec.pvcDeletionPolicy", POOL_PVC),
    done(Sht, "spec.postgresConfig", POSTGRES_CONFIG),
    done(Sht, "spec.postgresConfigRef", POSTGRES_CONFIG_REF),
];

/// The registry entries of one kind.
pub fn fields(kind: Kind) -> impl Iterator<Item = &'static Field> {
    FIELDS.iter().filter(move |f| f.kind == kind)
}

/// The not-yet-implemented entries an object of `kind` sets to a value that would have had an
/// effect, in registry order, each once. `spec` is the object's `spec` as JSON.
pub fn set_unimplemented(kind: Kind, spec: &Value) -> Vec<&'static Field> {
    fields(kind)
        .filter(|field| match field.support {
            Support::NotYetImplemented { when, .. } => values_at(spec, field.path)
                .into_iter()
                .any(|v| when.matches(v)),
            Support::Implemented(_) => false,
        })
        .collect()
}

/// Every value at `path` (which starts with `spec`) under `spec`.
fn values_at<'a>(spec: &'a Value, path: &str) -> Vec<&'a Value> {
    let mut current = vec![spec];
    for step in steps(path).skip(1) {
        current = current
            .into_iter()
            .flat_map(|value| -> Vec<&'a Value> {
                match step {
                    Step::Field(name) => value.get(name).into_iter().collect(),
                    Step::Items => value.as_array().into_iter().flatten().collect(),
                    Step::Values => value
                        .as_object()
                        .into_iter()
                        .flat_map(|m| m.values())
                        .collect(),
                }
            })
            .collect();
    }
    current
}

/// One step of a registry path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step<'a> {
    /// A named field.
    Field(&'a str),
    /// Every item of a list (`[]`).
    Items,
    /// Every value of a map (`{}`).
    Values,
}

fn steps(path: &str) -> impl Iterator<Item = Step<'_>> {
    path.split('.').flat_map(|part| {
        let (name, suffix) = match part.find(['[', '{']) {
            Some(i) => part.split_at(i),
            None => (part, ""),
        };
        std::iter::once(Step::Field(name)).chain(suffix.as_bytes().chunks(2).map(|pair| {
            if pair[0] == b'[' {
                Step::Items
            } else {
                Step::Values
            }
        }))
    })
}

/// Whether a value says anything: not null, `false`, `""`, or a list or map of such only.
fn meaningful(value: &Value) -> bool {
    match value {
        Value::Null | Value::Bool(false) => false,
        Value::String(s) => !s.is_empty(),
        Value::Array(items) => items.iter().any(meaningful),
        Value::Object(map) => map.values().any(meaningful),
        Value::Bool(true) | Value::Number(_) => true,
    }
}

/// Every leaf field path of a CRD's `spec` schema (the OpenAPI v3 schema of the whole object),
/// in the registry's notation.
pub fn schema_leaves(object_schema: &Value) -> Vec<String> {
    let mut leaves = Vec::new();
    if let Some(spec) = object_schema.pointer("/properties/spec") {
        collect_leaves(spec, "spec".to_owned(), &mut leaves);
    }
    leaves
}

fn collect_leaves(schema: &Value, path: String, leaves: &mut Vec<String>) {
    let has_properties = |s: &Value| {
        s.get("properties")
            .and_then(Value::as_object)
            .filter(|p| !p.is_empty())
            .is_some()
    };
    if let Some(properties) = schema
        .get("properties")
        .and_then(Value::as_object)
        .filter(|p| !p.is_empty())
    {
        for (name, child) in properties {
            collect_leaves(child, format!("{path}.{name}"), leaves);
        }
    } else if let Some(items) = schema.get("items").filter(|s| has_properties(s)) {
        collect_leaves(items, format!("{path}[]"), leaves);
    } else if let Some(values) = schema
        .get("additionalProperties")
        .filter(|s| has_properties(s))
    {
        collect_leaves(values, format!("{path}{{}}"), leaves);
    } else {
        leaves.push(path);
    }
}

/// Where the registry and a kind's CRD schema disagree: every leaf must be covered by exactly
/// one entry, and every entry must cover some leaf.
pub fn coverage_problems(kind: Kind, object_schema: &Value) -> Vec<CoverageProblem> {
    let leaves = schema_leaves(object_schema);
    let mut problems = Vec::new();
    for leaf in &leaves {
        let covering: Vec<&'static str> = fields(kind)
            .filter(|f| f.covers(leaf))
            .map(|f| f.path)
            .collect();
        match covering.len() {
            0 => problems.push(CoverageProblem::Unclassified {
                kind,
                path: leaf.clone(),
            }),
            1 => {}
            _ => problems.push(CoverageProblem::Ambiguous {
                kind,
                path: leaf.clone(),
                entries: covering,
            }),
        }
    }
    for field in fields(kind) {
        if !leaves.iter().any(|leaf| field.covers(leaf)) {
            problems.push(CoverageProblem::Stale {
                kind,
                path: field.path,
            });
        }
    }
    problems
}

/// Start and end markers of the generated section of `docs/field-support.md`.
pub const DOC_MARKERS: (&str, &str) = (
    "<!-- BEGIN generated from api/src/field_support.rs -->",
    "<!-- END generated from api/src/field_support.rs -->",
);

/// The registry as Markdown: per kind, a table of its entries.
pub fn markdown() -> String {
    let mut out = String::new();
    for kind in Kind::ALL {
        out.push_str(&format!(
            "\n### {}\n\n| field | status | where it acts, or what happens instead |\n|---|---|---|\n",
            kind.name()
        ));
        for field in fields(kind) {
            let (status, text) = match field.support {
                Support::Implemented(note) => ("implemented".to_owned(), note),
                Support::NotYetImplemented { reason, when } => {
                    (format!("**not yet implemented** ({when})"), reason)
                }
            };
            out.push_str(&format!("| `{}` | {status} | {text} |\n", field.path));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn paths(kind: Kind, spec: Value) -> Vec<&'static str> {
        set_unimplemented(kind, &spec)
            .iter()
            .map(|f| f.path)
            .collect()
    }

    fn unimplemented_path(kind: Kind, path: &str) -> bool {
        fields(kind).any(|f| f.path == path && f.is_unimplemented())
    }

    #[test]
    fn paths_parse_into_fields_items_and_values() {
        let steps: Vec<_> = steps("spec.a[].b{}.c").collect();
        assert_eq!(
            steps,
            [
                Step::Field("spec"),
                Step::Field("a"),
                Step::Items,
                Step::Field("b"),
                Step::Values,
                Step::Field("c"),
            ]
        );
    }

    #[test]
    fn entries_cover_their_subtree_only() {
        let field = done(Mgc, "spec.backup.s3", "");
        assert!(field.covers("spec.backup.s3"));
        assert!(field.covers("spec.backup.s3.bucket"));
        assert!(!field.covers("spec.backup.s3x"));
        assert!(!field.covers("spec.backup"));
        assert!(done(Mgc, "spec.cells", "").covers("spec.cells[].name"));
    }

    #[test]
    fn unset_empty_and_disabled_values_are_not_reported() {
        let spec = json!({
            "internalTLS": {"enabled": false},
            "externalGateway": {"enabled": false, "externalIPs": ["10.0.0.1"]},
            "observability": {},
            "certCommonName": "",
            "globalTopoServer": {"external": {"endpoints": ["http://e:2379"], "implementation": "etcd"}},
            "backup": {"type": "filesystem", "filesystem": {}, "pgbackrestTLS": {"secretName": "tls"}},
        });
        assert_eq!(paths(Mgc, spec), Vec::<&str>::new());
    }

    #[test]
    fn values_that_would_have_an_effect_are_reported_once_per_entry() {
        let shard =
            |name: &str| json!({"name": name, "spec": {"postgresConfig": {"work_mem": "4MB"}}});
        let spec = json!({
            "internalTLS": {"enabled": true},
            "observability": {"tracesExporter": "otlp"},
            "cells": [{"name": "a", "metadata": "x"}, {"name": "b", "metadata": "y"}],
            "databases": [{"name": "postgres", "tablegroups": [
                {"name": "default", "shards": [shard("0-inf")], "backup": {"type": "s3", "pgbackrestTLS": {}}},
                {"name": "other", "shards": [shard("0-inf")]},
            ]}],
        });
        let found = paths(Mgc, spec);
        let mut expected = vec![
            "spec.internalTLS",
            "spec.observability",
            "spec.cells[].metadata",
            "spec.databases[].tablegroups[].backup.pgbackrestTLS",
            "spec.databases[].tablegroups[].shards[].spec.postgresConfig",
        ];
        expected.retain(|p| unimplemented_path(Mgc, p));
        let mut sorted = found.clone();
        sorted.sort_unstable();
        expected.sort_unstable();
        assert_eq!(sorted, expected);
    }

    #[test]
    fn other_topology_implementations_are_reported() {
        let spec = json!({"localTopoServer": {"external": {"endpoints": ["http://e:2379"], "implementation": "zk2"}}});
        let found = paths(Cet, spec);
        let path = "spec.localTopoServer.external.implementation";
        assert_eq!(found.contains(&path), unimplemented_path(Cet, path));
    }

    #[test]
    fn map_values_are_walked() {
        let spec = json!({"pools": {"a": {"cells": ["x"]}, "b": {}}});
        let values = values_at(&spec, "spec.pools{}.cells");
        assert_eq!(values, [&json!(["x"])]);
    }

    #[test]
    fn leaves_of_a_schema_use_the_registry_notation() {
        let schema = json!({"properties": {"spec": {"properties": {
            "a": {"type": "string"},
            "list": {"type": "array", "items": {"properties": {"n": {"type": "string"}}}},
            "map": {"type": "object", "additionalProperties": {"properties": {"x": {"type": "integer"}}}},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        }}}});
        assert_eq!(
            schema_leaves(&schema),
            ["spec.a", "spec.labels", "spec.list[].n", "spec.map{}.x"]
        );
    }

    #[test]
    fn registry_paths_are_unique_per_kind() {
        for (i, a) in FIELDS.iter().enumerate() {
            for b in &FIELDS[i + 1..] {
                assert!(
                    a.kind != b.kind || a.path != b.path,
                    "{:?} {} is listed twice",
                    a.kind,
                    a.path
                );
            }
        }
    }
}
