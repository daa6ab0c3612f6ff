//! The bootstrap durability policy names, apart from [`super::records`] so that
//! [`super::error`] can list them without the two modules importing each other.

use std::fmt;

use multigres_proto::topo::{DurabilityPolicy, QuorumType};

/// The bootstrap durability policies Multigres accepts from users.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DurabilityPolicyName {
    /// Two poolers must acknowledge (a shard needs at least two initialised poolers).
    AtLeast2,
    /// Two poolers in different cells must acknowledge.
    MultiCellAtLeast2,
}

impl DurabilityPolicyName {
    /// Every accepted name, for error messages and documentation.
    pub const ALLOWED: &'static [&'static str] = &["AT_LEAST_2", "MULTI_CELL_AT_LEAST_2"];

    /// The upstream policy name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AtLeast2 => "AT_LEAST_2",
            Self::MultiCellAtLeast2 => "MULTI_CELL_AT_LEAST_2",
        }
    }

    /// The policy record: name, quorum type and count, as the Go operator writes it (no
    /// description or version, which Multigres does not route on).
    pub fn to_record(self) -> DurabilityPolicy {
        let quorum_type = match self {
            Self::AtLeast2 => QuorumType::AtLeastN,
            Self::MultiCellAtLeast2 => QuorumType::MultiCellAtLeastN,
        };
        DurabilityPolicy {
            policy_name: self.as_str().to_string(),
            quorum_type: quorum_type as i32,
            required_count: 2,
            ..Default::default()
        }
    }
}

impl fmt::Display for DurabilityPolicyName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
