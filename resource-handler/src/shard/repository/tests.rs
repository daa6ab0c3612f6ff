use super::*;

const S3: &str = "
type: s3
s3: {bucket: backups, region: eu-west-1, endpoint: 's3.local:8333', keyPrefix: prod/, credentialsSecret: prod-keys}
";

fn shard(backup: &str) -> Shard {
    let mut shard: Shard =
        serde_yaml::from_str(include_str!("../../../fixtures/shard.yaml")).unwrap();
    shard.spec.backup = Some(serde_yaml::from_str(backup).unwrap());
    shard
}

fn job_with(status: &str) -> Job {
    serde_yaml::from_str(&format!("metadata: {{name: m}}\nstatus: {status}")).unwrap()
}

fn with_condition(shard: &mut Shard, status: &str, reason: &str, message: &str) {
    shard.status = Some(
        serde_json::from_value(serde_json::json!({"conditions": [{
            "type": BACKUP_REPOSITORY, "status": status, "reason": reason,
            "message": message, "lastTransitionTime": "2026-12-05T14:10:00Z",
        }]}))
        .unwrap(),
    );
}

#[test]
fn the_marker_names_the_namespace_the_cluster_and_the_kubernetes_cluster() {
    let s = shard(S3);
    let owner = Owner::of(&s).unwrap();
    assert_eq!(
        marker(&owner, "5f0c-uid"),
        "cluster=db/prod kubernetes=5f0c-uid"
    );
}

#[test]
fn the_job_gets_the_repository_and_the_marker_only_through_its_environment() {
    let s = shard(S3);
    let owner = Owner::of(&s).unwrap();
    let s3 = pending(&s).unwrap();
    let job = job(&owner, &s.spec, s3, "cluster=db/prod kubernetes=k").unwrap();
    let vars = prestart::env_of(&job);
    let value = |name: &str| vars[name].value.clone().unwrap_or_default();
    assert_eq!(value("OWNER"), "cluster=db/prod kubernetes=k");
    assert_eq!(value("OWN_DESC"), "s3://backups/prod/multigres");
    assert_eq!(value("OWN_KEY_PREFIX"), "prod/");
    let key = vars["OWN_KEY"].value_from.as_ref().unwrap();
    assert_eq!(key.secret_key_ref.as_ref().unwrap().name, "prod-keys");
    let spec = job.spec.as_ref().unwrap();
    assert_eq!(spec.backoff_limit, Some(RETRIES));
    let rule = &spec.pod_failure_policy.as_ref().unwrap().rules[0];
    assert_eq!(rule.action, "FailJob");
    assert_eq!(
        rule.on_exit_codes.as_ref().unwrap().values,
        [OWNED_ELSEWHERE_STATUS]
    );
    let pod = spec.template.spec.as_ref().unwrap();
    assert_eq!(pod.automount_service_account_token, Some(false));
    assert_eq!(pod.restart_policy.as_deref(), Some("Never"));
    let container = &pod.containers[0];
    let command = container.command.as_ref().unwrap();
    assert_eq!(command[..2], ["/bin/sh".to_owned(), "-c".to_owned()]);
    assert!(!command[2].contains("prod"), "a user value in the script");
    // The kubelet leaves the script's own command substitutions alone.
    assert!(!command[2].contains(" $(pgbackrest"), "{}", command[2]);
    assert_eq!(
        container
            .security_context
            .as_ref()
            .unwrap()
            .read_only_root_filesystem,
        Some(true)
    );
    assert_eq!(
        job.metadata.owner_references.as_ref().unwrap()[0].uid,
        owner.reference.uid
    );
    // The script exits with the status the policy fails the Job at once on.
    assert!(SCRIPT.contains(&format!("\" {OWNED_ELSEWHERE_STATUS}\n")));
}

#[test]
fn a_shard_without_pools_has_no_user_to_mark_its_repository_as() {
    let mut s = shard(S3);
    s.spec.pools.clear();
    let owner = Owner::of(&s).unwrap();
    let s3 = pending(&s).unwrap();
    assert_eq!(
        job(&owner, &s.spec, s3, "cluster=db/prod kubernetes=k").map(|_| ()),
        Err(BuildError::NoPools)
    );
}

#[test]
fn another_repository_is_marked_again_under_another_job() {
    let mut s = shard(S3);
    let s3 = own(&s.spec).unwrap().clone();
    let first = job_name(&s.name_any(), &s3);
    assert!(first.starts_with("prod-postgres-default-0-inf-repository-"));
    let marked = verdict(&s3, &job_with("{succeeded: 1}"), None);
    assert!(marked.is_true());
    with_condition(&mut s, "True", "Marked", &marked.message);
    assert!(pending(&s).is_none());
    assert_eq!(done(&s).unwrap().message, marked.message);

    let mut moved = s.clone();
    moved.spec.backup =
        Some(serde_yaml::from_str(&S3.replace("keyPrefix: prod/", "keyPrefix: prod-2/")).unwrap());
    assert!(pending(&moved).is_some());
    assert!(done(&moved).is_none());
    assert_ne!(
        job_name(&moved.name_any(), own(&moved.spec).unwrap()),
        first
    );
}

#[test]
fn filesystem_backups_mark_nothing() {
    let s = shard("{type: filesystem, filesystem: {path: /backups}}");
    assert!(pending(&s).is_none());
    assert!(done(&s).is_none());
}

#[test]
fn the_verdict_follows_the_job_and_names_the_owner_found() {
    let s = shard(S3);
    let s3 = own(&s.spec).unwrap();
    let running = verdict(s3, &job_with("{active: 1}"), None);
    assert_eq!((running.status, running.reason), (FALSE, "Marking"));
    let retrying = verdict(
        s3,
        &job_with("{active: 1, failed: 1}"),
        Some("cannot read the owner: HTTP 403".into()),
    );
    assert_eq!(retrying.reason, "Marking");
    assert!(
        retrying.message.contains("HTTP 403"),
        "{}",
        retrying.message
    );
    let said = "s3://backups/prod/multigres belongs to another cluster (its marker says: \
                cluster=db/prod kubernetes=other), not to cluster=db/prod kubernetes=this";
    let refused = verdict(
        s3,
        &job_with("{failed: 1, conditions: [{type: Failed, status: 'True'}]}"),
        Some(said.into()),
    );
    assert_eq!(refused.reason, OWNED_ELSEWHERE);
    assert!(failed(&refused));
    assert!(
        refused.message.contains("kubernetes=other"),
        "{}",
        refused.message
    );
    let unreachable = verdict(
        s3,
        &job_with("{failed: 4, conditions: [{type: Failed, status: 'True'}]}"),
        None,
    );
    assert_eq!(unreachable.reason, FAILED);
    assert!(unreachable.message.contains("no message"));
}

#[test]
fn only_a_false_condition_reads_as_a_repository_not_this_clusters() {
    let mut s = shard(S3);
    assert_eq!(s.unclaimed_repository(), None);
    with_condition(&mut s, "False", OWNED_ELSEWHERE, "owned by db/other");
    assert_eq!(s.unclaimed_repository(), Some("owned by db/other"));
    with_condition(&mut s, "True", "Marked", "marked");
    assert_eq!(s.unclaimed_repository(), None);
}
