//! The reloads step of the Shard controller (see [`crate::reload`]): asks the multipooler of
//! every pool pod that has not confirmed the rendered postgresql.conf's reload-class settings
//! to reload, and returns the confirmed ones, for the controller to stamp, and why the others
//! wait, each reason once per pod.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};
use multigres_api::v1alpha1::Shard;
use multigres_common::events::Notice;
use multigres_common::telemetry::ErrorChain;

use crate::dial::Dial;
use crate::reload::{self, Desired, DesiredError, PodState, Verdict};
use crate::roles::{self, PoolPod, ShardKey};
use crate::topo::PoolerRecord;
use crate::watch::{Guarded, valid_in};

/// What [`deliver`] borrows from the Shard controller's context.
pub struct StepInputs<'a> {
    /// The shards' rendered postgresql.conf ConfigMaps.
    pub config_maps: &'a Store<Guarded<ConfigMap>>,
    /// Pool pods in the cache: the waits of pods gone from it are dropped.
    pub pods: &'a Store<Guarded<Pod>>,
    /// Why each pod's reload is waiting, as last reported.
    pub waits: &'a Waits,
    /// How to reach the shard's multipoolers.
    pub dial: &'a Dial,
}

/// What one pass of reload delivery found.
#[derive(Default)]
pub struct Delivery {
    /// Pods whose PostgreSQL confirmed the current reload-class settings → their fingerprint.
    pub stamps: BTreeMap<String, String>,
    /// Some pod's reload is still pending: look again after [`reload::RETRY`].
    pub retry: bool,
    /// Events to publish on the Shard, by pod (each waiting reason once per pod).
    pub notices: Vec<(String, Notice)>,
    /// The rendered file could not be read back.
    pub error: Option<DesiredError>,
}

/// Why each pod's reload is waiting, as last reported (`namespace/pod` → note), so a waiting
/// reload is announced once, not on every retry.
#[derive(Debug, Default)]
pub struct Waits(Mutex<HashMap<String, String>>);

impl Waits {
    /// Records that `pod`'s reload to `hash` waits for the reason `notice` gives; true the
    /// first time, so the event is published once. Entries of pods gone from `pods` are dropped
    /// whenever there are as many entries as cached pods, so the map stays within one entry of
    /// the number of pool pods.
    fn announce(
        &self,
        pods: &Store<Guarded<Pod>>,
        namespace: &str,
        pod: &str,
        hash: &str,
        notice: &Notice,
    ) -> bool {
        let note = format!("{hash} {}", notice.reason);
        let mut waits = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if waits.len() >= pods.len() {
            waits.retain(|key, _| {
                key.split_once('/').is_some_and(|(namespace, name)| {
                    pods.get(&ObjectRef::new(name).within(namespace)).is_some()
                })
            });
        }
        waits.insert(format!("{namespace}/{pod}"), note.clone()) != Some(note)
    }

    /// Forgets why `pod`'s reload waited: it was confirmed.
    pub fn forget(&self, namespace: &str, pod: &str) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&format!("{namespace}/{pod}"));
    }
}

/// Asks the multipooler of every pool pod of `pods` that has not confirmed the rendered file's
/// reload-class settings to reload, and collects the confirmed ones.
pub async fn deliver(
    lent: &StepInputs<'_>,
    shard: &Shard,
    key: ShardKey<'_>,
    pods: &[Pod],
    poolers: &BTreeMap<String, Option<Vec<PoolerRecord>>>,
) -> Delivery {
    let mut out = Delivery::default();
    let namespace = shard.namespace().unwrap_or_default();
    // No file rendered yet (or a postgresConfigRef still missing): nothing to reload.
    let Some(rendered) = rendered(lent.config_maps, shard, &namespace) else {
        return out;
    };
    let desired = match Desired::from_config_map(&rendered) {
        Ok(desired) => desired,
        Err(error) => {
            out.error = Some(error);
            return out;
        }
    };
    let states: Vec<PodState> = pods.iter().map(PodState::of).collect();
    for pod in reload::to_reload(&desired, &states) {
        let pool_pod = PoolPod {
            name: pod.name.clone(),
            cell: pod.cell.clone(),
        };
        let record = roles::pooler_of(key, &pool_pod, poolers);
        match attempt(lent.dial, pod, record, &desired).await {
            Attempt::Reloaded => {
                out.stamps
                    .insert(pod.name.clone(), desired.reload_hash.clone());
            }
            Attempt::Retry => out.retry = true,
            Attempt::Wait(notice) => {
                out.retry = true;
                // A pod never stamped is new: it most likely started with the current file
                // and its multipooler is still starting, so its first confirmation is waited
                // for quietly.
                let quiet = pod.reload_hash.is_none() && notice.reason == "ConfigReloadPending";
                let hash = &desired.reload_hash;
                if !quiet
                    && lent
                        .waits
                        .announce(lent.pods, &namespace, &pod.name, hash, &notice)
                {
                    out.notices.push((pod.name.clone(), notice));
                }
            }
        }
    }
    out
}

/// The rendered postgresql.conf ConfigMap of `shard`, if any.
fn rendered(
    config_maps: &Store<Guarded<ConfigMap>>,
    shard: &Shard,
    namespace: &str,
) -> Option<ConfigMap> {
    let uid = shard.uid();
    valid_in(config_maps, namespace, |cm| {
        cm.owner_references()
            .iter()
            .any(|o| Some(&o.uid) == uid.as_ref())
            && cm
                .data
                .as_ref()
                .is_some_and(|d| d.contains_key(reload::CONFIG_KEY))
    })
    .into_iter()
    .next()
}

/// What came of asking one pod to reload.
enum Attempt {
    /// Its PostgreSQL confirmed the settings: stamp it.
    Reloaded,
    /// Waiting, for the reason given: look again later.
    Wait(Notice),
    /// Not yet, for a reason not worth an event: look again later.
    Retry,
}

/// Asks `pod`'s multipooler, found by its pooler `record`, to reload to `desired`.
async fn attempt(
    dial: &Dial,
    pod: &PodState,
    record: Option<&PoolerRecord>,
    desired: &Desired,
) -> Attempt {
    let Some(address) = record.and_then(reload::address) else {
        tracing::debug!(pod = %pod.name, "reload waits for the pooler record");
        return Attempt::Wait(unregistered(pod, record));
    };
    match reload::call(dial, &address, &desired.expected).await {
        Ok(response) => judge(&pod.name, &desired.reload_hash, reload::verdict(&response)),
        Err(error) => {
            tracing::warn!(pod = %pod.name, error = %ErrorChain(&error), "ReloadConfig failed; retrying");
            Attempt::Retry
        }
    }
}

/// Why `pod`'s reload waits when its pooler `record` names no address to call.
fn unregistered(pod: &PodState, record: Option<&PoolerRecord>) -> Notice {
    let note = match record {
        None => format!(
            "pod {}: waiting for its multipooler to register in cell {} to reload \
             postgresql.conf",
            pod.name,
            pod.cell.as_deref().unwrap_or("(unlabelled)")
        ),
        Some(r) => format!(
            "pod {}: its multipooler record {} has no hostname or no {:?} port; waiting for it \
             to re-register to reload postgresql.conf",
            pod.name,
            r.key,
            reload::GRPC_PORT
        ),
    };
    Notice::normal("ConfigReloadPending", note)
}

/// What `verdict`, the answer of `pod`'s reload to fingerprint `hash`, comes to.
fn judge(pod: &str, hash: &str, verdict: Verdict) -> Attempt {
    match verdict {
        Verdict::Reloaded => {
            tracing::info!(%pod, %hash, "PostgreSQL reloaded its configuration");
            Attempt::Reloaded
        }
        Verdict::NeedsRestart(settings) => Attempt::Wait(Notice::warning(
            "ConfigReloadNeedsRestart",
            format!(
                "pod {pod}: PostgreSQL applies {} only at start, though the operator classified \
                 them as reloadable; restart the pod to apply them",
                settings.join(", ")
            ),
        )),
        Verdict::Rejected(settings) => Attempt::Wait(Notice::warning(
            "ConfigReloadRejected",
            format!(
                "pod {pod}: PostgreSQL rejects postgresql.conf's {}, so it was not reloaded; \
                 correct the values in the postgres config",
                settings
                    .iter()
                    .map(|(name, error)| format!("{name} ({error})"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
        Verdict::NotYet(settings) => {
            tracing::debug!(%pod, ?settings, "mounted postgresql.conf not synced yet");
            Attempt::Retry
        }
    }
}
