//! Every write the handler makes to the API server goes through the common [`Writer`], which
//! counts it in `multigres_operator_api_writes_total{controller,kind,verb}` (so tests and
//! alerts can see that an idle cluster costs nothing); the writes here also wait until the
//! watch cache has seen the write, so the next reconcile compares against what was written
//! rather than re-sending it.

use std::time::{Duration, Instant};

use kube::api::{DeleteParams, Preconditions};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};
use multigres_common::apply::{self, Applicable, ApplyError};
use multigres_common::status_pacer::{FirstStatus, Pace, StatusPacer};
use serde::Serialize;

use crate::children::Child;
use crate::watch::Guarded;

pub use multigres_common::apply::Writer;

/// How long a write waits for the watch cache to show it before moving on.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the cache is checked meanwhile.
const SETTLE_POLL: Duration = Duration::from_millis(5);

/// The kind, name and message of an apply the API server refused as invalid (HTTP 400 or
/// 422): the object built from the user's spec breaks a schema or CEL rule, so retrying
/// cannot help.
pub fn rejection(error: &ApplyError) -> Option<(String, String, String)> {
    match error {
        ApplyError::Kube {
            kind,
            name,
            source: kube::Error::Api(status),
        } if matches!(status.code, 400 | 422) => {
            Some((kind.clone(), name.clone(), status.message.clone()))
        }
        _ => None,
    }
}

/// Applies `desired` (forced server-side apply) unless `observed`, its cached version, is
/// already up to date. Returns whether it wrote.
pub async fn apply_child<K: Child>(
    writer: &Writer,
    store: &Store<Guarded<K>>,
    desired: &K,
    observed: Option<&K>,
) -> Result<bool, ApplyError> {
    if observed.is_some_and(|o| crate::children::up_to_date(desired, o)) {
        return Ok(false);
    }
    let namespace = desired.namespace().unwrap_or_default();
    let api = writer.api::<K>(&namespace, "apply");
    let before = observed.and_then(|o| o.resource_version());
    let stored = apply::apply(&api, writer.field_manager(), desired).await?;
    if stored.resource_version() != before {
        settle(store, &desired.name_any(), &namespace, |cached| {
            cached.is_some_and(|c| c.resource_version() != before)
        })
        .await;
    }
    Ok(true)
}

/// Deletes `obj` (only that incarnation: the uid is a precondition) and waits until the cache
/// shows it gone or terminating.
pub async fn delete_child<K: Child>(
    writer: &Writer,
    store: &Store<Guarded<K>>,
    obj: &K,
) -> Result<(), kube::Error> {
    let namespace = obj.namespace().unwrap_or_default();
    let name = obj.name_any();
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: obj.uid(),
            resource_version: None,
        }),
        ..DeleteParams::background()
    };
    match writer
        .api::<K>(&namespace, "delete")
        .delete(&name, &params)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => {
            // Already gone, or a newer object took the name: nothing of ours to delete.
            return Ok(());
        }
        Err(error) => return Err(error),
    }
    settle(store, &name, &namespace, |cached| {
        cached.is_none_or(|c| c.meta().deletion_timestamp.is_some())
    })
    .await;
    Ok(())
}

/// Applies `status` (which differs from `stored`, the object's stored status) to the status
/// subresource of `obj` and waits until the cache shows it, unless it only carries progress
/// and `pacer` wrote `obj` less than its interval ago or spent its progress budget
/// ([`multigres_common::status_pacer`]); `first` says whether a first status has a deadline.
/// Returns how long the write was deferred, if it was: the reconcile looks again then.
pub async fn apply_status_paced<K: Applicable, S: Serialize>(
    writer: &Writer,
    store: &Store<Guarded<K>>,
    pacer: &StatusPacer<String>,
    obj: &K,
    stored: Option<&S>,
    status: &S,
    first: FirstStatus,
) -> Result<Option<Duration>, ApplyError> {
    // One pacer may serve several kinds.
    let key = format!(
        "{}/{}/{}",
        K::kind(&()),
        obj.namespace().unwrap_or_default(),
        obj.name_any()
    );
    if let Pace::Defer(delay) = pacer.pace_typed(&key, stored, status, first) {
        tracing::debug!(?delay, "progress-only status write deferred");
        return Ok(Some(delay));
    }
    let before = obj.resource_version();
    let written = writer.apply_status(obj, status).await?;
    if written.resource_version() != before {
        settle(
            store,
            &obj.name_any(),
            &obj.namespace().unwrap_or_default(),
            |cached| cached.is_some_and(|c| c.resource_version() != before),
        )
        .await;
    }
    pacer.wrote(&key);
    Ok(None)
}

/// Sets the annotation `key` of `obj` to `value` (a forced server-side apply of that one
/// annotation) and waits until the cache shows it.
pub async fn apply_annotation<K: Applicable>(
    writer: &Writer,
    store: &Store<Guarded<K>>,
    obj: &K,
    key: &str,
    value: &str,
) -> Result<(), ApplyError> {
    let namespace = obj.namespace().unwrap_or_default();
    let name = obj.name_any();
    let kind = K::kind(&()).into_owned();
    let api = writer.api::<K>(&namespace, "apply");
    let body = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": kind,
        "metadata": { "name": name, "annotations": { key: value } },
    });
    api.patch(
        &name,
        &apply::apply_params(writer.field_manager()),
        &kube::api::Patch::Apply(body),
    )
    .await
    .map_err(|source| ApplyError::Kube {
        kind,
        name: name.clone(),
        source,
    })?;
    settle(store, &name, &namespace, |cached| {
        cached.is_some_and(|c| c.annotations().get(key).map(String::as_str) == Some(value))
    })
    .await;
    Ok(())
}

/// Waits until `done` holds for the cached object `namespace/name` (or `None` when absent),
/// at most [`SETTLE_TIMEOUT`]; a slow watch only costs a redundant write later, never a wrong
/// one.
async fn settle<K>(
    store: &Store<Guarded<K>>,
    name: &str,
    namespace: &str,
    done: impl Fn(Option<&Guarded<K>>) -> bool,
) where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    let key = ObjectRef::<Guarded<K>>::new(name).within(namespace);
    let deadline = Instant::now() + SETTLE_TIMEOUT;
    while !done(store.get(&key).as_deref()) {
        if Instant::now() >= deadline {
            tracing::debug!(
                name,
                namespace,
                "watch cache did not show the write in time"
            );
            return;
        }
        tokio::time::sleep(SETTLE_POLL).await;
    }
}
