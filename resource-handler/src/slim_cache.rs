//! Children cached without the parts of them no reconciler reads: the pod templates of
//! StatefulSets and Deployments (and a Deployment's selector and strategy), the specs of
//! Services (but their type), of PodDisruptionBudgets and of NetworkPolicies, the rendered
//! file of a postgresql.conf ConfigMap, and the labels no reconciler reads (all of a Service's,
//! a budget's, a policy's or a ConfigMap's). Those parts are much of the cached bytes (about
//! 4,700 children at 100 clusters) and only the write-skipping check reads them, so the cache
//! keeps a digest of what it dropped instead (with the applied hash, in a [`Stamp`]), and
//! remembers which stamps were checked against a full copy from the API server. A dropped part whose digest is
//! not remembered (after a restart, or because someone edited it) is fetched and compared
//! once; a drifted one is written back as before. `multigres_common::memory` has what this
//! saves, beside the other memory work.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Deref;
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, PodTemplateSpec, Service, ServiceSpec};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::ResourceExt;
use kube::runtime::reflector::Store;
use multigres_api::labels::{CLUSTER, COMPONENT, POOL};
use multigres_common::apply::Applicable;

use crate::sync::{APPLIED_HASH, ChildCache, Verdict, fnv1a64, is_subset};

/// What a cached copy keeps of its [`APPLIED_HASH`] annotation and of the digest of its dropped
/// part, in place of the annotation: `<applied hash>/<digest>`, both in hex, in its annotation
/// [`STAMP`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    applied_hash: u64,
    digest: u64,
}

/// The annotation a cached copy carries its [`Stamp`] in. Only cached copies have it: a cached
/// copy is never sent to the API server.
const STAMP: &str = "multigres.com/cache-stamp";

impl Stamp {
    /// The stamp a cached copy carries (see [`slim`]), if it carries one.
    fn of<K: Slimmed>(cached: &K) -> Option<Self> {
        let (applied_hash, digest) = cached.annotations().get(STAMP)?.split_once('/')?;
        Some(Self {
            applied_hash: u64::from_str_radix(applied_hash, 16).ok()?,
            digest: u64::from_str_radix(digest, 16).ok()?,
        })
    }
}

/// A kind cached without a part of it (see the module's documentation).
pub trait Slimmed: Applicable {
    /// The part the cache drops, as JSON (what its digest is taken of).
    fn dropped(&self) -> Vec<u8>;
    /// Removes that part, leaving what reconcilers read.
    fn drop_part(&mut self);
}

/// The labels a StatefulSet is read by: the metrics tell pools and topology servers apart by
/// them (`crate::gauges`).
const STATEFULSET_LABELS: [&str; 2] = [COMPONENT, POOL];

/// The pod template, and the labels but [`STATEFULSET_LABELS`].
impl Slimmed for StatefulSet {
    fn dropped(&self) -> Vec<u8> {
        json(&(
            unread_labels(self, &STATEFULSET_LABELS),
            self.spec.as_ref().map(|s| &s.template),
        ))
    }

    fn drop_part(&mut self) {
        keep_labels(self, &STATEFULSET_LABELS);
        if let Some(spec) = self.spec.as_mut() {
            spec.template = PodTemplateSpec::default();
        }
    }
}

/// The labels a Deployment is read by: which cluster's gateways it runs
/// (`crate::multiadmin`, `crate::gauges`).
const DEPLOYMENT_LABELS: [&str; 2] = [COMPONENT, CLUSTER];

/// The pod template, the selector, the update strategy, and the labels but
/// [`DEPLOYMENT_LABELS`]: readers take the replicas of the spec only.
impl Slimmed for Deployment {
    fn dropped(&self) -> Vec<u8> {
        json(&(
            unread_labels(self, &DEPLOYMENT_LABELS),
            self.spec
                .as_ref()
                .map(|s| (&s.template, &s.selector, &s.strategy)),
        ))
    }

    fn drop_part(&mut self) {
        keep_labels(self, &DEPLOYMENT_LABELS);
        if let Some(spec) = self.spec.as_mut() {
            spec.template = PodTemplateSpec::default();
            spec.selector = LabelSelector::default();
            spec.strategy = None;
        }
    }
}

/// The labels of `obj` but those in `read`: what [`keep_labels`] drops.
fn unread_labels<'a>(obj: &'a impl ResourceExt, read: &[&str]) -> BTreeMap<&'a str, &'a str> {
    obj.labels()
        .iter()
        .filter(|(key, _)| !read.contains(&key.as_str()))
        .map(|(key, value)| (key.as_str(), value.as_str()))
        .collect()
}

/// Drops the labels of `obj` but those in `read`. Each label is two allocations of its own;
/// most are never read of a cached child.
fn keep_labels(obj: &mut impl ResourceExt, read: &[&str]) {
    obj.labels_mut()
        .retain(|key, _| read.contains(&key.as_str()));
}

/// Everything of the spec but its type, which the cluster's external endpoint is read from
/// (`crate::multiadmin::external`), and the labels, which nothing reads of a Service (its
/// owner is found by owner reference); the status stays. A label map is a B-tree node of
/// about 0.5 KiB plus each key and value, more than the rest of a slimmed Service.
impl Slimmed for Service {
    fn dropped(&self) -> Vec<u8> {
        json(&(&self.metadata.labels, &self.spec))
    }

    fn drop_part(&mut self) {
        self.metadata.labels = None;
        self.spec = self.spec.take().map(|spec| ServiceSpec {
            type_: spec.type_,
            ..ServiceSpec::default()
        });
    }
}

/// The labels and the whole spec, neither read of a budget. The status is not read either,
/// and is no part of what the handler sets: [`slim_budget`] drops it without a digest.
impl Slimmed for PodDisruptionBudget {
    fn dropped(&self) -> Vec<u8> {
        json(&(&self.metadata.labels, &self.spec))
    }

    fn drop_part(&mut self) {
        self.metadata.labels = None;
        self.spec = None;
    }
}

/// The labels and the whole spec, neither read of a NetworkPolicy: a cluster's policies are
/// found by owner reference and pruned by name (`crate::netpol`). Seven per cluster, each
/// about 3.7 KiB of heap when cached whole.
impl Slimmed for NetworkPolicy {
    fn dropped(&self) -> Vec<u8> {
        json(&(&self.metadata.labels, &self.spec))
    }

    fn drop_part(&mut self) {
        self.metadata.labels = None;
        self.spec = None;
    }
}

/// The file's content and the labels, neither read of a rendered postgresql.conf ConfigMap: the
/// shard reconciler reads its annotations (the settings' hashes, `crate::shard::pgconfig`) and
/// finds its Shard by owner reference. The file is a few KiB of each of these.
impl Slimmed for ConfigMap {
    fn dropped(&self) -> Vec<u8> {
        json(&(&self.metadata.labels, &self.data, &self.binary_data))
    }

    fn drop_part(&mut self) {
        self.metadata.labels = None;
        self.data = None;
        self.binary_data = None;
    }
}

fn json(part: &impl serde::Serialize) -> Vec<u8> {
    serde_json::to_vec(part).unwrap_or_default()
}

/// Digest of `obj`'s dropped part; [`slim`] records it in hex.
fn digest<K: Slimmed>(obj: &K) -> u64 {
    fnv1a64(&obj.dropped())
}

/// Drops the part of an object about to be cached that reconcilers do not read, and moves its
/// [`APPLIED_HASH`] and the digest of that part into its [`Stamp`]; everything else stays.
pub fn slim<K: Slimmed>(obj: &mut K) {
    let digest = digest(obj);
    obj.drop_part();
    let applied_hash = without_applied_hash(obj).unwrap_or_default();
    obj.annotations_mut()
        .insert(STAMP.to_owned(), format!("{applied_hash}/{digest:016x}"));
}

/// Removes the [`APPLIED_HASH`] annotation of `obj` (and the annotation map, when that was the
/// last one), returning its value.
fn without_applied_hash<K: Slimmed>(obj: &mut K) -> Option<String> {
    let annotations = obj.meta_mut().annotations.as_mut()?;
    let hash = annotations.remove(APPLIED_HASH);
    if annotations.is_empty() {
        obj.meta_mut().annotations = None;
    }
    hash
}

/// [`slim`], and the status too, which no reconciler reads of a PodDisruptionBudget.
pub fn slim_budget(pdb: &mut PodDisruptionBudget) {
    slim(pdb);
    pdb.status = None;
}

/// [`slim`], and the status's conditions too, which no reconciler reads of a Deployment (its
/// replica counts and observed generation are read).
pub fn slim_deployment(deployment: &mut Deployment) {
    slim(deployment);
    if let Some(status) = deployment.status.as_mut() {
        status.conditions = None;
    }
}

/// A cache of slimmed children (see [`slim`]) and the checks of their dropped parts that
/// passed, shared by every controller that writes the kind.
pub struct SlimStore<K: Slimmed> {
    store: Store<K>,
    /// The stamps of full copies found up to date: one entry per object at most, under
    /// [`key_of`]; entries of objects gone from the cache are dropped once the map holds
    /// [`PRUNE_SLACK`] more than twice as many entries as the cache has objects.
    verified: Arc<Mutex<HashMap<u64, Stamp>>>,
}

/// How many more entries than twice the cached objects the verified map may hold before the
/// entries of objects no longer cached are dropped. An object the handler just created is
/// remembered before its watch event reaches the cache, so while many are being created the
/// map is ahead of the cache: dropping at once every entry the cache does not show yet (as
/// when the map could only be one larger than the cache) dropped theirs too, and each such
/// object cost a read on its next reconcile.
const PRUNE_SLACK: usize = 64;

impl<K: Slimmed> Clone for SlimStore<K> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            verified: self.verified.clone(),
        }
    }
}

impl<K: Slimmed> SlimStore<K> {
    /// Wraps a cache filled through [`slim`].
    pub fn new(store: Store<K>) -> Self {
        Self {
            store,
            verified: Arc::default(),
        }
    }
}

impl<K: Slimmed> Deref for SlimStore<K> {
    type Target = Store<K>;

    fn deref(&self) -> &Store<K> {
        &self.store
    }
}

/// The key of `obj` in the verified map: a digest of its namespace and name (8 bytes where an
/// `ObjectRef` is 96 and two strings). Two objects with one key only share an entry, which
/// holds for neither unless their applied hashes (of objects with different names) agree.
fn key_of<K: Slimmed>(obj: &K) -> u64 {
    let mut bytes = obj.namespace().unwrap_or_default().into_bytes();
    bytes.push(b'/');
    bytes.extend_from_slice(obj.name_any().as_bytes());
    fnv1a64(&bytes)
}

/// The value of the [`APPLIED_HASH`] annotation of `obj` (a desired object or a full copy).
fn applied_hash<K: Slimmed>(obj: &K) -> Option<u64> {
    obj.annotations()
        .get(APPLIED_HASH)
        .and_then(|hex| u64::from_str_radix(hex, 16).ok())
}

/// Whether every field `desired` sets outside its dropped part has that value in `cached`,
/// under the same applied hash.
fn up_to_date_but_dropped<K: Slimmed>(desired: &K, cached: &K) -> bool {
    let Some(hash) = applied_hash(desired) else {
        return false;
    };
    if Stamp::of(cached).map(|stamp| stamp.applied_hash) != Some(hash) {
        return false;
    }
    let mut desired = desired.clone();
    desired.drop_part();
    without_applied_hash(&mut desired);
    match (serde_json::to_value(&desired), serde_json::to_value(cached)) {
        (Ok(desired), Ok(cached)) => is_subset(&desired, &cached),
        _ => false,
    }
}

impl<K: Slimmed> ChildCache<K> for SlimStore<K> {
    fn store(&self) -> &Store<K> {
        &self.store
    }

    fn verdict(&self, desired: &K, cached: &K) -> Verdict {
        if !up_to_date_but_dropped(desired, cached) {
            return Verdict::Stale;
        }
        let stamp = Stamp::of(cached);
        let verified = self.verified.lock().unwrap_or_else(PoisonError::into_inner);
        let known = stamp.is_some() && verified.get(&key_of(cached)) == stamp.as_ref();
        if known {
            Verdict::UpToDate
        } else {
            Verdict::Unverified
        }
    }

    fn applied_hash(&self, cached: &K) -> Option<String> {
        Stamp::of(cached).map(|stamp| format!("{:016x}", stamp.applied_hash))
    }

    fn remember(&self, stored: &K) {
        let Some(applied_hash) = applied_hash(stored) else {
            return;
        };
        let key = key_of(stored);
        let entry = Stamp {
            applied_hash,
            digest: digest(stored),
        };
        let mut verified = self.verified.lock().unwrap_or_else(PoisonError::into_inner);
        if verified.len() >= 2 * self.store.len() + PRUNE_SLACK {
            let cached: HashSet<u64> = self.store.state().iter().map(|o| key_of(&**o)).collect();
            verified.retain(|k, _| *k == key || cached.contains(k));
        }
        verified.insert(key, entry);
    }
}

#[cfg(test)]
mod tests {
    use kube::runtime::reflector::ObjectRef;
    use kube::runtime::reflector::store::Writer;
    use kube::runtime::watcher::Event;
    use serde_json::json;

    use super::*;
    use crate::sync::{stamp, up_to_date};

    /// A pool StatefulSet as the handler builds it, stamped.
    fn desired(image: &str, replicas: i32) -> StatefulSet {
        let mut sts: StatefulSet = serde_json::from_value(json!({
            "metadata": {"name": "pool-a", "namespace": "ns", "labels": {"app": "pool", "app.kubernetes.io/component": "pool"}},
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
        slim(&mut sts);
        sts
    }

    /// A workload cache holding `objects` (trimmed) and nothing verified yet.
    fn cache(objects: &[&StatefulSet]) -> (SlimStore<StatefulSet>, Writer<StatefulSet>) {
        let mut writer = Writer::<StatefulSet>::default();
        for object in objects {
            writer.apply_watcher_event(&Event::Apply(trimmed(object)));
        }
        (SlimStore::new(writer.as_reader()), writer)
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
            Stamp::of(&cached),
            Some(Stamp {
                applied_hash: applied_hash(&full).unwrap(),
                digest: digest(&full),
            })
        );
        assert_eq!(
            cached.annotations().keys().collect::<Vec<_>>(),
            [STAMP],
            "the applied hash, the only annotation, is in the stamp"
        );
        assert_eq!(
            cached.metadata.labels,
            Some([(COMPONENT.to_owned(), "pool".to_owned())].into()),
            "the labels read are kept"
        );
        let mut restored = cached.clone();
        restored.metadata.annotations = full.metadata.annotations.clone();
        restored.spec.as_mut().unwrap().template = full.spec.clone().unwrap().template;
        restored.metadata.labels = full.metadata.labels.clone();
        assert_eq!(
            restored, full,
            "only the template, the labels not read and the stamp differ"
        );

        let other = trimmed(&stored(&desired("postgres:18", 3)));
        assert_ne!(
            Stamp::of(&other).unwrap().digest,
            Stamp::of(&cached).unwrap().digest,
            "another template, another digest"
        );
    }

    #[test]
    fn annotations_besides_the_applied_hash_stay_and_count() {
        let mut want = desired("postgres:17", 3);
        want.annotations_mut()
            .insert("multigres.com/drained-node".into(), "n/p".into());
        stamp(&mut want);
        let mut full = stored(&want);
        full.annotations_mut()
            .insert("someone.else/note".into(), "x".into());
        let cached = trimmed(&full);
        let mut kept = cached.annotations().clone();
        kept.remove(STAMP);
        assert_eq!(
            kept,
            [
                ("multigres.com/drained-node".to_owned(), "n/p".to_owned()),
                ("someone.else/note".to_owned(), "x".to_owned()),
            ]
            .into()
        );
        let (cache, _writer) = cache(&[&full]);
        cache.remember(&full);
        assert_eq!(cache.verdict(&want, &cached), Verdict::UpToDate);
        assert_eq!(
            cache.applied_hash(&cached),
            want.annotations().get(APPLIED_HASH).cloned()
        );
        // An annotation the handler sets, edited by hand: a write.
        let mut edited = full.clone();
        edited
            .annotations_mut()
            .insert("multigres.com/drained-node".into(), "m/q".into());
        assert_eq!(cache.verdict(&want, &trimmed(&edited)), Verdict::Stale);
        // The applied hash edited by hand: a write.
        let mut rehashed = full.clone();
        rehashed
            .annotations_mut()
            .insert(APPLIED_HASH.into(), "not-a-hash".into());
        let rehashed = trimmed(&rehashed);
        assert_eq!(Stamp::of(&rehashed), None);
        assert_eq!(cache.verdict(&want, &rehashed), Verdict::Stale);
    }

    #[test]
    fn a_template_is_trusted_only_once_a_full_copy_was_checked() {
        let want = desired("postgres:17", 3);
        let full = stored(&want);
        let (cache, _writer) = cache(&[&full]);
        let cached = cache.get(&ObjectRef::from_obj(&full)).unwrap();

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
    fn entries_of_objects_just_written_are_kept_and_of_gone_ones_dropped() {
        let named = |name: &str| {
            let mut sts = stored(&desired("postgres:17", 3));
            sts.metadata.name = Some(name.to_owned());
            sts
        };
        let (cache, mut writer) = cache(&[]);
        // Written, their watch events not in the cache yet: all remembered.
        for i in 0..PRUNE_SLACK {
            cache.remember(&named(&format!("pool-{i}")));
        }
        assert_eq!(cache.verified.lock().unwrap().len(), PRUNE_SLACK);
        // Only the first is cached, the others are gone: kept until the map holds the slack
        // more than twice the cache, then dropped.
        writer.apply_watcher_event(&Event::Apply(trimmed(&named("pool-0"))));
        cache.remember(&named("pool-b"));
        cache.remember(&named("pool-c"));
        assert_eq!(cache.verified.lock().unwrap().len(), 2 + PRUNE_SLACK);
        cache.remember(&named("pool-d"));
        let verified = cache.verified.lock().unwrap();
        let mut keys: Vec<_> = verified.keys().copied().collect();
        keys.sort_unstable();
        let mut kept = [key_of(&named("pool-0")), key_of(&named("pool-d"))];
        kept.sort_unstable();
        assert_eq!(keys, kept);
    }

    #[test]
    fn a_check_holds_for_its_object_only() {
        let want = desired("postgres:17", 3);
        let full = stored(&want);
        let mut other_full = full.clone();
        other_full.metadata.name = Some("pool-b".into());
        let mut other_want = want.clone();
        other_want.metadata.name = Some("pool-b".into());
        stamp(&mut other_want);
        other_full.metadata.annotations = other_want.metadata.annotations.clone();
        let (cache, _writer) = cache(&[&full, &other_full]);
        cache.remember(&full);
        let other_cached = cache.get(&ObjectRef::from_obj(&other_full)).unwrap();
        assert_eq!(
            cache.verdict(&other_want, &other_cached),
            Verdict::Unverified,
            "pool-b's template was never checked"
        );
        cache.remember(&other_full);
        assert_eq!(cache.verdict(&other_want, &other_cached), Verdict::UpToDate);
        assert_eq!(cache.verified.lock().unwrap().len(), 2);
    }

    /// A Service as the handler builds it (stamped) and as the API server stores it.
    fn service(port: i32) -> (Service, Service) {
        let mut desired: Service = serde_json::from_value(json!({
            "metadata": {"name": "gw", "namespace": "ns", "labels": {"app": "gw"}},
            "spec": {"type": "LoadBalancer", "selector": {"app": "gw"}, "ports": [{"port": port}]},
        }))
        .unwrap();
        stamp(&mut desired);
        let mut full = desired.clone();
        full.metadata.uid = Some("u-2".into());
        let spec = full.spec.as_mut().unwrap();
        spec.cluster_ip = Some("10.0.0.1".into());
        spec.session_affinity = Some("None".into());
        full.status = Some(
            serde_json::from_value(json!({"loadBalancer": {"ingress": [{"ip": "1.2.3.4"}]}}))
                .unwrap(),
        );
        (desired, full)
    }

    #[test]
    fn a_service_keeps_its_type_and_status_and_its_spec_is_checked_once() {
        let (want, full) = service(5432);
        let mut cached = full.clone();
        slim(&mut cached);
        assert_eq!(
            cached.spec,
            Some(ServiceSpec {
                type_: Some("LoadBalancer".into()),
                ..ServiceSpec::default()
            })
        );
        assert_eq!(cached.status, full.status);
        assert_eq!(cached.metadata.labels, None);
        let mut writer = Writer::<Service>::default();
        writer.apply_watcher_event(&Event::Apply(cached.clone()));
        let cache = SlimStore::new(writer.as_reader());
        assert_eq!(cache.verdict(&want, &cached), Verdict::Unverified);
        cache.remember(&full);
        assert_eq!(cache.verdict(&want, &cached), Verdict::UpToDate);

        // A port edited by hand: another digest, so the full copy is fetched (and found
        // drifted).
        let (_, mut edited) = service(5433);
        edited.metadata = full.metadata.clone();
        let mut edited_cached = edited.clone();
        slim(&mut edited_cached);
        assert_eq!(cache.verdict(&want, &edited_cached), Verdict::Unverified);
        assert!(!up_to_date(&want, &edited));
        // A label edited by hand: the same (fetched, found drifted).
        let mut relabelled = full.clone();
        relabelled.labels_mut().insert("app".into(), "other".into());
        let mut relabelled_cached = relabelled.clone();
        slim(&mut relabelled_cached);
        assert_eq!(
            cache.verdict(&want, &relabelled_cached),
            Verdict::Unverified
        );
        assert!(!up_to_date(&want, &relabelled));
        // Another type wanted: a write, no fetch.
        let (mut internal, _) = service(5432);
        internal.spec.as_mut().unwrap().type_ = Some("ClusterIP".into());
        stamp(&mut internal);
        assert_eq!(cache.verdict(&internal, &cached), Verdict::Stale);
    }

    #[test]
    fn a_config_map_keeps_its_hashes_and_a_drifted_file_is_written_back() {
        let desired = |text: &str| {
            let mut cm: ConfigMap = serde_json::from_value(json!({
                "metadata": {"name": "pg", "namespace": "ns", "labels": {"app": "pg"},
                    "annotations": {"multigres.com/config-hash": "r1"}},
                "data": {"postgresql.conf": text},
            }))
            .unwrap();
            stamp(&mut cm);
            cm
        };
        let want = desired("max_connections = 100\n");
        let mut full = want.clone();
        full.metadata.uid = Some("u-3".into());
        let mut cached = full.clone();
        slim(&mut cached);
        assert_eq!((&cached.data, &cached.metadata.labels), (&None, &None));
        assert_eq!(
            cached.annotations().get("multigres.com/config-hash"),
            Some(&"r1".to_owned()),
            "the hashes the shard reconciler reads stay"
        );
        let mut writer = Writer::<ConfigMap>::default();
        writer.apply_watcher_event(&Event::Apply(cached.clone()));
        let cache = SlimStore::new(writer.as_reader());
        assert_eq!(cache.verdict(&want, &cached), Verdict::Unverified);
        cache.remember(&full);
        assert_eq!(cache.verdict(&want, &cached), Verdict::UpToDate);

        // The file edited by hand: another digest, fetched, found drifted (written back).
        let mut edited = full.clone();
        edited.data = Some([("postgresql.conf".to_owned(), "fsync = off\n".to_owned())].into());
        let mut edited_cached = edited.clone();
        slim(&mut edited_cached);
        assert_eq!(cache.verdict(&want, &edited_cached), Verdict::Unverified);
        assert!(!up_to_date(&want, &edited));
        // Another file wanted: another applied hash, a write without a fetch.
        assert_eq!(
            cache.verdict(&desired("max_connections = 200\n"), &cached),
            Verdict::Stale
        );
    }

    #[test]
    fn a_budget_is_cached_without_spec_and_status() {
        let mut desired: PodDisruptionBudget = serde_json::from_value(json!({
            "metadata": {"name": "pool-a", "namespace": "ns", "labels": {"app": "pool"}},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "pool"}}},
        }))
        .unwrap();
        stamp(&mut desired);
        let mut full = desired.clone();
        full.status = Some(
            serde_json::from_value(json!({"currentHealthy": 2, "desiredHealthy": 1,
                "disruptionsAllowed": 1, "expectedPods": 2}))
            .unwrap(),
        );
        let mut cached = full.clone();
        slim_budget(&mut cached);
        assert_eq!((cached.spec.as_ref(), cached.status.as_ref()), (None, None));
        assert_eq!(cached.metadata.labels, None);
        let mut writer = Writer::<PodDisruptionBudget>::default();
        writer.apply_watcher_event(&Event::Apply(cached.clone()));
        let cache = SlimStore::new(writer.as_reader());
        assert_eq!(cache.verdict(&desired, &cached), Verdict::Unverified);
        cache.remember(&full);
        assert_eq!(cache.verdict(&desired, &cached), Verdict::UpToDate);
    }

    #[test]
    fn a_network_policy_is_cached_without_spec_and_labels_and_an_edited_rule_is_checked() {
        let policy = |port: i32| {
            let mut policy: NetworkPolicy = serde_json::from_value(json!({
                "metadata": {"name": "b0-postgres", "namespace": "ns", "labels": {"app": "pool"},
                    "ownerReferences": [{"apiVersion": "multigres.com/v1alpha1",
                        "kind": "MultigresCluster", "name": "b0", "uid": "u-c", "controller": true}]},
                "spec": {"podSelector": {"matchLabels": {"app": "pool"}}, "policyTypes": ["Ingress"],
                    "ingress": [{"ports": [{"port": port, "protocol": "TCP"}]}]},
            }))
            .unwrap();
            stamp(&mut policy);
            policy
        };
        let desired = policy(5432);
        let mut full = desired.clone();
        full.metadata.uid = Some("u-4".into());
        let mut cached = full.clone();
        slim(&mut cached);
        assert_eq!((&cached.spec, &cached.metadata.labels), (&None, &None));
        assert_eq!(
            cached.owner_references(),
            full.owner_references(),
            "the owner reference the prune finds a cluster's policies by stays"
        );
        let mut writer = Writer::<NetworkPolicy>::default();
        writer.apply_watcher_event(&Event::Apply(cached.clone()));
        let cache = SlimStore::new(writer.as_reader());
        assert_eq!(cache.verdict(&desired, &cached), Verdict::Unverified);
        cache.remember(&full);
        assert_eq!(cache.verdict(&desired, &cached), Verdict::UpToDate);

        // A port opened by hand: another digest, fetched, found drifted (written back).
        let mut edited = policy(22);
        edited.metadata = full.metadata.clone();
        let mut edited_cached = edited.clone();
        slim(&mut edited_cached);
        assert_eq!(cache.verdict(&desired, &edited_cached), Verdict::Unverified);
        assert!(!up_to_date(&desired, &edited));
    }
}
