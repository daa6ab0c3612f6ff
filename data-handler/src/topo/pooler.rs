//! Multipooler records as read from a cell topology.

use multigres_proto::topo::{Multipooler, RoutingRole};

/// One pooler's self-registration.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolerRecord {
    /// The etcd key the record was read from.
    pub key: String,
    /// Its etcd modification revision when read: a write conditional on it changes only the
    /// record as read.
    pub revision: i64,
    /// The pooler directory name, `multipooler-<cell>-<service id>`.
    pub id: String,
    /// The decoded record.
    pub pooler: Multipooler,
}

impl PoolerRecord {
    /// Whether the pooler currently serves as its shard's primary. `routing_state.role` is what
    /// gateways route by; the deprecated `type` field is ignored.
    pub fn is_primary(&self) -> bool {
        self.pooler
            .routing_state
            .as_ref()
            .is_some_and(|state| state.role() == RoutingRole::Primary)
    }
}

#[cfg(test)]
mod tests {
    use multigres_proto::topo::{PoolerType, RoutingState};

    use super::*;

    fn record(pooler: Multipooler) -> PoolerRecord {
        PoolerRecord {
            key: "k".into(),
            revision: 0,
            id: "multipooler-z-p".into(),
            pooler,
        }
    }

    #[test]
    fn primary_is_decided_by_routing_role_only() {
        let routed = |role: RoutingRole| Multipooler {
            routing_state: Some(RoutingState {
                role: role as i32,
                rule: None,
            }),
            ..Default::default()
        };
        assert!(record(routed(RoutingRole::Primary)).is_primary());
        assert!(!record(routed(RoutingRole::Replica)).is_primary());
        #[expect(
            deprecated,
            reason = "upstream deprecated `type`; it is set to show it is ignored"
        )]
        let legacy_primary = Multipooler {
            r#type: PoolerType::Primary as i32,
            ..Default::default()
        };
        assert!(!record(legacy_primary).is_primary());
    }
}
