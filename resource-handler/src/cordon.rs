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
//! No event tells a Shard about the node of its pods, so the cordoned nodes are watched, through
//! a field selector on `spec.unschedulable` (on a cluster with no drain under way the watch
//! holds nothing), and every Shard and Cell is reconciled when the set changes. Without the
//! right to watch nodes (a namespaced installation) this logs once and tries again rarely:
//! primaries are then not moved before a drain, and their PodDisruptionBudget makes the drain
//! wait.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use futures::StreamExt;
use futures::channel::mpsc::UnboundedSender;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::reflector::Store;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};
use multigres_common::shutdown::Shutdown;
use multigres_common::telemetry::ErrorChain;

use crate::stateless;

/// How soon a failed watch of the nodes is started again.
const RETRY: Duration = Duration::from_secs(10);
/// How soon it is started again while the handler may not watch nodes.
const FORBIDDEN_RETRY: Duration = Duration::from_secs(300);

/// The names of the cordoned nodes, as last listed.
#[derive(Clone, Debug, Default)]
pub struct Cordoned(Arc<RwLock<BTreeSet<String>>>);

impl Cordoned {
    /// The cordoned nodes as last listed. A reconcile reads them once and decides everything
    /// from that copy: read twice, a cordon arriving between the reads (a reconcile awaits
    /// several writes) had the primary's node seen as schedulable and multiorch's as cordoned,
    /// so multiorch moved before the primary handed over (found by the kwok drain test).
    pub fn snapshot(&self) -> BTreeSet<String> {
        self.0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Replaces the set; whether it changed.
    fn replace(&self, names: BTreeSet<String>) -> bool {
        let mut set = self.0.write().unwrap_or_else(PoisonError::into_inner);
        let changed = *set != names;
        *set = names;
        changed
    }
}

/// The first pod of `pods` that `selector` picks in `namespace` and runs on a cordoned node
/// (and is not leaving), as `<node>/<pod>`.
pub fn stranded_on(
    pods: &Store<Pod>,
    namespace: &str,
    selector: &BTreeMap<String, String>,
    cordoned: &BTreeSet<String>,
) -> Option<String> {
    if cordoned.is_empty() {
        return None;
    }
    crate::controller::selected(pods, namespace, selector)
        .iter()
        .filter(|pod| pod.metadata.deletion_timestamp.is_none())
        .find_map(|pod| {
            let node = pod.spec.as_ref()?.node_name.as_ref()?;
            cordoned
                .contains(node)
                .then(|| format!("{node}/{}", pod.name_any()))
        })
}

/// Moves `deployment`'s only pod (one of `pods`) off a cordoned node (when `may_move`), and
/// keeps the mark of an earlier move (see [`stateless::moved_off`]). The mark names the pod as
/// well as the node, so a later pod on the same node, cordoned again, is moved too. Returns the
/// `<node>/<pod>` that starts moving now, for an event.
pub fn move_single_pod(
    pods: &Store<Pod>,
    cordoned: &BTreeSet<String>,
    deployment: &mut Deployment,
    observed: Option<&Deployment>,
    may_move: bool,
) -> Option<String> {
    let last = stateless::last_moved_off(observed).map(str::to_owned);
    let spec = deployment.spec.as_ref();
    let single = spec.and_then(|s| s.replicas) == Some(1);
    let selector = spec
        .and_then(|s| s.selector.match_labels.clone())
        .unwrap_or_default();
    let namespace = deployment.metadata.namespace.clone().unwrap_or_default();
    let stranded = if single && may_move {
        stranded_on(pods, &namespace, &selector, cordoned)
    } else {
        None
    };
    if let Some(mark) = stranded.as_deref().or(last.as_deref()) {
        stateless::moved_off(deployment, mark);
    }
    stranded.filter(|mark| Some(mark) != last.as_ref())
}

/// Watches the cordoned nodes into `cordoned` until `shutdown`, sending on each of `changed`
/// whenever the set changes.
pub async fn watch(
    client: Client,
    cordoned: Cordoned,
    changed: Vec<UnboundedSender<()>>,
    shutdown: Shutdown,
) {
    let nodes: Api<Node> = Api::all(client);
    let config = watcher::Config::default().fields("spec.unschedulable=true");
    let mut events = std::pin::pin!(multigres_common::watch::watcher(nodes, config));
    let mut nodes = Nodes::default();
    let mut told_forbidden = false;
    loop {
        let event = tokio::select! {
            event = events.next() => event,
            () = shutdown.wait() => return,
        };
        let pause = match event {
            None => return,
            Some(Ok(event)) => {
                told_forbidden = false;
                if let Some(names) = nodes.apply(event)
                    && cordoned.replace(names)
                {
                    tracing::info!(nodes = ?cordoned.0.read().unwrap_or_else(PoisonError::into_inner), "cordoned nodes changed");
                    for subscriber in &changed {
                        let _ = subscriber.unbounded_send(());
                    }
                }
                continue;
            }
            Some(Err(
                watcher::Error::InitialListFailed(kube::Error::Api(status))
                | watcher::Error::WatchStartFailed(kube::Error::Api(status)),
            )) if status.code == 403 => {
                if !told_forbidden {
                    tracing::warn!(message = %status.message, "cannot watch nodes: primaries are not moved off nodes being drained (grant `list` and `watch` on nodes to move them)");
                    told_forbidden = true;
                }
                FORBIDDEN_RETRY
            }
            Some(Err(error)) => {
                tracing::info!(error = %ErrorChain(&error), "cannot watch the cordoned nodes now");
                RETRY
            }
        };
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = shutdown.wait() => return,
        }
    }
}

/// The cordoned nodes as a watch reports them: a list (`Init` .. `InitDone`) replaces the set
/// whole; a node that is no longer cordoned leaves the field selector, which the API server
/// reports as its deletion.
#[derive(Debug, Default)]
struct Nodes {
    current: BTreeSet<String>,
    listing: BTreeSet<String>,
}

impl Nodes {
    /// The set after `event`, when it may have changed.
    fn apply(&mut self, event: Event<Node>) -> Option<BTreeSet<String>> {
        let cordoned = |node: &Node| node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
        match event {
            Event::Init => {
                self.listing.clear();
                return None;
            }
            Event::InitApply(node) => {
                if cordoned(&node) {
                    self.listing.insert(node.name_any());
                }
                return None;
            }
            Event::InitDone => self.current = std::mem::take(&mut self.listing),
            Event::Apply(node) if cordoned(&node) => {
                self.current.insert(node.name_any());
            }
            Event::Apply(node) | Event::Delete(node) => {
                self.current.remove(&node.name_any());
            }
        }
        Some(self.current.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_set_is_a_change_and_the_same_set_is_not() {
        let cordoned = Cordoned::default();
        assert!(cordoned.snapshot().is_empty());
        assert!(cordoned.replace(BTreeSet::from(["a".to_owned()])));
        assert_eq!(cordoned.snapshot(), BTreeSet::from(["a".to_owned()]));
        assert!(!cordoned.replace(BTreeSet::from(["a".to_owned()])));
        assert!(cordoned.replace(BTreeSet::new()));
        assert!(cordoned.snapshot().is_empty());
    }

    fn node(name: &str, unschedulable: Option<bool>) -> Node {
        Node {
            metadata: kube::api::ObjectMeta {
                name: Some(name.to_owned()),
                ..Default::default()
            },
            spec: Some(k8s_openapi::api::core::v1::NodeSpec {
                unschedulable,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_list_replaces_the_set_and_an_uncordoned_node_leaves_it() {
        let set = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<BTreeSet<_>>();
        let mut nodes = Nodes::default();
        assert_eq!(
            nodes.apply(Event::Apply(node("a", Some(true)))),
            Some(set(&["a"]))
        );
        assert_eq!(nodes.apply(Event::Init), None);
        assert_eq!(nodes.apply(Event::InitApply(node("b", Some(true)))), None);
        assert_eq!(
            nodes.apply(Event::InitDone),
            Some(set(&["b"])),
            "the list replaces a"
        );
        assert_eq!(
            nodes.apply(Event::Apply(node("c", Some(true)))),
            Some(set(&["b", "c"]))
        );
        assert_eq!(
            nodes.apply(Event::Apply(node("b", None))),
            Some(set(&["c"]))
        );
        assert_eq!(
            nodes.apply(Event::Delete(node("c", Some(true)))),
            Some(set(&[]))
        );
    }
}
