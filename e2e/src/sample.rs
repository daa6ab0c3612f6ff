//! The minimal sample (`deploy/samples/minimal.yaml`) on real nodes, as the real-node test files
//! drive it: applied with the local images, served once Available, and its one shard's pool
//! pods, roles and consensus cohort as the Shard status publishes them, each checked against
//! what the pods themselves say.

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use futures::FutureExt;
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{ListParams, LogParams};
use kube::{Api, Client, ResourceExt};
use multigres_api::labels;
use multigres_api::v1alpha1::{CohortStatus, MultigresCluster, Shard};
use serde_json::Value;

use crate::harness::{eventually, repo_path};
use crate::manifest::{self, Mode};
use crate::real::{Endpoint, OPERATOR_NAMESPACE, is_ready, use_local_images};

/// The sample's cluster name.
pub const NAME: &str = "minimal";
/// The pool pods' selector.
pub const POOL_PODS: &str = "app.kubernetes.io/component=shard-pool,multigres.com/cluster=minimal";
/// Real images unpack, PostgreSQL initializes, the first backup is taken and restored, and a
/// leader is appointed, on 2 shared cores.
pub const WAIT: Duration = Duration::from_secs(420);

/// Applies the minimal sample with the local images and `edit` applied to its
/// MultigresCluster; the time it was sent.
pub async fn apply_sample(client: &Client, namespace: &str, edit: impl Fn(&mut Value)) -> Instant {
    let sent = Instant::now();
    apply_sample_file(client, namespace, "minimal", edit).await;
    sent
}

/// Applies `deploy/samples/<file>.yaml` with the local images (see [`use_local_images`]) and
/// `edit` applied to its MultigresCluster; the cluster's name.
pub async fn apply_sample_file(
    client: &Client,
    namespace: &str,
    file: &str,
    edit: impl Fn(&mut Value),
) -> String {
    apply_sample_at(
        client,
        namespace,
        &repo_path(&format!("deploy/samples/{file}.yaml")),
        edit,
    )
    .await
}

/// Applies the sample at `path` (of this tree or another version's) as [`apply_sample_file`]
/// does; the cluster's name.
pub async fn apply_sample_at(
    client: &Client,
    namespace: &str,
    path: &std::path::Path,
    edit: impl Fn(&mut Value),
) -> String {
    let mut name = None;
    for mut doc in manifest::read_documents(path).unwrap() {
        let kind = doc
            .types
            .as_ref()
            .map(|t| t.kind.clone())
            .unwrap_or_default();
        use_local_images(&kind, &mut doc.data);
        if kind == "MultigresCluster" {
            edit(&mut doc.data);
            name = doc.metadata.name.clone();
        }
        manifest::apply(client, &doc, Some(namespace), Mode::Apply)
            .await
            .unwrap_or_else(|e| panic!("applying {}: {e}", path.display()));
    }
    name.unwrap_or_else(|| panic!("{} has no MultigresCluster", path.display()))
}

/// The cluster's `Available` condition as (status, message).
fn available(cluster: &MultigresCluster) -> Option<(String, String)> {
    let c = cluster
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Available")?;
    Some((c.status.clone(), c.message.clone()))
}

/// Polls until the cluster is Available and `SELECT 1` is answered through the gateway;
/// returns (time to Available, time to the first answer) since `sent`, and checks that once
/// Available is True the gateway answers within a few seconds (Available means SQL is served).
pub async fn wait_serving(client: &Client, namespace: &str, sent: Instant) -> (Duration, Duration) {
    wait_serving_within(client, namespace, sent, Duration::from_secs(5)).await
}

/// The longest a multigateway waits before it dials a pooler's health stream again: full
/// jitter over 5 s doubling, capped at one minute (Multigres 6bd80b9b,
/// `go/common/constants/health.go:21-26`, `poolergateway/pooler_connection.go:295`). Only a
/// health stream tells a gateway which pooler is the primary.
pub const GATEWAY_HEALTH_RETRY_CAP: Duration = Duration::from_secs(60);

/// [`wait_serving`] for pool pods that come back rather than start afresh (restored from the
/// repository, or a deleted cluster recreated on its volumes), which pins a Multigres limit seen
/// on real pods: each pooler is in the topology seconds to tens of seconds before the gateway's
/// dials to it succeed (they are refused: `failed to open health stream ... connection
/// refused`; a recreated cluster's topology also still holds the deleted pods' records), and
/// every refusal lengthens the gateway's backoff. After `Available` (the topology names a
/// primary) the gateway may take up to [`GATEWAY_HEALTH_RETRY_CAP`] to see the primary. The gap
/// is printed.
pub async fn wait_serving_pools_returned(
    client: &Client,
    namespace: &str,
    sent: Instant,
) -> (Duration, Duration) {
    let tolerance = GATEWAY_HEALTH_RETRY_CAP + Duration::from_secs(5);
    let (to_available, to_sql) = wait_serving_within(client, namespace, sent, tolerance).await;
    crate::load::figure(
        "pool pods returned: Available -> first SELECT 1 through the gateway (s)",
        format!("{:.1}", to_sql.as_secs_f64() - to_available.as_secs_f64()),
    );
    (to_available, to_sql)
}

async fn wait_serving_within(
    client: &Client,
    namespace: &str,
    sent: Instant,
    tolerance: Duration,
) -> (Duration, Duration) {
    let clusters: Api<MultigresCluster> = Api::namespaced(client.clone(), namespace);
    let deadline = sent + WAIT;
    let (mut to_available, mut to_sql) = (None, None);
    let mut last = String::new();
    let mut diagnosed = false;
    while to_available.is_none() || to_sql.is_none() {
        // Half the wait gone: the diagnostics now, while the logs still hold the beginning.
        if !diagnosed && sent.elapsed() > WAIT / 2 {
            println!(
                "not serving after {:?}; diagnostics now, still waiting",
                WAIT / 2
            );
            print_diagnostics(client, namespace).await;
            diagnosed = true;
        }
        assert!(
            Instant::now() < deadline,
            "not serving within {WAIT:?}: Available {to_available:?}, SQL {to_sql:?}; last: {last}"
        );
        if to_available.is_none()
            && let Ok(c) = clusters.get(NAME).await
        {
            match available(&c) {
                Some((status, _)) if status == "True" => to_available = Some(sent.elapsed()),
                other => last = format!("Available: {other:?}"),
            }
        }
        if to_sql.is_none() {
            // Each attempt is cut at 2 s: one stuck in a connect or query timeout must not
            // delay the next attempt (and so the first answer) by up to 15 s.
            let answer = tokio::time::timeout(Duration::from_secs(2), async {
                let gateway = Endpoint::gateway(client, namespace, NAME).await?;
                gateway.query("SELECT 1").await
            })
            .await
            .unwrap_or_else(|_| Err("SELECT 1: no answer within 2 s".to_owned()));
            match answer {
                Ok(rows) if rows == [[Some("1".to_owned())]] => to_sql = Some(sent.elapsed()),
                Ok(rows) => last = format!("SELECT 1 answered {rows:?}"),
                Err(e) => last = format!("SELECT 1: {e}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (to_available, to_sql) = (to_available.unwrap(), to_sql.unwrap());
    assert!(
        to_sql <= to_available + tolerance,
        "Available at {to_available:?} but SQL only at {to_sql:?} (allowed: {tolerance:?} after \
         Available): Available must mean served; the last failed attempt: {last}"
    );
    (to_available, to_sql)
}

/// The sample's pool pods' UIDs by name: a changed UID is a restarted pod.
pub async fn pool_pod_uids(client: &Client, namespace: &str) -> BTreeMap<String, String> {
    crate::harness::pool_pods(client, namespace, NAME)
        .await
        .into_iter()
        .map(|(pod, (uid, _))| (pod, uid))
        .collect()
}

/// Waits until each pool pod of `before` (from [`pool_pod_uids`]) has restarted once (a new
/// UID); the pods in the order they restarted.
pub async fn wait_restarted(
    client: &Client,
    namespace: &str,
    before: &BTreeMap<String, String>,
) -> Vec<String> {
    let mut order: Vec<String> = Vec::new();
    let deadline = Instant::now() + WAIT * 2;
    while order.len() < before.len() {
        if Instant::now() >= deadline {
            panic!(
                "rollout incomplete: restarted {order:?} of {before:?}; {}",
                shard_summary(client, namespace).await
            );
        }
        for (pod, uid) in pool_pod_uids(client, namespace).await {
            if before.get(&pod) != Some(&uid) && !order.contains(&pod) {
                order.push(pod);
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    order
}

/// The Shards' roles, cohort and conditions on one line: what a panic message carries, which
/// CI's summary keeps when it cuts the test's output.
pub async fn shard_summary(client: &Client, namespace: &str) -> String {
    let shards: Api<Shard> = Api::namespaced(client.clone(), namespace);
    match shards.list(&ListParams::default()).await {
        Ok(list) => list
            .items
            .iter()
            .map(|shard| {
                let status = shard.status.clone().unwrap_or_default();
                let conditions: Vec<String> = status
                    .conditions
                    .iter()
                    .map(|c| format!("{} {} {}: {}", c.type_, c.status, c.reason, c.message))
                    .collect();
                format!(
                    "Shard {}: roles {:?}, cohort {:?}, conditions [{}]",
                    shard.name_any(),
                    status.pod_roles,
                    status.cohort.map(|c| c.summary),
                    conditions.join("; ")
                )
            })
            .collect::<Vec<_>>()
            .join(" | "),
        Err(e) => format!("listing Shards: {e}"),
    }
}

/// The sample's one Shard.
pub async fn shard(client: &Client, namespace: &str) -> Shard {
    let shards: Api<Shard> = Api::namespaced(client.clone(), namespace);
    let list = shards.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(list.len(), 1, "the sample has one shard");
    list.into_iter().next().unwrap()
}

/// The pool pods not being deleted.
pub async fn pool_pods(client: &Client, namespace: &str) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    pods.list(&ListParams::default().labels(POOL_PODS))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect()
}

/// The roles the data-handler published, once every pool pod is Ready and has one, exactly one
/// PRIMARY among them, `expected` pods in all; each checked against the pod's own PostgreSQL
/// (`pg_is_in_recovery`) and the pod's role label. Returns (primary, roles).
pub async fn settled_roles(
    client: &Client,
    namespace: &str,
    password: &str,
    expected: usize,
) -> (String, BTreeMap<String, String>) {
    eventually(
        &format!("{expected} Ready pool pods, one PRIMARY, roles matching PostgreSQL"),
        WAIT,
        || async {
            let pods = pool_pods(client, namespace).await;
            let roles = shard(client, namespace)
                .await
                .status
                .map(|s| s.pod_roles)
                .unwrap_or_default();
            if pods.len() != expected || !pods.iter().all(is_ready) {
                return Err(format!("{} pods, roles {roles:?}", pods.len()));
            }
            let primaries: Vec<&String> = roles
                .iter()
                .filter(|(_, r)| r.as_str() == "PRIMARY")
                .map(|(p, _)| p)
                .collect();
            if primaries.len() != 1 || roles.len() != expected {
                return Err(format!("roles {roles:?}"));
            }
            for pod in &pods {
                let name = pod.name_any();
                let role = roles.get(&name).ok_or(format!("{name} has no role"))?;
                let label = pod.labels().get(labels::ROLE).cloned();
                if label.as_deref() != Some(role.to_ascii_lowercase().as_str()) {
                    return Err(format!("{name}: role {role}, label {label:?}"));
                }
                let endpoint = Endpoint::pod(pod, password).ok_or("no pod IP")?;
                let recovery = endpoint
                    .query("SELECT pg_is_in_recovery()")
                    .await
                    .map_err(|e| format!("{name}: {e}"))?;
                let standby = recovery == [[Some("t".to_owned())]];
                if standby != (role != "PRIMARY") {
                    return Err(format!(
                        "{name} is {role} but pg_is_in_recovery = {recovery:?}"
                    ));
                }
            }
            Ok((primaries[0].clone(), roles.clone()))
        },
    )
    .await
}

/// The published cohort once `settled` accepts the Shard's status (the cohort, and its
/// `CohortHealthy` and `FailureTolerant` conditions as `(status, reason)`), and how long that
/// took; every pool pod's `multigres.com/cohort` label must match the cohort too.
pub async fn cohort_until(
    client: &Client,
    namespace: &str,
    what: &str,
    settled: impl Fn(&CohortStatus, (&str, &str), (&str, &str)) -> bool,
) -> (CohortStatus, Duration) {
    let started = Instant::now();
    let cohort = eventually(what, WAIT, || async {
        let status = shard(client, namespace).await.status.unwrap_or_default();
        let condition = |type_: &str| {
            status
                .conditions
                .iter()
                .find(|c| c.type_ == type_)
                .map(|c| (c.status.clone(), c.reason.clone()))
                .unwrap_or_default()
        };
        let (health, tolerance) = (condition("CohortHealthy"), condition("FailureTolerant"));
        let cohort = status.cohort.clone().ok_or("no cohort published")?;
        let shown = format!("{cohort:?}; CohortHealthy {health:?}, FailureTolerant {tolerance:?}");
        let health_pair = (health.0.as_str(), health.1.as_str());
        let tolerance_pair = (tolerance.0.as_str(), tolerance.1.as_str());
        if !settled(&cohort, health_pair, tolerance_pair) {
            return Err(shown);
        }
        for pod in pool_pods(client, namespace).await {
            let name = pod.name_any();
            let want = if cohort.is_healthy(&name) {
                "member"
            } else {
                "outside"
            };
            let label = pod.labels().get(labels::COHORT).map(String::as_str);
            if label != Some(want) {
                return Err(format!("{name} labelled {label:?}, not {want}: {shown}"));
            }
        }
        Ok(cohort)
    })
    .await;
    println!("cohort ({what}): {cohort:?}");
    (cohort, started.elapsed())
}

/// Whether the cohort has exactly `pods` pool pods, each taking part in commits (the primary,
/// or a member streaming from it), and no member without a pod.
pub fn whole(cohort: &CohortStatus, pods: usize) -> bool {
    cohort.missing.is_empty()
        && cohort.pods.len() == pods
        && cohort.pods.keys().all(|p| cohort.is_healthy(p))
}

/// The Shards' events of `namespace`, each `<type> <reason>: <message>`.
pub async fn shard_events(client: &Client, namespace: &str) -> Vec<String> {
    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    events
        .list(&ListParams::default().fields("involvedObject.kind=Shard"))
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|e| {
            format!(
                "{} {}: {}",
                e.type_.unwrap_or_default(),
                e.reason.unwrap_or_default(),
                e.message.unwrap_or_default()
            )
        })
        .collect()
}

/// Runs `story`; when it panics (a wait that timed out, a failed assertion), first prints what
/// explains the state of the cluster in `namespace` ([`print_diagnostics`]), then panics again
/// with the first panic's message and the Shards' state ([`shard_summary`]): CI keeps panic
/// messages but cuts a long test's output, diagnostics included.
pub async fn diagnosed<T>(client: &Client, namespace: &str, story: impl Future<Output = T>) -> T {
    match AssertUnwindSafe(story).catch_unwind().await {
        Ok(value) => value,
        Err(panic) => {
            print_diagnostics(client, namespace).await;
            let message = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("(a panic without a message)");
            panic!(
                "{message}\nthe Shards then: {}",
                shard_summary(client, namespace).await
            )
        }
    }
}

/// Runs `wait`; when it has not finished after `after`, prints the diagnostics once
/// ([`print_diagnostics`]) and goes on waiting: the logs then still hold the step's beginning,
/// which a timeout minutes later would have scrolled out of their last lines.
pub async fn diagnosed_if_slow<T>(
    client: &Client,
    namespace: &str,
    after: Duration,
    wait: impl Future<Output = T>,
) -> T {
    let mut wait = std::pin::pin!(wait);
    match tokio::time::timeout(after, &mut wait).await {
        Ok(value) => value,
        Err(_) => {
            println!("not done after {after:?}; diagnostics now, still waiting");
            print_diagnostics(client, namespace).await;
            wait.await
        }
    }
}

/// How many lines of each container's log [`print_diagnostics`] prints.
const DIAGNOSTIC_LOG_LINES: i64 = 200;

/// Prints the Shards' status (roles, cohort, conditions), the pool pods' labels and
/// annotations, the namespace's Events in time order, and the last lines of the logs of every
/// multiorch, every pool pod's multipooler and pgctld, and the data-handler. Nothing here
/// panics: an API error is printed in place of what it hid.
pub async fn print_diagnostics(client: &Client, namespace: &str) {
    println!("==== diagnostics of namespace {namespace}");
    let shards: Api<Shard> = Api::namespaced(client.clone(), namespace);
    match shards.list(&ListParams::default()).await {
        Ok(list) => {
            for shard in list {
                let status = shard.status.clone().unwrap_or_default();
                println!(
                    "Shard {}: podRoles {:?}",
                    shard.name_any(),
                    status.pod_roles
                );
                println!("  cohort {:?}", status.cohort);
                for c in &status.conditions {
                    println!("  {} {} {}: {}", c.type_, c.status, c.reason, c.message);
                }
            }
        }
        Err(e) => println!("listing Shards: {e}"),
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let pool = pods.list(&ListParams::default().labels(POOL_PODS)).await;
    if let Err(e) = &pool {
        println!("listing pool pods: {e}");
    }
    for pod in pool.iter().flat_map(|l| &l.items) {
        let multigres = |map: &BTreeMap<String, String>| -> BTreeMap<String, String> {
            map.iter()
                .filter(|(k, _)| k.starts_with("multigres.com/"))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        };
        println!(
            "pod {} ready {} deleting {}: {:?} {:?}",
            pod.name_any(),
            is_ready(pod),
            pod.metadata.deletion_timestamp.is_some(),
            multigres(pod.labels()),
            multigres(pod.annotations())
        );
    }
    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    match events.list(&ListParams::default()).await {
        Ok(list) => {
            let mut list = list.items;
            let at = |e: &Event| {
                e.series
                    .as_ref()
                    .and_then(|s| s.last_observed_time.as_ref().map(|t| t.0))
                    .or(e.last_timestamp.as_ref().map(|t| t.0))
                    .or(e.event_time.as_ref().map(|t| t.0))
            };
            list.sort_by_key(at);
            println!("---- events (last 80 of {})", list.len());
            for e in &list[list.len().saturating_sub(80)..] {
                println!(
                    "{:?} {} {}/{} {}: {}",
                    at(e),
                    e.type_.as_deref().unwrap_or_default(),
                    e.involved_object.kind.as_deref().unwrap_or_default(),
                    e.involved_object.name.as_deref().unwrap_or_default(),
                    e.reason.as_deref().unwrap_or_default(),
                    e.message.as_deref().unwrap_or_default()
                );
            }
        }
        Err(e) => println!("listing Events: {e}"),
    }
    let operator: Api<Pod> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
    // A handler that lost its Lease exits and restarts: its log below starts afresh.
    let handlers = operator.list(&ListParams::default()).await;
    if let Err(e) = &handlers {
        println!("listing the operator's pods: {e}");
    }
    for pod in handlers.iter().flat_map(|l| &l.items) {
        let statuses = pod
            .status
            .iter()
            .flat_map(|s| s.container_statuses.iter().flatten());
        for c in statuses {
            let last = c.last_state.as_ref().and_then(|s| s.terminated.as_ref());
            println!(
                "operator pod {} ready {}: {} restarts, last exit {:?} at {:?}",
                pod.name_any(),
                is_ready(pod),
                c.restart_count,
                last.map(|t| (t.exit_code, t.reason.clone())),
                last.and_then(|t| t.finished_at.as_ref()).map(|t| t.0)
            );
        }
    }
    let logs = [
        (&pods, "app.kubernetes.io/component=multiorch", "multiorch"),
        (&pods, POOL_PODS, "multipooler"),
        (&pods, POOL_PODS, "pgctld"),
        (
            &operator,
            "app.kubernetes.io/component=data-handler",
            "data-handler",
        ),
    ];
    for (api, selector, container) in logs {
        let list = match api.list(&ListParams::default().labels(selector)).await {
            Ok(list) => list.items,
            Err(e) => {
                println!("listing pods {selector}: {e}");
                continue;
            }
        };
        for pod in list {
            let params = LogParams {
                container: Some(container.to_owned()),
                tail_lines: Some(DIAGNOSTIC_LOG_LINES),
                timestamps: true,
                ..LogParams::default()
            };
            let log = api
                .logs(&pod.name_any(), &params)
                .await
                .unwrap_or_else(|e| format!("(no log: {e})"));
            println!(
                "---- {} {container}, last {DIAGNOSTIC_LOG_LINES} lines\n{log}",
                pod.name_any()
            );
        }
    }
    println!("==== end of diagnostics");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What CI keeps of a failed story: the panic's own message, then the Shards' state (here
    /// the error that hid it: nothing listens on the address).
    #[tokio::test]
    async fn a_diagnosed_panic_carries_its_message_and_the_shards_state() {
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let client = Client::try_from(config).unwrap();
        // run-e2e.sh repeats every panic at the end of the log: this one says it is deliberate.
        let story = diagnosed(&client, "nowhere", async {
            panic!("deliberate, in a passing unit test: the wait timed out")
        });
        let panic = AssertUnwindSafe(story).catch_unwind().await.unwrap_err();
        let message = panic.downcast_ref::<String>().expect("a formatted message");
        assert!(
            message.starts_with(
                "deliberate, in a passing unit test: the wait timed out\nthe Shards then: \
                 listing Shards: "
            ),
            "{message}"
        );
    }
}
