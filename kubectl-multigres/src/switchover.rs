//! `switchover`: asks for the documented switchover (docs/operations.md): the annotation
//! `multigres.com/switchover` on the primary pool pod. The resource-handler turns it into a
//! hand-over under the gates of a rollout, multiorch appoints the new primary among the
//! cohort's replicas (the annotation names no target: any value asks), and the annotation is
//! removed once another pod is the primary.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use multigres_api::labels::USER_SWITCHOVER;
use multigres_api::v1alpha1::{POD_ROLE_PRIMARY, Shard};

use crate::view;

/// Shard condition the resource-handler writes while a primary must hand over.
const SWITCHOVER_CONDITION: &str = "Switchover";
/// How often `--wait` reads the Shard.
const POLL: Duration = Duration::from_millis(500);

/// The primary pool pod the Shard status names, if a replica can take over from it.
pub fn primary(shard: &Shard) -> Result<String> {
    let roles = shard
        .status
        .as_ref()
        .map(|s| s.pod_roles.clone())
        .unwrap_or_default();
    let name = shard.name_any();
    let primary = roles
        .iter()
        .find(|(_, role)| role.as_str() == POD_ROLE_PRIMARY)
        .map(|(pod, _)| pod.clone())
        .ok_or_else(|| anyhow!("Shard {name} publishes no primary yet (roles: {roles:?})"))?;
    if !roles
        .iter()
        .any(|(pod, role)| *pod != primary && role == "REPLICA")
    {
        bail!("Shard {name} has no replica to hand over to: {primary} is its only pool pod");
    }
    Ok(primary)
}

/// Where a switchover away from `old` stands, as the Shard status tells.
#[derive(Debug, PartialEq, Eq)]
pub enum Progress {
    /// Another pod is the primary.
    Done(String),
    /// Not yet, and what the Shard says about it.
    Waiting(String),
}

/// How far the switchover away from `old` got.
pub fn progress(shard: &Shard, old: &str) -> Progress {
    let status = shard.status.clone().unwrap_or_default();
    let primary = status
        .pod_roles
        .iter()
        .find(|(_, role)| role.as_str() == POD_ROLE_PRIMARY)
        .map(|(pod, _)| pod.clone());
    match primary {
        Some(new) if new != old => return Progress::Done(new),
        Some(_) => {}
        None => {
            return Progress::Waiting("no primary published (a new one is being elected)".into());
        }
    }
    let condition = status
        .conditions
        .iter()
        .find(|c| c.type_ == SWITCHOVER_CONDITION);
    Progress::Waiting(match condition {
        Some(c) => format!("{} is still the primary; {}: {}", old, c.reason, c.message),
        None => format!("{old} is still the primary"),
    })
}

/// Annotates the primary of the Shard (or the cluster's only Shard) `name`; with `wait`, follows
/// the Shard until another pod is the primary, for at most `timeout`.
pub async fn run(
    client: &Client,
    namespace: &str,
    name: &str,
    wait: bool,
    timeout: Duration,
) -> Result<()> {
    let shard = view::shard(client, namespace, name).await?;
    let shard_name = shard.name_any();
    let old = primary(&shard)?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let pod = pods
        .get(&old)
        .await
        .with_context(|| format!("reading the primary pool pod {namespace}/{old}"))?;
    match pod.annotations().get(USER_SWITCHOVER) {
        Some(asked) => println!(
            "{old} (primary of Shard {shard_name}) was already asked: {USER_SWITCHOVER}={asked}"
        ),
        None => {
            let asked = Timestamp::now().to_string();
            let patch = serde_json::json!({"metadata": {"annotations": {USER_SWITCHOVER: asked}}});
            pods.patch(&old, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .with_context(|| format!("annotating pod {namespace}/{old}"))?;
            println!(
                "asked {old} (primary of Shard {shard_name}) to hand over: {USER_SWITCHOVER}={asked}"
            );
        }
    }
    println!("multiorch chooses the new primary among the cohort's replicas");
    if !wait {
        println!("follow it with: kubectl get shard {shard_name} -n {namespace} -w");
        return Ok(());
    }
    let shards: Api<Shard> = Api::namespaced(client.clone(), namespace);
    let started = Instant::now();
    let mut said = String::new();
    loop {
        let shard = shards
            .get(&shard_name)
            .await
            .with_context(|| format!("reading Shard {namespace}/{shard_name}"))?;
        let elapsed = started.elapsed().as_secs_f64();
        match progress(&shard, &old) {
            Progress::Done(new) => {
                println!("[{elapsed:5.1}s] {new} is the primary (was {old})");
                return Ok(());
            }
            Progress::Waiting(text) if text != said => {
                println!("[{elapsed:5.1}s] {text}");
                said = text;
            }
            Progress::Waiting(_) => {}
        }
        if started.elapsed() > timeout {
            bail!("{old} is still the primary after {timeout:?}: {said}");
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

    use super::*;
    use crate::status::tests::fixture;

    const A0: &str = "prod-postgres-default-0-inf-pool-main-zone-a-0";
    const A1: &str = "prod-postgres-default-0-inf-pool-main-zone-a-1";

    fn shard() -> Shard {
        fixture(include_str!("../fixtures/degraded.yaml"))
            .shards
            .remove(0)
    }

    #[test]
    fn the_primary_is_read_from_the_shard_status() {
        assert_eq!(primary(&shard()).unwrap(), A0);
        let mut alone = shard();
        let roles = &mut alone.status.as_mut().unwrap().pod_roles;
        roles.retain(|pod, _| pod == A0);
        let error = primary(&alone).unwrap_err().to_string();
        assert!(error.contains("no replica to hand over to"), "{error}");
        alone.status.as_mut().unwrap().pod_roles.clear();
        let error = primary(&alone).unwrap_err().to_string();
        assert!(error.contains("publishes no primary"), "{error}");
    }

    #[test]
    fn progress_follows_roles_and_the_switchover_condition() {
        let mut shard = shard();
        assert_eq!(
            progress(&shard, A0),
            Progress::Waiting(format!("{A0} is still the primary"))
        );
        let status = shard.status.as_mut().unwrap();
        status.conditions.push(Condition {
            type_: "Switchover".into(),
            status: "True".into(),
            reason: "WaitingForSwitchover".into(),
            message: "asked the primary to hand over".into(),
            last_transition_time: Time(Timestamp::UNIX_EPOCH),
            observed_generation: None,
        });
        assert_eq!(
            progress(&shard, A0),
            Progress::Waiting(format!(
                "{A0} is still the primary; WaitingForSwitchover: asked the primary to hand over"
            ))
        );
        let roles = &mut shard.status.as_mut().unwrap().pod_roles;
        roles.insert(A0.into(), "REPLICA".into());
        assert!(matches!(progress(&shard, A0), Progress::Waiting(w) if w.contains("no primary")));
        let roles = &mut shard.status.as_mut().unwrap().pod_roles;
        roles.insert(A1.into(), "PRIMARY".into());
        assert_eq!(progress(&shard, A0), Progress::Done(A1.into()));
    }
}
