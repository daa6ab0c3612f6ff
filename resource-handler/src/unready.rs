//! Why a pod is not Ready, in a few words a user can act on: the scheduler's verdict, or the
//! reason a container waits (an image that cannot be pulled, a crash loop, a missing Secret).
//! Status messages name the pods that hold a workload back with this, so `kubectl get` says
//! what is wrong without a trip through `kubectl describe pod`.

use k8s_openapi::api::core::v1::{ContainerStatus, Pod, PodStatus};

/// Longest detail quoted from the API (a scheduler message lists every node's verdict).
const MAX_DETAIL: usize = 200;

/// Waiting reasons that only say a container is on its way.
const ON_ITS_WAY: [&str; 2] = ["ContainerCreating", "PodInitializing"];

/// Why `pod` is not Ready (`None` when it is).
pub fn reason(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref();
    let condition = |type_: &str| {
        status
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == type_))
    };
    if condition("Ready").is_some_and(|c| c.status == "True") {
        return None;
    }
    if pod.metadata.deletion_timestamp.is_some() {
        return Some("terminating".to_owned());
    }
    if let Some(c) = condition("PodScheduled").filter(|c| c.status == "False") {
        let detail = c.message.as_deref().or(c.reason.as_deref()).unwrap_or("");
        return Some(format!("unschedulable: {}", shorten(detail)));
    }
    if let Some(waiting) = status.and_then(waiting_container) {
        return Some(waiting);
    }
    if let Some(node) = node_not_reporting(pod) {
        return Some(format!(
            "its node {node} stopped reporting (NotReady: down, or cut off from the API server)"
        ));
    }
    let unready = condition("ContainersReady")
        .filter(|c| c.status == "False")
        .and_then(|c| c.message.as_deref());
    Some(match unready {
        Some(message) => shorten(message),
        None => "not Ready yet".to_owned(),
    })
}

/// The node of `pod` when that node stopped reporting: only the kubelet sets ContainersReady,
/// and the node lifecycle controller sets Ready alone to False on every pod of a node whose
/// kubelet went silent (the node is NotReady). A Ready pod's node is reporting.
pub fn node_not_reporting(pod: &Pod) -> Option<&str> {
    let conditions = pod.status.as_ref()?.conditions.as_ref()?;
    let status_of = |type_: &str| {
        conditions
            .iter()
            .find(|c| c.type_ == type_)
            .map(|c| c.status.as_str())
    };
    let silent = status_of("Ready") == Some("False")
        && status_of("ContainersReady") == Some("True")
        && pod.metadata.deletion_timestamp.is_none();
    silent.then(|| pod.spec.as_ref()?.node_name.as_deref())?
}

/// The nodes that stopped reporting (see [`node_not_reporting`]) of the pods of `pods` that
/// `selector` picks in `namespace`.
pub fn silent_nodes(
    pods: &kube::runtime::reflector::Store<Pod>,
    namespace: &str,
    selector: &std::collections::BTreeMap<String, String>,
) -> std::collections::BTreeSet<String> {
    crate::controller::selected(pods, namespace, selector)
        .iter()
        .filter_map(|pod| node_not_reporting(pod).map(str::to_owned))
        .collect()
}

/// Keeps of `status` what [`reason`] reads: the conditions, and the containers that wait for
/// something other than their own start (so a healthy pod keeps no container status at all).
pub fn slim_status(status: &mut PodStatus) {
    let keep = |statuses: Option<Vec<ContainerStatus>>| {
        let kept: Vec<ContainerStatus> = statuses
            .into_iter()
            .flatten()
            .filter(|s| stuck_reason(s).is_some())
            .map(|s| ContainerStatus {
                name: s.name,
                state: s.state,
                ..ContainerStatus::default()
            })
            .collect();
        (!kept.is_empty()).then_some(kept)
    };
    *status = PodStatus {
        conditions: status.conditions.take(),
        init_container_statuses: keep(status.init_container_statuses.take()),
        container_statuses: keep(status.container_statuses.take()),
        ..PodStatus::default()
    };
}

/// The first container (init containers first) waiting for something other than its start.
fn waiting_container(status: &PodStatus) -> Option<String> {
    let init = status.init_container_statuses.iter().flatten();
    let main = status.container_statuses.iter().flatten();
    init.chain(main).find_map(|s| {
        let (reason, message) = stuck_reason(s)?;
        Some(match message {
            Some(message) => format!("container {}: {reason}: {}", s.name, shorten(message)),
            None => format!("container {}: {reason}", s.name),
        })
    })
}

fn stuck_reason(status: &ContainerStatus) -> Option<(&str, Option<&str>)> {
    let waiting = status.state.as_ref()?.waiting.as_ref()?;
    let reason = waiting.reason.as_deref()?;
    (!ON_ITS_WAY.contains(&reason)).then_some((reason, waiting.message.as_deref()))
}

fn shorten(text: &str) -> String {
    let text = text.trim();
    match text.char_indices().nth(MAX_DETAIL) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(yaml: &str) -> Pod {
        serde_yaml::from_str(yaml).unwrap()
    }

    #[test]
    fn a_pod_whose_node_stopped_reporting_says_so() {
        let p = pod(r#"
metadata: {name: p}
spec: {nodeName: node-zone-b, containers: []}
status:
  conditions:
  - {type: ContainersReady, status: "True"}
  - {type: Ready, status: "False"}
"#);
        assert_eq!(
            reason(&p).as_deref(),
            Some(
                "its node node-zone-b stopped reporting (NotReady: down, or cut off from the \
                 API server)"
            )
        );
    }

    #[test]
    fn a_ready_pod_has_no_reason() {
        let p =
            pod("metadata: {name: p}\nstatus:\n  conditions: [{type: Ready, status: 'True'}]\n");
        assert_eq!(reason(&p), None);
    }

    #[test]
    fn the_schedulers_verdict_comes_first() {
        let p = pod(r#"
metadata: {name: p}
status:
  phase: Pending
  conditions:
  - {type: PodScheduled, status: "False", reason: Unschedulable,
     message: "0/3 nodes are available: pod has unbound immediate PersistentVolumeClaims."}
"#);
        assert_eq!(
            reason(&p).as_deref(),
            Some(
                "unschedulable: 0/3 nodes are available: pod has unbound immediate \
                 PersistentVolumeClaims."
            )
        );
    }

    #[test]
    fn a_waiting_container_is_named_with_its_reason_and_a_starting_one_is_not() {
        let p = pod(r#"
metadata: {name: p}
status:
  conditions:
  - {type: PodScheduled, status: "True"}
  - {type: Ready, status: "False", reason: ContainersNotReady}
  - {type: ContainersReady, status: "False", message: "containers with unready status: [postgres multipooler]"}
  containerStatuses:
  - {name: multipooler, image: m, imageID: "", ready: false, restartCount: 0,
     state: {waiting: {reason: ContainerCreating}}}
  - {name: postgres, image: p, imageID: "", ready: false, restartCount: 4,
     state: {waiting: {reason: CrashLoopBackOff, message: "back-off 1m20s restarting failed container=postgres"}}}
"#);
        assert_eq!(
            reason(&p).as_deref(),
            Some(
                "container postgres: CrashLoopBackOff: back-off 1m20s restarting failed \
                 container=postgres"
            )
        );
        let mut slim = p.clone();
        slim_status(slim.status.as_mut().unwrap());
        assert_eq!(reason(&slim), reason(&p), "the slimmed pod reads the same");
        let kept = slim.status.unwrap().container_statuses.unwrap();
        assert_eq!(kept.len(), 1, "only the stuck container is kept");
        assert_eq!(
            (kept[0].name.as_str(), kept[0].image.as_str()),
            ("postgres", "")
        );
    }

    #[test]
    fn otherwise_the_unready_containers_are_named() {
        let p = pod(r#"
metadata: {name: p}
status:
  conditions:
  - {type: PodScheduled, status: "True"}
  - {type: ContainersReady, status: "False", message: "containers with unready status: [postgres]"}
"#);
        assert_eq!(
            reason(&p).as_deref(),
            Some("containers with unready status: [postgres]")
        );
        let bare = pod("metadata: {name: p}\n");
        assert_eq!(reason(&bare).as_deref(), Some("not Ready yet"));
        let leaving = pod("metadata: {name: p, deletionTimestamp: '2026-01-01T00:00:00Z'}\n");
        assert_eq!(reason(&leaving).as_deref(), Some("terminating"));
    }

    #[test]
    fn long_details_are_cut() {
        let long = "x".repeat(500);
        assert_eq!(shorten(&long).chars().count(), MAX_DETAIL + 1);
        assert!(shorten(&long).ends_with('…'));
        assert_eq!(shorten(" short "), "short");
    }
}
