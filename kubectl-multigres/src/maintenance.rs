//! Maintenance. `pause` and `resume` set and remove the annotation `multigres.com/paused` on a
//! MultigresCluster (docs/operations.md, "Pausing a cluster"). The operator passes it on to the
//! cluster's children and stops changing their workloads; the cluster's `Paused` condition confirms it.
//! `hibernate` and `wake` set and remove `multigres.com/hibernate` (docs/operations.md,
//! "Hibernating a cluster"): every data-plane pod stops, the volumes stay; the cluster's phase
//! becomes Hibernated once none is left.
//! `restart`: under `multigres.com/restart-policy: supervised`, releases the pool pod restarts
//! each Shard holds (its `status.pendingRestart`, copied into `multigres.com/release-restarts`).

use anyhow::{Context, Result};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use multigres_api::labels::{self, HIBERNATE, PAUSED, RELEASE_RESTARTS};
use multigres_api::v1alpha1::{MultigresCluster, Shard};
use serde_json::{Value, json};

use crate::view;

/// A switch annotation of a MultigresCluster the plugin turns on and off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Switch {
    /// `multigres.com/paused`: `pause` and `resume`.
    Pause,
    /// `multigres.com/hibernate`: `hibernate` and `wake`.
    Hibernate,
}

impl Switch {
    fn annotation(self) -> &'static str {
        match self {
            Self::Pause => PAUSED,
            Self::Hibernate => HIBERNATE,
        }
    }
}

/// The merge patch that turns `switch` on (`"true"`) or off (removing the annotation).
pub fn patch(switch: Switch, on: bool) -> Value {
    let value = if on { json!("true") } else { Value::Null };
    json!({"metadata": {"annotations": {switch.annotation(): value}}})
}

/// What the command prints once the annotation is written.
pub fn said(switch: Switch, cluster: &str, on: bool) -> String {
    match (switch, on) {
        (Switch::Pause, true) => format!(
            "MultigresCluster {cluster} paused: the operator changes none of its workloads until \
             `kubectl multigres resume {cluster}`; status keeps being reported"
        ),
        (Switch::Pause, false) => format!(
            "MultigresCluster {cluster} resumed: changes made while it was paused are applied now"
        ),
        (Switch::Hibernate, true) => format!(
            "MultigresCluster {cluster} hibernating: its pods stop, its volumes, topology, backups \
             and Secrets stay; its phase turns Hibernated once no pod is left. \
             `kubectl multigres wake {cluster}` starts it again"
        ),
        (Switch::Hibernate, false) => format!(
            "MultigresCluster {cluster} waking: its pods start on the same volumes, and it serves \
             once multiorch has elected a primary (kubectl multigres status {cluster})"
        ),
    }
}

/// Turns `switch` on or off on `cluster` in `namespace`.
pub async fn run(
    client: &Client,
    namespace: &str,
    cluster: &str,
    switch: Switch,
    on: bool,
) -> Result<()> {
    let api: Api<MultigresCluster> = Api::namespaced(client.clone(), namespace);
    api.patch(
        cluster,
        &PatchParams::default(),
        &Patch::Merge(patch(switch, on)),
    )
    .await
    .with_context(|| format!("annotating MultigresCluster {cluster} in {namespace}"))?;
    println!("{}", said(switch, cluster, on));
    Ok(())
}

/// The releases to write: each Shard that holds restarts, with what it holds.
pub fn releases(shards: &[Shard]) -> Vec<(String, String)> {
    shards
        .iter()
        .filter_map(|shard| {
            let pending = shard.status.as_ref()?.pending_restart.clone()?;
            let already = shard.annotations().get(RELEASE_RESTARTS) == Some(&pending);
            (!already).then(|| (shard.name_any(), pending))
        })
        .collect()
}

/// Releases the restarts the Shards of `cluster` hold under supervised restarts.
pub async fn restart(client: &Client, namespace: &str, cluster: &str) -> Result<()> {
    let found = view::cluster(client, namespace, cluster).await?;
    let of_cluster = ListParams::default().labels(&format!("{}={cluster}", labels::CLUSTER));
    let shards: Vec<Shard> = view::list(client, namespace, &of_cluster).await?;
    let released = releases(&shards);
    if released.is_empty() {
        let policy = if labels::supervised(found.annotations()) {
            "no Shard holds a restart"
        } else {
            "its restarts are automatic (no multigres.com/restart-policy: supervised)"
        };
        println!("MultigresCluster {cluster}: nothing to release, {policy}");
        return Ok(());
    }
    let api: Api<Shard> = Api::namespaced(client.clone(), namespace);
    for (shard, pending) in released {
        let patch = json!({"metadata": {"annotations": {RELEASE_RESTARTS: pending}}});
        api.patch(&shard, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .with_context(|| format!("releasing the restarts of Shard {shard}"))?;
        println!(
            "Shard {shard}: restarts of {pending} released; its pool pods restart one at a time, \
             replicas first (kubectl multigres status {cluster} follows them)"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pause_sets_the_annotation_and_resume_removes_it() {
        assert_eq!(
            patch(Switch::Pause, true),
            json!({"metadata": {"annotations": {"multigres.com/paused": "true"}}})
        );
        assert_eq!(
            patch(Switch::Pause, false),
            json!({"metadata": {"annotations": {"multigres.com/paused": null}}})
        );
        assert!(said(Switch::Pause, "minimal", true).contains("kubectl multigres resume minimal"));
    }

    #[test]
    fn hibernate_sets_the_annotation_and_wake_removes_it() {
        assert_eq!(
            patch(Switch::Hibernate, true),
            json!({"metadata": {"annotations": {"multigres.com/hibernate": "true"}}})
        );
        assert_eq!(
            patch(Switch::Hibernate, false),
            json!({"metadata": {"annotations": {"multigres.com/hibernate": null}}})
        );
        assert!(
            said(Switch::Hibernate, "minimal", true).contains("kubectl multigres wake minimal")
        );
    }

    #[test]
    fn restart_releases_what_each_shard_holds_once() {
        let shard = |name: &str, pending: Option<&str>, released: Option<&str>| {
            let mut s: Shard = serde_json::from_value(json!({
                "apiVersion": "multigres.com/v1alpha1", "kind": "Shard",
                "metadata": {"name": name},
                "spec": serde_yaml::from_str::<Value>(include_str!("../../resource-handler/fixtures/shard.yaml")).unwrap()["spec"],
            }))
            .unwrap();
            s.status = Some(multigres_api::v1alpha1::ShardStatus {
                pending_restart: pending.map(Into::into),
                ..Default::default()
            });
            if let Some(r) = released {
                s.annotations_mut()
                    .insert(RELEASE_RESTARTS.into(), r.into());
            }
            s
        };
        let shards = [
            shard("a", Some("pool-a-v2"), None),
            shard("b", None, None),
            shard("c", Some("pool-c-v3"), Some("pool-c-v3")),
            shard("d", Some("pool-d-v4"), Some("pool-d-v3")),
        ];
        assert_eq!(
            releases(&shards),
            [
                ("a".to_owned(), "pool-a-v2".to_owned()),
                ("d".to_owned(), "pool-d-v4".to_owned())
            ]
        );
    }
}
