//! Faults against the real control plane, each in its own namespace with its own handlers:
//! - each controller handler killed with SIGKILL mid-convergence and started again: the result
//!   is exactly what an undisturbed run produces (same children and workloads, same owners, no
//!   orphan), the topology records are in etcd, and the settled stack writes nothing;
//! - the topology etcd stopped for a minute: the conditions say so, no handler exits, and
//!   registration completes soon after etcd is back;
//! - the webhook-server down with the shipped registrations (`failurePolicy: Fail`): the user's
//!   writes of clusters are refused with the API server's message, the handlers keep
//!   reconciling what the webhook does not intercept, and everything works again once it is
//!   back;
//! - 1000 seeded random and malformed clusters through the API server with strict field
//!   validation: each is refused with a message naming a field, or accepted and observed by the
//!   cluster-handler; no handler panics or exits.
//!
//! The API server restart is in `faults_apiserver.rs`: it disturbs every client of the control
//! plane, so it gets a control plane of its own rather than racing these tests.
//!
//! Durations printed here are observations for `docs/reliability.md`, never assertions.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use etcd_client::{Client as Etcd, GetOptions};
use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
};
use kube::{Api, Client, ResourceExt};
use multigres_api::v1alpha1::{MultigresCluster, Phase};
use multigres_e2e::cluster::LocalCluster;
use multigres_e2e::etcd::{EtcdConfig, EtcdProcess};
use multigres_e2e::harness::{
    self, Stack, WAIT, WebhookServer, admin, apply_yaml, control_plane, eventually,
    fresh_namespace, grant_webhook_rbac, only_namespace, repo_path, webhook_registrations,
};
use multigres_e2e::manifest::{self, Mode};
use multigres_e2e::poolers::StandInPoolers;
use multigres_proto::topo::{Cell as CellRecord, Database};
use prost::Message;
use serde_json::{Value, json};

/// The data-handler's topology timings, shortened so outages are noticed within seconds.
const DATA_HANDLER_FLAGS: [&str; 5] = [
    "--topo-check-period=1s",
    "--topo-retry-max=2s",
    "--topo-connect-timeout=1s",
    "--topo-request-timeout=2s",
    "--roles-poll-period=1s",
];
/// The sample every fault runs: two cells, an external topology (the test's etcd).
const SAMPLE: &str = "external-topo";
/// The sample's root path in the topology.
const ROOT: &str = "/multigres/external-topo";
/// How long write counters must hold still before a handler counts as settled.
const QUIET: Duration = Duration::from_secs(5);

/// `deploy/samples/external-topo.yaml` pointed at `etcd`.
fn sample(etcd: &EtcdProcess) -> String {
    let text = std::fs::read_to_string(repo_path(&format!("deploy/samples/{SAMPLE}.yaml")))
        .expect("reading the sample");
    assert!(
        text.contains("http://topo-etcd:2379"),
        "the sample's endpoint moved"
    );
    text.replace("http://topo-etcd:2379", &etcd.client_url())
}

fn condition<'a>(cluster: &'a MultigresCluster, type_: &str) -> Option<&'a Condition> {
    cluster
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
}

/// `(status, reason)` of condition `type_`, empty when absent.
fn state(cluster: &MultigresCluster, type_: &str) -> (String, String) {
    condition(cluster, type_)
        .map(|c| (c.status.clone(), c.reason.clone()))
        .unwrap_or_default()
}

fn pair(status: &str, reason: &str) -> (String, String) {
    (status.to_owned(), reason.to_owned())
}

/// Waits until the cluster is Healthy (Available) at its current generation and, when
/// `topology` is set (a data-handler runs), registered in the topology. Without a data-handler
/// the pods' roles are published here in its place ([`harness::elect_primaries`]); with one,
/// it derives them from the records of the test's [`StandInPoolers`].
async fn wait_converged(
    clusters: &Api<MultigresCluster>,
    name: &str,
    topology: bool,
) -> MultigresCluster {
    eventually(&format!("{name} converges"), 3 * WAIT, || async {
        if !topology {
            let client = clusters.clone().into_client();
            let namespace = clusters.namespace().unwrap_or_default();
            harness::elect_primaries(&client, namespace).await?;
        }
        let c = clusters.get(name).await.map_err(|e| e.to_string())?;
        let status = c.status.clone().unwrap_or_default();
        let observed = status.observed_generation == c.metadata.generation;
        let healthy = status.phase == Some(Phase::Healthy)
            && state(&c, "Available") == pair("True", "AllCellsAndShardsReady");
        let registered = !topology || state(&c, "TopologyRegistered").0 == "True";
        if observed && healthy && registered {
            Ok(c)
        } else {
            Err(format!(
                "generation {:?}, {:?} {:?}",
                c.metadata.generation, status.phase, status.conditions
            ))
        }
    })
    .await
}

/// Every kind the handlers create for a cluster, without Pods (the workload controllers' own).
fn inventory_kinds() -> Vec<ApiResource> {
    harness::cluster_object_kinds()
        .into_iter()
        .filter(|k| k.kind != "Pod")
        .collect()
}

/// `Kind/name` → its owners as `Kind/name`, of everything labelled as part of cluster `name`.
/// An owner reference whose UID is not the live object of that kind and name shows as
/// `ORPHANED ...`; an object being deleted is marked, so a converged inventory has neither.
async fn inventory(client: &Client, namespace: &str, name: &str) -> BTreeMap<String, Vec<String>> {
    let selector = ListParams::default().labels(&format!("multigres.com/cluster={name}"));
    let mut objects = Vec::new();
    for resource in inventory_kinds() {
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource);
        for object in api.list(&selector).await.expect("listing").items {
            objects.push((resource.kind.clone(), object));
        }
    }
    let clusters: Api<MultigresCluster> = Api::namespaced(client.clone(), namespace);
    let mut live: BTreeMap<String, String> = BTreeMap::new();
    if let Some(c) = clusters.get_opt(name).await.expect("reading the cluster") {
        live.insert(
            c.uid().unwrap_or_default(),
            format!("MultigresCluster/{name}"),
        );
    }
    for (kind, object) in &objects {
        live.insert(
            object.uid().unwrap_or_default(),
            format!("{kind}/{}", object.name_any()),
        );
    }
    objects
        .iter()
        .map(|(kind, object)| {
            let mut key = format!("{kind}/{}", object.name_any());
            if object.metadata.deletion_timestamp.is_some() {
                key.push_str(" (being deleted)");
            }
            let owners = object
                .owner_references()
                .iter()
                .map(|o| {
                    let owner = format!("{}/{}", o.kind, o.name);
                    if live.get(&o.uid) == Some(&owner) {
                        owner
                    } else {
                        format!("ORPHANED by {owner} {}", o.uid)
                    }
                })
                .collect();
            (key, owners)
        })
        .collect()
}

/// The topology records of the sample, read back from etcd and decoded.
async fn topology_records(etcd: &EtcdProcess) -> Result<(Vec<CellRecord>, Database), String> {
    let mut client = Etcd::connect([etcd.client_url()], None)
        .await
        .map_err(|e| e.to_string())?;
    let mut cells = Vec::new();
    for cell in ["zone-a", "zone-b"] {
        let got = client
            .get(format!("{ROOT}/cells/{cell}/Cell"), None)
            .await
            .map_err(|e| e.to_string())?;
        let kv = got.kvs().first().ok_or(format!("no Cell record {cell}"))?;
        cells.push(CellRecord::decode(kv.value()).map_err(|e| e.to_string())?);
    }
    let got = client
        .get(format!("{ROOT}/databases/postgres/Database"), None)
        .await
        .map_err(|e| e.to_string())?;
    let kv = got.kvs().first().ok_or("no Database record")?;
    let database = Database::decode(kv.value()).map_err(|e| e.to_string())?;
    Ok((cells, database))
}

/// Every key under the sample's root and the store's revision (unchanged: nothing written).
async fn topology_keys(etcd: &EtcdProcess) -> (Vec<String>, i64) {
    let mut client = Etcd::connect([etcd.client_url()], None)
        .await
        .expect("etcd client");
    let got = client
        .get(ROOT, Some(GetOptions::new().with_prefix().with_keys_only()))
        .await
        .expect("listing topology keys");
    let keys = got
        .kvs()
        .iter()
        .map(|kv| kv.key_str().unwrap_or_default().to_owned())
        .collect();
    (keys, got.header().expect("header").revision())
}

/// Asserts the records say what the sample says: both cells at the test's etcd, one database
/// spanning them.
async fn assert_records(etcd: &EtcdProcess) {
    let (cells, database) = eventually("the topology records", WAIT, || async {
        topology_records(etcd).await
    })
    .await;
    for (record, cell) in cells.iter().zip(["zone-a", "zone-b"]) {
        assert_eq!(record.name, cell);
        assert_eq!(record.server_addresses, [etcd.client_addr()]);
    }
    assert_eq!(database.name, "postgres");
    assert_eq!(database.cells, ["zone-a", "zone-b"]);
}

/// Asserts no handler of the stack exited or panicked.
fn assert_alive(stack: &Stack) {
    for handler in stack.handlers() {
        assert!(
            handler.exit_status().is_none(),
            "{} exited: {:?}",
            handler.name(),
            handler.exit_status()
        );
        assert!(
            !handler.log().contains("panicked"),
            "{} panicked:\n{}",
            handler.name(),
            handler.log()
        );
    }
}

/// Waits until every handler's writes hold still, then checks a further quiet period costs
/// no Kubernetes write and no etcd write.
async fn assert_idle(stack: &Stack, etcd: &EtcdProcess) {
    for handler in stack.handlers() {
        handler.settled(QUIET).await;
    }
    let before: Vec<_> = all_writes(stack).await;
    let (_, revision) = topology_keys(etcd).await;
    tokio::time::sleep(2 * QUIET).await;
    assert_eq!(all_writes(stack).await, before, "writes while idle");
    assert_eq!(
        topology_keys(etcd).await.1,
        revision,
        "etcd writes while idle"
    );
}

async fn all_writes(stack: &Stack) -> Vec<(String, BTreeMap<String, u64>)> {
    let mut out = Vec::new();
    for handler in stack.handlers() {
        out.push((handler.name().to_owned(), handler.writes().await));
    }
    out
}

/// Runs the sample with the whole stack; with a `victim`, kills that handler (SIGKILL) as soon
/// as it has written something and the cluster is not yet converged, and starts it again.
/// Returns the converged inventory after checking records, liveness and idleness, then deletes
/// the cluster.
async fn run_sample(plane: &LocalCluster, victim: Option<&str>) -> BTreeMap<String, Vec<String>> {
    let label = victim.unwrap_or("none");
    let namespace = fresh_namespace(plane, &format!("kill-{}", &label[..4])).await;
    let etcd = EtcdProcess::start(EtcdConfig::default())
        .await
        .expect("topology etcd");
    let mut stack = Stack::start(plane, &namespace, Some(&DATA_HANDLER_FLAGS[..])).await;
    let client = admin(plane);
    let _poolers = StandInPoolers::start(client.clone(), &namespace);
    let clusters: Api<MultigresCluster> = Api::namespaced(client.clone(), &namespace);
    let applied = Instant::now();
    apply_yaml(plane, &namespace, &sample(&etcd)).await;

    if let Some(victim) = victim {
        let handler = match victim {
            "cluster-handler" => &mut stack.cluster_handler,
            "resource-handler" => &mut stack.resource_handler,
            _ => stack.data_handler.as_mut().expect("data-handler"),
        };
        eventually(&format!("{victim} starts writing"), WAIT, || async {
            let writes: u64 = handler.writes().await.values().sum();
            if writes > 0 {
                Ok(())
            } else {
                Err("no write yet".to_owned())
            }
        })
        .await;
        handler.signal(libc::SIGKILL);
        let code = handler.wait_exit().await;
        let killed_at = applied.elapsed();
        assert_eq!(code, None, "{victim} ended by the signal");
        let at_kill = clusters.get(SAMPLE).await.expect("cluster");
        let phase = at_kill.status.as_ref().and_then(|s| s.phase);
        assert_ne!(phase, Some(Phase::Healthy), "killed before convergence");
        let restarted = Instant::now();
        handler.restart().await;
        wait_converged(&clusters, SAMPLE, true).await;
        println!(
            "{victim}: SIGKILL {:.1}s after apply (cluster phase {phase:?}); restarted, ready \
             and converged {:.1}s later",
            killed_at.as_secs_f64(),
            restarted.elapsed().as_secs_f64()
        );
    } else {
        wait_converged(&clusters, SAMPLE, true).await;
        println!(
            "undisturbed: converged {:.1}s after apply",
            applied.elapsed().as_secs_f64()
        );
    }
    assert_records(&etcd).await;
    assert_idle(&stack, &etcd).await;
    let found = inventory(&client, &namespace, SAMPLE).await;
    assert_alive(&stack);

    clusters
        .delete(SAMPLE, &DeleteParams::background())
        .await
        .expect("deleting the cluster");
    eventually(
        "the cluster and its topology records are gone",
        WAIT,
        || async {
            let gone = clusters
                .get_opt(SAMPLE)
                .await
                .map_err(|e| e.to_string())?
                .is_none();
            let (keys, _) = topology_keys(&etcd).await;
            if gone && keys.is_empty() {
                Ok(())
            } else {
                Err(format!("cluster gone: {gone}, keys: {keys:?}"))
            }
        },
    )
    .await;
    found
}

#[tokio::test]
async fn each_handler_killed_mid_convergence_restarts_to_exactly_the_undisturbed_result() {
    let plane = control_plane().await;
    let reference = run_sample(plane, None).await;
    let orphans: Vec<_> = reference
        .iter()
        .filter(|(k, owners)| {
            k.contains("being deleted") || owners.iter().any(|o| o.contains("ORPHANED"))
        })
        .collect();
    assert!(orphans.is_empty(), "{orphans:?}");
    for kind in [
        "Cell",
        "TableGroup",
        "Shard",
        "StatefulSet",
        "Deployment",
        "Service",
    ] {
        assert!(
            reference.keys().any(|k| k.starts_with(&format!("{kind}/"))),
            "no {kind} in {reference:#?}"
        );
    }
    println!("undisturbed inventory: {} objects", reference.len());
    for victim in ["cluster-handler", "resource-handler", "data-handler"] {
        let got = run_sample(plane, Some(victim)).await;
        assert_eq!(got, reference, "after killing {victim}");
    }
}

#[tokio::test]
async fn a_topology_etcd_outage_is_reported_and_registration_completes_after_it() {
    let plane = control_plane().await;
    let namespace = fresh_namespace(plane, "etcd-outage").await;
    let mut etcd = EtcdProcess::start(EtcdConfig::default())
        .await
        .expect("topology etcd");
    let stack = Stack::start(plane, &namespace, Some(&DATA_HANDLER_FLAGS[..])).await;
    let client = admin(plane);
    let _poolers = StandInPoolers::start(client.clone(), &namespace);
    let clusters: Api<MultigresCluster> = Api::namespaced(client.clone(), &namespace);
    apply_yaml(plane, &namespace, &sample(&etcd)).await;
    wait_converged(&clusters, SAMPLE, true).await;
    let pids: Vec<u32> = stack.handlers().iter().map(|h| h.pid()).collect();

    let outage = Duration::from_secs(60);
    etcd.stop();
    let stopped = Instant::now();
    let down = [
        pair("False", "Unreachable"),
        pair("False", "TopoServerUnreachable"),
    ];
    let reported = eventually("the conditions report the outage", WAIT, || async {
        let c = clusters.get(SAMPLE).await.map_err(|e| e.to_string())?;
        let got = [
            state(&c, "TopoServerReachable"),
            state(&c, "TopologyRegistered"),
        ];
        if got == down {
            Ok(c)
        } else {
            Err(format!("{got:?}"))
        }
    })
    .await;
    let noticed = stopped.elapsed();
    let message = &condition(&reported, "TopoServerReachable")
        .expect("condition")
        .message;
    assert!(message.contains(&etcd.client_url()), "{message}");
    // The outage lasts its full minute; the conditions keep saying so and nobody exits.
    while stopped.elapsed() < outage {
        assert_alive(&stack);
        let c = clusters.get(SAMPLE).await.expect("cluster");
        let got = [
            state(&c, "TopoServerReachable"),
            state(&c, "TopologyRegistered"),
        ];
        assert_eq!(
            got,
            down,
            "during the outage, {:.0}s after the stop: {:#?}",
            stopped.elapsed().as_secs_f64(),
            c.status.as_ref().map(|s| &s.conditions)
        );
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    let during = clusters.get(SAMPLE).await.expect("cluster");

    etcd.restart().await.expect("etcd restarts");
    let back = Instant::now();
    eventually("registered again", WAIT, || async {
        let c = clusters.get(SAMPLE).await.map_err(|e| e.to_string())?;
        let got = [
            state(&c, "TopoServerReachable"),
            state(&c, "TopologyRegistered"),
        ];
        if got == [pair("True", "Reachable"), pair("True", "Registered")] {
            Ok(())
        } else {
            Err(format!("{got:?}"))
        }
    })
    .await;
    let recovered = back.elapsed();
    assert_records(&etcd).await;
    // The Events are written after the conditions they go with: wait for them too.
    let events: Api<Event> = Api::namespaced(client.clone(), &namespace);
    eventually("the Unreachable and Recovered Events", WAIT, || async {
        let reasons: Vec<String> = events
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(SAMPLE))
            .filter_map(|e| e.reason)
            .collect();
        ["Unreachable", "Recovered"]
            .iter()
            .all(|reason| reasons.iter().any(|r| r == reason))
            .then_some(())
            .ok_or_else(|| format!("{reasons:?}"))
    })
    .await;
    wait_converged(&clusters, SAMPLE, true).await;
    assert_alive(&stack);
    let after: Vec<u32> = stack.handlers().iter().map(|h| h.pid()).collect();
    assert_eq!(after, pids, "no handler restarted");
    println!(
        "topology etcd down {:.0}s: conditions False {:.1}s after the stop (phase during the \
         outage {:?}); TopologyRegistered True {:.1}s after etcd was back",
        outage.as_secs_f64(),
        noticed.as_secs_f64(),
        during.status.and_then(|s| s.phase),
        recovered.as_secs_f64()
    );
}

/// The API server's refusal message, or a panic if it accepted.
fn refusal<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> String {
    match result {
        Err(kube::Error::Api(status)) => status.message,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn with_the_webhook_down_user_writes_are_refused_and_the_handlers_keep_reconciling() {
    let plane = control_plane().await;
    let system = fresh_namespace(plane, "wh-system").await;
    let namespace = fresh_namespace(plane, "wh-down").await;
    let client = admin(plane);
    let operators = ["cluster-handler", "resource-handler", "data-handler"]
        .map(|h| format!("{namespace}:{h}"))
        .join(",");
    let kubeconfig = grant_webhook_rbac(plane, &system, None).await;
    let mut webhook = WebhookServer::spawn(&kubeconfig, &system, &operators, None).await;
    let registrations = webhook_registrations(webhook.address, only_namespace(&namespace), None);
    for registration in &registrations {
        manifest::apply(&client, registration, None, Mode::Apply)
            .await
            .expect("registering the webhook");
    }
    let stack = Stack::start(plane, &namespace, None).await;
    let clusters: Api<MultigresCluster> = Api::namespaced(client.clone(), &namespace);
    // A cluster of one cell whose topology nobody dials (no data-handler here).
    let mut spec = json!({
        "apiVersion": "multigres.com/v1alpha1", "kind": "MultigresCluster",
        "metadata": {"name": "guarded"},
        "spec": {
            "postgresPasswordSecretRef": {"name": "pw", "key": "password"},
            "globalTopoServer": {"external": {"endpoints": ["http://127.0.0.1:1"], "rootPath": "/x"}},
            "cells": [{"name": "zone-a", "zoneId": "zone-a"}],
        },
    });
    let apply = PatchParams::apply("e2e-user").force();
    // The caBundle is written by the webhook itself; until then the API server cannot call it.
    eventually("the webhook admits the cluster", WAIT, || async {
        clusters
            .patch("guarded", &apply, &Patch::Apply(&spec))
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
    .await;
    wait_converged(&clusters, "guarded", false).await;
    for handler in stack.handlers() {
        handler.settled(QUIET).await;
    }

    webhook.process.stop();
    let stopped = Instant::now();

    // 1. The user's writes of clusters are refused, naming the webhook that could not be called.
    spec["spec"]["cells"]
        .as_array_mut()
        .expect("cells")
        .push(json!({"name": "zone-b", "zoneId": "zone-b"}));
    let message = refusal(
        clusters
            .patch("guarded", &apply, &Patch::Apply(&spec))
            .await,
    );
    assert!(
        message.contains("failed calling webhook \"mmultigrescluster.multigres.com\""),
        "{message}"
    );
    println!("webhook down, user apply refused: {message}");
    let cells: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &namespace,
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("multigres.com", "v1alpha1", "Cell"),
            "cells",
        ),
    );
    let message = refusal(
        cells
            .delete("guarded-zone-a", &DeleteParams::default())
            .await,
    );
    assert!(
        message.contains("failed calling webhook \"vcell.multigres.com\""),
        "{message}"
    );
    // Deletion of a cluster is not intercepted.
    let dry_run = DeleteParams {
        dry_run: true,
        ..DeleteParams::default()
    };
    clusters
        .delete("guarded", &dry_run)
        .await
        .expect("deleting a cluster needs no webhook");

    // 2. The handlers keep reconciling what is not intercepted: workloads and every status.
    //    A hand-scaled workload is put back by the resource-handler.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &namespace);
    let workload = deployments
        .list(&ListParams::default().labels("multigres.com/cluster=guarded"))
        .await
        .expect("deployments")
        .items
        .into_iter()
        .find(|d| d.name_any().contains("zone-a"))
        .expect("a workload of cell zone-a");
    let name = workload.name_any();
    let replicas = workload.spec.as_ref().and_then(|s| s.replicas);
    let drifted = Instant::now();
    deployments
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 5}})),
        )
        .await
        .expect("scaling a workload by hand");
    eventually("the resource-handler reverts the drift", WAIT, || async {
        let d = deployments.get(&name).await.map_err(|e| e.to_string())?;
        let now = d.spec.as_ref().and_then(|s| s.replicas);
        if now == replicas {
            Ok(())
        } else {
            Err(format!("replicas {now:?}"))
        }
    })
    .await;
    let reverted = drifted.elapsed();
    wait_converged(&clusters, "guarded", false).await;
    assert_alive(&stack);
    println!(
        "webhook down: Deployment {name} scaled by hand was put back to {replicas:?} replicas \
         {:.1}s later, the cluster Healthy; webhook stopped {:.1}s before",
        reverted.as_secs_f64(),
        (drifted - stopped).as_secs_f64()
    );

    // 3. Back: the same write succeeds and reaches the handlers.
    webhook.process.restart().await;
    let back = Instant::now();
    eventually("writes pass the webhook again", WAIT, || async {
        clusters
            .patch("guarded", &apply, &Patch::Apply(&spec))
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
    .await;
    let admitted = back.elapsed();
    eventually("the new cell exists", WAIT, || async {
        cells
            .get_opt("guarded-zone-b")
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "absent".to_owned())
    })
    .await;
    wait_converged(&clusters, "guarded", false).await;
    assert_alive(&stack);
    println!(
        "webhook back: user write admitted {:.1}s after the restart",
        admitted.as_secs_f64()
    );

    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    for registration in registrations {
        let name = registration.name_any();
        let _ = validating.delete(&name, &DeleteParams::default()).await;
        let _ = mutating.delete(&name, &DeleteParams::default()).await;
    }
    webhook.process.stop();
}

/// A small seeded generator (xorshift64), so a failing spec can be reproduced from its index.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// A valid cluster: two cells, one pool, an external topology nobody dials.
fn valid_cluster(name: &str) -> Value {
    json!({
        "apiVersion": "multigres.com/v1alpha1", "kind": "MultigresCluster",
        "metadata": {"name": name},
        "spec": {
            "postgresPasswordSecretRef": {"name": "pw", "key": "password"},
            "images": {"imagePullPolicy": "IfNotPresent"},
            "globalTopoServer": {"external": {
                "endpoints": ["http://127.0.0.1:1"], "implementation": "etcd", "rootPath": "/multigres/fuzz",
            }},
            "pvcDeletionPolicy": {"whenDeleted": "Delete", "whenScaled": "Delete"},
            "cells": [
                {"name": "zone-a", "zoneId": "zone-a"},
                {"name": "zone-b", "zoneId": "zone-b", "spec": {"multigateway": {"replicas": 1}}},
            ],
            "databases": [{"name": "postgres", "default": true, "tablegroups": [{
                "name": "default", "default": true,
                "shards": [{"name": "0-inf", "spec": {
                    "multiorch": {"replicas": 1},
                    "pools": {"main": {
                        "type": "readWrite", "cells": ["zone-a"], "replicasPerCell": 1,
                        "storage": {"size": "1Gi"},
                    }},
                }}],
            }]}],
        },
    })
}

/// JSON pointers of every node under `/spec` of `value`.
fn paths(value: &Value, at: String, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                let p = format!("{at}/{}", k.replace('~', "~0").replace('/', "~1"));
                out.push(p.clone());
                paths(v, p, out);
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                let p = format!("{at}/{i}");
                out.push(p.clone());
                paths(v, p, out);
            }
        }
        _ => {}
    }
}

const SHARD: &str = "/spec/databases/0/tablegroups/0/shards/0";
const POOL: &str = "/spec/databases/0/tablegroups/0/shards/0/spec/pools/main";

/// One random change of a valid cluster.
struct Mutation {
    /// What was changed, for messages.
    what: String,
    /// JSON pointers of the fields it changed: a refusal must name one of them (or the object
    /// holding it, where a rule on that object refused it).
    at: Vec<String>,
}

impl std::fmt::Debug for Mutation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (at {})", self.what, self.at.join(", "))
    }
}

impl Mutation {
    fn new(what: String, at: &[&str]) -> Self {
        Self {
            what,
            at: at.iter().map(|&p| p.to_owned()).collect(),
        }
    }
}

/// Applies one random mutation to `cluster`.
fn mutate(rng: &mut Rng, cluster: &mut Value) -> Mutation {
    let set = |cluster: &mut Value, pointer: &str, value: Value| {
        let (parent, key) = pointer.rsplit_once('/').expect("pointer");
        match cluster.pointer_mut(parent) {
            Some(Value::Object(map)) => {
                map.insert(key.replace("~1", "/").replace("~0", "~"), value);
            }
            Some(Value::Array(items)) => match key.parse::<usize>() {
                Ok(i) if i < items.len() => items[i] = value,
                _ => items.push(value),
            },
            _ => {}
        }
    };
    let odd_values = [
        json!(null),
        json!(-1),
        json!(0),
        json!(33),
        json!(2147483648_i64),
        json!(1e300),
        json!(1.5),
        json!(true),
        json!("x"),
        json!(""),
        json!([]),
        json!([1, "two"]),
        json!({}),
        json!({"nested": {"deep": [null]}}),
    ];
    let mut spec_paths = Vec::new();
    paths(&cluster["spec"], "/spec".to_owned(), &mut spec_paths);
    match rng.below(11) {
        0 => {
            // A previous mutation may have removed the whole spec.
            let path = if spec_paths.is_empty() {
                "/spec".to_owned()
            } else {
                rng.pick(&spec_paths).clone()
            };
            let value = rng.pick(&odd_values).clone();
            set(cluster, &path, value.clone());
            Mutation::new(format!("wrong type {path} = {value}"), &[&path])
        }
        1 => {
            let path = rng
                .pick(&[
                    format!("{POOL}/replicasPerCell"),
                    format!("{POOL}/fsGroup"),
                    format!("{SHARD}/spec/multiorch/replicas"),
                    "/spec/cells/1/spec/multigateway/replicas".to_owned(),
                ])
                .clone();
            let value = rng
                .pick(&[
                    json!(-1),
                    json!(0),
                    json!(33),
                    json!(100000),
                    json!(2147483648_i64),
                    json!(2),
                    json!(3),
                ])
                .clone();
            set(cluster, &path, value.clone());
            Mutation::new(format!("number {path} = {value}"), &[&path])
        }
        2 => {
            let objects: Vec<&String> = spec_paths
                .iter()
                .filter(|p| cluster.pointer(p).is_some_and(Value::is_object))
                .collect();
            let at = if objects.is_empty() || rng.below(3) == 0 {
                "/spec".to_owned()
            } else {
                (*rng.pick(&objects)).clone()
            };
            let field = format!("{at}/bogusField{}", rng.below(100));
            set(cluster, &field, json!(1));
            Mutation::new(format!("unknown field {field}"), &[&field])
        }
        3 => {
            let bad = rng
                .pick(&[
                    "Zone-A",
                    "zone_a",
                    "-zone",
                    "zone-",
                    "a.b",
                    "zone.a.",
                    &"z".repeat(64),
                    "ünïcode",
                    "0-inf",
                ])
                .to_string();
            if rng.below(2) == 0 {
                set(cluster, "/spec/cells/0/name", json!(bad));
                Mutation::new(format!("cell name {bad:?}"), &["/spec/cells/0/name"])
            } else {
                set(cluster, "/metadata/name", json!(bad));
                Mutation::new(format!("cluster name {bad:?}"), &["/metadata/name"])
            }
        }
        4 => {
            let (path, value) = rng
                .pick(&[
                    ("/spec/images/imagePullPolicy".to_owned(), "Sometimes"),
                    ("/spec/pvcDeletionPolicy/whenDeleted".to_owned(), "Maybe"),
                    ("/spec/pvcDeletionPolicy/whenScaled".to_owned(), "delete"),
                    (
                        "/spec/globalTopoServer/external/implementation".to_owned(),
                        "consul",
                    ),
                    ("/spec/durabilityPolicy".to_owned(), "AT_MOST_NONE"),
                    ("/spec/imageUpdatePolicy/strategy".to_owned(), "eventually"),
                    (format!("{POOL}/type"), "readMostly"),
                ])
                .clone();
            set(cluster, &path, json!(value));
            Mutation::new(format!("enum {path} = {value:?}"), &[&path])
        }
        5 => {
            let path = rng
                .pick(&[
                    "/spec/postgresPasswordSecretRef",
                    "/spec/postgresPasswordSecretRef/key",
                    "/spec/cells/0/name",
                    "/spec/cells/1/zoneId",
                    "/spec/databases/0/name",
                    "/spec/databases/0/tablegroups/0/name",
                    "/spec/databases/0/tablegroups/0/shards/0/name",
                    "/spec/globalTopoServer/external/endpoints",
                    "/spec",
                ])
                .to_string();
            let (parent, key) = path.rsplit_once('/').expect("pointer");
            let parent = if parent.is_empty() { "" } else { parent };
            if let Some(Value::Object(map)) = cluster.pointer_mut(parent) {
                map.remove(key);
            }
            Mutation::new(format!("missing {path}"), &[&path])
        }
        6 => {
            let len = rng.pick(&[4096, 4097, 10_000, 300_000]).to_owned();
            let path = rng
                .pick(&[
                    "/spec/cells/0/metadata",
                    "/spec/images/multipooler",
                    "/spec/globalTopoServer/external/rootPath",
                    "/spec/postgresSuperuser",
                ])
                .to_string();
            set(cluster, &path, json!("x".repeat(len)));
            Mutation::new(format!("huge string {path} ({len})"), &[&path])
        }
        7 => {
            let which = rng.below(9);
            let mut none = Vec::new();
            let cells = match cluster.pointer_mut("/spec/cells") {
                Some(Value::Array(cells)) => cells,
                // An earlier mutation changed the shape: nothing to add to.
                _ => &mut none,
            };
            match which {
                0 => cells.push(json!({"name": "zone-a", "zoneId": "zone-c"})),
                1 => cells.clear(),
                2 => {
                    for i in 0..51 {
                        cells.push(json!({"name": format!("c{i}"), "zoneId": "zone-a"}));
                    }
                }
                3 => {
                    cells.push(json!({"name": "zone-c", "zoneId": "zone-c", "region": "region-1"}))
                }
                4 => cells.push(json!({"name": "zone-c"})),
                5 => cells.push(json!({"name": "zone-c", "zoneId": "zone-c"})),
                _ => {}
            }
            match which {
                6 => set(cluster, &format!("{POOL}/cells"), json!(["zone-z"])),
                7 => set(cluster, &format!("{POOL}/cells"), json!([])),
                8 => set(
                    cluster,
                    &format!("{POOL}/cells"),
                    json!(["zone-a", "zone-b"]),
                ),
                _ => {}
            }
            Mutation::new(
                format!("cells/pools combination {which}"),
                &["/spec/cells", &format!("{POOL}/cells")],
            )
        }
        8 => {
            let which = rng.below(4);
            // Earlier mutations may have changed the shape; each change applies where it fits.
            let shard = format!("{SHARD}/name");
            match which {
                0 => {
                    if let Some(Value::Array(dbs)) = cluster.pointer_mut("/spec/databases") {
                        dbs.push(json!({"name": "second", "default": false}));
                    }
                }
                1 => set(cluster, &shard, json!("1-2")),
                2 => set(
                    cluster,
                    "/spec/databases/0/tablegroups/0/default",
                    json!(false),
                ),
                _ => set(
                    cluster,
                    &format!("{SHARD}/spec/pools/Bad_Pool"),
                    json!({"cells": ["zone-a"]}),
                ),
            }
            Mutation::new(
                format!("databases combination {which}"),
                &["/spec/databases"],
            )
        }
        9 => {
            // The admission classes of issue 38: label metadata, durations Go cannot hold, a
            // gateway buffer without bound, backup paths over the pod's own directories,
            // access modes, superuser names and sizes that are no whole number of bytes.
            const GATEWAY: &str = "/spec/cells/1/spec/multigateway";
            let backup_path =
                *rng.pick(&["/var/lib/pooler/pg_data", "/etc", "rel", "/b/../etc", "/"]);
            let superuser = *rng.pick(&["", "Admin", "pg_admin", "1abc", "a-b"]);
            let size = *rng.pick(&["1m", "1.5", "100"]);
            let (path, value) = rng
                .pick(&[
                    (format!("{GATEWAY}/podLabels"), json!({"My Key": "x"})),
                    (
                        format!("{GATEWAY}/podLabels"),
                        json!({"team": "data platform"}),
                    ),
                    (format!("{GATEWAY}/podAnnotations"), json!({"a/b/c": "x"})),
                    (format!("{GATEWAY}/buffer/window"), json!("3000000h")),
                    (format!("{GATEWAY}/buffer/size"), json!(2147483647)),
                    (
                        format!("{SHARD}/spec/multiorch/leaderFailoverGracePeriodBase"),
                        json!("2562048h"),
                    ),
                    (
                        "/spec/backup/filesystem/path".to_owned(),
                        json!(backup_path),
                    ),
                    (
                        "/spec/backup/filesystem/storage/accessModes".to_owned(),
                        json!(["ReadWriteAll"]),
                    ),
                    ("/spec/postgresSuperuser".to_owned(), json!(superuser)),
                    (format!("{POOL}/storage/size"), json!(size)),
                    (
                        format!("{SHARD}/spec/postgresConfig"),
                        json!({"shared_buffers": "8GB"}),
                    ),
                ])
                .clone();
            if path.starts_with("/spec/backup/") {
                set(
                    cluster,
                    "/spec/backup",
                    json!({"type": "filesystem", "filesystem": {}}),
                );
            }
            // The objects the field lives in, where an earlier mutation left them out.
            let mut parent = String::new();
            let tokens: Vec<&str> = path.trim_start_matches('/').split('/').collect();
            for token in &tokens[..tokens.len() - 1] {
                parent = format!("{parent}/{token}");
                if cluster.pointer(&parent).is_none() {
                    set(cluster, &parent, json!({}));
                }
            }
            set(cluster, &path, value.clone());
            Mutation::new(format!("admission class {path} = {value}"), &[&path])
        }
        _ => {
            let which = rng.below(4);
            match which {
                0 => set(cluster, "/spec/logLevels", json!({"multigateway": "debug"})),
                1 => set(
                    cluster,
                    &format!("{SHARD}/spec/postgresConfig"),
                    json!({"max_connections": "50"}),
                ),
                2 => set(
                    cluster,
                    "/spec/cells/1/spec/multigateway/replicas",
                    json!(2),
                ),
                _ => set(
                    cluster,
                    "/spec/templateDefaults",
                    json!({"cellTemplate": "missing"}),
                ),
            }
            let at = match which {
                0 => "/spec/logLevels".to_owned(),
                1 => format!("{SHARD}/spec/postgresConfig"),
                2 => "/spec/cells/1/spec/multigateway/replicas".to_owned(),
                _ => "/spec/templateDefaults".to_owned(),
            };
            Mutation::new(format!("plausible change {which}"), &[&at])
        }
    }
}

/// Whether a refusal names the offending field: one of the `mutations`' fields, a field
/// inside one (a required field of an object set to something else), or the object holding
/// one (where a rule on that object refused it), as the API server and the webhook write
/// paths (`spec.cells[0].name`, `unknown field "spec.bogusField1"`).
fn names_the_offending_field(message: &str, mutations: &[Mutation]) -> bool {
    let message = message.replace('[', ".").replace(']', "");
    mutations.iter().flat_map(|m| &m.at).any(|pointer| {
        let tokens: Vec<String> = pointer
            .trim_start_matches('/')
            .split('/')
            .map(|t| t.replace("~1", "/").replace("~0", "~"))
            .collect();
        // "spec" alone names every field; it counts only when the whole spec was changed.
        let shortest = if tokens.len() == 1 { 1 } else { 2 };
        (shortest..=tokens.len()).any(|k| message.contains(&tokens[..k].join(".")))
    })
}

/// `Progressing` reasons of a cluster whose last reconcile succeeded (the cluster-handler's
/// `cluster/status.rs`).
const RECONCILED: [&str; 3] = ["Reconciling", "Ready", "ChildDegraded"];
/// `Progressing` reasons of a cluster blocked until its spec or templates change.
const INVALID: [&str; 4] = [
    "InvalidSpec",
    "InvalidObject",
    "TemplateNotFound",
    "InvalidTemplate",
];

#[tokio::test]
async fn a_thousand_random_and_malformed_clusters_are_refused_with_a_field_or_observed() {
    const SPECS: usize = 1000;
    const BATCH: usize = 100;
    let plane = control_plane().await;
    let namespace = fresh_namespace(plane, "fuzz").await;
    let stack = Stack::start(plane, &namespace, None).await;
    let client = admin(plane);
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("multigres.com", "v1alpha1", "MultigresCluster"),
        "multigresclusters",
    );
    let clusters: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &resource);
    let strict = PatchParams::apply("e2e-fuzz").force().validation_strict();
    let mut rng = Rng(0x5eed_f00d_cafe_d00d);
    let mut refused = 0;
    let mut unexplained = Vec::new();
    let mut converged = 0;
    let mut superseded = 0;
    let mut invalid = BTreeMap::<String, usize>::new();
    let started = Instant::now();
    for batch in 0..SPECS / BATCH {
        // By name: a mutation may give two specs of a batch the same name, and then one
        // cluster stands for both (whichever patch came last).
        let mut accepted = BTreeMap::new();
        let specs: Vec<_> = (batch * BATCH..(batch + 1) * BATCH)
            .map(|i| {
                let mut cluster = valid_cluster(&format!("fz-{i}"));
                let mutations: Vec<Mutation> = (0..1 + rng.below(3))
                    .map(|_| mutate(&mut rng, &mut cluster))
                    .collect();
                (i, cluster, mutations)
            })
            .collect();
        // A few at once, as several users would: the webhook and the API server answer each.
        let answers: Vec<_> = futures::stream::iter(specs)
            .map(|(i, cluster, mutations)| {
                let (clusters, strict) = (&clusters, &strict);
                async move {
                    let name = cluster["metadata"]["name"]
                        .as_str()
                        .unwrap_or("fz-unnamed")
                        .to_owned();
                    let answer = clusters.patch(&name, strict, &Patch::Apply(&cluster)).await;
                    (i, mutations, answer)
                }
            })
            .buffered(8)
            .collect()
            .await;
        for (i, mutations, answer) in answers {
            match answer {
                Ok(stored) => {
                    if accepted.insert(stored.name_any(), mutations).is_some() {
                        superseded += 1;
                    }
                }
                Err(kube::Error::Api(status))
                    if names_the_offending_field(&status.message, &mutations) =>
                {
                    refused += 1
                }
                Err(e) => unexplained.push(format!("#{i} {mutations:?}: {e}")),
            }
        }
        // Every accepted cluster is observed at its generation by the cluster-handler: either
        // reconciled, or blocked with a condition saying the spec is invalid. Any other reason
        // (a write that keeps failing, a name held by another cluster's children) is waited
        // out, and fails the test if it stays.
        for (name, mutations) in &accepted {
            let reason = eventually(
                &format!("{name} ({mutations:?}) reconciled or reported invalid"),
                WAIT,
                || async {
                    let c = clusters.get(name).await.map_err(|e| e.to_string())?;
                    let status = &c.data["status"];
                    if status["observedGeneration"].as_i64() != c.metadata.generation {
                        return Err(format!("{status}"));
                    }
                    let progressing = status["conditions"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .find(|c| c["type"] == "Progressing")
                        .ok_or_else(|| format!("no Progressing condition: {status}"))?;
                    let reason = progressing["reason"].as_str().unwrap_or_default();
                    if RECONCILED.contains(&reason) || INVALID.contains(&reason) {
                        Ok(reason.to_owned())
                    } else {
                        Err(format!("neither reconciled nor invalid: {status}"))
                    }
                },
            )
            .await;
            if INVALID.contains(&reason.as_str()) {
                *invalid.entry(reason).or_default() += 1;
            } else {
                converged += 1;
            }
        }
        // Gone before the next batch, which may reuse a name a mutation produced.
        for name in accepted.keys() {
            clusters
                .delete(name, &DeleteParams::background())
                .await
                .expect("deleting a fuzz cluster");
        }
        eventually("the batch is deleted", WAIT, || async {
            let left = clusters
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?
                .items
                .len();
            if left == 0 {
                Ok(())
            } else {
                Err(format!("{left} left"))
            }
        })
        .await;
        assert_alive(&stack);
    }
    println!(
        "{SPECS} specs in {:.0}s: {refused} refused naming the offending field, {converged} accepted and \
         reconciled, {} accepted and reported invalid {invalid:?}, {superseded} accepted and \
         standing for another spec of the same name, {} refused without naming the \
         offending field",
        started.elapsed().as_secs_f64(),
        invalid.values().sum::<usize>(),
        unexplained.len()
    );
    assert!(unexplained.is_empty(), "{unexplained:#?}");
    assert_eq!(
        refused + converged + invalid.values().sum::<usize>() + superseded,
        SPECS,
        "every spec classified"
    );
    // Both handlers are still the processes started at the beginning, and settle.
    for handler in stack.handlers() {
        handler.settled(QUIET).await;
    }
}
