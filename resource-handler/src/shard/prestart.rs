//! The Jobs a shard runs once before its pool pods start: [`super::repository`] marks its S3
//! backup repository as its cluster's, [`super::recovery`] restores another cluster's data into
//! it. Each runs one script in the pgctld image (PostgreSQL, pgBackRest and dash), after
//! `pgbackrest.sh`, as the first pool's PostgreSQL user, on that pool's tolerations, with the
//! repository's service account but no API token, and is deleted with the Shard or an hour
//! after it ends. Every value reaches the script through its environment.

use k8s_openapi::api::batch::v1::{
    Job, JobSpec, PodFailurePolicy, PodFailurePolicyOnExitCodesRequirement, PodFailurePolicyRule,
};
use k8s_openapi::api::core::v1::{
    Container, EnvVar, Pod, PodSpec, PodTemplateSpec, ResourceRequirements, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{ListParams, PostParams};
use kube::runtime::reflector::ObjectRef;
use multigres_api::labels::{self, Component};
use multigres_api::owner::Owner;
use multigres_api::resolver::defaults;
use multigres_api::v1alpha1::{PoolSpec, S3BackupConfig, ShardSpec};

use super::Guard;
use super::build::{self, BuildError};
use crate::controller::Ctx;
use crate::podspec::{container_security, env, env_from_secret, pod_security};

/// How long a finished Job, its pod and any scratch volume are kept (what the pod said is in
/// the Shard's condition by then).
pub const FINISHED_JOB_TTL_SECONDS: i32 = 3600;

/// What one Job runs.
pub struct Script {
    /// The Job's name.
    pub name: String,
    /// The container's name.
    pub container: &'static str,
    /// The whole script: `pgbackrest.sh` (the shell functions every script starts with), then
    /// the Job's own.
    pub text: &'static str,
    /// What the script reads besides [`job`]'s `POSTGRES_USER` and `OWN_*`.
    pub env: Vec<EnvVar>,
    /// The pod's volumes, each with where it is mounted and whether read-only.
    pub volumes: Vec<(Volume, VolumeMount)>,
    /// Whether the root filesystem is read-only (PostgreSQL writes outside its volumes).
    pub read_only_root: bool,
    /// The container's resources.
    pub resources: Option<ResourceRequirements>,
    /// Pods tried after the first fails.
    pub retries: i32,
    /// An exit status that fails the Job at once, however many tries are left.
    pub final_status: Option<i32>,
}

/// The first pool of `spec`, whose PostgreSQL user, volume size and tolerations the Jobs take.
pub fn first_pool(spec: &ShardSpec) -> Result<&PoolSpec, BuildError> {
    spec.pools
        .values()
        .next()
        .map(|pool| &**pool)
        .ok_or(BuildError::NoPools)
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

/// The environment naming one repository to a script (`prefix` `SOURCE` or `OWN`), its keys
/// from the Secret it names.
pub fn repository_env(prefix: &str, s3: &S3BackupConfig) -> Vec<EnvVar> {
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

/// The Job of `owner`'s shard running `script` against its own repository `own`, as
/// `pool`'s PostgreSQL user (see the module docs).
pub fn job(
    owner: &Owner,
    spec: &ShardSpec,
    pool: &PoolSpec,
    own: &S3BackupConfig,
    script: Script,
) -> Job {
    let (pg, _) = build::pool_identities(pool);
    let mut vars = vec![env(
        "POSTGRES_USER",
        spec.postgres_superuser
            .clone()
            .unwrap_or_else(|| defaults::POSTGRES_SUPERUSER.to_owned()),
    )];
    vars.extend(script.env);
    vars.extend(repository_env("OWN", own));
    let (mut volumes, mounts): (Vec<Volume>, Vec<VolumeMount>) = script.volumes.into_iter().unzip();
    let pull = build::pull(spec);
    let container = Container {
        name: script.container.to_owned(),
        image: Some(spec.images.postgres.as_str().to_owned()),
        image_pull_policy: Some(pull.policy()),
        // The kubelet leaves the script's own `$(...)` alone.
        command: Some(vec![
            "/bin/sh".to_owned(),
            "-c".to_owned(),
            multigres_api::expansion::literal(script.text),
        ]),
        env: Some(vars),
        resources: script.resources,
        security_context: Some(container_security(pg, script.read_only_root)),
        volume_mounts: Some(mounts),
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
    // A scratch volume's claim carries the shard's labels too.
    let claims = volumes
        .iter_mut()
        .filter_map(|v| v.ephemeral.as_mut()?.volume_claim_template.as_mut());
    for claim in claims {
        claim.metadata.get_or_insert_with(Default::default).labels = Some(labels.clone());
    }
    let pod = PodSpec {
        containers: vec![container],
        restart_policy: Some("Never".to_owned()),
        volumes: Some(volumes),
        security_context: Some(pod_security(pg, pool.fs_group.unwrap_or(pg.group))),
        service_account_name: own.service_account_name.clone(),
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        image_pull_secrets: pull.secrets(),
        tolerations: (!pool.tolerations.is_empty()).then(|| pool.tolerations.clone()),
        ..Default::default()
    };
    let pod_failure_policy = script.final_status.map(|status| PodFailurePolicy {
        rules: vec![PodFailurePolicyRule {
            action: "FailJob".to_owned(),
            on_exit_codes: Some(PodFailurePolicyOnExitCodesRequirement {
                container_name: None,
                operator: "In".to_owned(),
                values: vec![status],
            }),
            on_pod_conditions: None,
        }],
    });
    Job {
        metadata: ObjectMeta {
            name: Some(script.name),
            namespace: Some(owner.namespace.clone()),
            labels: Some(labels.clone()),
            owner_references: Some(vec![owner.reference.clone()]),
            ..Default::default()
        },
        spec: Some(JobSpec {
            backoff_limit: Some(script.retries),
            pod_failure_policy,
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
    }
}

/// The Job `desired` names, as cached (its end wakes the shard); created first if there is
/// none.
pub async fn ensure(ctx: &Ctx<Guard>, desired: Job) -> Result<Job, kube::Error> {
    if let Some(job) = ctx.stores.jobs.get(&ObjectRef::from_obj(&desired)) {
        return Ok((*job).clone());
    }
    let api: Api<Job> = Api::namespaced(
        ctx.client.clone(),
        desired.metadata.namespace.as_deref().unwrap_or_default(),
    );
    match api.create(&PostParams::default(), &desired).await {
        Ok(job) => Ok(job),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(desired),
        Err(e) => Err(e),
    }
}

/// What a failed pod of `job` (in `ns`) wrote to its termination message.
pub async fn failure_message(ctx: &Ctx<Guard>, ns: &str, job: &str) -> Option<String> {
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

/// The environment of `job`'s container, by name (for tests).
#[cfg(test)]
pub fn env_of(job: &Job) -> std::collections::BTreeMap<String, EnvVar> {
    let pod = job.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    pod.containers[0]
        .env
        .iter()
        .flatten()
        .map(|v| (v.name.clone(), v.clone()))
        .collect()
}
