//! MultigresCluster validation on create and update.
//!
//! Three passes:
//! 1. the spec as written: template references exist, quantities and sizes parse, no limit below
//!    its request, supported durability policies, no operator-managed PostgreSQL parameter, valid
//!    external IPs, at least one cell; on update, cells stay (by name) and keep their zone/region;
//! 2. the spec resolved with its templates ([`multigres_api::resolver`]): buffer durations,
//!    pool and multiorch cells that exist, postgres/multipooler UIDs, plus warnings;
//! 3. on update, the old and new specs resolved with the same templates: etcd member counts stay,
//!    volumes never shrink (etcd, pools, backups), pools and pool cells stay, backup encryption
//!    stays. Resolving catches changes CEL cannot see: removing a whole block, or moving a value
//!    between inline spec, overrides and template.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use multigres_api::DEFAULT_TEMPLATE;
use multigres_api::resolver::{self, GlobalTopo, ResolvedCluster, defaults};
use multigres_api::v1alpha1::{
    BackupConfig, BackupType, CellConfig, CellTemplateSpec, CoreTemplateSpec, DatabaseConfig,
    EtcdSpec, ExternalServiceConfig, MultigresCluster, MultigresClusterSpec, PoolSpec, ShardConfig,
    ShardResolvedSpec, ShardTemplateSpec, TableGroupConfig, TemplateRef,
};

use super::{BufferSettings, TemplateKind, Templates};
use crate::violation::Findings;

/// Every template a validation of these clusters may need: explicit references,
/// `templateDefaults`, and each kind's namespace `default`.
pub fn needed_templates<'a>(
    clusters: impl IntoIterator<Item = &'a MultigresCluster>,
) -> BTreeSet<(TemplateKind, String)> {
    let mut names = BTreeSet::new();
    for cluster in clusters {
        let refs = resolver::referenced_templates(cluster);
        for (kind, list) in [
            (TemplateKind::Core, refs.core_templates),
            (TemplateKind::Cell, refs.cell_templates),
            (TemplateKind::Shard, refs.shard_templates),
        ] {
            names.extend(list.into_iter().map(|r| (kind, r.into_inner())));
        }
    }
    names
}

/// The namespace `default` templates of [`needed_templates`] that no cluster names in a field,
/// only falls back to. For these the webhook may take its template cache's word that one is
/// absent: the controller resolves the fallback again from its own watch, so a `default`
/// template created a moment before the cluster still applies; only this admission's checks of
/// the pair are skipped.
pub fn implicit_defaults<'a>(
    clusters: impl IntoIterator<Item = &'a MultigresCluster>,
) -> BTreeSet<(TemplateKind, String)> {
    let mut named = BTreeSet::new();
    for cluster in clusters {
        let refs = resolver::named_templates(cluster);
        for (kind, list) in [
            (TemplateKind::Core, refs.core_templates),
            (TemplateKind::Cell, refs.cell_templates),
            (TemplateKind::Shard, refs.shard_templates),
        ] {
            if list.iter().any(|r| r.as_str() == DEFAULT_TEMPLATE) {
                named.insert(kind);
            }
        }
    }
    [TemplateKind::Core, TemplateKind::Cell, TemplateKind::Shard]
        .into_iter()
        .filter(|kind| !named.contains(kind))
        .map(|kind| (kind, DEFAULT_TEMPLATE.to_owned()))
        .collect()
}

/// Validates a cluster being created (`old` is `None`) or updated.
///
/// On update, problems the stored cluster already had are not held against the edit (ratcheting,
/// as Kubernetes does for CRD schemas): a cluster admitted before a rule existed, or broken by a
/// template change, can still be edited, including to fix it.
pub fn validate(
    new: &MultigresCluster,
    old: Option<&MultigresCluster>,
    templates: &Templates,
) -> Findings {
    let mut findings = state_checks(new, templates);
    let Some(old) = old else {
        return findings;
    };
    let before = state_checks(old, templates);
    findings
        .violations
        .retain(|v| !before.violations.contains(v));
    written_transition(&mut findings, &old.spec, &new.spec);
    if let (Ok(old_resolved), Ok(new_resolved)) = (
        resolver::resolve(old, templates),
        resolver::resolve(new, templates),
    ) {
        let old_view = View::new(&old.spec, templates, &old_resolved);
        let new_view = View::new(&new.spec, templates, &new_resolved);
        transition(&mut findings, &old_view, &new_view);
    }
    findings
}

/// The checks of one cluster on its own, written and resolved.
fn state_checks(cluster: &MultigresCluster, templates: &Templates) -> Findings {
    let mut findings = Findings::default();
    let namespace = cluster.metadata.namespace.as_deref().unwrap_or_default();
    missing_templates(&mut findings, &cluster.spec, templates, namespace);
    written(&mut findings, &cluster.spec);
    // A cluster that does not resolve has a missing template or an unsupported durability
    // policy, both reported above.
    if let Ok(resolved) = resolver::resolve(cluster, templates) {
        resolved_checks(
            &mut findings,
            &View::new(&cluster.spec, templates, &resolved),
        );
    }
    findings
}

/// Effective-value checks of a template change on one cluster that uses it: the same update
/// rules as for a cluster edit, with the cluster fixed and the template changing.
pub fn template_change(
    cluster: &MultigresCluster,
    old_templates: &Templates,
    new_templates: &Templates,
) -> Findings {
    let mut findings = Findings::default();
    if let (Ok(old_resolved), Ok(new_resolved)) = (
        resolver::resolve(cluster, old_templates),
        resolver::resolve(cluster, new_templates),
    ) {
        let old_view = View::new(&cluster.spec, old_templates, &old_resolved);
        let new_view = View::new(&cluster.spec, new_templates, &new_resolved);
        transition(&mut findings, &old_view, &new_view);
        // Only problems the change introduces: a cluster that was already invalid with the
        // stored template does not block fixing the template.
        let mut before = Findings::default();
        resolved_checks(&mut before, &old_view);
        let mut after = Findings::default();
        resolved_checks(&mut after, &new_view);
        findings.violations.extend(
            after
                .violations
                .into_iter()
                .filter(|v| !before.violations.contains(v)),
        );
    }
    findings
}

fn missing_templates(
    findings: &mut Findings,
    spec: &MultigresClusterSpec,
    templates: &Templates,
    namespace: &str,
) {
    let mut check = |kind: TemplateKind, reference: Option<&TemplateRef>, field: String| {
        let Some(name) = reference else { return };
        let exists = match kind {
            TemplateKind::Core => templates.core.contains_key(name.as_str()),
            TemplateKind::Cell => templates.cell.contains_key(name.as_str()),
            TemplateKind::Shard => templates.shard.contains_key(name.as_str()),
        };
        if !exists {
            findings.violation(
                field,
                format!(
                    "{kind} {:?} does not exist in namespace {namespace:?}; create it first or \
                     change the reference",
                    name.as_str()
                ),
            );
        }
    };
    if let Some(defaults) = &spec.template_defaults {
        let base = "spec.templateDefaults";
        check(
            TemplateKind::Core,
            defaults.core_template.as_ref(),
            format!("{base}.coreTemplate"),
        );
        check(
            TemplateKind::Cell,
            defaults.cell_template.as_ref(),
            format!("{base}.cellTemplate"),
        );
        check(
            TemplateKind::Shard,
            defaults.shard_template.as_ref(),
            format!("{base}.shardTemplate"),
        );
    }
    if let Some(g) = &spec.global_topo_server {
        check(
            TemplateKind::Core,
            g.template_ref.as_ref(),
            "spec.globalTopoServer.templateRef".into(),
        );
    }
    if let Some(m) = &spec.multiadmin {
        check(
            TemplateKind::Core,
            m.template_ref.as_ref(),
            "spec.multiadmin.templateRef".into(),
        );
    }
    if let Some(m) = &spec.multiadmin_web {
        check(
            TemplateKind::Core,
            m.template_ref.as_ref(),
            "spec.multiadminWeb.templateRef".into(),
        );
    }
    for (i, cell) in spec.cells.iter().enumerate() {
        check(
            TemplateKind::Cell,
            cell.cell_template.as_ref(),
            format!("spec.cells[{i}].cellTemplate"),
        );
    }
    for (path, shard) in written_shards(spec) {
        check(
            TemplateKind::Shard,
            shard.shard_template.as_ref(),
            format!("{path}.shardTemplate"),
        );
    }
}

/// Every shard entry written in the spec, with its path.
fn written_shards(spec: &MultigresClusterSpec) -> Vec<(String, &ShardConfig)> {
    let mut shards = Vec::new();
    for (d, db) in spec.databases.iter().enumerate() {
        for (t, tg) in db.tablegroups.iter().enumerate() {
            for (s, shard) in tg.shards.iter().enumerate() {
                shards.push((
                    format!("spec.databases[{d}].tablegroups[{t}].shards[{s}]"),
                    shard,
                ));
            }
        }
    }
    shards
}

fn written(findings: &mut Findings, spec: &MultigresClusterSpec) {
    if let Some(g) = &spec.global_topo_server {
        if let Some(etcd) = &g.etcd {
            etcd_block(findings, "spec.globalTopoServer.etcd", etcd);
        }
        super::pvc_policy_warning(
            findings,
            "spec.globalTopoServer.pvcDeletionPolicy",
            g.pvc_deletion_policy.as_ref(),
        );
    }
    if let Some(m) = &spec.multiadmin {
        let resources = m.spec.as_ref().and_then(|s| s.resources.as_ref());
        super::resources(findings, "spec.multiadmin.spec.resources", resources);
    }
    if let Some(m) = &spec.multiadmin_web {
        let resources = m.spec.as_ref().and_then(|s| s.resources.as_ref());
        super::resources(findings, "spec.multiadminWeb.spec.resources", resources);
    }
    if spec.cells.is_empty() {
        findings.violation(
            "spec.cells",
            "at least one cell is required: gateways and the shards' pools run in cells",
        );
    }
    for (i, cell) in spec.cells.iter().enumerate() {
        let path = format!("spec.cells[{i}]");
        if let Some(inline) = &cell.spec {
            let gateway = inline.multigateway.as_ref();
            super::resources(
                findings,
                &format!("{path}.spec.multigateway.resources"),
                gateway.and_then(|g| g.stateless.resources.as_ref()),
            );
            if let Some(etcd) = inline
                .local_topo_server
                .as_ref()
                .and_then(|l| l.etcd.as_ref())
            {
                etcd_block(findings, &format!("{path}.spec.localTopoServer.etcd"), etcd);
            }
        }
        if let Some(overrides) = &cell.overrides {
            super::resources(
                findings,
                &format!("{path}.overrides.multigateway.resources"),
                overrides
                    .multigateway
                    .as_ref()
                    .and_then(|g| g.stateless.resources.as_ref()),
            );
        }
    }
    durability(
        findings,
        "spec.durabilityPolicy",
        spec.durability_policy.as_deref(),
    );
    backup_block(findings, "spec.backup", spec.backup.as_ref());
    super::pvc_policy_warning(
        findings,
        "spec.pvcDeletionPolicy",
        spec.pvc_deletion_policy.as_ref(),
    );
    for (d, db) in spec.databases.iter().enumerate() {
        let db_path = format!("spec.databases[{d}]");
        durability(
            findings,
            &format!("{db_path}.durabilityPolicy"),
            db.durability_policy.as_deref(),
        );
        backup_block(findings, &format!("{db_path}.backup"), db.backup.as_ref());
        for (t, tg) in db.tablegroups.iter().enumerate() {
            let tg_path = format!("{db_path}.tablegroups[{t}]");
            backup_block(findings, &format!("{tg_path}.backup"), tg.backup.as_ref());
            super::pvc_policy_warning(
                findings,
                &format!("{tg_path}.pvcDeletionPolicy"),
                tg.pvc_deletion_policy.as_ref(),
            );
        }
    }
    for (path, shard) in written_shards(spec) {
        backup_block(findings, &format!("{path}.backup"), shard.backup.as_ref());
        if let Some(inline) = &shard.spec {
            let base = format!("{path}.spec");
            super::resources(
                findings,
                &format!("{base}.multiorch.resources"),
                inline
                    .multiorch
                    .as_ref()
                    .and_then(|m| m.stateless.resources.as_ref()),
            );
            pools_block(findings, &base, &inline.pools);
            super::postgres::postgres_config(
                findings,
                &format!("{base}.postgresConfig"),
                &inline.postgres_config,
            );
            super::pvc_policy_warning(
                findings,
                &format!("{base}.pvcDeletionPolicy"),
                inline.pvc_deletion_policy.as_ref(),
            );
        }
        if let Some(overrides) = &shard.overrides {
            let base = format!("{path}.overrides");
            super::resources(
                findings,
                &format!("{base}.multiorch.resources"),
                overrides
                    .multiorch
                    .as_ref()
                    .and_then(|m| m.stateless.resources.as_ref()),
            );
            pools_block(findings, &base, &overrides.pools);
            super::postgres::postgres_config(
                findings,
                &format!("{base}.postgresConfig"),
                &overrides.postgres_config,
            );
        }
    }
    external_service(
        findings,
        "spec.externalGateway",
        spec.external_gateway.as_ref(),
    );
    external_service(
        findings,
        "spec.externalAdminWeb",
        spec.external_admin_web.as_ref(),
    );
}

/// Checks of a written etcd block, shared by the cluster and the templates.
pub(super) fn etcd_block(findings: &mut Findings, path: &str, etcd: &EtcdSpec) {
    super::resources(
        findings,
        &format!("{path}.resources"),
        etcd.resources.as_ref(),
    );
    super::storage_size(
        findings,
        &format!("{path}.storage.size"),
        etcd.storage.as_ref().and_then(|s| s.size.as_deref()),
    );
    super::pvc_policy_warning(
        findings,
        &format!("{path}.pvcDeletionPolicy"),
        etcd.pvc_deletion_policy.as_ref(),
    );
}

/// Checks of written pools (inline spec, overrides or a ShardTemplate), under `base`.
pub(super) fn pools_block(
    findings: &mut Findings,
    base: &str,
    pools: &BTreeMap<multigres_api::v1alpha1::PoolName, PoolSpec>,
) {
    for (name, pool) in pools {
        let path = format!("{base}.pools[{name}]");
        super::storage_size(
            findings,
            &format!("{path}.storage.size"),
            pool.storage.as_ref().and_then(|s| s.size.as_deref()),
        );
        for (container, config) in [
            ("postgres", &pool.postgres),
            ("multipooler", &pool.multipooler),
        ] {
            super::resources(
                findings,
                &format!("{path}.{container}.resources"),
                config.as_ref().and_then(|c| c.resources.as_ref()),
            );
        }
        super::pvc_policy_warning(
            findings,
            &format!("{path}.pvcDeletionPolicy"),
            pool.pvc_deletion_policy.as_ref(),
        );
    }
}

fn backup_block(findings: &mut Findings, path: &str, backup: Option<&BackupConfig>) {
    let size = backup
        .and_then(|b| b.filesystem.as_ref())
        .and_then(|f| f.storage.as_ref())
        .and_then(|s| s.size.as_deref());
    super::storage_size(findings, &format!("{path}.filesystem.storage.size"), size);
}

fn durability(findings: &mut Findings, path: &str, policy: Option<&str>) {
    if let Some(policy) = policy
        && !defaults::DURABILITY_POLICIES.contains(&policy)
    {
        findings.violation(
            path,
            format!(
                "durability policy {policy:?} is not supported; use one of {}",
                defaults::DURABILITY_POLICIES.join(", ")
            ),
        );
    }
}

fn external_service(findings: &mut Findings, path: &str, service: Option<&ExternalServiceConfig>) {
    let Some(service) = service else { return };
    for (i, ip) in service.external_ips.iter().enumerate() {
        if ip.as_str().parse::<IpAddr>().is_err() {
            findings.violation(
                format!("{path}.externalIPs[{i}]"),
                format!("{:?} is not an IPv4 or IPv6 address", ip.as_str()),
            );
        }
    }
    if service.enabled && service.external_ips.is_empty() {
        findings.warning(
            path,
            "is enabled without externalIPs: the LoadBalancer Service gets an address only if \
             a load-balancer controller runs in the cluster",
        );
    }
}

fn written_transition(
    findings: &mut Findings,
    old: &MultigresClusterSpec,
    new: &MultigresClusterSpec,
) {
    let new_cells: BTreeMap<&str, (usize, &CellConfig)> = new
        .cells
        .iter()
        .enumerate()
        .map(|(i, c)| (c.name.as_str(), (i, c)))
        .collect();
    for old_cell in &old.cells {
        let name = old_cell.name.as_str();
        let Some((i, new_cell)) = new_cells.get(name) else {
            findings.violation(
                "spec.cells",
                format!(
                    "cell {name:?} cannot be removed or renamed: cells are append-only, since \
                     their topology records and data outlive them; keep it in the list"
                ),
            );
            continue;
        };
        let placements = [
            (
                "zoneId",
                old_cell.zone_id.as_deref(),
                new_cell.zone_id.as_deref(),
            ),
            (
                "region",
                old_cell.region.as_deref(),
                new_cell.region.as_deref(),
            ),
        ];
        for (field, before, after) in placements {
            if before != after {
                findings.violation(
                    format!("spec.cells[{i}].{field}"),
                    format!(
                        "{field} of cell {name:?} cannot change after creation (was {}, now {}): \
                         its pods and volumes are pinned there; add a new cell instead",
                        shown(before),
                        shown(after)
                    ),
                );
            }
        }
    }
}

fn shown(value: Option<&str>) -> String {
    value.map_or_else(|| "unset".to_owned(), |v| format!("{v:?}"))
}

/// Picks a component's template as the resolver does: explicit, else `templateDefaults`, else
/// the namespace `default` if it exists.
fn pick<'a, T>(
    map: &'a BTreeMap<String, T>,
    explicit: Option<&TemplateRef>,
    cluster_default: Option<&TemplateRef>,
) -> Option<(&'a str, &'a T)> {
    let name = explicit
        .or(cluster_default)
        .map_or(DEFAULT_TEMPLATE, |r| r.as_str());
    map.get_key_value(name).map(|(k, v)| (k.as_str(), v))
}

/// A cluster's spec with its resolution, and where each resolved value was written.
struct View<'a> {
    spec: &'a MultigresClusterSpec,
    resolved: &'a ResolvedCluster,
    core: Option<(&'a str, &'a CoreTemplateSpec)>,
    cells: Vec<CellSite<'a>>,
    shards: Vec<ShardSite<'a>>,
}

struct CellSite<'a> {
    path: String,
    config: &'a CellConfig,
    template: Option<(&'a str, &'a CellTemplateSpec)>,
}

/// One shard: where it is written (if at all) and what it resolved to.
struct ShardSite<'a> {
    /// `database/tablegroup/shard`.
    key: String,
    /// Path of the shard entry; `None` for the implicit default shard.
    path: Option<String>,
    config: Option<&'a ShardConfig>,
    tablegroup: Option<(String, &'a TableGroupConfig)>,
    database: Option<(String, &'a DatabaseConfig)>,
    template: Option<(&'a str, &'a ShardTemplateSpec)>,
    resolved: &'a ShardResolvedSpec,
    durability: &'a str,
}

impl<'a> View<'a> {
    fn new(
        spec: &'a MultigresClusterSpec,
        templates: &'a Templates,
        resolved: &'a ResolvedCluster,
    ) -> Self {
        let td = spec.template_defaults.as_ref();
        let core = pick(
            &templates.core,
            spec.global_topo_server
                .as_ref()
                .and_then(|g| g.template_ref.as_ref()),
            td.and_then(|t| t.core_template.as_ref()),
        );
        let cells = spec
            .cells
            .iter()
            .enumerate()
            .map(|(i, config)| CellSite {
                path: format!("spec.cells[{i}]"),
                config,
                template: pick(
                    &templates.cell,
                    config.cell_template.as_ref(),
                    td.and_then(|t| t.cell_template.as_ref()),
                ),
            })
            .collect();
        let mut shards = Vec::new();
        for tg in &resolved.table_groups {
            let db_name = tg.database_name.as_str();
            let tg_name = tg.table_group_name.as_str();
            let database = spec
                .databases
                .iter()
                .enumerate()
                .find(|(_, db)| db.name.as_str() == db_name)
                .map(|(d, db)| (format!("spec.databases[{d}]"), db));
            let tablegroup = database.as_ref().and_then(|(db_path, db)| {
                db.tablegroups
                    .iter()
                    .enumerate()
                    .find(|(_, t)| t.name.as_str() == tg_name)
                    .map(|(t, tg)| (format!("{db_path}.tablegroups[{t}]"), tg))
            });
            for resolved_shard in &tg.shards {
                let written = tablegroup.as_ref().and_then(|(tg_path, tg)| {
                    tg.shards
                        .iter()
                        .enumerate()
                        .find(|(_, s)| s.name.as_str() == resolved_shard.name)
                        .map(|(s, shard)| (format!("{tg_path}.shards[{s}]"), shard))
                });
                let config = written.as_ref().map(|(_, c)| *c);
                shards.push(ShardSite {
                    key: format!("{db_name}/{tg_name}/{}", resolved_shard.name),
                    path: written.as_ref().map(|(p, _)| p.clone()),
                    config,
                    tablegroup: tablegroup.clone(),
                    database: database.clone(),
                    template: pick(
                        &templates.shard,
                        config.and_then(|c| c.shard_template.as_ref()),
                        td.and_then(|t| t.shard_template.as_ref()),
                    ),
                    resolved: resolved_shard,
                    durability: tg
                        .durability_policy
                        .as_deref()
                        .unwrap_or(defaults::DURABILITY_POLICY),
                });
            }
        }
        Self {
            spec,
            resolved,
            core,
            cells,
            shards,
        }
    }

    fn cell_names(&self) -> BTreeSet<&str> {
        self.spec.cells.iter().map(|c| c.name.as_str()).collect()
    }

    /// Where a field of the global etcd comes from.
    fn global_etcd_field(&self, field: &str, set: impl Fn(&EtcdSpec) -> bool) -> String {
        let inline = self
            .spec
            .global_topo_server
            .as_ref()
            .and_then(|g| g.etcd.as_ref());
        if inline.is_some_and(&set) {
            return format!("spec.globalTopoServer.etcd.{field}");
        }
        if let Some((name, template)) = self.core
            && template
                .global_topo_server
                .as_ref()
                .and_then(|g| g.etcd.as_ref())
                .is_some_and(&set)
        {
            return format!("CoreTemplate {name:?} spec.globalTopoServer.etcd.{field}");
        }
        format!("spec.globalTopoServer.etcd.{field} (default)")
    }
}

impl CellSite<'_> {
    /// Where a field of the cell's local etcd comes from.
    fn local_etcd_field(&self, field: &str, set: impl Fn(&EtcdSpec) -> bool) -> String {
        let inline = self
            .config
            .spec
            .as_ref()
            .and_then(|s| s.local_topo_server.as_ref());
        match inline {
            Some(local) if local.etcd.as_ref().is_some_and(&set) => {
                format!("{}.spec.localTopoServer.etcd.{field}", self.path)
            }
            None => match self.template {
                Some((name, template))
                    if template
                        .local_topo_server
                        .as_ref()
                        .and_then(|l| l.etcd.as_ref())
                        .is_some_and(&set) =>
                {
                    format!("CellTemplate {name:?} spec.localTopoServer.etcd.{field}")
                }
                _ => format!("{}.spec.localTopoServer.etcd.{field} (default)", self.path),
            },
            Some(_) => format!("{}.spec.localTopoServer.etcd.{field} (default)", self.path),
        }
    }

    /// The cell's buffer settings, laid template → overrides → inline as the resolver does.
    fn buffer(&self) -> BufferSettings {
        let mut settings = BufferSettings::default();
        if let Some((name, template)) = self.template {
            settings.overlay(BufferSettings::written(
                &format!("CellTemplate {name:?} spec.multigateway.buffer"),
                template
                    .multigateway
                    .as_ref()
                    .and_then(|g| g.buffer.as_ref()),
            ));
        }
        if let Some(overrides) = &self.config.overrides {
            settings.overlay(BufferSettings::written(
                &format!("{}.overrides.multigateway.buffer", self.path),
                overrides
                    .multigateway
                    .as_ref()
                    .and_then(|g| g.buffer.as_ref()),
            ));
        }
        if let Some(inline) = &self.config.spec {
            settings.overlay(BufferSettings::written(
                &format!("{}.spec.multigateway.buffer", self.path),
                inline.multigateway.as_ref().and_then(|g| g.buffer.as_ref()),
            ));
        }
        settings
    }
}

impl ShardSite<'_> {
    fn describe(&self) -> String {
        self.path
            .clone()
            .unwrap_or_else(|| format!("shard {} (implicit)", self.key))
    }

    /// Where a field of a pool comes from: inline spec, overrides, template, or a default.
    fn pool_field(&self, pool: &str, field: &str, set: impl Fn(&PoolSpec) -> bool) -> String {
        if let (Some(path), Some(config)) = (&self.path, self.config) {
            if config
                .spec
                .as_ref()
                .and_then(|s| s.pools.get(pool))
                .is_some_and(&set)
            {
                return format!("{path}.spec.pools[{pool}].{field}");
            }
            if config
                .overrides
                .as_ref()
                .and_then(|o| o.pools.get(pool))
                .is_some_and(&set)
            {
                return format!("{path}.overrides.pools[{pool}].{field}");
            }
        }
        if let Some((name, template)) = self.template
            && template.pools.get(pool).is_some_and(&set)
        {
            return format!("ShardTemplate {name:?} spec.pools[{pool}].{field}");
        }
        format!("{} pool {pool:?} {field} (default)", self.describe())
    }

    /// Where a field of the shard's resolved backup comes from: the most specific level that
    /// sets it.
    fn backup_field(
        &self,
        spec: &MultigresClusterSpec,
        field: &str,
        set: impl Fn(&BackupConfig) -> bool,
    ) -> String {
        let levels = [
            self.path
                .as_ref()
                .zip(self.config.and_then(|c| c.backup.as_ref())),
            self.tablegroup
                .as_ref()
                .and_then(|(p, tg)| tg.backup.as_ref().map(|b| (p, b))),
            self.database
                .as_ref()
                .and_then(|(p, db)| db.backup.as_ref().map(|b| (p, b))),
        ];
        for (path, backup) in levels.into_iter().flatten() {
            if set(backup) {
                return format!("{path}.backup.{field}");
            }
        }
        match &spec.backup {
            Some(backup) if set(backup) => format!("spec.backup.{field}"),
            _ => format!("spec.backup.{field} (default)"),
        }
    }
}

fn resolved_checks(findings: &mut Findings, view: &View<'_>) {
    if let GlobalTopo::Managed(topo) = &view.resolved.global_topo
        && topo.etcd.as_ref().and_then(|e| e.replicas) == Some(1)
    {
        findings.warning(
            view.global_etcd_field("replicas", |e| e.replicas.is_some()),
            "the global etcd has 1 member, so no fault tolerance: losing it stops the whole \
             cluster's topology; 3 members are recommended (this cannot change later)",
        );
    }
    for (site, cell) in view.cells.iter().zip(&view.resolved.cells) {
        super::buffer(findings, &site.buffer(), true);
        if cell
            .local_topo
            .as_ref()
            .and_then(|t| t.etcd.as_ref())
            .and_then(|e| e.replicas)
            == Some(1)
        {
            findings.warning(
                site.local_etcd_field("replicas", |e| e.replicas.is_some()),
                format!(
                    "the local etcd of cell {:?} has 1 member, so no fault tolerance; 3 members \
                     are recommended (this cannot change later)",
                    site.config.name.as_str()
                ),
            );
        }
    }
    let cells = view.cell_names();
    for shard in &view.shards {
        unknown_cells(
            findings,
            &cells,
            &shard.resolved.multiorch.cells,
            || multiorch_cells_field(shard),
            "multiorch",
        );
        for (name, pool) in &shard.resolved.pools {
            let pool_name = name.as_str();
            unknown_cells(
                findings,
                &cells,
                &pool.cells,
                || shard.pool_field(pool_name, "cells", |p| !p.cells.is_empty()),
                &format!("pool {pool_name:?}"),
            );
            let uid = |container: &str, get: fn(&PoolSpec) -> Option<i64>| {
                get(pool).map(|uid| {
                    (
                        shard.pool_field(pool_name, &format!("{container}.runAsUser"), |p| {
                            get(p).is_some()
                        }),
                        uid,
                    )
                })
            };
            super::run_as_user(
                findings,
                uid("postgres", |p| {
                    p.postgres.as_ref().and_then(|c| c.run_as_user)
                }),
                uid("multipooler", |p| {
                    p.multipooler.as_ref().and_then(|c| c.run_as_user)
                }),
            );
            durability_warning(findings, shard, pool_name, pool);
        }
        override_pools_warning(findings, shard);
    }
}

fn multiorch_cells_field(shard: &ShardSite<'_>) -> String {
    let written = |get: &dyn Fn(&ShardConfig) -> bool| shard.config.is_some_and(get);
    let path = shard.describe();
    if written(&|c| {
        c.spec
            .as_ref()
            .and_then(|s| s.multiorch.as_ref())
            .is_some_and(|m| !m.cells.is_empty())
    }) {
        format!("{path}.spec.multiorch.cells")
    } else if written(&|c| {
        c.overrides
            .as_ref()
            .and_then(|o| o.multiorch.as_ref())
            .is_some_and(|m| !m.cells.is_empty())
    }) {
        format!("{path}.overrides.multiorch.cells")
    } else if let Some((name, _)) = shard.template {
        format!("ShardTemplate {name:?} spec.multiorch.cells")
    } else {
        format!("{path}.multiorch.cells")
    }
}

fn unknown_cells(
    findings: &mut Findings,
    cluster_cells: &BTreeSet<&str>,
    used: &[multigres_api::v1alpha1::CellName],
    field: impl Fn() -> String,
    what: &str,
) {
    let unknown: Vec<&str> = used
        .iter()
        .map(|c| c.as_str())
        .filter(|c| !cluster_cells.contains(c))
        .collect();
    if !unknown.is_empty() {
        findings.violation(
            field(),
            format!(
                "{what} is assigned to cells {unknown:?} that are not in spec.cells; use cells \
                 of this cluster ({:?})",
                cluster_cells
            ),
        );
    }
}

fn durability_warning(
    findings: &mut Findings,
    shard: &ShardSite<'_>,
    pool_name: &str,
    pool: &PoolSpec,
) {
    let cells = pool.cells.len();
    let per_cell = pool.replicas_per_cell.unwrap_or(1);
    let total = usize::try_from(per_cell).unwrap_or(0) * cells;
    let field = || {
        shard.pool_field(pool_name, "replicasPerCell", |p| {
            p.replicas_per_cell.is_some()
        })
    };
    match shard.durability {
        "MULTI_CELL_AT_LEAST_2" if cells < 2 => findings.warning(
            field(),
            format!(
                "pool {pool_name:?} of shard {} runs in {cells} cell(s) but durability policy \
                 MULTI_CELL_AT_LEAST_2 needs acknowledgements from 2 cells: writes will block",
                shard.key
            ),
        ),
        "AT_LEAST_2" if total < 2 => findings.warning(
            field(),
            format!(
                "pool {pool_name:?} of shard {} has {per_cell} replica(s) per cell in {cells} \
                 cell(s) ({total} in total) but durability policy AT_LEAST_2 needs 2: no primary \
                 can be elected",
                shard.key
            ),
        ),
        _ => {}
    }
}

fn override_pools_warning(findings: &mut Findings, shard: &ShardSite<'_>) {
    let (Some(path), Some(config), Some((template_name, template))) =
        (&shard.path, shard.config, shard.template)
    else {
        return;
    };
    for name in config.overrides.iter().flat_map(|o| o.pools.keys()) {
        if !template.pools.contains_key(name) {
            findings.warning(
                format!("{path}.overrides.pools[{name}]"),
                format!(
                    "pool {:?} does not exist in ShardTemplate {template_name:?}: a new pool \
                     will be created",
                    name.as_str()
                ),
            );
        }
    }
}

fn transition(findings: &mut Findings, old: &View<'_>, new: &View<'_>) {
    if let (GlobalTopo::Managed(old_topo), GlobalTopo::Managed(new_topo)) =
        (&old.resolved.global_topo, &new.resolved.global_topo)
        && let (Some(old_etcd), Some(new_etcd)) = (&old_topo.etcd, &new_topo.etcd)
    {
        etcd_transition(
            findings,
            old_etcd,
            new_etcd,
            "the global etcd",
            |field, set| new.global_etcd_field(field, set),
        );
    }
    for (site, cell) in new.cells.iter().zip(&new.resolved.cells) {
        let Some(old_cell) = old
            .resolved
            .cells
            .iter()
            .find(|c| c.spec.name == cell.spec.name)
        else {
            continue;
        };
        let etcd = |t: &Option<multigres_api::v1alpha1::TopoServerSpec>| {
            t.as_ref().and_then(|t| t.etcd.clone())
        };
        if let (Some(old_etcd), Some(new_etcd)) =
            (etcd(&old_cell.local_topo), etcd(&cell.local_topo))
        {
            etcd_transition(
                findings,
                &old_etcd,
                &new_etcd,
                &format!("the local etcd of cell {:?}", cell.spec.name.as_str()),
                |field, set| site.local_etcd_field(field, set),
            );
        }
    }
    for shard in &new.shards {
        let Some(old_shard) = old.shards.iter().find(|s| s.key == shard.key) else {
            continue;
        };
        shard_transition(findings, new.spec, old_shard, shard);
    }
}

fn etcd_transition(
    findings: &mut Findings,
    old: &EtcdSpec,
    new: &EtcdSpec,
    what: &str,
    field: impl Fn(&str, &dyn Fn(&EtcdSpec) -> bool) -> String,
) {
    if let (Some(before), Some(after)) = (old.replicas, new.replicas)
        && before != after
    {
        findings.violation(
            field("replicas", &|e| e.replicas.is_some()),
            format!(
                "{what} cannot change its member count after creation ({before} → {after}): etcd \
                 is bootstrapped with a static member list; keep {before}"
            ),
        );
    }
    if let (Some(before), Some(after)) = (storage_size(old), storage_size(new)) {
        super::no_shrink(
            findings,
            &field("storage.size", &|e| storage_size(e).is_some()),
            &format!("the volume of {what}"),
            before,
            after,
        );
    }
}

fn storage_size(etcd: &EtcdSpec) -> Option<&str> {
    etcd.storage.as_ref().and_then(|s| s.size.as_deref())
}

fn pool_size(pool: &PoolSpec) -> Option<&str> {
    pool.storage.as_ref().and_then(|s| s.size.as_deref())
}

fn shard_transition(
    findings: &mut Findings,
    spec: &MultigresClusterSpec,
    old: &ShardSite<'_>,
    new: &ShardSite<'_>,
) {
    let cluster_cells: BTreeSet<&str> = spec.cells.iter().map(|c| c.name.as_str()).collect();
    for (name, old_pool) in &old.resolved.pools {
        let pool = name.as_str();
        let Some(new_pool) = new.resolved.pools.get(name) else {
            findings.violation(
                format!("{} pools", new.describe()),
                format!(
                    "pool {pool:?} of shard {} cannot be removed or renamed: pools are \
                     append-only, since their volumes and topology entries outlive them; keep \
                     it (inline, in overrides or in the template)",
                    new.key
                ),
            );
            continue;
        };
        if let (Some(before), Some(after)) = (pool_size(old_pool), pool_size(new_pool)) {
            super::no_shrink(
                findings,
                &new.pool_field(pool, "storage.size", |p| pool_size(p).is_some()),
                &format!("the data volume of pool {pool:?}"),
                before,
                after,
            );
        }
        // Cells gone from the cluster are reported once, as removed cells.
        let removed: Vec<&str> = old_pool
            .cells
            .iter()
            .filter(|c| !new_pool.cells.contains(c) && cluster_cells.contains(c.as_str()))
            .map(|c| c.as_str())
            .collect();
        if !removed.is_empty() {
            findings.violation(
                new.pool_field(pool, "cells", |p| !p.cells.is_empty()),
                format!(
                    "cells {removed:?} cannot be removed from pool {pool:?}: pool cells are \
                     append-only, since their volumes outlive them"
                ),
            );
        }
    }
    let (Some(old_backup), Some(new_backup)) = (&old.resolved.backup, &new.resolved.backup) else {
        return;
    };
    let backup_size = |b: &BackupConfig| {
        (b.type_ == BackupType::Filesystem)
            .then(|| b.filesystem.as_ref()?.storage.as_ref()?.size.clone())
            .flatten()
    };
    if let (Some(before), Some(after)) = (backup_size(old_backup), backup_size(new_backup)) {
        super::no_shrink(
            findings,
            &new.backup_field(spec, "filesystem.storage.size", |b| {
                backup_size(b).is_some()
            }),
            &format!("the backup volume of shard {}", new.key),
            &before,
            &after,
        );
    }
    if old_backup.encryption != new_backup.encryption {
        let secret = |b: &BackupConfig| {
            b.encryption.as_ref().map_or_else(
                || "none".to_owned(),
                |e| format!("Secret {:?}", e.secret_name),
            )
        };
        findings.violation(
            new.backup_field(spec, "encryption", |b| b.encryption.is_some()),
            format!(
                "backup encryption of shard {} cannot be added, removed or changed after creation \
                 (was {}, now {}): existing backups would become unreadable",
                new.key,
                secret(old_backup),
                secret(new_backup)
            ),
        );
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A cluster `demo` in namespace `db` with the given spec (YAML).
    pub(crate) fn cluster(spec: &str) -> MultigresCluster {
        let spec: serde_yaml::Value = serde_yaml::from_str(spec).unwrap();
        serde_json::from_value(serde_json::json!({
            "apiVersion": "multigres.com/v1alpha1",
            "kind": "MultigresCluster",
            "metadata": {"name": "demo", "namespace": "db"},
            "spec": spec,
        }))
        .unwrap()
    }

    /// Templates from YAML: `{core: {name: spec}, cell: {...}, shard: {...}}`.
    pub(crate) fn templates(yaml: &str) -> Templates {
        #[derive(serde::Deserialize, Default)]
        #[serde(default)]
        struct Raw {
            core: BTreeMap<String, CoreTemplateSpec>,
            cell: BTreeMap<String, CellTemplateSpec>,
            shard: BTreeMap<String, ShardTemplateSpec>,
        }
        let raw: Raw = serde_yaml::from_str(yaml).unwrap();
        Templates {
            core: raw.core,
            cell: raw.cell,
            shard: raw.shard,
        }
    }

    fn fields(findings: &Findings) -> Vec<&str> {
        findings
            .violations
            .iter()
            .map(|v| v.field.as_str())
            .collect()
    }

    const BASE: &str = "
postgresPasswordSecretRef: {name: pw, key: password}
cells: [{name: zone-a, zoneId: z-a}, {name: zone-b, zoneId: z-b}]
";

    fn with(extra: &str) -> String {
        format!("{BASE}{extra}")
    }

    #[test]
    fn a_default_template_named_in_a_field_is_not_an_implicit_fallback() {
        let plain = cluster(BASE);
        let default = |kind| (kind, DEFAULT_TEMPLATE.to_owned());
        assert_eq!(
            implicit_defaults([&plain]),
            BTreeSet::from([
                default(TemplateKind::Core),
                default(TemplateKind::Cell),
                default(TemplateKind::Shard)
            ])
        );
        let named = cluster(
            "
postgresPasswordSecretRef: {name: pw, key: password}
cells: [{name: zone-a, zoneId: z-a, cellTemplate: default}]
templateDefaults: {shardTemplate: default}
",
        );
        assert_eq!(
            implicit_defaults([&plain, &named]),
            BTreeSet::from([default(TemplateKind::Core)])
        );
    }

    #[test]
    fn a_minimal_cluster_is_valid() {
        let findings = validate(&cluster(BASE), None, &Templates::default());
        assert_eq!(findings, Findings::default());
    }

    #[test]
    fn every_missing_template_reference_is_named() {
        let new = cluster(&with(
            "
templateDefaults: {cellTemplate: nope, shardTemplate: std}
multiadmin: {templateRef: core-x}
databases:
- name: postgres
  default: true
  tablegroups:
  - name: default
    default: true
    shards: [{name: 0-inf, shardTemplate: gone}]
",
        ));
        let findings = validate(&new, None, &templates("shard: {std: {}}"));
        assert_eq!(
            fields(&findings),
            [
                "spec.templateDefaults.cellTemplate",
                "spec.multiadmin.templateRef",
                "spec.databases[0].tablegroups[0].shards[0].shardTemplate"
            ]
        );
        assert_eq!(
            findings.violations[0].message,
            "CellTemplate \"nope\" does not exist in namespace \"db\"; create it first or change \
             the reference"
        );
    }

    #[test]
    fn written_values_are_checked_everywhere_they_appear() {
        let new = cluster(&with(
            "
durabilityPolicy: ALL_OF_THEM
globalTopoServer:
  etcd:
    storage: {size: 10GB}
    resources: {requests: {memory: 1Gi}, limits: {memory: 512Mi}}
externalGateway: {enabled: true, externalIPs: [10.0.0.300]}
databases:
- name: postgres
  default: true
  durabilityPolicy: MOSTLY
  tablegroups:
  - name: default
    default: true
    shards:
    - name: 0-inf
      overrides:
        postgresConfig: {wal_level: replica, work_mem: 4MB}
        pools:
          main:
            storage: {size: 0Gi}
            postgres: {resources: {requests: {cpu: '1'}, limits: {cpu: 500m}}}
",
        ));
        let findings = validate(&new, None, &Templates::default());
        assert_eq!(
            fields(&findings),
            [
                "spec.globalTopoServer.etcd.resources.limits.memory",
                "spec.globalTopoServer.etcd.storage.size",
                "spec.durabilityPolicy",
                "spec.databases[0].durabilityPolicy",
                "spec.databases[0].tablegroups[0].shards[0].overrides.pools[main].storage.size",
                "spec.databases[0].tablegroups[0].shards[0].overrides.pools[main].postgres.resources.limits.cpu",
                "spec.databases[0].tablegroups[0].shards[0].overrides.postgresConfig[wal_level]",
                "spec.externalGateway.externalIPs[0]",
            ]
        );
        assert!(
            findings.message().starts_with("8 problems: "),
            "{}",
            findings.message()
        );
        assert!(
            findings.violations[2]
                .message
                .contains("use one of AT_LEAST_2, MULTI_CELL_AT_LEAST_2")
        );
    }

    #[test]
    fn a_cluster_needs_a_cell() {
        let new = cluster("postgresPasswordSecretRef: {name: pw, key: password}");
        let findings = validate(&new, None, &Templates::default());
        assert_eq!(fields(&findings), ["spec.cells"]);
    }

    #[test]
    fn cells_stay_and_keep_their_placement() {
        let old = cluster(BASE);
        let new = cluster(
            "
postgresPasswordSecretRef: {name: pw, key: password}
cells: [{name: zone-b, region: r-1}, {name: zone-c, zoneId: z-c}]
",
        );
        let findings = validate(&new, Some(&old), &Templates::default());
        assert_eq!(
            fields(&findings),
            ["spec.cells", "spec.cells[0].zoneId", "spec.cells[0].region"]
        );
        assert!(
            findings.violations[0]
                .message
                .starts_with("cell \"zone-a\" cannot be removed")
        );
        assert!(
            findings.violations[1]
                .message
                .contains("(was \"z-b\", now unset)")
        );
    }

    #[test]
    fn problems_the_stored_cluster_already_had_do_not_block_an_edit() {
        let broken = with("durabilityPolicy: LEGACY\n");
        let old = cluster(&broken);
        let edited = cluster(&format!("{broken}topologyPruning: {{enabled: false}}\n"));
        assert!(validate(&edited, Some(&old), &Templates::default()).allowed());
        // A new problem in the same edit is still refused.
        let worse = cluster(&format!(
            "{broken}externalGateway: {{enabled: true, externalIPs: [x]}}\n"
        ));
        let findings = validate(&worse, Some(&old), &Templates::default());
        assert_eq!(fields(&findings), ["spec.externalGateway.externalIPs[0]"]);
    }

    #[test]
    fn etcd_member_count_is_compared_after_resolution() {
        let t = templates("core: {big: {globalTopoServer: {etcd: {replicas: 5}}}}");
        let old = cluster(&with("templateDefaults: {coreTemplate: big}"));
        // Same count written inline: fine.
        let same = cluster(&with(
            "templateDefaults: {coreTemplate: big}\nglobalTopoServer: {etcd: {replicas: 5}}",
        ));
        assert!(validate(&same, Some(&old), &t).allowed());
        // Dropping the template falls back to the default of 3.
        let findings = validate(&cluster(BASE), Some(&old), &t);
        assert_eq!(
            fields(&findings),
            ["spec.globalTopoServer.etcd.replicas (default)"]
        );
        assert!(findings.violations[0].message.contains("(5 → 3)"));
    }

    #[test]
    fn single_etcd_member_and_delete_policies_warn() {
        let new = cluster(&with(
            "pvcDeletionPolicy: {whenDeleted: Delete}\nglobalTopoServer: {etcd: {replicas: 1}}",
        ));
        let findings = validate(&new, None, &Templates::default());
        assert!(findings.allowed());
        assert_eq!(findings.warnings.len(), 2, "{:?}", findings.warnings);
        assert!(findings.warnings[0].starts_with("spec.pvcDeletionPolicy.whenDeleted: is Delete"));
        assert!(
            findings.warnings[1]
                .starts_with("spec.globalTopoServer.etcd.replicas: the global etcd has 1 member")
        );
    }

    const SHARD_WITH: &str = "
databases:
- name: postgres
  default: true
  tablegroups:
  - name: default
    default: true
    shards:
    - name: 0-inf
";

    fn shard(body: &str) -> String {
        let indented: String = body.lines().map(|l| format!("      {l}\n")).collect();
        with(&format!("{SHARD_WITH}{indented}"))
    }

    const SHARD: &str = "spec.databases[0].tablegroups[0].shards[0]";

    #[test]
    fn pool_volumes_never_shrink_whatever_level_sets_them() {
        let t = templates("shard: {std: {pools: {main: {storage: {size: 2Gi}}}}}");
        let old = cluster(&shard(
            "shardTemplate: std\noverrides: {pools: {main: {storage: {size: 10Gi}}}}",
        ));
        let grown = cluster(&shard(
            "shardTemplate: std\noverrides: {pools: {main: {storage: {size: 20Gi}}}}",
        ));
        assert!(validate(&grown, Some(&old), &t).allowed());
        // Removing the override falls back to the template's 2Gi.
        let findings = validate(&cluster(&shard("shardTemplate: std")), Some(&old), &t);
        assert_eq!(
            fields(&findings),
            ["ShardTemplate \"std\" spec.pools[main].storage.size"]
        );
        assert_eq!(
            findings.violations[0].message,
            "the data volume of pool \"main\" cannot shrink from 10Gi to 2Gi: \
             PersistentVolumeClaims can grow but never shrink; keep at least 10Gi"
        );
        // 10240Mi is the same amount as 10Gi.
        let same = cluster(&shard(
            "shardTemplate: std\noverrides: {pools: {main: {storage: {size: 10240Mi}}}}",
        ));
        assert!(validate(&same, Some(&old), &t).allowed());
    }

    #[test]
    fn pools_and_pool_cells_are_append_only() {
        let old = cluster(&shard(
            "spec: {pools: {main: {cells: [zone-a, zone-b]}, extra: {}}}",
        ));
        let new = cluster(&shard("spec: {pools: {main: {cells: [zone-a]}}}"));
        let findings = validate(&new, Some(&old), &Templates::default());
        assert_eq!(
            fields(&findings),
            [
                format!("{SHARD} pools"),
                format!("{SHARD}.spec.pools[main].cells")
            ]
        );
        assert!(
            findings.violations[0]
                .message
                .starts_with("pool \"extra\" of shard postgres/default/0-inf cannot be removed")
        );
        assert!(
            findings.violations[1]
                .message
                .starts_with("cells [\"zone-b\"] cannot be removed from pool \"main\"")
        );
    }

    #[test]
    fn pools_and_multiorch_use_cells_of_the_cluster() {
        let t = templates("shard: {std: {pools: {main: {cells: [zone-x]}}}}");
        let new = cluster(&shard(
            "shardTemplate: std\noverrides: {multiorch: {cells: [zone-a, zone-q]}}",
        ));
        let findings = validate(&new, None, &t);
        assert_eq!(
            fields(&findings),
            [
                format!("{SHARD}.overrides.multiorch.cells"),
                "ShardTemplate \"std\" spec.pools[main].cells".to_owned()
            ]
        );
        assert!(findings.violations[1].message.contains("[\"zone-x\"]"));
    }

    #[test]
    fn backup_volume_and_encryption_follow_the_resolved_backup() {
        let old = cluster(&with(
            "backup: {type: filesystem, filesystem: {storage: {size: 50Gi}}, encryption: {secretName: keys}}",
        ));
        // Removing the whole block: CEL's transition rule never sees it.
        let findings = validate(&cluster(BASE), Some(&old), &Templates::default());
        assert_eq!(
            fields(&findings),
            [
                "spec.backup.filesystem.storage.size (default)",
                "spec.backup.encryption (default)"
            ]
        );
        assert!(findings.violations[0].message.contains("from 50Gi to 10Gi"));
        assert!(
            findings.violations[1]
                .message
                .contains("(was Secret \"keys\", now none)")
        );
        // Moving the same settings to the shard level changes nothing.
        let moved = cluster(&shard(
            "backup: {type: filesystem, filesystem: {storage: {size: 50Gi}}, encryption: {secretName: keys}}",
        ));
        assert!(validate(&moved, Some(&old), &Templates::default()).allowed());
    }

    #[test]
    fn buffer_is_checked_after_merging_template_and_overrides() {
        let t = templates("cell: {gw: {multigateway: {buffer: {window: 15s}}}}");
        let new = cluster(
            "
postgresPasswordSecretRef: {name: pw, key: password}
cells:
- name: zone-a
  zoneId: z-a
  cellTemplate: gw
  overrides: {multigateway: {buffer: {maxFailoverDuration: 12s}}}
",
        );
        let findings = validate(&new, None, &t);
        assert_eq!(
            fields(&findings),
            ["CellTemplate \"gw\" spec.multigateway.buffer.window"]
        );
        assert!(
            findings.violations[0]
                .message
                .starts_with("buffer window (15s) must not exceed maxFailoverDuration (12s)")
        );
    }

    #[test]
    fn postgres_and_multipooler_share_a_uid() {
        let t = templates(
            "shard: {std: {pools: {main: {postgres: {runAsUser: 999}, multipooler: {runAsUser: 999}}}}}",
        );
        let new = cluster(&shard(
            "shardTemplate: std\noverrides: {pools: {main: {multipooler: {runAsUser: 1000}}}}",
        ));
        let findings = validate(&new, None, &t);
        assert_eq!(
            fields(&findings),
            ["ShardTemplate \"std\" spec.pools[main].postgres.runAsUser"]
        );
        assert!(
            findings.violations[0]
                .message
                .contains("differs from multipooler runAsUser 1000")
        );
    }

    #[test]
    fn durability_needs_two_poolers() {
        let new = cluster(&shard(
            "spec: {pools: {main: {cells: [zone-a], replicasPerCell: 1}}}",
        ));
        let findings = validate(&new, None, &Templates::default());
        assert!(findings.allowed());
        assert_eq!(findings.warnings.len(), 1);
        assert!(findings.warnings[0].starts_with(&format!(
            "{SHARD}.spec.pools[main].replicasPerCell: pool \"main\" of shard postgres/default/0-inf has 1 replica(s) per cell in 1 cell(s)"
        )));
        let multi = cluster(&format!(
            "{}durabilityPolicy: MULTI_CELL_AT_LEAST_2\n",
            shard("spec: {pools: {main: {cells: [zone-a]}}}")
        ));
        let findings = validate(&multi, None, &Templates::default());
        assert!(
            findings.warnings[0].contains("MULTI_CELL_AT_LEAST_2"),
            "{findings:?}"
        );
    }

    #[test]
    fn template_changes_are_judged_on_the_clusters_using_them() {
        let user = cluster(&shard("shardTemplate: std"));
        let old =
            templates("shard: {std: {pools: {main: {storage: {size: 5Gi}, cells: [zone-a]}}}}");
        let shrunk =
            templates("shard: {std: {pools: {main: {storage: {size: 1Gi}, cells: [zone-a]}}}}");
        let findings = template_change(&user, &old, &shrunk);
        assert_eq!(
            fields(&findings),
            ["ShardTemplate \"std\" spec.pools[main].storage.size"]
        );
        let unknown_cell = templates(
            "shard: {std: {pools: {main: {storage: {size: 5Gi}, cells: [zone-a, zone-z]}}}}",
        );
        let findings = template_change(&user, &old, &unknown_cell);
        assert_eq!(
            fields(&findings),
            ["ShardTemplate \"std\" spec.pools[main].cells"]
        );
        let grown = templates(
            "shard: {std: {pools: {main: {storage: {size: 9Gi}, cells: [zone-a, zone-b]}}}}",
        );
        assert!(template_change(&user, &old, &grown).allowed());
    }
}
