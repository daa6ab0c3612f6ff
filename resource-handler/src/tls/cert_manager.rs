//! The gateway certificate from cert-manager (`spec.issuerName`): the operator writes one
//! cert-manager `Certificate` per cluster and serves the Secret cert-manager issues for it.
//!
//! Only the fields the operator sets are modelled; Certificates are not watched (the operator
//! reads one only while reconciling its cluster), so the Secret cert-manager writes carries the
//! operator's labels (`secretTemplate`) and wakes the cluster and its cells through the Secret
//! cache.

use std::collections::BTreeMap;

use kube::api::{Api, DeleteParams};
use kube::{CustomResource, ResourceExt};
use multigres_api::owner::Owner;
use multigres_common::pki::workload::LeafSpec;
use serde::{Deserialize, Serialize};

use crate::controller::Ctx;
use crate::sync::{self, SyncError};

/// The API group of cert-manager, for the issuer reference.
const GROUP: &str = "cert-manager.io";

/// RFC 5280 bounds a subject common name at 64 characters; cert-manager refuses longer ones.
const MAX_COMMON_NAME: usize = 64;

/// The part of cert-manager's `Certificate` (cert-manager.io/v1) the operator writes.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "cert-manager.io",
    version = "v1",
    kind = "Certificate",
    namespaced,
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct CertificateSpec {
    /// The Secret cert-manager writes the key and certificate to.
    pub secret_name: String,
    /// Labels cert-manager puts on that Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_template: Option<SecretTemplate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub common_name: Option<String>,
    #[serde(default)]
    pub dns_names: Vec<String>,
    pub issuer_ref: IssuerRef,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub private_key: Option<PrivateKey>,
    #[serde(default)]
    pub usages: Vec<String>,
}

/// Metadata cert-manager copies onto the Secret it writes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SecretTemplate {
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// The issuer that signs the certificate.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct IssuerRef {
    pub name: String,
    pub kind: String,
    pub group: String,
}

/// How the key is made.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PrivateKey {
    pub algorithm: String,
    pub size: u32,
    /// `Always`: every renewal makes a new key, as the operator's own CA does.
    pub rotation_policy: String,
}

/// The Certificate for the gateway of `owner`'s cluster, signed by ClusterIssuer `issuer`:
/// the same names as the certificate the operator's own gateway CA would issue.
pub fn gateway_certificate(
    owner: &Owner,
    labels: &BTreeMap<String, String>,
    issuer: &str,
    leaf: &LeafSpec,
) -> Certificate {
    let name = multigres_api::names::gateway_certificate(&owner.cluster);
    // A longer subject cannot be a common name; the DNS names still carry it.
    let common_name = (leaf.common_name.len() <= MAX_COMMON_NAME).then(|| leaf.common_name.clone());
    let mut certificate = Certificate::new(
        &name,
        CertificateSpec {
            secret_name: name.clone(),
            secret_template: Some(SecretTemplate {
                labels: labels.clone(),
            }),
            common_name,
            dns_names: leaf.dns_names.clone(),
            issuer_ref: IssuerRef {
                name: issuer.to_owned(),
                kind: "ClusterIssuer".to_owned(),
                group: GROUP.to_owned(),
            },
            private_key: Some(PrivateKey {
                algorithm: "ECDSA".to_owned(),
                size: 256,
                rotation_policy: "Always".to_owned(),
            }),
            usages: vec!["server auth".to_owned(), "digital signature".to_owned()],
        },
    );
    certificate.metadata = crate::stateless::metadata(&name, owner, labels);
    certificate
}

/// Why the Certificate could not be written.
#[derive(Debug, thiserror::Error)]
pub enum CertManagerError {
    /// The API server does not serve Certificates: cert-manager is not installed.
    #[error(
        "spec.issuerName: the API server has no cert-manager Certificate kind \
         (certificates.cert-manager.io/v1); install cert-manager, or remove spec.issuerName to \
         have the operator's own gateway CA sign the certificate"
    )]
    NotInstalled,
    /// Reading, writing or deleting it failed.
    #[error(transparent)]
    Sync(#[from] SyncError),
}

/// The stored Certificate `name`, if any. Without cert-manager the API server answers 404 with
/// a plain-text body, which the client does not read as a `NotFound` Status: any 404 is none.
async fn stored(api: &Api<Certificate>, name: &str) -> Result<Option<Certificate>, kube::Error> {
    match api.get(name).await {
        Ok(certificate) => Ok(Some(certificate)),
        Err(kube::Error::Api(response)) if response.code == 404 => Ok(None),
        Err(e) => Err(e),
    }
}

/// Writes `desired` unless the stored Certificate already is what it says.
pub async fn ensure<K>(ctx: &Ctx<K>, desired: Certificate) -> Result<(), CertManagerError>
where
    K: kube::Resource<DynamicType = ()>,
{
    let namespace = desired.namespace().unwrap_or_default();
    let api = Api::<Certificate>::namespaced(ctx.client.clone(), &namespace);
    let name = desired.name_any();
    let stored = stored(&api, &name).await.map_err(|source| SyncError::Get {
        kind: "Certificate".to_owned(),
        name: name.clone(),
        source,
    })?;
    let mut desired = desired;
    sync::stamp(&mut desired);
    if stored.is_some_and(|stored| sync::up_to_date(&desired, &stored)) {
        return Ok(());
    }
    sync::count(ctx.kit.name, "Certificate", "apply");
    match multigres_common::apply::apply(&api, sync::FIELD_MANAGER, &desired).await {
        Ok(_) => Ok(()),
        Err(multigres_common::apply::ApplyError::Kube {
            source: kube::Error::Api(response),
            ..
        }) if response.code == 404 => Err(CertManagerError::NotInstalled),
        Err(e) => Err(SyncError::from(e).into()),
    }
}

/// Deletes the gateway Certificate of `owner`'s cluster if the operator made one. The Secret
/// cert-manager wrote stays (cert-manager never deletes it either); a user may still hold
/// clients that trust it. Without cert-manager, or without the right to read Certificates,
/// there is none to delete.
pub async fn remove<K>(ctx: &Ctx<K>, owner: &Owner) -> Result<(), SyncError>
where
    K: kube::Resource<DynamicType = ()>,
{
    let api = Api::<Certificate>::namespaced(ctx.client.clone(), &owner.namespace);
    let name = multigres_api::names::gateway_certificate(&owner.cluster);
    let stored = match stored(&api, &name).await {
        Ok(stored) => stored,
        Err(kube::Error::Api(response)) if response.code == 403 => None,
        Err(source) => {
            return Err(SyncError::Get {
                kind: "Certificate".to_owned(),
                name,
                source,
            });
        }
    };
    let Some(stored) = stored.filter(|c| sync::controlled_by(c, owner.uid())) else {
        return Ok(());
    };
    sync::count(ctx.kit.name, "Certificate", "delete");
    match api
        .delete(&stored.name_any(), &DeleteParams::default())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(response)) if response.code == 404 => Ok(()),
        Err(source) => Err(SyncError::Delete {
            kind: "Certificate".to_owned(),
            name,
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner() -> Owner {
        let cluster: multigres_api::v1alpha1::MultigresCluster = serde_yaml::from_str(
            "apiVersion: multigres.com/v1alpha1\nkind: MultigresCluster\nmetadata:\n  name: prod\n  namespace: db\n  uid: u-1\nspec:\n  postgresPasswordSecretRef: {name: pw, key: password}\n",
        )
        .unwrap();
        Owner::with_cluster(&cluster, "prod".to_owned()).unwrap()
    }

    #[test]
    fn the_certificate_names_the_cluster_issuer_and_labels_its_secret() {
        let labels = BTreeMap::from([("app.kubernetes.io/managed-by".to_owned(), "x".to_owned())]);
        let leaf = LeafSpec::new("db.example.com", ["db.example.com".to_owned()]);
        let cert = gateway_certificate(&owner(), &labels, "corp-ca", &leaf);
        let yaml = serde_yaml::to_string(&cert).unwrap();
        let expected = "\
apiVersion: cert-manager.io/v1
kind: Certificate
metadata:
  labels:
    app.kubernetes.io/managed-by: x
  name: prod-gateway-cert
  namespace: db
  ownerReferences:
  - apiVersion: multigres.com/v1alpha1
    controller: true
    kind: MultigresCluster
    name: prod
    uid: u-1
spec:
  secretName: prod-gateway-cert
  secretTemplate:
    labels:
      app.kubernetes.io/managed-by: x
  commonName: db.example.com
  dnsNames:
  - db.example.com
  issuerRef:
    name: corp-ca
    kind: ClusterIssuer
    group: cert-manager.io
  privateKey:
    algorithm: ECDSA
    size: 256
    rotationPolicy: Always
  usages:
  - server auth
  - digital signature
";
        assert_eq!(yaml, expected);
    }

    #[test]
    fn a_subject_longer_than_a_common_name_may_be_is_left_to_the_dns_names() {
        let long = format!("{}.example.com", "a".repeat(60));
        let leaf = LeafSpec::new(long.clone(), [long.clone()]);
        let cert = gateway_certificate(&owner(), &BTreeMap::new(), "corp-ca", &leaf);
        assert_eq!(cert.spec.common_name, None);
        assert_eq!(cert.spec.dns_names, vec![long]);
    }
}
