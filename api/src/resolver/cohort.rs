//! Whether a shard's consensus cohort (every pool pod of the shard) survives losing any one
//! member: the rule behind the default pool shape and the webhook's warning about a shard that
//! cannot lose a pool pod.
//!
//! It models Multigres's election after a loss (`go/common/consensus/durability.go`
//! `CheckSufficientRecruitment`, and the `CohortSurvivesAnyMemberLoss` gate of Multigres pull
//! request 1349, which refuses to bootstrap a cohort that fails it): with one member gone, the
//! others must be a strict majority of the cohort, the lost member alone must not satisfy the
//! durability policy (else the old rule is not revoked), and the others must satisfy it, so a new
//! primary can be elected and acknowledge commits. A shard that fails it stops writing when one
//! pod restarts or is drained, and a drain of its node never completes.

/// A durability policy as Multigres names it: `AT_LEAST_<n>` or `MULTI_CELL_AT_LEAST_<n>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// Every commit is on `n` pods.
    AtLeast(usize),
    /// Every commit is on pods of `n` cells.
    MultiCellAtLeast(usize),
}

impl Durability {
    /// The policy `name` means, or `None` for a name Multigres does not know.
    pub fn parse(name: &str) -> Option<Self> {
        if let Some(n) = name.strip_prefix("MULTI_CELL_AT_LEAST_") {
            n.parse().ok().map(Self::MultiCellAtLeast)
        } else {
            name.strip_prefix("AT_LEAST_")
                .and_then(|n| n.parse().ok())
                .map(Self::AtLeast)
        }
    }

    /// Whether pods placed `pods_per_cell` (one count per cell) can acknowledge a commit.
    pub fn satisfied_by(self, pods_per_cell: &[usize]) -> bool {
        match self {
            Self::AtLeast(n) => pods_per_cell.iter().sum::<usize>() >= n,
            Self::MultiCellAtLeast(n) => pods_per_cell.iter().filter(|&&p| p > 0).count() >= n,
        }
    }
}

/// Whether a cohort of `pods_per_cell` (pool pods of the shard, counted per cell) keeps electing
/// a primary and accepting writes under `policy` after losing any one of its pods. Pods of one
/// cell are interchangeable here, so losing one pod of each cell covers every case.
pub fn survives_any_pod_loss(policy: Durability, pods_per_cell: &[usize]) -> bool {
    let total: usize = pods_per_cell.iter().sum();
    if total == 0 {
        return false;
    }
    let majority = total / 2 + 1;
    let left = total - 1;
    (0..pods_per_cell.len())
        .filter(|&cell| pods_per_cell[cell] > 0)
        .all(|cell| {
            let mut rest = pods_per_cell.to_vec();
            rest[cell] -= 1;
            let mut lost = vec![0; pods_per_cell.len()];
            lost[cell] = 1;
            left >= majority && !policy.satisfied_by(&lost) && policy.satisfied_by(&rest)
        })
}

/// Pods per cell of a pool that names none: the fewest with which the pool alone survives the
/// loss of any one pod under every durability policy it can satisfy (3 in one cell, 2 per cell
/// in two, 1 per cell in three or more; see the tests). Multigres's AT_LEAST_2 and
/// MULTI_CELL_AT_LEAST_2 need the same shape, so the default does not depend on the policy.
pub fn pool_replicas_per_cell(cells: usize) -> i32 {
    match cells {
        0 | 1 => 3,
        2 => 2,
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resolver::defaults::DURABILITY_POLICIES;

    const AT_LEAST_2: Durability = Durability::AtLeast(2);
    const MULTI_CELL_AT_LEAST_2: Durability = Durability::MultiCellAtLeast(2);

    #[test]
    fn policies_parse_as_multigres_names_them() {
        assert_eq!(Durability::parse("AT_LEAST_2"), Some(AT_LEAST_2));
        assert_eq!(
            Durability::parse("MULTI_CELL_AT_LEAST_3"),
            Some(Durability::MultiCellAtLeast(3))
        );
        assert_eq!(Durability::parse("AT_LEAST_"), None);
        assert_eq!(Durability::parse("ANY_2"), None);
        for name in DURABILITY_POLICIES {
            assert!(Durability::parse(name).is_some(), "{name}");
        }
    }

    #[test]
    fn two_pods_cannot_lose_one_and_three_can() {
        assert!(!survives_any_pod_loss(AT_LEAST_2, &[2]));
        assert!(!survives_any_pod_loss(AT_LEAST_2, &[1, 1]));
        assert!(survives_any_pod_loss(AT_LEAST_2, &[3]));
        assert!(survives_any_pod_loss(AT_LEAST_2, &[1, 1, 1]));
        assert!(survives_any_pod_loss(AT_LEAST_2, &[2, 1]));
        assert!(!survives_any_pod_loss(AT_LEAST_2, &[1]));
        assert!(!survives_any_pod_loss(AT_LEAST_2, &[]));
        assert!(!survives_any_pod_loss(AT_LEAST_2, &[0, 0]));
    }

    #[test]
    fn multi_cell_needs_two_cells_left_after_the_loss() {
        assert!(!survives_any_pod_loss(MULTI_CELL_AT_LEAST_2, &[3]));
        assert!(!survives_any_pod_loss(MULTI_CELL_AT_LEAST_2, &[1, 1]));
        assert!(
            !survives_any_pod_loss(MULTI_CELL_AT_LEAST_2, &[2, 1]),
            "losing the only pod of the second cell leaves one cell"
        );
        assert!(survives_any_pod_loss(MULTI_CELL_AT_LEAST_2, &[2, 2]));
        assert!(survives_any_pod_loss(MULTI_CELL_AT_LEAST_2, &[1, 1, 1]));
        assert!(survives_any_pod_loss(MULTI_CELL_AT_LEAST_2, &[2, 2, 0]));
    }

    #[test]
    fn a_majority_must_remain_even_when_the_policy_is_met() {
        // AT_LEAST_1: any pod acknowledges, but one lost member of two leaves no majority,
        // and a lost member that satisfies the policy alone is never revoked.
        assert!(!survives_any_pod_loss(Durability::AtLeast(1), &[2]));
        assert!(!survives_any_pod_loss(Durability::AtLeast(1), &[3]));
        // AT_LEAST_3 needs 4 pods: 3 remain, a majority of 4.
        assert!(!survives_any_pod_loss(Durability::AtLeast(3), &[3]));
        assert!(survives_any_pod_loss(Durability::AtLeast(3), &[4]));
    }

    /// The default shape is the smallest that survives under every policy the pool can
    /// satisfy at all (a MULTI_CELL_ policy needs pods in at least 2 cells).
    #[test]
    fn the_default_shape_is_the_smallest_that_survives_one_loss() {
        for cells in 1..=8 {
            let policies: Vec<Durability> = DURABILITY_POLICIES
                .iter()
                .filter_map(|p| Durability::parse(p))
                .filter(|p| p.satisfied_by(&vec![3; cells]))
                .collect();
            let survives = |per_cell: usize| {
                policies
                    .iter()
                    .all(|&p| survives_any_pod_loss(p, &vec![per_cell; cells]))
            };
            let default = usize::try_from(pool_replicas_per_cell(cells)).unwrap();
            assert!(survives(default), "{cells} cells x {default}");
            assert!(!survives(default - 1), "{cells} cells x {}", default - 1);
        }
        assert_eq!(pool_replicas_per_cell(1), 3);
        assert_eq!(pool_replicas_per_cell(2), 2);
        assert_eq!(pool_replicas_per_cell(3), 1);
    }
}
