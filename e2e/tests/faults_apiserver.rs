//! The API server restarts under a running stack: the handlers keep running (same processes),
//! their watches recover on their own, and a spec change made after the restart reaches every
//! handler (a new cell: its Cell, its workloads, its topology record).
//!
//! A test binary of its own: restarting the API server disturbs every client of the control
//! plane, and each test binary has its own control plane, so no other test sees the outage.
//!
//! Durations printed here are observations for `docs/reliability.md`, never assertions.

use std::time::{Duration, Instant};

use etcd_client::Client as Etcd;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use multigres_api::v1alpha1::{Cell, MultigresCluster, Phase};
use multigres_e2e::etcd::{EtcdConfig, EtcdProcess};
use multigres_e2e::harness::{
    Stack, WAIT, admin, apply_yaml, control_plane, eventually, fresh_namespace, repo_path,
};
use multigres_e2e::poolers::StandInPoolers;
use multigres_proto::topo::Cell as CellRecord;
use prost::Message;
use serde_json::json;

const DATA_HANDLER_FLAGS: [&str; 5] = [
    "--topo-check-period=1s",
    "--topo-retry-max=2s",
    "--topo-connect-timeout=1s",
    "--topo-request-timeout=2s",
    "--roles-poll-period=1s",
];
const SAMPLE: &str = "external-topo";
const ROOT: &str = "/multigres/external-topo";

/// Waits until the cluster is Healthy at its current generation with `cells` cells and
/// registered in the topology (its shards' primary comes from the test's
/// [`StandInPoolers`]).
async fn wait_converged(clusters: &Api<MultigresCluster>, cells: usize) {
    eventually("the cluster converges", 3 * WAIT, || async {
        let c = clusters.get(SAMPLE).await.map_err(|e| e.to_string())?;
        let status = c.status.clone().unwrap_or_default();
        let registered = status
            .conditions
            .iter()
            .any(|c| c.type_ == "TopologyRegistered" && c.status == "True");
        if status.observed_generation == c.metadata.generation
            && status.phase == Some(Phase::Healthy)
            && status.cells.len() == cells
            && registered
        {
            Ok(())
        } else {
            Err(format!("{:?} {:?}", status.phase, status.conditions))
        }
    })
    .await;
}

#[tokio::test]
async fn after_an_api_server_restart_the_same_handlers_still_follow_spec_changes() {
    let plane = control_plane().await;
    let namespace = fresh_namespace(plane, "apiserver").await;
    let etcd = EtcdProcess::start(EtcdConfig::default())
        .await
        .expect("topology etcd");
    let stack = Stack::start(plane, &namespace, Some(&DATA_HANDLER_FLAGS[..])).await;
    let client = admin(plane);
    // No multipooler runs on fake nodes: this one's records give the shards their primary.
    let _poolers = StandInPoolers::start(client.clone(), &namespace);
    let clusters: Api<MultigresCluster> = Api::namespaced(client.clone(), &namespace);
    let sample = std::fs::read_to_string(repo_path(&format!("deploy/samples/{SAMPLE}.yaml")))
        .expect("sample")
        .replace("http://topo-etcd:2379", &etcd.client_url());
    apply_yaml(plane, &namespace, &sample).await;
    wait_converged(&clusters, 2).await;
    for handler in stack.handlers() {
        handler.settled(Duration::from_secs(3)).await;
    }
    let pids: Vec<u32> = stack.handlers().iter().map(|h| h.pid()).collect();

    let began = Instant::now();
    plane
        .restart_apiserver(Duration::from_secs(5))
        .await
        .expect("restarting kube-apiserver");
    let restarted = began.elapsed();

    // A change the user makes after the restart: a third cell.
    let changed = Instant::now();
    let patch = json!({
        "apiVersion": "multigres.com/v1alpha1", "kind": "MultigresCluster",
        "spec": {"cells": [
            {"name": "zone-a", "zone": "zone-a"},
            {"name": "zone-b", "zone": "zone-b"},
            {"name": "zone-c", "zone": "zone-c"},
        ]},
    });
    clusters
        .patch(
            SAMPLE,
            &PatchParams::apply("e2e-user"),
            &Patch::Apply(&patch),
        )
        .await
        .expect("adding a cell");
    let cells: Api<Cell> = Api::namespaced(client.clone(), &namespace);
    eventually("the cluster-handler creates the Cell", WAIT, || async {
        cells
            .get_opt(&format!("{SAMPLE}-zone-c"))
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "absent".to_owned())
    })
    .await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &namespace);
    eventually("the resource-handler runs its gateway", WAIT, || async {
        let names: Vec<String> = deployments
            .list(&ListParams::default().labels("multigres.com/cell=zone-c"))
            .await
            .map_err(|e| e.to_string())?
            .items
            .iter()
            .map(|d| d.name_any())
            .collect();
        if names.is_empty() {
            Err("no Deployment of zone-c".to_owned())
        } else {
            Ok(names)
        }
    })
    .await;
    let topo = Etcd::connect([etcd.client_url()], None)
        .await
        .expect("etcd client");
    let record = eventually("the data-handler registers the cell", WAIT, || {
        let mut topo = topo.clone();
        async move {
            let got = topo
                .get(format!("{ROOT}/cells/zone-c/Cell"), None)
                .await
                .map_err(|e| e.to_string())?;
            let kv = got.kvs().first().ok_or("no record")?;
            CellRecord::decode(kv.value()).map_err(|e| e.to_string())
        }
    })
    .await;
    assert_eq!(record.name, "zone-c");
    assert_eq!(record.server_addresses, [etcd.client_addr()]);
    wait_converged(&clusters, 3).await;
    let propagated = changed.elapsed();

    let after: Vec<u32> = stack.handlers().iter().map(|h| h.pid()).collect();
    assert_eq!(after, pids, "the same handler processes");
    for handler in stack.handlers() {
        assert!(handler.exit_status().is_none(), "{} exited", handler.name());
        assert!(!handler.log().contains("panicked"), "{}", handler.log());
        handler.settled(Duration::from_secs(3)).await;
    }
    println!(
        "kube-apiserver down 5s and ready again {:.1}s after the stop; a new cell applied \
         after the restart converged in {:.1}s (Cell, workloads, topology record) with the \
         same handler processes",
        restarted.as_secs_f64(),
        propagated.as_secs_f64()
    );
}
