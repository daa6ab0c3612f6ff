//! Hierarchical PVC deletion policy: each half (`whenDeleted`, `whenScaled`) comes from the most
//! specific level that sets it, so a level that sets one half inherits the other. With no level
//! setting a half, it is Retain: data is never deleted unless the user asks.

use super::defaults;
use crate::v1alpha1::PvcDeletionPolicy;

/// Resolves a policy from `levels`, most specific first (e.g. pool, shard, table group, cluster).
pub fn resolve_pvc_policy(levels: &[Option<&PvcDeletionPolicy>]) -> PvcDeletionPolicy {
    let first =
        |half: fn(&PvcDeletionPolicy) -> Option<_>| levels.iter().flatten().find_map(|p| half(p));
    PvcDeletionPolicy {
        when_deleted: Some(first(|p| p.when_deleted).unwrap_or(defaults::PVC_WHEN_DELETED)),
        when_scaled: Some(first(|p| p.when_scaled).unwrap_or(defaults::PVC_WHEN_SCALED)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1alpha1::PvcRetentionPolicyType::{Delete, Retain};

    fn p(
        d: Option<crate::v1alpha1::PvcRetentionPolicyType>,
        s: Option<crate::v1alpha1::PvcRetentionPolicyType>,
    ) -> PvcDeletionPolicy {
        PvcDeletionPolicy {
            when_deleted: d,
            when_scaled: s,
        }
    }

    #[test]
    fn nothing_set_means_retain_retain() {
        assert_eq!(
            resolve_pvc_policy(&[None, None]),
            p(Some(Retain), Some(Retain))
        );
        assert_eq!(resolve_pvc_policy(&[]), p(Some(Retain), Some(Retain)));
    }

    #[test]
    fn most_specific_level_wins_per_half() {
        let pool = p(Some(Delete), None);
        let cluster = p(Some(Retain), Some(Delete));
        assert_eq!(
            resolve_pvc_policy(&[Some(&pool), None, Some(&cluster)]),
            p(Some(Delete), Some(Delete)),
            "whenDeleted from the pool, whenScaled inherited from the cluster"
        );
    }

    #[test]
    fn empty_policy_inherits_both_halves() {
        let empty = p(None, None);
        let tg = p(Some(Delete), Some(Retain));
        assert_eq!(resolve_pvc_policy(&[Some(&empty), Some(&tg)]), tg);
    }
}
