//! Pass 3: on update, the old and new specs resolved with the same templates. Etcd member counts
//! stay, volumes never shrink (etcd, pools, backups), pools and pool cells stay, backup encryption
//! stays. Resolving catches changes CEL cannot see: removing a whole block, or moving a value
//! between inline spec, overrides and template.

use std::collections::BTreeSet;

use multigres_api::resolver::GlobalTopo;
use multigres_api::v1alpha1::{BackupConfig, BackupType, EtcdSpec, MultigresClusterSpec, PoolSpec};

use super::view::{ShardSite, View};
use crate::rules;
use crate::violation::Findings;

/// The update rules between two resolutions of a cluster (or of its templates).
pub(super) fn transition(findings: &mut Findings, old: &View<'_>, new: &View<'_>) {
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
        rules::no_shrink(
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
            rules::no_shrink(
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
    let recovery = |b: &Option<BackupConfig>| b.as_ref().and_then(|b| b.recovery.clone());
    let wanted = recovery(&new.resolved.backup);
    if wanted.is_some() && wanted != recovery(&old.resolved.backup) {
        findings.violation(
            new.backup_field(spec, "recovery", |b| b.recovery.is_some()),
            format!(
                "shard {} exists: a recovery is read once, before a new shard's first pod \
                 starts, so it cannot be added or changed afterwards (it may be removed); to \
                 recover into a cluster, apply a new one",
                new.key
            ),
        );
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
        rules::no_shrink(
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
mod tests {
    use crate::rules::Templates;
    use crate::rules::cluster::tests::{BASE, SHARD, cluster, fields, shard, templates, with};
    use crate::rules::cluster::validate;

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
    fn a_recovery_cannot_be_added_to_or_changed_on_an_existing_shard() {
        let t = Templates::default();
        let plain = cluster(&with(
            "backup: {type: s3, s3: {bucket: b, region: r, keyPrefix: x}}",
        ));
        let recovering = |prefix: &str| {
            cluster(&with(&format!(
                "backup: {{type: s3, s3: {{bucket: b, region: r, keyPrefix: x}}, \
                 recovery: {{source: {{bucket: b, region: r, keyPrefix: {prefix}}}}}}}"
            )))
        };
        let added = validate(&recovering("prod"), Some(&plain), &t);
        assert_eq!(fields(&added), ["spec.backup.recovery"]);
        assert!(
            added.violations[0]
                .message
                .contains("cannot be added or changed")
        );
        let changed = validate(&recovering("other"), Some(&recovering("prod")), &t);
        assert_eq!(fields(&changed), ["spec.backup.recovery"]);
        assert!(validate(&recovering("prod"), Some(&recovering("prod")), &t).allowed());
        assert!(validate(&plain, Some(&recovering("prod")), &t).allowed());
    }
}
