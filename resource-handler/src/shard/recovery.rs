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

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{
    ConfigMapVolumeSource, EphemeralVolumeSource, PersistentVolumeClaimTemplate, Volume,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::ResourceExt;
use kube::runtime::events::EventType;
use multigres_api::owner::Owner;
use multigres_api::resolver::defaults;
use multigres_api::v1alpha1::{RecoveryConfig, RecoveryTarget, Shard, ShardSpec};

use super::build::{self, BuildError};
use super::pgconfig::{CONFIG_DIR, CONFIG_KEY};
use super::{Error, Guard, prestart, repository};
use crate::conditions::{Computed, FALSE, TRUE};
use crate::contract::{PASSWORD_DIR, PASSWORD_FILE, POOLER_DIR};
use crate::controller::Ctx;
use crate::podspec::{env, mount};

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

/// The Job that seeds the shard's own repository with `recovery`'s source restored to its
/// target (see the module docs). It runs once (no retry: a second attempt would find WAL of
/// the first in the repository), as the pool pods' PostgreSQL user, with a scratch volume like
/// the first pool's data volume, and is deleted with the Shard.
pub fn job(owner: &Owner, spec: &ShardSpec, recovery: &RecoveryConfig) -> Result<Job, BuildError> {
    let own = repository::own(spec).ok_or(BuildError::RecoveryWithoutS3)?;
    let pool = prestart::first_pool(spec)?;
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
        env("PASSWORD_FILE", PASSWORD_FILE),
        env("EXTRA_CONF", format!("{CONFIG_DIR}/{CONFIG_KEY}")),
    ];
    vars.extend(prestart::repository_env("SOURCE", &recovery.source));
    let scratch = Volume {
        name: SCRATCH_VOLUME.to_owned(),
        ephemeral: Some(EphemeralVolumeSource {
            volume_claim_template: Some(PersistentVolumeClaimTemplate {
                metadata: None,
                spec: claim,
            }),
        }),
        ..Default::default()
    };
    // The shard's own postgresql.conf: PostgreSQL promotes here with the settings the pool pods
    // run, so none of them is below what the restored data was written with (a standby refuses
    // a max_connections lower than its primary's).
    let config = Volume {
        name: CONFIG_VOLUME.to_owned(),
        config_map: Some(ConfigMapVolumeSource {
            name: crate::names::postgres_config(&owner.name),
            ..Default::default()
        }),
        ..Default::default()
    };
    let script = prestart::Script {
        name,
        container: "recovery",
        text: SCRIPT,
        env: vars,
        volumes: vec![
            (scratch, mount(SCRATCH_VOLUME, POOLER_DIR, false)),
            (
                build::password_volume(spec),
                mount(build::PASSWORD_VOLUME, PASSWORD_DIR, true),
            ),
            (config, mount(CONFIG_VOLUME, CONFIG_DIR, true)),
        ],
        // PostgreSQL and pgBackRest write lock and log files outside the volume.
        read_only_root: false,
        resources: pool.postgres.as_ref().and_then(|c| c.resources.clone()),
        // A second attempt would find WAL of the first in the repository.
        retries: 0,
        final_status: None,
    };
    Ok(prestart::job(owner, spec, pool, own, script))
}

/// The `Recovery` verdict from the Job as stored (`None`: not created yet) and, once it
/// failed, what its pod said.
pub fn verdict(recovery: &RecoveryConfig, job: Option<&Job>, failure: Option<String>) -> Computed {
    let source = prestart::describe_repository(&recovery.source);
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
    let desired = job(owner, &shard.spec, recovery)?;
    let name = desired.name_any();
    let job = prestart::ensure(ctx, desired)
        .await
        .map_err(Error::Recovery)?;
    let failed = job.status.as_ref().and_then(|s| s.failed).unwrap_or(0) > 0;
    let failure = match failed {
        true => prestart::failure_message(ctx, &owner.namespace, &name).await,
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
        ctx.kit
            .event(guard, type_, computed.reason, computed.message.clone())
            .await;
    }
    Ok(computed)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::EnvVar;

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
        let vars = prestart::env_of(&job);
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
            Some(prestart::FINISHED_JOB_TTL_SECONDS)
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
        assert_eq!(problem, BuildError::RecoveryWithoutS3);
        assert!(problem.to_string().starts_with("spec.backup.recovery"));
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
