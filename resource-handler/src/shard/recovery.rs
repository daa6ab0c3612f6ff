//! A new shard started from another cluster's backups (`backup.recovery`).
//!
//! Multigres restores a shard only from its own repository, only the newest backup, and replays
//! all the WAL it finds (`backup/restore.go:65-76`); a pooler whose repository already holds a
//! backup restores it instead of running initdb (`rpc_first_backup.go:31-41`). So before any
//! pool pod exists, a Job ([`job`], `recovery.sh`) restores the source repository to the
//! target into a scratch volume, lets PostgreSQL promote there, and writes the result as the
//! first backup of the shard's own repository. The pool StatefulSets are created once it has
//! succeeded, and every pool pod then restores that backup. The source is only read.
//!
//! The `Recovery` condition says where the Job is; once True it stays, and the recovery is
//! never run again.

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    ConfigMapVolumeSource, Container, EnvVar, EphemeralVolumeSource, PersistentVolumeClaimTemplate,
    Pod, PodSpec, PodTemplateSpec, Volume,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use kube::api::{ListParams, PostParams};
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};
use multigres_api::labels::{self, Component};
use multigres_api::resolver::defaults;
use multigres_api::v1alpha1::{
    BackupType, RecoveryConfig, RecoveryTarget, S3BackupConfig, Shard, ShardSpec,
};

use super::build;
use super::pgconfig::{CONFIG_DIR, CONFIG_KEY};
use super::{Error, Guard};
use crate::conditions::{Computed, FALSE, TRUE};
use crate::contract::{PASSWORD_DIR, PASSWORD_FILE, POOLER_DIR};
use crate::controller::Ctx;
use crate::owner::Owner;
use crate::podspec::{container_security, env, env_from_secret, mount, pod_security};

/// Condition type: where the recovery of a shard's data from its `backup.recovery` source is.
pub const RECOVERY: &str = "Recovery";
/// Its reason once the recovery Job failed.
pub const FAILED: &str = "RecoveryFailed";

/// The script the Job runs after `pgbackrest.sh` (see its header).
const SCRIPT: &str = concat!(include_str!("pgbackrest.sh"), include_str!("recovery.sh"));
const SCRATCH_VOLUME: &str = "scratch";
const CONFIG_VOLUME: &str = "postgres-config";

/// The recovery `shard` still waits for: its spec names one and its `Recovery` condition is
/// not True yet.
pub fn pending(shard: &Shard) -> Option<&RecoveryConfig> {
    let recovery = shard.spec.backup.as_ref()?.recovery.as_ref()?;
    stored(shard)
        .is_none_or(|c| c.status != TRUE)
        .then_some(recovery)
}

/// The `Recovery` condition as last written (None before any).
pub fn stored(shard: &Shard) -> Option<&Condition> {
    shard
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == RECOVERY)
}

/// The `Recovery` condition of a shard whose recovery is done, kept as it was written by every
/// status this handler writes (hibernating, refused, serving), so the recovery never runs again.
pub fn done(shard: &Shard) -> Option<Computed> {
    shard.spec.backup.as_ref()?.recovery.as_ref()?;
    let stored = stored(shard).filter(|c| c.status == TRUE)?;
    Some(Computed::new(
        RECOVERY,
        TRUE,
        "Restored",
        stored.message.clone(),
    ))
}

/// The `job_id` annotation of the backup a shard's recovery writes: the Shard's UID, so a Job
/// made again for the same Shard knows its own backup, and another cluster's never matches.
fn recovery_id(owner: &Owner) -> String {
    format!("recovery-{}", owner.reference.uid)
}

/// How long a finished recovery Job (and its pod's scratch volume) is kept.
const FINISHED_JOB_TTL_SECONDS: i32 = 3600;

/// The Job of `shard`'s recovery.
pub fn job_name(shard: &str) -> String {
    multigres_api::names::join(&[shard, "recovery"], multigres_api::names::MAX_DNS_LABEL)
}

/// `target` as messages name it.
pub fn describe_target(target: Option<&RecoveryTarget>) -> String {
    match target {
        Some(RecoveryTarget { time: Some(t), .. }) => format!("time {}", t.0),
        Some(RecoveryTarget { lsn: Some(lsn), .. }) => format!("LSN {lsn}"),
        Some(RecoveryTarget {
            backup: Some(label),
            ..
        }) => format!("the end of backup {label}"),
        _ => "the end of its archived WAL".to_owned(),
    }
}

/// An S3 repository as messages name it: `s3://<bucket>/<prefix>/multigres` (where Multigres
/// keeps it, `go/common/backup/config.go:224-229`).
pub fn describe_repository(s3: &S3BackupConfig) -> String {
    let prefix = s3.key_prefix.as_deref().unwrap_or_default();
    let path = if prefix.is_empty() {
        "/multigres".to_owned()
    } else {
        format!("/{}/multigres", prefix.strip_suffix('/').unwrap_or(prefix))
    };
    format!("s3://{}{path}", s3.bucket)
}

/// pgBackRest's `--type` and `--target` for `target` (a time as `YYYY-MM-DD HH:MM:SS+00`, the
/// form pgBackRest reads to pick the backup before it).
fn restore_target(target: Option<&RecoveryTarget>) -> (&'static str, String) {
    match target {
        Some(RecoveryTarget { time: Some(t), .. }) => {
            ("time", t.0.strftime("%Y-%m-%d %H:%M:%S+00").to_string())
        }
        Some(RecoveryTarget { lsn: Some(lsn), .. }) => ("lsn", lsn.clone()),
        Some(RecoveryTarget {
            backup: Some(label),
            ..
        }) => ("backup", label.clone()),
        _ => ("latest", String::new()),
    }
}

/// The environment naming one repository to the script (`prefix` `SOURCE` or `OWN`).
pub(super) fn repository_env(prefix: &str, s3: &S3BackupConfig) -> Vec<EnvVar> {
    let mut vars = vec![
        env(&format!("{prefix}_BUCKET"), s3.bucket.as_str()),
        env(&format!("{prefix}_REGION"), s3.region.as_str()),
        env(
            &format!("{prefix}_ENDPOINT"),
            s3.endpoint.clone().unwrap_or_default(),
        ),
        env(
            &format!("{prefix}_KEY_PREFIX"),
            s3.key_prefix.clone().unwrap_or_default(),
        ),
        env(
            &format!("{prefix}_ENV_CREDENTIALS"),
            if s3.use_env_credentials { "true" } else { "" },
        ),
        env(&format!("{prefix}_DESC"), describe_repository(s3)),
    ];
    if let Some(secret) = &s3.credentials_secret {
        vars.push(env_from_secret(
            &format!("{prefix}_KEY"),
            secret,
            "AWS_ACCESS_KEY_ID",
        ));
        vars.push(env_from_secret(
            &format!("{prefix}_SECRET"),
            secret,
            "AWS_SECRET_ACCESS_KEY",
        ));
    }
    vars
}

/// The Job that seeds the shard's own repository with `recovery`'s source restored to its
/// target (see the module docs). It runs once (no retry: a second attempt would find WAL of
/// the first in the repository), as the pool pods' PostgreSQL user, with a scratch volume like
/// the first pool's data volume, and is deleted with the Shard.
pub fn job(owner: &Owner, spec: &ShardSpec, recovery: &RecoveryConfig) -> Result<Job, String> {
    let own = spec
        .backup
        .as_ref()
        .filter(|b| b.type_ == BackupType::S3)
        .and_then(|b| b.s3.as_ref())
        .ok_or(
            "spec.backup.recovery: the recovered data becomes the first backup of this \
             shard's own repository, which must be S3 (spec.backup.type: s3)",
        )?;
    let (_, pool) = spec
        .pools
        .iter()
        .next()
        .ok_or("spec.pools is empty: a recovery restores into a pool's volume size")?;
    let (pg, _) = build::pool_identities(pool);
    let (_, claim) = build::storage_request(
        &pool.storage.clone().unwrap_or_default(),
        defaults::POOL_STORAGE,
    );
    let name = job_name(&owner.name);
    let (restore_type, restore_target) = restore_target(recovery.target.as_ref());
    let mut vars = vec![
        env("RESTORE_TYPE", restore_type),
        env("RESTORE_TARGET", restore_target),
        env("RESTORE_DESC", describe_target(recovery.target.as_ref())),
        env("TABLE_GROUP", spec.table_group_name.as_str()),
        env("SHARD", spec.shard_name.as_str()),
        env("JOB_NAME", name.as_str()),
        env("RECOVERY_ID", recovery_id(owner)),
        env(
            "POSTGRES_USER",
            spec.postgres_superuser
                .clone()
                .unwrap_or_else(|| defaults::POSTGRES_SUPERUSER.to_owned()),
        ),
        env("PASSWORD_FILE", PASSWORD_FILE),
        env("EXTRA_CONF", format!("{CONFIG_DIR}/{CONFIG_KEY}")),
    ];
    vars.extend(repository_env("SOURCE", &recovery.source));
    vars.extend(repository_env("OWN", own));
    let pull = build::pull(spec);
    let container = Container {
        name: "recovery".to_owned(),
        image: Some(spec.images.postgres.as_str().to_owned()),
        image_pull_policy: Some(pull.policy()),
        command: Some(vec![
            "/bin/sh".to_owned(),
            "-c".to_owned(),
            multigres_api::expansion::literal(SCRIPT),
        ]),
        env: Some(vars),
        resources: pool.postgres.as_ref().and_then(|c| c.resources.clone()),
        // PostgreSQL and pgBackRest write lock and log files outside the volume.
        security_context: Some(container_security(pg, false)),
        volume_mounts: Some(vec![
            mount(SCRATCH_VOLUME, POOLER_DIR, false),
            mount(build::PASSWORD_VOLUME, PASSWORD_DIR, true),
            mount(CONFIG_VOLUME, CONFIG_DIR, true),
        ]),
        termination_message_policy: Some("FallbackToLogsOnError".to_owned()),
        ..Default::default()
    };
    let labels = labels::labels(
        &owner.cluster,
        Component::Shard,
        &labels::Placement {
            database: Some(spec.database_name.as_str()),
            table_group: Some(spec.table_group_name.as_str()),
            shard: Some(spec.shard_name.as_str()),
            ..Default::default()
        },
    );
    let pod = PodSpec {
        containers: vec![container],
        restart_policy: Some("Never".to_owned()),
        volumes: Some(vec![
            Volume {
                name: SCRATCH_VOLUME.to_owned(),
                ephemeral: Some(EphemeralVolumeSource {
                    volume_claim_template: Some(PersistentVolumeClaimTemplate {
                        metadata: Some(ObjectMeta {
                            labels: Some(labels.clone()),
                            ..Default::default()
                        }),
                        spec: claim,
                    }),
                }),
                ..Default::default()
            },
            build::password_volume(spec),
            // The shard's own postgresql.conf: PostgreSQL promotes here with the settings the
            // pool pods run, so none of them is below what the restored data was written with
            // (a standby refuses a max_connections lower than its primary's).
            Volume {
                name: CONFIG_VOLUME.to_owned(),
                config_map: Some(ConfigMapVolumeSource {
                    name: crate::names::postgres_config(&owner.name),
                    ..Default::default()
                }),
                ..Default::default()
            },
        ]),
        security_context: Some(pod_security(pg, pool.fs_group.unwrap_or(pg.group))),
        service_account_name: own.service_account_name.clone(),
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        image_pull_secrets: pull.secrets(),
        tolerations: (!pool.tolerations.is_empty()).then(|| pool.tolerations.clone()),
        ..Default::default()
    };
    Ok(Job {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(owner.namespace.clone()),
            labels: Some(labels.clone()),
            owner_references: Some(vec![owner.reference.clone()]),
            ..Default::default()
        },
        spec: Some(JobSpec {
            backoff_limit: Some(0),
            // Gone an hour after it ends, with its pod and scratch volume (a failure's message
            // stays in the Recovery condition).
            ttl_seconds_after_finished: Some(FINISHED_JOB_TTL_SECONDS),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..Default::default()
                }),
                spec: Some(pod),
            },
            ..Default::default()
        }),
        status: None,
    })
}

/// The `Recovery` verdict from the Job as stored (`None`: not created yet) and, once it
/// failed, what its pod said.
pub fn verdict(recovery: &RecoveryConfig, job: Option<&Job>, failure: Option<String>) -> Computed {
    let source = describe_repository(&recovery.source);
    let target = describe_target(recovery.target.as_ref());
    let status = job.and_then(|j| j.status.as_ref());
    if status.and_then(|s| s.succeeded).unwrap_or(0) > 0 {
        return Computed::new(
            RECOVERY,
            TRUE,
            "Restored",
            format!(
                "{source} restored to {target} and written as the first backup of this \
                 shard's own repository; every pool pod restores it"
            ),
        );
    }
    if status.and_then(|s| s.failed).unwrap_or(0) > 0 {
        let said = failure.unwrap_or_else(|| "its pod left no message".to_owned());
        return Computed::new(
            RECOVERY,
            FALSE,
            FAILED,
            format!(
                "restoring {source} to {target} failed, so no pool pod is started: {said}. \
                 Fix the spec and apply the cluster again under a new backup keyPrefix (the \
                 source is untouched)"
            ),
        );
    }
    Computed::new(
        RECOVERY,
        FALSE,
        "Restoring",
        format!(
            "Job {} restores {source} to {target} and writes it as this shard's first backup; \
             the pool pods start once it has",
            job.map(ResourceExt::name_any).unwrap_or_default()
        ),
    )
}

/// What the failed Job's pod wrote to its termination message.
pub(super) async fn failure_message(ctx: &Ctx<Guard>, ns: &str, job: &str) -> Option<String> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let params = ListParams::default().labels(&format!("batch.kubernetes.io/job-name={job}"));
    let listed = pods.list(&params).await.ok()?;
    listed.items.iter().find_map(|pod| {
        let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
        statuses.iter().find_map(|s| {
            let message = s.state.as_ref()?.terminated.as_ref()?.message.clone()?;
            Some(message.trim().to_owned())
        })
    })
}

/// Creates the recovery Job of `shard` unless it exists, and says where it is. Events mark the
/// start, the failure and the success once each (on a change of the condition's reason).
pub(super) async fn run(
    ctx: &Ctx<Guard>,
    guard: &Guard,
    shard: &Shard,
    owner: &Owner,
    recovery: &RecoveryConfig,
) -> Result<Computed, Error> {
    // A failed recovery is not tried again, nor read again (its Job goes after an hour): the
    // message stays until the cluster is applied again.
    if let Some(failed) = stored(shard).filter(|c| c.reason == FAILED) {
        return Ok(Computed::new(
            RECOVERY,
            FALSE,
            FAILED,
            failed.message.clone(),
        ));
    }
    let ns = owner.namespace.as_str();
    let desired = job(owner, &shard.spec, recovery).map_err(Error::InvalidSpec)?;
    let name = desired.name_any();
    let api: Api<Job> = Api::namespaced(ctx.client.clone(), ns);
    let found = api.get_opt(&name).await.map_err(Error::Recovery)?;
    let job = match found {
        Some(job) => job,
        None => match api.create(&PostParams::default(), &desired).await {
            Ok(job) => job,
            Err(kube::Error::Api(e)) if e.code == 409 => desired,
            Err(e) => return Err(Error::Recovery(e)),
        },
    };
    let failed = job.status.as_ref().and_then(|s| s.failed).unwrap_or(0) > 0;
    let failure = match failed {
        true => failure_message(ctx, ns, &name).await,
        false => None,
    };
    let computed = verdict(recovery, Some(&job), failure);
    let previous = stored(shard).map(|c| c.reason.as_str());
    if previous != Some(computed.reason) {
        let type_ = if computed.reason == FAILED {
            EventType::Warning
        } else {
            EventType::Normal
        };
        ctx.event(guard, type_, computed.reason, computed.message.clone())
            .await;
    }
    Ok(computed)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn shard(backup: &str) -> Shard {
        let mut shard: Shard =
            serde_yaml::from_str(include_str!("../../fixtures/shard.yaml")).unwrap();
        shard.spec.backup = Some(serde_yaml::from_str(backup).unwrap());
        shard
    }

    const RECOVERING: &str = "
type: s3
s3: {bucket: backups, region: eu-west-1, endpoint: 's3.local:8333', keyPrefix: staging/, credentialsSecret: staging-keys}
recovery:
  source: {bucket: backups, region: eu-west-1, endpoint: 's3.local:8333', keyPrefix: prod, credentialsSecret: prod-keys}
  target: {time: '2026-12-05T14:02:59Z'}
";

    fn vars(job: &Job) -> BTreeMap<String, EnvVar> {
        let pod = job.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
        pod.containers[0]
            .env
            .iter()
            .flatten()
            .map(|v| (v.name.clone(), v.clone()))
            .collect()
    }

    fn value(vars: &BTreeMap<String, EnvVar>, name: &str) -> String {
        vars[name].value.clone().unwrap_or_default()
    }

    fn secret_of(vars: &BTreeMap<String, EnvVar>, name: &str) -> (String, String) {
        let from = vars[name].value_from.as_ref().unwrap();
        let key = from.secret_key_ref.as_ref().unwrap();
        (key.name.clone(), key.key.clone())
    }

    #[test]
    fn the_job_reads_the_source_with_its_keys_and_writes_only_its_own_repository() {
        let s = shard(RECOVERING);
        let owner = Owner::of(&s).unwrap();
        let recovery = pending(&s).unwrap();
        let job = job(&owner, &s.spec, recovery).unwrap();
        let vars = vars(&job);
        assert_eq!(value(&vars, "SOURCE_DESC"), "s3://backups/prod/multigres");
        assert_eq!(value(&vars, "OWN_DESC"), "s3://backups/staging/multigres");
        assert_eq!(secret_of(&vars, "SOURCE_KEY").0, "prod-keys");
        assert_eq!(
            secret_of(&vars, "OWN_SECRET"),
            ("staging-keys".into(), "AWS_SECRET_ACCESS_KEY".into())
        );
        assert_eq!(value(&vars, "RESTORE_TYPE"), "time");
        assert_eq!(value(&vars, "RESTORE_TARGET"), "2026-12-05 14:02:59+00");
        assert_eq!(
            value(&vars, "TABLE_GROUP"),
            s.spec.table_group_name.as_str()
        );
        assert_eq!(
            value(&vars, "RECOVERY_ID"),
            format!("recovery-{}", owner.reference.uid)
        );
        let spec = job.spec.as_ref().unwrap();
        assert_eq!(spec.backoff_limit, Some(0));
        assert_eq!(
            spec.ttl_seconds_after_finished,
            Some(FINISHED_JOB_TTL_SECONDS)
        );
        let pod = spec.template.spec.as_ref().unwrap();
        assert_eq!(pod.restart_policy.as_deref(), Some("Never"));
        assert_eq!(pod.automount_service_account_token, Some(false));
        let container = &pod.containers[0];
        assert_eq!(
            container.image.as_deref(),
            Some(s.spec.images.postgres.as_str())
        );
        // The script is the one argument: user values reach it only through the environment.
        let command = container.command.as_ref().unwrap();
        assert_eq!(command[..2], ["/bin/sh".to_owned(), "-c".to_owned()]);
        assert!(!command[2].contains("prod"));
        for write in ["archive-push", "stanza-create", "$own backup"] {
            let lines: Vec<&str> = SCRIPT.lines().filter(|l| l.contains(write)).collect();
            assert!(!lines.is_empty(), "{write}");
            assert!(
                lines.iter().all(|l| !l.contains("source")),
                "{write} names the source: {lines:?}"
            );
        }
        assert_eq!(
            job.metadata.owner_references.as_ref().unwrap()[0].uid,
            owner.reference.uid
        );
    }

    #[test]
    fn a_recovery_into_filesystem_backups_is_refused_by_name() {
        let s = shard(
            "
type: filesystem
filesystem: {path: /backups}
recovery:
  source: {bucket: backups, region: eu-west-1}
",
        );
        let owner = Owner::of(&s).unwrap();
        let problem = job(&owner, &s.spec, pending(&s).unwrap()).unwrap_err();
        assert!(problem.starts_with("spec.backup.recovery"), "{problem}");
    }

    #[test]
    fn targets_read_as_pgbackrest_takes_them_and_as_messages_name_them() {
        let target = |yaml: &str| -> RecoveryTarget { serde_yaml::from_str(yaml).unwrap() };
        assert_eq!(
            restore_target(Some(&target("{lsn: 0/3000060}"))),
            ("lsn", "0/3000060".to_owned())
        );
        assert_eq!(
            restore_target(Some(&target("{backup: 20261205-094009F}"))),
            ("backup", "20261205-094009F".to_owned())
        );
        assert_eq!(restore_target(None), ("latest", String::new()));
        assert_eq!(
            describe_target(Some(&target("{time: '2026-12-05T14:02:59Z'}"))),
            "time 2026-12-05T14:02:59Z"
        );
        assert_eq!(describe_target(None), "the end of its archived WAL");
    }

    #[test]
    fn the_verdict_follows_the_job_and_stays_once_true() {
        let mut s = shard(RECOVERING);
        let recovery = pending(&s).unwrap().clone();
        let job = |status: &str| -> Job {
            serde_yaml::from_str(&format!("metadata: {{name: r}}\nstatus: {status}")).unwrap()
        };
        let running = verdict(&recovery, Some(&job("{active: 1}")), None);
        assert_eq!((running.status, running.reason), (FALSE, "Restoring"));
        let failed = verdict(
            &recovery,
            Some(&job("{failed: 1}")),
            Some(
                "unable to find backup set with stop time less than '2026-12-05 14:02:59+00'"
                    .into(),
            ),
        );
        assert_eq!(failed.reason, "RecoveryFailed");
        assert!(
            failed.message.contains("unable to find backup set"),
            "{}",
            failed.message
        );
        assert!(
            failed.message.contains("s3://backups/prod/multigres"),
            "{}",
            failed.message
        );
        let restored = verdict(&recovery, Some(&job("{succeeded: 1}")), None);
        assert!(restored.is_true());
        assert!(done(&s).is_none());
        s.status = Some(serde_yaml::from_str(
            "conditions: [{type: Recovery, status: 'True', reason: Restored, message: m, lastTransitionTime: '2026-12-05T14:10:00Z'}]",
        ).unwrap());
        assert!(pending(&s).is_none());
        assert_eq!(done(&s).unwrap().message, "m");
    }
}
