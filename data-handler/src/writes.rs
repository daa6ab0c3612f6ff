//! Every write the handler makes to the Kubernetes API goes through the common [`Writer`],
//! which counts it (see [`multigres_common::apply::Writer`]); the writes only this handler
//! makes, on pods and finalizers, are here. Callers compare with the cached object first and
//! only write when something differs.

use std::collections::BTreeMap;
use std::fmt::Debug;

use k8s_openapi::api::core::v1::Pod;
use kube::api::Patch;
use kube::{Resource, ResourceExt};
use multigres_api::postgres::RELOAD_HASH_ANNOTATION;
use multigres_common::apply;
use serde::de::DeserializeOwned;
use serde_json::json;

pub use multigres_common::apply::Writer;

/// Whether a write failed because the object no longer exists (404), or, for a server-side
/// apply, because the apply tried to create a deleted object and it was refused (422).
pub fn is_gone(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 404 || status.code == 422)
}

/// Sets (`Some`) or removes (`None`) annotation `key` of `pod`, by a JSON merge patch that
/// applies to this pod only (its UID, which the API server refuses to change); other fields are
/// left alone. A pod deleted or replaced meanwhile is not an error.
pub async fn annotate_pod(
    writer: &Writer,
    pod: &Pod,
    key: &str,
    value: Option<&str>,
) -> Result<(), kube::Error> {
    let api = writer.api::<Pod>(&pod.namespace().unwrap_or_default(), "patch");
    let body = json!({"metadata": {"uid": pod.uid(), "annotations": {key: value}}});
    match api
        .patch(
            &pod.name_any(),
            &apply::patch_params(writer.field_manager()),
            &Patch::Merge(body),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if [404, 409, 422].contains(&status.code) => Ok(()),
        Err(error) => Err(error),
    }
}

/// Server-side applies what this handler marks on a pool pod, together because an apply drops
/// the manager's fields it leaves out: the labels (`multigres.com/role`,
/// `multigres.com/cohort`) and the confirmed reload fingerprint annotation (`None` drops it).
/// A pod deleted meanwhile is not an error.
pub async fn apply_pod_marks(
    writer: &Writer,
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
    let api = writer.api::<Pod>(&namespace, "apply");
    match api
        .patch(
            &name,
            &apply::apply_params(writer.field_manager()),
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
pub async fn patch_json<K>(
    writer: &Writer,
    obj: &K,
    patch: json_patch::Patch,
) -> Result<(), kube::Error>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + Debug
        + DeserializeOwned,
{
    writer
        .api::<K>(&obj.namespace().unwrap_or_default(), "patch")
        .patch(
            &obj.name_any(),
            &apply::patch_params(writer.field_manager()),
            &Patch::<()>::Json(patch),
        )
        .await?;
    Ok(())
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
