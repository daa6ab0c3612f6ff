//! MultigresCluster: the resource users write. The operator resolves it (with templates) into
//! TopoServer, Cell, TableGroup and Shard children.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::LocalObjectReference, api::networking::v1::NetworkPolicyPeer,
    apimachinery::pkg::apis::meta::v1::Condition,
};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{
    cell::MultigatewaySpec,
    common::{
        BackupConfig, CellName, Cidr, ComponentLogLevels, DNS_SUBDOMAIN_PATTERN, DatabaseName,
        GatewayTlsConfig, ImagePullPolicy, ImageRef, InitdbArgs, InternalTlsConfig, IpAddress,
        ObservabilityConfig, Phase, PodPlacementSpec, PostgresConfigRef, PostgresPasswordSecretRef,
        PvcDeletionPolicy, Region, ShardName, StatelessSpec, TableGroupName, TemplateRef,
        TopologyPruningConfig, Zone, ZoneId,
    },
    roles::{ApplicationRoleConfig, ManagedRole},
    rules,
    shard::{MultiorchSpec, Pools},
    toposerver::{GlobalTopoServerSpec, LocalTopoServerSpec},
};
use crate::schema::{embedded_list, embedded_list_of_at_most, is_false};

/// Desired state of a MultigresCluster: the whole topology of one sharded PostgreSQL system.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[kube(
    group = "multigres.com",
    version = "v1alpha1",
    kind = "MultigresCluster",
    namespaced,
    status = "MultigresClusterStatus",
    shortname = "mgc",
    category = "multigres",
    doc = "MultigresCluster is a sharded PostgreSQL system managed by the operator: its global topology server, admin, cells (failure domains) and databases with their table groups and shards. Components come from inline specs or Core/Cell/ShardTemplates.",
    validation = Rule::new("self.metadata.name.size() <= 25")
        .message("metadata.name: MultigresCluster name must be at most 25 characters"),
    printcolumn = r#"{"name":"Available","type":"string","jsonPath":".status.conditions[?(@.type=='Available')].status"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Images","type":"string","jsonPath":".status.images.appliedRevision","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!(has(self.issuerName) && has(self.gatewayTLS) && has(self.gatewayTLS.secretName))")
    .message("spec.issuerName and spec.gatewayTLS.secretName both name a source of the gateway certificate; keep one"))]
#[x_kube(validation = Rule::new("!(has(self.issuerName) && has(self.gatewayTLS) && has(self.gatewayTLS.enabled) && !self.gatewayTLS.enabled)")
    .message("spec.issuerName: a gateway certificate needs gateway TLS; remove spec.gatewayTLS.enabled: false or spec.issuerName"))]
#[x_kube(validation = Rule::new("!has(self.roles) || self.roles.all(r, r.name != (has(self.postgresSuperuser) ? self.postgresSuperuser : 'postgres') && !(has(r.inRoles) && (has(self.postgresSuperuser) ? self.postgresSuperuser : 'postgres') in r.inRoles))")
    .message("spec.roles: the superuser is the operator's; a declared role cannot take its name or be a member of it"))]
#[x_kube(validation = Rule::new("!has(self.roles) || (has(self.applicationRole) && has(self.applicationRole.enabled) && !self.applicationRole.enabled) || self.roles.all(r, r.name != (has(self.applicationRole) && has(self.applicationRole.name) ? self.applicationRole.name : 'app'))")
    .message("spec.roles: a declared role takes the application role's name; rename it, or set spec.applicationRole.name"))]
#[x_kube(validation = Rule::new("!has(self.applicationRole) || !has(self.applicationRole.name) || self.applicationRole.name != (has(self.postgresSuperuser) ? self.postgresSuperuser : 'postgres')")
    .message("spec.applicationRole.name: the superuser is the operator's; choose another name"))]
pub struct MultigresClusterSpec {
    /// Images and pull settings of every component. Unset images come from the operator's
    /// defaults, chosen at reconcile time and never written here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub images: Option<ClusterImages>,

    /// When the cluster adopts a changed operator-default image set. Images set in `images`
    /// are not affected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_update_policy: Option<ImageUpdatePolicy>,

    /// `--log-level` of each data-plane component; unset means `info`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_levels: Option<ComponentLogLevels>,

    /// Templates used by components that name none themselves. Unset: the template named
    /// `default` in the namespace, if any, then built-in defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_defaults: Option<TemplateDefaults>,

    /// The cluster-wide topology server: an inline etcd, an external etcd, or a CoreTemplate.
    /// Unset: from the default CoreTemplate, else a 3-member etcd.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global_topo_server: Option<GlobalTopoServerSpec>,

    /// The multiadmin component: an inline spec or a CoreTemplate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multiadmin: Option<MultiadminConfig>,

    /// The multiadmin web UI: an inline spec or a CoreTemplate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multiadmin_web: Option<MultiadminWebConfig>,

    /// Cells (failure domains), keyed by name, at most 50. Cells can be added but never removed
    /// or renamed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 50))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    #[x_kube(validation = Rule::new("oldSelf.all(c, c.name in self.map(x, x.name))")
        .message("Cells cannot be removed or renamed (Append-Only)"))]
    #[x_kube(validation = Rule::new("self.all(c, c.name != 'global')")
        .message("the cell name global is reserved: Multigres keeps the global topology under that name; choose another"))]
    pub cells: Vec<CellConfig>,

    /// Logical databases with their table groups and shards. In v1alpha1 at most one: `postgres`
    /// with `default: true`. Unset: that database with table group `default` and shard `0-inf`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 1))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    #[x_kube(validation = Rule::new("self.all(db, db.name == 'postgres' && has(db.default) && db.default)")
        .message("in v1alpha1, only the single system database named 'postgres' (marked default: true) is supported"))]
    pub databases: Vec<DatabaseConfig>,

    /// PVC lifecycle of every stateful component, overridable per level. `whenDeleted` and
    /// `whenScaled` each default to `Retain` when set nowhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvc_deletion_policy: Option<PvcDeletionPolicy>,

    /// OpenTelemetry settings of data-plane pods. Unset: pods inherit the operator's own
    /// `OTEL_*` environment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observability: Option<ObservabilityConfig>,

    /// Backups of every shard, overridable per database, table group and shard. Default:
    /// filesystem at `/backups` on a 10Gi PVC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<BackupConfig>,

    /// External exposure of the global multigateway Service. Unset or disabled: ClusterIP only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_gateway: Option<ExternalServiceConfig>,

    /// External exposure of the global multiadmin-web Service. Unset or disabled: ClusterIP
    /// only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_admin_web: Option<ExternalServiceConfig>,

    /// NetworkPolicies of the cluster's pods: who may reach which port. Unset: enabled, with
    /// the gateways' PostgreSQL ports open to every source (see `docs/security.md`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_policy: Option<NetworkPolicyConfig>,

    /// Pruning of stale topology entries. Default enabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology_pruning: Option<TopologyPruningConfig>,

    /// Default durability policy of every database, written to the topology: `AT_LEAST_2`
    /// (default; any two nodes acknowledge writes) or `MULTI_CELL_AT_LEAST_2` (two nodes in
    /// different cells).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub durability_policy: Option<String>,

    /// Name of the Postgres superuser role: a lowercase PostgreSQL identifier (a letter or
    /// `_`, then letters, digits or `_`, at most 63 characters) not starting with `pg_`, since
    /// Multigres passes it unquoted and PostgreSQL reserves `pg_` names. Default `postgres`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = SUPERUSER_PATTERN),
        extend("default" = "postgres")
    )]
    #[x_kube(validation = Rule::new(crate::expansion::NO_REFERENCE_RULE)
        .message(crate::expansion::NO_REFERENCE_MESSAGE))]
    #[x_kube(validation = Rule::new("!self.startsWith('pg_')")
        .message("must not start with pg_: PostgreSQL reserves role names starting with pg_"))]
    pub postgres_superuser: Option<String>,

    /// Existing Secret holding the Postgres superuser password. Required.
    pub postgres_password_secret_ref: PostgresPasswordSecretRef,

    /// The application role: a login role that is no superuser, owning the schema of its
    /// name, with its connection settings in Secret `<cluster>-app`. Unset: role `app`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub application_role: Option<ApplicationRoleConfig>,

    /// Further PostgreSQL roles the operator keeps in every shard (at most 32), keyed by name.
    /// Removing one from the list leaves it in PostgreSQL; `ensure: absent` drops it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub roles: Vec<ManagedRole>,

    /// Mutual TLS between Multigres components. Default disabled.
    #[serde(
        default,
        rename = "internalTLS",
        skip_serializing_if = "Option::is_none"
    )]
    pub internal_tls: Option<InternalTlsConfig>,

    /// Client TLS of the gateways. Unset: TLS offered, plaintext still accepted.
    #[serde(
        default,
        rename = "gatewayTLS",
        skip_serializing_if = "Option::is_none"
    )]
    #[x_kube(validation = Rule::new("!(has(self.required) && self.required && has(self.enabled) && !self.enabled)")
        .message("spec.gatewayTLS: required: true needs TLS enabled; remove enabled: false or required: true"))]
    pub gateway_tls: Option<GatewayTlsConfig>,

    /// DNS name clients use for the gateway, e.g. `db.example.com`: the common name and an
    /// extra DNS name of the certificate multigateway serves (besides its Service names).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = 253),
        regex(
            pattern = r"^((\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)?$"
        )
    )]
    pub cert_common_name: Option<String>,

    /// cert-manager ClusterIssuer that signs the certificate multigateway serves to clients:
    /// the operator writes a cert-manager Certificate `<cluster>-gateway-cert` for the gateway's
    /// Service names and `certCommonName`, and multigateway serves the Secret cert-manager
    /// issues. Unset: the cluster's own gateway CA signs it. Internal certificates always come
    /// from the cluster's internal CA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), regex(pattern = DNS_SUBDOMAIN_PATTERN))]
    pub issuer_name: Option<String>,
}

/// Images and pull settings of every component of a cluster.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterImages {
    /// Image pull policy of every pod: `Always`, `Never` or `IfNotPresent` (default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<ImagePullPolicy>,

    /// Secrets used to pull the images, in the same namespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "embedded_list::<LocalObjectReference>")]
    pub image_pull_secrets: Vec<LocalObjectReference>,

    /// Image of multigateway. Default: the operator's multigres image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multigateway: Option<ImageRef>,

    /// Image of multiorch. Default: the operator's multigres image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multiorch: Option<ImageRef>,

    /// Image of multipooler. Default: the operator's multigres image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multipooler: Option<ImageRef>,

    /// Image of multiadmin. Default: the operator's multigres image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multiadmin: Option<ImageRef>,

    /// Image of the multiadmin web UI. Default: the operator's multiadmin-web image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multiadmin_web: Option<ImageRef>,

    /// Image of pgctld with PostgreSQL and pgBackRest. Default: the operator's pgctld image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub postgres: Option<ImageRef>,

    /// Image of postgres_exporter, run beside PostgreSQL in every pool pod. Default:
    /// `quay.io/prometheuscommunity/postgres-exporter:v0.17.1`. Not part of the operator's
    /// default image set (`status.images`): a changed default reaches pools with the operator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub postgres_exporter: Option<ImageRef>,
}

/// How a cluster adopts a new operator-default image set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = crate::schema::field_described)]
#[serde(rename_all = "lowercase")]
pub enum ImageUpdateStrategy {
    /// Adopt a changed default set on the next reconcile.
    Immediate,
    /// Keep the running set until `acknowledgedRevision` names the new one.
    Lazy,
}

/// When a cluster adopts a changed operator-default image set.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImageUpdatePolicy {
    /// `immediate` or `lazy`. Unset: the operator's `--image-update-strategy`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<ImageUpdateStrategy>,

    /// Revision (lowercase hex, at most 64 characters) of the default image set the cluster may
    /// adopt under the lazy strategy; copy it from `status.images.availableRevision`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64), regex(pattern = "^[0-9a-f]*$"))]
    pub acknowledged_revision: Option<String>,
}

/// A concrete image for every Multigres component.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ComponentImages {
    /// Image of multigateway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multigateway: Option<ImageRef>,

    /// Image of multiorch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multiorch: Option<ImageRef>,

    /// Image of multipooler.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multipooler: Option<ImageRef>,

    /// Image of multiadmin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multiadmin: Option<ImageRef>,

    /// Image of the multiadmin web UI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multiadmin_web: Option<ImageRef>,

    /// Image of pgctld with PostgreSQL and pgBackRest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub postgres: Option<ImageRef>,
}

/// Templates used by components that name none themselves.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TemplateDefaults {
    /// CoreTemplate for the global topology server and multiadmin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub core_template: Option<TemplateRef>,

    /// CellTemplate for cells.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cell_template: Option<TemplateRef>,

    /// ShardTemplate for shards.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard_template: Option<TemplateRef>,
}

/// multiadmin: an inline spec or a CoreTemplate (one of the two).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.spec) || has(self.templateRef)")
    .message("must specify either 'spec' or 'templateRef'"))]
#[x_kube(validation = rules::not_both("spec", "templateRef"))]
pub struct MultiadminConfig {
    /// Inline settings (default 1 replica, 100m CPU, 128Mi memory, limit 256Mi).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<StatelessSpec>,

    /// CoreTemplate whose `multiadmin` to use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_ref: Option<TemplateRef>,

    /// Scheduling of the multiadmin pods, whichever of spec or template is used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<PodPlacementSpec>,
}

/// The multiadmin web UI: an inline spec or a CoreTemplate (one of the two).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.spec) || has(self.templateRef)")
    .message("must specify either 'spec' or 'templateRef'"))]
#[x_kube(validation = rules::not_both("spec", "templateRef"))]
pub struct MultiadminWebConfig {
    /// Inline settings (default 1 replica, 50m CPU, 64Mi memory, limit 128Mi).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<StatelessSpec>,

    /// CoreTemplate whose `multiadminWeb` to use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_ref: Option<TemplateRef>,
}

/// A cell (failure domain) of the cluster: where it runs and how its gateway is configured
/// (inline `spec`, or `cellTemplate` plus `overrides`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = rules::not_both("spec", "cellTemplate"))]
#[x_kube(validation = rules::not_both("spec", "overrides"))]
#[x_kube(validation = rules::zone_or_region_exclusive())]
#[x_kube(validation = rules::zone_or_region_required())]
#[x_kube(validation = Rule::new(
    "has(self.zone) == has(oldSelf.zone) && (!has(self.zone) || self.zone == oldSelf.zone)")
    .message("zone is immutable: it cannot be added, removed or changed after the cell is created"))]
#[x_kube(validation = Rule::new(
    "has(self.zoneId) == has(oldSelf.zoneId) && (!has(self.zoneId) || self.zoneId == oldSelf.zoneId)")
    .message("zoneId is immutable: it cannot be added, removed or changed after the cell is created"))]
#[x_kube(validation = Rule::new(
    "has(self.region) == has(oldSelf.region) && (!has(self.region) || self.region == oldSelf.region)")
    .message("region is immutable: it cannot be added, removed or changed after the cell is created"))]
pub struct CellConfig {
    /// Name of the cell: a DNS label of at most 30 characters (no `_`). Cannot change.
    pub name: CellName,

    /// Zone the cell's pods are pinned to, by the well-known node label
    /// `topology.kubernetes.io/zone` that every Kubernetes sets (e.g. `us-east-1a`,
    /// `europe-west1-b`). Exactly one of `zone`, `zoneId` and `region`; immutable once the cell
    /// exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<Zone>,

    /// Availability zone ID the cell's pods are pinned to, by the node label
    /// `topology.k8s.aws/zone-id` (EKS; e.g. `use1-az1`), as the upstream operator pins it.
    /// Exactly one of `zone`, `zoneId` and `region`; immutable once the cell exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone_id: Option<ZoneId>,

    /// Region the cell's pods are pinned to, by the node label `topology.kubernetes.io/region`
    /// (e.g. `us-east-1`). Exactly one of `zone`, `zoneId` and `region`; immutable once the
    /// cell exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<Region>,

    /// Opaque document copied verbatim into the cell's topology record for administrative
    /// clients (at most 4096 characters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096))]
    pub metadata: Option<String>,

    /// CellTemplate to start from. Exclusive with `spec`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cell_template: Option<TemplateRef>,

    /// Changes applied on top of the template. Exclusive with `spec`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overrides: Option<CellOverrides>,

    /// Inline settings, used instead of a template. Exclusive with `cellTemplate` and
    /// `overrides`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<CellInlineSpec>,
}

/// Changes applied on top of a CellTemplate.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CellOverrides {
    /// multigateway settings merged over the template's: scalars replace, pod annotations and
    /// labels merge by key, resources and affinity replace as a whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multigateway: Option<MultigatewaySpec>,

    /// Scheduling of the multigateway pods; replaces the template's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multigateway_placement: Option<PodPlacementSpec>,
}

/// Inline settings of a cell.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CellInlineSpec {
    /// multigateway settings (default 1 replica, 100m CPU, 128Mi memory, limit 256Mi).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multigateway: Option<MultigatewaySpec>,

    /// Scheduling of the multigateway pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multigateway_placement: Option<PodPlacementSpec>,

    /// A cell-local topology server. Unset: the cell's topology lives in the global topology
    /// server under `/multigres/<cell>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_topo_server: Option<LocalTopoServerSpec>,
}

/// A logical database.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct DatabaseConfig {
    /// Name of the database; only `postgres` in v1alpha1.
    pub name: DatabaseName,

    /// Whether this is the system default database; must be true in v1alpha1.
    #[serde(default, skip_serializing_if = "is_false")]
    pub default: bool,

    /// Table groups, keyed by name (at most 20). Exactly one is the default, and it is named
    /// `default`. Unset: table group `default` with shard `0-inf`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 20))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    #[x_kube(validation = Rule::new("self.filter(x, has(x.default) && x.default).size() == 1")
        .message("every database must have exactly one tablegroup marked as default"))]
    pub tablegroups: Vec<TableGroupConfig>,

    /// Backups of this database's shards, merged over the cluster's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<BackupConfig>,

    /// Durability policy of this database, overriding the cluster's (`AT_LEAST_2` or
    /// `MULTI_CELL_AT_LEAST_2`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub durability_policy: Option<String>,
}

/// A table group within a database.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.default) || !self.default || self.name == 'default'")
    .message("the default tablegroup must be named 'default'"))]
pub struct TableGroupConfig {
    /// Name of the table group (DNS label, at most 25 characters).
    pub name: TableGroupName,

    /// Whether this is the database's default (unsharded) table group; it must be named
    /// `default`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub default: bool,

    /// Shards, keyed by name (at most 32). In v1alpha1 the only shard is `0-inf`. Unset: shard
    /// `0-inf`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub shards: Vec<ShardConfig>,

    /// Backups of this table group's shards, merged over the database's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<BackupConfig>,

    /// PVC lifecycle of this table group's shards, overriding the cluster's per field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvc_deletion_policy: Option<PvcDeletionPolicy>,
}

/// A shard of a table group: inline `spec`, or `shardTemplate` plus `overrides`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = rules::not_both("spec", "shardTemplate"))]
#[x_kube(validation = rules::not_both("spec", "overrides"))]
pub struct ShardConfig {
    /// Name of the shard; must be `0-inf` in v1alpha1 (one shard covering the whole key range).
    #[x_kube(validation = Rule::new("self == '0-inf'")
        .message("shardName must be strictly equal to '0-inf' in this version"))]
    pub name: ShardName,

    /// ShardTemplate to start from. Exclusive with `spec`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard_template: Option<TemplateRef>,

    /// Changes applied on top of the template. Exclusive with `spec`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overrides: Option<ShardOverrides>,

    /// Inline settings, used instead of a template. Exclusive with `shardTemplate` and
    /// `overrides`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<ShardInlineSpec>,

    /// Backups of this shard, merged over the table group's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<BackupConfig>,
}

/// Changes applied on top of a ShardTemplate.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ShardOverrides {
    /// multiorch settings merged over the template's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multiorch: Option<MultiorchSpec>,

    /// initdb arguments replacing the template's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initdb_args: Option<InitdbArgs>,

    /// Deprecated ConfigMap of extra postgresql.conf lines, replacing the template's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub postgres_config_ref: Option<PostgresConfigRef>,

    /// PostgreSQL parameters (at most 200) merged by key over the template's. Parameters the
    /// operator manages (e.g. `port`, `wal_level`) are refused.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 200))]
    pub postgres_config: BTreeMap<String, String>,

    /// Pools merged by name over the template's (a new name adds a pool); at most 8. Pools
    /// cannot be removed or renamed.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 8))]
    #[x_kube(validation = rules::pool_name_length())]
    #[x_kube(validation = rules::pool_name_pattern())]
    #[x_kube(validation = rules::pools_append_only())]
    pub pools: Pools,
}

/// Inline settings of a shard.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ShardInlineSpec {
    /// multiorch settings (default 1 replica per cell, 50m CPU, 64Mi memory, limit 128Mi).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multiorch: Option<MultiorchSpec>,

    /// Extra initdb arguments (e.g. `--locale-provider=icu --icu-locale=en_US.UTF-8`), used
    /// when a pod initializes a new data directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initdb_args: Option<InitdbArgs>,

    /// Deprecated ConfigMap of extra postgresql.conf lines; prefer `postgresConfig`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub postgres_config_ref: Option<PostgresConfigRef>,

    /// PostgreSQL parameters (at most 200), rendered over the operator's defaults and
    /// `postgresConfigRef`. Parameters the operator manages (e.g. `port`, `wal_level`) are
    /// refused.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 200))]
    pub postgres_config: BTreeMap<String, String>,

    /// Pools by name, at most 8. Pools cannot be removed or renamed.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 8))]
    #[x_kube(validation = rules::pool_name_length())]
    #[x_kube(validation = rules::pool_name_pattern())]
    #[x_kube(validation = rules::pools_append_only())]
    pub pools: Pools,

    /// PVC lifecycle of this shard's pool volumes, overriding table group and cluster per
    /// field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvc_deletion_policy: Option<PvcDeletionPolicy>,
}

/// External exposure of a global Service (multigateway or multiadmin-web). Enabled, the
/// Service becomes a LoadBalancer with these external IPs and annotations; disabled, ClusterIP.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = rules::no_reserved_annotations())]
pub struct ExternalServiceConfig {
    /// Enables external exposure.
    pub enabled: bool,

    /// Externally routable IPv4 or IPv6 addresses set as the Service's `externalIPs` (at most
    /// 10).
    #[serde(default, rename = "externalIPs", skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 10))]
    pub external_ips: Vec<IpAddress>,

    /// Client address ranges the load balancer admits (the Service's
    /// `loadBalancerSourceRanges`), at most 20 CIDRs such as `203.0.113.0/24`. Unset: every
    /// address. Enforced by the load-balancer controller (or kube-proxy), not by the operator.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 20))]
    pub load_balancer_source_ranges: Vec<Cidr>,

    /// Annotations of the Service (at most 20), e.g. for a load balancer. Keys under
    /// `multigres.com/` are reserved.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 20))]
    pub annotations: BTreeMap<String, String>,
}

/// Most sources a NetworkPolicy list of the spec may name.
pub const MAX_NETWORK_SOURCES: usize = 20;

/// Pattern of the superuser's name: a lowercase PostgreSQL identifier that needs no quoting
/// (Multigres writes it into SQL and connection strings as is), at most 63 bytes (NAMEDATALEN).
pub const SUPERUSER_PATTERN: &str = "^[a-z_][a-z0-9_]{0,62}$";

/// The NetworkPolicies the operator keeps for a cluster's pods. Enabled (the default), the
/// internal ports (etcd, multipooler, multiorch, multiadmin, pgBackRest) admit only the
/// cluster's own pods and the operator's namespace, pgctld's gRPC port admits no one, and the
/// gateways' PostgreSQL ports admit the sources listed here.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkPolicyConfig {
    /// Whether the operator keeps the cluster's NetworkPolicies. Default true; false deletes
    /// them, leaving every port open to every pod of the Kubernetes cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,

    /// Sources that may reach the gateways' PostgreSQL ports (5432, and 5433 for replica
    /// reads): NetworkPolicy peers (`namespaceSelector` and/or `podSelector`, or `ipBlock`),
    /// at most 20. Unset or empty: every source.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "embedded_list_of_at_most::<NetworkPolicyPeer, MAX_NETWORK_SOURCES>")]
    pub gateway_sources: Vec<NetworkPolicyPeer>,

    /// Sources that may reach multiadmin-web (port 18100) besides the cluster's own pods and
    /// the operator's namespace, at most 20. Unset or empty: no others, or every source while
    /// `externalAdminWeb` is enabled (narrow it with its `loadBalancerSourceRanges`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "embedded_list_of_at_most::<NetworkPolicyPeer, MAX_NETWORK_SOURCES>")]
    pub admin_web_sources: Vec<NetworkPolicyPeer>,

    /// Sources that may scrape the metrics ports (postgres_exporter's 9187 on pool pods, the
    /// managed etcd's 2381), at most 20: name your Prometheus here. Unset or empty: every pod
    /// of the Kubernetes cluster.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "embedded_list_of_at_most::<NetworkPolicyPeer, MAX_NETWORK_SOURCES>")]
    pub metrics_sources: Vec<NetworkPolicyPeer>,
}

impl NetworkPolicyConfig {
    /// Whether the policies are kept: unless `enabled: false`.
    pub fn enabled(config: Option<&Self>) -> bool {
        config.and_then(|c| c.enabled).unwrap_or(true)
    }
}

/// Observed state of a MultigresCluster, aggregated from its children.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct MultigresClusterStatus {
    /// The `metadata.generation` this status reflects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Latest observations (e.g. `Available`, `ImageRolloutPending`), one per type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "embedded_list::<Condition>")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,

    /// Lifecycle state: Initializing, Progressing, Healthy, Degraded or Unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,

    /// Details about the phase, e.g. what is wrong.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,

    /// Summary of each cell (at most 50).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 50))]
    pub cells: BTreeMap<CellName, CellStatusSummary>,

    /// External gateway endpoint; absent when `externalGateway` is unset or disabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<ExternalEndpointStatus>,

    /// External admin web endpoint; absent when `externalAdminWeb` is unset or disabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin_web: Option<ExternalEndpointStatus>,

    /// Summary of each database (at most 50).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 50))]
    pub databases: BTreeMap<DatabaseName, DatabaseStatusSummary>,

    /// Templates used by the last successful reconcile, so template changes requeue only their
    /// users.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved_templates: Option<ResolvedTemplates>,

    /// Effective images and the rollout state of operator-default images.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub images: Option<ImagesStatus>,

    /// The backup asked for by the annotation `multigres.com/backup-request`, over all
    /// shards; written by the data-handler.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup_request: Option<BackupRequestRollup>,
}

/// Where a requested backup stands over the shards of a cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = crate::schema::field_described)]
pub enum BackupRequestPhase {
    /// No shard has taken it yet (no serving pool pod to take it on, or not seen yet).
    Pending,
    /// Every shard that has not answered waits for a backup running before it.
    Queued,
    /// Being taken on some shards.
    Running,
    /// Completed on every shard.
    Completed,
    /// Answered on every shard, and failed on at least one.
    Failed,
}

/// The state of the cluster's backup request (`multigres.com/backup-request`) over its shards.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupRequestRollup {
    /// The request id, the annotation's value.
    pub id: String,

    /// Pending, Queued, Running, Completed or Failed.
    pub state: BackupRequestPhase,

    /// Shards whose backup completed.
    pub shards_completed: i32,

    /// Shards whose backup failed.
    pub shards_failed: i32,

    /// Shards of the cluster.
    pub shards_total: i32,

    /// What waits or what failed, shard by shard.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Summary of one cell.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CellStatusSummary {
    /// Whether the cell's gateways are available.
    pub ready: bool,

    /// Number of multigateway pods of the cell.
    pub gateway_replicas: i32,
}

/// Summary of one database.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DatabaseStatusSummary {
    /// Shards of the database that are healthy.
    pub ready_shards: i32,

    /// Shards of the database.
    pub total_shards: i32,
}

/// State of an externally exposed Service.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExternalEndpointStatus {
    /// Hostname or IP of the external endpoint, from `externalIPs` or the load balancer's
    /// ingress. Empty until provisioned.
    pub external_endpoint: String,
}

/// Templates resolved by the last successful reconcile (sorted, no duplicates).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedTemplates {
    /// CoreTemplate names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub core_templates: Vec<TemplateRef>,

    /// CellTemplate names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cell_templates: Vec<TemplateRef>,

    /// ShardTemplate names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shard_templates: Vec<TemplateRef>,
}

/// How the effective images were chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = crate::schema::field_described)]
#[serde(rename_all = "lowercase")]
pub enum ImageSource {
    /// Every image is set in `spec.images`.
    Explicit,
    /// Every image comes from the operator's defaults.
    Defaults,
    /// Some images are set in `spec.images`, the rest come from the defaults.
    Mixed,
}

/// Effective images and the rollout state of operator-default images.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImagesStatus {
    /// Strategy in effect: `spec.imageUpdatePolicy.strategy`, else the operator's flag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_strategy: Option<ImageUpdateStrategy>,

    /// The complete image set given to the children.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effective: Option<ComponentImages>,

    /// Where the effective images come from: `explicit`, `defaults` or `mixed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<ImageSource>,

    /// Operator-default images committed for the components not set in `spec.images`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied: Option<ComponentImages>,

    /// Revision of the applied default set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_revision: Option<String>,

    /// The operator's current default image set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available: Option<ComponentImages>,

    /// Revision of the current default set; when it differs from `appliedRevision` a new set
    /// waits to be adopted (under `lazy`, set `spec.imageUpdatePolicy.acknowledgedRevision` to
    /// it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_revision: Option<String>,
}
