//! Template resolution: one pure function from a MultigresCluster and the templates of its
//! namespace to the fully resolved specs of every child. Shared by the cluster-handler (which
//! applies the children) and the webhook (which shows users the defaults).
//!
//! For each component the chain is, from strongest to weakest:
//! 1. the inline spec (and `overrides`) on the component, over an explicit template reference;
//! 2. the template named in `spec.templateDefaults`;
//! 3. the namespace template named `default`;
//! 4. built-in defaults ([`defaults`]).
//!
//! Only one template applies per component: the explicit reference, else `templateDefaults`, else
//! `default`. A template that is named (explicitly or in `templateDefaults`) but does not exist is
//! an error listing every such reference; a missing `default` template is not. Levels are laid over
//! each other with the rules in [`merge`].

pub mod cohort;
pub mod defaults;
pub mod images;
pub mod merge;
mod pvc;

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::LocalObjectReference;
use kube::ResourceExt;

use crate::v1alpha1::{
    BackupConfig, BackupType, CellConfig, CellImages, CellName, CellSpec, CellTemplateSpec,
    ComponentLogLevels, ContainerConfig, CoreTemplateSpec, DatabaseConfig, EtcdSpec,
    ExternalTopoServerSpec, FilesystemBackupConfig, GatewayTlsConfig, GlobalTopoServerRef,
    GoDuration, ImagePullPolicy, ImageRef, LocalTopoServerSpec, LogLevel, MultigresCluster,
    MultigresClusterSpec, ObservabilityConfig, PodPlacementSpec, PoolName, PoolSpec, PoolType,
    PvcDeletionPolicy, ResolvedTemplates, ShardConfig, ShardImages, ShardResolvedSpec, ShardSpec,
    ShardTemplateSpec, StatelessSpec, StorageSpec, TableGroupConfig, TableGroupSpec,
    TemplateDefaults, TemplateRef, TopoServerSpec, TopologyPruningConfig, TopologyReconciliation,
};
use crate::{DEFAULT_DATABASE, DEFAULT_POOL, DEFAULT_SHARD, DEFAULT_TABLEGROUP, DEFAULT_TEMPLATE};
use merge::{Overlay, merge_map, merge_pools, overlay_opt, replace};
pub use pvc::resolve_pvc_policy;

/// Node label a cell's `zone` pins its pods with: the well-known label every Kubernetes sets.
pub const ZONE_NODE_LABEL: &str = "topology.kubernetes.io/zone";
/// Node label a cell's `zoneId` pins its pods with, as the upstream operator does (set on EKS
/// nodes only), so upstream manifests keep their meaning.
pub const ZONE_ID_NODE_LABEL: &str = "topology.k8s.aws/zone-id";
/// Node label a cell's `region` pins its pods with.
pub const REGION_NODE_LABEL: &str = "topology.kubernetes.io/region";

/// The node label and value a cell's pods are pinned to: whichever of `zone`, `zoneId` and
/// `region` the cell names (the schema allows exactly one).
pub fn cell_node_label<'a>(
    zone: Option<&'a str>,
    zone_id: Option<&'a str>,
    region: Option<&'a str>,
) -> Option<(&'static str, &'a str)> {
    zone.map(|z| (ZONE_NODE_LABEL, z))
        .or_else(|| zone_id.map(|z| (ZONE_ID_NODE_LABEL, z)))
        .or_else(|| region.map(|r| (REGION_NODE_LABEL, r)))
}

/// The templates of one namespace, by name.
#[derive(Clone, Debug, Default)]
pub struct Templates {
    pub core: BTreeMap<String, CoreTemplateSpec>,
    pub cell: BTreeMap<String, CellTemplateSpec>,
    pub shard: BTreeMap<String, ShardTemplateSpec>,
}

/// Which kind of template a reference names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum TemplateKind {
    Core,
    Cell,
    Shard,
}

impl std::fmt::Display for TemplateKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TemplateKind::Core => "CoreTemplate",
            TemplateKind::Cell => "CellTemplate",
            TemplateKind::Shard => "ShardTemplate",
        })
    }
}

/// A template reference that names nothing.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct MissingTemplate {
    pub kind: TemplateKind,
    pub name: String,
    /// Where the reference is, e.g. `spec.cells[1].cellTemplate`.
    pub field: String,
}

/// Why a cluster cannot be resolved. Every variant is a problem in the user's spec.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ResolveError {
    #[error("{}", missing_message(.0))]
    MissingTemplates(Vec<MissingTemplate>),
    #[error("{field}: durability policy {value:?} is not supported; allowed: {}", defaults::DURABILITY_POLICIES.join(", "))]
    UnsupportedDurabilityPolicy { field: String, value: String },
    #[error(
        "spec.internalTLS.topology: true needs every topology server to be an etcd the operator \
         runs, but {server} is external: Multigres dials every etcd of a cluster with one TLS \
         setting (--topo-etcd-tls-*); use a managed etcd there, or create the cluster with \
         spec.internalTLS.topology: false"
    )]
    TopologyTlsWithExternalServer { server: String },
    #[error(
        "spec.globalTopoServer.external.clientCertSecret is required with caSecret: Multigres \
         dials etcd over TLS only with a client certificate (--topo-etcd-tls-cert and -key); \
         name a Secret holding tls.crt and tls.key"
    )]
    TopologyCaWithoutClientCertificate,
    #[error(
        "{server} cannot take other TLS settings than spec.globalTopoServer.external \
         (caSecret {global_ca:?}, clientCertSecret {global_cert:?}): Multigres dials every etcd \
         of a cluster with one TLS setting (--topo-etcd-tls-*); name the same Secrets there, \
         or none when the global server has none"
    )]
    TopologyTlsMismatch {
        server: String,
        global_ca: Option<String>,
        global_cert: Option<String>,
    },
}

impl ResolveError {
    /// The field a topology TLS conflict is reported at; `None` for the other errors.
    pub fn topology_field(&self) -> Option<&'static str> {
        match self {
            ResolveError::TopologyTlsWithExternalServer { .. } => Some("spec.internalTLS.topology"),
            ResolveError::TopologyCaWithoutClientCertificate => {
                Some("spec.globalTopoServer.external.clientCertSecret")
            }
            ResolveError::TopologyTlsMismatch { .. } => Some("spec.cells"),
            ResolveError::MissingTemplates(_)
            | ResolveError::UnsupportedDurabilityPolicy { .. } => None,
        }
    }
}

fn missing_message(missing: &[MissingTemplate]) -> String {
    let parts: Vec<String> = missing
        .iter()
        .map(|m| {
            format!(
                "{}: {} {:?} does not exist in this namespace",
                m.field, m.kind, m.name
            )
        })
        .collect();
    format!(
        "{}; create the template or change the reference",
        parts.join("; ")
    )
}

/// The global topology server: created by the operator, or an existing etcd.
#[derive(Clone, Debug, PartialEq)]
pub enum GlobalTopo {
    Managed(Box<TopoServerSpec>),
    External(ExternalTopoServerSpec),
}

/// Concrete images and pull settings for every component.
#[derive(Clone, Debug, PartialEq)]
pub struct ResolvedImages {
    pub pull_policy: ImagePullPolicy,
    pub pull_secrets: Vec<LocalObjectReference>,
    pub multigateway: ImageRef,
    pub multiorch: ImageRef,
    pub multipooler: ImageRef,
    pub multiadmin: ImageRef,
    pub multiadmin_web: ImageRef,
    pub postgres: ImageRef,
    pub postgres_exporter: ImageRef,
}

/// A cell: the spec of its Cell child, and of its local TopoServer when the operator runs one.
#[derive(Clone, Debug, PartialEq)]
pub struct ResolvedCell {
    pub spec: CellSpec,
    pub local_topo: Option<TopoServerSpec>,
}

/// Everything the cluster resolves to.
#[derive(Clone, Debug, PartialEq)]
pub struct ResolvedCluster {
    pub global_topo: GlobalTopo,
    /// How every process reaches the global topology.
    pub topo_ref: GlobalTopoServerRef,
    pub multiadmin: StatelessSpec,
    pub multiadmin_placement: Option<PodPlacementSpec>,
    pub multiadmin_web: StatelessSpec,
    pub images: ResolvedImages,
    pub log_levels: ComponentLogLevels,
    pub cells: Vec<ResolvedCell>,
    pub table_groups: Vec<TableGroupSpec>,
    /// PVC policy of the cluster level, both halves resolved.
    pub pvc_deletion_policy: PvcDeletionPolicy,
}

/// Every template a cluster depends on, sorted: explicit references, `templateDefaults`, and the
/// namespace `default` of each kind (whose creation or edit changes the result too). Recorded in
/// the cluster's status so a template change re-resolves exactly the clusters that use it.
pub fn referenced_templates(cluster: &MultigresCluster) -> ResolvedTemplates {
    let with_default = |refs: Vec<TemplateRef>| {
        let mut names: BTreeSet<String> = refs.into_iter().map(TemplateRef::into_inner).collect();
        names.insert(DEFAULT_TEMPLATE.to_string());
        names.into_iter().map(TemplateRef::new).collect()
    };
    let explicit = named_templates(cluster);
    ResolvedTemplates {
        core_templates: with_default(explicit.core_templates),
        cell_templates: with_default(explicit.cell_templates),
        shard_templates: with_default(explicit.shard_templates),
    }
}

/// The templates a cluster names in its fields (explicit references and `templateDefaults`),
/// sorted; unlike [`referenced_templates`], without the namespace `default` it falls back to.
pub fn named_templates(cluster: &MultigresCluster) -> ResolvedTemplates {
    let spec = &cluster.spec;
    let mut core = BTreeSet::new();
    let mut cell = BTreeSet::new();
    let mut shard = BTreeSet::new();
    let defaults = spec.template_defaults.clone().unwrap_or_default();
    let add = |set: &mut BTreeSet<String>, r: &Option<TemplateRef>| {
        if let Some(r) = r {
            set.insert(r.as_str().to_string());
        }
    };
    add(&mut core, &defaults.core_template);
    add(&mut cell, &defaults.cell_template);
    add(&mut shard, &defaults.shard_template);
    if let Some(g) = &spec.global_topo_server {
        add(&mut core, &g.template_ref);
    }
    if let Some(m) = &spec.multiadmin {
        add(&mut core, &m.template_ref);
    }
    if let Some(m) = &spec.multiadmin_web {
        add(&mut core, &m.template_ref);
    }
    for c in &spec.cells {
        add(&mut cell, &c.cell_template);
    }
    for db in &spec.databases {
        for tg in &db.tablegroups {
            for s in &tg.shards {
                add(&mut shard, &s.shard_template);
            }
        }
    }
    let to_refs = |s: BTreeSet<String>| s.into_iter().map(TemplateRef::new).collect();
    ResolvedTemplates {
        core_templates: to_refs(core),
        cell_templates: to_refs(cell),
        shard_templates: to_refs(shard),
    }
}

/// Picks the one template of a component and records references that name nothing.
struct Picker<'a> {
    templates: &'a Templates,
    /// The cluster's `spec.templateDefaults`, the fallback of every component.
    defaults: Option<&'a TemplateDefaults>,
    missing: Vec<MissingTemplate>,
}

impl<'a> Picker<'a> {
    fn new(templates: &'a Templates, defaults: Option<&'a TemplateDefaults>) -> Self {
        Self {
            templates,
            defaults,
            missing: Vec::new(),
        }
    }

    /// The CoreTemplate of a component whose explicit reference is at `field`.
    fn core(
        &mut self,
        explicit: Option<&TemplateRef>,
        field: impl FnOnce() -> String,
    ) -> Option<&'a CoreTemplateSpec> {
        let templates = self.templates;
        self.pick(TemplateKind::Core, &templates.core, explicit, field)
    }

    /// The CellTemplate of a cell whose explicit reference is at `field`.
    fn cell(
        &mut self,
        explicit: Option<&TemplateRef>,
        field: impl FnOnce() -> String,
    ) -> Option<&'a CellTemplateSpec> {
        let templates = self.templates;
        self.pick(TemplateKind::Cell, &templates.cell, explicit, field)
    }

    /// The ShardTemplate of a shard whose explicit reference is at `field`.
    fn shard(
        &mut self,
        explicit: Option<&TemplateRef>,
        field: impl FnOnce() -> String,
    ) -> Option<&'a ShardTemplateSpec> {
        let templates = self.templates;
        self.pick(TemplateKind::Shard, &templates.shard, explicit, field)
    }

    /// `explicit`, else the cluster's `templateDefaults` entry for `kind`, else the namespace
    /// `default` (absent is fine).
    fn pick<T>(
        &mut self,
        kind: TemplateKind,
        map: &'a BTreeMap<String, T>,
        explicit: Option<&TemplateRef>,
        field: impl FnOnce() -> String,
    ) -> Option<&'a T> {
        let defaults = self.defaults;
        let (cluster_default, default_field) = match kind {
            TemplateKind::Core => (
                defaults.and_then(|d| d.core_template.as_ref()),
                "spec.templateDefaults.coreTemplate",
            ),
            TemplateKind::Cell => (
                defaults.and_then(|d| d.cell_template.as_ref()),
                "spec.templateDefaults.cellTemplate",
            ),
            TemplateKind::Shard => (
                defaults.and_then(|d| d.shard_template.as_ref()),
                "spec.templateDefaults.shardTemplate",
            ),
        };
        let named = match (explicit, cluster_default) {
            (Some(name), _) => Some((name, field())),
            (None, Some(name)) => Some((name, default_field.to_string())),
            (None, None) => None,
        };
        if let Some((name, field)) = named {
            let found = map.get(name.as_str());
            if found.is_none() {
                self.missing.push(MissingTemplate {
                    kind,
                    name: name.as_str().to_string(),
                    field,
                });
            }
            return found;
        }
        map.get(DEFAULT_TEMPLATE)
    }

    /// Ends the picking: every reference that named nothing, sorted, as one error.
    fn finish(self) -> Result<(), ResolveError> {
        if self.missing.is_empty() {
            return Ok(());
        }
        let mut missing = self.missing;
        missing.sort();
        missing.dedup();
        Err(ResolveError::MissingTemplates(missing))
    }
}

/// Resolves a cluster against the templates of its namespace.
///
/// Steps: the cluster-level settings (images, log levels, observability, PVC policy), the global
/// topology server, multiadmin and its web UI, the cells, then the table groups with their
/// shards. Missing templates are reported before an unsupported durability policy.
pub fn resolve(
    cluster: &MultigresCluster,
    templates: &Templates,
) -> Result<ResolvedCluster, ResolveError> {
    let spec = &cluster.spec;
    let mut picker = Picker::new(templates, spec.template_defaults.as_ref());
    let cluster_pvc = resolve_pvc_policy(&[spec.pvc_deletion_policy.as_ref()]);
    let images = resolve_images(cluster);
    let log_levels = resolve_log_levels(spec.log_levels.as_ref());
    let observability = resolve_observability(spec.observability.as_ref());

    let global_topo = resolve_global_topo(spec, &mut picker);
    let topo_ref = global_topo_ref(cluster, &global_topo);
    let (multiadmin, multiadmin_placement) = resolve_multiadmin(spec, &mut picker);
    let multiadmin_web = resolve_multiadmin_web(spec, &mut picker);

    let all_cells = sorted_cell_names(spec);
    let pruning = topology_pruning(spec);
    let inherited = Inherited {
        images: &images,
        topo_ref: &topo_ref,
        all_cells: &all_cells,
        pruning: &pruning,
        log_levels: &log_levels,
        observability: observability.as_ref(),
        gateway_tls: resolve_gateway_tls(cluster),
        cluster: spec,
    };
    let cells = resolve_cells(&mut picker, &inherited);
    let (table_groups, bad_durability) = resolve_table_groups(&mut picker, &inherited);

    picker.finish()?;
    if let Some(err) = bad_durability {
        return Err(err);
    }
    if crate::v1alpha1::InternalTlsConfig::topology_enabled(spec.internal_tls.as_ref())
        && let Some(server) = external_topology_server(&global_topo, &cells)
    {
        return Err(ResolveError::TopologyTlsWithExternalServer { server });
    }
    check_topology_tls(&topo_ref, &cells)?;
    Ok(ResolvedCluster {
        global_topo,
        topo_ref,
        multiadmin,
        multiadmin_placement,
        multiadmin_web,
        images,
        log_levels,
        cells,
        table_groups,
        pvc_deletion_policy: cluster_pvc,
    })
}

/// The cells' gateway TLS: with `spec.issuerName`, the Secret the cells serve is the one
/// cert-manager issues for the cluster's gateway Certificate.
fn resolve_gateway_tls(cluster: &MultigresCluster) -> Option<GatewayTlsConfig> {
    let spec = &cluster.spec;
    if spec.issuer_name.is_none() {
        return spec.gateway_tls.clone();
    }
    let mut tls = spec.gateway_tls.clone().unwrap_or_default();
    tls.secret_name = Some(crate::names::gateway_certificate(&cluster.name_any()));
    Some(tls)
}

/// The first topology server of the cluster the operator does not run, as a field path (a cell's
/// may come from its CellTemplate, hence its name rather than an index).
pub fn external_topology_server(global: &GlobalTopo, cells: &[ResolvedCell]) -> Option<String> {
    if matches!(global, GlobalTopo::External(_)) {
        return Some("spec.globalTopoServer.external".to_owned());
    }
    cells
        .iter()
        .find(|c| {
            c.spec
                .topo_server
                .as_ref()
                .is_some_and(|t| t.external.is_some())
        })
        .map(|c| {
            format!(
                "the localTopoServer.external of cell {}",
                c.spec.name.as_str()
            )
        })
}

/// Every topology server of the cluster takes the global one's TLS settings, since Multigres
/// applies one set of `--topo-etcd-tls-*` flags to every etcd a process dials: a cell's
/// external etcd names the same Secrets, and a cell's managed etcd (plaintext unless topology
/// TLS is on, which needs a managed global server) only goes with a plaintext global server.
fn check_topology_tls(
    global: &GlobalTopoServerRef,
    cells: &[ResolvedCell],
) -> Result<(), ResolveError> {
    if global.ca_secret.is_some() && global.client_cert_secret.is_none() {
        return Err(ResolveError::TopologyCaWithoutClientCertificate);
    }
    let external_tls = global.client_cert_secret.is_some();
    for cell in cells {
        let Some(local) = &cell.spec.topo_server else {
            continue;
        };
        let name = cell.spec.name.as_str();
        let same = match &local.external {
            Some(e) => {
                let secret = |s: &Option<String>| s.clone().filter(|s| !s.is_empty());
                secret(&e.ca_secret) == global.ca_secret
                    && secret(&e.client_cert_secret) == global.client_cert_secret
            }
            None => !external_tls,
        };
        if !same {
            let server = match local.external {
                Some(_) => format!("the localTopoServer.external of cell {name}"),
                None => format!("the managed localTopoServer.etcd of cell {name}"),
            };
            return Err(ResolveError::TopologyTlsMismatch {
                server,
                global_ca: global.ca_secret.clone(),
                global_cert: global.client_cert_secret.clone(),
            });
        }
    }
    Ok(())
}

/// The global topology server: the external one as written, or the managed etcd laid template →
/// inline over the built-in defaults.
fn resolve_global_topo(spec: &MultigresClusterSpec, picker: &mut Picker) -> GlobalTopo {
    let gts = spec.global_topo_server.clone().unwrap_or_default();
    let template = picker.core(gts.template_ref.as_ref(), || {
        "spec.globalTopoServer.templateRef".to_string()
    });
    if let Some(external) = &gts.external {
        return GlobalTopo::External(external.clone());
    }
    let base = template.and_then(|t| t.global_topo_server.clone());
    let mut etcd = base
        .as_ref()
        .and_then(|t| t.etcd.clone())
        .unwrap_or_default();
    if let Some(inline) = &gts.etcd {
        etcd.overlay(inline);
    }
    let mut placement = base.as_ref().and_then(|t| t.placement.clone());
    replace(&mut placement, &gts.placement);
    let pvc = resolve_pvc_policy(&[
        etcd.pvc_deletion_policy.as_ref(),
        gts.pvc_deletion_policy.as_ref(),
        base.as_ref().and_then(|t| t.pvc_deletion_policy.as_ref()),
        spec.pvc_deletion_policy.as_ref(),
    ]);
    let etcd = etcd_with_defaults(etcd, defaults::GLOBAL_ROOT, &pvc);
    GlobalTopo::Managed(Box::new(TopoServerSpec {
        etcd: Some(etcd),
        pvc_deletion_policy: Some(pvc),
        placement,
    }))
}

/// How every process reaches the global topology: the managed server's Service, or the
/// external endpoints.
fn global_topo_ref(cluster: &MultigresCluster, global_topo: &GlobalTopo) -> GlobalTopoServerRef {
    match global_topo {
        GlobalTopo::Managed(t) => {
            let name = cluster.metadata.name.as_deref().unwrap_or_default();
            let namespace = cluster.metadata.namespace.as_deref().unwrap_or_default();
            GlobalTopoServerRef {
                address: crate::names::topo_client_address(
                    &crate::names::global_topo_server(name),
                    namespace,
                ),
                root_path: t
                    .etcd
                    .as_ref()
                    .and_then(|e| e.root_path.clone())
                    .unwrap_or_else(|| defaults::GLOBAL_ROOT.to_string()),
                implementation: defaults::TOPO_IMPLEMENTATION.to_string(),
                ..Default::default()
            }
        }
        GlobalTopo::External(e) => GlobalTopoServerRef {
            address: e
                .endpoints
                .iter()
                .map(|u| host_port(u.as_str()))
                .collect::<Vec<_>>()
                .join(","),
            root_path: e
                .root_path
                .clone()
                .unwrap_or_else(|| defaults::GLOBAL_ROOT.to_string()),
            implementation: e
                .implementation
                .clone()
                .unwrap_or_else(|| defaults::TOPO_IMPLEMENTATION.to_string()),
            ca_secret: e.ca_secret.clone().filter(|s| !s.is_empty()),
            client_cert_secret: e.client_cert_secret.clone().filter(|s| !s.is_empty()),
        },
    }
}

/// multiadmin and its placement, laid template → inline over the built-in defaults.
fn resolve_multiadmin(
    spec: &MultigresClusterSpec,
    picker: &mut Picker,
) -> (StatelessSpec, Option<PodPlacementSpec>) {
    let admin = spec.multiadmin.clone().unwrap_or_default();
    let template = picker.core(admin.template_ref.as_ref(), || {
        "spec.multiadmin.templateRef".to_string()
    });
    let mut multiadmin = template
        .and_then(|t| t.multiadmin.clone())
        .unwrap_or_default();
    if let Some(inline) = &admin.spec {
        multiadmin.overlay(inline);
    }
    let multiadmin = stateless_with_defaults(
        multiadmin,
        defaults::MULTIADMIN_REPLICAS,
        defaults::multiadmin_resources,
    );
    let mut placement = template.and_then(|t| t.multiadmin_placement.clone());
    replace(&mut placement, &admin.placement);
    (multiadmin, placement)
}

/// multiadmin's web UI, laid template → inline over the built-in defaults.
fn resolve_multiadmin_web(spec: &MultigresClusterSpec, picker: &mut Picker) -> StatelessSpec {
    let web = spec.multiadmin_web.clone().unwrap_or_default();
    let template = picker.core(web.template_ref.as_ref(), || {
        "spec.multiadminWeb.templateRef".to_string()
    });
    let mut multiadmin_web = template
        .and_then(|t| t.multiadmin_web.clone())
        .unwrap_or_default();
    if let Some(inline) = &web.spec {
        multiadmin_web.overlay(inline);
    }
    stateless_with_defaults(
        multiadmin_web,
        defaults::MULTIADMIN_WEB_REPLICAS,
        defaults::multiadmin_web_resources,
    )
}

/// The names of the cluster's cells, sorted: every cell and shard lists all of them.
fn sorted_cell_names(spec: &MultigresClusterSpec) -> Vec<CellName> {
    let mut names: Vec<CellName> = spec.cells.iter().map(|c| c.name.clone()).collect();
    names.sort();
    names
}

/// Topology pruning, on unless the cluster turns it off.
fn topology_pruning(spec: &MultigresClusterSpec) -> TopologyPruningConfig {
    TopologyPruningConfig {
        enabled: Some(
            spec.topology_pruning
                .as_ref()
                .and_then(|p| p.enabled)
                .unwrap_or(true),
        ),
    }
}

/// Every cell with its template.
fn resolve_cells(picker: &mut Picker, inherited: &Inherited) -> Vec<ResolvedCell> {
    inherited
        .cluster
        .cells
        .iter()
        .enumerate()
        .map(|(i, cell)| {
            let template = picker.cell(cell.cell_template.as_ref(), || {
                format!("spec.cells[{i}].cellTemplate")
            });
            resolve_cell(cell, template, inherited)
        })
        .collect()
}

/// One effective database as its table groups inherit it.
struct DatabaseLevel<'a> {
    /// Index in `spec.databases`.
    index: usize,
    config: &'a DatabaseConfig,
    /// The cluster's backup with the database's laid over it.
    backup: BackupConfig,
    durability: String,
}

/// The table groups of every effective database, with their shards; and the first unsupported
/// durability policy, which [`resolve`] reports only when no template is missing.
fn resolve_table_groups(
    picker: &mut Picker,
    inherited: &Inherited,
) -> (Vec<TableGroupSpec>, Option<ResolveError>) {
    let spec = inherited.cluster;
    let cluster_backup = spec.backup.clone().unwrap_or_else(default_backup);
    let mut table_groups = Vec::new();
    let mut bad_durability = None;
    for (index, config) in effective_databases(&spec.databases).iter().enumerate() {
        let durability = config
            .durability_policy
            .as_deref()
            .or(spec.durability_policy.as_deref())
            .unwrap_or(defaults::DURABILITY_POLICY)
            .to_string();
        if bad_durability.is_none() {
            bad_durability = unsupported_durability(index, config, &durability);
        }
        let mut backup = cluster_backup.clone();
        if let Some(b) = &config.backup {
            backup.overlay(b);
        }
        let db = DatabaseLevel {
            index,
            config,
            backup,
            durability,
        };
        for (ti, tg) in config.tablegroups.iter().enumerate() {
            table_groups.push(resolve_table_group(picker, inherited, &db, ti, tg));
        }
    }
    (table_groups, bad_durability)
}

/// The error for a database's durability policy when it is not supported, naming the field it
/// came from: the database's own, else the cluster's.
fn unsupported_durability(
    index: usize,
    db: &DatabaseConfig,
    durability: &str,
) -> Option<ResolveError> {
    if defaults::DURABILITY_POLICIES.contains(&durability) {
        return None;
    }
    let field = if db.durability_policy.is_some() {
        format!("spec.databases[{index}].durabilityPolicy")
    } else {
        "spec.durabilityPolicy".to_string()
    };
    Some(ResolveError::UnsupportedDurabilityPolicy {
        field,
        value: durability.to_string(),
    })
}

/// One table group with its effective shards, each with its template.
fn resolve_table_group(
    picker: &mut Picker,
    inherited: &Inherited,
    db: &DatabaseLevel,
    ti: usize,
    tg: &TableGroupConfig,
) -> TableGroupSpec {
    let spec = inherited.cluster;
    let mut tg_backup = db.backup.clone();
    if let Some(b) = &tg.backup {
        tg_backup.overlay(b);
    }
    let tg_pvc = resolve_pvc_policy(&[
        tg.pvc_deletion_policy.as_ref(),
        spec.pvc_deletion_policy.as_ref(),
    ]);
    let di = db.index;
    let shards = effective_shards(&tg.shards)
        .iter()
        .enumerate()
        .map(|(si, shard)| {
            let template = picker.shard(shard.shard_template.as_ref(), || {
                format!("spec.databases[{di}].tablegroups[{ti}].shards[{si}].shardTemplate")
            });
            resolve_shard(shard, template, &tg_backup, &tg_pvc, inherited.all_cells)
        })
        .collect();
    let images = inherited.images;
    TableGroupSpec {
        database_name: db.config.name.clone(),
        table_group_name: tg.name.clone(),
        default: tg.default,
        images: ShardImages {
            image_pull_policy: Some(images.pull_policy),
            image_pull_secrets: images.pull_secrets.clone(),
            multiorch: images.multiorch.clone(),
            multipooler: images.multipooler.clone(),
            postgres: images.postgres.clone(),
            postgres_exporter: Some(images.postgres_exporter.clone()),
        },
        global_topo_server: inherited.topo_ref.clone(),
        shards,
        pvc_deletion_policy: Some(tg_pvc),
        internal_tls: spec.internal_tls.clone(),
        observability: inherited.observability.cloned(),
        log_levels: Some(inherited.log_levels.clone()),
        backup: Some(tg_backup),
        cell_topology_labels: cell_topology_labels(&spec.cells),
        topology_pruning: Some(inherited.pruning.clone()),
        durability_policy: Some(db.durability.clone()),
        postgres_superuser: Some(
            spec.postgres_superuser
                .clone()
                .unwrap_or_else(|| defaults::POSTGRES_SUPERUSER.to_string()),
        ),
        postgres_password_secret_ref: spec.postgres_password_secret_ref.clone(),
    }
}

/// The spec of one Shard child, from its TableGroup and its resolved entry there.
pub fn shard_spec(tg: &TableGroupSpec, shard: &ShardResolvedSpec) -> ShardSpec {
    let replicas = shard
        .pools
        .values()
        .map(|p| p.replicas_per_cell.unwrap_or(1) * p.cells.len() as i32)
        .sum();
    let pvc = resolve_pvc_policy(&[
        shard.pvc_deletion_policy.as_ref(),
        tg.pvc_deletion_policy.as_ref(),
    ]);
    ShardSpec {
        database_name: tg.database_name.clone(),
        table_group_name: tg.table_group_name.clone(),
        shard_name: crate::v1alpha1::ShardName::new(shard.name.clone()),
        images: tg.images.clone(),
        global_topo_server: tg.global_topo_server.clone(),
        multiorch: shard.multiorch.clone(),
        initdb_args: shard.initdb_args.clone(),
        postgres_config_ref: shard.postgres_config_ref.clone(),
        postgres_config: shard.postgres_config.clone(),
        pools: shard.pools.clone(),
        pvc_deletion_policy: Some(pvc),
        internal_tls: tg.internal_tls.clone(),
        observability: tg.observability.clone(),
        log_levels: tg.log_levels.clone(),
        backup: shard.backup.clone().or_else(|| tg.backup.clone()),
        topology_pruning: tg.topology_pruning.clone(),
        durability_policy: tg.durability_policy.clone(),
        postgres_superuser: tg.postgres_superuser.clone(),
        postgres_password_secret_ref: tg.postgres_password_secret_ref.clone(),
        cell_topology_labels: tg.cell_topology_labels.clone(),
        replicas: Some(replicas),
    }
}

fn host_port(url: &str) -> String {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
        .unwrap_or(url);
    rest.trim_end_matches('/').to_string()
}

fn resolve_images(cluster: &MultigresCluster) -> ResolvedImages {
    let i = cluster.spec.images.clone().unwrap_or_default();
    let or = |v: Option<ImageRef>, d: &str| v.unwrap_or_else(|| ImageRef::new(d));
    ResolvedImages {
        pull_policy: i.image_pull_policy.unwrap_or(ImagePullPolicy::IfNotPresent),
        pull_secrets: i.image_pull_secrets,
        multigateway: or(i.multigateway, defaults::MULTIGRES_IMAGE),
        multiorch: or(i.multiorch, defaults::MULTIGRES_IMAGE),
        multipooler: or(i.multipooler, defaults::MULTIGRES_IMAGE),
        multiadmin: or(i.multiadmin, defaults::MULTIGRES_IMAGE),
        multiadmin_web: or(i.multiadmin_web, defaults::MULTIADMIN_WEB_IMAGE),
        postgres: or(i.postgres, defaults::POSTGRES_IMAGE),
        postgres_exporter: or(i.postgres_exporter, defaults::POSTGRES_EXPORTER_IMAGE),
    }
}

/// OpenTelemetry settings as children receive them: the sampling ConfigMap key filled in as the
/// API server's schema default would, so a child compares equal to its stored form and an
/// unchanged cluster costs no apply.
fn resolve_observability(config: Option<&ObservabilityConfig>) -> Option<ObservabilityConfig> {
    let mut config = config?.clone();
    if let Some(sampling) = &mut config.sampling_config_ref {
        sampling
            .key
            .get_or_insert_with(|| defaults::SAMPLING_CONFIG_KEY.to_string());
    }
    if let Some(queries) = config
        .postgres_exporter
        .as_mut()
        .and_then(|e| e.custom_queries.as_mut())
    {
        queries
            .key
            .get_or_insert_with(|| defaults::EXPORTER_QUERIES_KEY.to_string());
    }
    Some(config)
}

fn resolve_log_levels(levels: Option<&ComponentLogLevels>) -> ComponentLogLevels {
    let l = levels.cloned().unwrap_or_default();
    let info = Some(LogLevel::Info);
    ComponentLogLevels {
        pgctld: l.pgctld.or(info),
        multipooler: l.multipooler.or(info),
        multiorch: l.multiorch.or(info),
        multiadmin: l.multiadmin.or(info),
        multigateway: l.multigateway.or(info),
    }
}

fn stateless_with_defaults(
    mut s: StatelessSpec,
    replicas: i32,
    resources: fn() -> k8s_openapi::api::core::v1::ResourceRequirements,
) -> StatelessSpec {
    s.replicas.get_or_insert(replicas);
    s.resources.get_or_insert_with(resources);
    s
}

fn storage_with_defaults(storage: Option<StorageSpec>, size: &str) -> StorageSpec {
    let mut s = storage.unwrap_or_default();
    s.size.get_or_insert_with(|| size.to_string());
    if s.access_modes.is_empty() {
        s.access_modes = vec![defaults::ACCESS_MODE.to_string()];
    }
    s
}

fn etcd_with_defaults(mut etcd: EtcdSpec, root: &str, pvc: &PvcDeletionPolicy) -> EtcdSpec {
    etcd.image
        .get_or_insert_with(|| ImageRef::new(defaults::ETCD_IMAGE));
    etcd.replicas.get_or_insert(defaults::ETCD_REPLICAS);
    etcd.storage = Some(storage_with_defaults(etcd.storage, defaults::ETCD_STORAGE));
    etcd.resources.get_or_insert_with(defaults::etcd_resources);
    etcd.root_path.get_or_insert_with(|| root.to_string());
    etcd.pvc_deletion_policy = Some(pvc.clone());
    etcd
}

/// What every cell and table group takes from the cluster level, resolved once.
struct Inherited<'a> {
    images: &'a ResolvedImages,
    topo_ref: &'a GlobalTopoServerRef,
    /// Every cell's name, sorted.
    all_cells: &'a [CellName],
    pruning: &'a TopologyPruningConfig,
    log_levels: &'a ComponentLogLevels,
    observability: Option<&'a ObservabilityConfig>,
    gateway_tls: Option<GatewayTlsConfig>,
    cluster: &'a MultigresClusterSpec,
}

fn resolve_cell(
    cell: &CellConfig,
    template: Option<&CellTemplateSpec>,
    ctx: &Inherited,
) -> ResolvedCell {
    let mut gateway = template
        .and_then(|t| t.multigateway.clone())
        .unwrap_or_default();
    let mut placement = template.and_then(|t| t.multigateway_placement.clone());
    let mut local = template.and_then(|t| t.local_topo_server.clone());
    if let Some(o) = &cell.overrides {
        if let Some(g) = &o.multigateway {
            gateway.overlay(g);
        }
        replace(&mut placement, &o.multigateway_placement);
    }
    if let Some(inline) = &cell.spec {
        if let Some(g) = &inline.multigateway {
            gateway.overlay(g);
        }
        replace(&mut placement, &inline.multigateway_placement);
        replace(&mut local, &inline.local_topo_server);
    }
    gateway.stateless = stateless_with_defaults(
        gateway.stateless,
        defaults::MULTIGATEWAY_REPLICAS,
        defaults::multigateway_resources,
    );
    let mut buffer = gateway.buffer.take().unwrap_or_default();
    buffer.enabled.get_or_insert(true);
    buffer.min_time_between_failovers.get_or_insert_with(|| {
        GoDuration::new(defaults::GATEWAY_BUFFER_MIN_TIME_BETWEEN_FAILOVERS)
    });
    gateway.buffer = Some(buffer);

    let cell_root = defaults::cell_root(cell.name.as_str());
    let mut local_topo = None;
    let topo_server = local.map(|l| match (l.etcd, l.external) {
        (Some(etcd), _) => {
            let pvc = resolve_pvc_policy(&[etcd.pvc_deletion_policy.as_ref()]);
            let etcd = etcd_with_defaults(etcd, &cell_root, &pvc);
            local_topo = Some(TopoServerSpec {
                etcd: Some(etcd.clone()),
                pvc_deletion_policy: Some(pvc),
                placement: None,
            });
            LocalTopoServerSpec {
                etcd: Some(etcd),
                external: None,
            }
        }
        (None, external) => LocalTopoServerSpec {
            etcd: None,
            external: external.map(|mut e| {
                e.root_path.get_or_insert_with(|| cell_root.clone());
                e.implementation
                    .get_or_insert_with(|| defaults::TOPO_IMPLEMENTATION.to_string());
                e
            }),
        },
    });

    ResolvedCell {
        spec: CellSpec {
            name: cell.name.clone(),
            zone: cell.zone.clone(),
            zone_id: cell.zone_id.clone(),
            region: cell.region.clone(),
            metadata: cell.metadata.clone(),
            images: CellImages {
                image_pull_policy: Some(ctx.images.pull_policy),
                image_pull_secrets: ctx.images.pull_secrets.clone(),
                multigateway: ctx.images.multigateway.clone(),
            },
            multigateway: gateway,
            multigateway_placement: placement,
            global_topo_server: ctx.topo_ref.clone(),
            topo_server,
            all_cells: ctx.all_cells.to_vec(),
            topology_reconciliation: Some(TopologyReconciliation {
                register_cell: true,
                prune_poolers: ctx.pruning.enabled == Some(true),
            }),
            observability: ctx.observability.cloned(),
            log_levels: Some(ctx.log_levels.clone()),
            internal_tls: ctx.cluster.internal_tls.clone(),
            cert_common_name: ctx.cluster.cert_common_name.clone(),
            gateway_tls: ctx.gateway_tls.clone(),
        },
        local_topo,
    }
}

fn resolve_shard(
    shard: &ShardConfig,
    template: Option<&ShardTemplateSpec>,
    inherited_backup: &BackupConfig,
    tg_pvc: &PvcDeletionPolicy,
    all_cells: &[CellName],
) -> ShardResolvedSpec {
    let t = template.cloned().unwrap_or_default();
    let mut multiorch = t.multiorch.unwrap_or_default();
    let mut pools = t.pools;
    let mut initdb_args = t.initdb_args;
    let mut postgres_config_ref = t.postgres_config_ref;
    let mut postgres_config = t.postgres_config;
    let mut pvc = t.pvc_deletion_policy;
    if let Some(o) = &shard.overrides {
        if let Some(m) = &o.multiorch {
            multiorch.overlay(m);
        }
        merge_pools(&mut pools, &o.pools);
        replace(&mut initdb_args, &o.initdb_args);
        replace(&mut postgres_config_ref, &o.postgres_config_ref);
        merge_map(&mut postgres_config, &o.postgres_config);
    }
    if let Some(inline) = &shard.spec {
        if let Some(m) = &inline.multiorch {
            multiorch.overlay(m);
        }
        merge_pools(&mut pools, &inline.pools);
        replace(&mut initdb_args, &inline.initdb_args);
        replace(&mut postgres_config_ref, &inline.postgres_config_ref);
        merge_map(&mut postgres_config, &inline.postgres_config);
        overlay_opt(&mut pvc, &inline.pvc_deletion_policy);
    }
    let mut backup = inherited_backup.clone();
    if let Some(b) = &shard.backup {
        backup.overlay(b);
    }

    multiorch.stateless = stateless_with_defaults(
        multiorch.stateless,
        defaults::MULTIORCH_REPLICAS,
        defaults::multiorch_resources,
    );
    if multiorch.cells.is_empty() {
        multiorch.cells = all_cells.to_vec();
    }
    multiorch
        .leader_failover_grace_period_base
        .get_or_insert_with(|| GoDuration::new(defaults::MULTIORCH_FAILOVER_GRACE_BASE));
    multiorch
        .leader_failover_grace_period_max_jitter
        .get_or_insert_with(|| GoDuration::new(defaults::MULTIORCH_FAILOVER_GRACE_MAX_JITTER));
    if pools.is_empty() {
        pools.insert(PoolName::new(DEFAULT_POOL), Box::default());
    }
    let shard_pvc = resolve_pvc_policy(&[pvc.as_ref(), Some(tg_pvc)]);
    let pools = pools
        .into_iter()
        .map(|(name, pool)| {
            (
                name,
                Box::new(pool_with_defaults(*pool, all_cells, &shard_pvc)),
            )
        })
        .collect();
    ShardResolvedSpec {
        name: shard.name.as_str().to_string(),
        multiorch,
        initdb_args,
        postgres_config_ref,
        postgres_config,
        pools,
        pvc_deletion_policy: Some(shard_pvc),
        backup: Some(backup),
    }
}

fn pool_with_defaults(
    mut pool: PoolSpec,
    all_cells: &[CellName],
    shard_pvc: &PvcDeletionPolicy,
) -> PoolSpec {
    pool.type_.get_or_insert(PoolType::ReadWrite);
    if pool.cells.is_empty() {
        pool.cells = all_cells.to_vec();
    }
    pool.replicas_per_cell
        .get_or_insert(defaults::pool_replicas_per_cell(pool.cells.len()));
    pool.storage = Some(storage_with_defaults(pool.storage, defaults::POOL_STORAGE));
    let with_resources = |c: Option<ContainerConfig>, r: fn() -> _| {
        let mut c = c.unwrap_or_default();
        c.resources.get_or_insert_with(r);
        Some(c)
    };
    pool.postgres = with_resources(pool.postgres, defaults::postgres_resources);
    pool.multipooler = with_resources(pool.multipooler, defaults::multipooler_resources);
    pool.pvc_deletion_policy = Some(resolve_pvc_policy(&[
        pool.pvc_deletion_policy.as_ref(),
        Some(shard_pvc),
    ]));
    pool
}

/// The default backup: a filesystem repository on a 10Gi volume at `/backups`.
fn default_backup() -> BackupConfig {
    BackupConfig {
        type_: BackupType::Filesystem,
        filesystem: Some(FilesystemBackupConfig {
            path: Some(defaults::BACKUP_PATH.to_string()),
            storage: Some(StorageSpec {
                size: Some(defaults::BACKUP_STORAGE.to_string()),
                class: None,
                access_modes: vec![defaults::ACCESS_MODE.to_string()],
            }),
        }),
        s3: None,
        pgbackrest_tls: None,
        encryption: None,
        schedule: None,
        recovery: None,
    }
}

/// The databases a cluster runs: as written, or the single `postgres` database with its
/// `default` table group when none is written.
fn effective_databases(dbs: &[DatabaseConfig]) -> Vec<DatabaseConfig> {
    if !dbs.is_empty() {
        return dbs
            .iter()
            .map(|db| {
                let mut db = db.clone();
                if db.tablegroups.is_empty() {
                    db.tablegroups = vec![default_table_group()];
                }
                db
            })
            .collect();
    }
    vec![DatabaseConfig {
        name: crate::v1alpha1::DatabaseName::new(DEFAULT_DATABASE),
        default: true,
        tablegroups: vec![default_table_group()],
        backup: None,
        durability_policy: None,
    }]
}

fn default_table_group() -> TableGroupConfig {
    TableGroupConfig {
        name: crate::v1alpha1::TableGroupName::new(DEFAULT_TABLEGROUP),
        default: true,
        shards: Vec::new(),
        backup: None,
        pvc_deletion_policy: None,
    }
}

/// The shards of a table group: as written, or the single `0-inf` shard when none is written.
fn effective_shards(shards: &[ShardConfig]) -> Vec<ShardConfig> {
    if shards.is_empty() {
        vec![ShardConfig {
            name: crate::v1alpha1::ShardName::new(DEFAULT_SHARD),
            ..Default::default()
        }]
    } else {
        shards.to_vec()
    }
}

fn cell_topology_labels(cells: &[CellConfig]) -> crate::v1alpha1::CellTopologyLabels {
    cells
        .iter()
        .filter_map(|c| {
            let (label, value) =
                cell_node_label(c.zone.as_deref(), c.zone_id.as_deref(), c.region.as_deref())?;
            Some((
                c.name.clone(),
                BTreeMap::from([(label.to_string(), value.to_string())]),
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests;
