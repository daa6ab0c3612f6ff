//! OpenTelemetry settings of every Multigres process: each container gets the `OTEL_*`
//! environment [`multigres_api::observability::telemetry`] computes for it, and, with a
//! sampling ConfigMap, that ConfigMap mounted at `/etc/otel`. Applied to the built workloads
//! before they are written, so the builders stay unaware of it.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMapVolumeSource, PodSpec, Volume};
use multigres_api::observability::{
    Identity, InheritedEnv, Process, SAMPLING_MOUNT_PATH, SAMPLING_VOLUME, Telemetry, telemetry,
};
use multigres_api::v1alpha1::ObservabilityConfig;

use crate::cell::build::CellObjects;
use crate::podspec::{env, mount};
use crate::shard::build::ShardObjects;

/// Where the telemetry of a workload's processes comes from.
#[derive(Clone, Copy, Debug)]
pub struct Source<'a> {
    /// The cluster's (or child's) `observability`.
    pub config: Option<&'a ObservabilityConfig>,
    /// The operator's own `OTEL_*` environment.
    pub inherited: &'a InheritedEnv,
    /// Name of the MultigresCluster.
    pub cluster: &'a str,
    /// The cluster's project reference, when annotated.
    pub project: Option<&'a str>,
}

impl Source<'_> {
    fn of(&self, process: Process) -> Telemetry {
        telemetry(
            self.config,
            self.inherited,
            Identity {
                project: self.project,
                cluster: self.cluster,
                process,
            },
        )
    }
}

/// Adds `t` to the container (or init container) `container` of `pod`: its variables after the
/// container's own, and the sampling ConfigMap volume and mount.
pub fn add_telemetry(pod: &mut PodSpec, container: &str, t: &Telemetry) {
    if t.env.is_empty() {
        return;
    }
    let target = pod
        .containers
        .iter_mut()
        .chain(pod.init_containers.iter_mut().flatten())
        .find(|c| c.name == container);
    let Some(target) = target else {
        return;
    };
    target
        .env
        .get_or_insert_with(Vec::new)
        .extend(t.env.iter().map(|(name, value)| env(name, value.clone())));
    let Some(file) = &t.sampling else {
        return;
    };
    target
        .volume_mounts
        .get_or_insert_with(Vec::new)
        .push(mount(SAMPLING_VOLUME, SAMPLING_MOUNT_PATH, true));
    let volumes = pod.volumes.get_or_insert_with(Vec::new);
    if !volumes.iter().any(|v| v.name == SAMPLING_VOLUME) {
        volumes.push(Volume {
            name: SAMPLING_VOLUME.to_owned(),
            config_map: Some(ConfigMapVolumeSource {
                name: file.config_map.clone(),
                ..Default::default()
            }),
            ..Default::default()
        });
    }
}

/// The pod template of a Deployment.
fn deployment_pod(deployment: &mut Deployment) -> Option<&mut PodSpec> {
    deployment.spec.as_mut()?.template.spec.as_mut()
}

/// Telemetry of a one-process Deployment (multigateway, multiorch, multiadmin).
pub fn add_to_deployment(
    deployment: &mut Deployment,
    container: &str,
    process: Process,
    source: Source<'_>,
) {
    if let Some(pod) = deployment_pod(deployment) {
        add_telemetry(pod, container, &source.of(process));
    }
}

/// Telemetry of a Cell's multigateway.
pub fn add_to_cell(objects: &mut CellObjects, source: Source<'_>) {
    add_to_deployment(
        &mut objects.deployment,
        "multigateway",
        Process::Multigateway,
        source,
    );
}

/// Telemetry of a Shard's multiorch Deployments and of pgctld and multipooler in its pools.
pub fn add_to_shard(objects: &mut ShardObjects, source: Source<'_>) {
    for orch in &mut objects.multiorch {
        add_to_deployment(
            &mut orch.deployment,
            "multiorch",
            Process::Multiorch,
            source,
        );
    }
    for pool in &mut objects.pools {
        let pod = pool
            .statefulset
            .spec
            .as_mut()
            .and_then(|s| s.template.spec.as_mut());
        if let Some(pod) = pod {
            add_telemetry(pod, "postgres", &source.of(Process::Pgctld));
            add_telemetry(pod, "multipooler", &source.of(Process::Multipooler));
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{Container, EnvVar};
    use multigres_api::v1alpha1::SamplingConfigRef;

    use super::*;

    fn inherited(vars: &[(&str, &str)]) -> InheritedEnv {
        InheritedEnv::from_vars(
            vars.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<Vec<_>>(),
        )
    }

    fn pod() -> PodSpec {
        PodSpec {
            init_containers: Some(vec![Container {
                name: "postgres".into(),
                env: Some(vec![env("PGDATA", "/data")]),
                ..Default::default()
            }]),
            containers: vec![Container {
                name: "multipooler".into(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn names(env: &Option<Vec<EnvVar>>) -> Vec<String> {
        env.iter().flatten().map(|e| e.name.clone()).collect()
    }

    #[test]
    fn variables_follow_the_containers_own_and_the_sampling_file_is_mounted_once() {
        let config = ObservabilityConfig {
            otlp_endpoint: Some("http://collector:4318".into()),
            sampling_config_ref: Some(SamplingConfigRef {
                name: "sampling".into(),
                key: Some("rules.yaml".into()),
            }),
            ..Default::default()
        };
        let source = Source {
            config: Some(&config),
            inherited: &InheritedEnv::default(),
            cluster: "c1",
            project: None,
        };
        let mut p = pod();
        add_telemetry(&mut p, "postgres", &source.of(Process::Pgctld));
        add_telemetry(&mut p, "multipooler", &source.of(Process::Multipooler));
        let init = &p.init_containers.as_ref().unwrap()[0];
        assert_eq!(
            names(&init.env),
            [
                "PGDATA",
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                "OTEL_RESOURCE_ATTRIBUTES",
                "OTEL_TRACES_SAMPLER_CONFIG"
            ]
        );
        let attributes = &init.env.as_ref().unwrap()[2];
        assert_eq!(
            attributes.value.as_deref(),
            Some("multigres.cluster=c1,multigres.component=pgctld")
        );
        assert_eq!(
            init.env.as_ref().unwrap()[3].value.as_deref(),
            Some("/etc/otel/rules.yaml")
        );
        for c in [init, &p.containers[0]] {
            assert_eq!(
                c.volume_mounts,
                Some(vec![mount(SAMPLING_VOLUME, SAMPLING_MOUNT_PATH, true)])
            );
        }
        let volumes = p.volumes.unwrap();
        assert_eq!(volumes.len(), 1);
        assert_eq!(volumes[0].config_map.as_ref().unwrap().name, "sampling");
    }

    #[test]
    fn no_telemetry_leaves_the_pod_untouched() {
        let disabled = ObservabilityConfig {
            otlp_endpoint: Some("disabled".into()),
            ..Default::default()
        };
        let operator = inherited(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://op:4317")]);
        for (config, inherited) in [
            (None, InheritedEnv::default()),
            (Some(&disabled), operator.clone()),
        ] {
            let source = Source {
                config,
                inherited: &inherited,
                cluster: "c1",
                project: None,
            };
            let mut p = pod();
            add_telemetry(&mut p, "multipooler", &source.of(Process::Multipooler));
            assert_eq!(p, pod());
        }
        let source = Source {
            config: None,
            inherited: &operator,
            cluster: "c1",
            project: Some("proj"),
        };
        let mut p = pod();
        add_telemetry(&mut p, "multipooler", &source.of(Process::Multipooler));
        assert_eq!(
            names(&p.containers[0].env),
            ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_RESOURCE_ATTRIBUTES"]
        );
        assert!(p.volumes.is_none());
    }
}
