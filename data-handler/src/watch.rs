//! Reading the caches of the shared watches ([`multigres_common::shared_watch`]): every object
//! behind a [`multigres_common::guard::Guarded`], so a malformed object becomes a per-object error instead of a
//! failed watch.

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, PersistentVolumeClaimStatus, Pod};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};

pub use multigres_common::shared_watch::Guarded;

/// Keeps of a pool pod only its metadata: the shard controller reads its name, labels and
/// annotations, and the spec and status are most of a pod's size, with every pool pod cached
/// and copied out of the cache on each shard reconcile.
pub fn pod_metadata_only(pod: &mut Guarded<Pod>) {
    if let Ok(pod) = pod.0.as_mut() {
        pod.spec = None;
        pod.status = None;
    }
}

/// Drops all of a cached claim but its metadata and capacity: only what storage gave is read.
pub fn claim_capacity_only(claim: &mut Guarded<PersistentVolumeClaim>) {
    if let Ok(claim) = claim.0.as_mut() {
        claim.spec = None;
        if let Some(status) = claim.status.as_mut() {
            *status = PersistentVolumeClaimStatus {
                capacity: status.capacity.take(),
                ..Default::default()
            };
        }
    }
}

/// The valid objects of `store` in `namespace` that `wanted` picks. Only those are copied: a
/// reconcile of one Shard must not copy every pod of a namespace holding many clusters.
pub fn valid_in<K>(
    store: &Store<Guarded<K>>,
    namespace: &str,
    wanted: impl Fn(&K) -> bool,
) -> Vec<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    store
        .state()
        .iter()
        .filter(|obj| obj.meta().namespace.as_deref() == Some(namespace))
        .filter_map(|obj| obj.0.as_ref().ok())
        .filter(|obj| wanted(obj))
        .cloned()
        .collect()
}

/// The valid object `namespace/name` of `store`, if cached.
pub fn valid<K>(store: &Store<Guarded<K>>, namespace: &str, name: &str) -> Option<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    store
        .get(&ObjectRef::new(name).within(namespace))
        .and_then(|obj| obj.0.as_ref().ok().cloned())
}

/// References to the objects of `store` in `namespace` whose label `key` is `value`, for
/// mapping a change of one object to the objects that depend on it.
pub fn labelled<K>(
    store: &Store<Guarded<K>>,
    namespace: &str,
    key: &str,
    value: &str,
) -> Vec<ObjectRef<Guarded<K>>>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    store
        .state()
        .iter()
        .filter(|obj| {
            obj.meta().namespace.as_deref() == Some(namespace)
                && obj.labels().get(key).map(String::as_str) == Some(value)
        })
        .map(|obj| ObjectRef::from_obj(&**obj))
        .collect()
}

/// `namespace/name` of an object, for messages.
pub fn full_name<K: Resource>(obj: &K) -> String {
    format!(
        "{}/{}",
        obj.meta().namespace.as_deref().unwrap_or_default(),
        obj.meta().name.as_deref().unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reload::PodState;

    #[test]
    fn a_pool_pod_trimmed_to_its_metadata_reads_the_same() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "pool-a-0",
                "namespace": "ns",
                "labels": {"multigres.com/cell": "zone1", "multigres.com/role": "replica"},
                "annotations": {"multigres.com/config-hash": "h1"},
            },
            "spec": {"containers": [{"name": "postgres", "image": "postgres:17"}]},
            "status": {"phase": "Running", "podIP": "10.0.0.7"},
        }))
        .unwrap();
        let mut guarded = multigres_common::guard::Guarded(Ok(pod.clone()));
        pod_metadata_only(&mut guarded);
        let trimmed = guarded.0.unwrap();
        assert_eq!(PodState::of(&trimmed), PodState::of(&pod));
        assert_eq!(trimmed.metadata, pod.metadata);
        assert_eq!((trimmed.spec, trimmed.status), (None, None));
    }
}
