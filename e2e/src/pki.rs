//! Per-cluster certificates for the local control plane, issued with [`multigres_common::pki`]:
//! a CA, the API server's serving certificate, an admin client certificate
//! (`O=system:masters`) and the ServiceAccount signing key, plus on demand the client and
//! serving certificates of real nodes (kubelet, kube-proxy). Generated fresh for every cluster
//! so nothing secret is committed or shared between runs; they never expire during a run.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use multigres_common::pki::{self, Pair, Template, Usage};

/// Errors generating or writing the certificates.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error(transparent)]
    Generate(#[from] pki::PkiError),
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// DNS names the API server answers to, besides the loopback IP.
const APISERVER_DNS_NAMES: &[&str] = &[
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
];

/// Paths of the PEM files written by [`Pki::generate`].
#[derive(Debug, Clone)]
pub struct Pki {
    /// Self-signed CA certificate: `--client-ca-file`, `--root-ca-file`, kubeconfig CA.
    pub ca_cert: PathBuf,
    /// CA private key (kept for signing further certificates, e.g. webhook serving certs).
    pub ca_key: PathBuf,
    /// API server serving certificate (serverAuth, IP SAN 127.0.0.1 plus the kubernetes DNS names).
    pub apiserver_cert: PathBuf,
    /// API server serving key.
    pub apiserver_key: PathBuf,
    /// Admin client certificate (clientAuth, `CN=admin, O=system:masters`).
    pub admin_cert: PathBuf,
    /// Admin client key.
    pub admin_key: PathBuf,
    /// ServiceAccount token signing key (private, PKCS#8).
    pub sa_key: PathBuf,
    /// ServiceAccount token verification key (public, SPKI).
    pub sa_pub: PathBuf,
}

impl Pki {
    /// Generates every certificate and key into `dir` (which must exist), for an API server
    /// reached at `ips` (the first is where clients dial; pods also use the `kubernetes`
    /// Service's ClusterIP, so real-node clusters list it too).
    pub fn generate(dir: &Path, ips: &[Ipv4Addr]) -> Result<Pki, PkiError> {
        let pki = Pki {
            ca_cert: dir.join("ca.crt"),
            ca_key: dir.join("ca.key"),
            apiserver_cert: dir.join("apiserver.crt"),
            apiserver_key: dir.join("apiserver.key"),
            admin_cert: dir.join("admin.crt"),
            admin_key: dir.join("admin.key"),
            sa_key: dir.join("sa.key"),
            sa_pub: dir.join("sa.pub"),
        };
        let ca = pki::self_signed(&template(
            "multigres-e2e-ca",
            None,
            Usage::Ca { path_len: None },
        ))?;
        write_pair(&pki.ca_cert, &pki.ca_key, &ca)?;

        let dns_names: Vec<String> = APISERVER_DNS_NAMES
            .iter()
            .map(|n| (*n).to_owned())
            .collect();
        let ips: Vec<IpAddr> = ips.iter().copied().map(IpAddr::V4).collect();
        let server = Template {
            dns_names: &dns_names,
            ip_addresses: &ips,
            ..template("kube-apiserver", None, Usage::Server)
        };
        write_pair(
            &pki.apiserver_cert,
            &pki.apiserver_key,
            &pki::issue(&ca, &server)?,
        )?;

        let admin = template("admin", Some("system:masters"), Usage::Client);
        write_pair(&pki.admin_cert, &pki.admin_key, &pki::issue(&ca, &admin)?)?;

        let sa_key = pki::new_key()?;
        write(&pki.sa_key, &sa_key.serialize_pem())?;
        write(&pki.sa_pub, &sa_key.public_key_pem())?;
        Ok(pki)
    }

    /// Issues a client certificate for `common_name` in `organization` (for example
    /// `system:node:<node>` in `system:nodes`, which the Node authorizer recognises), written
    /// to `<dir>/<stem>.crt` and `.key` beside the CA. Returns the two paths.
    pub fn client(
        &self,
        stem: &str,
        common_name: &str,
        organization: Option<&str>,
    ) -> Result<(PathBuf, PathBuf), PkiError> {
        self.issue(stem, &template(common_name, organization, Usage::Client))
    }

    /// Issues a serving certificate for `ip` (a kubelet's node address), so the API server can
    /// verify the kubelet it calls for logs, exec and port-forward.
    pub fn serving(&self, stem: &str, ip: Ipv4Addr) -> Result<(PathBuf, PathBuf), PkiError> {
        let ips = [IpAddr::V4(ip)];
        let template = Template {
            ip_addresses: &ips,
            ..template(stem, None, Usage::Server)
        };
        self.issue(stem, &template)
    }

    fn issue(&self, stem: &str, template: &Template<'_>) -> Result<(PathBuf, PathBuf), PkiError> {
        let read = |path: &Path| {
            std::fs::read_to_string(path).map_err(|source| PkiError::Read {
                path: path.to_path_buf(),
                source,
            })
        };
        let ca = Pair {
            cert: read(&self.ca_cert)?,
            key: read(&self.ca_key)?,
        };
        let dir = self.ca_cert.parent().unwrap_or(Path::new("."));
        let (cert_path, key_path) = (
            dir.join(format!("{stem}.crt")),
            dir.join(format!("{stem}.key")),
        );
        write_pair(&cert_path, &key_path, &pki::issue(&ca, template)?)?;
        Ok((cert_path, key_path))
    }
}

/// A certificate without SANs that never expires during a run.
fn template<'a>(common_name: &'a str, organization: Option<&'a str>, usage: Usage) -> Template<'a> {
    Template {
        common_name,
        organization,
        usage,
        dns_names: &[],
        ip_addresses: &[],
        validity: None,
    }
}

fn write_pair(cert_path: &Path, key_path: &Path, pair: &Pair) -> Result<(), PkiError> {
    write(cert_path, &pair.cert)?;
    write(key_path, &pair.key)
}

fn write(path: &Path, pem: &str) -> Result<(), PkiError> {
    std::fs::write(path, pem).map_err(|source| PkiError::Write {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rustls::RootCertStore;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    use rustls::server::WebPkiClientVerifier;
    use time::OffsetDateTime;

    use super::*;

    fn cert(path: &Path) -> CertificateDer<'static> {
        CertificateDer::from_pem_file(path).unwrap()
    }

    fn verify_as_server(pki: &Pki, leaf: &Path, name: &str) -> Result<(), pki::PkiError> {
        let name = ServerName::try_from(name.to_string()).unwrap();
        pki::verify(
            &cert(&pki.ca_cert),
            &cert(leaf),
            &[name],
            OffsetDateTime::now_utc(),
        )
    }

    #[test]
    fn serving_certificate_verifies_for_loopback_and_kubernetes_names() {
        let dir = tempfile::tempdir().unwrap();
        let pki = Pki::generate(dir.path(), &[Ipv4Addr::LOCALHOST]).unwrap();
        for name in ["127.0.0.1", "localhost", "kubernetes.default.svc"] {
            verify_as_server(&pki, &pki.apiserver_cert, name)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        assert!(verify_as_server(&pki, &pki.apiserver_cert, "127.0.0.2").is_err());
        // The admin certificate is for client auth only.
        assert!(verify_as_server(&pki, &pki.admin_cert, "127.0.0.1").is_err());
    }

    #[test]
    fn admin_certificate_verifies_as_a_client_of_the_ca() {
        let dir = tempfile::tempdir().unwrap();
        let pki = Pki::generate(dir.path(), &[Ipv4Addr::LOCALHOST]).unwrap();
        let mut roots = RootCertStore::empty();
        roots.add(cert(&pki.ca_cert)).unwrap();
        let verifier = WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            Arc::new(rustls::crypto::ring::default_provider()),
        )
        .build()
        .unwrap();
        verifier
            .verify_client_cert(&cert(&pki.admin_cert), &[], UnixTime::now())
            .unwrap();
        let other = tempfile::tempdir().unwrap();
        let other = Pki::generate(other.path(), &[Ipv4Addr::LOCALHOST]).unwrap();
        assert!(
            verifier
                .verify_client_cert(&cert(&other.admin_cert), &[], UnixTime::now())
                .is_err(),
            "a certificate from another cluster's CA was accepted"
        );
    }
}
