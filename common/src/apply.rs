//! Server-side apply, the only way handlers write objects: each binary owns exactly the fields
//! it sends, under its own field manager, and forces conflicts as Kubernetes recommends for
//! controllers.

use std::fmt::Debug;

use k8s_openapi::NamespaceResourceScope;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::metrics::record_api_write;

/// Prefix of every field manager the operator uses.
pub const FIELD_MANAGER_PREFIX: &str = "multigres-operator/";

/// Why an apply failed.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The object to apply has no `metadata.name`.
    #[error("cannot apply a {kind} without metadata.name")]
    MissingName {
        /// Kind of the object.
        kind: String,
    },
    /// The status could not be turned into JSON.
    #[error("cannot serialize the status of {kind} {name}")]
    Serialize {
        /// Kind of the object.
        kind: String,
        /// Name of the object.
        name: String,
        /// The serializer's error.
        #[source]
        source: serde_json::Error,
    },
    /// The API server refused or could not be reached.
    #[error("server-side apply of {kind} {name} failed")]
    Kube {
        /// Kind of the object.
        kind: String,
        /// Name of the object.
        name: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
}

/// The field manager of a binary: `multigres-operator/<binary>`.
pub fn field_manager(binary: &str) -> String {
    format!("{FIELD_MANAGER_PREFIX}{binary}")
}

/// Forced server-side-apply parameters for `field_manager`.
pub fn apply_params(field_manager: &str) -> PatchParams {
    PatchParams::apply(field_manager).force()
}

/// Parameters of a merge or JSON patch written as `field_manager` (not forced: only server-side
/// apply takes `force`).
pub fn patch_params(field_manager: &str) -> PatchParams {
    PatchParams {
        field_manager: Some(field_manager.to_owned()),
        ..Default::default()
    }
}

/// Parameters of a create or replace written as `field_manager`.
pub fn post_params(field_manager: &str) -> PostParams {
    PostParams {
        field_manager: Some(field_manager.to_owned()),
        ..Default::default()
    }
}

/// Applies `obj` (spec and metadata) with a forced server-side apply and returns the object as
/// stored. `obj` must be complete for the fields this manager owns: fields it sent before and
/// leaves out now are removed.
pub async fn apply<K>(api: &Api<K>, field_manager: &str, obj: &K) -> Result<K, ApplyError>
where
    K: Resource<DynamicType = ()> + Clone + Debug + Serialize + DeserializeOwned,
{
    let kind = K::kind(&()).into_owned();
    let name = obj
        .meta()
        .name
        .clone()
        .ok_or_else(|| ApplyError::MissingName { kind: kind.clone() })?;
    api.patch(&name, &apply_params(field_manager), &Patch::Apply(obj))
        .await
        .map_err(|source| ApplyError::Kube { kind, name, source })
}

/// The body of a status apply: `apiVersion` and `kind` are required by server-side apply,
/// `metadata.name` identifies the object, and only `status` is sent.
pub fn status_patch<K>(name: &str, status: &impl Serialize) -> Result<Value, serde_json::Error>
where
    K: Resource<DynamicType = ()>,
{
    Ok(json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "metadata": { "name": name },
        "status": serde_json::to_value(status)?,
    }))
}

/// Applies `status` to the `/status` subresource of `name` with a forced server-side apply.
pub async fn apply_status<K>(
    api: &Api<K>,
    field_manager: &str,
    name: &str,
    status: &impl Serialize,
) -> Result<K, ApplyError>
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned,
{
    let kind = K::kind(&()).into_owned();
    let patch = status_patch::<K>(name, status).map_err(|source| ApplyError::Serialize {
        kind: kind.clone(),
        name: name.to_owned(),
        source,
    })?;
    api.patch_status(name, &apply_params(field_manager), &Patch::Apply(patch))
        .await
        .map_err(|source| ApplyError::Kube {
            kind,
            name: name.to_owned(),
            source,
        })
}

/// A namespaced kind a handler applies whole and reads back from its caches: what every
/// handler's generic write and cache code needs of a kind, said once.
pub trait Applicable:
    Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + Clone
    + Debug
    + Serialize
    + DeserializeOwned
    + Send
    + Sync
    + 'static
{
}

impl<K> Applicable for K where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + Debug
        + Serialize
        + DeserializeOwned
        + Send
        + Sync
        + 'static
{
}

/// The write path of one controller, which every write it makes goes through: it writes as
/// the controller's field manager and counts each write in
/// `multigres_operator_api_writes_total{controller,kind,verb}`, so tests and alerts can see
/// that an idle cluster costs no writes. Handlers add their own writes on top of it.
#[derive(Clone)]
pub struct Writer {
    client: Client,
    controller: &'static str,
    field_manager: String,
}

impl Writer {
    /// Writes as `field_manager`, counted under `controller`.
    pub fn new(client: Client, controller: &'static str, field_manager: String) -> Self {
        Self {
            client,
            controller,
            field_manager,
        }
    }

    /// The field manager every write is made as.
    pub fn field_manager(&self) -> &str {
        &self.field_manager
    }

    /// The API of `K` in `namespace`, counting the `verb` write about to be made through it.
    pub fn api<K>(&self, namespace: &str, verb: &'static str) -> Api<K>
    where
        K: Resource<DynamicType = (), Scope = NamespaceResourceScope>,
    {
        record_api_write(self.controller, &K::kind(&()), verb);
        Api::namespaced(self.client.clone(), namespace)
    }

    /// Applies `status` (only the fields this handler owns) to the status subresource of `obj`
    /// (see [`apply_status`]); the object as stored.
    pub async fn apply_status<K>(&self, obj: &K, status: &impl Serialize) -> Result<K, ApplyError>
    where
        K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
            + Clone
            + Debug
            + DeserializeOwned,
    {
        let api = self.api::<K>(&obj.namespace().unwrap_or_default(), "apply-status");
        apply_status(&api, &self.field_manager, &obj.name_any(), status).await
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::apps::v1::{Deployment, DeploymentStatus};

    use super::*;

    #[test]
    fn field_manager_names_the_binary() {
        assert_eq!(
            field_manager("resource-handler"),
            "multigres-operator/resource-handler"
        );
    }

    #[test]
    fn apply_params_force_the_field_manager() {
        let params = apply_params("multigres-operator/cluster-handler");
        assert_eq!(
            params.field_manager.as_deref(),
            Some("multigres-operator/cluster-handler")
        );
        assert!(params.force);
    }

    #[test]
    fn patch_params_name_the_field_manager_without_forcing() {
        let params = patch_params("multigres-operator/data-handler");
        assert_eq!(
            params.field_manager.as_deref(),
            Some("multigres-operator/data-handler")
        );
        assert!(!params.force);
        assert!(!params.dry_run);
    }

    #[test]
    fn post_params_name_the_field_manager() {
        let params = post_params("multigres-operator/webhook-server");
        assert_eq!(
            params.field_manager.as_deref(),
            Some("multigres-operator/webhook-server")
        );
        assert!(!params.dry_run);
    }

    #[test]
    fn status_patch_carries_api_version_kind_and_only_status() {
        let status = DeploymentStatus {
            ready_replicas: Some(2),
            ..Default::default()
        };
        let patch = status_patch::<Deployment>("gw", &status).unwrap();
        assert_eq!(
            patch,
            json!({
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": { "name": "gw" },
                "status": { "readyReplicas": 2 },
            })
        );
    }
}
