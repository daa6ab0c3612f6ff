//! Stopping a control plane with real nodes leaves nothing behind: no process, no mount under its
//! directory, no network interface but loopback, no cgroup. Its own test process, so no other
//! cluster's pieces are around to confuse the count.

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;
use multigres_e2e::cluster::{ClusterOptions, LocalCluster};
use multigres_e2e::harness::eventually;
use multigres_e2e::nodes;

/// Names of the interfaces in this network namespace (`/proc/self/net/dev` follows the reader's
/// namespace; `/sys/class/net` would show the host's, since the sandbox keeps its sysfs).
fn interfaces() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_to_string("/proc/self/net/dev")
        .unwrap()
        .lines()
        .skip(2)
        .filter_map(|line| line.split_once(':').map(|(name, _)| name.trim().to_owned()))
        .collect();
    names.sort();
    names
}

/// Cgroup directories this process's nodes created (`nodes::cgroup_prefix` and the node's index).
fn our_cgroups() -> Vec<String> {
    let prefix = nodes::cgroup_prefix();
    let mut found = Vec::new();
    for hierarchy in std::fs::read_dir("/sys/fs/cgroup").unwrap().flatten() {
        if let Ok(entries) = std::fs::read_dir(hierarchy.path()) {
            for entry in entries.flatten() {
                if entry.file_name().to_string_lossy().starts_with(&prefix) {
                    found.push(entry.path().display().to_string());
                }
            }
        }
    }
    found
}

/// Processes other than this one that belong to the cluster: anything whose command line names
/// its directory (control plane, containerd, kubelets, shims), and the containers' own.
fn cluster_processes(dir: &Path) -> Vec<String> {
    let mut found: Vec<String> = nodes::processes_mentioning(&dir.to_string_lossy())
        .into_iter()
        .map(|pid| format!("{pid}"))
        .collect();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
        let comm = comm.trim();
        if ["pause", "coredns", "kubelet", "containerd", "kube-proxy"].contains(&comm)
            || comm.starts_with("containerd-shim")
        {
            found.push(format!("{} ({comm})", entry.file_name().to_string_lossy()));
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_real_nodes_leaves_no_process_mount_interface_or_cgroup() {
    let state = tempfile::Builder::new()
        .prefix("multigres-teardown-")
        .tempdir()
        .unwrap();
    let dir = state.path().to_path_buf();
    let before = interfaces();
    let cluster = LocalCluster::start(ClusterOptions {
        state_dir: Some(dir.clone()),
        zones: vec!["zone-a".to_owned()],
        real_nodes: true,
        ..ClusterOptions::default()
    })
    .await
    .unwrap_or_else(|e| panic!("starting one real node: {e}"));
    println!("started in {:?}", cluster.startup_time());

    // Something really runs: CoreDNS is a Ready pod with a pod IP, in containers of the node.
    let client = cluster.client().unwrap();
    let pods: Api<Pod> = Api::namespaced(client, "kube-system");
    let dns = pods
        .list(&ListParams::default().labels("k8s-app=kube-dns"))
        .await
        .unwrap()
        .items;
    assert!(dns.iter().any(|p| {
        p.status
            .as_ref()
            .and_then(|s| s.pod_ip.as_deref())
            .is_some_and(|ip| ip.starts_with("10.244."))
    }));
    assert!(
        !cluster_processes(&dir).is_empty(),
        "the cluster runs processes"
    );
    assert!(
        !nodes::mounts_under(&dir).is_empty(),
        "the node mounted volumes and rootfs"
    );
    assert!(
        interfaces().len() > before.len(),
        "the node added a bridge and veths"
    );
    assert!(!our_cgroups().is_empty(), "the node has a cgroup root");

    let began = std::time::Instant::now();
    cluster.stop();
    println!("stopped in {:?}", began.elapsed());
    eventually("nothing of the cluster is left", Duration::from_secs(30), || async {
        let left = (
            cluster_processes(&dir),
            nodes::mounts_under(&dir),
            interfaces(),
            our_cgroups(),
        );
        if left.0.is_empty() && left.1.is_empty() && left.2 == before && left.3.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "processes {:?}, mounts {:?}, interfaces {:?} (before {before:?}), cgroups {:?}",
                left.0, left.1, left.2, left.3
            ))
        }
    })
    .await;
}
