//! Names of the workloads this handler creates, derived from the name of the custom resource
//! that owns them, so they are stable across reconciles and fit Kubernetes' length limits.

use multigres_api::names::{MAX_DNS_LABEL, MAX_STATEFULSET, join};

/// The etcd StatefulSet of a TopoServer. Its pods are `<name>-<ordinal>`.
pub fn topo_statefulset(topo_server: &str) -> String {
    join(&[topo_server], MAX_STATEFULSET)
}

/// The client Service of a TopoServer: the TopoServer's own name, which is what
/// [`multigres_api::names::topo_client_address`] dials.
pub fn topo_client_service(topo_server: &str) -> String {
    topo_server.to_owned()
}

/// The multigateway Deployment and Service of a Cell.
pub fn multigateway(cell: &str) -> String {
    join(&[cell, "multigateway"], MAX_DNS_LABEL)
}

/// The StatefulSet (and its headless Service and PodDisruptionBudget) of one pool in one cell.
pub fn pool(shard: &str, pool: &str, cell: &str) -> String {
    join(&[shard, "pool", pool, cell], MAX_STATEFULSET)
}

/// The PodDisruptionBudget of a shard's primary pool pod.
pub fn primary_pdb(shard: &str) -> String {
    join(&[shard, "primary"], MAX_DNS_LABEL)
}

/// The multiorch Deployment and Service of a shard in one cell.
pub fn multiorch(shard: &str, cell: &str) -> String {
    join(&[shard, "multiorch", cell], MAX_DNS_LABEL)
}

/// The shared filesystem backup volume of a shard.
pub fn backup_pvc(shard: &str) -> String {
    join(&[shard, "backup"], MAX_DNS_LABEL)
}

/// The ConfigMap holding a shard's rendered postgresql.conf.
pub fn postgres_config(shard: &str) -> String {
    join(&[shard, "postgres-config"], MAX_DNS_LABEL)
}

/// The multiadmin Deployment and Service of a cluster.
pub fn multiadmin(cluster: &str) -> String {
    join(&[cluster, "multiadmin"], MAX_DNS_LABEL)
}

/// A NetworkPolicy of a cluster: `<cluster>-<part>-ingress`, `part` naming the pods it admits
/// traffic to (`pool`, `topo`, ...).
pub fn network_policy(cluster: &str, part: &str) -> String {
    join(&[cluster, part, "ingress"], MAX_DNS_LABEL)
}

/// The multiadmin-web Deployment and Service of a cluster.
pub fn multiadmin_web(cluster: &str) -> String {
    join(&[cluster, "multiadmin-web"], MAX_DNS_LABEL)
}

/// The cluster-wide multigateway Service (in the API crate: the kubectl plugin connects to it).
pub use multigres_api::names::cluster_multigateway;

/// The cluster-wide Service in front of every cell's gateways' replica-reads port.
pub fn cluster_multigateway_replica(cluster: &str) -> String {
    join(&[cluster, "multigateway-replica"], MAX_DNS_LABEL)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_names_read_naturally() {
        assert_eq!(topo_statefulset("prod-global-topo"), "prod-global-topo");
        assert_eq!(topo_client_service("prod-global-topo"), "prod-global-topo");
        assert_eq!(multigateway("prod-zone-a"), "prod-zone-a-multigateway");
        assert_eq!(
            pool("prod-postgres-default-0-inf", "main", "zone-a"),
            "prod-postgres-default-0-inf-pool-main-zone-a"
        );
        assert_eq!(
            multiorch("prod-postgres-default-0-inf", "zone-a"),
            "prod-postgres-default-0-inf-multiorch-zone-a"
        );
        assert_eq!(multiadmin("prod"), "prod-multiadmin");
        assert_eq!(
            postgres_config("prod-postgres-default-0-inf"),
            "prod-postgres-default-0-inf-postgres-config"
        );
        assert_eq!(multiadmin_web("prod"), "prod-multiadmin-web");
        assert_eq!(cluster_multigateway("prod"), "prod-multigateway");
        assert_eq!(
            cluster_multigateway_replica("prod"),
            "prod-multigateway-replica"
        );
    }

    #[test]
    fn long_names_stay_within_limits_and_apart() {
        let shard = "c".repeat(25) + "-postgres-default-0-inf";
        let a = pool(&shard, "analytics-readers", "us-east-1a");
        let b = pool(&shard, "analytics-readers", "us-east-1b");
        assert!(a.len() <= MAX_STATEFULSET, "{a}");
        assert_ne!(a, b);
        // Pod names (`<set>-<ordinal>`) must stay DNS labels for the headless Service records.
        assert!(format!("{a}-31").len() <= MAX_DNS_LABEL);
        let o = multiorch(&shard, &"z".repeat(30));
        assert!(o.len() <= MAX_DNS_LABEL, "{o}");
    }
}
