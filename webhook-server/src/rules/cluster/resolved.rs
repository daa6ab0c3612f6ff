//! Pass 2: the spec resolved with its templates ([`multigres_api::resolver`]). Buffer durations,
//! pool and multiorch cells that exist, postgres/multipooler UIDs, plus warnings.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::jiff::Timestamp;
use multigres_api::resolver::GlobalTopo;
use multigres_api::resolver::cohort::{self, Durability};
use multigres_api::v1alpha1::{BackupType, MultiorchSpec, PoolSpec, ShardConfig};

use multigres_api::postgres::limits;
use multigres_api::volumes::{self, AutoGrow};

use super::repository::Repository;
use super::view::{ShardSite, View};
use crate::rules;
use crate::violation::Findings;
use multigres_api::quantity::Quantity;

/// The checks of one resolved cluster.
pub(super) fn resolved_checks(findings: &mut Findings, view: &View<'_>) {
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
        rules::buffer(findings, &site.buffer(), true);
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
            rules::run_as_user(
                findings,
                uid("postgres", |p| {
                    p.postgres.as_ref().and_then(|c| c.run_as_user)
                }),
                uid("multipooler", |p| {
                    p.multipooler.as_ref().and_then(|c| c.run_as_user)
                }),
            );
            durability_warning(findings, shard, pool_name, pool);
            auto_grow(findings, shard, pool_name, pool);
        }
        multiorch_replicas(findings, shard);
        multiorch_durations(findings, shard);
        shared_memory(findings, shard);
        single_loss_warning(findings, shard);
        shared_backup_volume_warning(findings, view, shard);
        override_pools_warning(findings, shard);
        recovery(findings, view, shard);
    }
}

/// A shard started from another cluster's backups (`backup.recovery`, see the
/// resource-handler's recovery Job): the recovered data is written as the first backup of the
/// shard's own S3 repository, so that one must be S3, unencrypted, and not the source; the
/// source is read with its own keys; a time target lies in the past.
fn recovery(findings: &mut Findings, view: &View<'_>, shard: &ShardSite<'_>) {
    let Some(backup) = shard.resolved.backup.as_ref() else {
        return;
    };
    let Some(recovery) = backup.recovery.as_ref() else {
        return;
    };
    let field = |leaf: &str| shard.backup_field(view.spec, leaf, |b| b.recovery.is_some());
    let Some(own) = Repository::of(backup) else {
        findings.violation(
            field("recovery"),
            format!(
                "shard {} recovers into its own backup repository, which must be S3 \
                 (backup.type: s3): the recovered data becomes its first backup there",
                shard.key
            ),
        );
        return;
    };
    if Repository::of_s3(&recovery.source) == own {
        findings.violation(
            field("recovery.source"),
            format!(
                "shard {} would recover from its own repository ({own}): a recovery never \
                 writes into its source; give backup.s3.keyPrefix a prefix of its own",
                shard.key
            ),
        );
    }
    if backup.encryption.is_some() {
        findings.violation(
            field("encryption"),
            format!(
                "shard {}: a recovery writes an unencrypted first backup, so it cannot be \
                 combined with backup encryption yet",
                shard.key
            ),
        );
    }
    if recovery.source.service_account_name.is_some() {
        findings.violation(
            field("recovery.source.serviceAccountName"),
            "the recovery source is read with credentialsSecret or useEnvCredentials; a \
             ServiceAccount (IRSA) of its own is not supported",
        );
    }
    let time = recovery.target.as_ref().and_then(|t| t.time.as_ref());
    if let Some(time) = time.filter(|t| t.0 > Timestamp::now()) {
        findings.violation(
            field("recovery.target.time"),
            format!(
                "{} is in the future: a recovery reaches only what the source has archived",
                time.0
            ),
        );
    }
}

/// A pool's `autoGrow` after merging: a positive step, a threshold from 50 to 95, and a
/// ceiling no smaller than the volume it grows (else it could never grow, or would shrink).
fn auto_grow(findings: &mut Findings, shard: &ShardSite<'_>, pool_name: &str, pool: &PoolSpec) {
    let Some(spec) = &pool.auto_grow else {
        return;
    };
    let field = |leaf: &str| {
        shard.pool_field(pool_name, &format!("autoGrow.{leaf}"), |p| {
            p.auto_grow.is_some()
        })
    };
    let auto = match AutoGrow::of(spec) {
        Ok(auto) => auto,
        Err((leaf, why)) => {
            findings.violation(field(leaf), why);
            return;
        }
    };
    let size = pool.storage.as_ref().and_then(|s| s.size.as_deref());
    if let Some((size, bytes)) = size.and_then(|s| Some((s, volumes::parse_bytes(s)?)))
        && auto.ceiling < bytes
    {
        findings.violation(
            field("ceiling"),
            format!(
                "{:?} is below the pool's storage.size {size:?}: the ceiling is the largest size \
                 a volume is grown to, so it must be at least storage.size",
                spec.ceiling
            ),
        );
    }
}

fn multiorch_cells_field(shard: &ShardSite<'_>) -> String {
    multiorch_field(shard, "cells", |m| !m.cells.is_empty())
}

/// Where `multiorch.<leaf>` of a shard was written: its inline spec, its overrides or its
/// template (the first whose multiorch block `has` it).
fn multiorch_field(shard: &ShardSite<'_>, leaf: &str, has: fn(&MultiorchSpec) -> bool) -> String {
    let written = |get: &dyn Fn(&ShardConfig) -> bool| shard.config.is_some_and(get);
    let path = shard.describe();
    if written(&|c| {
        c.spec
            .as_ref()
            .and_then(|s| s.multiorch.as_ref())
            .is_some_and(has)
    }) {
        format!("{path}.spec.multiorch.{leaf}")
    } else if written(&|c| {
        c.overrides
            .as_ref()
            .and_then(|o| o.multiorch.as_ref())
            .is_some_and(has)
    }) {
        format!("{path}.overrides.multiorch.{leaf}")
    } else if let Some((name, _)) = shard.template {
        format!("ShardTemplate {name:?} spec.multiorch.{leaf}")
    } else {
        format!("{path}.multiorch.{leaf}")
    }
}

/// A shard without multiorch never gets a primary elected, nor a failed one replaced.
fn multiorch_replicas(findings: &mut Findings, shard: &ShardSite<'_>) {
    if shard.resolved.multiorch.stateless.replicas == Some(0) {
        findings.violation(
            multiorch_field(shard, "replicas", |m| m.stateless.replicas.is_some()),
            "must be at least 1: without multiorch no primary is ever elected for the shard, \
             and a failed primary is never replaced",
        );
    }
}

/// multiorch's failover grace periods, which it takes as Go durations.
fn multiorch_durations(findings: &mut Findings, shard: &ShardSite<'_>) {
    let multiorch = &shard.resolved.multiorch;
    rules::go_duration(
        findings,
        || {
            multiorch_field(shard, "leaderFailoverGracePeriodBase", |m| {
                m.leader_failover_grace_period_base.is_some()
            })
        },
        multiorch.leader_failover_grace_period_base.as_ref(),
    );
    rules::go_duration(
        findings,
        || {
            multiorch_field(shard, "leaderFailoverGracePeriodMaxJitter", |m| {
                m.leader_failover_grace_period_max_jitter.is_some()
            })
        },
        multiorch.leader_failover_grace_period_max_jitter.as_ref(),
    );
}

/// `shared_buffers` plus `wal_buffers` must fit the postgres container's memory limit:
/// PostgreSQL allocates both as shared memory at start, counted against the container's limit,
/// so it would fail to start or be OOM-killed, replica after replica in the rollout. A pool
/// without a memory limit is not checked.
fn shared_memory(findings: &mut Findings, shard: &ShardSite<'_>) {
    let config = &shard.resolved.postgres_config;
    let setting = |name: &str| {
        config
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(key, value)| (key.as_str(), value.as_str()))
    };
    let shared = setting("shared_buffers");
    let wal = setting("wal_buffers");
    let bytes = |s: Option<(&str, &str)>| {
        s.and_then(|(key, value)| limits::memory_bytes(key, value))
            .unwrap_or(0.0)
    };
    let total = bytes(shared) + bytes(wal);
    let Some((blamed, _)) = shared.or(wal) else {
        return;
    };
    let written: String = [shared, wal]
        .into_iter()
        .flatten()
        .map(|(key, value)| format!("{key} = {value}"))
        .collect::<Vec<_>>()
        .join(" plus ");
    for (name, pool) in &shard.resolved.pools {
        let Some(limit) = pool
            .postgres
            .as_ref()
            .and_then(|c| c.resources.as_ref())
            .and_then(|r| r.limits.as_ref())
            .and_then(|l| l.get("memory"))
        else {
            continue;
        };
        let Ok(amount) = Quantity::parse(&limit.0) else {
            continue;
        };
        if total > amount.to_f64() {
            findings.violation(
                postgres_config_field(shard, blamed),
                format!(
                    "{written} needs {:.0} MiB of shared memory, more than the memory limit {} \
                     of the postgres container of pool {:?}: PostgreSQL would fail to start or \
                     be OOM-killed; lower it (unset, the operator uses a quarter of the limit) \
                     or raise the pool's postgres.resources.limits.memory",
                    total / 1_048_576.0,
                    limit.0,
                    name.as_str()
                ),
            );
            return;
        }
    }
}

/// Where `postgresConfig[<key>]` of a shard was written: its inline spec, its overrides or its
/// template (the most specific that has it, as the resolver merges them).
fn postgres_config_field(shard: &ShardSite<'_>, key: &str) -> String {
    let has = |map: Option<&std::collections::BTreeMap<String, String>>| {
        map.is_some_and(|m| m.contains_key(key))
    };
    let config = shard.config;
    if has(config
        .and_then(|c| c.spec.as_ref())
        .map(|s| &s.postgres_config))
    {
        format!("{}.spec.postgresConfig[{key}]", shard.describe())
    } else if has(config
        .and_then(|c| c.overrides.as_ref())
        .map(|o| &o.postgres_config))
    {
        format!("{}.overrides.postgresConfig[{key}]", shard.describe())
    } else if let Some((name, _)) = shard.template {
        format!("ShardTemplate {name:?} spec.postgresConfig[{key}]")
    } else {
        format!("{}.postgresConfig[{key}]", shard.describe())
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

/// A shard whose cohort (every pool pod of the shard) meets its durability policy but cannot
/// lose any one pod ([`cohort::survives_any_pod_loss`]): a restart, a drain or a node failure
/// then stops writes until the pod is back, a drain of its node never completes, and Multigres
/// from pull request 1349 on refuses to bootstrap it. Only an explicit `replicasPerCell` (or a
/// `MULTI_CELL_` policy over pools in too few cells) asks for such a shape, since the defaults
/// survive; it stays accepted, as upstream manifests write it. A shard that cannot meet the
/// policy at all is warned per pool above.
fn single_loss_warning(findings: &mut Findings, shard: &ShardSite<'_>) {
    let Some(policy) = Durability::parse(shard.durability) else {
        return;
    };
    let pools = &shard.resolved.pools;
    let mut per_cell: BTreeMap<&str, usize> = BTreeMap::new();
    for pool in pools.values() {
        let pods = usize::try_from(pool.replicas_per_cell.unwrap_or(1)).unwrap_or(0);
        for cell in &pool.cells {
            *per_cell.entry(cell.as_str()).or_default() += pods;
        }
    }
    let pods_per_cell: Vec<usize> = per_cell.values().copied().collect();
    if !policy.satisfied_by(&pods_per_cell) || cohort::survives_any_pod_loss(policy, &pods_per_cell)
    {
        return;
    }
    // Name the replicasPerCell that asked for the shape: the first pool's that is written.
    let fields: Vec<String> = pools
        .keys()
        .map(|name| {
            shard.pool_field(name.as_str(), "replicasPerCell", |p| {
                p.replicas_per_cell.is_some()
            })
        })
        .collect();
    let Some(field) = fields
        .iter()
        .find(|f| !f.ends_with("(default)"))
        .or(fields.first())
    else {
        return;
    };
    let pods: usize = pods_per_cell.iter().sum();
    let cells = pods_per_cell.iter().filter(|&&p| p > 0).count();
    findings.warning(
        field,
        format!(
            "shard {} cannot lose any one of its {pods} pool pods in {cells} cell(s) (a \
             restart, a drain, a node failure): under durability policy {} the others cannot \
             elect a primary and accept writes until it returns; 3 pods in one cell, 2 per cell \
             in two or 1 per cell in three survive it (the default when replicasPerCell is unset)",
            shard.key, shard.durability,
        ),
    );
}

/// Filesystem backups on a volume that only one node can mount (no `ReadWriteMany`): every
/// pool pod mounts it, so the whole pool runs on that node. A node failure then takes every
/// pod, and a drain finds no replica elsewhere for the primary to hand over to.
fn shared_backup_volume_warning(findings: &mut Findings, view: &View<'_>, shard: &ShardSite<'_>) {
    let Some(backup) = shard.resolved.backup.as_ref() else {
        return;
    };
    if backup.type_ != BackupType::Filesystem {
        return;
    }
    let storage = backup.filesystem.as_ref().and_then(|f| f.storage.as_ref());
    if storage.is_some_and(|s| s.access_modes.iter().any(|m| m == "ReadWriteMany")) {
        return;
    }
    let pods: i32 = shard
        .resolved
        .pools
        .values()
        .map(|p| p.replicas_per_cell.unwrap_or(1) * i32::try_from(p.cells.len()).unwrap_or(0))
        .sum();
    if pods < 2 {
        return;
    }
    let mut cells: Vec<&str> = shard
        .resolved
        .pools
        .values()
        .flat_map(|p| p.cells.iter().map(|c| c.as_str()))
        .collect();
    cells.sort_unstable();
    cells.dedup();
    let consequence = if cells.len() > 1 {
        format!(
            "its pool pods in cells {} cannot all start: a volume one node mounts is in one \
             zone, so only the pods of the cell that holds it run, and the others stay Pending",
            cells.join(", ")
        )
    } else {
        "they all run on the one node that holds it, so losing that node stops the shard and a \
         drain of it cannot move the primary"
            .to_owned()
    };
    findings.warning(
        shard.backup_field(view.spec, "filesystem.storage.accessModes", |b| {
            b.filesystem
                .as_ref()
                .and_then(|f| f.storage.as_ref())
                .is_some_and(|s| !s.access_modes.is_empty())
        }),
        format!(
            "shard {} keeps filesystem backups on one volume without ReadWriteMany, which all \
             {pods} pool pods mount: {consequence}; use accessModes [ReadWriteMany] (a storage \
             class that offers it) or S3 backups",
            shard.key
        ),
    );
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

#[cfg(test)]
mod tests {
    use crate::rules::Templates;
    use crate::rules::cluster::tests::{SHARD, cluster, fields, shard, templates, with};
    use crate::rules::cluster::validate;

    #[test]
    fn single_etcd_member_and_delete_policies_warn() {
        let new = cluster(&with(
            "pvcDeletionPolicy: {whenDeleted: Delete}\nglobalTopoServer: {etcd: {replicas: 1}}",
        ));
        let findings = validate(&new, None, &Templates::default());
        assert!(findings.allowed());
        assert_eq!(findings.warnings.len(), 3, "{:?}", findings.warnings);
        assert!(findings.warnings[0].starts_with("spec.pvcDeletionPolicy.whenDeleted: is Delete"));
        assert!(
            findings.warnings[1]
                .starts_with("spec.globalTopoServer.etcd.replicas: the global etcd has 1 member")
        );
        assert!(
            findings
                .warnings
                .iter()
                .all(|w| !w.contains("cannot lose any one")),
            "the default shard's 3 pool pods survive the loss of one"
        );
    }

    #[test]
    fn auto_grow_needs_a_positive_step_and_a_ceiling_above_the_size() {
        let t = templates("shard: {std: {pools: {main: {storage: {size: 10Gi}}}}}");
        let new = cluster(&shard(
            "shardTemplate: std\noverrides: {pools: {main: {autoGrow: {step: 0Gi, ceiling: 20Gi}}}}",
        ));
        let findings = validate(&new, None, &t);
        assert_eq!(
            fields(&findings),
            [format!("{SHARD}.overrides.pools[main].autoGrow.step")]
        );
        assert!(findings.violations[0].message.contains("must be positive"));
        let low = cluster(&shard(
            "shardTemplate: std\noverrides: {pools: {main: {autoGrow: {step: 50%, ceiling: 5Gi}}}}",
        ));
        let findings = validate(&low, None, &t);
        assert_eq!(
            fields(&findings),
            [format!("{SHARD}.overrides.pools[main].autoGrow.ceiling")]
        );
        assert!(
            findings.violations[0]
                .message
                .contains("below the pool's storage.size \"10Gi\""),
            "{findings:?}"
        );
        let fine = cluster(&shard(
            "shardTemplate: std\noverrides: {pools: {main: {autoGrow: {step: 2Gi, ceiling: 40Gi}}}}",
        ));
        assert!(validate(&fine, None, &t).allowed());
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
    fn shared_buffers_must_fit_the_postgres_memory_limit() {
        let big = cluster(&shard("overrides: {postgresConfig: {shared_buffers: 8GB}}"));
        let findings = validate(&big, None, &Templates::default());
        assert_eq!(
            fields(&findings),
            [format!("{SHARD}.overrides.postgresConfig[shared_buffers]")]
        );
        assert!(
            findings.violations[0].message.starts_with(
                "shared_buffers = 8GB needs 8192 MiB of shared memory, more than the memory \
                 limit 512Mi of the postgres container of pool \"default\""
            ),
            "{findings:?}"
        );
        let t = templates(
            "shard: {std: {postgresConfig: {shared_buffers: 300MB, wal_buffers: 16MB}, pools: \
             {main: {postgres: {resources: {limits: {memory: 300Mi}}}}}}}",
        );
        let findings = validate(&cluster(&shard("shardTemplate: std")), None, &t);
        assert_eq!(
            fields(&findings),
            ["ShardTemplate \"std\" spec.postgresConfig[shared_buffers]"]
        );
        let fits = cluster(&shard("spec: {postgresConfig: {shared_buffers: 128MB}}"));
        assert!(validate(&fits, None, &Templates::default()).allowed());
        let unlimited = cluster(&shard(
            "spec: {postgresConfig: {shared_buffers: 8GB}, pools: {main: {postgres: \
             {resources: {requests: {memory: 1Gi}}}}}}",
        ));
        assert!(
            validate(&unlimited, None, &Templates::default()).allowed(),
            "no memory limit, nothing to compare with"
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
    fn filesystem_backups_on_a_volume_one_node_mounts_warn_that_the_pool_shares_that_node() {
        let warned = |backup: &str| {
            let new = cluster(&format!(
                "{}{backup}",
                shard("spec: {pools: {main: {cells: [zone-a], replicasPerCell: 3}}}")
            ));
            validate(&new, None, &Templates::default())
                .warnings
                .into_iter()
                .find(|w| w.contains("ReadWriteMany"))
        };
        let default = warned("").expect("the default filesystem backups warn");
        assert!(
            default.starts_with(
                "spec.backup.filesystem.storage.accessModes (default): shard \
                 postgres/default/0-inf keeps filesystem backups on one volume without \
                 ReadWriteMany, which all 3 pool pods mount"
            ),
            "{default}"
        );
        let shared =
            "backup: {type: filesystem, filesystem: {storage: {accessModes: [ReadWriteMany]}}}\n";
        assert_eq!(warned(shared), None);
        let two_cells = validate(
            &cluster(&shard(
                "spec: {pools: {main: {cells: [zone-a, zone-b], replicasPerCell: 1}}}",
            )),
            None,
            &Templates::default(),
        );
        let across = two_cells
            .warnings
            .iter()
            .find(|w| w.contains("ReadWriteMany"))
            .expect("two cells on one volume warn");
        assert!(
            across.contains(
                "its pool pods in cells zone-a, zone-b cannot all start: a volume one node \
                 mounts is in one zone"
            ),
            "{across}"
        );
        let once =
            "backup: {type: filesystem, filesystem: {storage: {accessModes: [ReadWriteOnce]}}}\n";
        assert!(
            warned(once)
                .unwrap()
                .starts_with("spec.backup.filesystem.storage.accessModes: shard")
        );
        let s3 = "backup: {type: s3, s3: {bucket: b, region: r}}\n";
        assert_eq!(warned(s3), None);
    }

    #[test]
    fn a_shard_that_cannot_lose_one_pod_says_so_and_what_would_survive_it() {
        let warned = |pools: &str, policy: &str| {
            let new = cluster(&format!("{}{policy}", shard(pools)));
            let findings = validate(&new, None, &Templates::default());
            assert!(findings.allowed(), "{findings:?}");
            findings
                .warnings
                .into_iter()
                .find(|w| w.contains("cannot lose any one"))
        };
        let two = warned(
            "spec: {pools: {main: {cells: [zone-a], replicasPerCell: 2}}}",
            "",
        )
        .expect("2 pods under AT_LEAST_2 warn");
        assert!(
            two.starts_with(&format!(
                "{SHARD}.spec.pools[main].replicasPerCell: shard postgres/default/0-inf cannot \
                 lose any one of its 2 pool pods in 1 cell(s)"
            )),
            "{two}"
        );
        assert!(two.contains("under durability policy AT_LEAST_2"), "{two}");
        assert!(two.ends_with("(the default when replicasPerCell is unset)"));
        for survives in [
            "spec: {pools: {main: {cells: [zone-a], replicasPerCell: 3}}}",
            "spec: {pools: {main: {cells: [zone-a, zone-b], replicasPerCell: 2}}}",
            "spec: {pools: {main: {cells: [zone-a]}}}",
            "spec: {pools: {main: {cells: [zone-a, zone-b]}}}",
            "spec: {pools: {main: {cells: [zone-a], replicasPerCell: 2}, more: {cells: [zone-b], replicasPerCell: 1}}}",
        ] {
            assert_eq!(warned(survives, ""), None, "{survives}");
        }
        let multi = "durabilityPolicy: MULTI_CELL_AT_LEAST_2\n";
        let across = warned(
            "spec: {pools: {main: {cells: [zone-a, zone-b], replicasPerCell: 1}}}",
            multi,
        )
        .expect("one pod per cell in two cells under MULTI_CELL_AT_LEAST_2 warn");
        assert!(
            across.contains("its 2 pool pods in 2 cell(s)") && across.contains("MULTI_CELL"),
            "{across}"
        );
        assert!(
            warned(
                "spec: {pools: {main: {cells: [zone-a], replicasPerCell: 2}, more: {cells: [zone-b], replicasPerCell: 1}}}",
                multi,
            )
            .is_some(),
            "losing the only pod of zone-b leaves one cell"
        );
        assert_eq!(
            warned("spec: {pools: {main: {cells: [zone-a, zone-b]}}}", multi),
            None,
            "the default 2 per cell survives under MULTI_CELL_AT_LEAST_2 too"
        );
    }

    #[test]
    fn a_recovery_writes_into_an_s3_repository_of_its_own_and_targets_the_past() {
        let t = Templates::default();
        let own = "type: s3, s3: {bucket: b, region: r, keyPrefix: staging}";
        let fine = cluster(&with(&format!(
            "backup: {{{own}, recovery: {{source: {{bucket: b, region: r, keyPrefix: prod}}, \
             target: {{time: '2026-01-01T00:00:00Z'}}}}}}"
        )));
        assert!(validate(&fine, None, &t).allowed());
        let itself = cluster(&with(&format!(
            "backup: {{{own}, recovery: {{source: {{bucket: b, region: r, keyPrefix: /staging/}}}}}}"
        )));
        let findings = validate(&itself, None, &t);
        assert_eq!(fields(&findings), ["spec.backup.recovery.source"]);
        assert!(
            findings.violations[0]
                .message
                .contains("never writes into its source"),
            "{findings:?}"
        );
        let future = cluster(&with(&format!(
            "backup: {{{own}, recovery: {{source: {{bucket: b, region: r, keyPrefix: prod}}, \
             target: {{time: '2999-01-01T00:00:00Z'}}}}}}"
        )));
        let findings = validate(&future, None, &t);
        assert_eq!(fields(&findings), ["spec.backup.recovery.target.time"]);
        assert!(findings.violations[0].message.contains("in the future"));
        let filesystem = cluster(&with(
            "backup: {type: filesystem, recovery: {source: {bucket: b, region: r}}}",
        ));
        let findings = validate(&filesystem, None, &t);
        assert_eq!(fields(&findings), ["spec.backup.recovery"]);
        assert!(findings.violations[0].message.contains("must be S3"));
        let encrypted = cluster(&with(&format!(
            "backup: {{{own}, encryption: {{secretName: k}}, \
             recovery: {{source: {{bucket: b, region: r, keyPrefix: prod}}}}}}"
        )));
        assert_eq!(
            fields(&validate(&encrypted, None, &t)),
            ["spec.backup.encryption"]
        );
    }
}
