//! Confirmations of changes that delete data: annotations on the MultigresCluster, each naming
//! what the owner agrees to lose (docs/operations.md, "Changes that delete data").
//!
//! One style for all of them: `multigres.com/confirm-delete-<what>: "<name>[,<name>...]"`. The
//! value names the objects, so a confirmation copied from another cluster, or written for an
//! earlier change, never confirms a different deletion. Without the annotation the webhook
//! refuses the change, and the operator, should the webhook have been bypassed, deletes nothing
//! and says what waits for confirmation.

use std::collections::BTreeMap;

/// Confirms deleting managed TopoServers (by object name) when the global topology or a cell's
/// local one stops being a managed etcd: their etcd data goes, and their volumes too under
/// `pvcDeletionPolicy.whenDeleted: Delete`.
pub const DELETE_TOPOLOGY: &str = "multigres.com/confirm-delete-topology";

/// Confirms deleting TableGroups (by object name) whose table group left the spec: their
/// Shards and pool StatefulSets go, and the volumes too under `whenDeleted: Delete`.
pub const DELETE_TABLEGROUPS: &str = "multigres.com/confirm-delete-tablegroups";

/// Confirms that the filesystem backup volumes of the cluster named in the value go with the
/// cluster under `whenDeleted: Delete`. Without it they are kept when the cluster is deleted.
/// The operator copies it onto the cluster's TableGroups and Shards.
pub const DELETE_BACKUPS: &str = "multigres.com/confirm-delete-backups";

/// Whether the annotation `key` of `annotations` names `name` in its comma-separated list.
pub fn confirmed(annotations: &BTreeMap<String, String>, key: &str, name: &str) -> bool {
    annotations
        .get(key)
        .is_some_and(|value| value.split(',').any(|n| n.trim() == name))
}

/// The annotation, as a user writes it, confirming the deletion of `names`.
pub fn annotation(key: &str, names: &[String]) -> String {
    format!("{key}: \"{}\"", names.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_names_listed_are_confirmed() {
        let annotations = BTreeMap::from([(
            DELETE_TOPOLOGY.to_owned(),
            "demo-global-topo, demo-zone-a-local-topo".to_owned(),
        )]);
        assert!(confirmed(&annotations, DELETE_TOPOLOGY, "demo-global-topo"));
        assert!(confirmed(
            &annotations,
            DELETE_TOPOLOGY,
            "demo-zone-a-local-topo"
        ));
        assert!(!confirmed(&annotations, DELETE_TOPOLOGY, "demo"));
        assert!(!confirmed(
            &annotations,
            DELETE_TABLEGROUPS,
            "demo-global-topo"
        ));
        assert_eq!(
            annotation(DELETE_TABLEGROUPS, &["a".into(), "b".into()]),
            "multigres.com/confirm-delete-tablegroups: \"a,b\""
        );
    }
}
