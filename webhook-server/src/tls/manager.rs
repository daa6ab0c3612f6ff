//! Where the serving certificate comes from, and keeping it current.
//!
//! * **Managed** (default): the CA and serving certificate live in one Secret. Every replica
//!   periodically reads it; the first to find it missing creates it (the others lose the create
//!   race and adopt the winner's), the first to find it due renews it with an optimistic
//!   concurrency check (the others see the new one on their next read). Each replica makes sure
//!   the operator's webhook configurations trust the CA bundle before a new CA is used.
//! * **Files** (cert-manager or any other issuer): `tls.crt` and `tls.key` in a directory,
//!   re-read when they change; never rotated, and the webhook configurations are left alone
//!   (cert-manager's CA injector owns their `caBundle`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::{Api, ObjectMeta, Patch};
use multigres_api::labels;
use multigres_common::apply::{self, patch_params, post_params};
use multigres_common::pki::webhook::{self as serving, Assessment, Lifetimes, Material, Sans};
use multigres_common::pki::{self, PkiError};
use multigres_common::shutdown::Shutdown;
use multigres_common::state::HandlerState;
use serde_json::json;
use time::OffsetDateTime;

use super::CertStore;

/// Secret keys of the material.
const CA_CERT_KEY: &str = "ca.crt";
const CA_KEY_KEY: &str = "ca.key";
const TLS_CERT_KEY: &str = "tls.crt";
const TLS_KEY_KEY: &str = "tls.key";

/// The binary whose field manager (`multigres-operator/webhook-server`) records these writes;
/// the same name as the binary's `HandlerSpec`, which lives in `main.rs`.
const NAME: &str = "webhook-server";

/// The field manager of every write of the managed certificate (Secret and caBundle).
fn field_manager() -> String {
    apply::field_manager(NAME)
}

/// Retry delay after a failed check, when shorter than the check interval.
const RETRY_DELAY: Duration = Duration::from_secs(5);

/// Where the serving certificate comes from.
#[derive(Debug, Clone)]
pub enum CertificateSource {
    /// `tls.crt` and `tls.key` in `dir`, re-read every `poll_interval`.
    Files {
        /// The mounted directory.
        dir: PathBuf,
        /// How often the files are checked for changes.
        poll_interval: Duration,
    },
    /// Generated and rotated by the webhook itself.
    Managed(ManagedCertificates),
}

impl CertificateSource {
    /// Files when `dir` holds both `tls.crt` and `tls.key`, else `managed`.
    pub fn detect(dir: PathBuf, poll_interval: Duration, managed: ManagedCertificates) -> Self {
        if dir.join(TLS_CERT_KEY).is_file() && dir.join(TLS_KEY_KEY).is_file() {
            Self::Files { dir, poll_interval }
        } else {
            Self::Managed(managed)
        }
    }
}

/// Settings of self-managed certificates.
#[derive(Debug, Clone)]
pub struct ManagedCertificates {
    /// Namespace of the Secret (the webhook's own).
    pub namespace: String,
    /// Name of the Secret.
    pub secret_name: String,
    /// Names the serving certificate must carry.
    pub sans: Sans,
    /// Validity of generated certificates.
    pub lifetimes: Lifetimes,
    /// How often the Secret is read (to renew, or to pick up another replica's renewal).
    pub check_interval: Duration,
    /// MutatingWebhookConfigurations whose `caBundle` this webhook keeps current.
    pub mutating_configurations: Vec<String>,
    /// ValidatingWebhookConfigurations whose `caBundle` this webhook keeps current.
    pub validating_configurations: Vec<String>,
}

/// Why a certificate check failed.
#[derive(Debug, thiserror::Error)]
pub enum CertificateError {
    /// Generating or reading certificates failed.
    #[error(transparent)]
    Pki(#[from] PkiError),
    /// The Kubernetes API refused or failed.
    #[error("{what}: {source}")]
    Kube {
        /// What was being done.
        what: String,
        /// The API error.
        source: kube::Error,
    },
    /// A certificate file could not be read.
    #[error("cannot read {path}: {source}")]
    File {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

fn kube_error(what: impl Into<String>) -> impl FnOnce(kube::Error) -> CertificateError {
    let what = what.into();
    move |source| CertificateError::Kube { what, source }
}

/// Keeps `store` serving a current certificate from `source` until `shutdown`; reports SERVING
/// on `state` once a certificate is loaded.
pub async fn run(
    source: CertificateSource,
    client: Client,
    store: Arc<CertStore>,
    state: HandlerState,
    shutdown: Shutdown,
) {
    let mut files = None;
    loop {
        let (result, interval) = match &source {
            CertificateSource::Files { dir, poll_interval } => {
                (load_files(dir, &store, &mut files).await, *poll_interval)
            }
            CertificateSource::Managed(managed) => (
                reconcile(&client, managed, &store).await,
                managed.check_interval,
            ),
        };
        let wait = match result {
            Ok(()) => interval,
            Err(error) => {
                tracing::warn!(%error, "webhook certificate check failed");
                interval.min(RETRY_DELAY)
            }
        };
        if store.is_loaded() && !state.is_serving() {
            state.set_ready(true).await;
        }
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = shutdown.wait() => return,
        }
    }
}

async fn load_files(
    dir: &std::path::Path,
    store: &CertStore,
    last: &mut Option<(Vec<u8>, Vec<u8>)>,
) -> Result<(), CertificateError> {
    let read = |name: &str| {
        let path = dir.join(name);
        async move {
            tokio::fs::read(&path)
                .await
                .map_err(|source| CertificateError::File { path, source })
        }
    };
    let cert = read(TLS_CERT_KEY).await?;
    let key = read(TLS_KEY_KEY).await?;
    if last.as_ref().is_some_and(|(c, k)| *c == cert && *k == key) {
        return Ok(());
    }
    let as_text = |bytes: &[u8], what: &'static str| {
        std::str::from_utf8(bytes)
            .map(str::to_owned)
            .map_err(|e| PkiError::Parse {
                what,
                detail: e.to_string(),
            })
    };
    // A pair caught mid-update (new certificate, old key) does not load; the next poll retries.
    if store.install(
        &as_text(&cert, "serving certificate")?,
        &as_text(&key, "serving key")?,
    )? {
        tracing::info!(dir = %dir.display(), "loaded the webhook certificate from files");
    }
    *last = Some((cert, key));
    Ok(())
}

fn material_from(secret: &Secret) -> Option<Material> {
    let data = secret.data.as_ref()?;
    let text = |key: &str| String::from_utf8(data.get(key)?.0.clone()).ok();
    Some(Material {
        ca_bundle: text(CA_CERT_KEY)?,
        ca_key: text(CA_KEY_KEY)?,
        cert: text(TLS_CERT_KEY)?,
        key: text(TLS_KEY_KEY)?,
    })
}

fn secret_for(
    managed: &ManagedCertificates,
    material: &Material,
    resource_version: Option<String>,
) -> Secret {
    let data = [
        (CA_CERT_KEY, &material.ca_bundle),
        (CA_KEY_KEY, &material.ca_key),
        (TLS_CERT_KEY, &material.cert),
        (TLS_KEY_KEY, &material.key),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), ByteString(v.as_bytes().to_vec())))
    .collect();
    Secret {
        metadata: ObjectMeta {
            name: Some(managed.secret_name.clone()),
            namespace: Some(managed.namespace.clone()),
            labels: Some(BTreeMap::from([
                (labels::MANAGED_BY.to_owned(), labels::OPERATOR.to_owned()),
                (labels::COMPONENT.to_owned(), "webhook".to_owned()),
            ])),
            resource_version,
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".to_owned()),
        data: Some(data),
        ..Default::default()
    }
}

/// One check of the managed certificate: create, adopt, renew or rotate it, load it, and make
/// sure the webhook configurations trust its CA.
pub async fn reconcile(
    client: &Client,
    managed: &ManagedCertificates,
    store: &CertStore,
) -> Result<(), CertificateError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &managed.namespace);
    let name = &managed.secret_name;
    let now = OffsetDateTime::now_utc();
    let stored = secrets.get_opt(name).await.map_err(kube_error(format!(
        "reading Secret {}/{name}",
        managed.namespace
    )))?;
    let material = match stored {
        None => {
            let material = serving::generate(&managed.sans, managed.lifetimes, now)?;
            trust(client, managed, &material.ca_bundle).await?;
            match secrets
                .create(
                    &post_params(&field_manager()),
                    &secret_for(managed, &material, None),
                )
                .await
            {
                Ok(_) => {
                    tracing::info!(secret = %name, "generated the webhook CA and certificate");
                    material
                }
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    tracing::info!(secret = %name, "another replica created the webhook certificate first; using it");
                    adopt(&secrets, managed).await?
                }
                Err(error) => {
                    return Err(kube_error(format!("creating Secret {name}"))(error));
                }
            }
        }
        Some(secret) => match next_material(material_from(&secret), managed, now)? {
            Next::Keep(current) => current,
            Next::Replace(reason, next) => {
                // Trust first: replicas switch to the new certificate as soon as the Secret
                // changes, and the API server must already accept it.
                trust(client, managed, &next.ca_bundle).await?;
                let replacement =
                    secret_for(managed, &next, secret.metadata.resource_version.clone());
                match secrets
                    .replace(name, &post_params(&field_manager()), &replacement)
                    .await
                {
                    Ok(_) => {
                        tracing::info!(secret = %name, %reason, "renewed the webhook certificate");
                        next
                    }
                    Err(kube::Error::Api(status)) if status.code == 409 => {
                        tracing::info!(secret = %name, "another replica renewed the webhook certificate first; using it");
                        adopt(&secrets, managed).await?
                    }
                    Err(error) => {
                        return Err(kube_error(format!("replacing Secret {name}"))(error));
                    }
                }
            }
        },
    };
    if store.install(&material.cert, &material.key)? {
        tracing::info!(secret = %name, "serving the webhook certificate from the Secret");
    }
    trust(client, managed, &material.ca_bundle).await
}

/// What to do with the stored material.
enum Next {
    /// Keep serving it.
    Keep(Material),
    /// Replace it, for this reason.
    Replace(String, Material),
}

fn next_material(
    current: Option<Material>,
    managed: &ManagedCertificates,
    now: OffsetDateTime,
) -> Result<Next, PkiError> {
    let (sans, lifetimes) = (&managed.sans, managed.lifetimes);
    let Some(current) = current else {
        return Ok(Next::Replace(
            "the Secret lacks some of ca.crt, ca.key, tls.crt, tls.key".to_owned(),
            serving::generate(sans, lifetimes, now)?,
        ));
    };
    Ok(match serving::assess(&current, sans, now) {
        Assessment::Fresh => Next::Keep(current),
        Assessment::RenewServing(reason) => Next::Replace(
            reason,
            serving::renew_serving(&current, sans, lifetimes, now)?,
        ),
        Assessment::RotateCa(reason) => {
            Next::Replace(reason, serving::rotate_ca(&current, sans, lifetimes, now)?)
        }
        Assessment::Regenerate(reason) => {
            Next::Replace(reason, serving::generate(sans, lifetimes, now)?)
        }
    })
}

/// The material another replica just wrote.
async fn adopt(
    secrets: &Api<Secret>,
    managed: &ManagedCertificates,
) -> Result<Material, CertificateError> {
    let name = &managed.secret_name;
    let secret = secrets
        .get(name)
        .await
        .map_err(kube_error(format!("reading Secret {name}")))?;
    material_from(&secret).ok_or_else(|| {
        CertificateError::Pki(PkiError::Parse {
            what: "webhook Secret",
            detail: format!("Secret {name} lacks some of ca.crt, ca.key, tls.crt, tls.key"),
        })
    })
}

/// Whether `existing` (a `caBundle`) already trusts every CA of `bundle`.
fn trusts(existing: Option<&ByteString>, bundle: &BTreeSet<Vec<u8>>) -> bool {
    let Some(existing) = existing.and_then(|b| std::str::from_utf8(&b.0).ok()) else {
        return false;
    };
    let Ok(ders) = pki::bundle_ders(existing) else {
        return false;
    };
    let present: BTreeSet<Vec<u8>> = ders.iter().map(|d| d.to_vec()).collect();
    bundle.is_subset(&present)
}

/// JSON patch setting `caBundle` on every webhook that does not trust `bundle` yet; each entry
/// is guarded by a test of the webhook's name, so a concurrent reordering fails the patch
/// instead of writing the wrong entry.
fn ca_bundle_patch<'a>(
    webhooks: impl Iterator<Item = (&'a str, Option<&'a ByteString>)>,
    pem: &str,
    bundle: &BTreeSet<Vec<u8>>,
) -> Vec<serde_json::Value> {
    let encoded = serde_json::to_value(ByteString(pem.as_bytes().to_vec())).unwrap_or_default();
    let mut ops = Vec::new();
    for (i, (name, current)) in webhooks.enumerate() {
        if !trusts(current, bundle) {
            ops.push(json!({"op": "test", "path": format!("/webhooks/{i}/name"), "value": name}));
            ops.push(json!({"op": "add", "path": format!("/webhooks/{i}/clientConfig/caBundle"), "value": encoded}));
        }
    }
    ops
}

/// Makes every configured webhook trust the CAs of `pem`. A configuration that does not exist
/// yet is skipped (it is picked up at the next check).
async fn trust(
    client: &Client,
    managed: &ManagedCertificates,
    pem: &str,
) -> Result<(), CertificateError> {
    let bundle: BTreeSet<Vec<u8>> = pki::bundle_ders(pem)?.iter().map(|d| d.to_vec()).collect();
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    for name in &managed.mutating_configurations {
        let Some(config) = mutating.get_opt(name).await.map_err(kube_error(format!(
            "reading MutatingWebhookConfiguration {name}"
        )))?
        else {
            tracing::debug!(%name, "MutatingWebhookConfiguration not found; caBundle not set");
            continue;
        };
        let webhooks = config.webhooks.iter().flatten();
        let ops = ca_bundle_patch(
            webhooks.map(|w| (w.name.as_str(), w.client_config.ca_bundle.as_ref())),
            pem,
            &bundle,
        );
        if !ops.is_empty() {
            patch_json(&mutating, name, ops).await?;
            tracing::info!(%name, "set caBundle on MutatingWebhookConfiguration");
        }
    }
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    for name in &managed.validating_configurations {
        let Some(config) = validating.get_opt(name).await.map_err(kube_error(format!(
            "reading ValidatingWebhookConfiguration {name}"
        )))?
        else {
            tracing::debug!(%name, "ValidatingWebhookConfiguration not found; caBundle not set");
            continue;
        };
        let webhooks = config.webhooks.iter().flatten();
        let ops = ca_bundle_patch(
            webhooks.map(|w| (w.name.as_str(), w.client_config.ca_bundle.as_ref())),
            pem,
            &bundle,
        );
        if !ops.is_empty() {
            patch_json(&validating, name, ops).await?;
            tracing::info!(%name, "set caBundle on ValidatingWebhookConfiguration");
        }
    }
    Ok(())
}

async fn patch_json<K>(
    api: &Api<K>,
    name: &str,
    ops: Vec<serde_json::Value>,
) -> Result<(), CertificateError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let patch: json_patch::Patch =
        serde_json::from_value(serde_json::Value::Array(ops)).map_err(|e| PkiError::Parse {
            what: "caBundle patch",
            detail: e.to_string(),
        })?;
    api.patch(
        name,
        &patch_params(&field_manager()),
        &Patch::Json::<()>(patch),
    )
    .await
    .map(|_| ())
    .map_err(kube_error(format!("patching caBundle of {name}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_are_recorded_under_the_webhook_server_field_manager() {
        assert_eq!(field_manager(), "multigres-operator/webhook-server");
    }

    #[test]
    fn ca_bundle_patch_touches_only_webhooks_missing_a_ca() {
        let sans = Sans::for_service("hooks", "ops", &[]);
        let lifetimes = Lifetimes::default();
        let now = OffsetDateTime::now_utc();
        let old = serving::generate(&sans, lifetimes, now).unwrap();
        let rotated = serving::rotate_ca(&old, &sans, lifetimes, now).unwrap();
        let bundle = |pem: &str| -> BTreeSet<Vec<u8>> {
            pki::bundle_ders(pem)
                .unwrap()
                .iter()
                .map(|d| d.to_vec())
                .collect()
        };
        let old_bytes = ByteString(old.ca_bundle.clone().into_bytes());
        let new_bytes = ByteString(rotated.ca_bundle.clone().into_bytes());

        let ops = ca_bundle_patch(
            [
                ("a", None),
                ("b", Some(&old_bytes)),
                ("c", Some(&new_bytes)),
            ]
            .into_iter(),
            &rotated.ca_bundle,
            &bundle(&rotated.ca_bundle),
        );
        let paths: Vec<&str> = ops.iter().map(|op| op["path"].as_str().unwrap()).collect();
        assert_eq!(
            paths,
            [
                "/webhooks/0/name",
                "/webhooks/0/clientConfig/caBundle",
                "/webhooks/1/name",
                "/webhooks/1/clientConfig/caBundle"
            ]
        );
        assert_eq!(ops[0]["value"], "a");
        assert_eq!(
            ops[1]["value"],
            serde_json::to_value(&new_bytes).unwrap(),
            "base64 of the PEM bundle"
        );

        // A replica still holding the old bundle does not undo a rotation: the new bundle
        // already contains the old CA.
        let stale = ca_bundle_patch(
            [("c", Some(&new_bytes))].into_iter(),
            &old.ca_bundle,
            &bundle(&old.ca_bundle),
        );
        assert!(stale.is_empty());
    }

    #[test]
    fn secrets_round_trip_the_material() {
        let managed = ManagedCertificates {
            namespace: "ops".into(),
            secret_name: "hooks-tls".into(),
            sans: Sans::for_service("hooks", "ops", &[]),
            lifetimes: Lifetimes::default(),
            check_interval: Duration::from_secs(60),
            mutating_configurations: vec![],
            validating_configurations: vec![],
        };
        let material =
            serving::generate(&managed.sans, managed.lifetimes, OffsetDateTime::now_utc()).unwrap();
        let secret = secret_for(&managed, &material, Some("42".into()));
        assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));
        assert_eq!(secret.metadata.resource_version.as_deref(), Some("42"));
        assert_eq!(material_from(&secret), Some(material));
        let mut partial = secret;
        partial.data.as_mut().unwrap().remove(CA_KEY_KEY);
        assert_eq!(material_from(&partial), None);
    }

    #[test]
    fn files_are_used_only_when_both_exist() {
        let dir = tempfile::tempdir().unwrap();
        let managed = ManagedCertificates {
            namespace: "ops".into(),
            secret_name: "s".into(),
            sans: Sans::default(),
            lifetimes: Lifetimes::default(),
            check_interval: Duration::from_secs(60),
            mutating_configurations: vec![],
            validating_configurations: vec![],
        };
        let detect = || {
            CertificateSource::detect(
                dir.path().to_owned(),
                Duration::from_secs(1),
                managed.clone(),
            )
        };
        assert!(matches!(detect(), CertificateSource::Managed(_)));
        std::fs::write(dir.path().join("tls.crt"), "x").unwrap();
        assert!(matches!(detect(), CertificateSource::Managed(_)));
        std::fs::write(dir.path().join("tls.key"), "y").unwrap();
        assert!(matches!(detect(), CertificateSource::Files { .. }));
    }
}
