//! The webhook's own PKI: a CA the API server trusts through the webhook configurations'
//! `caBundle`, and a serving certificate it signs.
//!
//! The serving certificate is renewed often (when a third of its life remains) under the same
//! CA, so the `caBundle` does not change and every replica may serve either certificate. The CA
//! lives far longer; when it is replaced, the previous CA stays in the bundle until it expires,
//! so certificates it signed keep verifying while replicas pick up the new one.

use std::net::IpAddr;
use std::time::Duration;

use rustls::pki_types::ServerName;
use time::OffsetDateTime;

use super::{CertInfo, Pair, PkiError, Template, Usage};

/// Common name of the generated CA.
const CA_COMMON_NAME: &str = "Multigres Operator Webhook CA";
/// Organization of every generated certificate.
const ORGANIZATION: &str = "Multigres Operator";

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

    /// The serving certificate's common name: its first name.
    fn common_name(&self) -> String {
        self.dns_names
            .first()
            .cloned()
            .or_else(|| self.ip_addresses.first().map(ToString::to_string))
            .unwrap_or_else(|| "multigres-webhook".to_owned())
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

/// What the serving certificate says: named for `sans`, valid for `validity` (`None` where
/// only its names matter).
fn serving<'a>(
    sans: &'a Sans,
    common_name: &'a str,
    validity: Option<(OffsetDateTime, Duration)>,
) -> Template<'a> {
    Template {
        common_name,
        organization: Some(ORGANIZATION),
        usage: Usage::Server,
        dns_names: &sans.dns_names,
        ip_addresses: &sans.ip_addresses,
        validity,
    }
}

/// A new CA and serving certificate.
pub fn generate(
    sans: &Sans,
    lifetimes: Lifetimes,
    now: OffsetDateTime,
) -> Result<Material, PkiError> {
    let ca = super::self_signed(&Template {
        common_name: CA_COMMON_NAME,
        organization: Some(ORGANIZATION),
        usage: Usage::Ca { path_len: Some(0) },
        dns_names: &[],
        ip_addresses: &[],
        validity: Some((now, lifetimes.ca)),
    })?;
    let name = sans.common_name();
    let leaf = super::issue(&ca, &serving(sans, &name, Some((now, lifetimes.serving))))?;
    Ok(Material {
        ca_bundle: ca.cert,
        ca_key: ca.key,
        cert: leaf.cert,
        key: leaf.key,
    })
}

/// A new serving certificate from the current CA.
pub fn renew_serving(
    material: &Material,
    sans: &Sans,
    lifetimes: Lifetimes,
    now: OffsetDateTime,
) -> Result<Material, PkiError> {
    let name = sans.common_name();
    let leaf = super::issue(
        &ca(material),
        &serving(sans, &name, Some((now, lifetimes.serving))),
    )?;
    Ok(Material {
        cert: leaf.cert,
        key: leaf.key,
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
        let unexpired =
            super::inspect(block).is_ok_and(|info| info.not_after > now.unix_timestamp());
        if unexpired {
            fresh.ca_bundle.push_str(block);
            fresh.ca_bundle.push('\n');
        }
    }
    Ok(fresh)
}

/// The PEM text of each certificate of a bundle, in order (kept as text, so a rotation copies
/// the previous CAs byte for byte).
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

/// Whether less than a third of the validity period is left at `now`.
fn nearly_expired(info: &CertInfo, now: OffsetDateTime) -> bool {
    let lifetime = (info.not_after - info.not_before).max(1);
    (info.not_after - now.unix_timestamp()) * 3 < lifetime
}

/// The current CA (the bundle's first certificate) and its key.
fn ca(material: &Material) -> Pair {
    Pair {
        cert: material.ca_bundle.clone(),
        key: material.ca_key.clone(),
    }
}

/// Decides whether stored material can keep serving at `now` for `sans`.
pub fn assess(material: &Material, sans: &Sans, now: OffsetDateTime) -> Assessment {
    let ca = match super::usable_ca(&ca(material)) {
        Ok(ca) => ca,
        Err(e) => return Assessment::Regenerate(format!("the CA: {e}")),
    };
    if nearly_expired(&ca, now) {
        return Assessment::RotateCa(format!(
            "the CA expires at {} (less than a third of its lifetime left)",
            ca.not_after
        ));
    }
    let leaf = Pair {
        cert: material.cert.clone(),
        key: material.key.clone(),
    };
    let name = sans.common_name();
    let due = |info: &CertInfo| {
        nearly_expired(info, now).then(|| {
            format!(
                "it expires at {} (less than a third of its lifetime left)",
                info.not_after
            )
        })
    };
    let template = serving(sans, &name, None);
    match super::leaf_problem(
        &leaf,
        &material.ca_bundle,
        &template,
        &sans.server_names(),
        due,
        now,
    ) {
        Some(why) => Assessment::RenewServing(format!("the serving certificate: {why}")),
        None => Assessment::Fresh,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki::{bundle_ders, inspect};

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
        let info = inspect(&material.cert).unwrap();
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
