//! Deterministic names for every object the operator creates, within Kubernetes length limits.
//!
//! Parts are joined with `-`. A name that fits is used as is (readable, and stable across
//! versions); one that does not is cut and given an 8-hex-digit FNV-1a hash of all its parts, so
//! two long names that share a prefix still differ and the same parts always give the same name.

/// DNS label limit: Services, label values, most object names the operator makes.
pub const MAX_DNS_LABEL: usize = 63;

/// StatefulSet limit: the controller appends `-<10 hex>` to build the `controller-revision-hash`
/// label value, which must stay within 63 characters.
pub const MAX_STATEFULSET: usize = 52;

/// Joins `parts` into a valid DNS label of at most `max` characters.
///
/// Each part is lower-cased and characters outside `[a-z0-9-]` become `-`. When the result is too
/// long it is truncated to leave room for `-<hash>`, where the hash covers the original parts.
pub fn join(parts: &[&str], max: usize) -> String {
    let cleaned: Vec<String> = parts.iter().map(|p| sanitize(p)).collect();
    let mut name = cleaned.join("-");
    if !name.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        name.insert(0, 'x');
    }
    if name.len() <= max && !name.ends_with('-') {
        return name;
    }
    let hash = hash(parts);
    let keep = max.saturating_sub(hash.len() + 1);
    let mut prefix: String = name.chars().take(keep).collect();
    while prefix.ends_with('-') {
        prefix.pop();
    }
    if prefix.is_empty() {
        hash
    } else {
        format!("{prefix}-{hash}")
    }
}

/// 8 hex digits that tell `parts` apart, for a name that must change with a value too long or
/// too free-form to put in it (e.g. a repository's address).
pub fn hash(parts: &[&str]) -> String {
    format!("{:08x}", fnv1a32(parts))
}

fn sanitize(part: &str) -> String {
    part.chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// 32-bit FNV-1a over the parts, each followed by a NUL so `["ab","c"]` and `["a","bc"]` differ.
fn fnv1a32(parts: &[&str]) -> u32 {
    let mut hash: u32 = 0x811c_9dc5;
    for part in parts {
        for byte in part.bytes().chain(std::iter::once(0)) {
            hash ^= u32::from(byte);
            hash = hash.wrapping_mul(0x0100_0193);
        }
    }
    hash
}

/// The cluster's global TopoServer (and its client Service).
pub fn global_topo_server(cluster: &str) -> String {
    join(&[cluster, "global-topo"], MAX_DNS_LABEL)
}

/// A cell's local TopoServer.
pub fn local_topo_server(cluster: &str, cell: &str) -> String {
    join(&[cluster, cell, "local-topo"], MAX_DNS_LABEL)
}

/// A Cell child.
pub fn cell(cluster: &str, cell: &str) -> String {
    join(&[cluster, cell], MAX_DNS_LABEL)
}

/// A TableGroup child.
pub fn table_group(cluster: &str, database: &str, table_group: &str) -> String {
    join(&[cluster, database, table_group], MAX_DNS_LABEL)
}

/// A Shard child.
pub fn shard(cluster: &str, database: &str, table_group: &str, shard: &str) -> String {
    join(&[cluster, database, table_group, shard], MAX_DNS_LABEL)
}

/// The cluster-wide multigateway Service in front of every cell's gateways: the one address
/// clients (and `externalGateway`) use.
pub fn cluster_multigateway(cluster: &str) -> String {
    join(&[cluster, "multigateway"], MAX_DNS_LABEL)
}

/// The cluster's gateway CA: a Secret (with its key) and a ConfigMap of the same name that
/// publishes the CA certificate alone (key `ca.crt`), for clients to verify the gateways.
pub fn gateway_ca(cluster: &str) -> String {
    join(&[cluster, "gateway-ca"], MAX_DNS_LABEL)
}

/// The Secret with the certificate and key multigateway serves to PostgreSQL clients.
pub fn gateway_tls(cluster: &str) -> String {
    join(&[cluster, "gateway-tls"], MAX_DNS_LABEL)
}

/// The cert-manager Certificate of the gateway (with `spec.issuerName`), and the Secret
/// cert-manager writes for it.
pub fn gateway_certificate(cluster: &str) -> String {
    join(&[cluster, "gateway-cert"], MAX_DNS_LABEL)
}

/// The Secret with the application role's generated password and connection settings.
pub fn application_role_secret(cluster: &str) -> String {
    join(&[cluster, "app"], MAX_DNS_LABEL)
}

/// The Secret with the generated password of postgres_exporter's monitoring role.
pub fn monitor_role_secret(cluster: &str) -> String {
    join(&[cluster, "monitor-role"], MAX_DNS_LABEL)
}

/// The Secret with the generated password of the web UI's read-only role.
pub fn web_ui_role_secret(cluster: &str) -> String {
    join(&[cluster, "web-ui-role"], MAX_DNS_LABEL)
}

/// The internal mutual-TLS identity of `process` in `cluster`: its certificate's common name
/// and the name of the Secret holding it. Multigres processes verify a peer by this name
/// (`--multipooler-grpc-server-name`).
pub fn internal_identity(process: &str, cluster: &str, namespace: &str) -> String {
    format!("{process}.{cluster}.{namespace}.multigres.internal")
}

/// The data-handler's client certificate of `cluster`'s internal CA (a Secret in the
/// cluster's namespace): how it calls the multipoolers when they require client certificates.
pub fn data_handler_client_tls(cluster: &str, namespace: &str) -> String {
    internal_identity("data-handler", cluster, namespace)
}

/// The headless peer Service of an etcd TopoServer.
pub fn topo_peer_service(topo_server: &str) -> String {
    join(&[topo_server, "peer"], MAX_DNS_LABEL)
}

/// The in-cluster client address (`host:port`) of a managed TopoServer.
pub fn topo_client_address(topo_server: &str, namespace: &str) -> String {
    format!(
        "{topo_server}.{namespace}.svc:{}",
        crate::resolver::defaults::ETCD_CLIENT_PORT
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_dns_label(s: &str) -> bool {
        !s.is_empty()
            && s.len() <= MAX_DNS_LABEL
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !s.starts_with('-')
            && !s.ends_with('-')
    }

    #[test]
    fn short_names_are_plain_joins() {
        assert_eq!(join(&["prod", "zone-a"], MAX_DNS_LABEL), "prod-zone-a");
        assert_eq!(
            shard("prod", "postgres", "default", "0-inf"),
            "prod-postgres-default-0-inf"
        );
        assert_eq!(global_topo_server("prod"), "prod-global-topo");
    }

    #[test]
    fn invalid_characters_are_replaced_and_case_folded() {
        assert_eq!(join(&["Prod_DB", "a.b"], MAX_DNS_LABEL), "prod-db-a-b");
        assert_eq!(join(&["-x"], MAX_DNS_LABEL), "x-x");
    }

    #[test]
    fn long_names_are_cut_with_a_stable_hash() {
        let cluster = "c".repeat(25);
        let db = "d".repeat(30);
        let tg = "t".repeat(25);
        let a = shard(&cluster, &db, &tg, "0-inf");
        let b = shard(&cluster, &db, &tg, "0-inf");
        assert_eq!(a, b, "same parts give the same name");
        assert_eq!(a.len(), MAX_DNS_LABEL);
        assert!(is_dns_label(&a), "{a}");
        let other = shard(&cluster, &db, &format!("{}u", &tg[..24]), "0-inf");
        assert_ne!(a, other, "names sharing a long prefix differ by hash");
        assert_eq!(&a[..40], &other[..40]);
    }

    #[test]
    fn hash_covers_part_boundaries() {
        assert_ne!(fnv1a32(&["ab", "c"]), fnv1a32(&["a", "bc"]));
        // FNV-1a 32 of the bytes "a\0", computed independently.
        assert_eq!(fnv1a32(&["a"]), 0x2b24_d044);
    }

    #[test]
    fn statefulset_limit_is_respected() {
        let n = join(
            &["x".repeat(40).as_str(), "pool-default", "zone-a"],
            MAX_STATEFULSET,
        );
        assert!(n.len() <= MAX_STATEFULSET);
        assert!(is_dns_label(&n));
    }

    #[test]
    fn cut_never_leaves_a_trailing_dash_before_the_hash() {
        for len in 50..70 {
            let part = format!("{}-{}", "a".repeat(len - 10), "b".repeat(9));
            let n = join(&[&part], MAX_DNS_LABEL);
            assert!(is_dns_label(&n), "{n}");
            assert!(!n.contains("--"), "{n}");
        }
    }
}
