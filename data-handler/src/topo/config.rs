//! How to reach the global topology.

use std::time::Duration;

use super::paths::DEFAULT_GLOBAL_ROOT;

/// Default time to establish a connection to an etcd endpoint.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Default bound on each etcd request, including waiting for a connection.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Connection settings for the global topology (and, with the same TLS material and timeouts,
/// for cell topologies on other etcd clusters).
#[derive(Debug, Clone)]
pub struct TopoConfig {
    /// etcd endpoints: `host:port`, or `http://` / `https://` URLs.
    pub endpoints: Vec<String>,
    /// Key prefix of the global records (`--topo-global-root` of the Multigres components).
    pub global_root: String,
    /// Client TLS; `None` means plaintext.
    pub tls: Option<TlsPem>,
    /// Time allowed to establish a connection.
    pub connect_timeout: Duration,
    /// Time allowed for each etcd request; past it the call fails with a transient `Timeout`. A
    /// registration makes a few requests (read, conditional write, retries on conflict).
    pub request_timeout: Duration,
    /// The namespace of the cluster's pods, in which a one-label host of a Cell record's
    /// addresses resolves (see [`qualified`]); `None` dials them as written.
    pub namespace: Option<String>,
}

/// `endpoint` (`host:port`, or a URL) with a one-label host qualified as a Service of
/// `namespace` (`topo-etcd:2379` becomes `topo-etcd.<namespace>.svc:2379`): the cluster's pods
/// resolve such a name in their own namespace, and the data-handler, which runs in another,
/// must dial what they dial. Other hosts (with a dot, an IP, `localhost`) are kept.
pub fn qualified(endpoint: &str, namespace: &str) -> String {
    let (scheme, rest) = match endpoint.split_once("://") {
        Some((scheme, rest)) => (format!("{scheme}://"), rest),
        None => (String::new(), endpoint),
    };
    let end = rest.find([':', '/']).unwrap_or(rest.len());
    let (host, tail) = rest.split_at(end);
    if host.is_empty() || host.contains('.') || host.starts_with('[') || host == "localhost" {
        return endpoint.to_owned();
    }
    format!("{scheme}{host}.{namespace}.svc{tail}")
}

impl TopoConfig {
    /// Plaintext settings with the default root and timeouts.
    pub fn new(endpoints: Vec<String>) -> Self {
        Self {
            endpoints,
            global_root: DEFAULT_GLOBAL_ROOT.to_string(),
            tls: None,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            namespace: None,
        }
    }
}

impl TlsPem {
    /// A digest of the material a connection is made with: connections are reused while it
    /// is unchanged.
    pub fn digest(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        self.ca.hash(&mut hasher);
        self.client_cert.hash(&mut hasher);
        self.client_key.hash(&mut hasher);
        hasher.finish()
    }
}

/// How to reach a cell's own topology, whose addresses its Cell record gives.
#[derive(Debug, Clone)]
pub enum CellTls {
    /// With the global topology's settings (the cell keeps its records there).
    Global,
    /// With its own: `None` for plaintext, else this TLS material.
    Own(Option<TlsPem>),
}

/// PEM material for TLS to etcd, as found in Kubernetes Secrets (`ca.crt`, `tls.crt`, `tls.key`).
#[derive(Clone, Default)]
pub struct TlsPem {
    /// CA bundle that signed the etcd server certificates (required: system roots are not used).
    pub ca: Vec<u8>,
    /// Client certificate chain for etcd client-certificate authentication.
    pub client_cert: Option<Vec<u8>>,
    /// Private key of `client_cert`.
    pub client_key: Option<Vec<u8>>,
    /// Name to verify in the server certificate when it differs from the endpoint host.
    pub server_name: Option<String>,
}

impl std::fmt::Debug for TlsPem {
    // Keeps the private key out of logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsPem")
            .field("ca_bytes", &self.ca.len())
            .field("client_cert", &self.client_cert.is_some())
            .field(
                "client_key",
                &self.client_key.as_ref().map(|_| "<redacted>"),
            )
            .field("server_name", &self.server_name)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::qualified;

    #[test]
    fn one_label_hosts_are_qualified_in_the_namespace_and_others_kept() {
        let ns = "team-a";
        assert_eq!(
            qualified("http://topo-etcd:2379", ns),
            "http://topo-etcd.team-a.svc:2379"
        );
        assert_eq!(qualified("topo-etcd:2379", ns), "topo-etcd.team-a.svc:2379");
        assert_eq!(qualified("topo-etcd", ns), "topo-etcd.team-a.svc");
        for kept in [
            "http://etcd.other.svc:2379",
            "10.0.0.7:2379",
            "http://localhost:2379",
            "[::1]:2379",
            "etcd.example.com:2379",
        ] {
            assert_eq!(qualified(kept, ns), kept);
        }
    }
}
