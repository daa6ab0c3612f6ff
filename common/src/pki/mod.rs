//! The one PKI of the project, on rcgen (issuing), x509-parser (reading) and rustls (checking as
//! a TLS peer would). Its users differ only in policy:
//!
//! * [`workload`]: the CA and leaves of the Multigres processes (internal mTLS, pgBackRest TLS)
//!   that the resource-handler keeps in Secrets;
//! * [`webhook`]: the admission webhook's own CA and serving certificate;
//! * the e2e control plane (`multigres-e2e`), which writes its certificates to files.
//!
//! Pure: the caller supplies the time; only keys and serial numbers are random.

pub mod webhook;
pub mod workload;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use rand::RngCore;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType, SerialNumber,
};
use rustls::RootCertStore;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::sign::CertifiedKey;
use time::OffsetDateTime;
use x509_parser::extensions::GeneralName;

/// Longest backdating of `notBefore` (a tenth of the lifetime when that is shorter), against
/// clock skew between nodes, replicas and the API server.
const MAX_BACKDATE: Duration = Duration::from_secs(3600);

/// Why a certificate could not be made, read or trusted.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// rcgen refused the parameters or could not sign.
    #[error("cannot generate the {what}: {source}")]
    Generate {
        /// Which certificate, key or name.
        what: &'static str,
        /// The rcgen error.
        source: rcgen::Error,
    },
    /// PEM or DER did not parse.
    #[error("cannot read the {what}: {detail}")]
    Parse {
        /// Which certificate or key.
        what: &'static str,
        /// What was wrong.
        detail: String,
    },
    /// The private key is not the certificate's.
    #[error("the private key does not match the certificate: {0}")]
    KeyMismatch(rustls::Error),
    /// A CA was expected.
    #[error("the certificate is not a CA")]
    NotCa,
    /// A TLS client would reject the certificate.
    #[error("it does not verify against the CA for {name}: {source}")]
    Untrusted {
        /// The name it was checked for.
        name: String,
        /// The verifier's error.
        source: rustls::Error,
    },
}

fn generate_error(what: &'static str) -> impl FnOnce(rcgen::Error) -> PkiError {
    move |source| PkiError::Generate { what, source }
}

fn parse_error<E: std::fmt::Display>(what: &'static str) -> impl FnOnce(E) -> PkiError {
    move |e| PkiError::Parse {
        what,
        detail: e.to_string(),
    }
}

/// A certificate and its private key, PEM encoded, as stored in a Secret or a file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pair {
    /// The certificate (`ca.crt` or `tls.crt`).
    pub cert: String,
    /// Its private key (`ca.key` or `tls.key`).
    pub key: String,
}

/// What a certificate may be used for; the key usages follow from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Usage {
    /// A CA; `path_len` bounds the CAs below it (`Some(0)`: it signs leaves only).
    Ca {
        /// Most intermediate CAs below it, `None` for no limit.
        path_len: Option<u8>,
    },
    /// A TLS server.
    Server,
    /// A TLS client.
    Client,
    /// Both, as for mutual TLS between processes.
    ServerAndClient,
}

/// What a new certificate says about itself.
#[derive(Clone, Copy, Debug)]
pub struct Template<'a> {
    /// Subject common name.
    pub common_name: &'a str,
    /// Subject organization, if any.
    pub organization: Option<&'a str>,
    /// What it is for.
    pub usage: Usage,
    /// DNS SANs (wildcards such as `*.svc.ns.svc` allowed).
    pub dns_names: &'a [String],
    /// IP SANs.
    pub ip_addresses: &'a [IpAddr],
    /// Issued at, and valid for; `None` keeps rcgen's 1975 to 4096, for certificates that
    /// live as long as a test and are never renewed.
    pub validity: Option<(OffsetDateTime, Duration)>,
}

impl Template<'_> {
    fn params(&self) -> Result<CertificateParams, PkiError> {
        let mut params = CertificateParams::default();
        let mut name = DistinguishedName::new();
        name.push(DnType::CommonName, self.common_name);
        if let Some(organization) = self.organization {
            name.push(DnType::OrganizationName, organization);
        }
        params.distinguished_name = name;
        params.serial_number = Some(random_serial());
        if let Some((now, lifetime)) = self.validity {
            params.not_before = now - (lifetime / 10).min(MAX_BACKDATE);
            params.not_after = now + lifetime;
        }
        let purposes = match self.usage {
            Usage::Ca { path_len } => {
                params.is_ca = IsCa::Ca(path_len.map_or(
                    BasicConstraints::Unconstrained,
                    BasicConstraints::Constrained,
                ));
                params.key_usages = vec![
                    KeyUsagePurpose::KeyCertSign,
                    KeyUsagePurpose::CrlSign,
                    KeyUsagePurpose::DigitalSignature,
                ];
                return Ok(params);
            }
            Usage::Server => vec![ExtendedKeyUsagePurpose::ServerAuth],
            Usage::Client => vec![ExtendedKeyUsagePurpose::ClientAuth],
            Usage::ServerAndClient => vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        };
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = purposes;
        params.use_authority_key_identifier_extension = true;
        for dns in self.dns_names {
            let name = dns.clone().try_into().map_err(generate_error("DNS name"))?;
            params.subject_alt_names.push(SanType::DnsName(name));
        }
        params
            .subject_alt_names
            .extend(self.ip_addresses.iter().copied().map(SanType::IpAddress));
        Ok(params)
    }
}

fn random_serial() -> SerialNumber {
    let mut bytes = [0u8; 16];
    rand::rng().fill_bytes(&mut bytes);
    // A positive INTEGER with no leading zero byte.
    bytes[0] = (bytes[0] & 0x7f) | 0x40;
    SerialNumber::from_slice(&bytes)
}

/// A fresh ECDSA P-256 key, for a certificate or for signing anything else (ServiceAccount
/// tokens).
pub fn new_key() -> Result<KeyPair, PkiError> {
    KeyPair::generate().map_err(generate_error("key"))
}

/// A new self-signed certificate (a CA) for `template`, with a fresh key.
pub fn self_signed(template: &Template<'_>) -> Result<Pair, PkiError> {
    let key = new_key()?;
    let cert = template
        .params()?
        .self_signed(&key)
        .map_err(generate_error("self-signed certificate"))?;
    Ok(Pair {
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
}

/// A new certificate for `template` with a fresh key, signed by `ca` (the first certificate of
/// its PEM is the signer).
pub fn issue(ca: &Pair, template: &Template<'_>) -> Result<Pair, PkiError> {
    let ca_key = KeyPair::from_pem(&ca.key).map_err(parse_error("CA key"))?;
    let issuer = Issuer::from_ca_cert_pem(&ca.cert, ca_key)
        .map_err(generate_error("issuer from the CA certificate"))?;
    let key = new_key()?;
    let cert = template
        .params()?
        .signed_by(&key, &issuer)
        .map_err(generate_error("certificate"))?;
    Ok(Pair {
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
}

/// Every certificate of a PEM text, in order: a chain, or a CA bundle.
pub fn bundle_ders(pem: &str) -> Result<Vec<CertificateDer<'static>>, PkiError> {
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(parse_error("PEM certificates"))
}

/// The first certificate of a PEM text: the leaf of a chain, the current CA of a bundle.
pub fn first_der(pem: &str) -> Result<CertificateDer<'static>, PkiError> {
    bundle_ders(pem)?
        .into_iter()
        .next()
        .ok_or_else(|| parse_error("PEM certificates")("no certificate"))
}

/// What renewal decisions read from a certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertInfo {
    /// Subject common name.
    pub common_name: String,
    /// DNS SANs, sorted.
    pub dns_names: Vec<String>,
    /// IP SANs, sorted.
    pub ip_addresses: Vec<IpAddr>,
    /// Start of validity, Unix seconds.
    pub not_before: i64,
    /// End of validity, Unix seconds.
    pub not_after: i64,
    /// Whether it is a CA (basic constraints).
    pub is_ca: bool,
}

impl CertInfo {
    /// Reads subject, SANs, validity and CA flag of a DER certificate.
    pub fn parse(der: &CertificateDer<'_>) -> Result<Self, PkiError> {
        let (_, cert) =
            x509_parser::parse_x509_certificate(der).map_err(parse_error("certificate"))?;
        let mut info = Self {
            common_name: cert
                .subject()
                .iter_common_name()
                .next()
                .and_then(|cn| cn.as_str().ok())
                .unwrap_or_default()
                .to_owned(),
            dns_names: Vec::new(),
            ip_addresses: Vec::new(),
            not_before: cert.validity().not_before.timestamp(),
            not_after: cert.validity().not_after.timestamp(),
            is_ca: cert.is_ca(),
        };
        let san = cert
            .subject_alternative_name()
            .map_err(parse_error("certificate"))?;
        for name in san.iter().flat_map(|san| &san.value.general_names) {
            match name {
                GeneralName::DNSName(dns) => info.dns_names.push((*dns).to_owned()),
                GeneralName::IPAddress(bytes) => {
                    if let Ok(v4) = <[u8; 4]>::try_from(*bytes) {
                        info.ip_addresses.push(IpAddr::from(v4));
                    } else if let Ok(v6) = <[u8; 16]>::try_from(*bytes) {
                        info.ip_addresses.push(IpAddr::from(v6));
                    }
                }
                _ => {}
            }
        }
        info.dns_names.sort();
        info.ip_addresses.sort();
        Ok(info)
    }
}

/// Reads the first certificate of `pem` (see [`CertInfo::parse`]).
pub fn inspect(pem: &str) -> Result<CertInfo, PkiError> {
    CertInfo::parse(&first_der(pem)?)
}

/// The chain of `cert` with its private `key`, as rustls serves them; fails unless the key is
/// the leaf's.
pub fn certified_key(cert: &str, key: &str) -> Result<CertifiedKey, PkiError> {
    let chain = bundle_ders(cert)?;
    if chain.is_empty() {
        return Err(parse_error("certificate")("no PEM certificate"));
    }
    let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).map_err(parse_error("private key"))?;
    CertifiedKey::from_der(chain, key, &rustls::crypto::ring::default_provider())
        .map_err(PkiError::KeyMismatch)
}

/// Verifies `leaf` against `ca` at `now` as a TLS client would, for each of `names`.
pub fn verify(
    ca: &CertificateDer<'static>,
    leaf: &CertificateDer<'_>,
    names: &[ServerName<'_>],
    now: OffsetDateTime,
) -> Result<(), PkiError> {
    let mut roots = RootCertStore::empty();
    roots
        .add(ca.clone())
        .map_err(parse_error("CA as a trust anchor"))?;
    let verifier = WebPkiServerVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::new(rustls::crypto::ring::default_provider()),
    )
    .build()
    .map_err(parse_error("CA as a trust anchor"))?;
    let at = UnixTime::since_unix_epoch(Duration::from_secs(
        u64::try_from(now.unix_timestamp()).unwrap_or_default(),
    ));
    for name in names {
        verifier
            .verify_server_cert(leaf, &[], name, &[], at)
            .map_err(|source| PkiError::Untrusted {
                name: name.to_str().into_owned(),
                source,
            })?;
    }
    Ok(())
}

/// Reads a stored CA and checks that it can sign: it parses, is a CA and `ca.key` is its key.
/// Of a bundle, the first certificate is the CA.
pub fn usable_ca(ca: &Pair) -> Result<CertInfo, PkiError> {
    let info = inspect(&ca.cert)?;
    if !info.is_ca {
        return Err(PkiError::NotCa);
    }
    certified_key(&ca.cert, &ca.key)?;
    Ok(info)
}

/// Why a stored `leaf` must be replaced, or `None` when it is good: it must parse, match its
/// key, carry exactly `template`'s subject and SANs (sorted), not be `due` for renewal (the
/// caller's policy) and verify against the CA `ca` (PEM) for each of `names`.
pub fn leaf_problem(
    leaf: &Pair,
    ca: &str,
    template: &Template<'_>,
    names: &[ServerName<'_>],
    due: impl FnOnce(&CertInfo) -> Option<String>,
    now: OffsetDateTime,
) -> Option<String> {
    let read = certified_key(&leaf.cert, &leaf.key).and_then(|_| {
        let der = first_der(&leaf.cert)?;
        Ok((CertInfo::parse(&der)?, der))
    });
    let (info, der) = match read {
        Ok(read) => read,
        Err(e) => return Some(e.to_string()),
    };
    let wanted = (
        template.common_name,
        template.dns_names,
        template.ip_addresses,
    );
    if (
        info.common_name.as_str(),
        &info.dns_names[..],
        &info.ip_addresses[..],
    ) != wanted
    {
        return Some(format!(
            "it names {:?} {:?} {:?}, wanted {:?} {:?} {:?}",
            info.common_name, info.dns_names, info.ip_addresses, wanted.0, wanted.1, wanted.2
        ));
    }
    if let Some(why) = due(&info) {
        return Some(why);
    }
    match first_der(ca) {
        Ok(ca) => verify(&ca, &der, names, now).err().map(|e| e.to_string()),
        Err(e) => Some(format!("the CA: {e}")),
    }
}
