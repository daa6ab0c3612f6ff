//! Every write the handler makes to the Kubernetes API goes through [`Writer`], which counts it
//! in `multigres_operator_api_writes_total{controller,kind,verb}` so tests and alerts can see
//! that an idle cluster costs no writes. Callers compare with the cached object first and only
//! call a writer method when something differs.

use std::collections::BTreeMap;
use std::fmt::Debug;

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::api::Patch;
use kube::runtime::events::Event;
use kube::{Api, Resource, ResourceExt};
use multigres_api::postgres::RELOAD_HASH_ANNOTATION;
use multigres_common::apply::{self, ApplyError};
use multigres_common::events::Recorder;
use multigres_common::metrics::record_api_write as count;
use multigres_common::telemetry::ErrorChain;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

/// Whether a write failed because the object no longer exists (404), or, for a server-side
/// apply, because the apply tried to create a deleted object and it was refused (422).
pub fn is_gone(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 404 || status.code == 422)
}

/// The write path of one controller.
#[derive(Clone)]
pub struct Writer {
    client: kube::Client,
    controller: &'static str,
    field_manager: String,
}

impl Writer {
    /// Writes as `field_manager`, counted under `controller`.
    pub fn new(client: kube::Client, controller: &'static str, field_manager: String) -> Self {
        Self {
            client,
            controller,
            field_manager,
        }
    }

    /// Server-side applies `status` (only the fields this handler owns) to the status
    /// subresource of `obj`.
    pub async fn apply_status<K>(&self, obj: &K, status: &Value) -> Result<(), ApplyError>
    where
        K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + Debug
            + DeserializeOwned,
    {
        let api: Api<K> =
            Api::namespaced(self.client.clone(), &obj.namespace().unwrap_or_default());
        count(self.controller, &K::kind(&()), "apply-status");
        apply::apply_status(&api, &self.field_manager, &obj.name_any(), status).await?;
        Ok(())
    }

    /// Sets (`Some`) or removes (`None`) annotation `key` of `pod`, by a JSON merge patch that
    /// applies to this pod only (its UID, which the API server refuses to change); other fields
    /// are left alone. A pod deleted or replaced meanwhile is not an error.
    pub async fn annotate_pod(
        &self,
        pod: &Pod,
        key: &str,
        value: Option<&str>,
    ) -> Result<(), kube::Error> {
        let api: Api<Pod> =
            Api::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
        let body = json!({"metadata": {"uid": pod.uid(), "annotations": {key: value}}});
        count(self.controller, "Pod", "patch");
        match api
            .patch(
                &pod.name_any(),
                &apply::patch_params(&self.field_manager),
                &Patch::Merge(body),
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if [404, 409, 422].contains(&status.code) => Ok(()),
            Err(error) => Err(error),
        }
    }

    /// Server-side applies what this handler marks on a pool pod, together because an apply
    /// drops the manager's fields it leaves out: the labels (`multigres.com/role`,
    /// `multigres.com/cohort`) and the confirmed reload fingerprint annotation (`None` drops
    /// it). A pod deleted meanwhile is not an error.
    pub async fn apply_pod_marks(
        &self,
        pod: &Pod,
        labels: &BTreeMap<&'static str, &str>,
        reload_hash: Option<&str>,
    ) -> Result<(), kube::Error> {
        let namespace = pod.namespace().unwrap_or_default();
        let name = pod.name_any();
        let annotations =
            reload_hash.map_or_else(|| json!({}), |h| json!({ RELOAD_HASH_ANNOTATION: h }));
        let body = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": labels,
                "annotations": annotations,
            },
        });
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &namespace);
        count(self.controller, "Pod", "apply");
        match api
            .patch(
                &name,
                &apply::apply_params(&self.field_manager),
                &Patch::Apply(body),
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(error) if is_gone(&error) => Ok(()),
            Err(error) => Err(error),
        }
    }

    /// Applies a JSON patch (finalizer changes) to `obj`, as this handler's field manager.
    pub async fn patch_json<K>(&self, obj: &K, patch: json_patch::Patch) -> Result<(), kube::Error>
    where
        K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + Debug
            + DeserializeOwned,
    {
        let api: Api<K> =
            Api::namespaced(self.client.clone(), &obj.namespace().unwrap_or_default());
        count(self.controller, &K::kind(&()), "patch");
        api.patch(
            &obj.name_any(),
            &apply::patch_params(&self.field_manager),
            &Patch::<()>::Json(patch),
        )
        .await?;
        Ok(())
    }

    /// Publishes `event` about `reference`; a failure is logged, never fatal.
    pub async fn publish(&self, recorder: &Recorder, event: &Event, reference: &ObjectReference) {
        count(self.controller, "Event", "event");
        if let Err(error) = recorder.publish(event, reference).await {
            tracing::warn!(
                reason = %event.reason,
                object = ?reference.name,
                error = %ErrorChain(&error),
                "cannot publish an event"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gone_means_not_found_or_refused_create() {
        let api = |code| {
            kube::Error::Api(
                kube::core::Status::failure("x", "y")
                    .with_code(code)
                    .boxed(),
            )
        };
        assert!(is_gone(&api(404)));
        assert!(is_gone(&api(422)));
        assert!(!is_gone(&api(409)));
        assert!(!is_gone(&api(500)));
    }
}
