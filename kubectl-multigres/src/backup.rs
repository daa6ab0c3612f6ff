//! `backup`: asks for a backup of every shard now, by the cluster's annotation
//! `multigres.com/backup-request` (docs/backups.md, "Backup on request") with a fresh id (the UTC
//! time), and with `--wait` follows it until every shard answered.
//!
//! The wait reads the cluster's Shards and rolls their answers up with the function the
//! data-handler writes `status.backupRequest` with ([`multigres_api::backup_request::rollup`]):
//! the cluster's roll-up follows the annotation's current id only, so a second request made
//! meanwhile would hide the first one's outcome, which the Shards still hold.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use multigres_api::backup_request::{self, REQUEST, REQUEST_TYPE, ShardAnswer};
use multigres_api::labels;
use multigres_api::v1alpha1::{
    BackupRequestPhase, BackupRequestRollup, BackupRequestState, MultigresCluster, Shard,
};

use crate::view;

/// How often `--wait` reads the Shards.
const POLL: Duration = Duration::from_secs(2);

/// The line `--wait` prints for `rollup`.
pub fn progress(rollup: &BackupRequestRollup) -> String {
    let counts = format!(
        "{}/{} shards completed",
        rollup.shards_completed, rollup.shards_total
    );
    match &rollup.message {
        Some(message) => format!("{:?}: {counts}; {message}", rollup.state),
        None => format!("{:?}: {counts}", rollup.state),
    }
}

/// One line per shard of request `id`: its backup's label, pod and time, or where it stands.
pub fn shard_lines(id: &str, shards: &[Shard]) -> Vec<String> {
    shards
        .iter()
        .map(|shard| {
            let name = shard.name_any();
            match backup_request::answer(id, shard.status.as_ref()) {
                ShardAnswer::Pending => format!("  {name}: not taken yet"),
                ShardAnswer::Queued => {
                    format!("  {name}: queued behind the backup running before it")
                }
                ShardAnswer::Taken(taken) => {
                    let pod = taken.pod.as_deref().unwrap_or("?");
                    let took = match (&taken.started_at, &taken.completed_at) {
                        (Some(start), Some(end)) => {
                            format!(" in {:.0}s", end.0.duration_since(start.0).as_secs_f64())
                        }
                        _ => String::new(),
                    };
                    match taken.state {
                        BackupRequestState::Completed => format!(
                            "  {name}: backup {} on pod {pod}{took}",
                            taken.backup.as_deref().unwrap_or("?")
                        ),
                        BackupRequestState::Running => {
                            format!("  {name}: running on pod {pod}")
                        }
                        BackupRequestState::Failed => format!(
                            "  {name}: FAILED{took}: {}",
                            taken.message.as_deref().unwrap_or("no reason given")
                        ),
                    }
                }
            }
        })
        .collect()
}

/// Annotates MultigresCluster `name` with a fresh request (of `kind`, when given); with `wait`,
/// follows its Shards until every one answered, for at most `timeout`.
pub async fn run(
    client: &Client,
    namespace: &str,
    name: &str,
    kind: Option<&str>,
    wait: bool,
    timeout: Duration,
) -> Result<()> {
    let found = view::cluster(client, namespace, name).await?;
    if labels::hibernated(found.annotations()) && wait {
        bail!(
            "MultigresCluster {namespace}/{name} is hibernated: no backup runs until \
             `kubectl multigres wake {name}`; ask without --wait to have it taken after waking"
        );
    }
    let id = backup_request::id_at(Timestamp::now());
    let clusters: Api<MultigresCluster> = Api::namespaced(client.clone(), namespace);
    // A type left from an earlier request goes: without one, the schedule's type applies.
    let patch = serde_json::json!({"metadata": {"annotations": {REQUEST: id, REQUEST_TYPE: kind}}});
    clusters
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("annotating MultigresCluster {namespace}/{name}"))?;
    println!(
        "asked for a backup ({}) of every shard of {name}: {REQUEST}={id}",
        kind.unwrap_or("the schedule's type, else full")
    );
    if !wait {
        println!(
            "follow it with: kubectl get multigrescluster {name} -n {namespace} \
             -o jsonpath='{{.status.backupRequest}}'"
        );
        return Ok(());
    }
    let shards: Api<Shard> = Api::namespaced(client.clone(), namespace);
    let of_cluster = ListParams::default().labels(&format!("{}={name}", labels::CLUSTER));
    let started = Instant::now();
    let mut said = String::new();
    loop {
        let mut found = shards
            .list(&of_cluster)
            .await
            .with_context(|| format!("listing the Shards of {namespace}/{name}"))?
            .items;
        found.sort_by_key(ResourceExt::name_any);
        let now = backup_request::rollup_of(&id, &found);
        let elapsed = started.elapsed().as_secs_f64();
        let line = progress(&now);
        if line != said {
            println!("[{elapsed:6.1}s] {line}");
            said = line;
        }
        match now.state {
            BackupRequestPhase::Completed => {
                shard_lines(&id, &found)
                    .iter()
                    .for_each(|l| println!("{l}"));
                println!("request {id} completed in {elapsed:.0}s");
                return Ok(());
            }
            BackupRequestPhase::Failed => {
                shard_lines(&id, &found)
                    .iter()
                    .for_each(|l| println!("{l}"));
                bail!("request {id} failed after {elapsed:.0}s: {said}");
            }
            _ => {}
        }
        if started.elapsed() > timeout {
            bail!("request {id} not answered after {timeout:?}: {said}");
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::tests::fixture;

    fn shards(status: &[&str]) -> Vec<Shard> {
        let mut view = fixture(include_str!("../fixtures/degraded.yaml"));
        let template = view.shards.remove(0);
        status
            .iter()
            .enumerate()
            .map(|(i, yaml)| {
                let mut shard = template.clone();
                shard.metadata.name = Some(format!("prod-postgres-default-{i}"));
                shard.status = Some(serde_yaml::from_str(yaml).unwrap());
                shard
            })
            .collect()
    }

    #[test]
    fn a_completed_request_lists_each_shards_backup_and_time() {
        let done = shards(&[
            "requestedBackup: {id: r1, type: full, state: Completed, pod: p-1, \
             backup: 20261204-221503F, startedAt: '2026-12-04T22:15:01Z', \
             completedAt: '2026-12-04T22:16:31Z'}",
            "requestedBackup: {id: r2, type: full, state: Running, pod: p-4}\n\
             previousRequestedBackup: {id: r1, type: full, state: Completed, pod: p-3, \
             backup: 20261204-221502F}",
        ]);
        let rolled = backup_request::rollup_of("r1", &done);
        assert_eq!(progress(&rolled), "Completed: 2/2 shards completed");
        assert_eq!(
            shard_lines("r1", &done),
            [
                "  prod-postgres-default-0: backup 20261204-221503F on pod p-1 in 90s",
                "  prod-postgres-default-1: backup 20261204-221502F on pod p-3",
            ]
        );
    }

    #[test]
    fn waiting_and_failed_shards_say_why() {
        let mixed = shards(&[
            "requestedBackup: {id: r0, type: full, state: Running, pod: p-1}\n\
             queuedRequest: {id: r1, type: full}",
            "requestedBackup: {id: r1, type: full, state: Failed, pod: p-3, message: lease held}",
        ]);
        let rolled = backup_request::rollup_of("r1", &mixed);
        assert_eq!(
            progress(&rolled),
            "Running: 0/2 shards completed; shard prod-postgres-default-1: lease held; waiting \
             for the backup running before it on prod-postgres-default-0"
        );
        assert_eq!(
            shard_lines("r1", &mixed),
            [
                "  prod-postgres-default-0: queued behind the backup running before it",
                "  prod-postgres-default-1: FAILED: lease held",
            ]
        );
    }
}
