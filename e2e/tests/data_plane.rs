//! The real Multigres data plane under the operator, on real nodes: the minimal sample (a managed
//! 3-member etcd, multiadmin, multigateway, multiorch, a pool of PostgreSQL 17 pods with pgctld
//! and multipooler, filesystem backups), its pool written at 2 pods to start from a shard that
//! cannot lose one, pointed at images built from the Multigres and pgBackRest snapshots, and
//! what a user of it sees: SQL through multigateway, roles from the topology and the consensus
//! cohort in the Shard status (and `kubectl multigres status` naming the primary and the
//! streaming replicas), a failover that loses no acknowledged row, a switchover a person asks for, `kubectl drain` of each node of the cell,
//! restart- and reload-class settings, a scale-down at once after a rollout (held until the
//! cohort lets it), a backup in status, and data that survives deleting and recreating the
//! cluster after that scale-down.
//!
//! Every hop is encrypted as a production cluster would have it: clients to the gateway and
//! replication offer or require TLS by default, and the story turns on internal mutual TLS
//! (`spec.internalTLS`), so each of the operator's calls to a multipooler (cohort, reloads,
//! switchover, scheduled backups) presents the data-handler's own client certificate; the
//! webhook turns topology TLS on (`internalTLS.topology`), so every Multigres process and the
//! data-handler reach etcd over TLS with a client certificate.
//!
//! One cluster, one story: each step starts from the state the previous one left, as a user's
//! cluster would, and 2 cores hold one such cluster comfortably, not several. The figures
//! (`[figure] …` lines) are printed, not asserted: `just data-plane-figures` shows them.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Event, PersistentVolumeClaim, Pod, Secret};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use multigres_api::labels;
use multigres_api::v1alpha1::MultigresCluster;
use multigres_api::volumes;
use multigres_e2e::cluster::LocalCluster;
use multigres_e2e::harness::{eventually, fresh_namespace, run_plugin};
use multigres_e2e::load::{Load, LoadReport, assert_kept, create_ledger, figure};
use multigres_e2e::nodes;
use multigres_e2e::prometheus;
use multigres_e2e::reach::{self, Reach};
use multigres_e2e::real::{self, Endpoint, is_ready, operator_installed};
use multigres_e2e::sample::{
    NAME, WAIT, apply_sample, cohort_until, diagnosed, diagnosed_if_slow, pool_pod_uids, pool_pods,
    settled_roles, shard, shard_events, wait_restarted, wait_serving, wait_serving_pools_returned,
    whole,
};
use serde_json::json;

/// The sample's edit: internal mutual TLS on, and the pool written at 2 pods (the default is 3):
/// the story starts from a shard that cannot lose a pod (step 2), grows it to 3 and scales it
/// back to 2, so it says that shape explicitly, as a user opting into it would. Its volumes are
/// small, so step 12 fills one past its thresholds with little data.
fn as_the_story_starts(cluster: &mut serde_json::Value) {
    cluster["spec"]["internalTLS"] = json!({"enabled": true});
    cluster["spec"]["databases"] = json!([{"name": "postgres", "default": true,
        "tablegroups": [{"name": "default", "default": true, "shards": [{"name": "0-inf",
            "spec": {"pools": {"default": {"replicasPerCell": 2,
                "storage": {"size": POOL_SIZE}}}}}]}]}]);
}

/// The pool's data volume size until step 12 raises it.
const POOL_SIZE: &str = "256Mi";

/// The primary the data-handler publishes once it is a pod other than `old`; a wait past
/// [`SLOW`] prints the diagnostics while the change is still recent.
async fn new_primary(client: &Client, namespace: &str, old: &str) -> String {
    let what = format!("a pod other than {old} is primary");
    let wait = eventually(&what, WAIT, || async {
        let roles = shard(client, namespace)
            .await
            .status
            .map(|s| s.pod_roles)
            .unwrap_or_default();
        match roles.iter().find(|(_, r)| r.as_str() == "PRIMARY") {
            Some((pod, _)) if pod != old => Ok(pod.clone()),
            other => Err(format!("primary {other:?}; roles {roles:?}")),
        }
    });
    diagnosed_if_slow(client, namespace, SLOW, wait).await
}

/// A failover or switchover takes seconds (docs/operations.md): one still waiting after this
/// is stuck, or about to be.
const SLOW: Duration = Duration::from_secs(60);

/// A rolling restart of the three pool pods takes 50-125 s (docs/dev/perf-history.md): one
/// still waiting after this is stuck, or about to be.
const SLOW_ROLLOUT: Duration = Duration::from_secs(240);

/// The PersistentVolumes bound to the namespace's claims.
async fn bound_volumes(claims: &Api<PersistentVolumeClaim>) -> BTreeSet<String> {
    claims
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter_map(|c| c.spec.as_ref()?.volume_name.clone())
        .collect()
}

/// Sets the shard's pool size and PostgreSQL parameters in the cluster spec.
async fn set_shard(
    client: &Client,
    namespace: &str,
    replicas: i32,
    postgres_config: &BTreeMap<&str, &str>,
) {
    patch_cluster(client, namespace, &shard_patch(replicas, postgres_config)).await;
}

/// The merge patch of the cluster that sets the shard's pool size and PostgreSQL settings.
fn shard_patch(replicas: i32, postgres_config: &BTreeMap<&str, &str>) -> serde_json::Value {
    json!({"spec": {"databases": [{"name": "postgres", "default": true,
        "tablegroups": [{"name": "default", "default": true, "shards": [{"name": "0-inf",
            "spec": {"pools": {"default": {"replicasPerCell": replicas,
                "storage": {"size": POOL_SIZE}}},
                     "postgresConfig": postgres_config}}]}]}]}})
}

async fn patch_cluster(client: &Client, namespace: &str, patch: &serde_json::Value) {
    Api::<MultigresCluster>::namespaced(client.clone(), namespace)
        .patch(NAME, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap_or_else(|e| panic!("editing the cluster with {patch}: {e}"));
}

/// What a rolling restart of the 3 pool pods did, under a steady load.
struct Rolled {
    /// The pool pods in the order they restarted.
    order: Vec<String>,
    /// The primary before the change.
    primary: String,
    /// Change to every pod restarted and the roles settled.
    took: Duration,
    load: LoadReport,
}

/// Applies `patch` under a steady load (ids from `first_id`) and waits until each of the 3
/// pool pods restarted once and the roles settled; checks that the primary restarted last,
/// after it handed over.
async fn roll_under_load(
    client: &Client,
    namespace: &str,
    gateway: &Endpoint,
    patch: &serde_json::Value,
    first_id: i64,
) -> Rolled {
    let (primary, _) = settled_roles(client, namespace, &gateway.password, 3).await;
    let before = pool_pod_uids(client, namespace).await;
    let load = Load::start(gateway.clone(), first_id);
    let started = Instant::now();
    patch_cluster(client, namespace, patch).await;
    let order = diagnosed_if_slow(
        client,
        namespace,
        SLOW_ROLLOUT,
        wait_restarted(client, namespace, &before),
    )
    .await;
    let (_, roles) = settled_roles(client, namespace, &gateway.password, 3).await;
    let took = started.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let load = load.finish().await;
    println!(
        "restart order {order:?} (primary before: {primary}; roles after: {roles:?}); \
         {} ok, {} failed, first errors {:?}",
        load.ok, load.failed, load.errors
    );
    assert_eq!(order.last(), Some(&primary), "the primary restarts last");
    assert_ne!(
        roles.get(&primary).map(String::as_str),
        Some("PRIMARY"),
        "the old primary handed over: {roles:?}"
    );
    Rolled {
        order,
        primary,
        took,
        load,
    }
}

/// Waits until every container of the cluster's pods that runs a tag of `image`'s repository
/// runs `image` itself, in a Ready pod: gateways, multiorch and multiadmin roll as Deployments,
/// after the pool pods.
async fn runs_image(client: &Client, namespace: &str, image: &str) {
    let repository = image.rsplit_once(':').map_or(image, |(r, _)| r);
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let params = ListParams::default().labels(&format!("{}={NAME}", labels::CLUSTER));
    eventually(&format!("every pod runs {image}"), WAIT, || async {
        let list = pods.list(&params).await.map_err(|e| e.to_string())?;
        let behind: Vec<String> = list
            .items
            .iter()
            .filter(|pod| {
                pod.metadata.deletion_timestamp.is_some() || !is_ready(pod) || {
                    pod.spec.iter().flat_map(|s| &s.containers).any(|c| {
                        let runs = c.image.as_deref().unwrap_or_default();
                        runs.starts_with(&format!("{repository}:")) && runs != image
                    })
                }
            })
            .map(ResourceExt::name_any)
            .collect();
        if behind.is_empty() {
            Ok(())
        } else {
            Err(format!("not yet: {behind:?}"))
        }
    })
    .await;
}

/// The Shard's `SwitchoverRequested` events: message -> how often it was published (repeats
/// of one message fold into one Event's series).
async fn switchover_requests(client: &Client, namespace: &str) -> BTreeMap<String, i32> {
    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    let params =
        ListParams::default().fields("involvedObject.kind=Shard,reason=SwitchoverRequested");
    let mut requests = BTreeMap::new();
    for event in events.list(&params).await.unwrap().items {
        let count = event
            .series
            .and_then(|s| s.count)
            .or(event.count)
            .unwrap_or(1);
        *requests
            .entry(event.message.unwrap_or_default())
            .or_insert(0) += count;
    }
    requests
}

/// The `SwitchoverRequested` messages published since `before` was taken.
async fn new_switchover_requests(
    client: &Client,
    namespace: &str,
    before: &BTreeMap<String, i32>,
) -> Vec<String> {
    switchover_requests(client, namespace)
        .await
        .into_iter()
        .filter(|(message, count)| before.get(message) != Some(count))
        .map(|(message, _)| message)
        .collect()
}

/// How long the drain that the primary's budget refuses keeps trying: kubectl's first refusal
/// comes within seconds (it tries again every 5 s), and the gateway's move off the node is
/// waited for after it (`gateway_on`).
const REFUSED_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a drain that completes may take (it took 23 s on real pods).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(120);

/// What a drain under load did: the acknowledged ids, and kubectl's output or error.
struct Drained {
    acknowledged: Vec<i64>,
    drain: Result<String, String>,
}

/// A `kubectl drain` the test runs.
struct Drain<'a> {
    node: &'a str,
    /// What the node holds, for the figures.
    what: &'a str,
    /// The first id the load writes.
    first_id: i64,
    /// How long kubectl keeps evicting.
    timeout: Duration,
}

/// Runs `kubectl drain` (evicting, as a user runs it) under a steady load, prints the figures
/// and the Deployments moved off a node.
async fn drain_under_load(
    cluster: &LocalCluster,
    client: &Client,
    namespace: &str,
    gateway: &Endpoint,
    Drain {
        node,
        what,
        first_id,
        timeout,
    }: Drain<'_>,
) -> Drained {
    let load = Load::start(gateway.clone(), first_id);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let started = Instant::now();
    let drain = cluster
        .kubectl(&[
            "drain",
            node,
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            &format!("--timeout={}s", timeout.as_secs()),
        ])
        .await
        .map_err(|e| e.to_string());
    let took = started.elapsed();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let report = load.finish().await;
    let what = format!("the drain of {what}");
    // kubectl repeats each refusal every 5 s: its last lines say how the drain ended.
    let ending = |text: &String| {
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(4)..].join("\n")
    };
    println!(
        "{what}, {node}: {} ok, {} failed, first errors {:?}; kubectl: {:?}",
        report.ok,
        report.failed,
        report.errors,
        drain.as_ref().map(ending).map_err(ending)
    );
    figure(&format!("{what} (s)"), format!("{:.1}", took.as_secs_f64()));
    report.figures(&what);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    for deployment in deployments.list(&ListParams::default()).await.unwrap() {
        if let Some(moved) = deployment.annotations().get(labels::DRAINED_NODE) {
            println!("{} moved off {moved}", deployment.name_any());
        }
    }
    Drained {
        acknowledged: report.acknowledged,
        drain,
    }
}

/// Waits until the cluster's only multigateway pod is Ready on `node`.
async fn gateway_on(client: &Client, namespace: &str, node: &str) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let gateways = ListParams::default().labels("app.kubernetes.io/component=multigateway");
    eventually(
        &format!("the multigateway Ready on {node}"),
        WAIT,
        || async {
            let list = pods.list(&gateways).await.map_err(|e| e.to_string())?;
            let at: Vec<(Option<String>, bool)> = list
                .items
                .iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .map(|p| {
                    (
                        p.spec.as_ref().and_then(|s| s.node_name.clone()),
                        is_ready(p),
                    )
                })
                .collect();
            match at.as_slice() {
                [(Some(on), true)] if on == node => Ok(()),
                _ => Err(format!("multigateway pods (node, ready): {at:?}")),
            }
        },
    )
    .await;
}

/// `kubectl uncordon <node>`, then waits until the pods that waited for it are back: a whole
/// cohort of 3 and every etcd member Ready.
async fn uncordon_and_settle(cluster: &LocalCluster, client: &Client, namespace: &str, node: &str) {
    cluster
        .kubectl(&["uncordon", node])
        .await
        .unwrap_or_else(|e| panic!("kubectl uncordon {node}: {e}"));
    let (_, back) = cohort_until(
        client,
        namespace,
        &format!("the pods of {node} back in a whole cohort"),
        |c, h, _| whole(c, 3) && h == ("True", "CohortComplete"),
    )
    .await;
    figure(
        "uncordon -> whole cohort of 3 again (s)",
        format!("{:.1}", back.as_secs_f64()),
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let topo = ListParams::default().labels(&format!("multigres.com/cluster={NAME}"));
    eventually("every etcd member Ready again", WAIT, || async {
        let list = pods.list(&topo).await.map_err(|e| e.to_string())?;
        let waiting: Vec<String> = list
            .items
            .iter()
            .filter(|p| p.name_any().contains("global-topo") && !is_ready(p))
            .map(|p| p.name_any())
            .collect();
        match waiting.is_empty() {
            true => Ok(()),
            false => Err(format!("not Ready: {waiting:?}")),
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_cluster_serves_sql_fails_over_rolls_scales_and_keeps_its_data() {
    let cluster = operator_installed().await;
    let client = cluster.client().unwrap();
    let namespace = fresh_namespace(cluster, "data-plane").await;
    let story = story(cluster, client.clone(), namespace.clone());
    diagnosed(&client, &namespace, story).await;
}

/// The test's steps; a wait that times out or a failed assertion prints the diagnostics first.
/// Step 5e: the application role from `<cluster>-app` alone owns its schema and is no
/// superuser; a declared role appears, logs in, has its password rotated through its Secret
/// (the old one refused, the new one accepted, no pod restarted) and is dropped with
/// `ensure: absent`; no password is in a pool pod's log.
async fn applications_connect_as_themselves(client: &Client, namespace: &str, gateway: &Endpoint) {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let key = |secret: &Secret, key: &str| {
        let data = secret.data.as_ref().and_then(|d| d.get(key)).expect(key);
        String::from_utf8(data.0.clone()).unwrap()
    };
    let app = secrets
        .get(&multigres_api::names::application_role_secret(NAME))
        .await
        .expect("the generated application Secret");
    let (user, password, uri) = (
        key(&app, "username"),
        key(&app, "password"),
        key(&app, "uri"),
    );
    assert_eq!(user, "app");
    assert!(
        uri.starts_with("postgresql://app:") && uri.contains("sslmode=require"),
        "uri"
    );
    let started = Instant::now();
    let who = eventually(
        "the application role logs in through the gateway",
        WAIT,
        || gateway.query_as(&user, &password, "SELECT current_user, current_schema()"),
    )
    .await;
    figure(
        "application role: first login after the cluster served (s)",
        format!("{:.1}", started.elapsed().as_secs_f64()),
    );
    assert_eq!(
        who,
        vec![vec![Some("app".to_owned()), Some("app".to_owned())]]
    );
    let notes = "CREATE TABLE notes (id int PRIMARY KEY, body text); \
                 INSERT INTO notes VALUES (1, 'kept'); SELECT body FROM app.notes";
    let rows = gateway.query_as(&user, &password, notes).await.unwrap();
    assert_eq!(
        rows,
        vec![vec![Some("kept".to_owned())]],
        "its tables land in schema app"
    );
    for superuser_only in ["CREATE ROLE intruder", "SELECT rolpassword FROM pg_authid"] {
        let refused = gateway
            .query_as(&user, &password, superuser_only)
            .await
            .unwrap_err();
        assert!(
            refused.contains("permission denied"),
            "{superuser_only}: {refused}"
        );
    }

    let (first, second) = ("first-Pa55word", "second-Pa55word");
    let secret = |password: &str| {
        serde_json::from_value::<Secret>(json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "reporting-password"},
            "stringData": {"password": password}
        }))
        .unwrap()
    };
    let apply = PatchParams::apply("e2e").force();
    secrets
        .patch("reporting-password", &apply, &Patch::Apply(secret(first)))
        .await
        .unwrap();
    let clusters: Api<MultigresCluster> = Api::namespaced(client.clone(), namespace);
    let declare = |role: serde_json::Value| {
        let clusters = clusters.clone();
        async move {
            let patch = json!({"spec": {"roles": [role]}});
            clusters
                .patch(NAME, &PatchParams::default(), &Patch::Merge(patch))
                .await
                .unwrap();
        }
    };
    declare(json!({"name": "reporting", "inRoles": ["pg_read_all_data"],
        "connectionLimit": 5, "passwordSecret": {"name": "reporting-password"}}))
    .await;
    let declared = Instant::now();
    let read = "SELECT body FROM app.notes";
    eventually(
        "the declared role reads the application's table",
        WAIT,
        || gateway.query_as("reporting", first, read),
    )
    .await;
    figure(
        "declared role: spec edit -> first login (s)",
        format!("{:.1}", declared.elapsed().as_secs_f64()),
    );
    let written = gateway
        .query_as("reporting", first, "INSERT INTO app.notes VALUES (2, 'no')")
        .await
        .unwrap_err();
    assert!(
        written.contains("permission denied"),
        "read-only: {written}"
    );

    let before = pool_pod_uids(client, namespace).await;
    secrets
        .patch("reporting-password", &apply, &Patch::Apply(secret(second)))
        .await
        .unwrap();
    let rotated = Instant::now();
    eventually(
        "the rotated password is accepted, the old one refused",
        WAIT,
        || async {
            gateway.query_as("reporting", second, read).await?;
            match gateway.query_as("reporting", first, read).await {
                Ok(_) => Err("the old password still works".to_owned()),
                Err(_) => Ok(()),
            }
        },
    )
    .await;
    figure(
        "declared role: Secret edit -> new password accepted, old refused (s)",
        format!("{:.1}", rotated.elapsed().as_secs_f64()),
    );
    assert_eq!(
        pool_pod_uids(client, namespace).await,
        before,
        "no pool pod restarted"
    );

    declare(json!({"name": "reporting", "ensure": "absent"})).await;
    eventually("the dropped role is gone", WAIT, || async {
        let exists = gateway
            .query("SELECT count(*) FROM pg_roles WHERE rolname = 'reporting'")
            .await?;
        match exists[0][0].as_deref() {
            Some("0") => Ok(()),
            other => Err(format!("pg_roles still counts {other:?}")),
        }
    })
    .await;
    eventually("Shard status says reporting is dropped", WAIT, || async {
        let roles = shard(client, namespace)
            .await
            .status
            .unwrap_or_default()
            .roles;
        let state = roles
            .iter()
            .find(|r| r.name == "reporting")
            .map(|r| r.state);
        match state {
            Some(multigres_api::v1alpha1::RoleState::Dropped) => Ok(()),
            other => Err(format!("reporting: {other:?} in {roles:?}")),
        }
    })
    .await;
    for pod in pool_pods(client, namespace).await {
        for container in ["multipooler", "postgres", "postgres-exporter"] {
            let logs = Api::<Pod>::namespaced(client.clone(), namespace)
                .logs(
                    &pod.name_any(),
                    &kube::api::LogParams {
                        container: Some(container.to_owned()),
                        ..Default::default()
                    },
                )
                .await
                .unwrap_or_else(|e| panic!("{} {container} logs: {e}", pod.name_any()));
            for secret in [first, second, password.as_str()] {
                assert!(
                    !logs.contains(secret),
                    "{} {container} logs a password",
                    pod.name_any()
                );
            }
        }
    }
    let events = shard_events(client, namespace).await;
    assert!(
        events.iter().all(|e| ![first, second, password.as_str()]
            .iter()
            .any(|p| e.contains(p))),
        "no password in an event"
    );
}

/// Step 5d: one probe pod in a fresh namespace and one labelled as the cluster's own, each
/// dialling every control port of the cluster once. Prints the table both saw.
async fn strangers_are_refused(
    client: &Client,
    cluster: &LocalCluster,
    namespace: &str,
    primary: &str,
) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let ip_of = |component: &'static str| {
        let pods = pods.clone();
        async move {
            let selector = format!(
                "{}={component},{}={NAME}",
                labels::COMPONENT,
                labels::CLUSTER
            );
            let list = pods
                .list(&ListParams::default().labels(&selector))
                .await
                .unwrap();
            let pod = list
                .items
                .iter()
                .find(|p| component != "shard-pool" || p.name_any() == primary)
                .unwrap_or_else(|| panic!("a {component} pod"));
            let ip = pod.status.as_ref().and_then(|s| s.pod_ip.clone()).unwrap();
            (pod.name_any(), ip.parse::<std::net::IpAddr>().unwrap())
        }
    };
    // (what, component, port, a stranger reaches it, the cluster's own pod reaches it)
    let rows: [(&str, &str, u16, Reach, Reach); 11] = [
        (
            "etcd client",
            "global-topo",
            2379,
            Reach::Filtered,
            Reach::Open,
        ),
        (
            "etcd peer",
            "global-topo",
            2380,
            Reach::Filtered,
            Reach::Open,
        ),
        (
            "etcd metrics",
            "global-topo",
            2381,
            Reach::Open,
            Reach::Open,
        ),
        (
            "multipooler gRPC",
            "shard-pool",
            15270,
            Reach::Filtered,
            Reach::Open,
        ),
        (
            "multipooler HTTP",
            "shard-pool",
            15200,
            Reach::Filtered,
            Reach::Open,
        ),
        (
            "PostgreSQL",
            "shard-pool",
            5432,
            Reach::Filtered,
            Reach::Open,
        ),
        // A metrics port: open to every pod while `metricsSources` lists none (TLS, read-only
        // statistics).
        (
            "postgres_exporter",
            "shard-pool",
            9187,
            Reach::Open,
            Reach::Open,
        ),
        // No policy admits it, not even to the cluster's own pods: pgctld listens on loopback
        // and is dialled only from its own pod.
        (
            "pgctld gRPC",
            "shard-pool",
            15470,
            Reach::Filtered,
            Reach::Filtered,
        ),
        (
            "multiorch gRPC",
            "multiorch",
            15370,
            Reach::Filtered,
            Reach::Open,
        ),
        (
            "multiadmin gRPC",
            "multiadmin",
            18070,
            Reach::Filtered,
            Reach::Open,
        ),
        (
            "multigateway PostgreSQL",
            "multigateway",
            5432,
            Reach::Open,
            Reach::Open,
        ),
    ];
    let mut targets = Vec::new();
    for (_, component, port, _, _) in &rows {
        let (_, ip) = ip_of(component).await;
        targets.push(std::net::SocketAddr::new(ip, *port));
    }
    let elsewhere = fresh_namespace(cluster, "stranger").await;
    let stranger = reach::probe(client, &elsewhere, "probe", &BTreeMap::new(), &targets)
        .await
        .unwrap();
    let own_labels = BTreeMap::from([(labels::CLUSTER.to_owned(), NAME.to_owned())]);
    let own = reach::probe(client, namespace, "probe", &own_labels, &targets)
        .await
        .unwrap();
    let mut wrong = Vec::new();
    for ((what, _, _, want_stranger, want_own), target) in rows.iter().zip(&targets) {
        let (got_stranger, got_own) = (&stranger[target], &own[target]);
        println!("{what:<24} {target:<22} stranger: {got_stranger:?}, cluster pod: {got_own:?}");
        if got_stranger != want_stranger || got_own != want_own {
            wrong.push(format!(
                "{what} {target}: stranger {got_stranger:?} (want {want_stranger:?}), \
                 cluster pod {got_own:?} (want {want_own:?})"
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "reachability differs from docs/security.md: {wrong:#?}"
    );
}

/// Runs pgbench through `gateway` with `args` and libpq's `sslmode`; its standard output.
async fn pgbench(gateway: &Endpoint, sslmode: &str, args: &[&str]) -> String {
    let out = tokio::process::Command::new("pgbench")
        .args([
            "-h",
            &gateway.host,
            "-p",
            &gateway.port.to_string(),
            "-U",
            "postgres",
        ])
        .args(args)
        .arg("postgres")
        .env("PGPASSWORD", &gateway.password)
        .env("PGSSLMODE", sslmode)
        .output()
        .await
        .expect("running pgbench");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "pgbench {args:?} (sslmode={sslmode}): {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The `tps = N (without initial connection time)` of a pgbench report.
fn tps(report: &str) -> f64 {
    report
        .lines()
        .find_map(|line| line.strip_prefix("tps = "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no tps in the pgbench report: {report}"))
}

/// The median of a few figures.
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// pgbench select-only (`-S`, 4 clients, 5 s a round) through the gateway, rounds alternating
/// plaintext (`sslmode=disable`) and TLS (`sslmode=require`); prints the medians and their
/// ratio. Tables from the server-side generator (the gateway has no COPY FROM STDIN), scale 1,
/// dropped afterwards.
async fn tls_cost(gateway: &Endpoint) {
    const ROUNDS: usize = 3;
    pgbench(gateway, "require", &["-i", "-I", "dtGp", "-s", "1", "-q"]).await;
    let run = ["-n", "-S", "-c", "4", "-j", "2", "-T", "5"];
    let (mut plain, mut tls) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        plain.push(tps(&pgbench(gateway, "disable", &run).await));
        tls.push(tps(&pgbench(gateway, "require", &run).await));
    }
    println!("pgbench -S tps per round: plaintext {plain:?}, TLS {tls:?}");
    let (plain, tls) = (median(plain), median(tls));
    figure(
        "gateway select-only tps, plaintext (median)",
        format!("{plain:.0}"),
    );
    figure("gateway select-only tps, TLS (median)", format!("{tls:.0}"));
    figure("gateway TLS / plaintext tps", format!("{:.2}", tls / plain));
    pgbench(gateway, "require", &["-i", "-I", "d"]).await;
}

/// One row written through `gateway` as soon as it takes one (`what` names the moment), with an
/// id below `below` (each try takes the next, so a write that landed unacknowledged is never
/// mistaken for this one); the id acknowledged.
async fn write_once(gateway: &Endpoint, what: &str, below: i64) -> i64 {
    let mut id = below;
    eventually(what, WAIT, || {
        id -= 1;
        let sql = format!("INSERT INTO ledger (id) VALUES ({id})");
        async move { gateway.query(&sql).await.map(|_| id) }
    })
    .await
}

/// Pods of the cluster's data plane (everything the operator runs but etcd), by name.
async fn data_plane_pods(client: &Client, namespace: &str) -> Vec<String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let managed = ListParams::default().labels("app.kubernetes.io/managed-by=multigres-operator");
    let mut names: Vec<String> = pods
        .list(&managed)
        .await
        .unwrap()
        .items
        .iter()
        .filter(|p| {
            !p.labels()
                .get(labels::COMPONENT)
                .is_some_and(|c| c.ends_with("-topo"))
        })
        .map(ResourceExt::name_any)
        .collect();
    names.sort();
    names
}

/// Step 10b: hibernates the cluster with the plugin, checks that no data-plane pod is left,
/// that the volumes and the last backup stay, then wakes it and waits until it serves with every
/// `acknowledged` row.
async fn hibernate_and_wake(
    cluster: &'static LocalCluster,
    client: &Client,
    namespace: &str,
    acknowledged: &[i64],
) {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
    let volumes = bound_volumes(&claims).await;
    let backup_before = shard(client, namespace)
        .await
        .status
        .and_then(|s| s.last_backup_time);
    let clusters: Api<MultigresCluster> = Api::namespaced(client.clone(), namespace);
    let started = Instant::now();
    let said = run_plugin(cluster, &["hibernate", NAME, "-n", namespace])
        .await
        .unwrap();
    assert!(said.contains("hibernating"), "{said}");
    eventually(
        "the cluster Hibernated, no data-plane pod left",
        WAIT,
        || async {
            let phase = clusters
                .get(NAME)
                .await
                .map_err(|e| e.to_string())?
                .status
                .and_then(|s| s.phase);
            let left = data_plane_pods(client, namespace).await;
            match (phase, left.is_empty()) {
                (Some(multigres_api::v1alpha1::Phase::Hibernated), true) => Ok(()),
                other => Err(format!("phase {:?}, pods {left:?}", other.0)),
            }
        },
    )
    .await;
    figure(
        "hibernate -> no data-plane pod, phase Hibernated (s)",
        format!("{:.1}", started.elapsed().as_secs_f64()),
    );
    let screen = run_plugin(cluster, &["status", NAME, "-n", namespace])
        .await
        .unwrap();
    assert!(screen.contains("Hibernated"), "{screen}");
    // A while asleep: nothing starts again, and no backup is taken.
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert_eq!(
        data_plane_pods(client, namespace).await,
        Vec::<String>::new()
    );
    assert_eq!(bound_volumes(&claims).await, volumes, "every volume stays");
    let backup_asleep = shard(client, namespace)
        .await
        .status
        .and_then(|s| s.last_backup_time);
    assert_eq!(backup_asleep, backup_before, "no backup while hibernated");

    let woken = Instant::now();
    run_plugin(cluster, &["wake", NAME, "-n", namespace])
        .await
        .unwrap();
    let (_, to_sql) = wait_serving(client, namespace, woken).await;
    figure(
        "wake -> first SELECT 1 answered (s)",
        format!("{:.1}", to_sql.as_secs_f64()),
    );
    assert_eq!(bound_volumes(&claims).await, volumes, "the same volumes");
    let gateway = Endpoint::gateway(client, namespace, NAME).await.unwrap();
    assert_kept(&gateway, acknowledged).await;
    cohort_until(
        client,
        namespace,
        "the woken shard's cohort is whole",
        |cohort, health, _| whole(cohort, 2) && health == ("True", "CohortComplete"),
    )
    .await;
}

async fn story(cluster: &'static LocalCluster, client: Client, namespace: String) {
    // 1. Apply → Available → SQL.
    let sent = apply_sample(&client, &namespace, as_the_story_starts).await;
    let (to_available, to_sql) = wait_serving(&client, &namespace, sent).await;
    figure(
        "apply -> Available (s)",
        format!("{:.1}", to_available.as_secs_f64()),
    );
    figure(
        "apply -> first SELECT 1 answered (s)",
        format!("{:.1}", to_sql.as_secs_f64()),
    );
    let stored = Api::<MultigresCluster>::namespaced(client.clone(), &namespace)
        .get(NAME)
        .await
        .unwrap();
    let tls = stored.spec.internal_tls.unwrap_or_default();
    assert_eq!(
        (tls.enabled, tls.topology),
        (Some(true), Some(true)),
        "gRPC and etcd both mutual TLS"
    );
    let gateway = Endpoint::gateway(&client, &namespace, NAME).await.unwrap();
    let password = gateway.password.clone();
    let mut acknowledged = create_ledger(&gateway).await;

    // 2. Roles from the topology match each PostgreSQL; the cohort of the sample's 2 pods is
    // whole, and the Shard says that losing either pod stops writes under AT_LEAST_2.
    let (_, roles) = settled_roles(&client, &namespace, &password, 2).await;
    println!("roles: {roles:?}");
    cohort_until(
        &client,
        &namespace,
        "2 pods in the cohort, not failure tolerant",
        |cohort, health, tolerance| {
            whole(cohort, 2)
                && health == ("True", "CohortComplete")
                && tolerance == ("False", "OnePodLossStopsWrites")
        },
    )
    .await;

    // 3. What client TLS costs: pgbench's select-only transactions through the gateway,
    // plaintext and TLS side by side (docs/security.md quotes the figures).
    tls_cost(&gateway).await;

    // 4. A reload-class setting: applied by the real multipooler's ReloadConfig, no restart.
    let before = pool_pod_uids(&client, &namespace).await;
    let mut config = BTreeMap::from([("work_mem", "12MB")]);
    set_shard(&client, &namespace, 2, &config).await;
    for pod in pool_pods(&client, &namespace).await {
        let endpoint = Endpoint::pod(&pod, &password).unwrap();
        eventually(
            &format!("{} reloads work_mem", pod.name_any()),
            WAIT,
            || async {
                match endpoint.query("SHOW work_mem").await? {
                    rows if rows == [[Some("12MB".to_owned())]] => Ok(()),
                    rows => Err(format!("work_mem {rows:?}")),
                }
            },
        )
        .await;
    }
    assert_eq!(
        pool_pod_uids(&client, &namespace).await,
        before,
        "no pod restarted"
    );
    for pod in pool_pods(&client, &namespace).await {
        let restarts: i32 = pod
            .status
            .iter()
            .flat_map(|s| s.container_statuses.iter().flatten())
            .map(|c| c.restart_count)
            .sum();
        assert_eq!(restarts, 0, "{} restarted a container", pod.name_any());
    }

    // 5. Scale 2 -> 3: the new replica joins and catches up.
    set_shard(&client, &namespace, 3, &config).await;
    let (_, roles) = settled_roles(&client, &namespace, &password, 3).await;
    let newcomer = pool_pods(&client, &namespace)
        .await
        .into_iter()
        .find(|p| p.name_any().ends_with("-2"))
        .expect("pod -2");
    assert_eq!(roles[&newcomer.name_any()], "REPLICA");
    let endpoint = Endpoint::pod(&newcomer, &password).unwrap();
    eventually("the new replica holds the rows", WAIT, || async {
        match endpoint.query("SELECT count(*) FROM ledger").await? {
            rows if rows == [[Some("100".to_owned())]] => Ok(()),
            rows => Err(format!("count {rows:?}")),
        }
    })
    .await;
    let (_, joined) = cohort_until(
        &client,
        &namespace,
        "3 pods in the cohort, failure tolerant",
        |cohort, health, tolerance| {
            whole(cohort, 3)
                && health == ("True", "CohortComplete")
                && tolerance == ("True", "SurvivesOnePodLoss")
        },
    )
    .await;
    figure(
        "new replica holds the rows -> whole cohort of 3 published (s)",
        format!("{:.1}", joined.as_secs_f64()),
    );

    // 5b. `kubectl multigres status` on this cluster: the primary that PostgreSQL itself says
    // is not in recovery (settled_roles checked each pod) and both replicas streaming.
    let (primary, roles) = settled_roles(&client, &namespace, &password, 3).await;
    // The screen reads the statuses the handlers publish, a cycle behind PostgreSQL at most.
    let screen = eventually(
        "kubectl multigres status shows the settled cohort",
        WAIT,
        || {
            let (namespace, primary, roles) = (&namespace, &primary, &roles);
            async move {
                let screen = run_plugin(cluster, &["status", NAME, "-n", namespace]).await?;
                let row = |pod: &str| -> Vec<String> {
                    screen
                        .lines()
                        .find(|l| l.trim_start().starts_with(&format!("{pod} ")))
                        .map(|l| {
                            l.split_whitespace()
                                .skip(1)
                                .take(4)
                                .map(str::to_owned)
                                .collect()
                        })
                        .unwrap_or_default()
                };
                let settled = row(primary) == ["yes", "PRIMARY", "member", "primary"]
                    && roles
                        .keys()
                        .filter(|pod| *pod != primary)
                        .all(|replica| row(replica) == ["yes", "REPLICA", "member", "streaming"])
                    && screen.contains("cohort 3/3 AT_LEAST_2");
                match settled {
                    true => Ok(screen),
                    false => Err(format!("primary {primary}, screen:\n{screen}")),
                }
            }
        },
    )
    .await;
    println!("kubectl multigres status {NAME}:\n{screen}");

    // 5c. Replication crosses the pod network encrypted: the primary's pg_stat_ssl shows TLS on
    // every WAL sender's connection, and pg_hba refuses a physical replication connection (what
    // a replica opens, `replication=true`) without it.
    let primary_pod = pool_pods(&client, &namespace)
        .await
        .into_iter()
        .find(|p| p.name_any() == primary)
        .expect("the primary's pod");
    let at_primary = Endpoint::pod(&primary_pod, &password).unwrap();
    let senders = at_primary
        .query(
            "SELECT r.application_name, s.ssl, s.version FROM pg_stat_replication r \
             JOIN pg_stat_ssl s ON s.pid = r.pid ORDER BY 1",
        )
        .await
        .unwrap();
    println!("WAL senders on {primary} (application, ssl, version): {senders:?}");
    assert_eq!(senders.len(), 2, "both replicas stream: {senders:?}");
    assert!(
        senders.iter().all(|row| row[1].as_deref() == Some("t")),
        "every replica streams over TLS: {senders:?}"
    );
    let replication = |sslmode: &'static str| {
        let (host, password) = (at_primary.host.clone(), password.clone());
        async move {
            tokio::process::Command::new("psql")
                .arg(format!(
                    "host={host} user=postgres dbname=postgres replication=true \
                     sslmode={sslmode} connect_timeout=5"
                ))
                .args(["-XAtc", "IDENTIFY_SYSTEM"])
                .env("PGPASSWORD", password)
                .output()
                .await
                .unwrap()
        }
    };
    let plain = replication("disable").await;
    let refusal = String::from_utf8_lossy(&plain.stderr).trim().to_owned();
    assert!(
        !plain.status.success() && refusal.contains("no pg_hba.conf entry"),
        "a plaintext replication connection is refused: {refusal}"
    );
    println!("plaintext replication connection: {refusal}");
    assert!(
        replication("require").await.status.success(),
        "a replication connection over TLS is admitted"
    );

    // 5d. Nothing answers strangers: the network enforces the cluster's NetworkPolicies (the
    // real-node tier runs kube-network-policies), so a pod of another namespace reaches the
    // gateway and etcd's metrics only; the same probe as one of the cluster's pods reaches
    // every internal port, and pgctld's gRPC no one (it listens on loopback, and no policy
    // admits its port).
    strangers_are_refused(&client, cluster, &namespace, &primary).await;

    // 5e. Applications connect as themselves: the generated application role, and a declared
    // role whose password is rotated by editing its Secret and which is dropped on request.
    applications_connect_as_themselves(&client, &namespace, &gateway).await;

    // 6. Delete the primary under a steady load: a replica is promoted, writes resume, and no
    // acknowledged row is lost. The newcomer is in the cohort (step 5 waited until the Shard
    // said so): until multiorch adds it, the cohort is the two older pods, and without the
    // deleted one no majority of it is left to elect a new primary, so writes wait until the
    // deleted pod is back (45-60 s; docs/dev/reliability-history.md).
    let load = Load::start(gateway.clone(), 1);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let deleted_at = Instant::now();
    pods.delete(&primary, &DeleteParams::default())
        .await
        .unwrap();
    let promoted = new_primary(&client, &namespace, &primary).await;
    let to_promoted = deleted_at.elapsed();
    eventually("writes resume through the gateway", WAIT, || async {
        gateway
            .query("INSERT INTO ledger (id) VALUES (-1000)")
            .await
            .map(|_| ())
    })
    .await;
    acknowledged.push(-1000);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let report = load.finish().await;
    let first_after = report
        .successes
        .iter()
        .find(|t| **t > deleted_at + Duration::from_millis(500))
        .map(|t| t.duration_since(deleted_at));
    println!(
        "failover {primary} -> {promoted}: {} ok, {} failed, first errors {:?}",
        report.ok, report.failed, report.errors
    );
    figure(
        "primary deleted -> new primary in Shard status (s)",
        format!("{:.1}", to_promoted.as_secs_f64()),
    );
    figure(
        "primary deleted -> first statement accepted again (s)",
        first_after.map_or("none".to_owned(), |d| format!("{:.1}", d.as_secs_f64())),
    );
    report.figures("the failover");
    acknowledged.extend(&report.acknowledged);
    assert_kept(&gateway, &acknowledged).await;
    settled_roles(&client, &namespace, &password, 3).await;
    // A failover passes through "no primary" (the deleted pod's record goes first), then a
    // new one is elected; a switchover moves it directly.
    let gone = format!("NoPrimary: pod {primary} is no longer the primary");
    let elected = format!("PrimaryElected: pod {promoted} is the primary");
    let moved = format!("PrimaryChanged: the primary moved from pod {primary} to pod {promoted}");
    let events = eventually("events tell of the new primary", WAIT, || async {
        let events = shard_events(&client, &namespace).await;
        let told = |text: &str| events.iter().any(|e| e.contains(text));
        if told(&moved) || (told(&gone) && told(&elected)) {
            Ok(events)
        } else {
            Err(events.join("\n  "))
        }
    })
    .await;
    println!("Shard events:\n  {}", events.join("\n  "));

    // 7. A person asks for a switchover under a steady load (annotation
    // multigres.com/switchover on the primary pod): it hands over under the rollout's gates,
    // and the annotation is removed once another pod is the primary.
    let (primary, _) = settled_roles(&client, &namespace, &password, 3).await;
    cohort_until(
        &client,
        &namespace,
        "a whole cohort before the switchover",
        |c, h, _| whole(c, 3) && h == ("True", "CohortComplete"),
    )
    .await;
    let load = Load::start(gateway.clone(), 500_001);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let asked_at = Instant::now();
    let ask = json!({"metadata": {"annotations": {"multigres.com/switchover": "data-plane"}}});
    pods.patch(&primary, &PatchParams::default(), &Patch::Merge(&ask))
        .await
        .unwrap();
    let promoted = new_primary(&client, &namespace, &primary).await;
    let to_moved = asked_at.elapsed();
    eventually("the answered request is removed", WAIT, || async {
        let pod = pods.get(&primary).await.map_err(|e| e.to_string())?;
        match pod.annotations().get("multigres.com/switchover") {
            None => Ok(()),
            Some(value) => Err(format!("still asked: {value}")),
        }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let report = load.finish().await;
    println!(
        "switchover {primary} -> {promoted}: {} ok, {} failed, first errors {:?}",
        report.ok, report.failed, report.errors
    );
    figure(
        "switchover asked -> new primary in Shard status (s)",
        format!("{:.1}", to_moved.as_secs_f64()),
    );
    report.figures("the asked-for switchover");
    acknowledged.extend(&report.acknowledged);
    assert_kept(&gateway, &acknowledged).await;

    // 7b. `kubectl drain` under a steady load, as a user runs it, of each of zone-a's two
    // nodes. The sample's filesystem backups live on one ReadWriteOnce volume that every pool
    // pod mounts, so the pool runs on that volume's node: draining it, the primary has no
    // replica elsewhere to hand over to, and its budget refuses the eviction (the database
    // stays up; the Shard says why); one replica may go (it waits Pending for its volume's
    // node), no second; the only multigateway moves to the other node before its old pod
    // stops. Draining the other node then completes: the gateway moves back.
    cohort_until(
        &client,
        &namespace,
        "a whole, failure-tolerant cohort before the drains",
        |c, h, t| whole(c, 3) && h == ("True", "CohortComplete") && t.0 == "True",
    )
    .await;
    let nodes: BTreeSet<String> = pool_pods(&client, &namespace)
        .await
        .iter()
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect();
    let pool_node = match Vec::from_iter(nodes).as_slice() {
        [node] => node.clone(),
        other => panic!("the pool pods share the backup volume's node, not {other:?}"),
    };
    let other_node = cluster
        .real_nodes()
        .into_iter()
        .find(|n| n.zone == "zone-a" && n.name != pool_node)
        .expect("a second node in zone-a")
        .name;
    let (primary, _) = settled_roles(&client, &namespace, &password, 3).await;
    let refused = drain_under_load(
        cluster,
        &client,
        &namespace,
        &gateway,
        Drain {
            node: &pool_node,
            what: "the pool's node",
            first_id: 800_001,
            timeout: REFUSED_DRAIN_TIMEOUT,
        },
    )
    .await;
    acknowledged.extend(&refused.acknowledged);
    let message = refused
        .drain
        .expect_err("the primary with no replica elsewhere is not evicted");
    assert!(message.contains("disruption budget"), "{message}");
    let status = shard(&client, &namespace).await.status.unwrap_or_default();
    let said = |type_: &str| {
        status
            .conditions
            .iter()
            .find(|c| c.type_ == type_)
            .map(|c| (c.reason.clone(), c.message.clone()))
    };
    println!(
        "Drain: {:?}; Switchover: {:?}",
        said("Drain"),
        said("Switchover")
    );
    assert_eq!(
        said("Drain").map(|(reason, _)| reason).as_deref(),
        Some("PrimaryHandingOver")
    );
    let (_, waiting) = said("Switchover").expect("a Switchover condition");
    assert!(waiting.contains("not cordoned"), "{waiting}");
    let roles = status.pod_roles.clone();
    assert_eq!(
        roles.get(&primary).map(String::as_str),
        Some("PRIMARY"),
        "the primary stayed: {roles:?}"
    );
    gateway_on(&client, &namespace, &other_node).await;
    assert_kept(&gateway, &acknowledged).await;
    uncordon_and_settle(cluster, &client, &namespace, &pool_node).await;
    let moved = drain_under_load(
        cluster,
        &client,
        &namespace,
        &gateway,
        Drain {
            node: &other_node,
            what: "the gateway's node",
            first_id: 900_001,
            timeout: DRAIN_TIMEOUT,
        },
    )
    .await;
    acknowledged.extend(&moved.acknowledged);
    moved
        .drain
        .unwrap_or_else(|e| panic!("kubectl drain {other_node}: {e}"));
    gateway_on(&client, &namespace, &pool_node).await;
    assert_kept(&gateway, &acknowledged).await;
    uncordon_and_settle(cluster, &client, &namespace, &other_node).await;

    // 8. A restart-class setting: replicas restart first, the primary last, under load, and only
    // after it has handed over (the resource-handler asks, the data-handler has its multipooler
    // resign, multiorch promotes a replica).
    let asked_before = switchover_requests(&client, &namespace).await;
    config.insert("max_connections", "80");
    let rolled = roll_under_load(
        &client,
        &namespace,
        &gateway,
        &shard_patch(3, &config),
        1_000_001,
    )
    .await;
    let asked = new_switchover_requests(&client, &namespace, &asked_before).await;
    let expected = format!("asked the primary {} to hand over", rolled.primary);
    assert!(
        asked.iter().any(|e| e.contains(&expected)),
        "the rollout asked {} to hand over before its restart: {asked:?}",
        rolled.primary
    );
    figure(
        "restart-class rollout of 3 pods (s)",
        format!("{:.1}", rolled.took.as_secs_f64()),
    );
    rolled.load.figures("the rolling restart");
    for pod in pool_pods(&client, &namespace).await {
        let endpoint = Endpoint::pod(&pod, &password).unwrap();
        let rows = endpoint.query("SHOW max_connections").await.unwrap();
        assert_eq!(rows, [[Some("80".to_owned())]], "{}", pod.name_any());
    }
    acknowledged.extend(&rolled.load.acknowledged);
    assert_kept(&gateway, &acknowledged).await;

    // 8b. A data-plane image upgrade under a steady load, as a release brings one (a second
    // tag of the same builds, `nodes::next_tag`): the Multigres image of the shard's components
    // (multipooler, multiorch) and of multiadmin, and the PostgreSQL image (pgctld's), in one
    // edit. One cohort-gated rollout: replicas first, the primary last after it handed over,
    // and every pod runs the new images at the end. That each image alone changes exactly its
    // own container of the pool pods is checked in the fast tier (resource-handler's
    // `each_data_plane_image_changes_only_its_own_container_of_the_pool_pods`), and a
    // multipooler image alone rolls the pool in the kwok tier (`resource_handler.rs`). Then the
    // gateways' Multigres image: a Deployment rollout, no pool pod restarts; a gateway that
    // stops ends the client connections it holds (the statement in flight on each fails once,
    // and the client reconnects to the new one). Every acknowledged row stays.
    let multigres = nodes::next_tag(&real::image(real::MULTIGRES_IMAGE_PREFIX));
    let postgres = nodes::next_tag(&real::image(real::PGCTLD_IMAGE_PREFIX));
    let what =
        "the Multigres image of multipooler, multiorch and multiadmin and the PostgreSQL image";
    let patch = json!({"spec": {"images": {"multiorch": multigres, "multipooler": multigres,
        "multiadmin": multigres, "postgres": postgres}}});
    let rolled = roll_under_load(&client, &namespace, &gateway, &patch, 3_000_001).await;
    figure(
        &format!("{what} changed -> 3 pool pods restarted, roles settled (s)"),
        format!("{:.1}", rolled.took.as_secs_f64()),
    );
    rolled.load.figures(&format!("the change of {what}"));
    println!("{what}: restart order {:?}", rolled.order);
    acknowledged.extend(&rolled.load.acknowledged);
    assert_kept(&gateway, &acknowledged).await;
    runs_image(&client, &namespace, &postgres).await;
    let before = pool_pod_uids(&client, &namespace).await;
    let load = Load::start(gateway.clone(), 5_000_001);
    let started = Instant::now();
    patch_cluster(
        &client,
        &namespace,
        &json!({"spec": {"images": {"multigateway": multigres}}}),
    )
    .await;
    runs_image(&client, &namespace, &multigres).await;
    let took = started.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let report = load.finish().await;
    println!(
        "the gateways' Multigres image: {} ok, {} failed, first errors {:?}",
        report.ok, report.failed, report.errors
    );
    assert_eq!(
        pool_pod_uids(&client, &namespace).await,
        before,
        "no pool pod restarted"
    );
    figure(
        "the gateways' Multigres image changed -> every gateway runs it (s)",
        format!("{:.1}", took.as_secs_f64()),
    );
    report.figures("the change of the gateways' Multigres image");
    acknowledged.extend(&report.acknowledged);
    assert_kept(&gateway, &acknowledged).await;
    let roles = settled_roles(&client, &namespace, &password, 3).await.1;

    // 9. Scale 3 -> 2 at once after the rollout, under a steady load: the pod restarted last
    // rejoins the cohort only when multiorch re-adds it, and the operator holds the scale-down
    // until every pod that stays takes part in commits; the removed pod then leaves the
    // cohort. The primary is never the pod removed, and the volume stays (whenScaled: Retain).
    // Where the primary is on -2, the operator asks it to hand over first; elsewhere nobody is
    // asked. (Multiorch cannot be steered onto -2, so the hand-over path is asserted
    // deterministically in the fast tier, resource_handler.rs; the same switchover ran here in
    // steps 7 and 8.)
    let before = roles
        .iter()
        .find(|(_, role)| role.as_str() == "PRIMARY")
        .map(|(pod, _)| pod.clone())
        .expect("a primary after the rollout");
    let asked_before = switchover_requests(&client, &namespace).await;
    let load = Load::start(gateway.clone(), 2_000_001);
    let started = Instant::now();
    set_shard(&client, &namespace, 2, &config).await;
    let (primary, roles) = settled_roles(&client, &namespace, &password, 2).await;
    assert!(
        !primary.ends_with("-2"),
        "the primary is not the removed pod: {roles:?}"
    );
    let asked = new_switchover_requests(&client, &namespace, &asked_before).await;
    if before.ends_with("-2") {
        let expected = format!("asked the primary {before} to hand over");
        assert!(
            asked.iter().any(|e| e.contains(&expected)),
            "the scale-down asked {before} to hand over first: {asked:?}"
        );
    } else {
        assert_eq!(primary, before, "removing a replica keeps the primary");
        assert!(asked.is_empty(), "no hand-over for a replica: {asked:?}");
    }
    println!("scale 3 -> 2 with the primary on {before}: primary now {primary}, asked {asked:?}");
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &namespace);
    let names: Vec<String> = claims
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    assert!(
        names.iter().any(|n| n.ends_with("-zone-a-2")),
        "the scaled-down pod's volume is kept: {names:?}"
    );
    cohort_until(
        &client,
        &namespace,
        "the removed pod left the cohort",
        |cohort, health, _| whole(cohort, 2) && health == ("True", "CohortComplete"),
    )
    .await;
    let scale_down = started.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let report = load.finish().await;
    println!(
        "scale-down: {} ok, {} failed, first errors {:?}",
        report.ok, report.failed, report.errors
    );
    figure(
        "scale 3 -> 2 after the rollout -> removed pod out of the cohort (s)",
        format!("{:.1}", scale_down.as_secs_f64()),
    );
    report.figures("the scale-down");
    acknowledged.extend(&report.acknowledged);
    assert_kept(&gateway, &acknowledged).await;

    // 10. The first backup (taken at bootstrap) shows in the Shard status.
    let backup = eventually("a backup in the Shard status", WAIT, || async {
        let status = shard(&client, &namespace).await.status.unwrap_or_default();
        match (&status.last_backup_time, &status.last_backup_type) {
            (Some(at), Some(kind)) => Ok(format!("{kind:?} at {}", at.0)),
            _ => Err(format!("conditions {:?}", status.conditions)),
        }
    })
    .await;
    println!("last backup: {backup}");

    // 10b. Hibernate (`kubectl multigres hibernate`): every data-plane pod stops at once, the
    // volumes stay, no backup runs, and the cluster says Hibernated. Wake: the pods start on the
    // same volumes, multiorch elects a primary, and every acknowledged row is there.
    hibernate_and_wake(cluster, &client, &namespace, &acknowledged).await;
    let gateway = Endpoint::gateway(&client, &namespace, NAME).await.unwrap();
    acknowledged.push(write_once(&gateway, "a write after waking", -1000).await);
    let stored = assert_kept(&gateway, &acknowledged).await;

    // 11. Delete the cluster (Retain) after the scale-down, recreate it: the same volumes, a
    // primary elected from the cohort the scale-down left, the same rows.
    let volumes_before: BTreeSet<String> = bound_volumes(&claims).await;
    let clusters: Api<MultigresCluster> = Api::namespaced(client.clone(), &namespace);
    clusters
        .delete(NAME, &DeleteParams::default())
        .await
        .unwrap();
    eventually("the cluster and its pods are gone", WAIT, || async {
        let left = pool_pods(&client, &namespace).await.len();
        let cluster = clusters.get_opt(NAME).await.map_err(|e| e.to_string())?;
        if left == 0 && cluster.is_none() {
            Ok(())
        } else {
            Err(format!("{left} pool pods, cluster {}", cluster.is_some()))
        }
    })
    .await;
    let sent = apply_sample(&client, &namespace, as_the_story_starts).await;
    set_shard(&client, &namespace, 2, &config).await;
    let (_, to_sql) = wait_serving_pools_returned(&client, &namespace, sent).await;
    figure(
        "recreate -> first SELECT 1 answered (s)",
        format!("{:.1}", to_sql.as_secs_f64()),
    );
    let volumes_after: BTreeSet<String> = bound_volumes(&claims).await;
    assert!(
        volumes_before.is_subset(&volumes_after),
        "the same volumes are bound again: before {volumes_before:?}, after {volumes_after:?}"
    );
    // The records the deleted pods left behind, marked shut down when the data-handler read
    // them after the new pods were created (printed, not asserted: a pooler that registers
    // first rewrites its own).
    let retired: Vec<String> = shard_events(&client, &namespace)
        .await
        .into_iter()
        .filter(|e| e.contains("StalePoolerRecord"))
        .collect();
    println!("stale pooler records retired after the re-creation: {retired:?}");
    let gateway = Endpoint::gateway(&client, &namespace, NAME).await.unwrap();
    assert_eq!(assert_kept(&gateway, &acknowledged).await, stored);
    cohort_until(
        &client,
        &namespace,
        "the recreated shard's cohort is whole",
        |cohort, health, _| whole(cohort, 2) && health == ("True", "CohortComplete"),
    )
    .await;

    acknowledged.push(write_once(&gateway, "a write after the re-creation", -2000).await);
    assert_kept(&gateway, &acknowledged).await;

    // 12. Volumes before they fill, under a steady load: each pool pod's usage in the Shard
    // status and in Prometheus; a larger storage.size grows the claims online; autoGrow grows a
    // claim past its threshold by its step up to its ceiling, and at the ceiling grows nothing
    // and says so, while the disk alert fires before the volume is full.
    let load = Load::start(gateway.clone(), 9_000_001);
    volumes_before_they_fill(&client, &namespace, &gateway, &config).await;
    let report = load.finish().await;
    println!(
        "volumes under load: {} ok, {} failed, failed statements {:?}",
        report.ok, report.failed, report.errors
    );
    report.figures("the volume growth");
    assert_eq!(report.failed, 0, "no statement failed: {:?}", report.errors);
    acknowledged.extend(&report.acknowledged);
    assert_kept(&gateway, &acknowledged).await;
}

/// Rounds `bytes` up to whole 32 MiB.
fn round_up_32mi(bytes: i64) -> i64 {
    const STEP: i64 = 32 << 20;
    (bytes + STEP - 1) / STEP * STEP
}

/// What PostgreSQL on `endpoint` holds on its data volume: data plus WAL bytes.
async fn used_on(endpoint: &Endpoint) -> i64 {
    let rows = endpoint.query(volumes::USAGE_SQL).await.unwrap();
    let line = rows[0][0].clone().unwrap_or_default();
    let (data, wal) = line.split_once(' ').expect("two fields");
    data.parse::<i64>().unwrap() + wal.parse::<i64>().unwrap()
}

/// What PostgreSQL holds on each pool pod's data volume (see [`used_on`]), by pod.
async fn used_by_pod(pods: &[(String, Endpoint)]) -> BTreeMap<String, i64> {
    let mut used = BTreeMap::new();
    for (pod, endpoint) in pods {
        used.insert(pod.clone(), used_on(endpoint).await);
    }
    used
}

/// Inserts rows of 1 KB through the gateway, 10 MB a statement, until PostgreSQL on some pool
/// pod of `pods` holds at least `target` bytes (a replica keeps WAL longer than its primary, so
/// the fullest is not always the primary).
async fn fill(gateway: &Endpoint, pods: &[(String, Endpoint)], target: i64) {
    gateway
        .query("CREATE TABLE IF NOT EXISTS fill (id bigint, pad text)")
        .await
        .unwrap();
    for statements in 0..80 {
        let used = used_by_pod(pods).await;
        if used.values().any(|u| *u >= target) {
            if statements > 0 {
                let mib: BTreeMap<&String, i64> = used.iter().map(|(p, u)| (p, u >> 20)).collect();
                println!("filled to {mib:?} MiB in {statements} statements");
            }
            return;
        }
        gateway
            .query("INSERT INTO fill SELECT g, repeat('x', 1000) FROM generate_series(1, 10000) g")
            .await
            .unwrap_or_else(|e| panic!("filling: {e}"));
    }
    panic!(
        "80 statements did not fill a pool pod to {} MiB",
        target >> 20
    );
}

/// The Shard's `status.volumes` and `VolumeAutoGrow`, for a failure message.
fn published_usage(shard: &multigres_api::v1alpha1::Shard) -> String {
    let status = shard.status.clone().unwrap_or_default();
    let usage: Vec<String> = status
        .volumes
        .iter()
        .map(|v| {
            format!(
                "{} {} MiB of {:?} MiB at {}",
                v.pod,
                v.used_bytes() >> 20,
                v.capacity_bytes.map(|c| c >> 20),
                v.measured_at.0
            )
        })
        .collect();
    let auto = status
        .conditions
        .iter()
        .find(|c| c.type_ == "VolumeAutoGrow");
    format!("status.volumes {usage:?}, VolumeAutoGrow {auto:?}")
}

/// Keeps the fullest pool pod of `pods` at `target` bytes or more, topping it up (a checkpoint
/// may recycle WAL), until `done` answers, within [`WAIT`]; what it answered.
async fn fill_until<T, F, Fut>(
    gateway: &Endpoint,
    pods: &[(String, Endpoint)],
    target: i64,
    what: &str,
    done: F,
) -> T
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + WAIT;
    loop {
        fill(gateway, pods, target).await;
        match done().await {
            Ok(answer) => return answer,
            Err(why) if Instant::now() > deadline => {
                panic!("{what}: not within {WAIT:?} of filling: {why}")
            }
            Err(_) => tokio::time::sleep(Duration::from_secs(5)).await,
        }
    }
}

/// The data claims of the pool pods: name -> (request, capacity), in bytes.
async fn claim_sizes(client: &Client, namespace: &str) -> BTreeMap<String, (i64, i64)> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
    let bytes = |q: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>| {
        q.and_then(|q| volumes::parse_bytes(&q.0))
            .and_then(|b| i64::try_from(b).ok())
            .unwrap_or_default()
    };
    claims
        .list(&ListParams::default().labels(&format!(
            "{}={}",
            labels::COMPONENT,
            labels::Component::Pool.as_str()
        )))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|c| c.name_any().starts_with("data-"))
        .map(|c| {
            let request = bytes(
                c.spec
                    .as_ref()
                    .and_then(|s| s.resources.as_ref())
                    .and_then(|r| r.requests.as_ref())
                    .and_then(|r| r.get("storage")),
            );
            let capacity = bytes(
                c.status
                    .as_ref()
                    .and_then(|s| s.capacity.as_ref())
                    .and_then(|r| r.get("storage")),
            );
            (c.name_any(), (request, capacity))
        })
        .collect()
}

/// The Shard's condition `type_` as (reason, message), if set.
async fn shard_condition(
    client: &Client,
    namespace: &str,
    type_: &str,
) -> Option<(String, String)> {
    shard(client, namespace)
        .await
        .status?
        .conditions
        .into_iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.reason, c.message))
}

/// The `MultigresVolumeFillingUp` alert of `namespace`, if it fires.
async fn filling_up(
    prometheus: &prometheus::Prometheus,
    namespace: &str,
) -> Result<Option<serde_json::Value>, String> {
    Ok(prometheus.alerts().await?.into_iter().find(|a| {
        a["labels"]["alertname"] == "MultigresVolumeFillingUp"
            && a["labels"]["namespace"] == namespace
            && a["state"] == "firing"
    }))
}

/// Step 12 (see the story): usage published, storage.size raised, autoGrow to its ceiling and
/// the alert, with the steady load the caller runs.
async fn volumes_before_they_fill(
    client: &Client,
    namespace: &str,
    gateway: &Endpoint,
    config: &BTreeMap<&str, &str>,
) {
    let prometheus = prometheus::server().await;
    let pods: Vec<String> = pool_pods(client, namespace)
        .await
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    let published = eventually(
        "every pool pod's volume in the Shard status",
        WAIT,
        || async {
            let volumes = shard(client, namespace)
                .await
                .status
                .map(|s| s.volumes)
                .unwrap_or_default();
            let all = pods.iter().all(|p| {
                volumes
                    .iter()
                    .any(|v| &v.pod == p && v.capacity_bytes.is_some() && v.data_bytes > 0)
            });
            if all {
                Ok(volumes)
            } else {
                Err(format!("{volumes:?}"))
            }
        },
    )
    .await;
    for v in &published {
        println!(
            "status.volumes: {} data {} MiB, WAL {} MiB, capacity {:?} MiB, at {}",
            v.pod,
            v.data_bytes >> 20,
            v.wal_bytes >> 20,
            v.capacity_bytes.map(|c| c >> 20),
            v.measured_at.0
        );
    }
    let in_prometheus = format!(
        "multigres_operator_shard_volume_used_bytes{{namespace=\"{namespace}\"}} \
         or multigres_operator_shard_volume_capacity_bytes{{namespace=\"{namespace}\"}}"
    );
    let series = eventually("the volume gauges in Prometheus", WAIT, || async {
        let series = prometheus.query(&in_prometheus).await?;
        // data, wal and capacity of each pod
        if series.len() >= 3 * pods.len() {
            Ok(series.len())
        } else {
            Err(format!("{series:?}"))
        }
    })
    .await;
    println!("volume series in Prometheus: {series}");

    // A larger storage.size, with autoGrow: +25 % past 80 %, up to a ceiling one step above.
    let used = published.iter().map(|v| v.used_bytes()).max().unwrap();
    let capacity = published
        .iter()
        .filter_map(|v| v.capacity_bytes)
        .max()
        .unwrap();
    let size = round_up_32mi((capacity + (64 << 20)).max(used * 100 / 55));
    let ceiling = size + size / 4;
    let (size_mi, ceiling_mi) = (format!("{}Mi", size >> 20), format!("{}Mi", ceiling >> 20));
    println!(
        "usage {} MiB of {} MiB: storage.size {size_mi}, ceiling {ceiling_mi}",
        used >> 20,
        capacity >> 20
    );
    let raised = Instant::now();
    patch_cluster(
        client,
        namespace,
        &json!({"spec": {"databases": [{"name": "postgres", "default": true,
            "tablegroups": [{"name": "default", "default": true, "shards": [{"name": "0-inf",
                "spec": {"pools": {"default": {"replicasPerCell": 2,
                    "storage": {"size": size_mi},
                    "autoGrow": {"threshold": 80, "step": "25%", "ceiling": ceiling_mi}}},
                         "postgresConfig": config}}]}]}]}}),
    )
    .await;
    eventually("every claim grown to storage.size", WAIT, || async {
        let sizes = claim_sizes(client, namespace).await;
        match sizes
            .values()
            .all(|(request, given)| *request == size && *given == size)
        {
            true => Ok(()),
            false => Err(format!("{sizes:?}")),
        }
    })
    .await;
    figure(
        "storage.size raised -> every claim's capacity grown (s)",
        format!("{:.1}", raised.elapsed().as_secs_f64()),
    );
    // What kube-controller-manager made of it: a class it has no plugin for is left to an
    // external resizer (the tier's provisioner), with an ExternalExpanding event.
    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    let params = ListParams::default().fields("involvedObject.kind=PersistentVolumeClaim");
    for event in events.list(&params).await.unwrap().items {
        println!(
            "claim event {} {}: {}",
            event.involved_object.name.unwrap_or_default(),
            event.reason.unwrap_or_default(),
            event.message.unwrap_or_default()
        );
    }

    // Past the threshold: the claim grows by the step, which reaches the ceiling.
    let at_pods: Vec<(String, Endpoint)> = pool_pods(client, namespace)
        .await
        .iter()
        .map(|p| (p.name_any(), Endpoint::pod(p, &gateway.password).unwrap()))
        .collect();
    let crossing = Instant::now();
    let claim = fill_until(
        gateway,
        &at_pods,
        size * 85 / 100,
        "a claim auto-grown by the step",
        || async {
            let sizes = claim_sizes(client, namespace).await;
            let shard = shard(client, namespace).await;
            sizes
                .iter()
                .find(|(_, (request, given))| *request == ceiling && *given == ceiling)
                .map(|(claim, _)| claim.clone())
                .ok_or_else(|| format!("claims {sizes:?}, {}", published_usage(&shard)))
        },
    )
    .await;
    figure(
        "first fill past 80 % -> claim auto-grown (s)",
        format!("{:.1}", crossing.elapsed().as_secs_f64()),
    );
    let grown: Vec<String> = shard_events(client, namespace)
        .await
        .into_iter()
        .filter(|e| e.contains("VolumeAutoGrown"))
        .collect();
    println!("auto-grow events: {grown:?}");
    assert!(
        grown
            .iter()
            .any(|e| e.contains(&claim) && e.contains(&ceiling_mi)),
        "{grown:?}"
    );

    // Past the threshold at the ceiling: nothing grows, the Shard says so, and the disk alert
    // fires while the volume still has room (quiet first: the growth made room).
    eventually(
        "MultigresVolumeFillingUp quiet after the growth",
        WAIT,
        || async {
            match filling_up(prometheus, namespace).await? {
                None => Ok(()),
                Some(alert) => Err(format!("firing: {}", alert["annotations"]["summary"])),
            }
        },
    )
    .await;
    let at_ceiling = Instant::now();
    let target = ceiling * 88 / 100;
    let (reason, message) = fill_until(gateway, &at_pods, target, "AtCeiling", || async {
        match shard_condition(client, namespace, "VolumeAutoGrow").await {
            Some((reason, message)) if reason == "AtCeiling" => Ok((reason, message)),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    println!("VolumeAutoGrow: {reason}: {message}");
    let alert = fill_until(gateway, &at_pods, target, "the alert", || async {
        filling_up(prometheus, namespace)
            .await?
            .ok_or_else(|| "not firing".to_owned())
    })
    .await;
    println!(
        "alert firing: {} ({})",
        alert["annotations"]["summary"], alert["labels"]["pod"]
    );
    figure(
        "second fill past 80 % at the ceiling -> alert firing (s)",
        format!("{:.1}", at_ceiling.elapsed().as_secs_f64()),
    );
    let sizes = claim_sizes(client, namespace).await;
    println!("claims (request, capacity) at the end: {sizes:?}");
    assert!(
        sizes
            .values()
            .all(|(request, given)| *request <= ceiling && *given <= ceiling),
        "never past the ceiling: {sizes:?}"
    );
    assert_eq!(
        sizes[&claim],
        (ceiling, ceiling),
        "at the ceiling, not past it"
    );
    let used = used_by_pod(&at_pods).await;
    println!("used when the alert fired, bytes: {used:?} of {ceiling}");
    assert!(
        used.values().all(|u| *u < ceiling),
        "the alert fired before any volume was full: {used:?} of {ceiling}"
    );
    gateway.query("DROP TABLE fill").await.unwrap();
}
