//! Per-cluster certificates for the local control plane: a CA, the API server's serving
//! certificate, an admin client certificate (`O=system:masters`) and the ServiceAccount signing
//! key, plus on demand the client and serving certificates of real nodes (kubelet, kube-proxy).
//! Generated fresh for every cluster so nothing secret is committed or shared between runs.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};

/// Errors generating or writing the certificates.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("generating {what}: {source}")]
    Generate {
        what: &'static str,
        source: rcgen::Error,
    },
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

        let ca_key = key("CA key")?;
        let ca_params = ca_params();
        let ca_cert = ca_params
            .self_signed(&ca_key)
            .map_err(|source| PkiError::Generate {
                what: "CA certificate",
                source,
            })?;
        write(&pki.ca_cert, &ca_cert.pem())?;
        write(&pki.ca_key, &ca_key.serialize_pem())?;
        let issuer = Issuer::new(ca_params, ca_key);

        let server_key = key("API server key")?;
        let mut server = leaf("kube-apiserver", None, ExtendedKeyUsagePurpose::ServerAuth);
        server.subject_alt_names = ips
            .iter()
            .map(|ip| SanType::IpAddress(IpAddr::V4(*ip)))
            .collect();
        for dns in APISERVER_DNS_NAMES {
            let dns = (*dns).try_into().map_err(|source| PkiError::Generate {
                what: "API server DNS name",
                source,
            })?;
            server.subject_alt_names.push(SanType::DnsName(dns));
        }
        let server_cert =
            server
                .signed_by(&server_key, &issuer)
                .map_err(|source| PkiError::Generate {
                    what: "API server certificate",
                    source,
                })?;
        write(&pki.apiserver_cert, &server_cert.pem())?;
        write(&pki.apiserver_key, &server_key.serialize_pem())?;

        let admin_key = key("admin key")?;
        let admin = leaf(
            "admin",
            Some("system:masters"),
            ExtendedKeyUsagePurpose::ClientAuth,
        );
        let admin_cert =
            admin
                .signed_by(&admin_key, &issuer)
                .map_err(|source| PkiError::Generate {
                    what: "admin certificate",
                    source,
                })?;
        write(&pki.admin_cert, &admin_cert.pem())?;
        write(&pki.admin_key, &admin_key.serialize_pem())?;

        let sa_key = key("ServiceAccount key")?;
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
        let params = leaf(
            common_name,
            organization,
            ExtendedKeyUsagePurpose::ClientAuth,
        );
        self.issue(stem, params)
    }

    /// Issues a serving certificate for `ip` (a kubelet's node address), so the API server can
    /// verify the kubelet it calls for logs, exec and port-forward.
    pub fn serving(&self, stem: &str, ip: Ipv4Addr) -> Result<(PathBuf, PathBuf), PkiError> {
        let mut params = leaf(stem, None, ExtendedKeyUsagePurpose::ServerAuth);
        params.subject_alt_names = vec![SanType::IpAddress(IpAddr::V4(ip))];
        self.issue(stem, params)
    }

    fn issue(&self, stem: &str, params: CertificateParams) -> Result<(PathBuf, PathBuf), PkiError> {
        let read = |path: &Path| {
            std::fs::read_to_string(path).map_err(|source| PkiError::Read {
                path: path.to_path_buf(),
                source,
            })
        };
        let ca_key =
            KeyPair::from_pem(&read(&self.ca_key)?).map_err(|source| PkiError::Generate {
                what: "CA key (reloaded)",
                source,
            })?;
        // The CA's name and key are all a signer needs: its certificate is not re-read.
        let ca_params = ca_params();
        let issuer = Issuer::from_params(&ca_params, ca_key);
        let key = key("leaf key")?;
        let cert = params
            .signed_by(&key, &issuer)
            .map_err(|source| PkiError::Generate {
                what: "leaf certificate",
                source,
            })?;
        let dir = self.ca_cert.parent().unwrap_or(Path::new("."));
        let (cert_path, key_path) = (
            dir.join(format!("{stem}.crt")),
            dir.join(format!("{stem}.key")),
        );
        write(&cert_path, &cert.pem())?;
        write(&key_path, &key.serialize_pem())?;
        Ok((cert_path, key_path))
    }
}

/// The CA's name, constraints and usages (the same at generation and when issuing later).
fn ca_params() -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = name("multigres-e2e-ca", None);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

fn key(what: &'static str) -> Result<KeyPair, PkiError> {
    KeyPair::generate().map_err(|source| PkiError::Generate { what, source })
}

fn name(common_name: &str, organization: Option<&str>) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    if let Some(org) = organization {
        dn.push(DnType::OrganizationName, org);
    }
    dn
}

fn leaf(
    common_name: &str,
    organization: Option<&str>,
    usage: ExtendedKeyUsagePurpose,
) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = name(common_name, organization);
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![usage];
    params.use_authority_key_identifier_extension = true;
    params
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
    use rustls::client::WebPkiServerVerifier;
    use rustls::client::danger::ServerCertVerifier;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    use rustls::server::WebPkiClientVerifier;

    use super::*;

    fn cert(path: &Path) -> CertificateDer<'static> {
        CertificateDer::from_pem_file(path).unwrap()
    }

    fn roots(pki: &Pki) -> Arc<RootCertStore> {
        let mut roots = RootCertStore::empty();
        roots.add(cert(&pki.ca_cert)).unwrap();
        Arc::new(roots)
    }

    fn provider() -> Arc<rustls::crypto::CryptoProvider> {
        Arc::new(rustls::crypto::ring::default_provider())
    }

    fn verify_as_server(pki: &Pki, leaf: &Path, name: &str) -> Result<(), rustls::Error> {
        let verifier = WebPkiServerVerifier::builder_with_provider(roots(pki), provider())
            .build()
            .unwrap();
        let name = ServerName::try_from(name.to_string()).unwrap();
        verifier
            .verify_server_cert(&cert(leaf), &[], &name, &[], UnixTime::now())
            .map(|_| ())
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
        let verifier = WebPkiClientVerifier::builder_with_provider(roots(&pki), provider())
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
