//! The cluster-handler binary against a real control plane, running as its own ServiceAccount
//! with only the rules of `deploy/rbac/cluster-handler.yaml` (bound in the test's namespace):
//! every sample produces exactly its children; a template edit reaches every cluster using it;
//! edits to children are reverted; a missing template is reported and healed once created; a
//! switch to an external topology removes the managed one; deleting a cluster garbage-collects
//! its children; an idle cluster costs no writes; a cluster the handler cannot read is reported
//! and does not hold up the others.
//!
//! Each test works in its own namespace with its own handler (`--watch-namespace`, leader
//! election through a Lease there). No resource-handler runs, so children never report status:
//! clusters stay Initializing.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, Client, Resource, ResourceExt};
use multigres_api::resolver::{self, GlobalTopo, Templates};
use multigres_api::v1alpha1::{
    Cell, CellTemplate, CoreTemplate, MultigresCluster, Shard, ShardTemplate, TableGroup,
    TopoServer,
};
use multigres_e2e::cluster::LocalCluster;
use multigres_e2e::manifest::{self, Mode};
use serde_json::json;

use multigres_e2e::harness::{HandlerProcess, WAIT, eventually, fresh_namespace, repo_path};

async fn cluster() -> &'static LocalCluster {
    multigres_e2e::harness::control_plane().await
}

/// The cluster-handler serving one namespace as its own ServiceAccount, electing itself leader
/// through a Lease in that namespace, once its caches are synced.
async fn start_handler(cluster: &LocalCluster, namespace: &str) -> HandlerProcess {
    let lease_namespace = format!("--leader-election-namespace={namespace}");
    HandlerProcess::start_in(
        cluster,
        "cluster-handler",
        namespace,
        &["--leader-elect", &lease_namespace],
    )
    .await
}

/// Server-side applies every document of `yaml` into `namespace` as the test (the user).
async fn apply_yaml(client: &Client, namespace: &str, yaml: &str) {
    for doc in manifest::parse_documents(yaml, Path::new("inline.yaml")).unwrap() {
        manifest::apply(client, &doc, Some(namespace), Mode::Apply)
            .await
            .unwrap_or_else(|e| panic!("applying {:?}: {e}", doc.metadata.name));
    }
}

fn read_sample(name: &str) -> String {
    std::fs::read_to_string(repo_path(&format!("deploy/samples/{name}.yaml"))).unwrap()
}

/// The templates a sample file defines, for the resolver.
fn sample_templates(yaml: &str) -> Templates {
    let mut templates = Templates::default();
    for doc in manifest::parse_documents(yaml, Path::new("sample.yaml")).unwrap() {
        let kind = doc
            .types
            .as_ref()
            .map(|t| t.kind.clone())
            .unwrap_or_default();
        let name = doc.name_any();
        let value = serde_json::to_value(&doc).unwrap();
        match kind.as_str() {
            "CoreTemplate" => {
                let t: CoreTemplate = serde_json::from_value(value).unwrap();
                templates.core.insert(name, t.spec);
            }
            "CellTemplate" => {
                let t: CellTemplate = serde_json::from_value(value).unwrap();
                templates.cell.insert(name, t.spec);
            }
            "ShardTemplate" => {
                let t: ShardTemplate = serde_json::from_value(value).unwrap();
                templates.shard.insert(name, t.spec);
            }
            _ => {}
        }
    }
    templates
}

/// Names of every object of kind `K` in `namespace`, sorted.
async fn names<K>(client: &Client, namespace: &str) -> Vec<String>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    let mut out: Vec<String> = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|o| o.name_any())
        .collect();
    out.sort();
    out
}

/// Names of every child in `namespace` by kind.
async fn all_children(client: &Client, namespace: &str) -> BTreeMap<&'static str, Vec<String>> {
    BTreeMap::from([
        ("Cell", names::<Cell>(client, namespace).await),
        ("Shard", names::<Shard>(client, namespace).await),
        ("TableGroup", names::<TableGroup>(client, namespace).await),
        ("TopoServer", names::<TopoServer>(client, namespace).await),
    ])
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

/// The owner reference a child must carry: its controller, blocking foreground deletion.
fn controller_ref<K: Resource<DynamicType = ()>>(owner: &K) -> OwnerReference {
    OwnerReference {
        api_version: "multigres.com/v1alpha1".to_owned(),
        kind: K::kind(&()).into_owned(),
        name: owner.meta().name.clone().unwrap(),
        uid: owner.meta().uid.clone().unwrap(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// The standard labels of a child plus its topology labels.
fn expected_labels(
    cluster: &str,
    component: &str,
    extra: &[(&str, &str)],
) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = [
        ("app.kubernetes.io/name", "multigres"),
        ("app.kubernetes.io/part-of", "multigres"),
        ("app.kubernetes.io/managed-by", "multigres-operator"),
        ("app.kubernetes.io/instance", cluster),
        ("app.kubernetes.io/component", component),
        ("multigres.com/cluster", cluster),
    ]
    .iter()
    .chain(extra)
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    out.retain(|_, v| !v.is_empty());
    out
}

/// Waits until the cluster's status reflects its current generation.
async fn wait_observed(clusters: &Api<MultigresCluster>, name: &str) -> MultigresCluster {
    eventually(
        &format!("MultigresCluster {name} observed"),
        WAIT,
        || async {
            let c = clusters.get(name).await.map_err(|e| e.to_string())?;
            let observed = c.status.as_ref().and_then(|s| s.observed_generation);
            if observed.is_some() && observed == c.metadata.generation {
                Ok(c)
            } else {
                Err(format!("{:?}", c.status))
            }
        },
    )
    .await
}

/// What a sample must produce: child names by kind.
struct Expected {
    sample: &'static str,
    topo_servers: &'static [&'static str],
    cells: &'static [&'static str],
}

const SAMPLES: [Expected; 5] = [
    Expected {
        sample: "minimal",
        topo_servers: &["minimal-global-topo"],
        cells: &["minimal-zone-a"],
    },
    Expected {
        sample: "inline",
        topo_servers: &["inline-global-topo"],
        cells: &["inline-zone-a", "inline-zone-b"],
    },
    Expected {
        sample: "templated",
        topo_servers: &["templated-global-topo"],
        cells: &["templated-zone-a", "templated-zone-b", "templated-zone-c"],
    },
    Expected {
        sample: "overrides",
        topo_servers: &["overrides-global-topo"],
        cells: &["overrides-zone-a", "overrides-zone-b"],
    },
    Expected {
        sample: "external-topo",
        topo_servers: &[],
        cells: &["external-topo-zone-a", "external-topo-zone-b"],
    },
];

#[tokio::test]
async fn every_sample_produces_exactly_its_children() {
    let cluster = cluster().await;
    let namespace = fresh_namespace(cluster, "ch-samples").await;
    let handler = start_handler(cluster, &namespace).await;
    let client = cluster.client().unwrap();
    for expected in &SAMPLES {
        apply_yaml(&client, &namespace, &read_sample(expected.sample)).await;
    }

    let clusters: Api<MultigresCluster> = Api::namespaced(client.clone(), &namespace);
    let topo_servers: Api<TopoServer> = Api::namespaced(client.clone(), &namespace);
    let cells: Api<Cell> = Api::namespaced(client.clone(), &namespace);
    let table_groups: Api<TableGroup> = Api::namespaced(client.clone(), &namespace);
    let shards: Api<Shard> = Api::namespaced(client.clone(), &namespace);

    let mut want: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for expected in &SAMPLES {
        let name = expected.sample;
        want.entry("TopoServer")
            .or_default()
            .extend(strings(expected.topo_servers));
        want.entry("Cell")
            .or_default()
            .extend(strings(expected.cells));
        want.entry("TableGroup")
            .or_default()
            .push(format!("{name}-postgres-default"));
        want.entry("Shard")
            .or_default()
            .push(format!("{name}-postgres-default-0-inf"));
    }
    want.values_mut().for_each(|v| v.sort());
    eventually("exactly the children of the five samples", WAIT, || async {
        let got = all_children(&client, &namespace).await;
        if got == want {
            Ok(())
        } else {
            Err(format!("{got:?}"))
        }
    })
    .await;

    for expected in &SAMPLES {
        let stored = wait_observed(&clusters, expected.sample).await;
        let name = expected.sample;
        let templates = sample_templates(&read_sample(name));
        let resolved = resolver::resolve(&stored, &templates).expect("sample resolves");
        let owner = controller_ref(&stored);

        match (&resolved.global_topo, expected.topo_servers) {
            (GlobalTopo::Managed(spec), [topo_name]) => {
                let topo = topo_servers.get(topo_name).await.unwrap();
                assert_eq!(&topo.spec, spec.as_ref(), "{topo_name}");
                assert_eq!(topo.labels(), &expected_labels(name, "global-topo", &[]));
                assert_eq!(
                    topo.owner_references(),
                    std::slice::from_ref(&owner),
                    "{topo_name}"
                );
            }
            (GlobalTopo::External(_), []) => {}
            (topo, names) => panic!("{name}: resolved {topo:?} but expected {names:?}"),
        }
        for (resolved_cell, cell_name) in resolved.cells.iter().zip(expected.cells) {
            let cell = cells.get(cell_name).await.unwrap();
            assert_eq!(cell.spec, resolved_cell.spec, "{cell_name}");
            assert_eq!(
                cell.labels(),
                &expected_labels(
                    name,
                    "cell",
                    &[("multigres.com/cell", resolved_cell.spec.name.as_str())]
                )
            );
            assert_eq!(
                cell.owner_references(),
                std::slice::from_ref(&owner),
                "{cell_name}"
            );
        }
        let tg_name = format!("{name}-postgres-default");
        let tg = table_groups.get(&tg_name).await.unwrap();
        assert_eq!(tg.spec, resolved.table_groups[0], "{tg_name}");
        assert_eq!(
            tg.labels(),
            &expected_labels(
                name,
                "tablegroup",
                &[
                    ("multigres.com/database", "postgres"),
                    ("multigres.com/tablegroup", "default")
                ]
            )
        );
        assert_eq!(
            tg.owner_references(),
            std::slice::from_ref(&owner),
            "{tg_name}"
        );

        let shard_name = format!("{tg_name}-0-inf");
        let shard = eventually(&format!("Shard {shard_name}"), WAIT, || async {
            shards.get(&shard_name).await.map_err(|e| e.to_string())
        })
        .await;
        assert_eq!(
            shard.spec,
            resolver::shard_spec(&tg.spec, &tg.spec.shards[0])
        );
        assert_eq!(
            shard.labels(),
            &expected_labels(
                name,
                "shard",
                &[
                    ("multigres.com/database", "postgres"),
                    ("multigres.com/tablegroup", "default"),
                    ("multigres.com/shard", "0-inf"),
                ]
            )
        );
        assert_eq!(
            shard.owner_references(),
            [controller_ref(&tg)],
            "{shard_name}"
        );

        let status = stored.status.clone().unwrap();
        assert_eq!(
            status.resolved_templates,
            Some(resolver::referenced_templates(&stored)),
            "{name}"
        );
        assert_eq!(status.cells.len(), expected.cells.len(), "{name}");
    }
    println!(
        "writes after the five samples converged: {:?}",
        handler.writes().await
    );
}

#[tokio::test]
async fn a_template_edit_reaches_every_cluster_using_it_and_no_other() {
    let cluster = cluster().await;
    let namespace = fresh_namespace(cluster, "ch-template").await;
    let _handler = start_handler(cluster, &namespace).await;
    let client = cluster.client().unwrap();
    let cluster_yaml = |name: &str, template: Option<&str>| {
        let defaults = template
            .map(|t| format!("  templateDefaults: {{cellTemplate: {t}}}\n"))
            .unwrap_or_default();
        format!(
            "apiVersion: multigres.com/v1alpha1\nkind: MultigresCluster\nmetadata: {{name: {name}}}\n\
             spec:\n  postgresPasswordSecretRef: {{name: pw, key: password}}\n{defaults}\
             \x20 cells:\n    - {{name: zone-a, zoneId: zone-a}}\n"
        )
    };
    apply_yaml(
        &client,
        &namespace,
        "apiVersion: multigres.com/v1alpha1\nkind: CellTemplate\nmetadata: {name: shared}\n\
         spec:\n  multigateway: {replicas: 1}\n",
    )
    .await;
    for (name, template) in [
        ("first", Some("shared")),
        ("second", Some("shared")),
        ("third", None),
    ] {
        apply_yaml(&client, &namespace, &cluster_yaml(name, template)).await;
    }
    let cells: Api<Cell> = Api::namespaced(client.clone(), &namespace);
    let replicas = |name: &'static str| {
        let cells = cells.clone();
        async move {
            let cell = cells.get(name).await.map_err(|e| e.to_string())?;
            Ok::<_, String>((
                cell.spec.multigateway.stateless.replicas,
                cell.resource_version(),
            ))
        }
    };
    for name in ["first-zone-a", "second-zone-a", "third-zone-a"] {
        eventually(name, WAIT, || replicas(name)).await;
    }
    let (_, third_before) = replicas("third-zone-a").await.unwrap();

    let edited_at = Instant::now();
    apply_yaml(
        &client,
        &namespace,
        "apiVersion: multigres.com/v1alpha1\nkind: CellTemplate\nmetadata: {name: shared}\n\
         spec:\n  multigateway: {replicas: 3}\n",
    )
    .await;
    for name in ["first-zone-a", "second-zone-a"] {
        eventually(
            &format!("{name} takes the edited template"),
            WAIT,
            || async {
                match replicas(name).await? {
                    (Some(3), _) => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            },
        )
        .await;
    }
    println!(
        "template edit reached both clusters in {:?}",
        edited_at.elapsed()
    );
    let (third_replicas, third_after) = replicas("third-zone-a").await.unwrap();
    assert_eq!(third_replicas, Some(1));
    assert_eq!(
        third_after, third_before,
        "a cluster not using the template was written"
    );
}

#[tokio::test]
async fn edits_to_children_are_reverted_and_deleted_children_come_back() {
    let cluster = cluster().await;
    let namespace = fresh_namespace(cluster, "ch-revert").await;
    let _handler = start_handler(cluster, &namespace).await;
    let client = cluster.client().unwrap();
    apply_yaml(&client, &namespace, &read_sample("minimal")).await;
    let cells: Api<Cell> = Api::namespaced(client.clone(), &namespace);
    let shards: Api<Shard> = Api::namespaced(client.clone(), &namespace);
    let table_groups: Api<TableGroup> = Api::namespaced(client.clone(), &namespace);
    let shard_name = "minimal-postgres-default-0-inf";
    let shard = eventually("the Shard exists", WAIT, || async {
        shards.get(shard_name).await.map_err(|e| e.to_string())
    })
    .await;
    let cell = cells.get("minimal-zone-a").await.unwrap();

    // A person edits the Cell and the Shard (a plain update-style merge patch).
    let edit = PatchParams {
        field_manager: Some("kubectl-edit".to_owned()),
        ..Default::default()
    };
    let edited_at = Instant::now();
    cells
        .patch(
            "minimal-zone-a",
            &edit,
            &Patch::Merge(json!({"spec": {"multigateway": {"replicas": 7}}})),
        )
        .await
        .unwrap();
    shards
        .patch(
            shard_name,
            &edit,
            &Patch::Merge(json!({"spec": {"replicas": 9}})),
        )
        .await
        .unwrap();
    eventually(
        "the Cell edit is reverted",
        Duration::from_secs(10),
        || async {
            let now = cells
                .get("minimal-zone-a")
                .await
                .map_err(|e| e.to_string())?;
            if now.spec == cell.spec {
                Ok(())
            } else {
                Err(format!("{:?}", now.spec.multigateway))
            }
        },
    )
    .await;
    eventually(
        "the Shard edit is reverted",
        Duration::from_secs(10),
        || async {
            let now = shards.get(shard_name).await.map_err(|e| e.to_string())?;
            if now.spec == shard.spec {
                Ok(())
            } else {
                Err(format!("{:?}", now.spec.replicas))
            }
        },
    )
    .await;
    println!("manual edits reverted within {:?}", edited_at.elapsed());

    // Deleting a child: it is recreated, and so is its own child.
    let tg = table_groups.get("minimal-postgres-default").await.unwrap();
    table_groups
        .delete("minimal-postgres-default", &DeleteParams::foreground())
        .await
        .unwrap();
    let recreated = eventually("the TableGroup is recreated", WAIT, || async {
        match table_groups.get_opt("minimal-postgres-default").await {
            Ok(Some(new)) if new.uid() != tg.uid() && new.metadata.deletion_timestamp.is_none() => {
                Ok(new)
            }
            other => Err(format!("{:?}", other.map(|o| o.map(|t| t.uid())))),
        }
    })
    .await;
    assert_eq!(recreated.spec, tg.spec);
    eventually(
        "the Shard is recreated under the new TableGroup",
        WAIT,
        || async {
            let shard = shards.get(shard_name).await.map_err(|e| e.to_string())?;
            if shard
                .owner_references()
                .iter()
                .any(|o| Some(&o.uid) == recreated.uid().as_ref())
            {
                Ok(())
            } else {
                Err(format!("{:?}", shard.owner_references()))
            }
        },
    )
    .await;
}

#[tokio::test]
async fn a_missing_template_is_reported_and_healed_once_created() {
    let cluster = cluster().await;
    let namespace = fresh_namespace(cluster, "ch-missing").await;
    let _handler = start_handler(cluster, &namespace).await;
    let client = cluster.client().unwrap();
    apply_yaml(
        &client,
        &namespace,
        "apiVersion: multigres.com/v1alpha1\nkind: MultigresCluster\nmetadata: {name: waiting}\n\
         spec:\n  postgresPasswordSecretRef: {name: pw, key: password}\n\
         \x20 templateDefaults: {shardTemplate: not-yet}\n\
         \x20 cells:\n    - {name: zone-a, zoneId: zone-a}\n",
    )
    .await;
    let clusters: Api<MultigresCluster> = Api::namespaced(client.clone(), &namespace);
    let degraded = eventually("the Degraded condition", WAIT, || async {
        let c = clusters.get("waiting").await.map_err(|e| e.to_string())?;
        c.status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Degraded").cloned())
            .filter(|c| c.status == "True")
            .ok_or_else(|| format!("{:?}", c.status))
    })
    .await;
    assert_eq!(degraded.reason, "TemplateNotFound");
    assert!(
        degraded
            .message
            .contains("ShardTemplate \"not-yet\" does not exist"),
        "{}",
        degraded.message
    );
    let status = clusters.get("waiting").await.unwrap().status.unwrap();
    assert_eq!(status.phase, Some(multigres_api::v1alpha1::Phase::Degraded));

    let events: Api<Event> = Api::namespaced(client.clone(), &namespace);
    let event = eventually("a TemplateNotFound event", WAIT, || async {
        let list = events
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        list.items
            .into_iter()
            .find(|e| {
                e.reason.as_deref() == Some("TemplateNotFound")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("waiting")
            })
            .ok_or_else(|| "no event yet".to_owned())
    })
    .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert!(event.note.unwrap_or_default().contains("not-yet"));
    assert_eq!(
        event.reporting_controller.as_deref(),
        Some("multigres-operator/cluster-handler")
    );
    let none: BTreeMap<&str, Vec<String>> = ["Cell", "Shard", "TableGroup", "TopoServer"]
        .map(|k| (k, Vec::new()))
        .into();
    assert_eq!(
        all_children(&client, &namespace).await,
        none,
        "children made without the template"
    );

    // Creating the template re-resolves the cluster: its status named the template.
    apply_yaml(
        &client,
        &namespace,
        "apiVersion: multigres.com/v1alpha1\nkind: ShardTemplate\nmetadata: {name: not-yet}\n\
         spec:\n  postgresConfig: {max_connections: \"50\"}\n",
    )
    .await;
    let table_groups: Api<TableGroup> = Api::namespaced(client.clone(), &namespace);
    let tg = eventually("the TableGroup once the template exists", WAIT, || async {
        table_groups
            .get("waiting-postgres-default")
            .await
            .map_err(|e| e.to_string())
    })
    .await;
    assert_eq!(tg.spec.shards[0].postgres_config["max_connections"], "50");
    eventually("Degraded clears", WAIT, || async {
        let c = clusters.get("waiting").await.map_err(|e| e.to_string())?;
        let status = c.status.unwrap_or_default();
        match status.conditions.iter().find(|c| c.type_ == "Degraded") {
            Some(c) if c.status == "False" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

/// The webhook refuses this switch without confirmation; here it is not running (as when it is
/// bypassed), so the cluster-handler itself holds the change until the annotation names the
/// TopoServer (docs/operations.md, "Changes that delete data").
#[tokio::test]
async fn switching_to_an_external_topology_deletes_the_managed_topo_server_once_confirmed() {
    let cluster = cluster().await;
    let namespace = fresh_namespace(cluster, "ch-external").await;
    let _handler = start_handler(cluster, &namespace).await;
    let client = cluster.client().unwrap();
    apply_yaml(&client, &namespace, &read_sample("minimal")).await;
    let topo_servers: Api<TopoServer> = Api::namespaced(client.clone(), &namespace);
    eventually("the global TopoServer", WAIT, || async {
        topo_servers
            .get("minimal-global-topo")
            .await
            .map_err(|e| e.to_string())
    })
    .await;

    let clusters: Api<MultigresCluster> = Api::namespaced(client.clone(), &namespace);
    clusters
        .patch(
            "minimal",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"globalTopoServer": {
                "external": {"endpoints": ["http://etcd.example:2379"]}
            }}})),
        )
        .await
        .unwrap();
    let degraded = eventually(
        "Degraded says what waits for confirmation",
        WAIT,
        || async {
            let c = clusters.get("minimal").await.map_err(|e| e.to_string())?;
            let status = c.status.unwrap_or_default();
            match status.conditions.iter().find(|c| c.type_ == "Degraded") {
                Some(c) if c.status == "True" && c.reason == "DeletionNotConfirmed" => {
                    Ok(c.clone())
                }
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    assert!(
        degraded.message.contains(
            "multigres.com/confirm-delete-topology: \"minimal-global-topo\" on the MultigresCluster"
        ),
        "{}",
        degraded.message
    );
    let events: Api<Event> = Api::namespaced(client.clone(), &namespace);
    let event_with = |reason: &'static str, text: &'static str| {
        let events = events.clone();
        async move {
            let list = events
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            let found = list.items.iter().any(|e| {
                e.reason.as_deref() == Some(reason)
                    && e.note.as_deref().is_some_and(|n| n.contains(text))
            });
            if found {
                Ok(())
            } else {
                Err(format!("{} other events", list.items.len()))
            }
        }
    };
    eventually("a Warning naming the TopoServer", WAIT, || {
        event_with("DeletionNotConfirmed", "TopoServer \"minimal-global-topo\"")
    })
    .await;
    assert!(
        topo_servers
            .get_opt("minimal-global-topo")
            .await
            .unwrap()
            .is_some(),
        "not deleted without confirmation"
    );
    let cells: Api<Cell> = Api::namespaced(client.clone(), &namespace);
    assert_ne!(
        cells
            .get("minimal-zone-a")
            .await
            .unwrap()
            .spec
            .global_topo_server
            .address,
        "etcd.example:2379",
        "nothing of the held change is applied"
    );

    clusters
        .patch(
            "minimal",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                "multigres.com/confirm-delete-topology": "minimal-global-topo"
            }}})),
        )
        .await
        .unwrap();
    eventually("the managed TopoServer is deleted", WAIT, || async {
        match topo_servers.get_opt("minimal-global-topo").await {
            Ok(None) => Ok(()),
            other => Err(format!("{:?}", other.map(|t| t.map(|t| t.name_any())))),
        }
    })
    .await;
    let cell = cells.get("minimal-zone-a").await.unwrap();
    assert_eq!(cell.spec.global_topo_server.address, "etcd.example:2379");
    eventually("a Deleted event", WAIT, || {
        event_with("Deleted", "TopoServer minimal-global-topo")
    })
    .await;
}

#[tokio::test]
async fn deleting_a_cluster_garbage_collects_every_child() {
    let cluster = cluster().await;
    let namespace = fresh_namespace(cluster, "ch-delete").await;
    let _handler = start_handler(cluster, &namespace).await;
    let client = cluster.client().unwrap();
    apply_yaml(&client, &namespace, &read_sample("templated")).await;
    eventually("the templated children", WAIT, || async {
        let got = all_children(&client, &namespace).await;
        if got.values().map(Vec::len).sum::<usize>() == 6 {
            Ok(())
        } else {
            Err(format!("{got:?}"))
        }
    })
    .await;
    let clusters: Api<MultigresCluster> = Api::namespaced(client.clone(), &namespace);
    clusters
        .delete("templated", &DeleteParams::default())
        .await
        .unwrap();
    let started = Instant::now();
    let none: BTreeMap<&str, Vec<String>> = ["Cell", "Shard", "TableGroup", "TopoServer"]
        .map(|k| (k, Vec::new()))
        .into();
    eventually(
        "every child is garbage-collected",
        Duration::from_secs(90),
        || async {
            let got = all_children(&client, &namespace).await;
            if got == none {
                Ok(())
            } else {
                Err(format!("{got:?}"))
            }
        },
    )
    .await;
    println!(
        "children garbage-collected {:?} after the cluster's deletion",
        started.elapsed()
    );
    let templates = names::<CellTemplate>(&client, &namespace).await;
    assert_eq!(templates, ["standard-cell"], "templates are not children");
}

#[tokio::test]
async fn an_idle_cluster_costs_no_writes() {
    let cluster = cluster().await;
    let namespace = fresh_namespace(cluster, "ch-idle").await;
    let handler = start_handler(cluster, &namespace).await;
    let client = cluster.client().unwrap();
    apply_yaml(&client, &namespace, &read_sample("templated")).await;
    apply_yaml(&client, &namespace, &read_sample("minimal")).await;
    let clusters: Api<MultigresCluster> = Api::namespaced(client.clone(), &namespace);
    wait_observed(&clusters, "templated").await;
    wait_observed(&clusters, "minimal").await;

    // Converged: the counter holds still for a while.
    let last = handler.settled(Duration::from_secs(5)).await;
    let total: u64 = last.values().sum();
    let children = all_children(&client, &namespace).await;
    let child_count: usize = children.values().map(Vec::len).sum();
    println!("converged after {total} writes for 2 clusters and {child_count} children: {last:?}");
    let events: Api<Event> = Api::namespaced(client.clone(), &namespace);
    for e in events.list(&ListParams::default()).await.unwrap().items {
        println!(
            "event {:?} {:?} {:?}: {:?}",
            e.regarding.and_then(|r| r.name),
            e.type_,
            e.reason,
            e.note
        );
    }
    // Each child applied once, each cluster once (its record of the adopted image set), each
    // cluster and TableGroup status written a few times (as the children appear), events on
    // phase changes: far below a write per child per second.
    let child_applies: u64 = last
        .iter()
        .filter(|(k, _)| k.ends_with("/apply") && !k.contains("/MultigresCluster/"))
        .map(|(_, v)| v)
        .sum();
    assert_eq!(
        child_applies, child_count as u64,
        "one apply per child: {last:?}"
    );
    assert_eq!(
        last.get("multigrescluster/MultigresCluster/apply"),
        Some(&2),
        "one image record per cluster: {last:?}"
    );

    let versions = |client: Client, namespace: String| async move {
        let mut out = BTreeMap::new();
        macro_rules! collect {
            ($kind:ty) => {
                let api: Api<$kind> = Api::namespaced(client.clone(), &namespace);
                for o in api.list(&ListParams::default()).await.unwrap().items {
                    out.insert(
                        format!("{}/{}", <$kind>::kind(&()), o.name_any()),
                        o.resource_version().unwrap_or_default(),
                    );
                }
            };
        }
        collect!(MultigresCluster);
        collect!(TopoServer);
        collect!(Cell);
        collect!(TableGroup);
        collect!(Shard);
        out
    };
    let before = versions(client.clone(), namespace.clone()).await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    let after = versions(client.clone(), namespace.clone()).await;
    let writes_after = handler.writes().await;
    assert_eq!(writes_after, last, "the handler wrote while idle");
    assert_eq!(after, before, "objects changed while idle");
    println!("idle for 60s: 0 writes, {} objects unchanged", before.len());
    let known: BTreeSet<&str> = ["multigrescluster", "tablegroup", "kube"].into();
    assert!(
        last.keys()
            .all(|k| known.contains(k.split('/').next().unwrap())),
        "{last:?}"
    );
}

/// Simulates a newer operator's CRD (a value this handler's types do not know) on a control
/// plane of its own, so no other test sees the schema change.
#[tokio::test]
async fn a_cluster_the_handler_cannot_read_is_reported_and_does_not_stall_the_others() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use multigres_e2e::cluster::ClusterOptions;

    let cluster = LocalCluster::start(ClusterOptions::default())
        .await
        .unwrap_or_else(|e| panic!("starting a second control plane: {e}"));
    let client = cluster.client().unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut crd = crds.get("multigresclusters.multigres.com").await.unwrap();
    let schema = serde_json::to_value(&crd.spec.versions[0].schema).unwrap();
    let mut schema = schema;
    let policy = &mut schema["openAPIV3Schema"]["properties"]["spec"]["properties"]["images"]["properties"]
        ["imagePullPolicy"]["enum"];
    policy
        .as_array_mut()
        .expect("imagePullPolicy enum")
        .push(json!("IfNewer"));
    crd.spec.versions[0].schema = Some(serde_json::from_value(schema).unwrap());
    crds.replace("multigresclusters.multigres.com", &Default::default(), &crd)
        .await
        .unwrap();

    let namespace = fresh_namespace(&cluster, "ch-unreadable").await;
    let handler = start_handler(&cluster, &namespace).await;
    let broken = "apiVersion: multigres.com/v1alpha1\nkind: MultigresCluster\nmetadata: {name: broken}\n\
         spec:\n  postgresPasswordSecretRef: {name: pw, key: password}\n\
         \x20 images: {imagePullPolicy: IfNewer}\n\
         \x20 cells:\n    - {name: zone-a, zoneId: zone-a}\n";
    eventually("the API server accepts the new value", WAIT, || async {
        let docs = manifest::parse_documents(broken, Path::new("broken.yaml")).unwrap();
        manifest::apply(&client, &docs[0], Some(&namespace), Mode::Apply)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
    .await;
    let events: Api<Event> = Api::namespaced(client.clone(), &namespace);
    let event = eventually("an InvalidObject event", WAIT, || async {
        let list = events
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        list.items
            .into_iter()
            .find(|e| {
                e.reason.as_deref() == Some("InvalidObject")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("broken")
            })
            .ok_or_else(|| "no event yet".to_owned())
    })
    .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    let note = event.note.unwrap_or_default();
    assert!(
        note.contains("cannot be read") && note.contains("IfNewer"),
        "{note}"
    );

    apply_yaml(&client, &namespace, &read_sample("minimal")).await;
    eventually("the readable cluster's children", WAIT, || async {
        let got = all_children(&client, &namespace).await;
        if got["TopoServer"] == ["minimal-global-topo"] && got["Shard"].len() == 1 {
            Ok(())
        } else {
            Err(format!("{got:?}"))
        }
    })
    .await;
    assert_eq!(names::<Cell>(&client, &namespace).await, ["minimal-zone-a"]);
    assert!(handler.exit_status().is_none(), "{}", handler.log());
    drop(handler);
    cluster.stop();
}

#[tokio::test]
async fn a_restarted_handler_repairs_drift_and_writes_nothing_else() {
    let cluster = cluster().await;
    let namespace = fresh_namespace(cluster, "ch-restart").await;
    let client = cluster.client().unwrap();
    let first = start_handler(cluster, &namespace).await;
    apply_yaml(&client, &namespace, &read_sample("minimal")).await;
    let clusters: Api<MultigresCluster> = Api::namespaced(client.clone(), &namespace);
    let shards: Api<Shard> = Api::namespaced(client.clone(), &namespace);
    wait_observed(&clusters, "minimal").await;
    eventually("the Shard", WAIT, || async {
        shards
            .get("minimal-postgres-default-0-inf")
            .await
            .map_err(|e| e.to_string())
    })
    .await;
    first.settled(Duration::from_secs(3)).await;
    first.stop();
    drop(first);

    // While no handler runs, a person edits a Cell.
    let cells: Api<Cell> = Api::namespaced(client.clone(), &namespace);
    let cell = cells.get("minimal-zone-a").await.unwrap();
    cells
        .patch(
            "minimal-zone-a",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"multigateway": {"replicas": 4}}})),
        )
        .await
        .unwrap();

    // The next handler reconciles everything it finds at start, without any new event: it
    // reverts the edit and writes nothing else (no status, no event, no other child).
    let second = start_handler(cluster, &namespace).await;
    eventually("the edit made while down is reverted", WAIT, || async {
        let now = cells
            .get("minimal-zone-a")
            .await
            .map_err(|e| e.to_string())?;
        if now.spec == cell.spec {
            Ok(())
        } else {
            Err(format!("{:?}", now.spec.multigateway.stateless.replicas))
        }
    })
    .await;
    let writes = second.settled(Duration::from_secs(3)).await;
    assert_eq!(
        writes,
        BTreeMap::from([
            ("multigrescluster/Cell/apply".to_owned(), 1),
            ("kube/cells/patch".to_owned(), 1),
        ]),
        "{}",
        second.log()
    );
}

#[test]
fn the_harness_waits_out_the_handlers_status_pacing() {
    assert_eq!(
        multigres_e2e::harness::STATUS_PACING,
        multigres_common::status_pacer::MIN_INTERVAL
    );
}
