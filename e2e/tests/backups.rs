//! Backups to S3 on real nodes: the minimal sample with `backup.type: s3` against a real S3
//! server (Versity's S3 gateway over TLS, SigV4 with the keys of a Secret; `multigres_e2e::s3`), three
//! pool pods, and what a user sees, under a steady writer: the bootstrap backup and the WAL
//! archive in the bucket under the cluster's key prefix, the backup in the Shard status;
//! backups on a schedule (`backup.schedule`), taken on a replica and expired by `retainFull`
//! in the bucket and the status; backups on request (`multigres.com/backup-request`), a second
//! one queued behind the first; a replica whose volume is lost rebuilt from that repository,
//! holding every row; and the whole shard recovered from the bucket after every volume of the
//! namespace is deleted with the cluster.
//!
//! One cluster, one story, as in `data_plane.rs`; the figures (`[figure] …`) are printed, not
//! asserted.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{DeleteParams, ListParams, LogParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use multigres_api::backup_request;
use multigres_api::v1alpha1::{
    BACKUP_REPOSITORY, BackupRequestPhase, BackupRequestRollup, BackupRequestState,
    MultigresCluster, Shard, ShardStatus,
};
use multigres_e2e::cluster::LocalCluster;
use multigres_e2e::harness::{eventually, fresh_namespace, run_plugin};
use multigres_e2e::load::{Load, assert_kept, create_ledger, figure, ledger};
use multigres_e2e::manifest::{self, Mode};
use multigres_e2e::real::{Endpoint, is_ready, operator_installed};
use multigres_e2e::s3::{self, Object, S3Server};
use multigres_e2e::sample::{
    NAME, WAIT, apply_sample, cohort_until, pool_pods, settled_roles, shard, shard_events,
    wait_serving, wait_serving_pools_returned, whole,
};
use serde_json::{Value, json};

/// The full backups (`<label>` of each `backup/<stanza>/<label>/backup.manifest`) and the WAL
/// segments (`archive/<stanza>/<pg version>/<timeline+log>/<24 hex digits>-<checksum>…`)
/// among `objects`.
fn repository(objects: &[Object]) -> (Vec<String>, Vec<String>) {
    let mut backups = Vec::new();
    let mut segments = Vec::new();
    for object in objects {
        let parts: Vec<&str> = object.key.split('/').collect();
        match parts.as_slice() {
            [.., "backup", _, label, "backup.manifest"] if label.ends_with('F') => {
                backups.push((*label).to_owned());
            }
            [.., "archive", _, _, _, file]
                if file.len() > 24 && file[..24].bytes().all(|b| b.is_ascii_hexdigit()) =>
            {
                segments.push((*file).to_owned());
            }
            _ => {}
        }
    }
    (backups, segments)
}

/// The names of the pod's own PersistentVolumeClaims (its volume claim templates').
/// Clients of the burst in [`a_client_burst_leaves_the_writer_alone`], as in issue 38's
/// `pgbench -S -c 100`.
const BURST_CLIENTS: usize = 100;

/// Runs [`BURST_CLIENTS`] clients through the gateway for 20 s, each on its own connection
/// running `SELECT 1` as fast as it can, beside a steady writer that goes on 10 s after; returns
/// the rows the writer had acknowledged.
async fn a_client_burst_leaves_the_writer_alone(gateway: &Endpoint) -> Vec<i64> {
    let load = Load::start(gateway.clone(), 3_000_000);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let until = Instant::now() + Duration::from_secs(20);
    let clients: Vec<_> = (0..BURST_CLIENTS)
        .map(|_| {
            let gateway = gateway.clone();
            tokio::spawn(async move {
                let client = match gateway.connect().await {
                    Ok(client) => client,
                    Err(error) => return (0_u64, Some(format!("connect: {error}"))),
                };
                let mut answered = 0;
                while Instant::now() < until {
                    if let Err(error) = client.simple_query("SELECT 1").await {
                        return (answered, Some(error.to_string()));
                    }
                    answered += 1;
                }
                (answered, None)
            })
        })
        .collect();
    let mut answered = 0;
    let mut refused = Vec::new();
    for client in clients {
        let (n, error) = client.await.unwrap();
        answered += n;
        refused.extend(error);
    }
    println!(
        "burst: {BURST_CLIENTS} clients, {answered} statements answered, {} clients failed, \
         first errors {:?}",
        refused.len(),
        refused.iter().take(3).collect::<Vec<_>>()
    );
    let ended = Instant::now();
    let fresh = gateway.query("SELECT 1").await;
    let to_fresh = ended.elapsed();
    assert!(fresh.is_ok(), "a new client after the burst: {fresh:?}");
    tokio::time::sleep(Duration::from_secs(10)).await;
    let report = load.finish().await;
    assert_eq!(
        report.failed, 0,
        "the writer's statements failed during or after the burst: {:?}",
        report.errors
    );
    figure("client burst: clients that failed, of 100", refused.len());
    figure("client burst: statements answered in 20 s", answered);
    figure(
        "client burst ended -> a new client answered (s)",
        format!("{:.2}", to_fresh.as_secs_f64()),
    );
    report.figures("a burst of 100 clients");
    report.acknowledged.clone()
}

/// The Shard's `PrimaryServing` condition, as `(status, reason, message)`.
async fn primary_serving(client: &Client, namespace: &str) -> Option<(String, String, String)> {
    let status = shard(client, namespace).await.status?;
    status
        .conditions
        .into_iter()
        .find(|c| c.type_ == multigres_api::v1alpha1::PRIMARY_SERVING)
        .map(|c| (c.status, c.reason, c.message))
}

/// Takes every connection slot of the primary with direct superuser sessions, waits for the
/// Shard's `PrimaryServing` to turn False (`ConnectionSlotsExhausted`), closes them and waits
/// for it to turn True and for the gateway to answer again.
async fn slots_exhausted_turn_primary_serving_red(
    client: &Client,
    namespace: &str,
    gateway: &Endpoint,
) {
    let password = gateway.password.clone();
    let (primary, _) = settled_roles(client, namespace, &password, 3).await;
    let pod = Api::<Pod>::namespaced(client.clone(), namespace)
        .get(&primary)
        .await
        .unwrap();
    let direct = Endpoint::pod(&pod, &password).unwrap();
    let mut sessions = Vec::new();
    let refusal = loop {
        assert!(
            sessions.len() < 200,
            "{} sessions and no refusal",
            sessions.len()
        );
        match direct.connect().await {
            Ok(session) => sessions.push(session),
            Err(error) => break error,
        }
    };
    println!(
        "{} direct sessions on the primary {primary}, then: {refusal}",
        sessions.len()
    );
    let taken = Instant::now();
    let red = eventually("PrimaryServing False", WAIT, || async {
        match primary_serving(client, namespace).await {
            Some((status, reason, message)) if status == "False" => Ok((reason, message)),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let to_red = taken.elapsed();
    println!("PrimaryServing False: {red:?}");
    assert_eq!(red.0, "ConnectionSlotsExhausted", "{red:?}");
    assert!(
        red.1.contains(&primary),
        "the message names the primary: {red:?}"
    );
    drop(sessions);
    let released = Instant::now();
    eventually("PrimaryServing True again", WAIT, || async {
        match primary_serving(client, namespace).await {
            Some((status, ..)) if status == "True" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let to_green = released.elapsed();
    eventually("the gateway answers again", WAIT, || async {
        gateway.query("SELECT 1").await.map(|_| ())
    })
    .await;
    figure(
        "primary's slots all taken -> PrimaryServing False (s)",
        format!("{:.1}", to_red.as_secs_f64()),
    );
    figure(
        "sessions closed -> PrimaryServing True (s)",
        format!("{:.1}", to_green.as_secs_f64()),
    );
}

/// Breaks a replica's data directory so its PostgreSQL cannot start, then waits for the pod to
/// be quarantined, replaced on a new volume, streaming and back in a whole cohort, under a
/// writer; returns the rows the writer had acknowledged.
async fn quarantined_replica_is_replaced(
    client: &Client,
    namespace: &str,
    gateway: &Endpoint,
) -> Vec<i64> {
    let password = gateway.password.clone();
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
    let (_, roles) = settled_roles(client, namespace, &password, 3).await;
    let sick = roles
        .iter()
        .find(|(_, role)| role.as_str() == "REPLICA")
        .map(|(pod, _)| pod.clone())
        .unwrap_or_else(|| panic!("a replica among {roles:?}"));
    let old = pods.get(&sick).await.unwrap();
    let old_claims = claim_uids(&claims, &old).await;
    Endpoint::pod(&old, &password)
        .unwrap()
        .query("COPY (SELECT 'not a version') TO '/var/lib/pooler/pg_data/PG_VERSION'")
        .await
        .unwrap_or_else(|e| panic!("overwriting {sick}'s PG_VERSION: {e}"));
    let load = Load::start(gateway.clone(), 2_000_000);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let broken_at = Instant::now();
    pods.delete(&sick, &DeleteParams::default()).await.unwrap();
    eventually("the Shard publishes the pod QUARANTINED", WAIT, || async {
        let roles = shard(client, namespace)
            .await
            .status
            .unwrap_or_default()
            .pod_roles;
        match roles.get(&sick) {
            Some(role) if role == "QUARANTINED" => Ok(()),
            role => Err(format!("{sick}: {role:?}")),
        }
    })
    .await;
    let to_quarantined = broken_at.elapsed();
    let rebuilt = eventually(
        "the quarantined pod replaced on a new volume",
        WAIT,
        || async {
            for (name, uid) in &old_claims {
                let claim = claims.get(name).await.map_err(|e| e.to_string())?;
                if claim.uid() == *uid {
                    return Err(format!("{name} is still the old claim"));
                }
            }
            let pod = pods.get(&sick).await.map_err(|e| e.to_string())?;
            if !is_ready(&pod) {
                return Err(format!("{sick} on its new volume is not Ready"));
            }
            Ok(pod)
        },
    )
    .await;
    let to_ready = broken_at.elapsed();
    let endpoint = Endpoint::pod(&rebuilt, &password).unwrap();
    wait_streaming(&endpoint, "the replaced pod streams from the primary").await;
    cohort_until(
        client,
        namespace,
        "the replaced pod back in a whole cohort",
        |c, h, _| whole(c, 3) && h == ("True", "CohortComplete"),
    )
    .await;
    let to_cohort = broken_at.elapsed();
    let events = shard_events(client, namespace).await;
    for reason in ["PoolerQuarantined", "ReplacingQuarantinedPod"] {
        let told = events.iter().find(|e| e.contains(&format!(" {reason}: ")));
        let told = told.unwrap_or_else(|| panic!("no {reason} event among {events:#?}"));
        println!("{told}");
    }
    let report = load.finish().await;
    println!(
        "quarantine of {sick}: {} ok, {} failed, first errors {:?}",
        report.ok, report.failed, report.errors
    );
    eventually(
        "the replaced pod holds every acknowledged row",
        WAIT,
        || async {
            let ids = ledger(&endpoint).await?;
            match report
                .acknowledged
                .iter()
                .filter(|id| !ids.contains(id))
                .count()
            {
                0 => Ok(()),
                n => Err(format!(
                    "{n} of {} acknowledged rows missing",
                    report.acknowledged.len()
                )),
            }
        },
    )
    .await;
    figure(
        "replica's PG_VERSION broken, pod deleted -> QUARANTINED (s)",
        format!("{:.1}", to_quarantined.as_secs_f64()),
    );
    figure(
        "replica's PG_VERSION broken, pod deleted -> replaced pod Ready (s)",
        format!("{:.1}", to_ready.as_secs_f64()),
    );
    figure(
        "replica's PG_VERSION broken, pod deleted -> back in a whole cohort (s)",
        format!("{:.1}", to_cohort.as_secs_f64()),
    );
    report.figures("the quarantined replica's replacement");
    report.acknowledged.clone()
}

/// Waits until `endpoint`, a replica, streams WAL from the primary.
async fn wait_streaming(endpoint: &Endpoint, what: &str) {
    eventually(what, WAIT, || async {
        match endpoint
            .query("SELECT status FROM pg_stat_wal_receiver")
            .await?
        {
            rows if rows == [[Some("streaming".to_owned())]] => Ok(()),
            rows => Err(format!("WAL receiver {rows:?}")),
        }
    })
    .await;
}

/// The claims `pod` mounts of its own, each with its UID.
async fn claim_uids(
    claims: &Api<PersistentVolumeClaim>,
    pod: &Pod,
) -> BTreeMap<String, Option<String>> {
    let mut uids = BTreeMap::new();
    for name in own_claims(pod) {
        uids.insert(name.clone(), claims.get(&name).await.unwrap().uid());
    }
    uids
}

fn own_claims(pod: &Pod) -> Vec<String> {
    let name = pod.name_any();
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| v.persistent_volume_claim.as_ref())
        .map(|c| c.claim_name.clone())
        .filter(|claim| claim.ends_with(&name))
        .collect()
}

/// Applies the sample with S3 backups to `s3` under the key prefix `namespace`, and 3 pool pods.
async fn apply_with_s3(client: &Client, namespace: &str, s3: &S3Server) -> Instant {
    apply_sample(client, namespace, |cluster| {
        cluster["spec"]["backup"] = s3.backup_spec(namespace);
        cluster["spec"]["databases"] = json!([{"name": "postgres", "default": true,
            "tablegroups": [{"name": "default", "default": true, "shards": [{"name": "0-inf",
                "spec": {"pools": {"default": {"replicasPerCell": 3}}}}]}]}]);
    })
    .await
}

/// Sets `spec.backup.schedule` (merged into the S3 backup settings).
async fn set_schedule(client: &Client, namespace: &str, schedule: Value) {
    let clusters: Api<MultigresCluster> = Api::namespaced(client.clone(), namespace);
    let patch = json!({"spec": {"backup": {"schedule": schedule}}});
    clusters
        .patch(NAME, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("setting the backup schedule: {e}"));
}

/// The end of the primary's pgBackRest archive-push log, which says why a backup waited for a
/// WAL segment in vain.
async fn archive_push_log(namespace: &str, status: &ShardStatus) -> String {
    let Some(primary) = status
        .pod_roles
        .iter()
        .find(|(_, role)| role.as_str() == "PRIMARY")
        .map(|(pod, _)| pod.as_str())
    else {
        return format!("no primary in {:?}", status.pod_roles);
    };
    let tail = "tail -n 40 /var/lib/pooler/pgbackrest/log/*archive-push*.log";
    let cluster = operator_installed().await;
    let args = [
        "exec", "-n", namespace, primary, "-c", "postgres", "--", "sh", "-c", tail,
    ];
    match cluster.kubectl(&args).await {
        Ok(log) => format!("archive-push log of {primary}:\n{log}"),
        Err(e) => format!("archive-push log of {primary}: {e}"),
    }
}

/// Step b: a schedule of a full backup every minute keeping two, under a steady writer, until
/// the bootstrap backup (`bootstrap`, the bucket's only one so far) has expired; then
/// suspended. Extends `acknowledged`; returns the ids acknowledged before the last scheduled
/// backup started, which that backup holds.
async fn scheduled_backups(
    client: &Client,
    namespace: &str,
    bootstrap: &[String],
    acknowledged: &mut Vec<i64>,
) -> Vec<i64> {
    let s3 = s3::server().await;
    let gateway = Endpoint::gateway(client, namespace, NAME).await.unwrap();
    let load = Load::start(gateway, 1_000_000);
    let started = Instant::now();
    set_schedule(
        client,
        namespace,
        json!({"cron": "* * * * *", "retainFull": 2}),
    )
    .await;
    let reported = Mutex::new(BTreeSet::new());
    let status = eventually(
        "two scheduled backups kept, the bootstrap one expired",
        WAIT,
        || async {
            let status = shard(client, namespace).await.status.unwrap_or_default();
            let scheduled = status.scheduled_backups.clone().unwrap_or_default();
            if let Some(failure) = &scheduled.last_failure {
                let new = reported.lock().unwrap().insert(failure.start_time.0);
                if new {
                    println!("a scheduled backup failed (it is tried again): {failure:?}");
                    println!("{}", archive_push_log(namespace, &status).await);
                }
            }
            let retained = &status.retained_backups;
            let expired = bootstrap.iter().all(|b| !retained.contains(b));
            match &scheduled.last_success {
                Some(success) if retained.len() == 2 && expired && scheduled.running.is_none() => {
                    Ok((status.clone(), success.clone()))
                }
                _ => Err(format!("retained {retained:?}, scheduled {scheduled:?}")),
            }
        },
    )
    .await;
    let (status, last) = status;
    let to_expired = started.elapsed();
    let label = last
        .backup
        .clone()
        .expect("the label of the last scheduled backup");
    assert!(status.retained_backups.contains(&label), "{status:?}");
    assert_eq!(
        status.pod_roles.get(&last.pod).map(String::as_str),
        Some("REPLICA"),
        "taken on a replica: {last:?}, roles {:?}",
        status.pod_roles
    );
    let in_bucket = eventually(
        "the bucket holds the retained backups only",
        WAIT,
        || async {
            let mut full = repository(&s3.objects(namespace).await?).0;
            full.sort();
            let mut retained = status.retained_backups.clone();
            retained.sort();
            if full == retained {
                Ok(full)
            } else {
                Err(format!("bucket {full:?}, status {retained:?}"))
            }
        },
    )
    .await;
    set_schedule(
        client,
        namespace,
        json!({"cron": "* * * * *", "retainFull": 2, "suspend": true}),
    )
    .await;
    let report = load.finish().await;
    let before_last: Vec<i64> = report
        .acknowledged
        .iter()
        .zip(&report.acknowledged_at)
        .filter(|(_, at)| **at < last.start_time.0)
        .map(|(id, _)| *id)
        .collect();
    acknowledged.extend(&report.acknowledged);
    let events = shard_events(client, namespace).await;
    let failed = events
        .iter()
        .filter(|e| e.starts_with("Warning ScheduledBackupFailed: "))
        .count();
    figure("scheduled backups failed and tried again", failed);
    for reason in ["ScheduledBackupStarted", "ScheduledBackupCompleted"] {
        let told = format!("Normal {reason}: ");
        assert!(
            events.iter().any(|e| e.starts_with(&told)),
            "{reason} in {events:?}"
        );
    }
    let took = last
        .end_time
        .as_ref()
        .map(|end| end.0.duration_since(last.start_time.0).as_secs_f64());
    println!(
        "scheduled backups: last {label} on {} ({}), bucket {in_bucket:?}",
        last.pod,
        last.message.as_deref().unwrap_or("nothing expired")
    );
    figure(
        "schedule set -> bootstrap backup expired, 2 scheduled kept (s)",
        format!("{:.1}", to_expired.as_secs_f64()),
    );
    figure(
        "scheduled full backup on a replica, start to end as published (s)",
        format!("{:.0}", took.unwrap_or_default()),
    );
    report.figures("scheduled backups");
    before_last
}

/// Step b3: waits for `status.recoverableWindow` to start at the oldest retained backup and end
/// at an archived segment after it, not in the future; the plugin shows it.
async fn recoverable_window_is_published(
    cluster: &'static LocalCluster,
    client: &Client,
    namespace: &str,
) {
    let window = eventually(
        "the recoverable window in the Shard status",
        WAIT,
        || async {
            let status = shard(client, namespace).await.status.unwrap_or_default();
            let window = status.recoverable_window.clone().unwrap_or_default();
            let now = k8s_openapi::jiff::Timestamp::now();
            match (&window.earliest, &window.earliest_backup, &window.latest) {
                (Some(earliest), Some(label), Some(latest))
                    if status.retained_backups.first() == Some(label)
                        && earliest.0 < latest.0
                        && latest.0 <= now
                        && window.latest_wal.is_some() =>
                {
                    Ok(window)
                }
                _ => Err(format!(
                    "window {window:?}, retained {:?}",
                    status.retained_backups
                )),
            }
        },
    )
    .await;
    assert_eq!(window.archive_failing, None, "archiving works");
    println!("recoverable window: {window:?}");
    let screen = run_plugin(cluster, &["status", NAME, "-n", namespace])
        .await
        .unwrap();
    let label = window.earliest_backup.unwrap_or_default();
    assert!(
        screen.contains(&format!("(end of backup {label})")),
        "{screen}"
    );
}

/// Sets (`Some`) or removes the cluster's backup request annotation.
async fn request_backup(client: &Client, namespace: &str, id: Option<&str>) {
    let clusters: Api<MultigresCluster> = Api::namespaced(client.clone(), namespace);
    let patch = json!({"metadata": {"annotations": {backup_request::REQUEST: id}}});
    clusters
        .patch(NAME, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("setting the backup request {id:?}: {e}"));
}

/// The cluster's `status.backupRequest`, once it names `id` in a state `done` accepts.
async fn cluster_request(
    client: &Client,
    namespace: &str,
    id: &str,
    what: &str,
    done: impl Fn(BackupRequestPhase) -> bool,
) -> BackupRequestRollup {
    let clusters: Api<MultigresCluster> = Api::namespaced(client.clone(), namespace);
    eventually(what, WAIT, || async {
        let cluster = clusters.get(NAME).await.map_err(|e| e.to_string())?;
        let request = cluster.status.and_then(|s| s.backup_request);
        match request {
            Some(r) if r.id == id && done(r.state) => Ok(r),
            Some(r) if r.state == BackupRequestPhase::Failed => {
                panic!("request {} failed: {r:?}", r.id)
            }
            other => Err(format!("status.backupRequest {other:?}")),
        }
    })
    .await
}

/// Step b2: backups on request under a steady writer. A first request is taken on a replica
/// and completes in the cluster's status; a second one, sent while the first runs, is queued
/// and taken right after; each adds one full backup to the bucket; ids already answered, set
/// again, take none. Extends `acknowledged`.
async fn backups_on_request(client: &Client, namespace: &str, acknowledged: &mut Vec<i64>) {
    let s3 = s3::server().await;
    let full_backups = || async { repository(&s3.objects(namespace).await.unwrap()).0 };
    let before = full_backups().await;
    let gateway = Endpoint::gateway(client, namespace, NAME).await.unwrap();
    let load = Load::start(gateway, 4_000_000);
    let (first, second) = ("e2e-request-1", "e2e-request-2");
    let asked = Instant::now();
    request_backup(client, namespace, Some(first)).await;
    let running = eventually("the first request running on the shard", WAIT, || async {
        let status = shard(client, namespace).await.status.unwrap_or_default();
        match &status.requested_backup {
            Some(r) if r.id == first && r.state == BackupRequestState::Running => Ok(r.clone()),
            other => Err(format!("requestedBackup {other:?}")),
        }
    })
    .await;
    request_backup(client, namespace, Some(second)).await;
    let second_taken =
        cluster_request(client, namespace, second, "the second request taken", |s| {
            matches!(
                s,
                BackupRequestPhase::Running | BackupRequestPhase::Completed
            )
        })
        .await;
    let to_first = asked.elapsed();
    let done = cluster_request(
        client,
        namespace,
        second,
        "the second request completed",
        |s| s == BackupRequestPhase::Completed,
    )
    .await;
    let to_second = asked.elapsed();
    let status = shard(client, namespace).await.status.unwrap_or_default();
    let answered = |id: &str| match backup_request::answer(id, Some(&status)) {
        backup_request::ShardAnswer::Taken(r) if r.state == BackupRequestState::Completed => {
            r.clone()
        }
        other => panic!("request {id} on the shard: {other:?}"),
    };
    let (one, two) = (answered(first), answered(second));
    assert_eq!(
        status
            .pod_roles
            .get(one.pod.as_deref().unwrap_or_default())
            .map(String::as_str),
        Some("REPLICA"),
        "taken on a replica: {one:?}, roles {:?}",
        status.pod_roles
    );
    let labels: Vec<String> = [&one, &two]
        .iter()
        .map(|r| r.backup.clone().expect("the backup's label"))
        .collect();
    let after = eventually("both requested backups in the bucket", WAIT, || async {
        let now = full_backups().await;
        let new: Vec<&String> = now.iter().filter(|b| !before.contains(b)).collect();
        if new.len() == 2 && labels.iter().all(|l| now.contains(l)) {
            Ok(now.clone())
        } else {
            Err(format!(
                "before {before:?}, now {now:?}, requested {labels:?}"
            ))
        }
    })
    .await;
    let events = shard_events(client, namespace).await;
    let queued = format!(
        "Normal BackupRequestQueued: request {second} waits for the backup of request {first}"
    );
    assert!(
        events.iter().any(|e| e.starts_with(&queued)),
        "{queued} in {events:?}"
    );

    // The same ids again: the annotation removed, then set back to each answered id.
    let started = |events: &[String]| {
        events
            .iter()
            .filter(|e| e.starts_with("Normal BackupRequestStarted: "))
            .count()
    };
    let started_before = started(&events);
    for id in [second, first] {
        request_backup(client, namespace, None).await;
        request_backup(client, namespace, Some(id)).await;
    }
    tokio::time::sleep(3 * backup_runs_poll()).await;
    let status_again = shard(client, namespace).await.status.unwrap_or_default();
    assert_eq!(
        (&status_again.requested_backup, &status_again.queued_request),
        (&status.requested_backup, &None),
        "an answered id takes no new backup"
    );
    assert_eq!(full_backups().await, after, "no new backup in the bucket");
    assert_eq!(
        started(&shard_events(client, namespace).await),
        started_before
    );

    let report = load.finish().await;
    acknowledged.extend(&report.acknowledged);
    assert_eq!(
        report.failed, 0,
        "statements failed during the requested backups: {:?}",
        report.errors
    );
    println!(
        "requested backups: {first} {} on {} (started {}), {second} {} on {}; cluster {done:?}; \
         taken while the first ran: {second_taken:?}",
        labels[0],
        one.pod.as_deref().unwrap_or_default(),
        running
            .started_at
            .map(|t| t.0.to_string())
            .unwrap_or_default(),
        labels[1],
        two.pod.as_deref().unwrap_or_default(),
    );
    figure(
        "backup request annotated -> the request behind it taken (s)",
        format!("{:.1}", to_first.as_secs_f64()),
    );
    figure(
        "two backup requests annotated -> both completed in the cluster status (s)",
        format!("{:.1}", to_second.as_secs_f64()),
    );
    report.figures("the requested backups");
}

/// How often the data-handler looks at a running backup (its `backup_runs::POLL`).
fn backup_runs_poll() -> Duration {
    Duration::from_secs(10)
}

/// Rows of the restore step's `moments` table: `batch` 1 before the target time, 2 after.
async fn insert_moments(gateway: &Endpoint, batch: i64) {
    let sql = format!(
        "INSERT INTO moments (id, batch) SELECT {batch} * 1000 + g, {batch} \
         FROM generate_series(1, 200) g ON CONFLICT DO NOTHING"
    );
    eventually("a batch of moments written", WAIT, || gateway.query(&sql)).await;
}

/// The `batch` of every row of `moments` at `endpoint`.
async fn moments(endpoint: &Endpoint) -> Result<BTreeMap<i64, usize>, String> {
    let rows = endpoint
        .query("SELECT batch, count(*) FROM moments GROUP BY batch")
        .await?;
    Ok(rows
        .iter()
        .filter_map(|r| {
            let batch = r[0].as_deref()?.parse().ok()?;
            Some((batch, r[1].as_deref()?.parse().ok()?))
        })
        .collect())
}

/// The sample's MultigresCluster, with `edit` applied, sent to `namespace` as a server-side
/// dry run (admission runs, nothing is stored): the API server's refusal, if any.
async fn dry_run_sample(
    client: &Client,
    namespace: &str,
    edit: impl Fn(&mut Value),
) -> Option<String> {
    let path = multigres_e2e::harness::repo_path("deploy/samples/minimal.yaml");
    let mut cluster = manifest::read_documents(&path)
        .unwrap()
        .into_iter()
        .find(|d| {
            d.types
                .as_ref()
                .is_some_and(|t| t.kind == "MultigresCluster")
        })
        .expect("the sample's MultigresCluster");
    edit(&mut cluster.data);
    manifest::apply(client, &cluster, Some(namespace), Mode::DryRun)
        .await
        .err()
        .map(|e| e.to_string())
}

/// Step b4: a point-in-time recovery into a new namespace. 200 rows, a time T, 200 more; once
/// the WAL past T is in the bucket, the same cluster (name, shape) is applied in another
/// namespace with its own key prefix and `backup.recovery` naming this repository and T. Its
/// recovery Job restores T and writes it as the first backup of the new repository, and its
/// pods restore that: every row of the first batch is there, none of the second. The source
/// writes on under a steady writer that fails no statement. Before that, admission refuses a
/// target before the source's recoverable window (naming it), and a second cluster writing
/// into the source's repository.
async fn recover_to_a_time_in_a_new_namespace(
    cluster: &'static LocalCluster,
    client: &Client,
    namespace: &str,
    gateway: &Endpoint,
) {
    let s3 = s3::server().await;
    gateway
        .query("CREATE TABLE IF NOT EXISTS moments (id bigint PRIMARY KEY, batch int)")
        .await
        .unwrap();
    insert_moments(gateway, 1).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let target = gateway
        .query(r#"SELECT to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')"#)
        .await
        .unwrap()[0][0]
        .clone()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    insert_moments(gateway, 2).await;
    let segments = repository(&s3.objects(namespace).await.unwrap()).1.len();
    gateway.query("SELECT pg_switch_wal()").await.unwrap();
    eventually("the WAL past the target in the bucket", WAIT, || async {
        let now = repository(&s3.objects(namespace).await?).1.len();
        if now > segments {
            Ok(())
        } else {
            Err(format!("{now} segments, {segments} before the switch"))
        }
    })
    .await;

    // The source's repository is marked as its cluster's, on this Kubernetes cluster.
    let kubernetes = Api::<Namespace>::all(client.clone())
        .get("kube-system")
        .await
        .unwrap()
        .uid()
        .unwrap();
    let marker = s3.object(&format!("{namespace}/multigres/owner")).await;
    assert_eq!(
        marker.unwrap().as_deref().map(str::trim_end),
        Some(format!("cluster={namespace}/{NAME} kubernetes={kubernetes}").as_str()),
        "the marker of the source's repository"
    );

    let load = Load::start(gateway.clone(), 5_000_000);
    let restored = fresh_namespace(cluster, "restored").await;
    s3::create_credentials(client, &restored).await;
    let source = s3.backup_spec(namespace)["s3"].clone();
    let window = shard(client, namespace)
        .await
        .status
        .and_then(|s| s.recoverable_window)
        .expect("the window of step b3");
    let too_early = dry_run_sample(client, &restored, |c| {
        c["spec"]["backup"] = s3.backup_spec(&restored);
        c["spec"]["backup"]["recovery"] =
            json!({"source": source, "target": {"time": "2026-01-01T00:00:00Z"}});
    })
    .await
    .expect("a target before the window is refused");
    let earliest = window.earliest.as_ref().unwrap().0.to_string();
    assert!(
        too_early.contains("before the recoverable window") && too_early.contains(&earliest),
        "{too_early}"
    );
    println!("a target before the window: {too_early}");
    let taken = dry_run_sample(client, &restored, |c| {
        c["spec"]["backup"] = s3.backup_spec(namespace);
    })
    .await
    .expect("a second cluster writing the source's repository is refused");
    assert!(
        taken.contains(&format!("MultigresCluster {namespace}/{NAME}'s")),
        "{taken}"
    );
    println!("a second cluster on the source's repository: {taken}");
    // The new cluster's own repository already marked by a cluster of another Kubernetes
    // cluster, which the webhook cannot see: no pod starts until the marker is released.
    let own_marker = format!("{restored}/multigres/owner");
    s3.put_object(
        &own_marker,
        &format!("cluster={restored}/{NAME} kubernetes=another-kubernetes-cluster\n"),
    )
    .await
    .unwrap();
    apply_sample(client, &restored, |c| {
        c["spec"]["backup"] = s3.backup_spec(&restored);
        c["spec"]["backup"]["recovery"] = json!({"source": source, "target": {"time": target}});
        c["spec"]["databases"] = json!([{"name": "postgres", "default": true,
            "tablegroups": [{"name": "default", "default": true, "shards": [{"name": "0-inf",
                "spec": {"pools": {"default": {"replicasPerCell": 3}}}}]}]}]);
    })
    .await;
    let refused = refused_repository(client, &restored).await;
    assert!(
        refused.contains("kubernetes=another-kubernetes-cluster"),
        "{refused}"
    );
    println!("a repository another Kubernetes cluster's cluster marked: {refused}");
    s3.delete_object(&own_marker).await.unwrap();
    let jobs: Api<Job> = Api::namespaced(client.clone(), &restored);
    let sent = Instant::now();
    for job in jobs.list(&ListParams::default()).await.unwrap() {
        jobs.delete(&job.name_any(), &DeleteParams::background())
            .await
            .unwrap();
    }
    let recovery = shard_condition(client, &restored, "Recovery", |c| {
        (c.status == "True" || c.reason == "RecoveryFailed")
            .then(|| format!("{}: {}", c.reason, c.message))
    })
    .await;
    assert!(recovery.starts_with("Restored"), "{recovery}");
    let recovered_in = sent.elapsed();
    let (_, to_sql) = wait_serving_pools_returned(client, &restored, sent).await;
    let new_gateway = Endpoint::gateway(client, &restored, NAME).await.unwrap();
    let found = eventually("the restored moments read back", WAIT, || {
        moments(&new_gateway)
    })
    .await;
    let report = load.finish().await;
    report.figures("the recovery into a new namespace (the source's writer)");
    assert_eq!(
        report.failed, 0,
        "the source failed statements: {:?}",
        report.errors
    );
    assert_eq!(
        found,
        BTreeMap::from([(1, 200)]),
        "restored to {target}: every row of the first batch, none of the second"
    );
    let own = s3.objects(&restored).await.unwrap();
    assert!(
        !repository(&own).0.is_empty(),
        "the new repository holds its first backup"
    );
    println!("recovery to {target}: {recovery}");
    figure(
        "recovery to a time into a new namespace: marker released -> Recovery True (s)",
        format!("{:.1}", recovered_in.as_secs_f64()),
    );
    figure(
        "recovery to a time into a new namespace: marker released -> first SELECT 1 answered (s)",
        format!("{:.1}", to_sql.as_secs_f64()),
    );
    let clusters: Api<MultigresCluster> = Api::namespaced(client.clone(), &restored);
    clusters
        .delete(NAME, &DeleteParams::default())
        .await
        .unwrap();
}

/// Waits for the Shard of `namespace` to report its backup repository as another cluster's,
/// checks that no pool StatefulSet was made, and returns the condition's message.
async fn refused_repository(client: &Client, namespace: &str) -> String {
    let message = shard_condition(client, namespace, BACKUP_REPOSITORY, |c| {
        (c.reason == "OwnedByAnotherCluster").then(|| c.message.clone())
    })
    .await;
    let statefulsets: Api<StatefulSet> = Api::namespaced(client.clone(), namespace);
    let pools: Vec<String> = statefulsets
        .list(&ListParams::default().labels("app.kubernetes.io/component=shard-pool"))
        .await
        .unwrap()
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    assert!(pools.is_empty(), "pool StatefulSets made: {pools:?}");
    message
}

/// Waits until `done` takes the condition `type_` of the Shard of `namespace`, and returns
/// what it made of it.
async fn shard_condition<T>(
    client: &Client,
    namespace: &str,
    type_: &str,
    done: impl Fn(&Condition) -> Option<T>,
) -> T {
    let shards: Api<Shard> = Api::namespaced(client.clone(), namespace);
    eventually(&format!("the Shard's {type_} condition"), WAIT, || async {
        let listed = shards
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        let status = listed.items.first().and_then(|s| s.status.clone());
        let condition = status
            .unwrap_or_default()
            .conditions
            .into_iter()
            .find(|c| c.type_ == type_);
        match condition.as_ref().and_then(&done) {
            Some(taken) => Ok(taken),
            None => Err(format!("{condition:?}")),
        }
    })
    .await
}

/// Step e: deletes the cluster and every claim of `namespace`, applies the cluster again and
/// checks that the ids of `in_backup` are all back; prints how many of `acknowledged` are.
async fn recover_from_the_bucket(
    client: &Client,
    namespace: &str,
    s3: &S3Server,
    in_backup: &[i64],
    acknowledged: &[i64],
) {
    let clusters: Api<MultigresCluster> = Api::namespaced(client.clone(), namespace);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    clusters
        .delete(NAME, &DeleteParams::default())
        .await
        .unwrap();
    eventually("the cluster and its pods are gone", WAIT, || async {
        let left = pods
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?
            .items
            .len();
        let cluster = clusters.get_opt(NAME).await.map_err(|e| e.to_string())?;
        match (left, cluster) {
            (0, None) => Ok(()),
            (left, cluster) => Err(format!("{left} pods, cluster {}", cluster.is_some())),
        }
    })
    .await;
    claims
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .unwrap();
    eventually("every claim is gone", WAIT, || async {
        let left = claims
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        let names: Vec<String> = left.items.iter().map(ResourceExt::name_any).collect();
        if names.is_empty() {
            Ok(())
        } else {
            Err(format!("claims {names:?}"))
        }
    })
    .await;
    let sent = apply_with_s3(client, namespace, s3).await;
    let (_, to_sql) = wait_serving_pools_returned(client, namespace, sent).await;
    let gateway = Endpoint::gateway(client, namespace, NAME).await.unwrap();
    let ids = eventually("the recovered ledger reads back", WAIT, || ledger(&gateway)).await;
    let lost: Vec<&i64> = in_backup.iter().filter(|id| !ids.contains(id)).collect();
    assert!(
        lost.is_empty(),
        "{} of {} rows acknowledged before the last backup are not back: {lost:?}",
        lost.len(),
        in_backup.len()
    );
    let back = acknowledged.iter().filter(|id| ids.contains(id)).count();
    figure(
        "every volume lost, cluster applied again -> first SELECT 1 answered (s)",
        format!("{:.1}", to_sql.as_secs_f64()),
    );
    figure(
        "rows back after recovery from the bucket (acknowledged before the last backup / all acknowledged)",
        format!(
            "{} of {} / {back} of {}",
            in_backup.len(),
            in_backup.len(),
            acknowledged.len()
        ),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_lost_its_volume_is_rebuilt_from_the_s3_repository() {
    let began = Instant::now();
    let cluster = operator_installed().await;
    let s3 = s3::server().await;
    let client = cluster.client().unwrap();
    let namespace = fresh_namespace(cluster, "backups").await;

    // a. The cluster serves SQL; its bootstrap backup and the WAL archive are in the bucket
    // under the key prefix, and the Shard status shows the backup.
    s3::create_credentials(&client, &namespace).await;
    let sent = apply_with_s3(&client, &namespace, s3).await;
    let (_, to_sql) = wait_serving(&client, &namespace, sent).await;
    figure(
        "apply with S3 backups -> first SELECT 1 answered (s)",
        format!("{:.1}", to_sql.as_secs_f64()),
    );
    let gateway = Endpoint::gateway(&client, &namespace, NAME).await.unwrap();
    let password = gateway.password.clone();
    let mut acknowledged = create_ledger(&gateway).await;

    let (backups, segments, objects) =
        eventually("a full backup and WAL in the bucket", WAIT, || async {
            let objects = s3.objects(&namespace).await?;
            let (backups, segments) = repository(&objects);
            if backups.is_empty() || segments.is_empty() {
                let keys: Vec<&str> = objects.iter().map(|o| o.key.as_str()).collect();
                return Err(format!("objects under {namespace}/: {keys:?}"));
            }
            Ok((backups, segments, objects))
        })
        .await;
    let bytes: u64 = objects.iter().map(|o| o.size).sum();
    println!(
        "bucket {}/{namespace}/: {} objects, {bytes} bytes; backups {backups:?}; {} WAL segments",
        s3::BUCKET,
        objects.len(),
        segments.len()
    );
    let other = objects
        .iter()
        .find(|o| !o.key.starts_with(&format!("{namespace}/")));
    assert!(other.is_none(), "an object outside the prefix: {other:?}");
    let (backup_time, healthy) = eventually("the backup in the Shard status", WAIT, || async {
        let status = shard(&client, &namespace).await.status.unwrap_or_default();
        let healthy = status
            .conditions
            .iter()
            .find(|c| c.type_ == "BackupHealthy")
            .map(|c| (c.status.clone(), c.message.clone()));
        match (&status.last_backup_time, healthy) {
            (Some(at), Some((state, message))) if state == "True" => Ok((at.0, message)),
            (at, healthy) => Err(format!("lastBackupTime {at:?}, BackupHealthy {healthy:?}")),
        }
    })
    .await;
    println!("Shard: lastBackupTime {backup_time}, BackupHealthy: {healthy}");

    // b. Scheduled backups under a steady writer: every minute, two full backups kept. Each is
    // taken on a replica; once two are, the bootstrap backup expires from the bucket and from
    // `status.retainedBackups`. Then the schedule is suspended.
    let before_schedule = scheduled_backups(&client, &namespace, &backups, &mut acknowledged).await;

    // b2. Backups on request under a steady writer (the schedule suspended): the annotation
    // multigres.com/backup-request with an id; a second id sent while the first runs is queued
    // and taken right after; each adds a full backup to the bucket, no statement fails, and an
    // id already answered, set again, takes no backup.
    backups_on_request(&client, &namespace, &mut acknowledged).await;

    // b3. The recoverable window in the Shard status and on the plugin's screen: from the end
    // of the oldest backup the repository keeps to the last WAL segment the primary archived.
    recoverable_window_is_published(cluster, &client, &namespace).await;

    // b4. Recovery to a point in time into a new namespace, under a steady writer on the source.
    recover_to_a_time_in_a_new_namespace(cluster, &client, &namespace, &gateway).await;

    // c. A replica loses its volume (its claim, then its pod, deleted under a steady writer):
    // the StatefulSet makes both again, the new pod restores the newest backup from the
    // bucket, streams from the primary, and holds every acknowledged row.
    let (primary, roles) = settled_roles(&client, &namespace, &password, 3).await;
    cohort_until(
        &client,
        &namespace,
        "a whole cohort of 3 before the replica's loss",
        |c, h, _| whole(c, 3) && h == ("True", "CohortComplete"),
    )
    .await;
    let replica = roles
        .iter()
        .find(|(_, role)| role.as_str() == "REPLICA")
        .map(|(pod, _)| pod.clone())
        .unwrap_or_else(|| panic!("a replica among {roles:?}"));
    // No shared backup volume holds the pool to one node: the scheduler may spread it.
    let nodes: Vec<(String, Option<String>)> = pool_pods(&client, &namespace)
        .await
        .iter()
        .map(|p| {
            (
                p.name_any(),
                p.spec.as_ref().and_then(|s| s.node_name.clone()),
            )
        })
        .collect();
    println!("pool pods on nodes {nodes:?}; primary {primary}; rebuilding replica {replica}");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &namespace);
    let old = pods.get(&replica).await.unwrap();
    let old_claims = claim_uids(&claims, &old).await;
    assert!(!old_claims.is_empty(), "{replica} has a volume of its own");
    let load = Load::start(gateway.clone(), 1);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let deleted_at = Instant::now();
    for name in old_claims.keys() {
        claims.delete(name, &DeleteParams::default()).await.unwrap();
    }
    pods.delete(&replica, &DeleteParams::default())
        .await
        .unwrap();

    let rebuilt = eventually("the replica back Ready on a new volume", WAIT, || async {
        let pod = pods.get(&replica).await.map_err(|e| e.to_string())?;
        if pod.uid() == old.uid() || !is_ready(&pod) {
            return Err(format!("pod {:?}, Ready {}", pod.uid(), is_ready(&pod)));
        }
        for (name, uid) in &old_claims {
            let claim = claims.get(name).await.map_err(|e| e.to_string())?;
            if claim.uid() == *uid {
                return Err(format!("{name} is still the old claim"));
            }
        }
        Ok(pod)
    })
    .await;
    let to_ready = deleted_at.elapsed();
    let endpoint = Endpoint::pod(&rebuilt, &password).unwrap();
    wait_streaming(&endpoint, "the rebuilt replica streams from the primary").await;
    let to_streaming = deleted_at.elapsed();
    let log = pods
        .logs(
            &replica,
            &LogParams {
                container: Some("multipooler".to_owned()),
                ..LogParams::default()
            },
        )
        .await
        .unwrap();
    let restored = log
        .lines()
        .find(|l| l.contains("successfully restored from backup"))
        .unwrap_or_else(|| panic!("{replica}'s multipooler did not restore:\n{log}"));
    println!("{replica}: {restored}");
    let repository_now = repository(&s3.objects(&namespace).await.unwrap()).0;
    assert!(
        repository_now.iter().any(|label| restored.contains(label)),
        "{replica} restored a backup of the bucket ({repository_now:?})"
    );
    let (_, roles) = settled_roles(&client, &namespace, &password, 3).await;
    assert_eq!(roles[&replica], "REPLICA", "{roles:?}");
    let (cohort, _) = cohort_until(
        &client,
        &namespace,
        "the rebuilt replica back in a whole cohort",
        |c, h, _| whole(c, 3) && h == ("True", "CohortComplete"),
    )
    .await;
    assert!(cohort.is_healthy(&replica), "{cohort:?}");
    let to_cohort = deleted_at.elapsed();
    let report = load.finish().await;
    println!(
        "rebuild of {replica}: {} ok, {} failed, first errors {:?}",
        report.ok, report.failed, report.errors
    );
    acknowledged.extend(&report.acknowledged);
    let held = eventually(
        "the rebuilt replica holds every acknowledged row",
        WAIT,
        || async {
            let ids = ledger(&endpoint).await?;
            let missing = acknowledged.iter().filter(|id| !ids.contains(id)).count();
            match missing {
                0 => Ok(ids.len()),
                n => Err(format!(
                    "{n} of {} acknowledged rows missing",
                    acknowledged.len()
                )),
            }
        },
    )
    .await;
    figure(
        "replica's claim and pod deleted -> new pod Ready (s)",
        format!("{:.1}", to_ready.as_secs_f64()),
    );
    figure(
        "replica's claim and pod deleted -> streaming from the primary (s)",
        format!("{:.1}", to_streaming.as_secs_f64()),
    );
    figure(
        "replica's claim and pod deleted -> back in a whole cohort (s)",
        format!("{:.1}", to_cohort.as_secs_f64()),
    );
    figure("rows checked on the rebuilt replica", held);
    report.figures("the replica's rebuild");

    // c2. A replica whose PostgreSQL can no longer start (PG_VERSION overwritten, then its pod
    // deleted, so PostgreSQL starts again) under a steady writer: its multipooler quarantines
    // it after the chart's unrecoverable timeout (30 s here), the Shard publishes it
    // QUARANTINED, and the operator deletes its claim and pod; the new pod restores from the
    // bucket and holds every acknowledged row.
    acknowledged.extend(&quarantined_replica_is_replaced(&client, &namespace, &gateway).await);

    // c3. A burst of 100 clients through the gateway, more than the primary's max_connections
    // (60) and multipooler's pool (47, derived from it), beside a steady writer: the writer
    // fails no statement during the burst or after it, and a new client is served at once.
    acknowledged.extend(&a_client_burst_leaves_the_writer_alone(&gateway).await);

    // c4. Every connection slot of the primary taken by direct sessions (as a runaway client
    // beside the gateway would): the Shard's PrimaryServing turns False with the reason, and
    // True again once they are closed.
    slots_exhausted_turn_primary_serving_red(&client, &namespace, &gateway).await;

    // d. Every acknowledged row is there through the gateway.
    let stored = assert_kept(&gateway, &acknowledged).await;
    println!("{stored} rows through the gateway");

    // e. Disaster: the cluster is deleted and every claim of the namespace with it (the
    // PostgreSQL volumes and the topology's); the bucket survives. The same cluster applied
    // again restores from the repository: every row acknowledged before the last scheduled
    // backup started is back, and the rows the WAL archive holds beyond it.
    recover_from_the_bucket(&client, &namespace, s3, &before_schedule, &acknowledged).await;
    figure(
        "backups.rs, start to end (s)",
        format!("{:.1}", began.elapsed().as_secs_f64()),
    );
}
