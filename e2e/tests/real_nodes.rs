//! The real-node tier: the operator installed by `helm install` from the image `just image`
//! builds, its four handlers running as real pods (containerd, runc, CNI) under the chart's
//! ServiceAccounts and RBAC, the API server calling the webhook through its Service, and a
//! managed etcd topology that the data-handler reaches through cluster DNS, over TLS with its
//! client certificate.
//!
//! One control plane with real nodes (zones `zone-a` twice, `zone-b`, `zone-c`) per test
//! process; the release is installed once and shared; tests that change it run one at a time.

use std::time::Duration;

use etcd_client::{
    Certificate, Client as EtcdClient, ConnectOptions, GetOptions, Identity, TlsOptions,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};
use multigres_api::v1alpha1::{Cell, MultigresCluster};
use multigres_e2e::harness::{self, HANDLERS, eventually, fresh_namespace, repo_path};
use multigres_e2e::manifest::{self, Mode};
use multigres_e2e::real::{
    ETCD_IMAGE_PREFIX, OPERATOR_IMAGE_PREFIX, OPERATOR_NAMESPACE, image, is_ready,
    operator_installed,
};

const CONTROLLERS: [&str; 3] = ["cluster-handler", "resource-handler", "data-handler"];
/// Real pods start in seconds, but images unpack and probes pass on 2 shared cores.
const WAIT: Duration = Duration::from_secs(180);

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn handler_of(pod: &Pod) -> String {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("app.kubernetes.io/component"))
        .cloned()
        .unwrap_or_default()
}

async fn operator_pods(client: &Client) -> Vec<Pod> {
    Api::<Pod>::namespaced(client.clone(), OPERATOR_NAMESPACE)
        .list(&ListParams::default())
        .await
        .expect("listing the operator's pods")
        .items
}

/// The pod holding a controller's Lease (its holder identity starts with the pod name).
async fn leader(client: &Client, handler: &str) -> Option<String> {
    let lease = Api::<Lease>::namespaced(client.clone(), OPERATOR_NAMESPACE)
        .get_opt(&format!("multigres-operator-{handler}"))
        .await
        .ok()??;
    let holder = lease.spec?.holder_identity?;
    operator_pods(client)
        .await
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .find(|name| holder.starts_with(name.as_str()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_handlers_run_as_real_pods_from_the_operator_image() {
    let _serial = SERIAL.lock().await;
    let cluster = operator_installed().await;
    let client = cluster.client().unwrap();
    let operator = image(OPERATOR_IMAGE_PREFIX);
    let real: Vec<String> = cluster.real_nodes().into_iter().map(|n| n.name).collect();
    assert_eq!(
        real.len(),
        multigres_e2e::cluster::REAL_NODE_ZONES.len(),
        "the real nodes"
    );

    let nodes: Api<Node> = Api::all(client.clone());
    for name in &real {
        let node = nodes.get(name).await.unwrap();
        let info = node.status.and_then(|s| s.node_info).expect("node info");
        assert!(
            info.container_runtime_version.starts_with("containerd://"),
            "{name} runs {}",
            info.container_runtime_version
        );
        assert!(
            info.kubelet_version.starts_with("v1.36"),
            "{}",
            info.kubelet_version
        );
        let zone = node
            .metadata
            .labels
            .unwrap_or_default()
            .get("topology.kubernetes.io/zone")
            .cloned();
        let zone = zone.unwrap_or_default();
        assert!(
            name.starts_with(&format!("node-{zone}")),
            "{name} in {zone}"
        );
    }

    // Only the Ready pods that stay are checked: another test of this file deletes a leader
    // pod, and its replacement may not have a container yet.
    let pods = eventually("two Ready pods per handler", WAIT, || async {
        let pods: Vec<_> = operator_pods(&client)
            .await
            .into_iter()
            .filter(|p| is_ready(p) && p.metadata.deletion_timestamp.is_none())
            .collect();
        let mut ready = std::collections::BTreeMap::<String, usize>::new();
        for pod in &pods {
            *ready.entry(handler_of(pod)).or_default() += 1;
        }
        if HANDLERS.iter().all(|h| ready.get(*h) == Some(&2)) {
            Ok(pods)
        } else {
            Err(format!("Ready pods per handler: {ready:?}"))
        }
    })
    .await;
    for pod in &pods {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let spec = pod.spec.as_ref().unwrap();
        let node = spec.node_name.clone().unwrap_or_default();
        assert!(
            real.contains(&node),
            "{name} runs on {node}, not a real node"
        );
        assert_eq!(spec.containers[0].image.as_deref(), Some(operator.as_str()));
        let status = pod.status.as_ref().unwrap();
        let container = &status.container_statuses.as_ref().unwrap()[0];
        assert!(
            container
                .container_id
                .as_deref()
                .is_some_and(|id| id.starts_with("containerd://")),
            "{name}: {:?}",
            container.container_id
        );
        assert!(
            status
                .pod_ip
                .as_deref()
                .is_some_and(|ip| ip.starts_with("10.244.")),
            "{name} has pod IP {:?}",
            status.pod_ip
        );
        let account = spec.service_account_name.clone().unwrap_or_default();
        assert!(
            account.contains(&handler_of(pod)),
            "{name} runs as {account}"
        );
    }
    let wide = cluster
        .kubectl(&["get", "pods", "-n", OPERATOR_NAMESPACE, "-o", "wide"])
        .await
        .unwrap();
    println!("{wide}");

    // The API server reaches the kubelet for logs.
    let webhook = pods
        .iter()
        .find(|p| handler_of(p) == harness::WEBHOOK)
        .and_then(|p| p.metadata.name.clone())
        .unwrap();
    let logs = cluster
        .kubectl(&["logs", "-n", OPERATOR_NAMESPACE, &webhook])
        .await
        .unwrap();
    assert!(
        logs.contains(harness::ADMISSION_MESSAGE),
        "webhook-server logs:\n{logs}"
    );

    for handler in CONTROLLERS {
        let holder = eventually(&format!("{handler} has a leader pod"), WAIT, || async {
            leader(&client, handler)
                .await
                .ok_or_else(|| "no holder yet".to_owned())
        })
        .await;
        println!("{handler} leader: {holder}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_refuses_bad_input_through_its_service() {
    let _serial = SERIAL.lock().await;
    let cluster = operator_installed().await;
    let client = cluster.client().unwrap();
    let configs = cluster
        .kubectl(&["get", "validatingwebhookconfigurations", "-o", "json"])
        .await
        .unwrap();
    assert!(
        configs.contains("\"service\"") && !configs.contains("\"url\""),
        "the chart registers the webhook by Service:\n{configs}"
    );
    let namespace = fresh_namespace(cluster, "real-webhook").await;
    // Valid for the CRD's schema and CEL rules, which run before any webhook: only the
    // webhook, which reads the namespace's templates, can refuse it.
    let cluster_object: MultigresCluster = serde_json::from_value(serde_json::json!({
        "apiVersion": "multigres.com/v1alpha1",
        "kind": "MultigresCluster",
        "metadata": {"name": "missing-template"},
        "spec": {
            "postgresPasswordSecretRef": {"name": "postgres-password", "key": "password"},
            "cells": [{"name": "zone-a", "zoneId": "zone-a", "cellTemplate": "missing"}],
        },
    }))
    .unwrap();
    let clusters: Api<MultigresCluster> = Api::namespaced(client.clone(), &namespace);
    let error = eventually("the webhook answers through its Service", WAIT, || async {
        match clusters
            .create(&PostParams::default(), &cluster_object)
            .await
        {
            Err(kube::Error::Api(status)) if !status.message.contains("failed calling webhook") => {
                Ok(status.message)
            }
            other => Err(format!("not refused by the webhook yet: {other:?}")),
        }
    })
    .await;
    assert_eq!(
        error,
        format!(
            "admission webhook \"vmultigrescluster.multigres.com\" denied the request: \
             spec.cells[0].cellTemplate: CellTemplate \"missing\" does not exist in namespace \
             \"{namespace}\"; create it first or change the reference"
        ),
        "the webhook's own denial, naming the field and what to do"
    );
}

/// The webhook turned topology TLS on for the sample (every etcd managed): one member, dialled
/// at its pod IP, refuses plaintext and a TLS client without a certificate, and answers the
/// data-handler's client certificate (the one it registered the cell with, above) by the
/// member's own DNS name. Its peers formed a quorum over TLS, with certificates both ways.
async fn etcd_refuses_clients_without_a_certificate(client: &Client, namespace: &str) {
    let clusters: Api<MultigresCluster> = Api::namespaced(client.clone(), namespace);
    let stored = clusters.get("minimal").await.unwrap();
    assert_eq!(
        stored.spec.internal_tls.as_ref().and_then(|t| t.topology),
        Some(true),
        "the webhook sets internalTLS.topology on a new cluster of managed etcds"
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let member = pods.get("minimal-global-topo-0").await.unwrap();
    let ip = member
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .unwrap();
    let args = member.spec.as_ref().unwrap().containers[0]
        .args
        .clone()
        .unwrap();
    let initial = args
        .iter()
        .find(|a| a.starts_with("--initial-cluster="))
        .unwrap();
    assert_eq!(initial.matches("=https://").count(), 3, "{initial}");
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let issued = secrets
        .get(&multigres_api::names::data_handler_client_tls(
            "minimal", namespace,
        ))
        .await
        .unwrap();
    let key = |k: &str| issued.data.as_ref().unwrap()[k].0.clone();
    let timeout = Duration::from_secs(5);
    let options = || {
        ConnectOptions::new()
            .with_connect_timeout(timeout)
            .with_timeout(timeout)
    };
    let root = "/multigres/global";
    let read = |endpoint: String, options: ConnectOptions| async move {
        let mut etcd = EtcdClient::connect([endpoint], Some(options))
            .await
            .map_err(|e| e.to_string())?;
        etcd.get(root, Some(GetOptions::new().with_prefix().with_keys_only()))
            .await
            .map(|r| r.kvs().len())
            .map_err(|e| e.to_string())
    };
    let plain = read(format!("http://{ip}:2379"), options()).await;
    assert!(plain.is_err(), "plaintext answered: {plain:?}");
    let server = format!("minimal-global-topo-0.minimal-global-topo-peer.{namespace}.svc");
    let ca_only = TlsOptions::new()
        .ca_certificate(Certificate::from_pem(key("ca.crt")))
        .domain_name(&server);
    let anonymous = read(
        format!("https://{ip}:2379"),
        options().with_tls(ca_only.clone()),
    )
    .await;
    assert!(
        anonymous.is_err(),
        "a TLS client without a certificate answered: {anonymous:?}"
    );
    let identified = ca_only.identity(Identity::from_pem(key("tls.crt"), key("tls.key")));
    let keys = read(format!("https://{ip}:2379"), options().with_tls(identified))
        .await
        .expect("the data-handler's certificate is accepted");
    assert!(keys > 0, "the global topology holds the cell's record");
    println!(
        "etcd {ip}: plaintext refused ({}), TLS without a certificate refused ({}), with the \
         data-handler's certificate {keys} keys under {root}",
        plain.unwrap_err(),
        anonymous.unwrap_err()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_managed_etcd_topology_registers_through_cluster_dns_and_survives_a_leader_handover() {
    let _serial = SERIAL.lock().await;
    let cluster = operator_installed().await;
    let client = cluster.client().unwrap();
    let namespace = fresh_namespace(cluster, "real-topo").await;
    let etcd = image(ETCD_IMAGE_PREFIX);

    // The unchanged minimal sample, with the locally built etcd that is never pulled.
    let path = repo_path("deploy/samples/minimal.yaml");
    for mut doc in manifest::read_documents(&path).unwrap() {
        if doc
            .types
            .as_ref()
            .is_some_and(|t| t.kind == "MultigresCluster")
        {
            doc.data["spec"]["globalTopoServer"] =
                serde_json::json!({"etcd": {"image": etcd, "replicas": 3}});
            doc.data["spec"]["images"] = serde_json::json!({"imagePullPolicy": "Never"});
        }
        manifest::apply(&client, &doc, Some(&namespace), Mode::Apply)
            .await
            .unwrap_or_else(|e| panic!("applying {}: {e}", path.display()));
    }
    let cells: Api<Cell> = Api::namespaced(client.clone(), &namespace);
    let registered = |cells: Api<Cell>, ns: String| async move {
        let list = cells
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        let states: Vec<String> = list
            .items
            .iter()
            .map(|cell| {
                let condition = cell.status.as_ref().and_then(|s| {
                    s.conditions
                        .iter()
                        .find(|c| c.type_ == "TopologyRegistered")
                });
                format!(
                    "{}: {:?}",
                    cell.metadata.name.clone().unwrap_or_default(),
                    condition.map(|c| (&c.status, &c.message))
                )
            })
            .collect();
        let all = !list.items.is_empty()
            && list.items.iter().all(|cell| {
                cell.status.as_ref().is_some_and(|s| {
                    s.conditions
                        .iter()
                        .any(|c| c.type_ == "TopologyRegistered" && c.status == "True")
                })
            });
        if all {
            return Ok(());
        }
        // What the first etcd member says, for a topology that never serves.
        let pods: Api<Pod> = Api::namespaced(cells.clone().into_client(), &ns);
        let params = kube::api::LogParams {
            tail_lines: Some(5),
            ..Default::default()
        };
        let etcd = pods
            .logs("minimal-global-topo-0", &params)
            .await
            .unwrap_or_default();
        Err(format!("{}; etcd-0 says: {etcd}", states.join("; ")))
    };
    eventually(
        "the cell is registered in the managed etcd (data-handler pod -> cluster DNS -> etcd pods)",
        WAIT * 2,
        || registered(cells.clone(), namespace.clone()),
    )
    .await;
    // A quorum (two members) is enough to register; the third may still be starting.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    eventually("three Ready etcd members", WAIT, || async {
        let ready = pods
            .list(&ListParams::default().labels("app.kubernetes.io/component=global-topo"))
            .await
            .map_err(|e| e.to_string())?
            .items
            .iter()
            .filter(|p| is_ready(p))
            .count();
        if ready >= 3 {
            Ok(())
        } else {
            Err(format!("{ready} Ready"))
        }
    })
    .await;
    etcd_refuses_clients_without_a_certificate(&client, &namespace).await;

    // Hand over: delete the cluster-handler's leader pod; another takes the Lease, and
    // reconciling goes on (a scaled gateway is rolled out by the new leaders).
    let old = leader(&client, "cluster-handler")
        .await
        .expect("a cluster-handler leader");
    Api::<Pod>::namespaced(client.clone(), OPERATOR_NAMESPACE)
        .delete(&old, &DeleteParams::default())
        .await
        .unwrap();
    let new = eventually(
        "another pod takes the cluster-handler Lease",
        WAIT,
        || async {
            match leader(&client, "cluster-handler").await {
                Some(holder) if holder != old => Ok(holder),
                other => Err(format!("holder {other:?}")),
            }
        },
    )
    .await;
    println!("cluster-handler leader {old} -> {new}");
    let clusters: Api<MultigresCluster> = Api::namespaced(client.clone(), &namespace);
    let patch = serde_json::json!({"spec": {"cells": [{"name": "zone-a", "zone": "zone-a",
        "spec": {"multigateway": {"replicas": 2}}}]}});
    clusters
        .patch(
            "minimal",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .unwrap();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &namespace);
    eventually(
        "the new leaders roll the edit out (gateway at 2 replicas)",
        WAIT,
        || async {
            let list = deployments
                .list(&ListParams::default().labels("app.kubernetes.io/component=multigateway"))
                .await
                .map_err(|e| e.to_string())?;
            let replicas: Vec<Option<i32>> = list
                .items
                .iter()
                .map(|d| d.spec.as_ref().and_then(|s| s.replicas))
                .collect();
            if replicas == [Some(2)] {
                Ok(())
            } else {
                Err(format!("{replicas:?}"))
            }
        },
    )
    .await;
}
