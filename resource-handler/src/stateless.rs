//! Deployments and Services of the stateless Multigres daemons (multigateway, multiorch,
//! multiadmin): one container, hardened, with the resolved replicas, resources, scheduling,
//! pod labels and annotations, and pull settings.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, PodSpec, PodTemplateSpec, Service, ServicePort, ServiceSpec,
    Toleration,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use multigres_api::labels::{DRAINED_NODE, merge_user};
use multigres_api::owner::Owner;
use multigres_api::v1alpha1::StatelessSpec;

use crate::podspec::{
    Probes, PullSettings, RunAs, TMP_DIR, TMP_VOLUME, container_security, mount, pod_identity_env,
    pod_security, tmp_volume,
};

/// The one process of a stateless workload.
#[derive(Clone, Debug)]
pub struct Process {
    /// Container name.
    pub name: &'static str,
    /// Image reference.
    pub image: String,
    /// Binary to run (the `multigres` image has no entrypoint).
    pub command: String,
    /// Flags, exactly as the process contract says.
    pub args: Vec<String>,
    /// Ports the process listens on.
    pub ports: Vec<ContainerPort>,
    /// Its probes.
    pub probes: Probes,
}

/// Everything that shapes one stateless Deployment.
#[derive(Clone, Debug)]
pub struct Workload<'a> {
    /// Name of the Deployment (and its Service).
    pub name: String,
    /// Who owns it.
    pub owner: &'a Owner,
    /// Labels of the Deployment and its pods.
    pub labels: BTreeMap<String, String>,
    /// The identity labels selecting its pods.
    pub selector: BTreeMap<String, String>,
    /// Resolved replicas, resources, affinity, pod labels and annotations.
    pub spec: &'a StatelessSpec,
    /// Replicas when the spec leaves them unset.
    pub default_replicas: i32,
    /// Taints the pods tolerate.
    pub tolerations: Vec<Toleration>,
    /// Node labels the pods must run on (a cell's zone or region).
    pub node_selector: BTreeMap<String, String>,
    /// Image pull policy and secrets.
    pub pull: &'a PullSettings,
    /// What runs in the pod.
    pub process: Process,
    /// `Recreate` when two pods must never run at once (same service id).
    pub recreate: bool,
}

/// Object metadata of a child named `name`.
pub fn metadata(name: &str, owner: &Owner, labels: &BTreeMap<String, String>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some(owner.namespace.clone()),
        labels: Some(labels.clone()),
        owner_references: Some(vec![owner.reference.clone()]),
        ..Default::default()
    }
}

/// The disruption budget of a stateless workload running `replicas` pods: one pod at a time
/// while it runs several; none while it runs one, so a drain never takes a cell's only
/// multigateway or multiorch: the operator moves that pod off the cordoned node first (see
/// [`moved_off`]). None for a workload scaled to zero.
pub fn budget(w: &Workload<'_>, replicas: i32) -> Option<PodDisruptionBudget> {
    (replicas > 0).then(|| PodDisruptionBudget {
        metadata: metadata(&w.name, w.owner, &w.labels),
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(i32::from(replicas > 1))),
            selector: Some(LabelSelector {
                match_labels: Some(w.selector.clone()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: None,
    })
}

/// Marks `deployment` as moved off a cordoned node its only pod ran on (`mark`:
/// `<node>/<pod>`): the changed pod template makes the Deployment controller start a pod on
/// another node (first, under `RollingUpdate`) and remove the old one, which its budget kept a
/// drain from evicting. The mark is kept on the Deployment (whose cached copy has no pod
/// template) so that later reconciles write the same template and restart nothing.
pub fn moved_off(deployment: &mut Deployment, mark: &str) {
    let mark = |meta: &mut ObjectMeta| {
        meta.annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(DRAINED_NODE.to_owned(), mark.to_owned());
    };
    mark(&mut deployment.metadata);
    if let Some(spec) = deployment.spec.as_mut() {
        mark(
            spec.template
                .metadata
                .get_or_insert_with(ObjectMeta::default),
        );
    }
}

/// The `<node>/<pod>` `observed` was last moved off (see [`moved_off`]).
pub fn last_moved_off(observed: Option<&Deployment>) -> Option<&str> {
    observed?
        .metadata
        .annotations
        .as_ref()?
        .get(DRAINED_NODE)
        .map(String::as_str)
}

/// The Deployment of a stateless workload.
pub fn deployment(w: Workload<'_>) -> Deployment {
    let p = w.process;
    let container = Container {
        name: p.name.to_owned(),
        image: Some(p.image),
        image_pull_policy: Some(w.pull.policy()),
        command: Some(vec![p.command]),
        args: Some(p.args),
        env: Some(pod_identity_env()),
        ports: Some(p.ports),
        resources: w.spec.resources.clone(),
        startup_probe: Some(p.probes.startup),
        liveness_probe: Some(p.probes.liveness),
        readiness_probe: Some(p.probes.readiness),
        security_context: Some(container_security(RunAs::NONROOT, true)),
        volume_mounts: Some(vec![mount(TMP_VOLUME, TMP_DIR, false)]),
        ..Default::default()
    };
    let pod_labels = merge_user(w.labels.clone(), &w.spec.pod_labels);
    let pod = PodSpec {
        containers: vec![container],
        volumes: Some(vec![tmp_volume()]),
        security_context: Some(pod_security(RunAs::NONROOT, RunAs::NONROOT.group)),
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        image_pull_secrets: w.pull.secrets(),
        affinity: w.spec.affinity.clone(),
        tolerations: (!w.tolerations.is_empty()).then_some(w.tolerations),
        node_selector: (!w.node_selector.is_empty()).then_some(w.node_selector),
        termination_grace_period_seconds: Some(30),
        ..Default::default()
    };
    let strategy = DeploymentStrategy {
        type_: Some(
            if w.recreate {
                "Recreate"
            } else {
                "RollingUpdate"
            }
            .to_owned(),
        ),
        ..Default::default()
    };
    Deployment {
        metadata: metadata(&w.name, w.owner, &w.labels),
        spec: Some(DeploymentSpec {
            replicas: Some(w.spec.replicas.unwrap_or(w.default_replicas)),
            selector: LabelSelector {
                match_labels: Some(w.selector),
                ..Default::default()
            },
            strategy: Some(strategy),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    annotations: (!w.spec.pod_annotations.is_empty())
                        .then(|| w.spec.pod_annotations.clone()),
                    ..Default::default()
                }),
                spec: Some(pod),
            },
            ..Default::default()
        }),
        status: None,
    }
}

/// A ClusterIP Service named `name` in front of the pods `selector` picks.
pub fn service(
    name: &str,
    owner: &Owner,
    labels: &BTreeMap<String, String>,
    selector: &BTreeMap<String, String>,
    ports: Vec<ServicePort>,
) -> Service {
    Service {
        metadata: metadata(name, owner, labels),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".to_owned()),
            selector: Some(selector.clone()),
            ports: Some(ports),
            ..Default::default()
        }),
        status: None,
    }
}
