//! Cells as failure domains on real pods: the minimal sample grown to three cells (`zone-a`,
//! `zone-b`, `zone-c`, one pool pod each, `MULTI_CELL_AT_LEAST_2`, S3 backups since a volume
//! only one node mounts cannot serve three zones), under a steady writer through a surviving
//! cell's own gateway. The primary's zone loses power (every node of it: kubelet, containerd
//! and every process of its pods killed at once, nothing said to anyone); a new primary in
//! another zone takes the writes; the statuses say what is gone; nothing the operator does
//! deletes a volume or a lost pod; then the zone comes back, its pod rejoins as a replica, the
//! cohort is whole again, and every acknowledged row is on every pod.
//!
//! The figures (`[figure] …`) are printed, not asserted.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Pod};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};
use multigres_api::v1alpha1::{Cell, MultigresCluster};
use multigres_e2e::harness::{eventually, fresh_namespace};
use multigres_e2e::load::{Load, assert_kept, create_ledger, figure, ledger};
use multigres_e2e::real::{Endpoint, is_ready, operator_installed};
use multigres_e2e::s3;
use multigres_e2e::sample::{
    NAME, WAIT, apply_sample, cohort_until, pool_pods, settled_roles, shard, shard_events,
    wait_serving, whole,
};
use serde_json::json;

const ZONES: [&str; 3] = ["zone-a", "zone-b", "zone-c"];
const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// Each pod of `namespace` that has not finished, with the node it runs on.
async fn placement(client: &Client, namespace: &str) -> BTreeMap<String, String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    pods.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        // A finished Job's pod (the backup repository's marking) is never Ready again.
        .filter(|p| {
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            !matches!(phase, Some("Succeeded" | "Failed"))
        })
        .map(|p| {
            let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
            (p.name_any(), node.unwrap_or_default())
        })
        .collect()
}

/// The zone of each node.
async fn node_zones(client: &Client) -> BTreeMap<String, String> {
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|n| Some((n.name_any(), n.labels().get(ZONE_LABEL)?.clone())))
        .collect()
}

/// The claims of `namespace` by name, with their UIDs: a claim deleted and made again has
/// another UID.
async fn claims(client: &Client, namespace: &str) -> BTreeMap<String, String> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
    claims
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|c| (c.name_any(), c.uid().unwrap_or_default()))
        .collect()
}

/// What the cluster, its Cells and its Shard say, one line each: phase, message and the
/// conditions that are not True.
async fn statuses(client: &Client, namespace: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let cluster = Api::<MultigresCluster>::namespaced(client.clone(), namespace)
        .get(NAME)
        .await
        .unwrap();
    let status = cluster.status.unwrap_or_default();
    let not_true = |conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition]| {
        conditions
            .iter()
            .filter(|c| c.status != "True")
            .map(|c| format!("{}={} {}: {}", c.type_, c.status, c.reason, c.message))
            .collect::<Vec<_>>()
    };
    lines.push(format!(
        "MultigresCluster: phase {:?}, {:?}; {:?}",
        status.phase,
        status.message,
        not_true(&status.conditions)
    ));
    for cell in Api::<Cell>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
    {
        let status = cell.status.clone().unwrap_or_default();
        lines.push(format!(
            "Cell {}: phase {:?}, {:?}; {:?}",
            cell.name_any(),
            status.phase,
            status.message,
            not_true(&status.conditions)
        ));
    }
    let status = shard(client, namespace).await.status.unwrap_or_default();
    lines.push(format!(
        "Shard: phase {:?}, {:?}; roles {:?}; cohort {:?}; {:?}",
        status.phase,
        status.message,
        status.pod_roles,
        status.cohort.as_ref().map(|c| c.summary.clone()),
        not_true(&status.conditions)
    ));
    lines
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_zone_is_survived_and_rejoins_when_it_returns() {
    let began = Instant::now();
    let cluster = operator_installed().await;
    let s3 = s3::server().await;
    let client = cluster.client().unwrap();
    let namespace = fresh_namespace(cluster, "zones").await;

    // a. Three cells, one pool pod each, two cells must acknowledge every commit.
    s3::create_credentials(&client, &namespace).await;
    let sent = apply_sample(&client, &namespace, |c| {
        c["spec"]["cells"] = json!(ZONES.map(|z| json!({"name": z, "zoneId": z})));
        c["spec"]["durabilityPolicy"] = json!("MULTI_CELL_AT_LEAST_2");
        c["spec"]["backup"] = s3.backup_spec(&namespace);
        c["spec"]["databases"] = json!([{"name": "postgres", "default": true,
            "tablegroups": [{"name": "default", "default": true, "shards": [{"name": "0-inf",
                "spec": {"pools": {"default": {"replicasPerCell": 1}}}}]}]}]);
    })
    .await;
    let (_, to_sql) = wait_serving(&client, &namespace, sent).await;
    figure(
        "apply of 3 cells -> first SELECT 1 answered (s)",
        format!("{:.1}", to_sql.as_secs_f64()),
    );
    let gateway = Endpoint::gateway(&client, &namespace, NAME).await.unwrap();
    let password = gateway.password.clone();
    let (primary, roles) = settled_roles(&client, &namespace, &password, 3).await;
    cohort_until(
        &client,
        &namespace,
        "a whole cohort of 3 in 3 cells",
        |c, h, t| whole(c, 3) && h.0 == "True" && t.0 == "True",
    )
    .await;
    let zones = node_zones(&client).await;
    let before = placement(&client, &namespace).await;
    println!("pods on nodes: {before:?}");
    let etcd_zones: Vec<&String> = before
        .iter()
        .filter(|(pod, _)| pod.contains("global-topo"))
        .filter_map(|(_, node)| zones.get(node))
        .collect();
    let mut distinct = etcd_zones.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        3,
        "the three etcd members prefer a zone each: {etcd_zones:?} ({before:?})"
    );
    let lost_zone = zones[&before[&primary]].clone();
    let survivor = ZONES
        .iter()
        .find(|z| **z != lost_zone)
        .expect("another zone")
        .to_string();
    let writer = Endpoint::cell_gateway(&client, &namespace, NAME, &survivor)
        .await
        .unwrap();
    let mut acknowledged = create_ledger(&writer).await;

    // Replica reads through a cell's gateway (its `pg-replica` port) are served by that cell's
    // replica: multigateway prefers local-cell replicas.
    let reader_cell = ZONES
        .iter()
        .find(|z| {
            roles
                .get(&format!("{NAME}-postgres-default-0-inf-pool-default-{z}-0"))
                .is_some_and(|r| r == "REPLICA")
        })
        .expect("a cell whose pool pod is a replica");
    let mut replica_reads = Endpoint::cell_gateway(&client, &namespace, NAME, reader_cell)
        .await
        .unwrap();
    replica_reads.port = 5433;
    let local = format!("{NAME}-postgres-default-0-inf-pool-default-{reader_cell}-0");
    let served_by = eventually(
        &format!("replica reads through {reader_cell}'s gateway served by {local}"),
        WAIT,
        || async {
            // A standby streams under `application_name=<cell>_<pod>` (the gateway refuses
            // file access, so no hostname).
            let mut hosts = Vec::new();
            for _ in 0..5 {
                let rows = replica_reads
                    .query("SELECT current_setting('primary_conninfo'), pg_is_in_recovery()")
                    .await?;
                let conninfo = rows[0][0].clone().unwrap_or_default();
                let name = conninfo
                    .split_whitespace()
                    .find_map(|kv| kv.strip_prefix("application_name="))
                    .unwrap_or_default()
                    .to_owned();
                hosts.push((name, rows[0][1].clone()));
            }
            let expected = format!("{reader_cell}_{local}");
            if hosts
                .iter()
                .all(|(h, standby)| *h == expected && standby.as_deref() == Some("t"))
            {
                Ok(hosts)
            } else {
                Err(format!("served by {hosts:?}"))
            }
        },
    )
    .await;
    println!("replica reads through {reader_cell}'s gateway: {served_by:?}");
    let claims_before = claims(&client, &namespace).await;
    let lost_pods: Vec<String> = before
        .iter()
        .filter(|(_, node)| zones.get(*node) == Some(&lost_zone))
        .map(|(pod, _)| pod.clone())
        .collect();
    println!(
        "primary {primary} in {lost_zone}; roles {roles:?}; writing through {survivor}'s \
         gateway; {lost_zone} holds {lost_pods:?}"
    );

    // b. The primary's zone loses power under the writer.
    let load = Load::start(writer.clone(), 1_000_000);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let lost_nodes: Vec<String> = cluster
        .real_nodes()
        .into_iter()
        .filter(|n| n.zone == lost_zone)
        .map(|n| n.name)
        .collect();
    let powered_off = Timestamp::now();
    let off = Instant::now();
    for node in &lost_nodes {
        cluster.power_off(node).unwrap();
    }
    println!("powered off {lost_nodes:?}");
    let new_primary = eventually("a new primary in a surviving zone", WAIT, || async {
        let status = shard(&client, &namespace).await.status.unwrap_or_default();
        let primaries: Vec<&String> = status
            .pod_roles
            .iter()
            .filter(|(pod, role)| role.as_str() == "PRIMARY" && !lost_pods.contains(pod))
            .map(|(pod, _)| pod)
            .collect();
        match primaries.as_slice() {
            [one] => Ok((*one).clone()),
            _ => Err(format!("roles {:?}", status.pod_roles)),
        }
    })
    .await;
    let to_new_primary = off.elapsed();
    // The writer keeps going while the zone is gone; what the statuses say once Kubernetes has
    // noticed the nodes (NotReady after the controller manager's 40 s grace).
    eventually("the lost nodes NotReady", WAIT, || async {
        let nodes: Api<Node> = Api::all(client.clone());
        let mut states = Vec::new();
        for name in &lost_nodes {
            let node = nodes.get(name).await.map_err(|e| e.to_string())?;
            let ready = node
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .into_iter()
                .find(|c| c.type_ == "Ready")
                .map(|c| c.status);
            states.push(ready);
        }
        if states.iter().all(|s| s.as_deref() != Some("True")) {
            Ok(())
        } else {
            Err(format!("{lost_nodes:?}: Ready {states:?}"))
        }
    })
    .await;
    let to_not_ready = off.elapsed();
    // What a user reads: the cluster Degraded, naming the lost zone's Cell and the Shard, each
    // saying that its pods were lost with a node that stopped reporting; one primary.
    let names_a_lost_node = |text: &str| lost_nodes.iter().any(|n| text.contains(n.as_str()));
    let lost_cell = format!("{NAME}-{lost_zone}");
    eventually("the statuses tell the zone's loss", WAIT, || async {
        let cluster = Api::<MultigresCluster>::namespaced(client.clone(), &namespace)
            .get(NAME)
            .await
            .map_err(|e| e.to_string())?;
        let status = cluster.status.unwrap_or_default();
        let degraded = status
            .conditions
            .iter()
            .find(|c| c.type_ == "Degraded")
            .map(|c| (c.status.clone(), c.message.clone()))
            .unwrap_or_default();
        let shard = shard(&client, &namespace).await.status.unwrap_or_default();
        let primaries = shard.pod_roles.values().filter(|r| *r == "PRIMARY").count();
        let told = degraded.0 == "True"
            && degraded
                .1
                .contains(&format!("Cell {lost_cell}: multigateway pods lost"))
            && names_a_lost_node(&degraded.1)
            && shard
                .message
                .as_deref()
                .is_some_and(|m| m.contains("stopped reporting") && names_a_lost_node(m))
            && primaries == 1;
        if told {
            Ok(())
        } else {
            Err(format!(
                "Degraded {degraded:?}; Shard {:?}: {:?}; roles {:?}",
                shard.phase, shard.message, shard.pod_roles
            ))
        }
    })
    .await;
    let to_told = off.elapsed();
    let during = statuses(&client, &namespace).await;
    println!("while {lost_zone} is lost:");
    for line in &during {
        println!("  {line}");
    }
    for event in shard_events(&client, &namespace).await {
        println!("  event {event}");
    }
    let lost_at = off.elapsed();

    // c. The zone comes back: its pod rejoins as a replica, the cohort is whole again.
    for node in &lost_nodes {
        cluster.power_on(node).unwrap();
    }
    let (cohort, to_whole) = cohort_until(
        &client,
        &namespace,
        "the cohort whole again after the zone returned",
        |c, h, t| whole(c, 3) && h.0 == "True" && t.0 == "True",
    )
    .await;
    let (primary_after, roles_after) = settled_roles(&client, &namespace, &password, 3).await;
    assert_eq!(
        primary_after, new_primary,
        "the returning zone does not take the primary back: {roles_after:?}"
    );
    let report = load.finish().await;
    report.figures("the zone's loss and return");
    acknowledged.extend(&report.acknowledged);
    // A write in flight at the loss can still be acknowledged at once; writes are accepted
    // again at the end of the longest pause in acknowledgements after the loss.
    let mut since = powered_off;
    let mut longest = (SignedDuration::ZERO, None);
    for at in report
        .acknowledged_at
        .iter()
        .filter(|at| **at > powered_off)
    {
        let pause = at.duration_since(since);
        if pause > longest.0 {
            longest = (pause, Some(*at));
        }
        since = *at;
    }
    let accepted_again = longest
        .1
        .map(|at| at.duration_since(powered_off).as_secs_f64());
    let after_loss = report
        .acknowledged_at
        .iter()
        .filter(|at| **at > powered_off)
        .count();
    assert!(
        after_loss > 0,
        "no write accepted after {lost_zone} was lost: {:?}",
        report.errors
    );
    assert_kept(&writer, &acknowledged).await;
    for pod in pool_pods(&client, &namespace).await {
        let name = pod.name_any();
        let endpoint = Endpoint::pod(&pod, &password).expect("a pod IP");
        eventually(
            &format!("every acknowledged row on {name}"),
            WAIT,
            || async {
                let rows = ledger(&endpoint).await?;
                let missing = acknowledged.iter().filter(|id| !rows.contains(id)).count();
                if missing == 0 {
                    Ok(())
                } else {
                    Err(format!("{name} misses {missing} of {}", acknowledged.len()))
                }
            },
        )
        .await;
    }
    let claims_after = claims(&client, &namespace).await;
    assert_eq!(
        claims_before, claims_after,
        "no claim deleted or made again while the zone was lost"
    );
    let after = statuses(&client, &namespace).await;
    println!("after {lost_zone} returned: {after:?}; cohort {cohort:?}");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    // Every pod that was on the lost zone is Ready again, the web UI's too.
    for name in &lost_pods {
        eventually(&format!("{name} Ready again"), WAIT, || async {
            let pod = pods.get(name).await.map_err(|e| e.to_string())?;
            if is_ready(&pod) {
                Ok(())
            } else {
                Err(format!("not Ready: {:?}", pod.status.map(|s| s.conditions)))
            }
        })
        .await;
    }
    figure(
        "zone lost -> writes accepted again (s)",
        accepted_again.map_or("none".into(), |s| format!("{s:.1}")),
    );
    figure(
        "zone lost -> a new primary published (s)",
        format!("{:.1}", to_new_primary.as_secs_f64()),
    );
    figure(
        "zone lost -> its nodes NotReady (s)",
        format!("{:.1}", to_not_ready.as_secs_f64()),
    );
    figure(
        "zone lost -> the cluster Degraded, naming it (s)",
        format!("{:.1}", to_told.as_secs_f64()),
    );
    figure("zone lost for (s)", format!("{:.1}", lost_at.as_secs_f64()));
    figure(
        "zone back -> cohort whole (s)",
        format!("{:.1}", to_whole.as_secs_f64()),
    );
    figure(
        "zones.rs, start to end (s)",
        format!("{:.1}", began.elapsed().as_secs_f64()),
    );
}
