//! Certificates the operator issues for the workloads it runs (internal mTLS between Multigres
//! processes, pgBackRest TLS between pool pods): a CA per scope and leaf certificates it signs,
//! with server and client usage. No cert-manager: the operator keeps the PEM in Secrets and
//! decides on each reconcile whether what is stored is still good, so an unchanged object
//! writes nothing and a certificate is replaced only when it must be.

use std::time::Duration;

use rustls::pki_types::ServerName;
use time::OffsetDateTime;

use super::{CertInfo, Pair, PkiError, Template, Usage};

/// Organization of every issued certificate.
pub const ORGANIZATION: &str = "Multigres";
/// A certificate with less validity left than this is replaced.
pub const RENEW_BEFORE: Duration = Duration::from_secs(30 * 24 * 3600);
/// Lifetime of a CA: long, since replacing it breaks trust until every pod has the new one.
pub const CA_LIFETIME: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// Lifetime of a leaf certificate (renewed under the same CA 30 days before it ends).
pub const LEAF_LIFETIME: Duration = Duration::from_secs(365 * 24 * 3600);

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

/// A new self-signed CA named `common_name`, valid for [`CA_LIFETIME`] from `now`.
pub fn new_ca(common_name: &str, now: OffsetDateTime) -> Result<Pair, PkiError> {
    super::self_signed(&Template {
        common_name,
        organization: Some(ORGANIZATION),
        usage: Usage::Ca { path_len: Some(0) },
        dns_names: &[],
        ip_addresses: &[],
        validity: Some((now, CA_LIFETIME)),
    })
}

/// What a leaf for `spec` says: valid for [`LEAF_LIFETIME`] from `now`, usable by a server and
/// as a client certificate (mutual TLS).
fn leaf_template(spec: &LeafSpec, now: OffsetDateTime) -> Template<'_> {
    Template {
        common_name: &spec.common_name,
        organization: Some(ORGANIZATION),
        usage: Usage::ServerAndClient,
        dns_names: &spec.dns_names,
        ip_addresses: &[],
        validity: Some((now, LEAF_LIFETIME)),
    }
}

/// A new leaf certificate for `spec`, signed by `ca` (see `leaf_template`).
pub fn issue(ca: &Pair, spec: &LeafSpec, now: OffsetDateTime) -> Result<Pair, PkiError> {
    super::issue(ca, &leaf_template(spec, now))
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
    match super::usable_ca(ca) {
        Ok(info) => expiring(&info, now).map(|e| format!("the CA: {e}")),
        Err(e) => Some(format!("the CA: {e}")),
    }
}

/// Why the stored leaf must be replaced (for `spec`, under `ca`), or `None` when it is good:
/// see [`super::leaf_problem`]; it must have at least [`RENEW_BEFORE`] left.
pub fn leaf_problem(
    leaf: &Pair,
    ca: &Pair,
    spec: &LeafSpec,
    now: OffsetDateTime,
) -> Option<String> {
    // Any concrete name proves the chain; wildcards cannot be dialled.
    let name = spec
        .dns_names
        .iter()
        .find(|n| !n.starts_with('*'))
        .unwrap_or(&spec.common_name);
    let name = match ServerName::try_from(name.as_str()) {
        Ok(name) => name,
        Err(e) => return Some(format!("bad name {name}: {e}")),
    };
    let template = leaf_template(spec, now);
    super::leaf_problem(
        leaf,
        &ca.cert,
        &template,
        &[name],
        |info| expiring(info, now),
        now,
    )
}

/// The stored CA if it is good, else a new one named `common_name`.
pub fn ensure_ca(
    stored: Option<Pair>,
    common_name: &str,
    now: OffsetDateTime,
) -> Result<(Pair, Outcome), PkiError> {
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
) -> Result<(Pair, Outcome), PkiError> {
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
    use crate::pki::inspect;

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
