//! An operator upgrade as README.md's "Upgrade" says, on real nodes, with a cluster under a
//! steady writer: the previous version (the commit in `e2e/images/previous-operator`, built by
//! `e2e/images/previous-operator.sh` and imported into every node) installed with its own chart
//! and CRDs; the minimal sample applied with `multigres.com/restart-policy: supervised`; then the
//! working tree's CRDs applied server-side and `helm upgrade --reset-then-reuse-values` to the
//! working tree's chart and image.
//!
//! What must hold: the handlers roll; no data-plane pod restarts (same UIDs, same restart
//! counts); a pool pod template the new version changes waits, and the Shard says so and what
//! changes (`RollingUpdate` `WaitingForRelease`, `status.pendingRestart`); the cluster's spec reads back
//! unchanged; `kubectl multigres restart` then runs the cohort-gated rollout, the primary last;
//! every acknowledged row is there. The failed statements are printed.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use multigres_api::labels;
use multigres_api::v1alpha1::{MultigresCluster, Shard};
use multigres_e2e::harness::{self, eventually, fresh_namespace, repo_path, run_plugin};
use multigres_e2e::load::{Load, assert_kept, create_ledger, figure};
use multigres_e2e::manifest::{self, Mode};
use multigres_e2e::nodes;
use multigres_e2e::real::{self, Endpoint, OPERATOR_NAMESPACE, RELEASE, is_ready};
use multigres_e2e::sample::{
    NAME, POOL_PODS, WAIT, apply_sample_at, pool_pod_uids, settled_roles, wait_restarted,
    wait_serving,
};
use serde_json::json;

/// The previous operator's image reference, and the directory of its source (chart, CRDs).
fn previous_operator() -> (String, PathBuf) {
    const PREFIX: &str = "localhost/multigres-operator-previous:";
    let images = nodes::image_list().unwrap_or_else(|e| panic!("{e}"));
    let (reference, archive) = images
        .iter()
        .find(|(reference, _)| reference.starts_with(PREFIX))
        .unwrap_or_else(|| {
            panic!(
                "no {PREFIX}* image in ${}: e2e/run-e2e.sh adds the one \
                 e2e/images/previous-operator.sh builds",
                nodes::IMAGES_ENV
            )
        });
    let src = archive
        .parent()
        .expect("the archive's directory")
        .join("src");
    (reference.clone(), src)
}

/// Server-side applies (forced) every CRD of `dir`, as README.md's `kubectl apply
/// --server-side --force-conflicts` does.
async fn apply_crds(client: &Client, dir: &std::path::Path) {
    for file in manifest::yaml_files(dir).unwrap() {
        for doc in manifest::read_documents(&file).unwrap() {
            manifest::apply(client, &doc, None, Mode::Apply)
                .await
                .unwrap_or_else(|e| panic!("applying {}: {e}", file.display()));
        }
    }
}

/// Every pod of the cluster (its etcd too): name -> (UID, restarts of all its containers).
async fn cluster_pods(client: &Client, namespace: &str) -> BTreeMap<String, (String, i32)> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let params = ListParams::default().labels(&format!("{}={NAME}", labels::CLUSTER));
    pods.list(&params)
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| {
            let restarts = p
                .status
                .iter()
                .flat_map(|s| s.container_statuses.iter().flatten())
                .map(|c| c.restart_count)
                .sum();
            (p.name_any(), (p.uid().unwrap_or_default(), restarts))
        })
        .collect()
}

/// Waits until every handler Deployment of the release runs `image` in Ready pods only.
async fn handlers_run(client: &Client, image: &str) {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
    let pods: Api<Pod> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
    eventually(&format!("every handler runs {image}"), WAIT, || async {
        let behind: Vec<String> = pods
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?
            .items
            .iter()
            .filter(|p| {
                !is_ready(p)
                    || p.spec
                        .iter()
                        .flat_map(|s| &s.containers)
                        .any(|c| c.image.as_deref() != Some(image))
            })
            .map(ResourceExt::name_any)
            .collect();
        let rolling: Vec<String> = deployments
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?
            .items
            .iter()
            .filter(|d| {
                let s = d.status.clone().unwrap_or_default();
                s.updated_replicas != s.replicas || s.ready_replicas != s.replicas
            })
            .map(ResourceExt::name_any)
            .collect();
        if behind.is_empty() && rolling.is_empty() {
            Ok(())
        } else {
            Err(format!("pods {behind:?}, deployments {rolling:?}"))
        }
    })
    .await;
}

/// The pool StatefulSets whose template is a newer revision than their pods run (`OnDelete`:
/// the pods change only when the operator's rollout replaces them).
async fn pool_templates_ahead_of_pods(
    statefulsets: &Api<StatefulSet>,
) -> Result<Vec<String>, String> {
    Ok(statefulsets
        .list(&ListParams::default().labels(POOL_PODS))
        .await
        .map_err(|e| e.to_string())?
        .items
        .iter()
        .filter(|sts| {
            let status = sts.status.clone().unwrap_or_default();
            status.update_revision != status.current_revision
        })
        .map(ResourceExt::name_any)
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_upgrade_restarts_no_database_and_a_changed_pod_template_waits_for_release() {
    let began = Instant::now();
    let cluster = real::real_cluster().await;
    let client = cluster.client().unwrap();
    let (previous, previous_src) = previous_operator();
    let chart = |src: &std::path::Path| src.join("deploy/helm/multigres-operator");

    // 1. The previous version with its own CRDs and chart.
    apply_crds(&client, &chart(&previous_src).join("crds")).await;
    real::install_operator(cluster, &chart(&previous_src), &previous, &[]).await;
    let namespace = fresh_namespace(cluster, "upgrade").await;
    let sent = Instant::now();
    let sample = previous_src.join("deploy/samples/minimal.yaml");
    apply_sample_at(&client, &namespace, &sample, |c| {
        c["spec"]["databases"] = json!([{"name": "postgres", "default": true,
            "tablegroups": [{"name": "default", "default": true, "shards": [{"name": "0-inf",
                "spec": {"pools": {"default": {"replicasPerCell": 3}}}}]}]}]);
    })
    .await;
    let clusters: Api<MultigresCluster> = Api::namespaced(client.clone(), &namespace);
    let supervised = json!({"metadata": {"annotations": {labels::RESTART_POLICY: "supervised"}}});
    clusters
        .patch(NAME, &PatchParams::default(), &Patch::Merge(&supervised))
        .await
        .unwrap();
    let (_, to_sql) = wait_serving(&client, &namespace, sent).await;
    println!(
        "previous operator {previous}: first SELECT 1 after {:.1} s",
        to_sql.as_secs_f64()
    );
    let gateway = Endpoint::gateway(&client, &namespace, NAME).await.unwrap();
    let mut acknowledged = create_ledger(&gateway).await;
    let (primary, _) = settled_roles(&client, &namespace, &gateway.password, 3).await;
    let spec_before = clusters.get(NAME).await.unwrap().spec;
    let pods_before = cluster_pods(&client, &namespace).await;

    // 2. Upgrade under a steady writer: CRDs first, then the chart, as README.md says.
    let load = Load::start(gateway.clone(), 1);
    let started = Instant::now();
    apply_crds(&client, &repo_path("deploy/helm/multigres-operator/crds")).await;
    let current = real::image(real::OPERATOR_IMAGE_PREFIX);
    let [repository, tag] = real::image_values(&current);
    let new_chart = repo_path("deploy/helm/multigres-operator");
    let out = harness::helm(
        &[
            "upgrade",
            RELEASE,
            new_chart.to_str().unwrap(),
            "--namespace",
            OPERATOR_NAMESPACE,
            "--reset-then-reuse-values",
            "--set",
            &repository,
            "--set",
            &tag,
            "--wait",
            "--timeout",
            "5m",
        ],
        Some(cluster.kubeconfig()),
    )
    .await;
    assert!(out.contains("STATUS: deployed"), "{out}");
    handlers_run(&client, &current).await;
    figure(
        "helm upgrade -> every handler runs the new image (s)",
        format!("{:.1}", started.elapsed().as_secs_f64()),
    );

    // 3. The new handlers have read every object the old ones wrote: no pod restarts, the Shard
    // reports what waits, the cluster is Available and its spec reads back unchanged. The Shard
    // is read after a 20 s watch of the pods, time enough for the new resource-handler to
    // reconcile it; what it says must agree with the pool StatefulSets: one whose pods run an
    // older revision than its template (OnDelete) is a restart the new version waits to be
    // released for, never "nothing waits" (read too early, the old version's status said so,
    // and the released rollout went untested).
    tokio::time::sleep(Duration::from_secs(20)).await;
    let pods_after = cluster_pods(&client, &namespace).await;
    let restarted: Vec<&String> = pods_before
        .iter()
        .filter(|(pod, before)| pods_after.get(*pod) != Some(before))
        .map(|(pod, _)| pod)
        .collect();
    assert!(
        restarted.is_empty(),
        "the upgrade restarted {restarted:?}: before {pods_before:?}, after {pods_after:?}"
    );
    let shards: Api<Shard> = Api::namespaced(client.clone(), &namespace);
    let statefulsets: Api<StatefulSet> = Api::namespaced(client.clone(), &namespace);
    let waiting = eventually(
        "the Shard says what the new version restarts, or that nothing waits",
        WAIT,
        || async {
            let shard = shards
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            let shard = shard.items.into_iter().next().ok_or("no Shard")?;
            let behind = pool_templates_ahead_of_pods(&statefulsets).await?;
            let status = shard.status.clone().unwrap_or_default();
            let rolling = status
                .conditions
                .iter()
                .find(|c| c.type_ == "RollingUpdate");
            match (&status.pending_restart, rolling) {
                // It says what the restart changes (container by container, from the old and
                // new StatefulSet revisions) before anything restarts.
                (Some(pending), Some(c))
                    if c.reason == "WaitingForRelease" && c.message.contains("what changes: ") =>
                {
                    Ok(Some((pending.clone(), c.message.clone())))
                }
                (None, Some(c)) if c.status == "False" && behind.is_empty() => Ok(None),
                (pending, c) => Err(format!(
                    "pendingRestart {pending:?}, RollingUpdate {c:?}, pool StatefulSets ahead \
                     of their pods {behind:?}"
                )),
            }
        },
    )
    .await;
    println!("after the upgrade, the Shard holds: {waiting:?}");
    let stored = clusters.get(NAME).await.unwrap();
    assert_eq!(
        stored.spec, spec_before,
        "the cluster's spec reads back unchanged"
    );
    let report = load.finish().await;
    report.figures("the operator upgrade");
    acknowledged.extend(&report.acknowledged);
    assert_kept(&gateway, &acknowledged).await;

    // 4. What waits runs when released: the cohort-gated rollout, the primary last.
    if let Some((pending, _)) = waiting {
        let pool_before = pool_pod_uids(&client, &namespace).await;
        let load = Load::start(gateway.clone(), 1_000_001);
        let released = Instant::now();
        let out = run_plugin(cluster, &["restart", NAME, "-n", &namespace])
            .await
            .unwrap_or_else(|e| panic!("kubectl multigres restart: {e}"));
        println!("kubectl multigres restart: {out}");
        let order = wait_restarted(&client, &namespace, &pool_before).await;
        let (_, roles) = settled_roles(&client, &namespace, &gateway.password, 3).await;
        let took = released.elapsed();
        let report = load.finish().await;
        println!(
            "released restarts of {pending}: order {order:?}, primary before {primary}, \
             roles {roles:?}"
        );
        assert_eq!(order.last(), Some(&primary), "the primary restarts last");
        figure(
            "released restarts after the upgrade -> 3 pool pods restarted, roles settled (s)",
            format!("{:.1}", took.as_secs_f64()),
        );
        report.figures("the released restarts");
        acknowledged.extend(&report.acknowledged);
        assert_kept(&gateway, &acknowledged).await;
    }
    figure(
        "upgrade.rs, start to end (s)",
        format!("{:.1}", began.elapsed().as_secs_f64()),
    );
}
