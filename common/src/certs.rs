//! Certificates the operator issues for the workloads it runs (internal mTLS between Multigres
//! processes, pgBackRest TLS between pool pods): a CA per scope and leaf certificates it signs,
//! with server and client usage. No cert-manager: the operator keeps the PEM in Secrets and
//! decides on each reconcile whether what is stored is still good, so an unchanged object
//! writes nothing and a certificate is replaced only when it must be.
//!
//! Pure: the caller supplies the time and the stored PEM.

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

/// Organization of every issued certificate.
pub const ORGANIZATION: &str = "Multigres";
/// A certificate with less validity left than this is replaced.
pub const RENEW_BEFORE: Duration = Duration::from_secs(30 * 24 * 3600);
/// Lifetime of a CA: long, since replacing it breaks trust until every pod has the new one.
pub const CA_LIFETIME: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// Lifetime of a leaf certificate (renewed under the same CA 30 days before it ends).
pub const LEAF_LIFETIME: Duration = Duration::from_secs(365 * 24 * 3600);
/// `notBefore` is backdated by this much, against clock skew between nodes.
const BACKDATE: Duration = Duration::from_secs(3600);

/// Why a certificate could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// rcgen refused the parameters or could not sign.
    #[error("cannot generate the {what}: {source}")]
    Generate {
        /// Which certificate, key or name.
        what: &'static str,
        /// The rcgen error.
        source: rcgen::Error,
    },
}

fn generate_error(what: &'static str) -> impl FnOnce(rcgen::Error) -> CertError {
    move |source| CertError::Generate { what, source }
}

/// A certificate and its private key, PEM encoded, as stored in a Secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pair {
    /// The certificate (`ca.crt` or `tls.crt`).
    pub cert: String,
    /// Its private key (`ca.key` or `tls.key`).
    pub key: String,
}

/// What a leaf certificate must say: its subject and the names it is valid for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeafSpec {
    /// Subject common name.
    pub common_name: String,
    /// DNS SANs, sorted and without duplicates (wildcards such as `*.svc.ns.svc` allowed).
    pub dns_names: Vec<String>,
}

impl LeafSpec {
    /// A spec for `common_name` valid for `dns_names` (order and duplicates do not matter).
    pub fn new(
        common_name: impl Into<String>,
        dns_names: impl IntoIterator<Item = String>,
    ) -> Self {
        let mut dns_names: Vec<String> = dns_names.into_iter().collect();
        dns_names.sort();
        dns_names.dedup();
        Self {
            common_name: common_name.into(),
            dns_names,
        }
    }
}

/// What [`ensure_ca`] and [`ensure_leaf`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The stored certificate is still good and is kept as it is.
    Kept,
    /// Nothing was stored; a new one was made.
    Created,
    /// The stored one was replaced, for the reason given.
    Replaced(String),
}

fn random_serial() -> SerialNumber {
    let mut bytes = [0u8; 16];
    rand::rng().fill_bytes(&mut bytes);
    // A positive INTEGER with no leading zero byte.
    bytes[0] = (bytes[0] & 0x7f) | 0x40;
    SerialNumber::from_slice(&bytes)
}

fn base_params(common_name: &str, now: OffsetDateTime, lifetime: Duration) -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, common_name);
    name.push(DnType::OrganizationName, ORGANIZATION);
    params.distinguished_name = name;
    params.serial_number = Some(random_serial());
    params.not_before = now - BACKDATE;
    params.not_after = now + lifetime;
    params
}

/// A new self-signed CA named `common_name`, valid for [`CA_LIFETIME`] from `now`.
pub fn new_ca(common_name: &str, now: OffsetDateTime) -> Result<Pair, CertError> {
    let key = KeyPair::generate().map_err(generate_error("CA key"))?;
    let mut params = base_params(common_name, now, CA_LIFETIME);
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let cert = params
        .self_signed(&key)
        .map_err(generate_error("CA certificate"))?;
    Ok(Pair {
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
}

/// A new leaf certificate for `spec`, signed by `ca`, valid for [`LEAF_LIFETIME`] from `now`,
/// usable by a server and as a client certificate (mutual TLS).
pub fn issue(ca: &Pair, spec: &LeafSpec, now: OffsetDateTime) -> Result<Pair, CertError> {
    let ca_key = KeyPair::from_pem(&ca.key).map_err(generate_error("CA key"))?;
    let issuer =
        Issuer::from_ca_cert_pem(&ca.cert, ca_key).map_err(generate_error("issuer from the CA"))?;
    let key = KeyPair::generate().map_err(generate_error("leaf key"))?;
    let mut params = base_params(&spec.common_name, now, LEAF_LIFETIME);
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params.use_authority_key_identifier_extension = true;
    for dns in &spec.dns_names {
        let name = dns.clone().try_into().map_err(generate_error("DNS name"))?;
        params.subject_alt_names.push(SanType::DnsName(name));
    }
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(generate_error("leaf certificate"))?;
    Ok(Pair {
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
}

/// What the renewal decision reads from a certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertInfo {
    /// Subject common name.
    pub common_name: String,
    /// DNS SANs, sorted.
    pub dns_names: Vec<String>,
    /// End of validity, Unix seconds.
    pub not_after: i64,
    /// Whether it is a CA (basic constraints).
    pub is_ca: bool,
}

/// The first certificate of a PEM text, as DER.
fn first_der(pem: &str) -> Result<CertificateDer<'static>, String> {
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .next()
        .ok_or_else(|| "no PEM certificate".to_owned())?
        .map_err(|e| format!("the PEM does not parse: {e}"))
}

/// Reads subject, SANs, expiry and CA flag of the first certificate of `pem`.
pub fn inspect(pem: &str) -> Result<CertInfo, String> {
    let der = first_der(pem)?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der)
        .map_err(|e| format!("the certificate does not parse: {e}"))?;
    let common_name = cert
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .unwrap_or_default()
        .to_owned();
    let mut dns_names = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            if let GeneralName::DNSName(dns) = name {
                dns_names.push((*dns).to_owned());
            }
        }
    }
    dns_names.sort();
    Ok(CertInfo {
        common_name,
        dns_names,
        not_after: cert.validity().not_after.timestamp(),
        is_ca: cert.is_ca(),
    })
}

/// The certificate and key parse and belong together.
fn key_matches(pair: &Pair) -> Result<(), String> {
    let cert = first_der(&pair.cert)?;
    let key = PrivateKeyDer::from_pem_slice(pair.key.as_bytes())
        .map_err(|e| format!("the private key does not parse: {e}"))?;
    CertifiedKey::from_der(vec![cert], key, &rustls::crypto::ring::default_provider())
        .map(|_| ())
        .map_err(|e| format!("the private key does not match the certificate: {e}"))
}

fn expiring(info: &CertInfo, now: OffsetDateTime) -> Option<String> {
    let left = info.not_after - now.unix_timestamp();
    (left < RENEW_BEFORE.as_secs() as i64).then(|| {
        format!(
            "it expires in {} days (renewed with less than {} days left)",
            left.max(0) / 86_400,
            RENEW_BEFORE.as_secs() / 86_400
        )
    })
}

/// Why the stored CA must be replaced, or `None` when it is good.
pub fn ca_problem(ca: &Pair, now: OffsetDateTime) -> Option<String> {
    let info = match inspect(&ca.cert) {
        Ok(info) => info,
        Err(e) => return Some(format!("the CA certificate: {e}")),
    };
    if !info.is_ca {
        return Some("the CA certificate is not a CA".to_owned());
    }
    if let Err(e) = key_matches(ca) {
        return Some(format!("the CA: {e}"));
    }
    expiring(&info, now).map(|e| format!("the CA: {e}"))
}

/// Verifies `leaf` against `ca` at `now` as a TLS client would, for one of its names.
fn verify(ca: &str, leaf: &str, name: &str, now: OffsetDateTime) -> Result<(), String> {
    let mut roots = RootCertStore::empty();
    roots
        .add(first_der(ca)?)
        .map_err(|e| format!("the CA is not usable as a trust anchor: {e}"))?;
    let verifier = WebPkiServerVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::new(rustls::crypto::ring::default_provider()),
    )
    .build()
    .map_err(|e| format!("cannot build a verifier: {e}"))?;
    let server_name =
        ServerName::try_from(name.to_owned()).map_err(|e| format!("bad name {name}: {e}"))?;
    let at = UnixTime::since_unix_epoch(Duration::from_secs(
        u64::try_from(now.unix_timestamp()).unwrap_or_default(),
    ));
    verifier
        .verify_server_cert(&first_der(leaf)?, &[], &server_name, &[], at)
        .map(|_| ())
        .map_err(|e| format!("it does not verify against the CA: {e}"))
}

/// Why the stored leaf must be replaced (for `spec`, under `ca`), or `None` when it is good:
/// it must parse, match its key, name exactly `spec`'s subject and SANs, be signed by `ca` and
/// have at least [`RENEW_BEFORE`] left.
pub fn leaf_problem(
    leaf: &Pair,
    ca: &Pair,
    spec: &LeafSpec,
    now: OffsetDateTime,
) -> Option<String> {
    let info = match inspect(&leaf.cert) {
        Ok(info) => info,
        Err(e) => return Some(e),
    };
    if let Err(e) = key_matches(leaf) {
        return Some(e);
    }
    if info.common_name != spec.common_name {
        return Some(format!(
            "its common name is {:?}, wanted {:?}",
            info.common_name, spec.common_name
        ));
    }
    if info.dns_names != spec.dns_names {
        return Some(format!(
            "it names {:?}, wanted {:?}",
            info.dns_names, spec.dns_names
        ));
    }
    if let Some(e) = expiring(&info, now) {
        return Some(e);
    }
    // Any concrete name proves the chain; wildcards cannot be dialled.
    let name = spec
        .dns_names
        .iter()
        .find(|n| !n.starts_with('*'))
        .unwrap_or(&spec.common_name);
    verify(&ca.cert, &leaf.cert, name, now).err()
}

/// The stored CA if it is good, else a new one named `common_name`.
pub fn ensure_ca(
    stored: Option<Pair>,
    common_name: &str,
    now: OffsetDateTime,
) -> Result<(Pair, Outcome), CertError> {
    match stored {
        None => Ok((new_ca(common_name, now)?, Outcome::Created)),
        Some(ca) => match ca_problem(&ca, now) {
            None => Ok((ca, Outcome::Kept)),
            Some(why) => Ok((new_ca(common_name, now)?, Outcome::Replaced(why))),
        },
    }
}

/// The stored leaf if it is good for `spec` under `ca`, else a new one.
pub fn ensure_leaf(
    stored: Option<Pair>,
    ca: &Pair,
    spec: &LeafSpec,
    now: OffsetDateTime,
) -> Result<(Pair, Outcome), CertError> {
    match stored {
        None => Ok((issue(ca, spec, now)?, Outcome::Created)),
        Some(leaf) => match leaf_problem(&leaf, ca, spec, now) {
            None => Ok((leaf, Outcome::Kept)),
            Some(why) => Ok((issue(ca, spec, now)?, Outcome::Replaced(why))),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: i64 = 86_400;

    fn at(days: i64) -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(1_800_000_000 + days * DAY).unwrap()
    }

    fn spec() -> LeafSpec {
        LeafSpec::new(
            "multipooler.prod.db.multigres.internal",
            [
                "multipooler.prod.db.multigres.internal".to_owned(),
                "*.pool-a.db.svc".to_owned(),
                "*.pool-a.db.svc".to_owned(),
            ],
        )
    }

    #[test]
    fn issued_leaves_name_the_spec_and_verify_against_their_ca() {
        let ca = new_ca("Multigres test CA", at(0)).unwrap();
        assert_eq!(ca_problem(&ca, at(0)), None);
        let leaf = issue(&ca, &spec(), at(0)).unwrap();
        let info = inspect(&leaf.cert).unwrap();
        assert_eq!(info.common_name, "multipooler.prod.db.multigres.internal");
        assert_eq!(
            info.dns_names,
            ["*.pool-a.db.svc", "multipooler.prod.db.multigres.internal"]
        );
        assert!(!info.is_ca);
        assert_eq!(info.not_after - at(0).unix_timestamp(), 365 * DAY);
        assert_eq!(leaf_problem(&leaf, &ca, &spec(), at(1)), None);
    }

    #[test]
    fn good_material_is_kept_as_it_is() {
        let (ca, outcome) = ensure_ca(None, "ca", at(0)).unwrap();
        assert_eq!(outcome, Outcome::Created);
        let (leaf, outcome) = ensure_leaf(None, &ca, &spec(), at(0)).unwrap();
        assert_eq!(outcome, Outcome::Created);
        // A later reconcile with nothing changed produces the same bytes (nothing to write).
        let (again, outcome) = ensure_ca(Some(ca.clone()), "ca", at(200)).unwrap();
        assert_eq!((again, outcome), (ca.clone(), Outcome::Kept));
        let (again, outcome) = ensure_leaf(Some(leaf.clone()), &ca, &spec(), at(200)).unwrap();
        assert_eq!((again, outcome), (leaf, Outcome::Kept));
    }

    #[test]
    fn leaves_are_renewed_thirty_days_before_they_end() {
        let ca = new_ca("ca", at(0)).unwrap();
        let leaf = issue(&ca, &spec(), at(0)).unwrap();
        assert_eq!(leaf_problem(&leaf, &ca, &spec(), at(334)), None);
        let (renewed, outcome) = ensure_leaf(Some(leaf.clone()), &ca, &spec(), at(336)).unwrap();
        assert!(
            matches!(&outcome, Outcome::Replaced(why) if why.contains("expires in 29 days")),
            "{outcome:?}"
        );
        assert_ne!(renewed, leaf);
        assert_eq!(leaf_problem(&renewed, &ca, &spec(), at(337)), None);
    }

    #[test]
    fn changed_names_or_another_signer_replace_the_leaf() {
        let ca = new_ca("ca", at(0)).unwrap();
        let leaf = issue(&ca, &spec(), at(0)).unwrap();
        let grown = LeafSpec::new(
            spec().common_name,
            spec()
                .dns_names
                .into_iter()
                .chain(["*.pool-b.db.svc".to_owned()]),
        );
        let why = leaf_problem(&leaf, &ca, &grown, at(1)).unwrap();
        assert!(why.contains("*.pool-b.db.svc"), "{why}");
        let renamed = LeafSpec::new("other", spec().dns_names);
        assert!(leaf_problem(&leaf, &ca, &renamed, at(1)).is_some());

        let other_ca = new_ca("ca", at(0)).unwrap();
        let why = leaf_problem(&leaf, &other_ca, &spec(), at(1)).unwrap();
        assert!(why.contains("does not verify"), "{why}");
        // A leaf of the new CA replaces it.
        let (fresh, outcome) = ensure_leaf(Some(leaf), &other_ca, &spec(), at(1)).unwrap();
        assert!(matches!(outcome, Outcome::Replaced(_)));
        assert_eq!(leaf_problem(&fresh, &other_ca, &spec(), at(1)), None);
    }

    #[test]
    fn mismatched_or_corrupt_material_is_replaced() {
        let ca = new_ca("ca", at(0)).unwrap();
        let a = issue(&ca, &spec(), at(0)).unwrap();
        let b = issue(&ca, &spec(), at(0)).unwrap();
        let crossed = Pair {
            cert: a.cert.clone(),
            key: b.key.clone(),
        };
        let why = leaf_problem(&crossed, &ca, &spec(), at(1)).unwrap();
        assert!(why.contains("does not match"), "{why}");
        let garbage = Pair {
            cert: "garbage".into(),
            key: a.key,
        };
        assert!(leaf_problem(&garbage, &ca, &spec(), at(1)).is_some());
        assert!(ca_problem(&garbage, at(1)).is_some());
        assert!(
            ca_problem(&b, at(1)).unwrap().contains("not a CA"),
            "a leaf is no CA"
        );
    }

    #[test]
    fn the_ca_is_replaced_thirty_days_before_it_ends() {
        let ca = new_ca("ca", at(0)).unwrap();
        let ten_years = 3650;
        assert_eq!(ca_problem(&ca, at(ten_years - 31)), None);
        let (fresh, outcome) = ensure_ca(Some(ca.clone()), "ca", at(ten_years - 29)).unwrap();
        assert!(matches!(outcome, Outcome::Replaced(ref why) if why.contains("the CA")));
        assert_ne!(fresh, ca);
        // Leaves of the old CA no longer verify, so they follow.
        let leaf = issue(&ca, &spec(), at(ten_years - 30)).unwrap();
        assert!(leaf_problem(&leaf, &fresh, &spec(), at(ten_years - 29)).is_some());
    }
}
