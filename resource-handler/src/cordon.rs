//! Nodes being drained. `kubectl drain` (and a cluster's node upgrades) cordon a node
//! (`spec.unschedulable`) before evicting its pods. A primary pool pod on such a node is asked to
//! hand over to a Ready replica on another node first, while the shard's primary
//! PodDisruptionBudget refuses its eviction (see [`crate::shard::build`]); once it is a replica,
//! the drain evicts it like any other.
//!
//! A multigateway or multiorch Deployment running a single pod has a budget that refuses its
//! eviction (a drain must not take a cell's only one); when that pod is on a cordoned node the
//! Cell or Shard reconcile moves it (see [`crate::stateless::moved_off`]), a multiorch only once
//! the shard's primary has handed over, since multiorch appoints the new primary.
//!
//! No event tells a Shard about the node of its pods, so the cordoned nodes are listed every
//! [`PERIOD`], by name only and through a field selector (on a cluster with no drain under way
//! the answer is empty), and every Shard is reconciled when the set changes. Without the right
//! to list nodes (a namespaced installation) this logs once and tries again rarely: primaries
//! are then not moved before a drain, and their PodDisruptionBudget makes the drain wait.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use futures::channel::mpsc::UnboundedSender;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::ListParams;
use kube::{Api, Client};
use multigres_common::shutdown::Shutdown;
use multigres_common::telemetry::ErrorChain;

use crate::stateless;
use crate::sync::SyncError;

/// How often the cordoned nodes are listed.
pub const PERIOD: Duration = Duration::from_secs(10);
/// How often they are listed while the handler may not list nodes.
const FORBIDDEN_PERIOD: Duration = Duration::from_secs(300);

/// The names of the cordoned nodes, as last listed.
#[derive(Clone, Debug, Default)]
pub struct Cordoned(Arc<RwLock<BTreeSet<String>>>);

impl Cordoned {
    /// Whether node `name` was cordoned at the last listing.
    pub fn contains(&self, name: &str) -> bool {
        self.0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(name)
    }

    /// Whether no node was cordoned at the last listing.
    pub fn is_empty(&self) -> bool {
        self.0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty()
    }

    /// Replaces the set; whether it changed.
    fn replace(&self, names: BTreeSet<String>) -> bool {
        let mut set = self.0.write().unwrap_or_else(PoisonError::into_inner);
        let changed = *set != names;
        *set = names;
        changed
    }
}

/// The first pod `selector` picks in `namespace` that runs on a cordoned node (and is not
/// leaving), as `<node>/<pod>`. Pods are listed only while some node is cordoned.
pub async fn stranded_on(
    client: &Client,
    namespace: &str,
    selector: &BTreeMap<String, String>,
    cordoned: &Cordoned,
) -> Result<Option<String>, kube::Error> {
    if cordoned.is_empty() {
        return Ok(None);
    }
    let labels: Vec<String> = selector.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let pods = Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels(&labels.join(",")))
        .await?;
    Ok(pods
        .items
        .into_iter()
        .filter(|pod| pod.metadata.deletion_timestamp.is_none())
        .find_map(|pod| {
            let node = pod.spec?.node_name?;
            cordoned
                .contains(&node)
                .then(|| format!("{node}/{}", pod.metadata.name.unwrap_or_default()))
        }))
}

/// Moves `deployment`'s only pod off a cordoned node (when `may_move`), and keeps the mark of
/// an earlier move (see [`stateless::moved_off`]). The mark names the pod as well as the node,
/// so a later pod on the same node, cordoned again, is moved too. Returns the `<node>/<pod>`
/// that starts moving now, for an event.
pub async fn move_single_pod(
    client: &Client,
    cordoned: &Cordoned,
    deployment: &mut Deployment,
    observed: Option<&Deployment>,
    may_move: bool,
) -> Result<Option<String>, SyncError> {
    let last = stateless::last_moved_off(observed).map(str::to_owned);
    let spec = deployment.spec.as_ref();
    let single = spec.and_then(|s| s.replicas) == Some(1);
    let selector = spec
        .and_then(|s| s.selector.match_labels.clone())
        .unwrap_or_default();
    let namespace = deployment.metadata.namespace.clone().unwrap_or_default();
    let stranded = if single && may_move {
        stranded_on(client, &namespace, &selector, cordoned)
            .await
            .map_err(|source| SyncError::Get {
                kind: "Pod".to_owned(),
                name: format!(
                    "pods of {}",
                    deployment.metadata.name.as_deref().unwrap_or("")
                ),
                source,
            })?
    } else {
        None
    };
    if let Some(mark) = stranded.as_deref().or(last.as_deref()) {
        stateless::moved_off(deployment, mark);
    }
    Ok(stranded.filter(|mark| Some(mark) != last.as_ref()))
}

/// Lists the cordoned nodes into `cordoned` every [`PERIOD`] until `shutdown`, sending on
/// each of `changed` whenever the set changes.
pub async fn watch(
    client: Client,
    cordoned: Cordoned,
    changed: Vec<UnboundedSender<()>>,
    shutdown: Shutdown,
) {
    let nodes: Api<Node> = Api::all(client);
    let params = ListParams::default().fields("spec.unschedulable=true");
    let mut told_forbidden = false;
    while !shutdown.is_triggered() {
        let pause = match nodes.list_metadata(&params).await {
            Ok(list) => {
                let names = list
                    .items
                    .into_iter()
                    .filter_map(|n| n.metadata.name)
                    .collect();
                if cordoned.replace(names) {
                    tracing::info!(nodes = ?cordoned.0.read().unwrap_or_else(PoisonError::into_inner), "cordoned nodes changed");
                    for subscriber in &changed {
                        let _ = subscriber.unbounded_send(());
                    }
                }
                told_forbidden = false;
                PERIOD
            }
            Err(kube::Error::Api(status)) if status.code == 403 => {
                if !told_forbidden {
                    tracing::warn!(message = %status.message, "cannot list nodes: primaries are not moved off nodes being drained (grant `list` on nodes to move them)");
                    told_forbidden = true;
                }
                FORBIDDEN_PERIOD
            }
            Err(error) => {
                tracing::info!(error = %ErrorChain(&error), "cannot list the cordoned nodes now");
                PERIOD
            }
        };
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = shutdown.wait() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_set_is_a_change_and_the_same_set_is_not() {
        let cordoned = Cordoned::default();
        assert!(!cordoned.contains("a"));
        assert!(cordoned.replace(BTreeSet::from(["a".to_owned()])));
        assert!(cordoned.contains("a"));
        assert!(!cordoned.replace(BTreeSet::from(["a".to_owned()])));
        assert!(cordoned.replace(BTreeSet::new()));
        assert!(!cordoned.contains("a"));
    }
}
