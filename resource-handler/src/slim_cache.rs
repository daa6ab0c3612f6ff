//! StatefulSets and Deployments cached without their pod templates. The templates are most of
//! the cached bytes and only the write-skipping check reads them, so the cache keeps a digest
//! of each template instead, and remembers which (applied hash, template digest) pairs were
//! checked against a full copy from the API server. A template whose digest is not
//! remembered (after a restart, or because someone edited it) is fetched and compared once;
//! a drifted one is written back as before.

use std::collections::HashMap;
use std::ops::Deref;
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};
use serde_json::Value;

use crate::sync::{APPLIED_HASH, Child, ChildCache, Verdict, fnv1a64, is_subset};

/// Annotation on a cached copy only (never sent to the API server): the digest of the pod
/// template the cache dropped.
pub const CACHED_TEMPLATE_DIGEST: &str = "multigres.com/cached-template-digest";

/// A workload kind with a pod template in its spec.
pub trait PodTemplated: Child {
    /// The pod template, if the object has a spec.
    fn template(&self) -> Option<&PodTemplateSpec>;
    /// The pod template, mutably, if the object has a spec.
    fn template_mut(&mut self) -> Option<&mut PodTemplateSpec>;
}

impl PodTemplated for StatefulSet {
    fn template(&self) -> Option<&PodTemplateSpec> {
        self.spec.as_ref().map(|s| &s.template)
    }

    fn template_mut(&mut self) -> Option<&mut PodTemplateSpec> {
        self.spec.as_mut().map(|s| &mut s.template)
    }
}

impl PodTemplated for Deployment {
    fn template(&self) -> Option<&PodTemplateSpec> {
        self.spec.as_ref().map(|s| &s.template)
    }

    fn template_mut(&mut self) -> Option<&mut PodTemplateSpec> {
        self.spec.as_mut().map(|s| &mut s.template)
    }
}

/// Digest of `obj`'s pod template, as [`trim_template`] records it.
fn template_digest<K: PodTemplated>(obj: &K) -> String {
    let bytes = serde_json::to_vec(&obj.template()).unwrap_or_default();
    format!("{:016x}", fnv1a64(&bytes))
}

/// Replaces the pod template of an object about to be cached with an empty one and records
/// the template's digest in [`CACHED_TEMPLATE_DIGEST`]; everything else stays.
pub fn trim_template<K: PodTemplated>(obj: &mut K) {
    let digest = template_digest(obj);
    if let Some(template) = obj.template_mut() {
        *template = PodTemplateSpec::default();
    }
    obj.annotations_mut()
        .insert(CACHED_TEMPLATE_DIGEST.to_owned(), digest);
}

/// An object's applied hash and template digest, once a full copy of it was up to date.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Verified {
    applied_hash: String,
    template_digest: String,
}

/// A cache of template-trimmed workloads (see [`trim_template`]) and the template checks
/// that passed, shared by every controller that writes the kind.
pub struct WorkloadStore<K: PodTemplated> {
    store: Store<K>,
    /// One entry per object at most; entries of objects gone from the cache are dropped
    /// whenever the map is as large as the cache, so it holds at most one entry more than
    /// the cache has objects.
    verified: Arc<Mutex<HashMap<ObjectRef<K>, Verified>>>,
}

impl<K: PodTemplated> Clone for WorkloadStore<K> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            verified: self.verified.clone(),
        }
    }
}

impl<K: PodTemplated> WorkloadStore<K> {
    /// Wraps a cache filled through [`trim_template`].
    pub fn new(store: Store<K>) -> Self {
        Self {
            store,
            verified: Arc::default(),
        }
    }
}

impl<K: PodTemplated> Deref for WorkloadStore<K> {
    type Target = Store<K>;

    fn deref(&self) -> &Store<K> {
        &self.store
    }
}

/// The key of `obj` in the verified map, without the resource version and uid
/// [`ObjectRef::from_obj`] would keep.
fn key_of<K: PodTemplated>(obj: &K) -> ObjectRef<K> {
    let key = ObjectRef::new(&obj.name_any());
    match obj.namespace() {
        Some(namespace) => key.within(&namespace),
        None => key,
    }
}

/// Whether every field `desired` sets outside its pod template has that value in `cached`,
/// under the same applied hash.
fn up_to_date_but_template<K: PodTemplated>(desired: &K, cached: &K) -> bool {
    let hash = |obj: &K| obj.annotations().get(APPLIED_HASH).cloned();
    if hash(desired).is_none() || hash(desired) != hash(cached) {
        return false;
    }
    let (Ok(mut desired), Ok(cached)) =
        (serde_json::to_value(desired), serde_json::to_value(cached))
    else {
        return false;
    };
    if let Some(spec) = desired.get_mut("spec").and_then(Value::as_object_mut) {
        spec.remove("template");
    }
    is_subset(&desired, &cached)
}

impl<K: PodTemplated> ChildCache<K> for WorkloadStore<K> {
    fn store(&self) -> &Store<K> {
        &self.store
    }

    fn verdict(&self, desired: &K, cached: &K) -> Verdict {
        if !up_to_date_but_template(desired, cached) {
            return Verdict::Stale;
        }
        let verified = self.verified.lock().unwrap_or_else(PoisonError::into_inner);
        let known = verified.get(&key_of(cached)).is_some_and(|v| {
            desired.annotations().get(APPLIED_HASH) == Some(&v.applied_hash)
                && cached.annotations().get(CACHED_TEMPLATE_DIGEST) == Some(&v.template_digest)
        });
        if known {
            Verdict::UpToDate
        } else {
            Verdict::Unverified
        }
    }

    fn remember(&self, stored: &K) {
        let Some(applied_hash) = stored.annotations().get(APPLIED_HASH).cloned() else {
            return;
        };
        let key = key_of(stored);
        let entry = Verified {
            applied_hash,
            template_digest: template_digest(stored),
        };
        let mut verified = self.verified.lock().unwrap_or_else(PoisonError::into_inner);
        if verified.len() >= self.store.len() {
            verified.retain(|k, _| *k == key || self.store.get(k).is_some());
        }
        verified.insert(key, entry);
    }
}

#[cfg(test)]
mod tests {
    use kube::runtime::reflector::store::Writer;
    use kube::runtime::watcher::Event;
    use serde_json::json;

    use super::*;
    use crate::sync::{stamp, up_to_date};

    /// A pool StatefulSet as the handler builds it, stamped.
    fn desired(image: &str, replicas: i32) -> StatefulSet {
        let mut sts: StatefulSet = serde_json::from_value(json!({
            "metadata": {"name": "pool-a", "namespace": "ns", "labels": {"app": "pool"}},
            "spec": {
                "replicas": replicas,
                "serviceName": "pool-a",
                "selector": {"matchLabels": {"app": "pool"}},
                "template": {
                    "metadata": {"labels": {"app": "pool"}},
                    "spec": {"containers": [{"name": "postgres", "image": image}]},
                },
            },
        }))
        .unwrap();
        stamp(&mut sts);
        sts
    }

    /// `desired` as the API server stores it: defaults and status added.
    fn stored(desired: &StatefulSet) -> StatefulSet {
        let mut sts = desired.clone();
        sts.metadata.resource_version = Some("7".into());
        sts.metadata.uid = Some("u-1".into());
        let spec = sts.spec.as_mut().unwrap();
        spec.pod_management_policy = Some("OrderedReady".into());
        let pod = spec.template.spec.as_mut().unwrap();
        pod.restart_policy = Some("Always".into());
        pod.containers[0].image_pull_policy = Some("IfNotPresent".into());
        sts.status =
            Some(serde_json::from_value(json!({"replicas": 3, "readyReplicas": 2})).unwrap());
        sts
    }

    fn trimmed(full: &StatefulSet) -> StatefulSet {
        let mut sts = full.clone();
        trim_template(&mut sts);
        sts
    }

    /// A workload cache holding `objects` (trimmed) and nothing verified yet.
    fn cache(objects: &[&StatefulSet]) -> (WorkloadStore<StatefulSet>, Writer<StatefulSet>) {
        let mut writer = Writer::<StatefulSet>::default();
        for object in objects {
            writer.apply_watcher_event(&Event::Apply(trimmed(object)));
        }
        (WorkloadStore::new(writer.as_reader()), writer)
    }

    #[test]
    fn the_trim_drops_the_template_records_its_digest_and_keeps_the_rest() {
        let full = stored(&desired("postgres:17", 3));
        let cached = trimmed(&full);
        assert_eq!(
            cached.spec.as_ref().unwrap().template,
            PodTemplateSpec::default()
        );
        assert_eq!(
            cached.annotations().get(CACHED_TEMPLATE_DIGEST),
            Some(&template_digest(&full))
        );
        let mut restored = cached.clone();
        restored.annotations_mut().remove(CACHED_TEMPLATE_DIGEST);
        restored.spec.as_mut().unwrap().template = full.spec.clone().unwrap().template;
        assert_eq!(restored, full, "only the template and the digest differ");

        let other = trimmed(&stored(&desired("postgres:18", 3)));
        assert_ne!(
            other.annotations().get(CACHED_TEMPLATE_DIGEST),
            cached.annotations().get(CACHED_TEMPLATE_DIGEST),
            "another template, another digest"
        );
    }

    #[test]
    fn a_template_is_trusted_only_once_a_full_copy_was_checked() {
        let want = desired("postgres:17", 3);
        let full = stored(&want);
        let (cache, _writer) = cache(&[&full]);
        let cached = cache.get(&key_of(&full)).unwrap();

        // The handler now wants something else: a write, no fetch.
        assert_eq!(
            cache.verdict(&desired("postgres:18", 3), &cached),
            Verdict::Stale
        );
        // Same hash, but no full copy was checked (e.g. after a restart): fetch it.
        assert_eq!(cache.verdict(&want, &cached), Verdict::Unverified);
        // The fetched copy is up to date: remembered, and the cache alone says so from now on.
        assert!(up_to_date(&want, &full));
        cache.remember(&full);
        assert_eq!(cache.verdict(&want, &cached), Verdict::UpToDate);

        // A field outside the template edited by hand: a write, whatever was remembered.
        let mut scaled = full.clone();
        scaled.spec.as_mut().unwrap().replicas = Some(5);
        assert_eq!(cache.verdict(&want, &trimmed(&scaled)), Verdict::Stale);
    }

    #[test]
    fn an_edited_template_is_fetched_and_written_back_only_if_it_drifted() {
        let want = desired("postgres:17", 3);
        let full = stored(&want);
        let (cache, _writer) = cache(&[&full]);
        cache.remember(&full);

        // Someone changed the image: the digest changed, so the full copy is fetched, and it
        // is not up to date (the handler applies).
        let mut edited = full.clone();
        edited
            .spec
            .as_mut()
            .unwrap()
            .template
            .spec
            .as_mut()
            .unwrap()
            .containers[0]
            .image = Some("evil:1".into());
        assert_eq!(cache.verdict(&want, &trimmed(&edited)), Verdict::Unverified);
        assert!(!up_to_date(&want, &edited));

        // Someone added an annotation the handler does not set (e.g. `kubectl rollout
        // restart`): fetched once, up to date, remembered; no write.
        let mut restarted = full.clone();
        restarted
            .spec
            .as_mut()
            .unwrap()
            .template
            .metadata
            .as_mut()
            .unwrap()
            .annotations = Some([("restartedAt".to_owned(), "now".to_owned())].into());
        let cached = trimmed(&restarted);
        assert_eq!(cache.verdict(&want, &cached), Verdict::Unverified);
        assert!(up_to_date(&want, &restarted));
        cache.remember(&restarted);
        assert_eq!(cache.verdict(&want, &cached), Verdict::UpToDate);
    }

    #[test]
    fn entries_of_objects_gone_from_the_cache_are_dropped() {
        let first = stored(&desired("postgres:17", 3));
        let mut second = first.clone();
        second.metadata.name = Some("pool-b".into());
        let (cache, mut writer) = cache(&[&first]);
        cache.remember(&first);
        writer.apply_watcher_event(&Event::Delete(trimmed(&first)));
        writer.apply_watcher_event(&Event::Apply(trimmed(&second)));
        cache.remember(&second);
        let verified = cache.verified.lock().unwrap();
        assert_eq!(
            verified.keys().cloned().collect::<Vec<_>>(),
            [key_of(&second)]
        );
    }
}
