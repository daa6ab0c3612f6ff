//! TopoServer → etcd: a StatefulSet bootstrapped statically (every member listed in
//! `--initial-cluster`, peers addressed through the headless Service), that headless peer
//! Service, the client Service Multigres processes dial, and a PodDisruptionBudget that keeps
//! quorum through voluntary disruptions.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    StatefulSet, StatefulSetPersistentVolumeClaimRetentionPolicy, StatefulSetSpec,
    StatefulSetUpdateStrategy,
};
use k8s_openapi::api::core::v1::{
    Container, PersistentVolumeClaim, PersistentVolumeClaimSpec, PodSpec, PodTemplateSpec,
    SecretVolumeSource, Service, ServiceSpec, Volume, VolumeResourceRequirements,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use multigres_api::labels::{self, Component, Placement};
use multigres_api::names::topo_peer_service;
use multigres_api::owner::Owner;
use multigres_api::resolver::defaults;
use multigres_api::v1alpha1::{
    EtcdSpec, PvcDeletionPolicy, PvcRetentionPolicyType, TopoServerSpec,
};

use crate::contract::{
    ETCD_BIN, ETCD_CLIENT, ETCD_DATA_DIR, ETCD_METRICS, ETCD_PEER, ETCD_VOLUME_DIR, flag,
    flag_expanding,
};
use crate::podspec::{
    Probes, PullSettings, RunAs, TMP_DIR, TMP_VOLUME, container_port, container_security,
    env_from_field, mount, pod_security, service_port, spread_across_zones_and_nodes, tmp_volume,
};

/// Name of the data volume claim template (PVCs are `data-<pod>`).
pub const DATA_VOLUME: &str = "data";
/// The volume of the members' certificate (topology TLS).
const TLS_VOLUME: &str = "etcd-tls";
/// Where etcd reads it: `tls.crt`, `tls.key` and the cluster's internal `ca.crt`.
const TLS_DIR: &str = "/etc/etcd/tls";

/// Where a TopoServer sits: the cluster's global topology, or one cell's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Level {
    /// The cluster-wide topology.
    Global,
    /// The local topology of a cell.
    Cell(String),
}

impl Level {
    fn component(&self) -> Component {
        match self {
            Level::Global => Component::GlobalTopo,
            Level::Cell(_) => Component::LocalTopo,
        }
    }

    fn placement(&self) -> Placement<'_> {
        Placement {
            cell: match self {
                Level::Global => None,
                Level::Cell(cell) => Some(cell),
            },
            ..Default::default()
        }
    }
}

/// What the builder needs besides the spec.
#[derive(Clone, Debug)]
pub struct TopoInput<'a> {
    /// The TopoServer.
    pub owner: &'a Owner,
    /// Global or cell-local.
    pub level: Level,
    /// Its resolved spec.
    pub spec: &'a TopoServerSpec,
    /// Pull settings of the cluster.
    pub pull: &'a PullSettings,
    /// Serve clients and peers over TLS and require client certificates of the cluster's
    /// internal CA (`internalTLS.topology`).
    pub tls: bool,
}

/// The objects realising one TopoServer.
#[derive(Clone, Debug, PartialEq)]
pub struct TopoObjects {
    /// The etcd members.
    pub statefulset: StatefulSet,
    /// Headless Service giving members stable DNS names.
    pub peer_service: Service,
    /// What Multigres processes dial.
    pub client_service: Service,
    /// Keeps quorum through voluntary disruptions.
    pub pdb: PodDisruptionBudget,
    /// Size each member's volume should request.
    pub storage_size: String,
}

/// The labels of every object of the TopoServer, and the subset selecting its pods.
pub fn labels(input: &TopoInput<'_>) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let component = input.level.component();
    let placement = input.level.placement();
    (
        labels::labels(&input.owner.cluster, component, &placement),
        labels::selector(&input.owner.cluster, component, &placement),
    )
}

/// The StatefulSet PVC retention for a resolved policy (Retain where unset).
pub fn retention(
    policy: Option<&PvcDeletionPolicy>,
) -> StatefulSetPersistentVolumeClaimRetentionPolicy {
    let name = |p: Option<PvcRetentionPolicyType>| {
        match p.unwrap_or(defaults::PVC_WHEN_DELETED) {
            PvcRetentionPolicyType::Retain => "Retain",
            PvcRetentionPolicyType::Delete => "Delete",
        }
        .to_owned()
    };
    StatefulSetPersistentVolumeClaimRetentionPolicy {
        when_deleted: Some(name(policy.and_then(|p| p.when_deleted))),
        when_scaled: Some(name(policy.and_then(|p| p.when_scaled))),
    }
}

/// Why a TopoServer's spec cannot be realised. Each message names the field and what it
/// allows: it is what the TopoServer's status and events say.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    /// No etcd section: etcd is the only topology server the operator runs.
    #[error("spec.etcd is required: the operator only runs etcd")]
    NoEtcd,
    /// A member count etcd cannot bootstrap a quorum from: not a positive odd number.
    #[error("spec.etcd.replicas is {replicas}: etcd needs an odd number of members (1, 3, 5)")]
    MemberCount {
        /// The count asked for.
        replicas: i32,
    },
}

/// Builds the etcd objects, or says why the spec cannot be realised.
pub fn build(input: &TopoInput<'_>) -> Result<TopoObjects, BuildError> {
    let etcd = input.spec.etcd.as_ref().ok_or(BuildError::NoEtcd)?;
    let replicas = members(etcd)?;
    let owner = input.owner;
    let names = Names::of(input);
    let args = etcd_args(owner, &names, replicas, input.tls);
    let mut container = etcd_container(etcd, input.pull, args);
    let mut pod_volumes = vec![tmp_volume()];
    if input.tls {
        container
            .volume_mounts
            .get_or_insert_default()
            .push(mount(TLS_VOLUME, TLS_DIR, true));
        pod_volumes.push(tls_volume(owner));
    }
    let pod = etcd_pod(input, &names, container, pod_volumes);
    let (storage_size, claim) = data_claim(etcd, &names.labels);
    Ok(TopoObjects {
        statefulset: etcd_statefulset(input, etcd, &names, replicas, pod, claim),
        peer_service: peer_service(owner, &names),
        client_service: client_service(owner, &names),
        pdb: pdb(owner, &names),
        storage_size,
    })
}

/// The number of etcd members, or why it cannot be bootstrapped.
fn members(etcd: &EtcdSpec) -> Result<i32, BuildError> {
    let replicas = etcd.replicas.unwrap_or(defaults::ETCD_REPLICAS);
    if replicas < 1 || replicas % 2 == 0 {
        return Err(BuildError::MemberCount { replicas });
    }
    Ok(replicas)
}

/// How a TopoServer's objects are named and labelled.
struct Names {
    /// The StatefulSet (and PodDisruptionBudget).
    statefulset: String,
    /// The headless peer Service.
    peer: String,
    /// Labels of every object.
    labels: BTreeMap<String, String>,
    /// The subset of `labels` selecting the etcd pods.
    selector: BTreeMap<String, String>,
}

impl Names {
    /// The names and labels of the TopoServer of `input`.
    fn of(input: &TopoInput<'_>) -> Self {
        let (labels, selector) = labels(input);
        Self {
            statefulset: crate::names::topo_statefulset(&input.owner.name),
            peer: topo_peer_service(&input.owner.name),
            labels,
            selector,
        }
    }

    /// Metadata of the object `name`, owned by the TopoServer.
    fn metadata(&self, owner: &Owner, name: &str) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(owner.namespace.clone()),
            labels: Some(self.labels.clone()),
            owner_references: Some(vec![owner.reference.clone()]),
            ..Default::default()
        }
    }

    /// A label selector matching the etcd pods.
    fn match_labels(&self) -> LabelSelector {
        LabelSelector {
            match_labels: Some(self.selector.clone()),
            ..Default::default()
        }
    }
}

/// The scheme of etcd's client and peer URLs.
pub fn scheme(tls: bool) -> &'static str {
    if tls { "https" } else { "http" }
}

/// etcd's command line: every one of `replicas` members listed in `--initial-cluster`, each
/// addressed through the peer Service; with `tls`, clients and peers served over TLS and both
/// required to present a certificate of the cluster's internal CA (the members present theirs
/// to each other).
fn etcd_args(owner: &Owner, names: &Names, replicas: i32, tls: bool) -> Vec<String> {
    let ns = &owner.namespace;
    let (name, peer) = (&names.statefulset, &names.peer);
    let scheme = scheme(tls);
    let host = |pod: &str| format!("{pod}.{peer}.{ns}.svc");
    let initial_cluster = (0..replicas)
        .map(|i| {
            let pod = format!("{name}-{i}");
            format!("{pod}={scheme}://{}:{ETCD_PEER}", host(&pod))
        })
        .collect::<Vec<_>>()
        .join(",");
    let self_host = host("$(POD_NAME)");
    let mut args = vec![
        flag_expanding("name", "$(POD_NAME)"),
        flag("data-dir", ETCD_DATA_DIR),
        flag(
            "listen-client-urls",
            format!("{scheme}://0.0.0.0:{ETCD_CLIENT}"),
        ),
        flag_expanding(
            "advertise-client-urls",
            format!("{scheme}://{self_host}:{ETCD_CLIENT}"),
        ),
        flag(
            "listen-peer-urls",
            format!("{scheme}://0.0.0.0:{ETCD_PEER}"),
        ),
        flag_expanding(
            "initial-advertise-peer-urls",
            format!("{scheme}://{self_host}:{ETCD_PEER}"),
        ),
        // Probes and Prometheus read health and metrics here, plaintext and without a
        // certificate: nothing on this port writes.
        flag(
            "listen-metrics-urls",
            format!("http://0.0.0.0:{ETCD_METRICS}"),
        ),
        flag("initial-cluster", initial_cluster),
        flag("initial-cluster-state", "new"),
        flag("initial-cluster-token", format!("{}.{ns}", owner.name)),
        flag("auto-compaction-retention", "1"),
    ];
    if tls {
        let (cert, key, ca) = (
            format!("{TLS_DIR}/{}", crate::tls::TLS_CRT),
            format!("{TLS_DIR}/{}", crate::tls::TLS_KEY),
            format!("{TLS_DIR}/{}", crate::tls::CA_CRT),
        );
        args.extend([
            flag("cert-file", &cert),
            flag("key-file", &key),
            flag("trusted-ca-file", &ca),
            flag("client-cert-auth", true),
            flag("peer-cert-file", &cert),
            flag("peer-key-file", &key),
            flag("peer-trusted-ca-file", &ca),
            flag("peer-client-cert-auth", true),
            // A peer still presents a certificate of the cluster's CA, which only the members
            // hold; etcd's extra check, that the connection's source IP is one the
            // certificate's DNS names resolve to, fails wherever pod traffic is masqueraded:
            // on the real-node tier every peer arrived from the node's bridge address
            // (`"10.244.1.1" does not match any of DNSNames`) and the members never formed a
            // quorum.
            flag("peer-skip-client-san-verification", true),
            flag("tls-min-version", "TLS1.2"),
        ]);
    }
    args
}

/// The members' certificate (the cluster's etcd identity, with the internal CA).
fn tls_volume(owner: &Owner) -> Volume {
    Volume {
        name: TLS_VOLUME.to_owned(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(crate::tls::etcd_identity(&owner.cluster, &owner.namespace)),
            default_mode: Some(0o440),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The etcd container, run with `args`.
fn etcd_container(etcd: &EtcdSpec, pull: &PullSettings, args: Vec<String>) -> Container {
    let probes = Probes::new("/readyz", "/livez", "/readyz", ETCD_METRICS, 300);
    Container {
        name: "etcd".to_owned(),
        image: Some(
            etcd.image
                .as_ref()
                .map_or(defaults::ETCD_IMAGE, |i| i.as_str())
                .to_owned(),
        ),
        image_pull_policy: Some(pull.policy()),
        command: Some(vec![ETCD_BIN.to_owned()]),
        args: Some(args),
        env: Some(vec![env_from_field("POD_NAME", "metadata.name")]),
        ports: Some(vec![
            container_port("client", ETCD_CLIENT),
            container_port("peer", ETCD_PEER),
            container_port("metrics", ETCD_METRICS),
        ]),
        resources: etcd.resources.clone(),
        startup_probe: Some(probes.startup),
        liveness_probe: Some(probes.liveness),
        readiness_probe: Some(probes.readiness),
        security_context: Some(container_security(RunAs::NONROOT, true)),
        volume_mounts: Some(vec![
            mount(DATA_VOLUME, ETCD_VOLUME_DIR, false),
            mount(TMP_VOLUME, TMP_DIR, false),
        ]),
        ..Default::default()
    }
}

/// The etcd pod of `container`, placed as the spec says (members on different nodes unless
/// the spec gives an affinity).
fn etcd_pod(
    input: &TopoInput<'_>,
    names: &Names,
    container: Container,
    volumes: Vec<Volume>,
) -> PodSpec {
    let placement = input.spec.placement.clone().unwrap_or_default();
    PodSpec {
        containers: vec![container],
        volumes: Some(volumes),
        security_context: Some(pod_security(RunAs::NONROOT, RunAs::NONROOT.group)),
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        image_pull_secrets: input.pull.secrets(),
        node_selector: (!placement.node_selector.is_empty()).then_some(placement.node_selector),
        affinity: Some(spread_across_zones_and_nodes(
            placement.affinity,
            &names.selector,
        )),
        tolerations: (!placement.tolerations.is_empty()).then_some(placement.tolerations),
        topology_spread_constraints: (!placement.topology_spread_constraints.is_empty())
            .then_some(placement.topology_spread_constraints),
        termination_grace_period_seconds: Some(30),
        ..Default::default()
    }
}

/// The data volume claim template of the etcd members, and the size it requests.
fn data_claim(
    etcd: &EtcdSpec,
    labels: &BTreeMap<String, String>,
) -> (String, PersistentVolumeClaim) {
    let storage = etcd.storage.clone().unwrap_or_default();
    let size = storage
        .size
        .clone()
        .unwrap_or_else(|| defaults::ETCD_STORAGE.to_owned());
    let access_modes = if storage.access_modes.is_empty() {
        vec![defaults::ACCESS_MODE.to_owned()]
    } else {
        storage.access_modes.clone()
    };
    let claim = PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(DATA_VOLUME.to_owned()),
            labels: Some(labels.clone()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(access_modes),
            storage_class_name: storage.class.clone(),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_owned(),
                    Quantity(size.clone()),
                )])),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    (size, claim)
}

/// The StatefulSet of `replicas` etcd members running `pod`, each with a `claim` volume.
fn etcd_statefulset(
    input: &TopoInput<'_>,
    etcd: &EtcdSpec,
    names: &Names,
    replicas: i32,
    pod: PodSpec,
    claim: PersistentVolumeClaim,
) -> StatefulSet {
    let policy = input
        .spec
        .pvc_deletion_policy
        .as_ref()
        .or(etcd.pvc_deletion_policy.as_ref());
    StatefulSet {
        metadata: names.metadata(input.owner, &names.statefulset),
        spec: Some(StatefulSetSpec {
            replicas: Some(replicas),
            selector: names.match_labels(),
            service_name: Some(names.peer.clone()),
            pod_management_policy: Some("Parallel".to_owned()),
            update_strategy: Some(StatefulSetUpdateStrategy {
                type_: Some("RollingUpdate".to_owned()),
                ..Default::default()
            }),
            persistent_volume_claim_retention_policy: Some(retention(policy)),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(names.labels.clone()),
                    ..Default::default()
                }),
                spec: Some(pod),
            },
            volume_claim_templates: Some(vec![claim]),
            ..Default::default()
        }),
        status: None,
    }
}

/// The headless Service giving members stable DNS names (ready or not).
fn peer_service(owner: &Owner, names: &Names) -> Service {
    Service {
        metadata: names.metadata(owner, &names.peer),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".to_owned()),
            publish_not_ready_addresses: Some(true),
            selector: Some(names.selector.clone()),
            ports: Some(vec![
                service_port("client", ETCD_CLIENT),
                service_port("peer", ETCD_PEER),
            ]),
            ..Default::default()
        }),
        status: None,
    }
}

/// The Service Multigres processes dial.
fn client_service(owner: &Owner, names: &Names) -> Service {
    let name = crate::names::topo_client_service(&owner.name);
    Service {
        metadata: names.metadata(owner, &name),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".to_owned()),
            selector: Some(names.selector.clone()),
            ports: Some(vec![service_port("client", ETCD_CLIENT)]),
            ..Default::default()
        }),
        status: None,
    }
}

/// At most one member down at a time, so voluntary disruptions keep quorum.
fn pdb(owner: &Owner, names: &Names) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: names.metadata(owner, &names.statefulset),
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(names.match_labels()),
            ..Default::default()
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests;
