//! What passes 2 and 3 look at: a cluster's spec with its resolution, and where each resolved
//! value was written, so a finding names the field to change.

use std::collections::{BTreeMap, BTreeSet};

use multigres_api::DEFAULT_TEMPLATE;
use multigres_api::resolver::{ResolvedCluster, defaults};
use multigres_api::v1alpha1::{
    BackupConfig, CellConfig, CellTemplateSpec, CoreTemplateSpec, DatabaseConfig, EtcdSpec,
    MultigresClusterSpec, PoolSpec, ShardConfig, ShardResolvedSpec, ShardTemplateSpec,
    TableGroupConfig, TemplateRef,
};

use crate::rules::{BufferSettings, Templates};

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
pub(super) struct View<'a> {
    pub(super) spec: &'a MultigresClusterSpec,
    pub(super) resolved: &'a ResolvedCluster,
    core: Option<(&'a str, &'a CoreTemplateSpec)>,
    pub(super) cells: Vec<CellSite<'a>>,
    pub(super) shards: Vec<ShardSite<'a>>,
}

/// One cell: where it is written and the template it uses.
pub(super) struct CellSite<'a> {
    path: String,
    pub(super) config: &'a CellConfig,
    template: Option<(&'a str, &'a CellTemplateSpec)>,
}

/// One shard: where it is written (if at all) and what it resolved to.
pub(super) struct ShardSite<'a> {
    /// `database/tablegroup/shard`.
    pub(super) key: String,
    /// Path of the shard entry; `None` for the implicit default shard.
    pub(super) path: Option<String>,
    pub(super) config: Option<&'a ShardConfig>,
    tablegroup: Option<(String, &'a TableGroupConfig)>,
    database: Option<(String, &'a DatabaseConfig)>,
    pub(super) template: Option<(&'a str, &'a ShardTemplateSpec)>,
    pub(super) resolved: &'a ShardResolvedSpec,
    pub(super) durability: &'a str,
}

impl<'a> View<'a> {
    pub(super) fn new(
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

    /// The names in `spec.cells`.
    pub(super) fn cell_names(&self) -> BTreeSet<&str> {
        self.spec.cells.iter().map(|c| c.name.as_str()).collect()
    }

    /// Where a field of the global etcd comes from.
    pub(super) fn global_etcd_field(&self, field: &str, set: impl Fn(&EtcdSpec) -> bool) -> String {
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
    pub(super) fn local_etcd_field(&self, field: &str, set: impl Fn(&EtcdSpec) -> bool) -> String {
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
    pub(super) fn buffer(&self) -> BufferSettings {
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
    /// The shard's path, or its key when it is implicit.
    pub(super) fn describe(&self) -> String {
        self.path
            .clone()
            .unwrap_or_else(|| format!("shard {} (implicit)", self.key))
    }

    /// Where a field of a pool comes from: inline spec, overrides, template, or a default.
    pub(super) fn pool_field(
        &self,
        pool: &str,
        field: &str,
        set: impl Fn(&PoolSpec) -> bool,
    ) -> String {
        if let (Some(path), Some(config)) = (&self.path, self.config) {
            if config
                .spec
                .as_ref()
                .and_then(|s| s.pools.get(pool))
                .is_some_and(|p| set(p))
            {
                return format!("{path}.spec.pools[{pool}].{field}");
            }
            if config
                .overrides
                .as_ref()
                .and_then(|o| o.pools.get(pool))
                .is_some_and(|p| set(p))
            {
                return format!("{path}.overrides.pools[{pool}].{field}");
            }
        }
        if let Some((name, template)) = self.template
            && template.pools.get(pool).is_some_and(|p| set(p))
        {
            return format!("ShardTemplate {name:?} spec.pools[{pool}].{field}");
        }
        format!("{} pool {pool:?} {field} (default)", self.describe())
    }

    /// Where a field of the shard's resolved backup comes from: the most specific level that
    /// sets it.
    pub(super) fn backup_field(
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
