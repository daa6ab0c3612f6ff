//! Pieces every pod this handler builds shares: hardened security contexts, HTTP probes,
//! ports, environment, pull settings and the writable scratch volume that lets root
//! filesystems stay read-only.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, ContainerPort, EnvVar, EnvVarSource, HTTPGetAction,
    LocalObjectReference, ObjectFieldSelector, PodAffinityTerm, PodAntiAffinity,
    PodSecurityContext, Probe, SeccompProfile, SecretKeySelector, SecurityContext, ServicePort,
    Volume, VolumeMount, WeightedPodAffinityTerm,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use multigres_api::v1alpha1::ImagePullPolicy;

/// User and group of the `multigres` and etcd images (distroless `nonroot`).
pub const NONROOT_ID: i64 = 65532;
/// User and group of `postgres` in the pgctld image.
pub const POSTGRES_ID: i64 = 999;

/// Name and mount point of the scratch volume for processes that write temporary files.
pub const TMP_VOLUME: &str = "tmp";
/// Mount point of the scratch volume.
pub const TMP_DIR: &str = "/tmp";

/// Image pull policy and secrets, applied to every pod of a workload.
#[derive(Clone, Debug, PartialEq)]
pub struct PullSettings {
    /// `Always`, `Never` or `IfNotPresent`.
    pub policy: ImagePullPolicy,
    /// Secrets used to pull the images.
    pub secrets: Vec<LocalObjectReference>,
}

impl PullSettings {
    /// The settings resolved for a child, `IfNotPresent` when unset.
    pub fn new(policy: Option<ImagePullPolicy>, secrets: &[LocalObjectReference]) -> Self {
        Self {
            policy: policy.unwrap_or(ImagePullPolicy::IfNotPresent),
            secrets: secrets.to_vec(),
        }
    }

    /// The `imagePullPolicy` string.
    pub fn policy(&self) -> String {
        match self.policy {
            ImagePullPolicy::Always => "Always",
            ImagePullPolicy::Never => "Never",
            ImagePullPolicy::IfNotPresent => "IfNotPresent",
        }
        .to_owned()
    }

    /// `imagePullSecrets` of a pod spec (`None` when empty, so nothing is sent).
    pub fn secrets(&self) -> Option<Vec<LocalObjectReference>> {
        (!self.secrets.is_empty()).then(|| self.secrets.clone())
    }
}

/// Identity of a container process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunAs {
    /// `runAsUser`.
    pub user: i64,
    /// `runAsGroup` (and default `fsGroup`).
    pub group: i64,
}

impl RunAs {
    /// The distroless `nonroot` identity of the `multigres` and etcd images.
    pub const NONROOT: RunAs = RunAs {
        user: NONROOT_ID,
        group: NONROOT_ID,
    };
}

fn runtime_default_seccomp() -> SeccompProfile {
    SeccompProfile {
        type_: "RuntimeDefault".to_owned(),
        ..Default::default()
    }
}

/// Pod-level hardening: non-root, seccomp `RuntimeDefault`, and an `fsGroup` so the process
/// can write its volumes.
pub fn pod_security(run_as: RunAs, fs_group: i64) -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(run_as.user),
        run_as_group: Some(run_as.group),
        fs_group: Some(fs_group),
        fs_group_change_policy: Some("OnRootMismatch".to_owned()),
        seccomp_profile: Some(runtime_default_seccomp()),
        ..Default::default()
    }
}

/// Container-level hardening: no privilege escalation, every capability dropped, non-root,
/// seccomp `RuntimeDefault`, and a read-only root filesystem when the process allows it.
pub fn container_security(run_as: RunAs, read_only_root: bool) -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        privileged: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".to_owned()]),
            ..Default::default()
        }),
        read_only_root_filesystem: Some(read_only_root),
        run_as_non_root: Some(true),
        run_as_user: Some(run_as.user),
        run_as_group: Some(run_as.group),
        seccomp_profile: Some(runtime_default_seccomp()),
        ..Default::default()
    }
}

/// A named TCP container port.
pub fn container_port(name: &str, port: i32) -> ContainerPort {
    ContainerPort {
        name: Some(name.to_owned()),
        container_port: port,
        protocol: Some("TCP".to_owned()),
        ..Default::default()
    }
}

/// A named TCP Service port forwarding to the container port of the same name.
pub fn service_port(name: &str, port: i32) -> ServicePort {
    ServicePort {
        name: Some(name.to_owned()),
        port,
        target_port: Some(IntOrString::String(name.to_owned())),
        protocol: Some("TCP".to_owned()),
        ..Default::default()
    }
}

/// An HTTP GET probe on `port` and `path`.
fn http_probe(path: &str, port: i32, period: i32, failures: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.to_owned()),
            port: IntOrString::Int(port),
            scheme: Some("HTTP".to_owned()),
            ..Default::default()
        }),
        period_seconds: Some(period),
        timeout_seconds: Some(3),
        success_threshold: Some(1),
        failure_threshold: Some(failures),
        ..Default::default()
    }
}

/// Startup, liveness and readiness probes of one container.
#[derive(Clone, Debug, PartialEq)]
pub struct Probes {
    /// Holds liveness off while the process starts.
    pub startup: Probe,
    /// Restarts a hung process.
    pub liveness: Probe,
    /// Takes the pod out of Services while not ready.
    pub readiness: Probe,
}

impl Probes {
    /// Probes of a Multigres daemon on its HTTP port: startup and liveness on `/live` (the
    /// listener is up), readiness on `/ready` (its own checks pass). Startup gets
    /// `startup_budget_seconds` in 5 s steps, during which liveness does not run.
    pub fn multigres(http_port: i32, startup_budget_seconds: i32) -> Self {
        Self::new(
            crate::contract::LIVE,
            crate::contract::LIVE,
            crate::contract::READY,
            http_port,
            startup_budget_seconds,
        )
    }

    /// Probes with explicit paths; `startup_budget_seconds` is split into 5 s periods.
    pub fn new(
        startup: &str,
        liveness: &str,
        readiness: &str,
        port: i32,
        startup_budget_seconds: i32,
    ) -> Self {
        Self {
            startup: http_probe(startup, port, 5, (startup_budget_seconds / 5).max(1)),
            liveness: http_probe(liveness, port, 10, 3),
            readiness: http_probe(readiness, port, 5, 3),
        }
    }
}

/// `name=value`, `value` taken literally by the kubelet (it may hold a user's text, and the
/// kubelet expands `$(NAME)` in env values too).
pub fn env(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value: Some(multigres_api::expansion::literal(&value.into())),
        ..Default::default()
    }
}

/// `name` from key `key` of Secret `secret`.
pub fn env_from_secret(name: &str, secret: &str, key: &str) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret.to_owned(),
                key: key.to_owned(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// `name` from a field of the pod (downward API), e.g. `metadata.name`.
pub fn env_from_field(name: &str, field_path: &str) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: field_path.to_owned(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// `POD_NAME`, `POD_NAMESPACE` and `POD_IP`, referenced by flags as `$(POD_NAME)` etc.
pub fn pod_identity_env() -> Vec<EnvVar> {
    vec![
        env_from_field("POD_NAME", "metadata.name"),
        env_from_field("POD_NAMESPACE", "metadata.namespace"),
        env_from_field("POD_IP", "status.podIP"),
    ]
}

/// The scratch volume (memory-backed is not needed: it only holds small temporary files).
pub fn tmp_volume() -> Volume {
    Volume {
        name: TMP_VOLUME.to_owned(),
        empty_dir: Some(Default::default()),
        ..Default::default()
    }
}

/// A mount of volume `name` at `path`.
pub fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.to_owned(),
        mount_path: path.to_owned(),
        read_only: read_only.then_some(true),
        ..Default::default()
    }
}

/// Node label naming each node, the unit one drain or one node failure takes away.
const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";
/// Node label naming each node's zone, the unit a zone outage takes away.
const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// `affinity` when the user gave one, else a preference for placing the pods `selector` picks
/// in different zones first and on different nodes next: a zone or a node lost then takes one
/// etcd member of a topology server (whose quorum survives it), and a node one pool pod of a
/// shard, not several. Pool pods are pinned to their cell's zone, where only the node term
/// matters. Only preferred, so a cluster with fewer zones or nodes still schedules them all.
pub fn spread_across_zones_and_nodes(
    affinity: Option<Affinity>,
    selector: &BTreeMap<String, String>,
) -> Affinity {
    let apart_on = |topology_key: &str, weight: i32| WeightedPodAffinityTerm {
        weight,
        pod_affinity_term: PodAffinityTerm {
            label_selector: Some(LabelSelector {
                match_labels: Some(selector.clone()),
                ..Default::default()
            }),
            topology_key: topology_key.to_owned(),
            ..Default::default()
        },
    };
    affinity.unwrap_or_else(|| Affinity {
        pod_anti_affinity: Some(PodAntiAffinity {
            preferred_during_scheduling_ignored_during_execution: Some(vec![
                apart_on(ZONE_LABEL, 100),
                apart_on(HOSTNAME_LABEL, 50),
            ]),
            ..Default::default()
        }),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_security_is_hardened() {
        let sc = container_security(RunAs::NONROOT, true);
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(sc.run_as_non_root, Some(true));
        assert_eq!(sc.run_as_user, Some(65532));
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(
            sc.capabilities.and_then(|c| c.drop),
            Some(vec!["ALL".to_owned()])
        );
        assert_eq!(
            sc.seccomp_profile.map(|p| p.type_).as_deref(),
            Some("RuntimeDefault")
        );
    }

    #[test]
    fn multigres_probes_split_the_startup_budget() {
        let p = Probes::multigres(15100, 300);
        let path = |p: &Probe| p.http_get.as_ref().and_then(|h| h.path.clone());
        assert_eq!(path(&p.startup).as_deref(), Some("/live"));
        assert_eq!(path(&p.liveness).as_deref(), Some("/live"));
        assert_eq!(path(&p.readiness).as_deref(), Some("/ready"));
        assert_eq!(p.startup.failure_threshold, Some(60));
        assert_eq!(p.startup.period_seconds, Some(5));
        assert_eq!(
            p.readiness.http_get.map(|h| h.port),
            Some(IntOrString::Int(15100))
        );
    }

    #[test]
    fn pull_settings_default_and_omit_empty_secrets() {
        let p = PullSettings::new(None, &[]);
        assert_eq!(p.policy(), "IfNotPresent");
        assert_eq!(p.secrets(), None);
        let s = PullSettings::new(
            Some(ImagePullPolicy::Always),
            &[LocalObjectReference {
                name: "regcred".into(),
            }],
        );
        assert_eq!(s.policy(), "Always");
        assert_eq!(s.secrets().unwrap()[0].name, "regcred");
    }
}
