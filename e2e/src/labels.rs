//! The topology labels and region the test Nodes carry, apart from [`crate::cluster`] so that
//! [`crate::nodes`] can use them without the two modules importing each other.

/// Zone label on the fake Nodes.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
/// Zone-id label on the fake Nodes (same value as the zone), which cells with a `zoneId` select.
pub const ZONE_ID_LABEL: &str = "topology.k8s.aws/zone-id";
/// Region label on the fake Nodes, which cells with a `region` select.
pub const REGION_LABEL: &str = "topology.kubernetes.io/region";
/// The one region of the fake Nodes.
pub const REGION: &str = "region-1";
