//! Backups to S3 on real nodes: the minimal sample with `backup.type: s3` against a real S3
//! server (SeaweedFS over TLS, SigV4 with the keys of a Secret; `multigres_e2e::s3`), three
//! pool pods, and what a user sees, under a steady writer: the bootstrap backup and the WAL
//! archive in the bucket under the cluster's key prefix, the backup in the Shard status;
//! backups on a schedule (`backup.schedule`), taken on a replica and expired by `retainFull`
//! in the bucket and the status; a replica whose volume is lost rebuilt from that repository,
//! holding every row; and the whole shard recovered from the bucket after every volume of the
//! namespace is deleted with the cluster.
//!
//! One cluster, one story, as in `data_plane.rs`; the figures (`[figure] …`) are printed, not
//! asserted.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Secret};
use kube::api::{DeleteParams, ListParams, LogParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use multigres_api::v1alpha1::{MultigresCluster, ShardStatus};
use multigres_e2e::harness::{eventually, fresh_namespace};
use multigres_e2e::load::{Load, assert_kept, create_ledger, figure, ledger};
use multigres_e2e::real::{Endpoint, is_ready, operator_installed};
use multigres_e2e::s3::{self, Object, S3Server};
use multigres_e2e::sample::{
    NAME, WAIT, apply_sample, cohort_until, pool_pods, settled_roles, shard, shard_events,
    wait_serving, whole,
};
use serde_json::{Value, json};

/// The Secret with the S3 keys, as `credentialsSecret` names it.
const CREDENTIALS: &str = "backup-credentials";

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

/// Creates the Secret with the S3 keys that `credentialsSecret` names.
async fn create_credentials(client: &Client, namespace: &str) {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": CREDENTIALS},
        "stringData": {
            "AWS_ACCESS_KEY_ID": s3::ACCESS_KEY_ID,
            "AWS_SECRET_ACCESS_KEY": s3::SECRET_ACCESS_KEY,
        },
    }))
    .unwrap();
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
}

/// Applies the sample with S3 backups to `s3` under the key prefix `namespace`, and 3 pool pods.
async fn apply_with_s3(client: &Client, namespace: &str, s3: &S3Server) -> Instant {
    let endpoint = s3.endpoint();
    apply_sample(client, namespace, |cluster| {
        cluster["spec"]["backup"] = json!({"type": "s3", "s3": {
            "bucket": s3::BUCKET,
            "region": s3::REGION,
            "endpoint": endpoint,
            "keyPrefix": namespace,
            "credentialsSecret": CREDENTIALS,
        }});
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
    let (_, to_sql) = wait_serving(client, namespace, sent).await;
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
    create_credentials(&client, &namespace).await;
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
    let old_claims: BTreeMap<String, Option<String>> = {
        let mut uids = BTreeMap::new();
        for name in own_claims(&old) {
            uids.insert(name.clone(), claims.get(&name).await.unwrap().uid());
        }
        uids
    };
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
    eventually(
        "the rebuilt replica streams from the primary",
        WAIT,
        || async {
            match endpoint
                .query("SELECT status FROM pg_stat_wal_receiver")
                .await?
            {
                rows if rows == [[Some("streaming".to_owned())]] => Ok(()),
                rows => Err(format!("WAL receiver {rows:?}")),
            }
        },
    )
    .await;
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
