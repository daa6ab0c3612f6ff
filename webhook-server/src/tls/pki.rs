//! The webhook's own PKI: a CA the API server trusts through the webhook configurations'
//! `caBundle`, and a serving certificate it signs. Pure: the caller supplies the time.
//!
//! The serving certificate is renewed often (when a third of its life remains) under the same
//! CA, so the `caBundle` does not change and every replica may serve either certificate. The CA
//! lives far longer; when it is replaced, the previous CA stays in the bundle until it expires,
//! so certificates it signed keep verifying while replicas pick up the new one.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls::RootCertStore;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use time::OffsetDateTime;
use x509_parser::extensions::GeneralName;

/// Common name of the generated CA.
const CA_COMMON_NAME: &str = "Multigres Operator Webhook CA";
/// Organization of every generated certificate.
const ORGANIZATION: &str = "Multigres Operator";
/// Longest backdating of `notBefore`, against clock skew between replicas and the API server.
const MAX_BACKDATE: Duration = Duration::from_secs(3600);

/// Why certificates could not be made or read.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// rcgen refused the parameters or could not sign.
    #[error("cannot generate the {what}: {source}")]
    Generate {
        /// Which certificate or key.
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
}

/// What the serving certificate must name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sans {
    /// DNS names, e.g. `<service>.<namespace>.svc`.
    pub dns_names: Vec<String>,
    /// IP addresses, e.g. `127.0.0.1` for a webhook registered by URL on loopback.
    pub ip_addresses: Vec<IpAddr>,
}

impl Sans {
    /// The DNS names a Service is reached by from the API server, plus `extra` names or IPs.
    pub fn for_service(service: &str, namespace: &str, extra: &[String]) -> Self {
        let mut sans = Self {
            dns_names: vec![
                format!("{service}.{namespace}.svc"),
                format!("{service}.{namespace}.svc.cluster.local"),
            ],
            ip_addresses: Vec::new(),
        };
        for name in extra {
            match name.parse::<IpAddr>() {
                Ok(ip) => sans.ip_addresses.push(ip),
                Err(_) => sans.dns_names.push(name.clone()),
            }
        }
        sans.dns_names.sort();
        sans.dns_names.dedup();
        sans.ip_addresses.sort();
        sans.ip_addresses.dedup();
        sans
    }

    fn server_names(&self) -> Vec<ServerName<'static>> {
        let dns = self
            .dns_names
            .iter()
            .filter_map(|n| ServerName::try_from(n.clone()).ok());
        let ips = self.ip_addresses.iter().map(|ip| ServerName::from(*ip));
        dns.chain(ips).collect()
    }
}

/// How long generated certificates are valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lifetimes {
    /// The CA.
    pub ca: Duration,
    /// The serving certificate.
    pub serving: Duration,
}

impl Default for Lifetimes {
    /// A 10-year CA; 45-day serving certificates, so renewal (at a third of life left) happens
    /// every 30 days.
    fn default() -> Self {
        Self {
            ca: Duration::from_secs(10 * 365 * 24 * 3600),
            serving: Duration::from_secs(45 * 24 * 3600),
        }
    }
}

/// The PEM material stored in the Secret and served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Material {
    /// CA certificates for the `caBundle`: the current CA first, then previous CAs that have not
    /// expired yet.
    pub ca_bundle: String,
    /// Private key of the current CA.
    pub ca_key: String,
    /// Serving certificate.
    pub cert: String,
    /// Serving private key.
    pub key: String,
}

/// What to do with stored material.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Assessment {
    /// Keep serving it.
    Fresh,
    /// Issue a new serving certificate from the same CA.
    RenewServing(String),
    /// Replace the CA (keeping the old one in the bundle) and issue a new serving certificate.
    RotateCa(String),
    /// Unusable: generate everything anew.
    Regenerate(String),
}

fn backdate(lifetime: Duration) -> Duration {
    (lifetime / 10).min(MAX_BACKDATE)
}

fn validity(params: &mut CertificateParams, now: OffsetDateTime, lifetime: Duration) {
    params.not_before = now - backdate(lifetime);
    params.not_after = now + lifetime;
}

fn generate_ca(now: OffsetDateTime, lifetime: Duration) -> Result<(String, KeyPair), PkiError> {
    let key = KeyPair::generate().map_err(|source| PkiError::Generate {
        what: "CA key",
        source,
    })?;
    let mut params = CertificateParams::default();
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, CA_COMMON_NAME);
    name.push(DnType::OrganizationName, ORGANIZATION);
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    validity(&mut params, now, lifetime);
    let cert = params
        .self_signed(&key)
        .map_err(|source| PkiError::Generate {
            what: "CA certificate",
            source,
        })?;
    Ok((cert.pem(), key))
}

fn generate_serving(
    ca_cert: &str,
    ca_key: &KeyPair,
    sans: &Sans,
    now: OffsetDateTime,
    lifetime: Duration,
) -> Result<(String, String), PkiError> {
    let issuer =
        Issuer::from_ca_cert_pem(ca_cert, ca_key).map_err(|source| PkiError::Generate {
            what: "issuer from the CA certificate",
            source,
        })?;
    let key = KeyPair::generate().map_err(|source| PkiError::Generate {
        what: "serving key",
        source,
    })?;
    let mut params = CertificateParams::default();
    let mut name = DistinguishedName::new();
    let common_name = sans
        .dns_names
        .first()
        .cloned()
        .or_else(|| sans.ip_addresses.first().map(ToString::to_string))
        .unwrap_or_else(|| "multigres-webhook".to_owned());
    name.push(DnType::CommonName, common_name);
    name.push(DnType::OrganizationName, ORGANIZATION);
    params.distinguished_name = name;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    for dns in &sans.dns_names {
        let dns = dns
            .clone()
            .try_into()
            .map_err(|source| PkiError::Generate {
                what: "DNS name",
                source,
            })?;
        params.subject_alt_names.push(SanType::DnsName(dns));
    }
    params
        .subject_alt_names
        .extend(sans.ip_addresses.iter().copied().map(SanType::IpAddress));
    validity(&mut params, now, lifetime);
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(|source| PkiError::Generate {
            what: "serving certificate",
            source,
        })?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// A new CA and serving certificate.
pub fn generate(
    sans: &Sans,
    lifetimes: Lifetimes,
    now: OffsetDateTime,
) -> Result<Material, PkiError> {
    let (ca_cert, ca_key) = generate_ca(now, lifetimes.ca)?;
    let (cert, key) = generate_serving(&ca_cert, &ca_key, sans, now, lifetimes.serving)?;
    Ok(Material {
        ca_bundle: ca_cert,
        ca_key: ca_key.serialize_pem(),
        cert,
        key,
    })
}

/// A new serving certificate from the current CA.
pub fn renew_serving(
    material: &Material,
    sans: &Sans,
    lifetimes: Lifetimes,
    now: OffsetDateTime,
) -> Result<Material, PkiError> {
    let ca_key = KeyPair::from_pem(&material.ca_key).map_err(|e| PkiError::Parse {
        what: "CA key",
        detail: e.to_string(),
    })?;
    let ca_cert = current_ca_pem(&material.ca_bundle)?;
    let (cert, key) = generate_serving(ca_cert, &ca_key, sans, now, lifetimes.serving)?;
    Ok(Material {
        cert,
        key,
        ..material.clone()
    })
}

/// A new CA and serving certificate; previous CAs still valid at `now` stay in the bundle.
pub fn rotate_ca(
    material: &Material,
    sans: &Sans,
    lifetimes: Lifetimes,
    now: OffsetDateTime,
) -> Result<Material, PkiError> {
    let mut fresh = generate(sans, lifetimes, now)?;
    for block in pem_certificates(&material.ca_bundle) {
        let unexpired = bundle_ders(block)
            .ok()
            .and_then(|ders| CertInfo::parse(ders.first()?).ok())
            .is_some_and(|info| info.not_after > now.unix_timestamp());
        if unexpired {
            fresh.ca_bundle.push_str(block);
            fresh.ca_bundle.push('\n');
        }
    }
    Ok(fresh)
}

/// The PEM text of each certificate of a bundle, in order.
fn pem_certificates(bundle: &str) -> Vec<&str> {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let mut blocks = Vec::new();
    let mut rest = bundle;
    while let Some(start) = rest.find(BEGIN) {
        let Some(len) = rest[start..].find(END) else {
            break;
        };
        let end = start + len + END.len();
        blocks.push(&rest[start..end]);
        rest = &rest[end..];
    }
    blocks
}

/// Every certificate of a PEM bundle, in order.
pub fn bundle_ders(bundle: &str) -> Result<Vec<CertificateDer<'static>>, PkiError> {
    CertificateDer::pem_slice_iter(bundle.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| PkiError::Parse {
            what: "CA bundle",
            detail: e.to_string(),
        })
}

fn current_ca_pem(bundle: &str) -> Result<&str, PkiError> {
    pem_certificates(bundle)
        .first()
        .copied()
        .ok_or_else(|| PkiError::Parse {
            what: "CA bundle",
            detail: "no certificate".to_owned(),
        })
}

/// The serving certificate chain and key, as rustls loads them.
pub fn serving_chain(
    cert: &str,
    key: &str,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), PkiError> {
    let chain = CertificateDer::pem_slice_iter(cert.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| PkiError::Parse {
            what: "serving certificate",
            detail: e.to_string(),
        })?;
    if chain.is_empty() {
        return Err(PkiError::Parse {
            what: "serving certificate",
            detail: "no certificate".to_owned(),
        });
    }
    let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).map_err(|e| PkiError::Parse {
        what: "serving key",
        detail: e.to_string(),
    })?;
    Ok((chain, key))
}

/// What the lifecycle needs to know about a certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertInfo {
    /// Start of validity, Unix seconds.
    pub not_before: i64,
    /// End of validity, Unix seconds.
    pub not_after: i64,
    /// DNS SANs, sorted.
    pub dns_names: Vec<String>,
    /// IP SANs, sorted.
    pub ip_addresses: Vec<IpAddr>,
}

impl CertInfo {
    /// Reads validity and SANs from a DER certificate.
    pub fn parse(der: &CertificateDer<'_>) -> Result<Self, PkiError> {
        let parse_error = |detail: String| PkiError::Parse {
            what: "certificate",
            detail,
        };
        let (_, cert) =
            x509_parser::parse_x509_certificate(der).map_err(|e| parse_error(e.to_string()))?;
        let mut info = Self {
            not_before: cert.validity().not_before.timestamp(),
            not_after: cert.validity().not_after.timestamp(),
            dns_names: Vec::new(),
            ip_addresses: Vec::new(),
        };
        if let Some(san) = cert
            .subject_alternative_name()
            .map_err(|e| parse_error(e.to_string()))?
        {
            for name in &san.value.general_names {
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
        }
        info.dns_names.sort();
        info.ip_addresses.sort();
        Ok(info)
    }

    /// Whether less than a third of the validity period is left at `now`.
    fn nearly_expired(&self, now: i64) -> bool {
        let lifetime = (self.not_after - self.not_before).max(1);
        (self.not_after - now) * 3 < lifetime
    }
}

/// Decides whether stored material can keep serving at `now` for `sans`.
pub fn assess(material: &Material, sans: &Sans, now: OffsetDateTime) -> Assessment {
    let now_secs = now.unix_timestamp();
    let cas = match bundle_ders(&material.ca_bundle) {
        Ok(cas) if !cas.is_empty() => cas,
        Ok(_) => return Assessment::Regenerate("the CA bundle holds no certificate".into()),
        Err(e) => return Assessment::Regenerate(e.to_string()),
    };
    let ca = match CertInfo::parse(&cas[0]) {
        Ok(ca) => ca,
        Err(e) => return Assessment::Regenerate(format!("the CA: {e}")),
    };
    if let Err(e) = KeyPair::from_pem(&material.ca_key) {
        return Assessment::Regenerate(format!("the CA key does not parse: {e}"));
    }
    if ca.nearly_expired(now_secs) {
        return Assessment::RotateCa(format!(
            "the CA expires at {} (less than a third of its lifetime left)",
            ca.not_after
        ));
    }
    let (chain, _) = match serving_chain(&material.cert, &material.key) {
        Ok(parsed) => parsed,
        Err(e) => return Assessment::RenewServing(e.to_string()),
    };
    let serving = match CertInfo::parse(&chain[0]) {
        Ok(info) => info,
        Err(e) => return Assessment::RenewServing(format!("the serving certificate: {e}")),
    };
    if serving.dns_names != sans.dns_names || serving.ip_addresses != sans.ip_addresses {
        return Assessment::RenewServing(format!(
            "the serving certificate names {:?} {:?}, wanted {:?} {:?}",
            serving.dns_names, serving.ip_addresses, sans.dns_names, sans.ip_addresses
        ));
    }
    if serving.nearly_expired(now_secs) {
        return Assessment::RenewServing(format!(
            "the serving certificate expires at {} (less than a third of its lifetime left)",
            serving.not_after
        ));
    }
    if let Err(reason) = verify(&cas[0], &chain[0], sans, now) {
        return Assessment::RenewServing(reason);
    }
    if let Err(reason) = keys_match(&material.cert, &material.key) {
        return Assessment::RenewServing(reason);
    }
    Assessment::Fresh
}

/// Verifies the serving certificate against the current CA for every SAN, as a TLS client would.
fn verify(
    ca: &CertificateDer<'static>,
    cert: &CertificateDer<'static>,
    sans: &Sans,
    now: OffsetDateTime,
) -> Result<(), String> {
    let mut roots = RootCertStore::empty();
    roots
        .add(ca.clone())
        .map_err(|e| format!("the CA is not usable as a trust anchor: {e}"))?;
    let verifier = WebPkiServerVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::new(rustls::crypto::ring::default_provider()),
    )
    .build()
    .map_err(|e| format!("cannot build a verifier: {e}"))?;
    let at = UnixTime::since_unix_epoch(Duration::from_secs(
        u64::try_from(now.unix_timestamp()).unwrap_or_default(),
    ));
    for name in sans.server_names() {
        verifier
            .verify_server_cert(cert, &[], &name, &[], at)
            .map_err(|e| format!("the serving certificate does not verify for {name:?}: {e}"))?;
    }
    Ok(())
}

fn keys_match(cert: &str, key: &str) -> Result<(), String> {
    let (chain, key) = serving_chain(cert, key).map_err(|e| e.to_string())?;
    rustls::sign::CertifiedKey::from_der(chain, key, &rustls::crypto::ring::default_provider())
        .map(|_| ())
        .map_err(|e| format!("the serving key does not match its certificate: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sans() -> Sans {
        Sans::for_service(
            "hooks",
            "ops",
            &["127.0.0.1".into(), "extra.example".into()],
        )
    }

    fn at(secs: i64) -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(1_800_000_000 + secs).unwrap()
    }

    const LIFETIMES: Lifetimes = Lifetimes {
        ca: Duration::from_secs(9000),
        serving: Duration::from_secs(900),
    };

    #[test]
    fn service_sans() {
        let sans = sans();
        assert_eq!(
            sans.dns_names,
            [
                "extra.example",
                "hooks.ops.svc",
                "hooks.ops.svc.cluster.local"
            ]
        );
        assert_eq!(sans.ip_addresses, [IpAddr::from([127, 0, 0, 1])]);
    }

    #[test]
    fn generated_material_is_fresh_and_names_the_sans() {
        let material = generate(&sans(), LIFETIMES, at(0)).unwrap();
        assert_eq!(assess(&material, &sans(), at(1)), Assessment::Fresh);
        let (chain, _) = serving_chain(&material.cert, &material.key).unwrap();
        let info = CertInfo::parse(&chain[0]).unwrap();
        assert_eq!(info.dns_names, sans().dns_names);
        assert_eq!(info.ip_addresses, sans().ip_addresses);
        assert_eq!(info.not_after - info.not_before, 900 + 90);
    }

    #[test]
    fn serving_certificate_is_renewed_with_a_third_left() {
        let material = generate(&sans(), LIFETIMES, at(0)).unwrap();
        // 990 s of validity (90 s backdated): renewal once less than 330 s remain.
        assert_eq!(assess(&material, &sans(), at(560)), Assessment::Fresh);
        assert!(matches!(
            assess(&material, &sans(), at(580)),
            Assessment::RenewServing(_)
        ));
        let renewed = renew_serving(&material, &sans(), LIFETIMES, at(580)).unwrap();
        assert_eq!(renewed.ca_bundle, material.ca_bundle, "same CA");
        assert_ne!(renewed.cert, material.cert);
        assert_eq!(assess(&renewed, &sans(), at(600)), Assessment::Fresh);
    }

    #[test]
    fn changed_sans_renew_the_serving_certificate() {
        let material = generate(&sans(), LIFETIMES, at(0)).unwrap();
        let other = Sans::for_service("hooks", "other", &[]);
        assert!(matches!(
            assess(&material, &other, at(1)),
            Assessment::RenewServing(_)
        ));
    }

    #[test]
    fn ca_rotation_keeps_the_previous_ca_in_the_bundle() {
        let material = generate(&sans(), LIFETIMES, at(0)).unwrap();
        assert!(matches!(
            assess(&material, &sans(), at(6100)),
            Assessment::RotateCa(_)
        ));
        let rotated = rotate_ca(&material, &sans(), LIFETIMES, at(6100)).unwrap();
        let bundle = bundle_ders(&rotated.ca_bundle).unwrap();
        assert_eq!(bundle.len(), 2);
        assert_eq!(bundle[1], bundle_ders(&material.ca_bundle).unwrap()[0]);
        assert_eq!(pem_certificates(&rotated.ca_bundle).len(), 2);
        assert_eq!(assess(&rotated, &sans(), at(6101)), Assessment::Fresh);
        // Once the old CA has expired it is dropped at the next rotation.
        let again = rotate_ca(&rotated, &sans(), LIFETIMES, at(9100)).unwrap();
        assert_eq!(bundle_ders(&again.ca_bundle).unwrap().len(), 2);
    }

    #[test]
    fn foreign_or_corrupt_material_is_replaced() {
        let material = generate(&sans(), LIFETIMES, at(0)).unwrap();
        let other = generate(&sans(), LIFETIMES, at(0)).unwrap();
        let mixed = Material {
            cert: other.cert.clone(),
            key: other.key.clone(),
            ..material.clone()
        };
        assert!(matches!(
            assess(&mixed, &sans(), at(1)),
            Assessment::RenewServing(reason) if reason.contains("does not verify")
        ));
        let wrong_key = Material {
            key: other.key,
            ..material.clone()
        };
        assert!(matches!(
            assess(&wrong_key, &sans(), at(1)),
            Assessment::RenewServing(reason) if reason.contains("does not match")
        ));
        let corrupt = Material {
            ca_bundle: "garbage".into(),
            ..material
        };
        assert!(matches!(
            assess(&corrupt, &sans(), at(1)),
            Assessment::Regenerate(_)
        ));
    }
}
