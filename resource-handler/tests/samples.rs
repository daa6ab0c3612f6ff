//! Every sample in `deploy/samples/`, followed from its YAML down to the workloads with no API
//! server: the cluster is resolved against the sample's templates as the cluster-handler does,
//! its children (TopoServer, Cell, Shard) get the resolved specs, and the resource-handler's own
//! builders turn them into Deployments, StatefulSets, Services and the postgresql.conf
//! ConfigMap. The expectations ([`SAMPLES`]) are read off each sample's YAML, and off the
//! built-in defaults where it says nothing, so the resolver's variants (inline, templated,
//! overrides, external topology), which differ only in how the spec is written, are checked in
//! milliseconds rather than on real pods.
//!
//! The kwok tier (`e2e/tests/cluster_handler.rs`, `every_sample_produces_exactly_its_children`)
//! checks that the cluster-handler writes exactly these resolved specs into its children; the
//! two together cover sample → workloads. Webhook defaulting (internal TLS on for a new
//! cluster) is left out: the samples are resolved as written, and the webhook's own tests cover
//! what it adds.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use cluster_handler::cluster::build as cluster_build;
use cluster_handler::tablegroup::build as tablegroup_build;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, PersistentVolumeClaim, PodSpec, PodTemplateSpec, ResourceRequirements,
    Service,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use multigres_api::labels::CELL;
use multigres_api::owner::Owner;
use multigres_api::resolver::cohort::{Durability, survives_any_pod_loss};
use multigres_api::resolver::{self, ResolvedCluster, Templates, ZONE_NODE_LABEL, defaults};
use multigres_api::v1alpha1::{
    Cell, CellTemplate, CoreTemplate, GatewayTlsConfig, InternalTlsConfig, MultigresCluster, Shard,
    ShardTemplate, TopoServer,
};
use resource_handler::podspec::PullSettings;
use resource_handler::shard::pgconfig::CONFIG_KEY;
use resource_handler::toposerver::build::{Level, TopoInput};
use resource_handler::{cell, multiadmin, names, shard, toposerver};
use serde::Deserialize;

/// The namespace the samples are applied to (the topology address names it).
const NAMESPACE: &str = "samples";

/// Requests and limits as the samples write them: `cpu`, `memory` requested, `memory` limit.
#[derive(Clone, Copy, Debug)]
struct Res {
    cpu: &'static str,
    memory: &'static str,
    memory_limit: &'static str,
}

const fn res(cpu: &'static str, memory: &'static str, memory_limit: &'static str) -> Res {
    Res {
        cpu,
        memory,
        memory_limit,
    }
}

/// The global topology a sample asks for.
enum Topology {
    /// The operator runs etcd: `members` pods of `storage` each, `resources` (None: the
    /// built-in default), the cluster's records under `root`.
    Managed {
        members: i32,
        storage: &'static str,
        resources: Option<Res>,
        root: &'static str,
    },
    /// An etcd the user runs, at `address`, records under `root`: no TopoServer.
    External {
        address: &'static str,
        root: &'static str,
    },
}

/// A cell's multigateway.
struct Gateway {
    cell: &'static str,
    /// The cell's `zone`, which its pods are pinned to.
    zone: &'static str,
    replicas: i32,
    /// None: the built-in default.
    resources: Option<Res>,
    pod_annotations: &'static [(&'static str, &'static str)],
}

/// One pool in one cell: its StatefulSet.
struct Pool {
    pool: &'static str,
    cell: &'static str,
    replicas: i32,
    storage: &'static str,
    /// pgctld's (PostgreSQL's) resources; None: the built-in default.
    postgres: Option<Res>,
    /// multipooler's resources; None: the built-in default.
    multipooler: Option<Res>,
}

/// What one sample's YAML (and the defaults where it is silent) say its workloads are.
struct Expected {
    file: &'static str,
    /// `metadata.name` of the MultigresCluster.
    cluster: &'static str,
    topology: Topology,
    gateways: &'static [Gateway],
    /// Every gateway's `--buffer-*` flags, exactly.
    buffer_flags: &'static [&'static str],
    /// The shard `postgres/default/0-inf`, pool by pool and cell by cell.
    pools: &'static [Pool],
    /// Cells with one multiorch of the shard.
    multiorch_cells: &'static [&'static str],
    /// multiorch's `--leader-failover-grace-period-base` and `-max-jitter`.
    multiorch_grace: (&'static str, &'static str),
    /// Parameters the rendered postgresql.conf must set (its last line for each wins).
    postgres: &'static [(&'static str, &'static str)],
    /// The shard's filesystem backup volume: size and access mode; its mount path.
    backup: (&'static str, &'static str, &'static str),
    /// multiadmin's resources; None: the built-in default.
    multiadmin: Option<Res>,
}

/// The built-in backup volume, where a sample names none (minimal.yaml's header lists it).
const BACKUP_DEFAULT: (&str, &str, &str) = ("10Gi", "ReadWriteOnce", "/backups");
/// The backup volume of the multi-cell samples: every cell's pool pods mount it.
const BACKUP_SHARED: (&str, &str, &str) = ("10Gi", "ReadWriteMany", "/backups");
/// multiorch's built-in grace periods before it appoints a new primary.
const GRACE_DEFAULT: (&str, &str) = ("1s", "2s");
/// What the resolver gives every gateway's buffer when the spec leaves it out.
const BUFFER_DEFAULT: &[&str] = &[
    "--buffer-enabled=true",
    "--buffer-min-time-between-failovers=0s",
];

const fn gateway(cell: &'static str, replicas: i32, resources: Option<Res>) -> Gateway {
    Gateway {
        cell,
        zone: cell,
        replicas,
        resources,
        pod_annotations: &[],
    }
}

const fn pool(
    pool: &'static str,
    cell: &'static str,
    replicas: i32,
    storage: &'static str,
) -> Pool {
    Pool {
        pool,
        cell,
        replicas,
        storage,
        postgres: None,
        multipooler: None,
    }
}

/// Every sample, as its YAML reads.
const SAMPLES: [Expected; 5] = [
    // Nothing but one cell: every value is a default. A 3-member etcd of 1Gi volumes, one
    // gateway, the default pool with three pods (one cell: a primary and two replicas), a 10Gi
    // ReadWriteOnce backup volume.
    Expected {
        file: "minimal.yaml",
        cluster: "minimal",
        topology: Topology::Managed {
            members: 3,
            storage: "1Gi",
            resources: None,
            root: "/multigres/global",
        },
        gateways: &[gateway("zone-a", 1, None)],
        buffer_flags: BUFFER_DEFAULT,
        pools: &[pool("default", "zone-a", 3, "1Gi")],
        multiorch_cells: &["zone-a"],
        multiorch_grace: GRACE_DEFAULT,
        postgres: &[],
        backup: BACKUP_DEFAULT,
        multiadmin: None,
    },
    // Everything inline: pool `main` in both cells with two pods each, the resources and
    // max_connections written in the cluster itself.
    Expected {
        file: "inline.yaml",
        cluster: "inline",
        topology: Topology::Managed {
            members: 3,
            storage: "1Gi",
            resources: None,
            root: "/multigres/global",
        },
        gateways: &[
            gateway("zone-a", 1, Some(res("100m", "128Mi", "256Mi"))),
            gateway("zone-b", 1, None),
        ],
        buffer_flags: BUFFER_DEFAULT,
        pools: &[
            Pool {
                postgres: Some(res("100m", "256Mi", "512Mi")),
                multipooler: Some(res("100m", "128Mi", "256Mi")),
                ..pool("main", "zone-a", 2, "1Gi")
            },
            Pool {
                postgres: Some(res("100m", "256Mi", "512Mi")),
                multipooler: Some(res("100m", "128Mi", "256Mi")),
                ..pool("main", "zone-b", 2, "1Gi")
            },
        ],
        multiorch_cells: &["zone-a", "zone-b"],
        multiorch_grace: GRACE_DEFAULT,
        postgres: &[("max_connections", "100")],
        backup: BACKUP_SHARED,
        multiadmin: None,
    },
    // From templates: standard-core's etcd (2Gi volumes) and multiadmin, standard-cell's two
    // gateways per cell with their failover buffer, standard-shard's pool (5Gi, its PostgreSQL
    // resources) in every cell, its grace periods and PostgreSQL parameters.
    Expected {
        file: "templated.yaml",
        cluster: "templated",
        topology: Topology::Managed {
            members: 3,
            storage: "2Gi",
            resources: Some(res("100m", "256Mi", "512Mi")),
            root: "/multigres/global",
        },
        gateways: &[
            gateway("zone-a", 2, Some(res("100m", "128Mi", "256Mi"))),
            gateway("zone-b", 2, Some(res("100m", "128Mi", "256Mi"))),
            gateway("zone-c", 2, Some(res("100m", "128Mi", "256Mi"))),
        ],
        buffer_flags: &[
            "--buffer-enabled=true",
            "--buffer-window=10s",
            "--buffer-max-failover-duration=20s",
            "--buffer-min-time-between-failovers=0s",
        ],
        pools: &[
            Pool {
                postgres: Some(res("250m", "512Mi", "1Gi")),
                ..pool("main", "zone-a", 1, "5Gi")
            },
            Pool {
                postgres: Some(res("250m", "512Mi", "1Gi")),
                ..pool("main", "zone-b", 1, "5Gi")
            },
            Pool {
                postgres: Some(res("250m", "512Mi", "1Gi")),
                ..pool("main", "zone-c", 1, "5Gi")
            },
        ],
        multiorch_cells: &["zone-a", "zone-b", "zone-c"],
        multiorch_grace: ("1s", "2s"),
        postgres: &[("max_connections", "200"), ("shared_buffers", "128MB")],
        backup: BACKUP_SHARED,
        multiadmin: Some(res("100m", "128Mi", "256Mi")),
    },
    // small-cell and small-shard with overrides on top: zone-a's two gateways (the template's
    // resources kept, a pod annotation added), pool `main` grown to two 4Gi pods per cell, an
    // extra pool `reporting` in zone-a only, work_mem merged over the template's
    // max_connections. No CoreTemplate: the default etcd.
    Expected {
        file: "overrides.yaml",
        cluster: "overrides",
        topology: Topology::Managed {
            members: 3,
            storage: "1Gi",
            resources: None,
            root: "/multigres/global",
        },
        gateways: &[
            Gateway {
                pod_annotations: &[("example.com/team", "payments")],
                ..gateway("zone-a", 2, Some(res("50m", "64Mi", "128Mi")))
            },
            gateway("zone-b", 1, Some(res("50m", "64Mi", "128Mi"))),
        ],
        buffer_flags: BUFFER_DEFAULT,
        pools: &[
            pool("main", "zone-a", 2, "4Gi"),
            pool("main", "zone-b", 2, "4Gi"),
            pool("reporting", "zone-a", 1, "1Gi"),
        ],
        multiorch_cells: &["zone-a", "zone-b"],
        multiorch_grace: GRACE_DEFAULT,
        postgres: &[("max_connections", "100"), ("work_mem", "8MB")],
        backup: BACKUP_SHARED,
        multiadmin: None,
    },
    // The user's etcd at topo-etcd:2379: no TopoServer, every process dials it. Otherwise
    // defaults over two cells: the default pool with two pods per cell.
    Expected {
        file: "external-topo.yaml",
        cluster: "external-topo",
        topology: Topology::External {
            address: "topo-etcd:2379",
            root: "/multigres/external-topo",
        },
        gateways: &[gateway("zone-a", 1, None), gateway("zone-b", 1, None)],
        buffer_flags: BUFFER_DEFAULT,
        pools: &[
            pool("default", "zone-a", 2, "1Gi"),
            pool("default", "zone-b", 2, "1Gi"),
        ],
        multiorch_cells: &["zone-a", "zone-b"],
        multiorch_grace: GRACE_DEFAULT,
        postgres: &[],
        backup: BACKUP_SHARED,
        multiadmin: None,
    },
];

// ---------------------------------------------------------------------------------------------
// Sample → resolved cluster → children → workloads.

fn samples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/samples")
}

/// A sample's MultigresCluster, as stored in [`NAMESPACE`], and the templates it defines.
struct Sample {
    cluster: MultigresCluster,
    templates: Templates,
}

/// Parses every document of a sample (Secrets are skipped: nothing here reads them).
fn parse(file: &str) -> Sample {
    let text = std::fs::read_to_string(samples_dir().join(file)).unwrap();
    let mut clusters = Vec::new();
    let mut templates = Templates::default();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let value = serde_json::to_value(serde_yaml::Value::deserialize(doc).unwrap()).unwrap();
        if value.is_null() {
            continue;
        }
        let kind = value["kind"].as_str().unwrap_or_default().to_owned();
        let name = value["metadata"]["name"].as_str().unwrap().to_owned();
        let what = format!("{file}: {kind} {name}");
        match kind.as_str() {
            "Secret" => {}
            "MultigresCluster" => clusters.push(typed::<MultigresCluster>(value, &what)),
            "CoreTemplate" => {
                let t: CoreTemplate = typed(value, &what);
                templates.core.insert(name, t.spec);
            }
            "CellTemplate" => {
                let t: CellTemplate = typed(value, &what);
                templates.cell.insert(name, t.spec);
            }
            "ShardTemplate" => {
                let t: ShardTemplate = typed(value, &what);
                templates.shard.insert(name, t.spec);
            }
            other => panic!("{file}: unexpected kind {other}"),
        }
    }
    assert_eq!(clusters.len(), 1, "{file}: one MultigresCluster");
    let mut cluster = clusters.remove(0);
    cluster.metadata.namespace = Some(NAMESPACE.to_owned());
    cluster.metadata.uid = Some(format!("uid-{}", cluster.metadata.name.as_deref().unwrap()));
    Sample { cluster, templates }
}

fn typed<T: serde::de::DeserializeOwned>(value: serde_json::Value, what: &str) -> T {
    serde_json::from_value(value).unwrap_or_else(|e| panic!("{what} does not parse: {e}"))
}

/// The cluster resolved as the cluster-handler resolves a new one: the images it leaves unset
/// filled from the default set (it has adopted none yet), then its templates applied.
fn resolve(sample: &Sample) -> ResolvedCluster {
    let cluster = &sample.cluster;
    let images = resolver::images::recorded_effective(cluster);
    let completed = resolver::images::complete(cluster, &images);
    resolver::resolve(&completed, &sample.templates).expect("the sample resolves")
}

/// The child custom resources the resource-handler reconciles, with the resolved specs.
struct Children {
    topo_servers: Vec<TopoServer>,
    cells: Vec<Cell>,
    shards: Vec<Shard>,
}

/// The children of `cluster` for its resolved spec, built by the cluster-handler's own builders
/// (the cluster's TopoServers, Cells and TableGroups, then each TableGroup's Shards), each
/// given the uid the API server would.
fn children(cluster: &MultigresCluster, resolved: &ResolvedCluster) -> Children {
    let stored = |meta: &mut ObjectMeta| {
        meta.uid = Some(format!("uid-{}", meta.name.as_deref().unwrap()));
    };
    let owner = cluster_build::owner(cluster).unwrap();
    let mut built = cluster_build::children(&owner, resolved);
    let mut shards = Vec::new();
    for tg in &mut built.table_groups {
        stored(&mut tg.metadata);
        let owner = tablegroup_build::owner(tg).unwrap();
        shards.extend(tablegroup_build::shards(&owner, &tg.spec));
    }
    let mut children = Children {
        topo_servers: built.topo_servers,
        cells: built.cells,
        shards,
    };
    children
        .topo_servers
        .iter_mut()
        .for_each(|t| stored(&mut t.metadata));
    children
        .cells
        .iter_mut()
        .for_each(|c| stored(&mut c.metadata));
    children
        .shards
        .iter_mut()
        .for_each(|s| stored(&mut s.metadata));
    children
}

/// Everything the resource-handler's builders make of one sample, by name.
#[derive(Default)]
struct Built {
    deployments: BTreeMap<String, Deployment>,
    statefulsets: BTreeMap<String, StatefulSet>,
    services: BTreeMap<String, Service>,
    config_maps: BTreeMap<String, ConfigMap>,
    backups: BTreeMap<String, PersistentVolumeClaim>,
}

/// Adds `object` under its name, which no other object of its kind may have.
fn add<K: kube::Resource>(into: &mut BTreeMap<String, K>, object: K) {
    let name = object.meta().name.clone().unwrap();
    assert!(
        into.insert(name.clone(), object).is_none(),
        "{name} built twice"
    );
}

/// Runs the builders the four reconcilers run (TopoServer, Cell, Shard with its
/// postgresql.conf, the cluster's multiadmin and its web UI), with the inputs they read.
fn build(sample: &Sample, resolved: &ResolvedCluster, children: &Children) -> Built {
    let spec = &sample.cluster.spec;
    let mut built = Built::default();
    // The TopoServer reconciler takes pull settings and topology TLS from the cluster.
    let images = spec.images.clone().unwrap_or_default();
    let pull = PullSettings::new(images.image_pull_policy, &images.image_pull_secrets);
    let topology_tls = InternalTlsConfig::topology_enabled(spec.internal_tls.as_ref());
    for topo in &children.topo_servers {
        let owner = Owner::of(topo).unwrap();
        // Local to the cell its label names, else global (as the reconciler reads it).
        let cell = topo.metadata.labels.as_ref().and_then(|l| l.get(CELL));
        let level = match cell.filter(|c| !c.is_empty()) {
            Some(cell) => Level::Cell(cell.clone()),
            None => Level::Global,
        };
        let objects = toposerver::build::build(&TopoInput {
            owner: &owner,
            level,
            spec: &topo.spec,
            pull: &pull,
            tls: topology_tls,
        })
        .unwrap();
        add(&mut built.statefulsets, objects.statefulset);
        add(&mut built.services, objects.peer_service);
        add(&mut built.services, objects.client_service);
    }
    for c in &children.cells {
        let objects = cell::build::build(&Owner::of(c).unwrap(), &c.spec);
        add(&mut built.deployments, objects.deployment);
        add(&mut built.services, objects.service);
    }
    for s in &children.shards {
        let owner = Owner::of(s).unwrap();
        let mut objects =
            shard::build::build(&owner, &s.spec, shard::build::BackupDeletion::of(s, &owner))
                .unwrap();
        let (config_map, _) =
            shard::pgconfig::desired(&owner, s, None, &Default::default(), &mut objects).unwrap();
        add(&mut built.config_maps, config_map);
        for orch in objects.multiorch {
            add(&mut built.deployments, orch.deployment);
            add(&mut built.services, orch.service);
        }
        for p in objects.pools {
            add(&mut built.statefulsets, p.statefulset);
            add(&mut built.services, p.service);
        }
        if let Some(backup) = objects.backup {
            add(&mut built.backups, backup);
        }
    }
    let name = sample.cluster.metadata.name.clone().unwrap();
    let owner = Owner::with_cluster(&sample.cluster, name).unwrap();
    let admin = multiadmin::build::build(&owner, resolved);
    add(&mut built.deployments, admin.deployment);
    add(&mut built.services, admin.service);
    let with_password = !GatewayTlsConfig::is_required(spec.gateway_tls.as_ref());
    let web = multiadmin::web::build(&owner, resolved, with_password);
    add(&mut built.deployments, web.deployment);
    add(&mut built.services, web.service);
    built
}

// ---------------------------------------------------------------------------------------------
// Reading the built objects.

fn pod(template: &PodTemplateSpec) -> &PodSpec {
    template.spec.as_ref().unwrap()
}

fn deployment_pod(d: &Deployment) -> &PodTemplateSpec {
    &d.spec.as_ref().unwrap().template
}

fn statefulset_pod(s: &StatefulSet) -> &PodTemplateSpec {
    &s.spec.as_ref().unwrap().template
}

/// Every container of a pod, native sidecars (init containers) included.
fn containers(template: &PodTemplateSpec) -> impl Iterator<Item = &Container> {
    let pod = pod(template);
    pod.init_containers.iter().flatten().chain(&pod.containers)
}

fn container<'a>(template: &'a PodTemplateSpec, name: &str) -> &'a Container {
    containers(template)
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

/// The values of `--<name>=` on `c`'s command line.
fn flag_values<'a>(c: &'a Container, name: &str) -> Vec<&'a str> {
    let prefix = format!("--{name}=");
    c.args
        .iter()
        .flatten()
        .filter_map(|a| a.strip_prefix(&prefix))
        .collect()
}

fn requirements(r: Res) -> ResourceRequirements {
    let q = |v: &str| Quantity(v.to_owned());
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".to_owned(), q(r.cpu)),
            ("memory".to_owned(), q(r.memory)),
        ])),
        limits: Some(BTreeMap::from([("memory".to_owned(), q(r.memory_limit))])),
        ..Default::default()
    }
}

/// The resources `want` names, else the built-in `default`.
fn resources_or(want: Option<Res>, default: fn() -> ResourceRequirements) -> ResourceRequirements {
    want.map_or_else(default, requirements)
}

/// Node labels pinning pods to `zone` (every sample's cells name a `zone`).
fn in_zone(zone: &str) -> Option<BTreeMap<String, String>> {
    Some(BTreeMap::from([(
        ZONE_NODE_LABEL.to_owned(),
        zone.to_owned(),
    )]))
}

/// The effective parameters of a postgresql.conf: `name = 'value'` lines, the last one winning.
fn parameters(text: &str) -> BTreeMap<&str, &str> {
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| l.split_once(" = "))
        .map(|(k, v)| (k.trim(), v.trim().trim_matches('\'')))
        .collect()
}

/// The one data volume claim template of a StatefulSet: its size and access modes.
fn claim(s: &StatefulSet) -> (String, Vec<String>) {
    let claims = s
        .spec
        .as_ref()
        .unwrap()
        .volume_claim_templates
        .as_ref()
        .unwrap();
    assert_eq!(claims.len(), 1);
    pvc_request(claims[0].spec.as_ref().unwrap())
}

fn pvc_request(
    spec: &k8s_openapi::api::core::v1::PersistentVolumeClaimSpec,
) -> (String, Vec<String>) {
    let size = spec.resources.as_ref().unwrap().requests.as_ref().unwrap()["storage"]
        .0
        .clone();
    (size, spec.access_modes.clone().unwrap_or_default())
}

// ---------------------------------------------------------------------------------------------
// The checks.

fn keys<V>(m: &BTreeMap<String, V>) -> BTreeSet<String> {
    m.keys().cloned().collect()
}

/// Names of the shard `postgres/default/0-inf` every sample has.
fn shard_name(cluster: &str) -> String {
    multigres_api::names::shard(cluster, "postgres", "default", "0-inf")
}

/// Exactly the Deployments, StatefulSets and Services the expectations imply: nothing missing,
/// nothing extra (a second TopoServer, a pool in a cell it was not asked for).
fn check_inventory(e: &Expected, built: &Built) {
    let cluster = e.cluster;
    let shard = shard_name(cluster);
    let cell_child = |cell: &str| multigres_api::names::cell(cluster, cell);
    let mut deployments: BTreeSet<String> = e
        .gateways
        .iter()
        .map(|g| names::multigateway(&cell_child(g.cell)))
        .collect();
    deployments.extend(
        e.multiorch_cells
            .iter()
            .map(|c| names::multiorch(&shard, c)),
    );
    deployments.insert(names::multiadmin(cluster));
    deployments.insert(names::multiadmin_web(cluster));
    let mut statefulsets: BTreeSet<String> = e
        .pools
        .iter()
        .map(|p| names::pool(&shard, p.pool, p.cell))
        .collect();
    let mut services: BTreeSet<String> = deployments.union(&statefulsets).cloned().collect();
    if let Topology::Managed { .. } = e.topology {
        let topo = multigres_api::names::global_topo_server(cluster);
        statefulsets.insert(names::topo_statefulset(&topo));
        services.insert(names::topo_client_service(&topo));
        services.insert(multigres_api::names::topo_peer_service(&topo));
    }
    let file = e.file;
    assert_eq!(keys(&built.deployments), deployments, "{file}: Deployments");
    assert_eq!(
        keys(&built.statefulsets),
        statefulsets,
        "{file}: StatefulSets"
    );
    assert_eq!(keys(&built.services), services, "{file}: Services");
}

/// Each cell's multigateway: pinned to the cell's zone, with the replicas, resources, pod
/// annotations and failover buffer the sample gives it.
fn check_gateways(e: &Expected, built: &Built) {
    for g in e.gateways {
        let name = names::multigateway(&multigres_api::names::cell(e.cluster, g.cell));
        let what = format!("{}: {name}", e.file);
        let d = &built.deployments[&name];
        assert_eq!(
            d.spec.as_ref().unwrap().replicas,
            Some(g.replicas),
            "{what}"
        );
        let template = deployment_pod(d);
        assert_eq!(pod(template).node_selector, in_zone(g.zone), "{what}");
        let c = container(template, "multigateway");
        assert_eq!(flag_values(c, "cell"), [g.cell], "{what}");
        let want = resources_or(g.resources, defaults::multigateway_resources);
        assert_eq!(c.resources.as_ref(), Some(&want), "{what}");
        let annotations: Vec<(&str, &str)> = template
            .metadata
            .as_ref()
            .and_then(|m| m.annotations.as_ref())
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(annotations, g.pod_annotations, "{what}: pod annotations");
        let buffer: Vec<&str> = c
            .args
            .iter()
            .flatten()
            .map(String::as_str)
            .filter(|a| a.starts_with("--buffer-"))
            .collect();
        assert_eq!(buffer, e.buffer_flags, "{what}: buffer flags");
    }
}

/// The zone of `cell`, from the sample's cells.
fn zone_of<'a>(e: &'a Expected, cell: &str) -> &'a str {
    e.gateways.iter().find(|g| g.cell == cell).unwrap().zone
}

/// The shard: per pool and cell a StatefulSet in the cell's zone with the pods, volume size
/// and resources asked for; one multiorch per cell; the PostgreSQL parameters in the
/// postgresql.conf its pods mount; the backup volume.
fn check_shard(e: &Expected, built: &Built) {
    let shard = shard_name(e.cluster);
    for p in e.pools {
        let name = names::pool(&shard, p.pool, p.cell);
        let what = format!("{}: {name}", e.file);
        let s = &built.statefulsets[&name];
        assert_eq!(
            s.spec.as_ref().unwrap().replicas,
            Some(p.replicas),
            "{what}"
        );
        assert_eq!(
            claim(s),
            (p.storage.to_owned(), vec!["ReadWriteOnce".to_owned()]),
            "{what}: data volume"
        );
        let template = statefulset_pod(s);
        assert_eq!(
            pod(template).node_selector,
            in_zone(zone_of(e, p.cell)),
            "{what}"
        );
        let postgres = container(template, "postgres");
        let want = resources_or(p.postgres, defaults::postgres_resources);
        assert_eq!(postgres.resources.as_ref(), Some(&want), "{what}: postgres");
        let pooler = container(template, "multipooler");
        let want = resources_or(p.multipooler, defaults::multipooler_resources);
        assert_eq!(
            pooler.resources.as_ref(),
            Some(&want),
            "{what}: multipooler"
        );
        assert_eq!(flag_values(pooler, "cell"), [p.cell], "{what}");
    }
    for cell in e.multiorch_cells {
        let name = names::multiorch(&shard, cell);
        let what = format!("{}: {name}", e.file);
        let d = &built.deployments[&name];
        assert_eq!(d.spec.as_ref().unwrap().replicas, Some(1), "{what}");
        let template = deployment_pod(d);
        assert_eq!(
            pod(template).node_selector,
            in_zone(zone_of(e, cell)),
            "{what}"
        );
        let c = container(template, "multiorch");
        assert_eq!(flag_values(c, "cell"), [*cell], "{what}");
        let (base, jitter) = e.multiorch_grace;
        assert_eq!(
            flag_values(c, "leader-failover-grace-period-base"),
            [base],
            "{what}"
        );
        assert_eq!(
            flag_values(c, "leader-failover-grace-period-max-jitter"),
            [jitter],
            "{what}"
        );
    }
    let config_name = names::postgres_config(&shard);
    let config = &built.config_maps[&config_name];
    let text = &config.data.as_ref().unwrap()[CONFIG_KEY];
    let settings = parameters(text);
    for (name, value) in e.postgres {
        assert_eq!(
            settings.get(name),
            Some(value),
            "{}: {config_name} {name}",
            e.file
        );
    }
    let (size, mode, path) = e.backup;
    let backup = &built.backups[&names::backup_pvc(&shard)];
    assert_eq!(
        pvc_request(backup.spec.as_ref().unwrap()),
        (size.to_owned(), vec![mode.to_owned()]),
        "{}: backup volume",
        e.file
    );
    for p in e.pools {
        let s = &built.statefulsets[&names::pool(&shard, p.pool, p.cell)];
        let pooler = container(statefulset_pod(s), "multipooler");
        let mounted = pooler
            .volume_mounts
            .iter()
            .flatten()
            .any(|m| m.mount_path == path);
        assert!(mounted, "{}: {} mounts no backup at {path}", e.file, p.cell);
    }
}

/// The global topology: a managed one is an etcd StatefulSet of the sample's members, volume
/// and resources whose client Service every process dials; an external one has no etcd here
/// and every process dials the address the sample names.
fn check_topology(e: &Expected, built: &Built) {
    let file = e.file;
    let (address, root) = match e.topology {
        Topology::Managed {
            members,
            storage,
            resources,
            root,
        } => {
            let topo = multigres_api::names::global_topo_server(e.cluster);
            let etcd = &built.statefulsets[&names::topo_statefulset(&topo)];
            assert_eq!(
                etcd.spec.as_ref().unwrap().replicas,
                Some(members),
                "{file}"
            );
            assert_eq!(claim(etcd).0, storage, "{file}: etcd volume");
            let c = container(statefulset_pod(etcd), "etcd");
            let want = resources_or(resources, defaults::etcd_resources);
            assert_eq!(c.resources.as_ref(), Some(&want), "{file}: etcd");
            // The address names the client Service, which selects the etcd pods on 2379.
            let client = &built.services[&names::topo_client_service(&topo)];
            let client_spec = client.spec.as_ref().unwrap();
            let pod_labels = statefulset_pod(etcd)
                .metadata
                .as_ref()
                .unwrap()
                .labels
                .as_ref()
                .unwrap();
            let selector = client_spec.selector.as_ref().unwrap();
            assert!(
                selector.iter().all(|(k, v)| pod_labels.get(k) == Some(v)),
                "{file}: the client Service selects the etcd pods"
            );
            let ports: Vec<i32> = client_spec.ports.iter().flatten().map(|p| p.port).collect();
            assert!(ports.contains(&2379), "{file}: client port {ports:?}");
            (format!("{topo}.{NAMESPACE}.svc:2379"), root)
        }
        Topology::External { address, root } => {
            let etcd = built
                .statefulsets
                .values()
                .filter(|s| containers(statefulset_pod(s)).any(|c| c.name == "etcd"));
            assert_eq!(etcd.count(), 0, "{file}: no etcd for an external topology");
            (address.to_owned(), root)
        }
    };
    // Every Multigres process that talks to the topology, in every workload.
    let templates = built
        .deployments
        .values()
        .map(deployment_pod)
        .chain(built.statefulsets.values().map(statefulset_pod));
    let mut processes = BTreeMap::<&str, usize>::new();
    for template in templates {
        for c in containers(template) {
            if !["multigateway", "multiorch", "multipooler", "multiadmin"]
                .contains(&c.name.as_str())
            {
                continue;
            }
            let what = format!("{file}: {}", c.name);
            assert_eq!(
                flag_values(c, "topo-global-server-addresses"),
                [address.as_str()],
                "{what}"
            );
            assert_eq!(flag_values(c, "topo-global-root"), [root], "{what}");
            *processes.entry(c.name.as_str()).or_default() += 1;
        }
    }
    let pools = e.pools.len();
    let want = BTreeMap::from([
        ("multiadmin", 1),
        ("multigateway", e.gateways.len()),
        ("multiorch", e.multiorch_cells.len()),
        ("multipooler", pools),
    ]);
    assert_eq!(processes, want, "{file}: topology clients checked");
}

/// Every container runs the image the sample names, else the built-in default (no sample pins
/// one), pulled `IfNotPresent`; multiadmin and its web UI run as the sample says.
fn check_images_and_admin(e: &Expected, built: &Built) {
    let image = |name: &str| match name {
        "multigateway" | "multiorch" | "multipooler" | "multiadmin" => defaults::MULTIGRES_IMAGE,
        "postgres" => defaults::POSTGRES_IMAGE,
        "etcd" => defaults::ETCD_IMAGE,
        "multiadmin-web" => defaults::MULTIADMIN_WEB_IMAGE,
        "postgres-exporter" => defaults::POSTGRES_EXPORTER_IMAGE,
        other => panic!("{}: unexpected container {other}", e.file),
    };
    let templates = built
        .deployments
        .values()
        .map(deployment_pod)
        .chain(built.statefulsets.values().map(statefulset_pod));
    for template in templates {
        for c in containers(template) {
            let what = format!("{}: {}", e.file, c.name);
            assert_eq!(c.image.as_deref(), Some(image(&c.name)), "{what}");
            assert_eq!(
                c.image_pull_policy.as_deref(),
                Some("IfNotPresent"),
                "{what}"
            );
        }
    }
    let admin = &built.deployments[&names::multiadmin(e.cluster)];
    assert_eq!(admin.spec.as_ref().unwrap().replicas, Some(1), "{}", e.file);
    let c = container(deployment_pod(admin), "multiadmin");
    let want = resources_or(e.multiadmin, defaults::multiadmin_resources);
    assert_eq!(c.resources.as_ref(), Some(&want), "{}: multiadmin", e.file);
    let web = &built.deployments[&names::multiadmin_web(e.cluster)];
    assert_eq!(web.spec.as_ref().unwrap().replicas, Some(1), "{}", e.file);
}

#[test]
fn every_sample_has_expectations() {
    let mut present: Vec<String> = std::fs::read_dir(samples_dir())
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".yaml"))
        .collect();
    present.sort();
    let mut expected: Vec<&str> = SAMPLES.iter().map(|e| e.file).collect();
    expected.sort();
    assert_eq!(
        present, expected,
        "every sample in deploy/samples/ needs an entry in SAMPLES"
    );
}

/// Every sample's shard keeps electing a primary and accepting writes after losing any one of
/// its pool pods, under its durability policy: the pool StatefulSets' replicas per cell, as
/// built.
#[test]
fn every_sample_can_lose_any_one_pool_pod() {
    for e in &SAMPLES {
        let sample = parse(e.file);
        let resolved = resolve(&sample);
        let children = children(&sample.cluster, &resolved);
        let built = build(&sample, &resolved, &children);
        // The pool StatefulSets are exactly those of `e.pools` (check_inventory).
        let shard = shard_name(e.cluster);
        let mut per_cell: BTreeMap<&str, usize> = BTreeMap::new();
        for p in e.pools {
            let set = &built.statefulsets[&names::pool(&shard, p.pool, p.cell)];
            let replicas = set.spec.as_ref().unwrap().replicas.unwrap();
            *per_cell.entry(p.cell).or_default() += usize::try_from(replicas).unwrap();
        }
        let policy = resolved.table_groups[0]
            .durability_policy
            .as_deref()
            .and_then(Durability::parse)
            .unwrap();
        let pods: Vec<usize> = per_cell.values().copied().collect();
        assert!(
            survives_any_pod_loss(policy, &pods),
            "{}: pool pods per cell {per_cell:?} under {policy:?}",
            e.file
        );
    }
}

#[test]
fn every_sample_builds_the_workloads_its_yaml_asks_for() {
    for e in &SAMPLES {
        let sample = parse(e.file);
        assert_eq!(sample.cluster.metadata.name.as_deref(), Some(e.cluster));
        let resolved = resolve(&sample);
        let children = children(&sample.cluster, &resolved);
        let managed = matches!(e.topology, Topology::Managed { .. });
        assert_eq!(
            children.topo_servers.len(),
            usize::from(managed),
            "{}",
            e.file
        );
        assert_eq!(children.cells.len(), e.gateways.len(), "{}: Cells", e.file);
        assert_eq!(children.shards.len(), 1, "{}: Shards", e.file);
        let built = build(&sample, &resolved, &children);
        check_inventory(e, &built);
        check_gateways(e, &built);
        check_shard(e, &built);
        check_topology(e, &built);
        check_images_and_admin(e, &built);
    }
}
