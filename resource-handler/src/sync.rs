//! Writing only what changed: a child is applied when it is missing, when what this handler
//! would send differs from what it sent last time (a hash of the desired object stored in an
//! annotation, which also catches fields that were removed from the desired object), or when
//! someone changed a field this handler sets (for children cached without the parts no reconciler
//! reads, see [`crate::slim_cache`]). A status is applied only when one of this
//! handler's status fields or conditions differs from what is stored, and then at most once per
//! pacing interval while the object converges ([`multigres_common::status_pacer`]).

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::api::{DeleteParams, Preconditions};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Resource, ResourceExt};
use multigres_common::apply::{Applicable, ApplyError, apply, apply_status};
use multigres_common::status_pacer::{FirstStatus, Pace, StatusPacer};
use serde::Serialize;
use serde_json::Value;

/// The field manager of every write this handler makes:
/// `multigres_common::apply::field_manager("resource-handler")`, spelled out because a `const`
/// cannot be built from `FIELD_MANAGER_PREFIX` (a unit test keeps the two equal).
pub const FIELD_MANAGER: &str = "multigres-operator/resource-handler";

pub use multigres_common::metrics::record_api_write as count;

/// Annotation holding the hash of the object as this handler last applied it.
pub const APPLIED_HASH: &str = "multigres.com/applied-hash";

/// Why a write failed; always transient (the API server refused or was unreachable).
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// A server-side apply failed.
    #[error(transparent)]
    Apply(#[from] ApplyError),
    /// Reading the full object to check what its cached copy leaves out failed.
    #[error("reading {kind} {name}")]
    Get {
        kind: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    /// Deleting an object that is no longer desired failed.
    #[error("deleting {kind} {name}")]
    Delete {
        kind: String,
        name: String,
        #[source]
        source: kube::Error,
    },
}

/// 64-bit FNV-1a: a stable, dependency-free fingerprint of the desired object.
pub(crate) fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Records in `obj` the hash of everything else in it, so a later reconcile can tell whether
/// what it would apply changed.
pub fn stamp<K: Resource + Serialize>(obj: &mut K) {
    obj.annotations_mut().remove(APPLIED_HASH);
    let bytes = serde_json::to_vec(obj).unwrap_or_default();
    let hash = format!("{:016x}", fnv1a64(&bytes));
    obj.annotations_mut().insert(APPLIED_HASH.to_owned(), hash);
}

/// Whether every field set in `desired` has the same value in `observed`. Arrays must have
/// the same length and match element by element; fields only `observed` has (defaults, other
/// managers' fields, status) do not matter.
pub fn is_subset(desired: &Value, observed: &Value) -> bool {
    match (desired, observed) {
        (Value::Object(d), Value::Object(o)) => d
            .iter()
            .all(|(k, v)| o.get(k).is_some_and(|ov| is_subset(v, ov))),
        (Value::Array(d), Value::Array(o)) => {
            d.len() == o.len() && d.iter().zip(o).all(|(a, b)| is_subset(a, b))
        }
        (Value::Number(d), Value::Number(o)) => d.as_f64() == o.as_f64(),
        (d, o) => d == o,
    }
}

/// Whether `observed` already is what applying `desired` (stamped) would produce.
pub fn up_to_date<K: Resource + Serialize>(desired: &K, observed: &K) -> bool {
    let hash = |obj: &K| obj.annotations().get(APPLIED_HASH).cloned();
    if hash(desired).is_none() || hash(desired) != hash(observed) {
        return false;
    }
    match (
        serde_json::to_value(desired),
        serde_json::to_value(observed),
    ) {
        (Ok(d), Ok(o)) => is_subset(&d, &o),
        _ => false,
    }
}

/// How long a write waits for the cache to show it, so the next reconcile compares against
/// what was written rather than sending it again.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(2);

/// What a cache tells about a child before a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Applying would change nothing.
    UpToDate,
    /// Applying is needed.
    Stale,
    /// The cached copy leaves out fields the handler sets: read the full object to tell.
    Unverified,
}

/// Where [`ensure`] finds a child and learns whether applying it would change anything.
pub trait ChildCache<K: Applicable> {
    /// The cached copies.
    fn store(&self) -> &Store<K>;
    /// Whether `cached` already is what applying `desired` (stamped) would produce.
    fn verdict(&self, desired: &K, cached: &K) -> Verdict;
    /// The [`APPLIED_HASH`] of the object `cached` is a copy of.
    fn applied_hash(&self, cached: &K) -> Option<String>;
    /// Notes that `stored`, a full copy from the API server, was found up to date.
    fn remember(&self, stored: &K);
}

/// Full copies: the cache alone decides.
impl<K: Applicable> ChildCache<K> for Store<K> {
    fn store(&self) -> &Store<K> {
        self
    }

    fn verdict(&self, desired: &K, cached: &K) -> Verdict {
        if up_to_date(desired, cached) {
            Verdict::UpToDate
        } else {
            Verdict::Stale
        }
    }

    fn applied_hash(&self, cached: &K) -> Option<String> {
        cached.annotations().get(APPLIED_HASH).cloned()
    }

    fn remember(&self, _: &K) {}
}

/// Applies `desired` (stamping it first) unless the cached object in `cache` is already up to
/// date. Returns whether a write happened.
pub async fn ensure<K: Applicable>(
    controller: &'static str,
    api: &Api<K>,
    cache: &impl ChildCache<K>,
    desired: K,
) -> Result<bool, SyncError> {
    ensure_with(controller, api, cache, desired, |_, _| {}).await
}

/// [`ensure`] for an object only some specs want (`None`: nothing to write).
pub async fn ensure_wanted<K: Applicable>(
    controller: &'static str,
    api: &Api<K>,
    cache: &impl ChildCache<K>,
    desired: Option<K>,
) -> Result<(), SyncError> {
    match desired {
        Some(desired) => ensure(controller, api, cache, desired).await.map(|_| ()),
        None => Ok(()),
    }
}

/// [`ensure`], first copying from the existing object what cannot change once created
/// (`keep(desired, existing)`, e.g. StatefulSet claim templates). The hash covers what the
/// builder produced, so a kept field never counts as a change.
pub async fn ensure_with<K: Applicable>(
    controller: &'static str,
    api: &Api<K>,
    cache: &impl ChildCache<K>,
    mut desired: K,
    keep: impl FnOnce(&mut K, &K),
) -> Result<bool, SyncError> {
    stamp(&mut desired);
    let key = ObjectRef::from_obj(&desired);
    let store = cache.store();
    if let Some(existing) = store.get(&key) {
        keep(&mut desired, &existing);
        match cache.verdict(&desired, &existing) {
            Verdict::UpToDate => return Ok(false),
            Verdict::Stale => {}
            Verdict::Unverified => {
                let full =
                    api.get_opt(&desired.name_any())
                        .await
                        .map_err(|source| SyncError::Get {
                            kind: K::kind(&()).into_owned(),
                            name: desired.name_any(),
                            source,
                        })?;
                if let Some(full) = full.filter(|full| up_to_date(&desired, full)) {
                    cache.remember(&full);
                    return Ok(false);
                }
            }
        }
    }
    count(controller, &K::kind(&()), "apply");
    let stored = apply(api, FIELD_MANAGER, &desired).await?;
    if up_to_date(&desired, &stored) {
        cache.remember(&stored);
    }
    tracing::info!(
        kind = %K::kind(&()),
        name = %desired.name_any(),
        namespace = ?desired.namespace(),
        "applied"
    );
    let hash = desired.annotations().get(APPLIED_HASH).cloned();
    let deadline = Instant::now() + SETTLE_TIMEOUT;
    while Instant::now() < deadline {
        let cached = store.get(&key);
        if cached.is_some_and(|c| cache.applied_hash(&c) == hash) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(true)
}

/// Whether `obj` has a controller owner reference to `uid`.
pub fn controlled_by(obj: &impl Resource, uid: &str) -> bool {
    obj.meta()
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.uid == uid)
}

/// Deletes the objects in `owned` whose names are not in `keep` (objects the owner no longer
/// wants, e.g. the multiorch of a cell it stopped watching). Returns the deleted names.
pub async fn prune<K: Applicable>(
    controller: &'static str,
    api: &Api<K>,
    owned: &[Arc<K>],
    keep: &BTreeSet<String>,
) -> Result<Vec<String>, SyncError> {
    let mut deleted = Vec::new();
    for obj in owned {
        let name = obj.name_any();
        if keep.contains(&name) || obj.meta().deletion_timestamp.is_some() {
            continue;
        }
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: obj.uid(),
                resource_version: None,
            }),
            ..DeleteParams::background()
        };
        count(controller, &K::kind(&()), "delete");
        match api.delete(&name, &params).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => continue,
            Err(source) => {
                return Err(SyncError::Delete {
                    kind: K::kind(&()).into_owned(),
                    name,
                    source,
                });
            }
        }
        tracing::info!(kind = %K::kind(&()), %name, "deleted, no longer desired");
        deleted.push(name);
    }
    Ok(deleted)
}

/// Whether the stored status differs from `desired` in any field `desired` sets. Conditions
/// are compared by type, so conditions of other handlers do not count.
pub fn status_differs(desired: &impl Serialize, observed: Option<&impl Serialize>) -> bool {
    let (Ok(desired), Ok(observed)) = (
        serde_json::to_value(desired),
        serde_json::to_value(observed),
    ) else {
        return true;
    };
    let Value::Object(fields) = desired else {
        return true;
    };
    fields.iter().any(|(key, value)| {
        let stored = observed.get(key).unwrap_or(&Value::Null);
        if key != "conditions" {
            return !is_subset(value, stored);
        }
        let stored = stored.as_array().map(Vec::as_slice).unwrap_or_default();
        value.as_array().into_iter().flatten().any(|cond| {
            !stored
                .iter()
                .any(|s| s.get("type") == cond.get("type") && s == cond)
        })
    })
}

/// Applies `desired` to the status of `obj` unless it already holds it, or unless it only
/// carries progress and `pacer` wrote this object less than its interval ago (see
/// [`multigres_common::status_pacer`]). Returns how long the write was deferred, if it was:
/// the reconcile looks again then ([`multigres_common::status_pacer::action`]).
pub async fn ensure_status<K, S>(
    controller: &'static str,
    api: &Api<K>,
    obj: &K,
    desired: &S,
    observed: Option<&S>,
    pacer: &StatusPacer<String>,
) -> Result<Option<Duration>, SyncError>
where
    K: Applicable,
    S: Serialize,
{
    if !status_differs(desired, observed) {
        return Ok(None);
    }
    let key = format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any());
    if let Pace::Defer(delay) = pacer.pace_typed(&key, observed, desired, FirstStatus::Deadline) {
        return Ok(Some(delay));
    }
    count(controller, &K::kind(&()), "apply-status");
    apply_status(api, FIELD_MANAGER, &obj.name_any(), desired).await?;
    pacer.wrote(&key);
    Ok(None)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;
    use serde_json::json;

    use super::*;

    fn config_map(data: Value) -> ConfigMap {
        serde_json::from_value(json!({"metadata": {"name": "c"}, "data": data})).unwrap()
    }

    #[test]
    fn field_manager_is_the_common_one_of_this_binary() {
        assert_eq!(
            FIELD_MANAGER,
            multigres_common::apply::field_manager("resource-handler")
        );
        assert_eq!(crate::controller::REPORTER, FIELD_MANAGER);
    }

    #[test]
    fn subset_ignores_extra_fields_but_not_changed_ones() {
        let d = json!({"a": 1, "b": {"c": [1, {"d": "x"}]}});
        let o = json!({"a": 1.0, "z": true, "b": {"c": [1, {"d": "x", "e": 2}]}});
        assert!(is_subset(&d, &o));
        assert!(!is_subset(&json!({"a": 2}), &o));
        assert!(
            !is_subset(&json!({"b": {"c": [1]}}), &o),
            "list lengths differ"
        );
        assert!(!is_subset(&json!({"q": 1}), &o), "missing field");
    }

    #[test]
    fn stamped_objects_compare_by_hash_and_content() {
        let mut desired = config_map(json!({"k": "v"}));
        stamp(&mut desired);
        let mut stored = desired.clone();
        stored.metadata.resource_version = Some("7".into());
        assert!(up_to_date(&desired, &stored));

        // Someone edited a field this handler sets.
        let mut edited = stored.clone();
        edited.data = Some([("k".to_owned(), "changed".to_owned())].into());
        assert!(!up_to_date(&desired, &edited));

        // The desired object lost a key: the hash differs although the stored one is a
        // superset of the new desired object.
        let mut smaller = config_map(json!({}));
        stamp(&mut smaller);
        assert!(!up_to_date(&smaller, &stored));
    }

    #[test]
    fn status_compares_only_our_fields_and_condition_types() {
        let stored = json!({
            "observedGeneration": 2,
            "podRoles": {"p-0": "PRIMARY"},
            "conditions": [
                {"type": "Available", "status": "True", "reason": "R", "message": "m",
                 "lastTransitionTime": "2025-01-01T00:00:00Z"},
                {"type": "BackupHealthy", "status": "False"}
            ]
        });
        let same = json!({
            "observedGeneration": 2,
            "conditions": [
                {"type": "Available", "status": "True", "reason": "R", "message": "m",
                 "lastTransitionTime": "2025-01-01T00:00:00Z"}
            ]
        });
        assert!(!status_differs(&same, Some(&stored)));
        let mut changed = same.clone();
        changed["conditions"][0]["message"] = json!("n");
        assert!(status_differs(&changed, Some(&stored)));
        assert!(status_differs(
            &json!({"observedGeneration": 3}),
            Some(&stored)
        ));
        assert!(status_differs(&same, None::<&Value>));
    }
}
