//! The caches of `Lookups::cached` against a real local API server. For templates, its client
//! acts as a user who may list and watch templates but not get them: a template found without an
//! error can only have come from the cache, and a name the cache lacks shows up as the
//! (forbidden) GET the cache falls back to. For Node labels, the user loses its right to list
//! Nodes once the cache has them: an answer after that can only have come from the watch.

mod support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, DeleteParams, PostParams};
use kube::{Client, Error};
use multigres_api::v1alpha1::ShardTemplate;
use serde_json::json;
use support::{control_plane, namespace};
use webhook_server::lookup::{LookupError, Lookups};
use webhook_server::rules::{TemplateKind, Templates};

/// The user the cache's client acts as.
const WATCHER: &str = "webhook-lookup-test-watcher";

/// Creates `object`, or leaves the one already there (another test binary may have made it).
async fn ensure<K>(api: &Api<K>, object: serde_json::Value)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let object: K = serde_json::from_value(object).unwrap();
    match api.create(&PostParams::default(), &object).await {
        Ok(_) => {}
        Err(Error::Api(status)) if status.code == 409 => {}
        Err(e) => panic!("creating {object:?}: {e}"),
    }
}

/// A client acting as [`WATCHER`], allowed to list and watch templates in every namespace.
async fn watcher_client(admin: &Client) -> Client {
    let rule = json!({
        "apiGroups": ["multigres.com"],
        "resources": ["coretemplates", "celltemplates", "shardtemplates"],
        "verbs": ["list", "watch"],
    });
    ensure::<ClusterRole>(
        &Api::all(admin.clone()),
        json!({"metadata": {"name": WATCHER}, "rules": [rule]}),
    )
    .await;
    ensure::<ClusterRoleBinding>(
        &Api::all(admin.clone()),
        json!({
            "metadata": {"name": WATCHER},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": WATCHER},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": WATCHER}],
        }),
    )
    .await;
    let mut config = control_plane().await.config().clone();
    config.auth_info.impersonate = Some(WATCHER.to_owned());
    Client::try_from(config).unwrap()
}

async fn shard_template(lookups: &Lookups, ns: &str, name: &str) -> Result<Templates, LookupError> {
    let names = BTreeSet::from([(TemplateKind::Shard, name.to_owned())]);
    lookups.templates(ns, &names, &BTreeSet::new()).await
}

/// Waits up to 30 s for `done` to hold of the lookup of ShardTemplate `name`.
async fn until(
    lookups: &Lookups,
    ns: &str,
    name: &str,
    what: &str,
    done: impl Fn(&Result<Templates, LookupError>) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let found = shard_template(lookups, ns, name).await;
        if done(&found) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: still {:?}",
            found.map(|t| t.shard.into_keys().collect::<Vec<_>>())
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn forbidden_get(found: &Result<Templates, LookupError>) -> bool {
    found
        .as_ref()
        .is_err_and(|e| e.to_string().contains("forbidden"))
}

#[tokio::test]
async fn cached_templates_are_served_without_a_get_and_misses_are_read_from_the_api_server() {
    let cluster = control_plane().await;
    let admin = cluster.client().unwrap();
    let ns = namespace(cluster, "lookup").await;
    let (lookups, watches) = Lookups::cached(watcher_client(&admin).await);

    assert!(
        forbidden_get(&shard_template(&lookups, &ns, "absent").await),
        "a name the cache lacks is read with a GET"
    );

    let templates: Api<ShardTemplate> = Api::namespaced(admin, &ns);
    let template = json!({
        "apiVersion": "multigres.com/v1alpha1", "kind": "ShardTemplate",
        "metadata": {"name": "fast", "namespace": ns},
        "spec": {"multiorch": {"replicas": 1}},
    });
    templates
        .create(
            &PostParams::default(),
            &serde_json::from_value(template).unwrap(),
        )
        .await
        .unwrap();
    until(&lookups, &ns, "fast", "the new template served", |found| {
        found.as_ref().is_ok_and(|t| t.shard.contains_key("fast"))
    })
    .await;
    assert!(
        forbidden_get(&shard_template(&lookups, &ns, "absent").await),
        "a cache holding other templates still reads a missing name with a GET"
    );
    let fallback = BTreeSet::from([(TemplateKind::Shard, "default".to_owned())]);
    let found = lookups.templates(&ns, &fallback, &fallback).await;
    assert!(
        found.as_ref().is_ok_and(|t| t.shard.is_empty()),
        "a fallback no field names, absent from the delivering cache, is absent without a GET: {:?}",
        found.map(|t| t.shard.into_keys().collect::<Vec<_>>())
    );

    templates
        .delete("fast", &DeleteParams::default())
        .await
        .unwrap();
    until(
        &lookups,
        &ns,
        "fast",
        "the deleted template read with a GET again",
        forbidden_get,
    )
    .await;

    drop(watches);
}

/// Polls `check` every 50 ms for up to 30 s until it holds.
async fn eventually(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !check().await {
        assert!(Instant::now() < deadline, "{what}: not within 30 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn node_labels_are_served_from_the_watch() {
    let cluster = control_plane().await;
    let admin = cluster.client().unwrap();
    let user = format!("webhook-lookup-test-node-watcher-{}", std::process::id());
    let rule = json!({"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]});
    ensure::<ClusterRole>(
        &Api::all(admin.clone()),
        json!({"metadata": {"name": user}, "rules": [rule]}),
    )
    .await;
    let bindings: Api<ClusterRoleBinding> = Api::all(admin.clone());
    ensure(
        &bindings,
        json!({
            "metadata": {"name": user},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": user},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        }),
    )
    .await;
    let mut config = cluster.config().clone();
    config.auth_info.impersonate = Some(user.clone());
    let client = Client::try_from(config).unwrap();
    let (lookups, watches) = Lookups::cached(client.clone());
    let uncached = Lookups::new(client);

    let (label, zone) = (
        "multigres-test/zone",
        format!("zone-{}", std::process::id()),
    );
    let nodes: Api<Node> = Api::all(admin.clone());
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": format!("lookup-{zone}"), "labels": {label: zone}},
    }))
    .unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    eventually("the new Node's label served", async || {
        matches!(lookups.node_labelled(label, &zone).await, Ok(true))
    })
    .await;
    assert!(matches!(
        lookups.node_labelled(label, "elsewhere").await,
        Ok(false)
    ));

    bindings
        .delete(&user, &DeleteParams::default())
        .await
        .unwrap();
    eventually("listing Nodes forbidden to the user", async || {
        uncached
            .node_labelled(label, &zone)
            .await
            .is_err_and(|e| e.to_string().contains("forbidden"))
    })
    .await;
    assert!(
        matches!(lookups.node_labelled(label, &zone).await, Ok(true)),
        "answered without a list: from the watch"
    );
    nodes
        .delete(&format!("lookup-{zone}"), &DeleteParams::default())
        .await
        .unwrap();
    eventually("the deleted Node's label gone", async || {
        matches!(lookups.node_labelled(label, &zone).await, Ok(false))
    })
    .await;

    drop(watches);
}
