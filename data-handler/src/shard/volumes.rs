//! The volumes step of the Shard controller: each pool pod's data volume usage, published as
//! `status.volumes` and, from there, as the `multigres_operator_shard_volume_*` gauges (the
//! `MultigresVolumeFillingUp` alert and the resource-handler's auto-grow read them).
//!
//! Multigres has no disk-usage call, so each pod is asked through its own multipooler as the
//! superuser (`ExecuteQuery`, read-only mode, so a replica answers too): the data directory's
//! two tablespaces and the WAL directory, in bytes. What the claim holds comes from the claim's
//! `status.capacity` in the watch cache (what storage gave, not what was asked for).
//!
//! Pods are asked at most every [`PERIOD`]; the figures are written only when one moved by
//! [`MOVE_PERCENT`] % of its capacity (or 1 MiB without one), the pods or capacities changed, or
//! the published ones are older than [`REFRESH`], so an idle shard's status is not rewritten
//! every pass.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use multigres_api::v1alpha1::VolumeUsage;
use multigres_api::volumes::parse_bytes;
use multigres_common::status_metrics::StatusGauges;

use crate::dial::Dial;
use crate::postgres_roles::Session;
use crate::reload;
use crate::roles::{self, PoolPod, ShardKey};
use crate::topo::PoolerRecord;

/// The usage statement ([`multigres_api::volumes::USAGE_SQL`]).
pub const USAGE: &str = multigres_api::volumes::USAGE_SQL;
/// How often each pod is asked.
pub const PERIOD: Duration = Duration::from_secs(30);
/// How far a figure moves, in percent of its capacity, before it is written again.
const MOVE_PERCENT: i64 = 1;
/// How old the published figures may get before they are written again anyway.
const REFRESH: Duration = Duration::from_secs(600);
/// Time allowed for the statement, connection included.
const TIMEOUT: Duration = Duration::from_secs(5);
/// Prefix of a pool pod's data claim (the claim template is named `data`).
const CLAIM_PREFIX: &str = "data-";

/// Reads the answer to [`USAGE`]: data and WAL bytes.
pub fn parse(answer: &str) -> Option<(i64, i64)> {
    let (data, wal) = answer.trim().split_once(' ')?;
    Some((data.parse().ok()?, wal.parse().ok()?))
}

/// The capacity of pod `pod`'s data claim among `claims`, in bytes.
pub fn capacity(claims: &[PersistentVolumeClaim], pod: &str) -> Option<i64> {
    let name = format!("{CLAIM_PREFIX}{pod}");
    let claim = claims
        .iter()
        .find(|c| c.metadata.name.as_deref() == Some(name.as_str()))?;
    let given = claim.status.as_ref()?.capacity.as_ref()?.get("storage")?;
    i64::try_from(parse_bytes(&given.0)?).ok()
}

/// When each shard's pods were last asked (`namespace/shard`), so they are asked once a
/// [`PERIOD`] whatever wakes the reconcile.
#[derive(Debug, Default)]
pub struct Pacer(Mutex<HashMap<String, Instant>>);

impl Pacer {
    /// Whether `shard`'s pods are due to be asked at `now`; if so, records that they are.
    /// Entries older than ten periods (shards gone, or no longer asked) are dropped.
    pub fn due(&self, shard: &str, now: Instant) -> bool {
        let mut asked = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        asked.retain(|_, at| now.saturating_duration_since(*at) < PERIOD * 10);
        match asked.get(shard) {
            Some(at) if now.saturating_duration_since(*at) < PERIOD => false,
            _ => {
                asked.insert(shard.to_owned(), now);
                true
            }
        }
    }
}

/// The figures to publish: each of `pods` with its new measurement from `measured`, else as
/// `stored`; `stored` itself when nothing moved enough to be written (see the module doc).
pub fn next(
    stored: &[VolumeUsage],
    pods: &[PoolPod],
    measured: &BTreeMap<String, VolumeUsage>,
    now: Timestamp,
) -> Vec<VolumeUsage> {
    let old = |pod: &str| stored.iter().find(|v| v.pod == pod);
    let mut next: Vec<VolumeUsage> = pods
        .iter()
        .filter_map(|pod| measured.get(&pod.name).or_else(|| old(&pod.name)).cloned())
        .collect();
    next.sort_by(|a, b| a.pod.cmp(&b.pod));
    let moved = next.len() != stored.len()
        || next.iter().any(|v| match old(&v.pod) {
            None => true,
            Some(o) => {
                let step = v
                    .capacity_bytes
                    .map_or(1 << 20, |c| (c * MOVE_PERCENT / 100).max(1));
                o.capacity_bytes != v.capacity_bytes
                    || (o.data_bytes - v.data_bytes).abs() >= step
                    || (o.wal_bytes - v.wal_bytes).abs() >= step
                    || now.duration_since(o.measured_at.0).unsigned_abs() >= REFRESH
            }
        });
    if moved { next } else { stored.to_vec() }
}

/// Asks each of `pods` (through the multipooler its record in `poolers` names) for its usage,
/// as `superuser`; `claims` give the capacities. Pods that do not answer are left out (and
/// logged): their published figures stay.
pub async fn measure(
    dial: &Dial,
    key: ShardKey<'_>,
    superuser: &str,
    pods: &[PoolPod],
    poolers: &BTreeMap<String, Option<Vec<PoolerRecord>>>,
    claims: &[PersistentVolumeClaim],
) -> BTreeMap<String, VolumeUsage> {
    let mut out = BTreeMap::new();
    for pod in pods {
        let Some(address) = roles::pooler_of(key, pod, poolers).and_then(reload::address) else {
            continue;
        };
        let session = Session {
            key,
            superuser: superuser.to_owned(),
            address,
        };
        match ask(dial, &session).await {
            Ok((data_bytes, wal_bytes)) => {
                out.insert(
                    pod.name.clone(),
                    VolumeUsage {
                        pod: pod.name.clone(),
                        data_bytes,
                        wal_bytes,
                        capacity_bytes: capacity(claims, &pod.name),
                        measured_at: Time(Timestamp::now()),
                    },
                );
            }
            Err(why) => {
                tracing::info!(pod = %pod.name, why, "cannot measure the volume usage now; the published figures stay");
            }
        }
    }
    out
}

/// Runs [`USAGE`] on the pod behind `session`.
async fn ask(dial: &Dial, session: &Session<'_>) -> Result<(i64, i64), String> {
    let line = session
        .ask(dial, session.read_request(USAGE), TIMEOUT)
        .await?;
    parse(&line).ok_or_else(|| format!("the usage statement answered {line:?}"))
}

/// Sets the volume gauges of one Shard from its published figures.
pub fn collect(gauges: &mut StatusGauges, namespace: &str, shard: &str, volumes: &[VolumeUsage]) {
    for v in volumes {
        gauges.set_shard_volume(
            namespace,
            shard,
            &v.pod,
            (v.data_bytes, v.wal_bytes),
            v.capacity_bytes,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(pod: &str, data: i64, wal: i64, capacity: Option<i64>, at: i64) -> VolumeUsage {
        VolumeUsage {
            pod: pod.to_owned(),
            data_bytes: data,
            wal_bytes: wal,
            capacity_bytes: capacity,
            measured_at: Time(Timestamp::from_second(at).unwrap()),
        }
    }

    fn pod(name: &str) -> PoolPod {
        PoolPod {
            name: name.to_owned(),
            cell: None,
        }
    }

    #[test]
    fn the_answer_is_data_then_wal() {
        assert_eq!(parse("52428800 16777216"), Some((52_428_800, 16_777_216)));
        assert_eq!(parse("1 x"), None);
        assert_eq!(parse("1"), None);
    }

    #[test]
    fn the_claim_capacity_is_what_storage_gave() {
        let claim: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "data-p-0"},
            "spec": {"resources": {"requests": {"storage": "1Gi"}}},
            "status": {"capacity": {"storage": "2Gi"}},
        }))
        .unwrap();
        assert_eq!(capacity(std::slice::from_ref(&claim), "p-0"), Some(2 << 30));
        assert_eq!(capacity(&[claim], "p-1"), None);
    }

    #[test]
    fn pods_are_asked_once_a_period() {
        let pacer = Pacer::default();
        let start = Instant::now();
        assert!(pacer.due("db/s", start));
        assert!(!pacer.due("db/s", start + Duration::from_secs(10)));
        assert!(pacer.due("db/other", start + Duration::from_secs(10)));
        assert!(pacer.due("db/s", start + PERIOD));
    }

    #[test]
    fn figures_are_written_when_they_move_and_gone_pods_leave() {
        let gib = 1 << 30;
        let now = Timestamp::from_second(1_000).unwrap();
        let stored = vec![
            usage("p-0", 100 << 20, 16 << 20, Some(gib), 900),
            usage("p-1", 100 << 20, 16 << 20, Some(gib), 900),
        ];
        let pods = [pod("p-0"), pod("p-1")];
        // Less than 1 % of 1 GiB moved: the stored figures stay, unwritten.
        let small = BTreeMap::from([(
            "p-0".to_owned(),
            usage("p-0", (100 << 20) + (5 << 20), 16 << 20, Some(gib), 1_000),
        )]);
        assert_eq!(next(&stored, &pods, &small, now), stored);
        // 20 MiB more: written, with p-1 as stored.
        let big = BTreeMap::from([(
            "p-0".to_owned(),
            usage("p-0", 120 << 20, 16 << 20, Some(gib), 1_000),
        )]);
        let written = next(&stored, &pods, &big, now);
        assert_eq!(written[0].data_bytes, 120 << 20);
        assert_eq!(written[1], stored[1]);
        // A grown claim is written at once; a pod gone is dropped.
        let grown = BTreeMap::from([(
            "p-0".to_owned(),
            usage("p-0", 100 << 20, 16 << 20, Some(2 * gib), 1_000),
        )]);
        assert_eq!(
            next(&stored, &pods[..1], &grown, now),
            [usage("p-0", 100 << 20, 16 << 20, Some(2 * gib), 1_000)]
        );
        // Ten minutes on, the same figures are written again.
        let late = Timestamp::from_second(1_600).unwrap();
        let same = BTreeMap::from([(
            "p-0".to_owned(),
            usage("p-0", 100 << 20, 16 << 20, Some(gib), 1_600),
        )]);
        assert_ne!(next(&stored, &pods, &same, late), stored);
    }
}
