//! A backup repository belongs to one cluster: each shard with S3 backups marks its own
//! repository as its cluster's before any of its pool pods starts (`repository.sh`, run by a
//! Job), and a shard whose repository another cluster marked starts none.
//!
//! The webhook already refuses a cluster whose repository another cluster of this Kubernetes
//! cluster uses; the marker also covers a cluster in another Kubernetes cluster (or one the
//! webhook did not see), which would otherwise restore that cluster's newest backup into its
//! pods and expire its backups. The marker names the namespace, the cluster and the UID of the
//! kube-system namespace (what tells Kubernetes clusters apart), so the documented recovery of
//! a deleted cluster, applied again under the same names, still finds its repository its own.
//!
//! Shards whose pool StatefulSets exist already (made before this check) are not stopped: their
//! repository is marked too, and if another cluster's marker is found, the `BackupRepository`
//! condition turns False and the data-handler takes no more backups into it.

use std::sync::Arc;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{EmptyDirVolumeSource, Namespace, Volume};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::runtime::events::EventType;
use kube::{Api, Client, ResourceExt};
use multigres_api::names;
use multigres_api::owner::Owner;
use multigres_api::v1alpha1::{BACKUP_REPOSITORY, BackupType, S3BackupConfig, Shard, ShardSpec};

use super::build::BuildError;
use super::{Error, Guard, prestart};
use crate::conditions::{Computed, FALSE, TRUE};
use crate::contract::POOLER_DIR;
use crate::controller::Ctx;
use crate::podspec::{env, mount};

/// Its reason once another cluster's marker was found.
pub const OWNED_ELSEWHERE: &str = "OwnedByAnotherCluster";
/// Its reason once the Job failed for any other cause (the bucket unreachable, keys refused).
pub const FAILED: &str = "MarkingFailed";

/// The script the Job runs after `pgbackrest.sh` (see its header).
const SCRIPT: &str = concat!(include_str!("pgbackrest.sh"), include_str!("repository.sh"));
/// `repository.sh`'s exit status for a repository another cluster marked: it fails the Job at
/// once, where other failures are tried again.
const OWNED_ELSEWHERE_STATUS: i32 = 3;
/// Tries of the Job for failures other than [`OWNED_ELSEWHERE_STATUS`] (the Job controller
/// waits 10 s, 20 s, 40 s between them).
const RETRIES: i32 = 3;
const WORK_VOLUME: &str = "work";

/// The Kubernetes cluster's identity in markers: the UID of its kube-system namespace, read
/// once (the first time a repository is marked) and kept for the life of the process.
#[derive(Clone, Default)]
pub struct KubernetesId(Arc<tokio::sync::OnceCell<String>>);

impl KubernetesId {
    async fn get(&self, client: &Client) -> Result<&str, kube::Error> {
        self.0
            .get_or_try_init(|| async {
                let namespaces: Api<Namespace> = Api::all(client.clone());
                let uid = namespaces.get("kube-system").await?.uid();
                Ok(uid.unwrap_or_default())
            })
            .await
            .map(String::as_str)
    }
}

/// The S3 repository a shard's own backups go to; `None` for filesystem backups (a volume of
/// the cluster's own namespace) or none.
pub fn own(spec: &ShardSpec) -> Option<&S3BackupConfig> {
    spec.backup
        .as_ref()
        .filter(|b| b.type_ == BackupType::S3)?
        .s3
        .as_ref()
}

/// The marker `owner` writes, on Kubernetes cluster `kubernetes`.
pub fn marker(owner: &Owner, kubernetes: &str) -> String {
    format!(
        "cluster={}/{} kubernetes={kubernetes}",
        owner.namespace, owner.cluster
    )
}

/// The repository as messages name it, with its endpoint (two endpoints are two repositories).
fn describe(s3: &S3BackupConfig) -> String {
    match s3.endpoint.as_deref().filter(|e| !e.is_empty()) {
        Some(endpoint) => format!("{} at {endpoint}", prestart::describe_repository(s3)),
        None => prestart::describe_repository(s3),
    }
}

/// The message of a True condition for `s3`: a stored True condition counts only for the
/// repository it names, so a changed repository is marked again.
fn marked_message(s3: &S3BackupConfig) -> String {
    format!(
        "{} is marked as this cluster's; its pool pods restore from it and back up to it",
        describe(s3)
    )
}

/// The Job marking `s3` for `shard`: one name per repository.
pub fn job_name(shard: &str, s3: &S3BackupConfig) -> String {
    let repository = names::hash(&[&describe(s3)]);
    names::join(&[shard, "repository", &repository], names::MAX_DNS_LABEL)
}

/// The `BackupRepository` condition as last written (None before any).
fn stored(shard: &Shard) -> Option<&Condition> {
    shard
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == BACKUP_REPOSITORY)
}

/// The repository `shard` must still mark: it has S3 backups and no True condition names that
/// repository.
pub fn pending(shard: &Shard) -> Option<&S3BackupConfig> {
    let s3 = own(&shard.spec)?;
    let message = marked_message(s3);
    stored(shard)
        .is_none_or(|c| c.status != TRUE || c.message != message)
        .then_some(s3)
}

/// The True condition of a shard whose repository is marked, kept by every status this handler
/// writes so the marking never runs again.
pub fn done(shard: &Shard) -> Option<Computed> {
    let s3 = own(&shard.spec)?;
    pending(shard)
        .is_none()
        .then(|| Computed::new(BACKUP_REPOSITORY, TRUE, "Marked", marked_message(s3)))
}

/// The Job that marks `s3` as `owner`'s (see the module docs): only the repository's settings
/// and keys, and a scratch directory.
pub fn job(
    owner: &Owner,
    spec: &ShardSpec,
    s3: &S3BackupConfig,
    marker: &str,
) -> Result<Job, BuildError> {
    let work = Volume {
        name: WORK_VOLUME.to_owned(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Default::default()
    };
    let script = prestart::Script {
        name: job_name(&owner.name, s3),
        container: "repository",
        text: SCRIPT,
        env: vec![env("OWNER", marker)],
        volumes: vec![(work, mount(WORK_VOLUME, POOLER_DIR, false))],
        read_only_root: true,
        resources: None,
        retries: RETRIES,
        final_status: Some(OWNED_ELSEWHERE_STATUS),
    };
    Ok(prestart::job(
        owner,
        spec,
        prestart::first_pool(spec)?,
        s3,
        script,
    ))
}

/// The `BackupRepository` verdict from the Job as stored and, once it failed, what its pod
/// said.
pub fn verdict(s3: &S3BackupConfig, job: &Job, failure: Option<String>) -> Computed {
    let status = job.status.as_ref();
    if status.and_then(|s| s.succeeded).unwrap_or(0) > 0 {
        return Computed::new(BACKUP_REPOSITORY, TRUE, "Marked", marked_message(s3));
    }
    if job_failed(job) {
        let said = failure.unwrap_or_else(|| "its pod left no message".to_owned());
        let owned_elsewhere = said.contains("belongs to another cluster");
        let reason = if owned_elsewhere {
            OWNED_ELSEWHERE
        } else {
            FAILED
        };
        return Computed::new(
            BACKUP_REPOSITORY,
            FALSE,
            reason,
            format!(
                "Job {} could not mark {} as this cluster's: {said}",
                job.name_any(),
                describe(s3)
            ),
        );
    }
    let mut message = format!(
        "Job {} marks {} as this cluster's; the pool pods start once it has",
        job.name_any(),
        describe(s3)
    );
    if let Some(said) = failure {
        message = format!("{message}. Its last try failed and is tried again: {said}");
    }
    Computed::new(BACKUP_REPOSITORY, FALSE, "Marking", message)
}

/// Whether `job` has failed for good (its `Failed` condition: tries used up, or the
/// [`OWNED_ELSEWHERE_STATUS`] that fails it at once).
fn job_failed(job: &Job) -> bool {
    job.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Failed" && c.status == TRUE)
    })
}

/// Whether `verdict` is final until someone acts (the Job failed).
pub fn failed(verdict: &Computed) -> bool {
    verdict.reason == OWNED_ELSEWHERE || verdict.reason == FAILED
}

/// Creates the Job marking `s3` for `shard` unless it exists, and says where it is; an event
/// marks each change of the condition's reason.
pub(super) async fn mark(
    ctx: &Ctx<Guard>,
    guard: &Guard,
    shard: &Shard,
    owner: &Owner,
    s3: &S3BackupConfig,
) -> Result<Computed, Error> {
    let kubernetes = match ctx.kubernetes.get(&ctx.client).await {
        Ok(kubernetes) => kubernetes,
        Err(error) => {
            let computed = unidentified(s3, &error);
            announce(ctx, guard, shard, &computed).await;
            return Ok(computed);
        }
    };
    let desired = job(owner, &shard.spec, s3, &marker(owner, kubernetes))?;
    let name = desired.name_any();
    let job = prestart::ensure(ctx, desired)
        .await
        .map_err(Error::Repository)?;
    // A failure already reported for this Job is not read again: it stays until the Job is
    // deleted (then a new one tries again) or the repository changes (a new Job).
    let reported = stored(shard).filter(|c| {
        (c.reason == OWNED_ELSEWHERE || c.reason == FAILED) && c.message.contains(&name)
    });
    let computed = match reported {
        Some(c) if job_failed(&job) => {
            let reason = if c.reason == OWNED_ELSEWHERE {
                OWNED_ELSEWHERE
            } else {
                FAILED
            };
            Computed::new(BACKUP_REPOSITORY, FALSE, reason, c.message.clone())
        }
        _ => {
            let failure = match job.status.as_ref().and_then(|s| s.failed).unwrap_or(0) > 0 {
                true => prestart::failure_message(ctx, &owner.namespace, &name).await,
                false => None,
            };
            verdict(s3, &job, failure)
        }
    };
    announce(ctx, guard, shard, &computed).await;
    Ok(computed)
}

/// The verdict when this Kubernetes cluster's identity cannot be read (looked at again on the
/// next reconcile).
fn unidentified(s3: &S3BackupConfig, error: &kube::Error) -> Computed {
    Computed::new(
        BACKUP_REPOSITORY,
        FALSE,
        FAILED,
        format!(
            "cannot mark {} as this cluster's: the UID of namespace kube-system, which tells \
             this Kubernetes cluster apart in the marker, cannot be read ({error}); the \
             resource-handler needs get on namespaces/kube-system cluster-wide \
             (deploy/rbac/resource-handler.yaml)",
            describe(s3)
        ),
    )
}

/// An event for `computed` when its reason is not the stored one: a Warning for a failure.
async fn announce(ctx: &Ctx<Guard>, guard: &Guard, shard: &Shard, computed: &Computed) {
    if stored(shard).map(|c| c.reason.as_str()) == Some(computed.reason) {
        return;
    }
    let type_ = if failed(computed) {
        EventType::Warning
    } else {
        EventType::Normal
    };
    ctx.kit
        .event(guard, type_, computed.reason, computed.message.clone())
        .await;
}

#[cfg(test)]
mod tests;
