//! The children every sample produces (names, labels, owner references, specs), the status
//! aggregation, and which template changes concern which clusters.

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::events::EventType;
use multigres_api::resolver::{self, ResolveError, TemplateKind};
use multigres_api::v1alpha1::{
    Cell, MultigresCluster, Phase, ResolvedTemplates, TableGroup, TemplateRef, TopoServer,
};
use multigres_common::conditions::{FALSE, TRUE, find_condition};
use multigres_common::controller::Classify;
use serde_json::{Value, json};

use super::build::{self, Children};
use super::status::{self, Observed, Outcome};
use super::{Error, uses_template};
use crate::fixtures::{self, NAMESPACE, from_yaml, stored};

fn children_of(sample: &str) -> (MultigresCluster, Children) {
    let fixtures::Sample { cluster, templates } = fixtures::sample(sample);
    let resolved = resolver::resolve(&cluster, &templates)
        .unwrap_or_else(|e| panic!("{sample} does not resolve: {e}"));
    let children = build::children(&build::owner(&cluster).unwrap(), &resolved);
    (cluster, children)
}

fn names<K: kube::Resource>(objects: &[K]) -> Vec<String> {
    objects
        .iter()
        .map(|o| o.meta().name.clone().unwrap())
        .collect()
}

fn spec<K: serde::Serialize>(obj: &K) -> Value {
    serde_json::to_value(obj).unwrap()["spec"].clone()
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn standard(cluster: &str, component: &str, extra: &[(&str, &str)]) -> BTreeMap<String, String> {
    let mut out = labels(&[
        ("app.kubernetes.io/name", "multigres"),
        ("app.kubernetes.io/part-of", "multigres"),
        ("app.kubernetes.io/managed-by", "multigres-operator"),
        ("app.kubernetes.io/instance", cluster),
        ("app.kubernetes.io/component", component),
        ("multigres.com/cluster", cluster),
    ]);
    out.extend(labels(extra));
    out
}

/// Every child: in the cluster's namespace, controlled by the cluster, blocking its
/// foreground deletion.
fn assert_owned(children: &Children, cluster: &MultigresCluster) {
    let expected = json!([{
        "apiVersion": "multigres.com/v1alpha1",
        "kind": "MultigresCluster",
        "name": cluster.name_any(),
        "uid": cluster.uid().unwrap(),
        "controller": true,
        "blockOwnerDeletion": true,
    }]);
    let metas = children
        .topo_servers
        .iter()
        .map(|c| &c.metadata)
        .chain(children.cells.iter().map(|c| &c.metadata))
        .chain(children.table_groups.iter().map(|c| &c.metadata));
    for meta in metas {
        assert_eq!(meta.namespace.as_deref(), Some(NAMESPACE));
        assert_eq!(
            serde_json::to_value(&meta.owner_references).unwrap(),
            expected,
            "{:?}",
            meta.name
        );
    }
}

#[test]
fn minimal_sample_gets_a_managed_topology_one_cell_and_the_default_table_group() {
    let (cluster, children) = children_of("minimal");
    assert_eq!(names(&children.topo_servers), ["minimal-global-topo"]);
    assert_eq!(names(&children.cells), ["minimal-zone-a"]);
    assert_eq!(names(&children.table_groups), ["minimal-postgres-default"]);
    assert_owned(&children, &cluster);

    let topo = &children.topo_servers[0];
    assert_eq!(topo.labels(), &standard("minimal", "global-topo", &[]));
    assert_eq!(
        spec(topo),
        json!({
            "etcd": {
                "image": "gcr.io/etcd-development/etcd:v3.6.7",
                "replicas": 3,
                "storage": {"size": "1Gi", "accessModes": ["ReadWriteOnce"]},
                "resources": {
                    "requests": {"cpu": "100m", "memory": "256Mi"},
                    "limits": {"memory": "512Mi"},
                },
                "rootPath": "/multigres/global",
                "pvcDeletionPolicy": {"whenDeleted": "Retain", "whenScaled": "Retain"},
            },
            "pvcDeletionPolicy": {"whenDeleted": "Retain", "whenScaled": "Retain"},
        })
    );

    let cell = &children.cells[0];
    assert_eq!(
        cell.labels(),
        &standard("minimal", "cell", &[("multigres.com/cell", "zone-a")])
    );
    let cell_spec = spec(cell);
    assert_eq!(cell_spec["name"], "zone-a");
    assert_eq!(cell_spec["zone"], "zone-a");
    assert!(cell_spec.get("zoneId").is_none(), "{cell_spec}");
    assert_eq!(cell_spec["multigateway"]["replicas"], 1);
    assert_eq!(cell_spec["allCells"], json!(["zone-a"]));
    assert_eq!(
        cell_spec["globalTopoServer"],
        json!({
            "address": "minimal-global-topo.ns.svc:2379",
            "rootPath": "/multigres/global",
            "implementation": "etcd",
        })
    );
    assert!(cell_spec.get("topoServer").is_none(), "{cell_spec}");

    let tg = &children.table_groups[0];
    assert_eq!(
        tg.labels(),
        &standard(
            "minimal",
            "tablegroup",
            &[
                ("multigres.com/database", "postgres"),
                ("multigres.com/tablegroup", "default")
            ]
        )
    );
    let tg_spec = spec(tg);
    assert_eq!(tg_spec["databaseName"], "postgres");
    assert_eq!(tg_spec["tableGroupName"], "default");
    assert_eq!(tg_spec["shards"].as_array().unwrap().len(), 1);
    let shard = &tg_spec["shards"][0];
    assert_eq!(shard["name"], "0-inf");
    assert_eq!(shard["pools"]["default"]["cells"], json!(["zone-a"]));
    assert_eq!(
        shard["pools"]["default"]["replicasPerCell"], 3,
        "one cell: three pods survive the loss of any one"
    );
    assert_eq!(
        tg_spec["postgresPasswordSecretRef"]["name"],
        "minimal-postgres-password"
    );
}

#[test]
fn external_topology_sample_gets_no_topo_server_and_points_cells_at_the_endpoint() {
    let (cluster, children) = children_of("external-topo");
    assert!(children.topo_servers.is_empty());
    assert_eq!(
        names(&children.cells),
        ["external-topo-zone-a", "external-topo-zone-b"]
    );
    assert_eq!(
        names(&children.table_groups),
        ["external-topo-postgres-default"]
    );
    assert_owned(&children, &cluster);
    for cell in &children.cells {
        assert_eq!(
            spec(cell)["globalTopoServer"],
            json!({
                "address": "topo-etcd:2379",
                "rootPath": "/multigres/external-topo",
                "implementation": "etcd",
            })
        );
    }
    assert_eq!(
        spec(&children.table_groups[0])["globalTopoServer"]["address"],
        "topo-etcd:2379"
    );
}

#[test]
fn templated_sample_takes_every_component_from_its_templates() {
    let (cluster, children) = children_of("templated");
    assert_eq!(names(&children.topo_servers), ["templated-global-topo"]);
    assert_eq!(
        names(&children.cells),
        ["templated-zone-a", "templated-zone-b", "templated-zone-c"]
    );
    assert_eq!(
        names(&children.table_groups),
        ["templated-postgres-default"]
    );
    assert_owned(&children, &cluster);
    assert_eq!(
        spec(&children.topo_servers[0])["etcd"]["storage"]["size"],
        "2Gi"
    );
    for cell in &children.cells {
        let gateway = &spec(cell)["multigateway"];
        assert_eq!(gateway["replicas"], 2, "{}", cell.name_any());
        assert_eq!(gateway["buffer"]["window"], "10s");
    }
    let shard = &spec(&children.table_groups[0])["shards"][0];
    assert_eq!(shard["pools"]["main"]["storage"]["size"], "5Gi");
    assert_eq!(
        shard["pools"]["main"]["cells"],
        json!(["zone-a", "zone-b", "zone-c"])
    );
    assert_eq!(shard["postgresConfig"]["max_connections"], "200");
}

#[test]
fn overrides_sample_merges_cell_and_shard_overrides_over_the_templates() {
    let (cluster, children) = children_of("overrides");
    assert_eq!(names(&children.topo_servers), ["overrides-global-topo"]);
    assert_eq!(
        names(&children.cells),
        ["overrides-zone-a", "overrides-zone-b"]
    );
    assert_owned(&children, &cluster);

    let zone_a = spec(&children.cells[0])["multigateway"].clone();
    assert_eq!(zone_a["replicas"], 2);
    assert_eq!(
        zone_a["resources"]["requests"]["cpu"], "50m",
        "template kept"
    );
    assert_eq!(zone_a["podAnnotations"]["example.com/team"], "payments");
    let zone_b = spec(&children.cells[1])["multigateway"].clone();
    assert_eq!(zone_b["replicas"], 1);
    assert!(zone_b.get("podAnnotations").is_none());

    let tg = spec(&children.table_groups[0]);
    assert_eq!(tg["pvcDeletionPolicy"]["whenDeleted"], "Retain");
    let shard = &tg["shards"][0];
    assert_eq!(shard["pools"]["main"]["replicasPerCell"], 2);
    assert_eq!(shard["pools"]["main"]["storage"]["size"], "4Gi");
    assert_eq!(shard["pools"]["reporting"]["cells"], json!(["zone-a"]));
    assert_eq!(
        shard["postgresConfig"],
        json!({"max_connections": "100", "work_mem": "8MB"})
    );
}

#[test]
fn inline_sample_uses_its_inline_specs() {
    let (cluster, children) = children_of("inline");
    assert_eq!(names(&children.topo_servers), ["inline-global-topo"]);
    assert_eq!(names(&children.cells), ["inline-zone-a", "inline-zone-b"]);
    assert_eq!(names(&children.table_groups), ["inline-postgres-default"]);
    assert_owned(&children, &cluster);
    let shard = &spec(&children.table_groups[0])["shards"][0];
    assert_eq!(shard["pools"]["main"]["cells"], json!(["zone-a", "zone-b"]));
    assert_eq!(shard["multiorch"]["cells"], json!(["zone-a", "zone-b"]));
    assert_eq!(shard["postgresConfig"]["max_connections"], "100");
}

#[test]
fn a_cell_with_a_local_etcd_gets_its_own_topo_server() {
    let cluster: MultigresCluster = stored(
        from_yaml(
            r#"
apiVersion: multigres.com/v1alpha1
kind: MultigresCluster
metadata: {name: prod}
spec:
  postgresPasswordSecretRef: {name: pw, key: password}
  cells:
    - name: zone-a
      zoneId: zone-a
      spec:
        localTopoServer:
          etcd: {replicas: 1}
    - name: zone-b
      zoneId: zone-b
"#,
        ),
        "uid-prod",
        4,
    );
    let resolved = resolver::resolve(&cluster, &Default::default()).unwrap();
    let children = build::children(&build::owner(&cluster).unwrap(), &resolved);
    assert_eq!(
        names(&children.topo_servers),
        ["prod-global-topo", "prod-zone-a-local-topo"]
    );
    let local = &children.topo_servers[1];
    assert_eq!(
        local.labels(),
        &standard("prod", "local-topo", &[("multigres.com/cell", "zone-a")])
    );
    assert_eq!(spec(local)["etcd"]["replicas"], 1);
    assert_eq!(spec(local)["etcd"]["rootPath"], "/multigres/zone-a");
    assert_eq!(
        spec(&children.cells[0])["topoServer"]["etcd"]["replicas"],
        1
    );
    assert!(spec(&children.cells[1]).get("topoServer").is_none());
    assert_owned(&children, &cluster);
}

#[test]
fn long_names_are_shortened_with_a_stable_hash() {
    let yaml = r#"
apiVersion: multigres.com/v1alpha1
kind: MultigresCluster
metadata: {name: a-twenty-five-char-name-x}
spec:
  postgresPasswordSecretRef: {name: pw, key: password}
  cells:
    - name: a-cell-name-of-thirty-chars-xy
      region: us-east-1
      spec:
        localTopoServer:
          etcd: {}
"#;
    let build = || {
        let cluster: MultigresCluster = stored(from_yaml(yaml), "uid-long", 1);
        let resolved = resolver::resolve(&cluster, &Default::default()).unwrap();
        build::children(&build::owner(&cluster).unwrap(), &resolved)
    };
    let children = build();
    let local = children.topo_servers[1].name_any();
    assert!(local.len() <= 63, "{local}");
    let (prefix, hash) = local.rsplit_once('-').unwrap();
    assert_eq!(
        prefix,
        "a-twenty-five-char-name-x-a-cell-name-of-thirty-chars"
    );
    assert!(
        hash.len() == 8 && hash.chars().all(|c| c.is_ascii_hexdigit()),
        "{local}"
    );
    assert!(
        !local.contains("local-topo"),
        "cut before the hash: {local}"
    );
    assert_eq!(local, build().topo_servers[1].name_any(), "stable");
    assert_eq!(
        children.cells[0].name_any(),
        "a-twenty-five-char-name-x-a-cell-name-of-thirty-chars-xy",
        "a name that fits is not hashed"
    );
}

#[test]
fn a_cluster_never_stored_has_no_children() {
    let mut cluster = fixtures::sample("minimal").cluster;
    cluster.metadata.uid = None;
    assert_eq!(
        build::owner(&cluster).unwrap_err().to_string(),
        "the object has no metadata.uid: only a stored object owns children"
    );
}

// --- status ---------------------------------------------------------------------------------

fn at(seconds: i64) -> Timestamp {
    Timestamp::from_second(seconds).unwrap()
}

fn referenced(cluster: &MultigresCluster) -> ResolvedTemplates {
    resolver::referenced_templates(cluster)
}

/// Every child as its handler would report it: `phase` at the current generation, cells
/// Available when Healthy, TableGroups with all shards ready when Healthy.
fn observed(children: &Children, phase: &str) -> Observed {
    fn report<K: serde::Serialize + serde::de::DeserializeOwned>(
        child: &K,
        status: Value,
    ) -> (String, K) {
        let mut value = serde_json::to_value(child).unwrap();
        value["metadata"]["generation"] = json!(2);
        value["status"] = status;
        let name = value["metadata"]["name"].as_str().unwrap().to_owned();
        (name, serde_json::from_value(value).unwrap())
    }
    let available = if phase == "Healthy" { "True" } else { "False" };
    Observed {
        topo_servers: children
            .topo_servers
            .iter()
            .map(|t| report(t, json!({"phase": phase, "observedGeneration": 2})))
            .collect(),
        cells: children
            .cells
            .iter()
            .map(|c| {
                report(
                    c,
                    json!({
                        "phase": phase, "observedGeneration": 2, "gatewayReplicas": 2,
                        "conditions": [{
                            "type": "Available", "status": available, "reason": "R",
                            "message": "m", "lastTransitionTime": "2026-01-01T00:00:00Z",
                        }],
                    }),
                )
            })
            .collect(),
        table_groups: children
            .table_groups
            .iter()
            .map(|t| {
                let ready = if phase == "Healthy" { 1 } else { 0 };
                report(
                    t,
                    json!({"phase": phase, "observedGeneration": 2, "readyShards": ready, "totalShards": 1}),
                )
            })
            .collect(),
    }
}

fn with_status(mut cluster: MultigresCluster, computed: &status::Computed) -> MultigresCluster {
    cluster.status = Some(computed.status.clone());
    cluster
}

#[test]
fn a_new_cluster_is_initializing_until_its_children_report() {
    let (cluster, children) = children_of("external-topo");
    let computed = status::compute(
        &cluster,
        &Outcome::Applied(&children),
        &Observed::default(),
        referenced(&cluster),
        at(100),
    );
    let s = &computed.status;
    assert!(!computed.changed.is_empty());
    assert_eq!(s.observed_generation, Some(1));
    assert_eq!(s.phase, Some(Phase::Initializing));
    assert_eq!(
        s.message.as_deref(),
        Some(
            "0/3 components healthy; Cell external-topo-zone-a does not exist yet; \
             Cell external-topo-zone-b does not exist yet; \
             TableGroup external-topo-postgres-default does not exist yet"
        )
    );
    let available = find_condition(&s.conditions, "Available").unwrap();
    assert_eq!(
        (available.status.as_str(), available.reason.as_str()),
        (FALSE, "CellsNotReady")
    );
    assert_eq!(
        available.message,
        "0/2 cells ready; not ready: zone-a; zone-b"
    );
    let progressing = find_condition(&s.conditions, "Progressing").unwrap();
    assert_eq!(
        (progressing.status.as_str(), progressing.reason.as_str()),
        (TRUE, "Reconciling")
    );
    let degraded = find_condition(&s.conditions, "Degraded").unwrap();
    assert_eq!(
        (degraded.status.as_str(), degraded.reason.as_str()),
        (FALSE, "AsExpected")
    );
    assert_eq!(s.cells.len(), 2);
    assert!(
        s.cells
            .values()
            .all(|c| !c.ready && c.gateway_replicas == 0)
    );
    let db = &s.databases[&multigres_api::v1alpha1::DatabaseName::new("postgres")];
    assert_eq!((db.ready_shards, db.total_shards), (0, 1));
    assert_eq!(
        s.resolved_templates.as_ref().unwrap().shard_templates,
        [TemplateRef::new("default")]
    );
    assert!(computed.notices.is_empty(), "{:?}", computed.notices);
}

#[test]
fn healthy_children_make_a_healthy_available_cluster_and_a_recompute_writes_nothing() {
    let (mut cluster, children) = children_of("minimal");
    cluster.metadata.generation = Some(2);
    let observed = observed(&children, "Healthy");
    let first = status::compute(
        &cluster,
        &Outcome::Applied(&children),
        &observed,
        referenced(&cluster),
        at(100),
    );
    let s = &first.status;
    assert_eq!(s.phase, Some(Phase::Healthy));
    assert_eq!(s.message.as_deref(), Some("All 3 components are healthy"));
    assert!(multigres_common::conditions::is_true(
        &s.conditions,
        "Available"
    ));
    let zone_a = &s.cells[&multigres_api::v1alpha1::CellName::new("zone-a")];
    assert!(zone_a.ready);
    assert_eq!(zone_a.gateway_replicas, 2);
    let db = &s.databases[&multigres_api::v1alpha1::DatabaseName::new("postgres")];
    assert_eq!((db.ready_shards, db.total_shards), (1, 1));

    // The same inputs later: nothing to write, nothing to tell, no timestamp moved.
    let cluster = with_status(cluster, &first);
    let again = status::compute(
        &cluster,
        &Outcome::Applied(&children),
        &observed,
        referenced(&cluster),
        at(500),
    );
    assert_eq!(again.changed, Vec::<&str>::new());
    assert!(again.notices.is_empty());
    assert_eq!(again.status, first.status);
}

#[test]
fn conditions_of_other_handlers_are_neither_sent_nor_compared() {
    let (cluster, children) = children_of("minimal");
    let first = status::compute(
        &cluster,
        &Outcome::Applied(&children),
        &Observed::default(),
        referenced(&cluster),
        at(100),
    );
    let mut stored_status = first.status.clone();
    stored_status
        .conditions
        .push(k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
            type_: "TopologyRegistered".into(),
            status: TRUE.into(),
            reason: "Registered".into(),
            message: "cell registered".into(),
            observed_generation: Some(1),
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at(50)),
        });
    let mut cluster = cluster;
    cluster.status = Some(stored_status);
    let again = status::compute(
        &cluster,
        &Outcome::Applied(&children),
        &Observed::default(),
        referenced(&cluster),
        at(200),
    );
    assert_eq!(again.changed, Vec::<&str>::new());
    assert!(
        again
            .status
            .conditions
            .iter()
            .all(|c| c.type_ != "TopologyRegistered")
    );
}

#[test]
fn a_stale_or_degraded_child_shows_in_phase_and_conditions() {
    let (mut cluster, children) = children_of("minimal");
    cluster.metadata.generation = Some(2);
    let mut observed = observed(&children, "Healthy");
    let cell = observed.cells.get_mut("minimal-zone-a").unwrap();
    cell.metadata.generation = Some(3);
    let stale = status::compute(
        &cluster,
        &Outcome::Applied(&children),
        &observed,
        referenced(&cluster),
        at(100),
    );
    assert_eq!(stale.status.phase, Some(Phase::Progressing));
    assert_eq!(
        stale.status.message.as_deref(),
        Some("2/3 components healthy; Cell minimal-zone-a has not observed its latest spec yet")
    );
    assert!(!stale.status.cells.values().next().unwrap().ready);

    let mut observed = self::observed(&children, "Healthy");
    let topo = observed
        .topo_servers
        .get_mut("minimal-global-topo")
        .unwrap();
    let status = topo.status.as_mut().unwrap();
    status.phase = Some(Phase::Degraded);
    status.message = Some("1/3 members ready".into());
    let degraded = status::compute(
        &cluster,
        &Outcome::Applied(&children),
        &observed,
        referenced(&cluster),
        at(100),
    );
    assert_eq!(degraded.status.phase, Some(Phase::Degraded));
    let condition = find_condition(&degraded.status.conditions, "Degraded").unwrap();
    assert_eq!(
        (
            condition.status.as_str(),
            condition.reason.as_str(),
            condition.message.as_str()
        ),
        (
            TRUE,
            "ChildDegraded",
            "TopoServer minimal-global-topo: 1/3 members ready"
        )
    );
    assert!(
        degraded
            .notices
            .iter()
            .any(|n| n.type_ == EventType::Warning && n.reason == "ChildDegraded")
    );
}

#[test]
fn a_missing_template_blocks_with_a_condition_and_a_warning() {
    let fixtures::Sample {
        cluster,
        mut templates,
    } = fixtures::sample("templated");
    templates.shard.remove("standard-shard");
    let error = Error::from(resolver::resolve(&cluster, &templates).unwrap_err());
    assert!(error.is_invalid_spec());
    assert_eq!(error.reason(), "TemplateNotFound");
    let message = error.to_string();
    assert!(
        message.contains("ShardTemplate \"standard-shard\" does not exist"),
        "{message}"
    );

    let computed = status::compute(
        &cluster,
        &Outcome::Blocked {
            reason: error.reason(),
            message: message.clone(),
        },
        &Observed::default(),
        referenced(&cluster),
        at(100),
    );
    let s = &computed.status;
    assert_eq!(s.phase, Some(Phase::Degraded));
    for type_ in ["Degraded", "Progressing"] {
        let c = find_condition(&s.conditions, type_).unwrap();
        assert_eq!(c.reason, "TemplateNotFound", "{type_}");
        assert_eq!(c.message, message, "{type_}");
    }
    assert_eq!(
        find_condition(&s.conditions, "Degraded").unwrap().status,
        TRUE
    );
    assert_eq!(
        s.resolved_templates.as_ref().unwrap().shard_templates,
        [
            TemplateRef::new("default"),
            TemplateRef::new("standard-shard")
        ],
        "the missing template is recorded, so creating it re-resolves the cluster"
    );
    let warning = computed
        .notices
        .iter()
        .find(|n| n.reason == "TemplateNotFound")
        .expect("a TemplateNotFound event");
    assert_eq!(warning.type_, EventType::Warning);
    assert_eq!(warning.message, message);
}

#[test]
fn unsupported_values_and_refused_children_are_spec_errors_and_io_is_not() {
    let unsupported = Error::from(ResolveError::UnsupportedDurabilityPolicy {
        field: "spec.durabilityPolicy".into(),
        value: "ALL".into(),
    });
    assert!(unsupported.is_invalid_spec());
    assert_eq!(unsupported.reason(), "InvalidSpec");
    let refused = Error::Rejected {
        kind: "Cell".into(),
        name: "c".into(),
        message: "spec.name: Invalid value".into(),
    };
    assert!(refused.is_invalid_spec());
    let foreign = Error::Foreign {
        kind: "Cell".into(),
        name: "c".into(),
        owner_kind: "MultigresCluster".into(),
        owner: "old".into(),
    };
    assert!(!foreign.is_invalid_spec());
    assert_eq!(foreign.reason(), "NameConflict");
}

#[test]
fn template_changes_concern_the_clusters_that_recorded_them() {
    let recorded = ResolvedTemplates {
        core_templates: vec![TemplateRef::new("default")],
        cell_templates: vec![TemplateRef::new("default"), TemplateRef::new("big")],
        shard_templates: vec![TemplateRef::new("default")],
    };
    assert!(uses_template(Some(&recorded), TemplateKind::Cell, "big"));
    assert!(uses_template(
        Some(&recorded),
        TemplateKind::Shard,
        "default"
    ));
    assert!(!uses_template(Some(&recorded), TemplateKind::Shard, "big"));
    assert!(!uses_template(Some(&recorded), TemplateKind::Cell, "small"));
    assert!(uses_template(None, TemplateKind::Core, "anything"));
}

#[test]
fn clusters_using_a_template_are_found_in_its_namespace_only() {
    use kube::runtime::reflector::{self, ObjectRef};
    use kube::runtime::watcher::Event;

    let (reader, mut writer) = reflector::store();
    let cluster = |name: &str, namespace: &str, cell_template: Option<&str>| {
        let mut c = fixtures::sample("minimal").cluster;
        c.metadata.name = Some(name.into());
        c.metadata.namespace = Some(namespace.into());
        c.status = cell_template.map(|t| multigres_api::v1alpha1::MultigresClusterStatus {
            resolved_templates: Some(ResolvedTemplates {
                cell_templates: vec![TemplateRef::new(t)],
                ..Default::default()
            }),
            ..Default::default()
        });
        multigres_common::guard::Guarded(Ok(c))
    };
    for obj in [
        cluster("uses", "ns", Some("big")),
        cluster("other", "ns", Some("small")),
        cluster("fresh", "ns", None),
        cluster("elsewhere", "other-ns", Some("big")),
    ] {
        writer.apply_watcher_event(&Event::Apply(obj));
    }
    let template: multigres_api::v1alpha1::CellTemplate = stored(
        from_yaml(
            "apiVersion: multigres.com/v1alpha1\nkind: CellTemplate\nmetadata: {name: big}\nspec: {}\n",
        ),
        "t",
        1,
    );
    let mut found: Vec<String> = super::clusters_using(&reader, TemplateKind::Cell, &template)
        .into_iter()
        .map(|r: ObjectRef<_>| r.name)
        .collect();
    found.sort();
    assert_eq!(found, ["fresh", "uses"]);
}

#[test]
fn cells_and_table_groups_without_status_are_not_ready() {
    let (cluster, children) = children_of("minimal");
    let mut observed = Observed::default();
    let cell: Cell = children.cells[0].clone();
    observed.cells.insert(cell.name_any(), cell);
    let tg: TableGroup = children.table_groups[0].clone();
    observed.table_groups.insert(tg.name_any(), tg);
    let topo: TopoServer = children.topo_servers[0].clone();
    observed.topo_servers.insert(topo.name_any(), topo);
    let computed = status::compute(
        &cluster,
        &Outcome::Applied(&children),
        &observed,
        referenced(&cluster),
        at(1),
    );
    assert_eq!(computed.status.phase, Some(Phase::Initializing));
    assert!(
        computed
            .status
            .message
            .unwrap()
            .contains("has not reported status")
    );
}

#[test]
fn ready_gateways_without_ready_shards_are_not_available() {
    let (cluster, children) = children_of("external-topo");
    let mut observed = observed(&children, "Healthy");
    for table_group in observed.table_groups.values_mut() {
        let status = table_group.status.as_mut().unwrap();
        status.ready_shards = Some(0);
    }
    let computed = status::compute(
        &cluster,
        &Outcome::Applied(&children),
        &observed,
        referenced(&cluster),
        at(100),
    );
    let available = find_condition(&computed.status.conditions, "Available").unwrap();
    assert_eq!(
        (available.status.as_str(), available.reason.as_str()),
        (FALSE, "ShardsNotReady")
    );
    assert_eq!(
        available.message,
        "The gateways are ready, but 0/1 shards are: queries are not served until every shard \
         is; waiting for: postgres (0/1); each Shard's Available condition names the pods \
         holding it back (kubectl describe shards -n ns -l multigres.com/cluster=external-topo)"
    );

    let ready = status::compute(
        &cluster,
        &Outcome::Applied(&children),
        &self::observed(&children, "Healthy"),
        referenced(&cluster),
        at(100),
    );
    let available = find_condition(&ready.status.conditions, "Available").unwrap();
    assert_eq!(
        (available.status.as_str(), available.reason.as_str()),
        (TRUE, "AllCellsAndShardsReady")
    );
}

#[test]
fn a_paused_cluster_says_so_and_its_children_carry_the_annotation_until_resumed() {
    let (mut cluster, _) = children_of("minimal");
    cluster
        .annotations_mut()
        .insert(multigres_api::labels::PAUSED.into(), "true".into());
    let owner = build::owner(&cluster).unwrap();
    let templates = resolver::Templates::default();
    let resolved = resolver::resolve(&cluster, &templates).unwrap();
    let children = build::children(&owner, &resolved);
    for annotations in children
        .cells
        .iter()
        .map(|c| c.annotations())
        .chain(children.table_groups.iter().map(|t| t.annotations()))
        .chain(children.topo_servers.iter().map(|t| t.annotations()))
    {
        assert_eq!(annotations[multigres_api::labels::PAUSED], "true");
    }
    let observed = observed(&children, "Healthy");
    let compute = |cluster: &MultigresCluster, now| {
        status::compute(
            cluster,
            &Outcome::Applied(&children),
            &observed,
            referenced(cluster),
            now,
        )
    };
    let paused = compute(&cluster, at(100));
    let condition =
        multigres_common::conditions::find_condition(&paused.status.conditions, status::PAUSED)
            .unwrap();
    assert_eq!(
        (condition.status.as_str(), condition.reason.as_str()),
        ("True", "PausedByAnnotation")
    );
    assert!(condition.message.contains("kubectl multigres resume"));
    let cluster = with_status(cluster, &paused);
    assert!(compute(&cluster, at(200)).changed.is_empty());

    // Resumed: the condition goes, and so does the children's annotation.
    let mut resumed = cluster.clone();
    resumed
        .annotations_mut()
        .insert(multigres_api::labels::PAUSED.into(), "false".into());
    let after = compute(&resumed, at(300));
    assert!(after.changed.contains(&"conditions"), "{:?}", after.changed);
    assert!(
        multigres_common::conditions::find_condition(&after.status.conditions, status::PAUSED)
            .is_none()
    );
    let owner = build::owner(&resumed).unwrap();
    let children = build::children(&owner, &resolver::resolve(&resumed, &templates).unwrap());
    assert!(
        children.cells[0]
            .annotations()
            .get(multigres_api::labels::PAUSED)
            .is_some_and(|v| v == "false")
    );
}

#[test]
fn a_hibernating_cluster_passes_the_switch_on_and_is_hibernated_once_its_children_are() {
    let (mut cluster, _) = children_of("minimal");
    cluster
        .annotations_mut()
        .insert(multigres_api::labels::HIBERNATE.into(), "true".into());
    let owner = build::owner(&cluster).unwrap();
    let resolved = resolver::resolve(&cluster, &resolver::Templates::default()).unwrap();
    let children = build::children(&owner, &resolved);
    for annotations in children
        .cells
        .iter()
        .map(|c| c.annotations())
        .chain(children.table_groups.iter().map(|t| t.annotations()))
    {
        assert_eq!(annotations[multigres_api::labels::HIBERNATE], "true");
    }
    let compute = |observed: &Observed, now| {
        status::compute(
            &cluster,
            &Outcome::Applied(&children),
            observed,
            referenced(&cluster),
            now,
        )
    };
    let hibernated = |computed: &status::Computed| {
        let c = find_condition(&computed.status.conditions, status::HIBERNATED).unwrap();
        (c.status.clone(), c.reason.clone())
    };
    // Pods still stopping: Progressing, and the condition says so.
    let stopping = compute(&observed(&children, "Progressing"), at(100));
    assert_eq!(stopping.status.phase, Some(Phase::Progressing));
    assert_eq!(hibernated(&stopping), (FALSE.into(), "Hibernating".into()));
    // Cells and table groups hibernated, the etcd healthy: the cluster is Hibernated.
    let mut asleep = observed(&children, "Hibernated");
    asleep.topo_servers = observed(&children, "Healthy").topo_servers;
    let done = compute(&asleep, at(200));
    assert_eq!(done.status.phase, Some(Phase::Hibernated));
    assert_eq!(hibernated(&done), (TRUE.into(), "Hibernated".into()));
    let progressing = find_condition(&done.status.conditions, "Progressing").unwrap();
    assert_eq!(progressing.status, FALSE);
}
