//! How one level of configuration is laid over another.
//!
//! The rule depends on the kind of field, the same everywhere:
//!
//! | field kind | rule | examples |
//! |---|---|---|
//! | scalar (`Option<T>`) | the upper level replaces when it sets a value | `replicas`, `image`, `rootPath` |
//! | map | merged key by key; the upper level wins on a shared key | `podAnnotations`, `podLabels`, `postgresConfig` |
//! | resource block | replaced whole when the upper level sets it | `resources`, `affinity`, placements |
//! | list | replaced whole when the upper level's list is non-empty | `cells`, `tolerations`, `accessModes` |
//! | nested struct | merged field by field with these same rules | `storage`, `buffer`, `pvcDeletionPolicy` |
//! | pools | merged per pool name; a new name adds a pool | `pools` |
//! | backup | replaced whole when `type` differs, else merged field by field | `backup` |
//!
//! Replacing resource blocks whole (rather than merging requests and limits key by key) keeps a
//! template's `limits` from silently surviving under an override that sets only `requests`.

use std::collections::BTreeMap;

use crate::v1alpha1::{
    BackupConfig, ContainerConfig, EtcdSpec, FilesystemBackupConfig, GatewayBufferConfig,
    MultigatewaySpec, MultiorchSpec, PoolSpec, Pools, PvcDeletionPolicy, S3BackupConfig,
    StatelessSpec, StorageSpec,
};

/// Lays an upper level over `self`: what the upper level sets wins, by the rules above.
pub trait Overlay {
    fn overlay(&mut self, upper: &Self);
}

/// Scalar and resource-block rule: the upper value replaces when set.
pub fn replace<T: Clone>(base: &mut Option<T>, upper: &Option<T>) {
    if upper.is_some() {
        base.clone_from(upper);
    }
}

/// List rule: a non-empty upper list replaces.
pub fn replace_list<T: Clone>(base: &mut Vec<T>, upper: &[T]) {
    if !upper.is_empty() {
        *base = upper.to_vec();
    }
}

/// Map rule: merged per key, the upper level wins.
pub fn merge_map<K: Ord + Clone, V: Clone>(base: &mut BTreeMap<K, V>, upper: &BTreeMap<K, V>) {
    base.extend(upper.iter().map(|(k, v)| (k.clone(), v.clone())));
}

/// Nested-struct rule: merged field by field, or taken whole when the base has none.
pub fn overlay_opt<T: Overlay + Clone>(base: &mut Option<T>, upper: &Option<T>) {
    match (base.as_mut(), upper) {
        (Some(b), Some(u)) => b.overlay(u),
        (None, Some(u)) => *base = Some(u.clone()),
        (_, None) => {}
    }
}

impl Overlay for StatelessSpec {
    fn overlay(&mut self, upper: &Self) {
        replace(&mut self.replicas, &upper.replicas);
        replace(&mut self.resources, &upper.resources);
        replace(&mut self.affinity, &upper.affinity);
        merge_map(&mut self.pod_annotations, &upper.pod_annotations);
        merge_map(&mut self.pod_labels, &upper.pod_labels);
    }
}

impl Overlay for GatewayBufferConfig {
    fn overlay(&mut self, upper: &Self) {
        replace(&mut self.enabled, &upper.enabled);
        replace(&mut self.window, &upper.window);
        replace(
            &mut self.max_failover_duration,
            &upper.max_failover_duration,
        );
        replace(
            &mut self.min_time_between_failovers,
            &upper.min_time_between_failovers,
        );
        replace(&mut self.size, &upper.size);
        replace(&mut self.drain_concurrency, &upper.drain_concurrency);
    }
}

impl Overlay for MultigatewaySpec {
    fn overlay(&mut self, upper: &Self) {
        self.stateless.overlay(&upper.stateless);
        overlay_opt(&mut self.buffer, &upper.buffer);
    }
}

impl Overlay for MultiorchSpec {
    fn overlay(&mut self, upper: &Self) {
        self.stateless.overlay(&upper.stateless);
        replace(&mut self.placement, &upper.placement);
        replace_list(&mut self.cells, &upper.cells);
        replace(
            &mut self.leader_failover_grace_period_base,
            &upper.leader_failover_grace_period_base,
        );
        replace(
            &mut self.leader_failover_grace_period_max_jitter,
            &upper.leader_failover_grace_period_max_jitter,
        );
    }
}

impl Overlay for StorageSpec {
    fn overlay(&mut self, upper: &Self) {
        replace(&mut self.size, &upper.size);
        replace(&mut self.class, &upper.class);
        replace_list(&mut self.access_modes, &upper.access_modes);
    }
}

impl Overlay for ContainerConfig {
    fn overlay(&mut self, upper: &Self) {
        replace(&mut self.resources, &upper.resources);
        replace(&mut self.run_as_user, &upper.run_as_user);
        replace(&mut self.run_as_group, &upper.run_as_group);
    }
}

impl Overlay for PvcDeletionPolicy {
    fn overlay(&mut self, upper: &Self) {
        replace(&mut self.when_deleted, &upper.when_deleted);
        replace(&mut self.when_scaled, &upper.when_scaled);
    }
}

impl Overlay for PoolSpec {
    fn overlay(&mut self, upper: &Self) {
        replace(&mut self.type_, &upper.type_);
        replace_list(&mut self.cells, &upper.cells);
        replace(&mut self.replicas_per_cell, &upper.replicas_per_cell);
        overlay_opt(&mut self.storage, &upper.storage);
        replace(&mut self.auto_grow, &upper.auto_grow);
        overlay_opt(&mut self.postgres, &upper.postgres);
        overlay_opt(&mut self.multipooler, &upper.multipooler);
        replace(&mut self.affinity, &upper.affinity);
        replace_list(&mut self.tolerations, &upper.tolerations);
        replace(&mut self.fs_group, &upper.fs_group);
        overlay_opt(&mut self.pvc_deletion_policy, &upper.pvc_deletion_policy);
    }
}

/// Pools rule: per pool name; a name only in the upper level adds a pool.
pub fn merge_pools(base: &mut Pools, upper: &Pools) {
    for (name, pool) in upper {
        match base.get_mut(name) {
            Some(existing) => existing.overlay(pool),
            None => {
                base.insert(name.clone(), pool.clone());
            }
        }
    }
}

impl Overlay for EtcdSpec {
    fn overlay(&mut self, upper: &Self) {
        replace(&mut self.image, &upper.image);
        replace(&mut self.replicas, &upper.replicas);
        overlay_opt(&mut self.storage, &upper.storage);
        replace(&mut self.resources, &upper.resources);
        replace(&mut self.root_path, &upper.root_path);
        overlay_opt(&mut self.pvc_deletion_policy, &upper.pvc_deletion_policy);
    }
}

impl Overlay for FilesystemBackupConfig {
    fn overlay(&mut self, upper: &Self) {
        replace(&mut self.path, &upper.path);
        overlay_opt(&mut self.storage, &upper.storage);
    }
}

impl Overlay for S3BackupConfig {
    fn overlay(&mut self, upper: &Self) {
        if !upper.bucket.is_empty() {
            self.bucket.clone_from(&upper.bucket);
        }
        if !upper.region.is_empty() {
            self.region.clone_from(&upper.region);
        }
        replace(&mut self.endpoint, &upper.endpoint);
        replace(&mut self.key_prefix, &upper.key_prefix);
        self.use_env_credentials = upper.use_env_credentials;
        replace(&mut self.credentials_secret, &upper.credentials_secret);
        replace(&mut self.service_account_name, &upper.service_account_name);
    }
}

impl Overlay for BackupConfig {
    fn overlay(&mut self, upper: &Self) {
        if upper.type_ != self.type_ {
            *self = upper.clone();
            return;
        }
        overlay_opt(&mut self.filesystem, &upper.filesystem);
        overlay_opt(&mut self.s3, &upper.s3);
        replace(&mut self.pgbackrest_tls, &upper.pgbackrest_tls);
        replace(&mut self.encryption, &upper.encryption);
        replace(&mut self.schedule, &upper.schedule);
        replace(&mut self.recovery, &upper.recovery);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1alpha1::{BackupType, PoolName, PvcRetentionPolicyType};
    use k8s_openapi::api::core::v1::{ResourceRequirements, Toleration};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn req(cpu: &str) -> ResourceRequirements {
        ResourceRequirements {
            requests: Some(BTreeMap::from([("cpu".into(), Quantity(cpu.into()))])),
            ..Default::default()
        }
    }

    #[test]
    fn scalars_replace_only_when_set() {
        let mut base = StatelessSpec {
            replicas: Some(2),
            ..Default::default()
        };
        base.overlay(&StatelessSpec::default());
        assert_eq!(base.replicas, Some(2));
        base.overlay(&StatelessSpec {
            replicas: Some(5),
            ..Default::default()
        });
        assert_eq!(base.replicas, Some(5));
    }

    #[test]
    fn maps_merge_per_key_upper_wins() {
        let mut base = StatelessSpec {
            pod_labels: BTreeMap::from([("a".into(), "1".into()), ("b".into(), "1".into())]),
            ..Default::default()
        };
        base.overlay(&StatelessSpec {
            pod_labels: BTreeMap::from([("b".into(), "2".into()), ("c".into(), "2".into())]),
            ..Default::default()
        });
        assert_eq!(
            base.pod_labels,
            BTreeMap::from([
                ("a".into(), "1".into()),
                ("b".into(), "2".into()),
                ("c".into(), "2".into())
            ])
        );
    }

    #[test]
    fn resource_blocks_replace_whole() {
        let mut base = StatelessSpec {
            resources: Some(ResourceRequirements {
                limits: Some(BTreeMap::from([("memory".into(), Quantity("1Gi".into()))])),
                ..req("1")
            }),
            ..Default::default()
        };
        base.overlay(&StatelessSpec {
            resources: Some(req("2")),
            ..Default::default()
        });
        assert_eq!(
            base.resources,
            Some(req("2")),
            "template limits do not survive"
        );
    }

    #[test]
    fn lists_replace_when_non_empty() {
        let tol = |k: &str| Toleration {
            key: Some(k.into()),
            ..Default::default()
        };
        let mut base = PoolSpec {
            cells: vec![crate::v1alpha1::CellName::new("a")],
            tolerations: vec![tol("x")],
            ..Default::default()
        };
        base.overlay(&PoolSpec {
            tolerations: vec![tol("y"), tol("z")],
            ..Default::default()
        });
        assert_eq!(base.cells.len(), 1, "empty upper list keeps the base");
        assert_eq!(base.tolerations, vec![tol("y"), tol("z")]);
    }

    #[test]
    fn nested_structs_merge_per_field() {
        let mut base = PoolSpec {
            storage: Some(StorageSpec {
                size: Some("10Gi".into()),
                class: Some("fast".into()),
                ..Default::default()
            }),
            pvc_deletion_policy: Some(PvcDeletionPolicy {
                when_deleted: Some(PvcRetentionPolicyType::Delete),
                when_scaled: None,
            }),
            ..Default::default()
        };
        base.overlay(&PoolSpec {
            storage: Some(StorageSpec {
                size: Some("20Gi".into()),
                ..Default::default()
            }),
            pvc_deletion_policy: Some(PvcDeletionPolicy {
                when_deleted: None,
                when_scaled: Some(PvcRetentionPolicyType::Retain),
            }),
            ..Default::default()
        });
        let storage = base.storage.unwrap();
        assert_eq!(storage.size.as_deref(), Some("20Gi"));
        assert_eq!(storage.class.as_deref(), Some("fast"));
        let pvc = base.pvc_deletion_policy.unwrap();
        assert_eq!(pvc.when_deleted, Some(PvcRetentionPolicyType::Delete));
        assert_eq!(pvc.when_scaled, Some(PvcRetentionPolicyType::Retain));
    }

    #[test]
    fn pools_merge_per_name_and_add_new_ones() {
        let mut base = BTreeMap::from([(
            PoolName::new("main"),
            Box::new(PoolSpec {
                replicas_per_cell: Some(3),
                fs_group: Some(999),
                ..Default::default()
            }),
        )]);
        let upper = BTreeMap::from([
            (
                PoolName::new("main"),
                Box::new(PoolSpec {
                    replicas_per_cell: Some(5),
                    ..Default::default()
                }),
            ),
            (PoolName::new("extra"), Box::default()),
        ]);
        merge_pools(&mut base, &upper);
        assert_eq!(base.len(), 2);
        assert_eq!(base[&PoolName::new("main")].replicas_per_cell, Some(5));
        assert_eq!(base[&PoolName::new("main")].fs_group, Some(999));
    }

    #[test]
    fn backup_of_another_type_replaces_whole() {
        let fs = BackupConfig {
            type_: BackupType::Filesystem,
            filesystem: Some(FilesystemBackupConfig {
                path: Some("/b".into()),
                storage: None,
            }),
            s3: None,
            pgbackrest_tls: None,
            encryption: None,
            schedule: None,
            recovery: None,
        };
        let s3 = BackupConfig {
            type_: BackupType::S3,
            filesystem: None,
            s3: Some(S3BackupConfig {
                bucket: "bk".into(),
                region: "eu".into(),
                ..Default::default()
            }),
            pgbackrest_tls: None,
            encryption: None,
            schedule: None,
            recovery: None,
        };
        let mut merged = fs.clone();
        merged.overlay(&s3);
        assert_eq!(merged, s3);

        let mut same = fs.clone();
        same.overlay(&BackupConfig {
            filesystem: Some(FilesystemBackupConfig {
                path: None,
                storage: Some(StorageSpec {
                    size: Some("5Gi".into()),
                    ..Default::default()
                }),
            }),
            ..fs.clone()
        });
        let f = same.filesystem.unwrap();
        assert_eq!(f.path.as_deref(), Some("/b"), "same type merges per field");
        assert_eq!(f.storage.unwrap().size.as_deref(), Some("5Gi"));
    }
}
