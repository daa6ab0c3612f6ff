//! MultigresCluster → multiadmin: one Deployment and Service per cluster, pointed at the
//! cluster's real global topology (the managed TopoServer's address and root, or the external
//! etcd's), as the resolver computes it for every other component.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use multigres_api::labels::{self, Component, Placement};
use multigres_api::owner::Owner;
use multigres_api::resolver::{ResolvedCluster, defaults};

use crate::contract::{
    MULTIADMIN_GRPC, MULTIADMIN_HTTP, flag, flag_expanding, log_level_flag, multigres_bin,
    topo_flags,
};
use crate::podspec::{Probes, PullSettings, container_port, service_port};
use crate::stateless::{self, Process, Workload};

/// multiadmin has no ready checks and listens at once.
const STARTUP_BUDGET_SECONDS: i32 = 120;

/// The multiadmin objects of one cluster.
#[derive(Clone, Debug, PartialEq)]
pub struct MultiadminObjects {
    /// The multiadmin Deployment.
    pub deployment: Deployment,
    /// Its Service (HTTP and gRPC API).
    pub service: Service,
}

/// multiadmin's command line. `--service-map=grpc-multiadmin` is what registers its API.
pub fn multiadmin_args(resolved: &ResolvedCluster) -> Vec<String> {
    let mut args = vec![
        flag("http-port", MULTIADMIN_HTTP),
        flag("grpc-port", MULTIADMIN_GRPC),
    ];
    args.extend(topo_flags(&resolved.topo_ref));
    args.extend([
        flag("service-map", "grpc-multiadmin"),
        flag_expanding("hostname", "$(POD_IP)"),
        log_level_flag(resolved.log_levels.multiadmin),
    ]);
    args
}

/// Builds multiadmin for a resolved cluster owned by `owner`.
pub fn build(owner: &Owner, resolved: &ResolvedCluster) -> MultiadminObjects {
    let at = Placement::default();
    let labels = labels::labels(&owner.cluster, Component::Multiadmin, &at);
    let selector = labels::selector(&owner.cluster, Component::Multiadmin, &at);
    let name = crate::names::multiadmin(&owner.cluster);
    let images = &resolved.images;
    let pull = PullSettings::new(Some(images.pull_policy), &images.pull_secrets);
    let deployment = stateless::deployment(Workload {
        name: name.clone(),
        owner,
        labels: labels.clone(),
        selector: selector.clone(),
        spec: &resolved.multiadmin,
        default_replicas: defaults::MULTIADMIN_REPLICAS,
        tolerations: resolved
            .multiadmin_placement
            .as_ref()
            .map(|p| p.tolerations.clone())
            .unwrap_or_default(),
        node_selector: Default::default(),
        pull: &pull,
        process: Process {
            name: "multiadmin",
            image: images.multiadmin.as_str().to_owned(),
            command: multigres_bin("multiadmin"),
            args: multiadmin_args(resolved),
            ports: vec![
                container_port("http", MULTIADMIN_HTTP),
                container_port("grpc", MULTIADMIN_GRPC),
            ],
            probes: Probes::multigres(MULTIADMIN_HTTP, STARTUP_BUDGET_SECONDS),
        },
        recreate: false,
    });
    let service = stateless::service(
        &name,
        owner,
        &labels,
        &selector,
        vec![
            service_port("http", MULTIADMIN_HTTP),
            service_port("grpc", MULTIADMIN_GRPC),
        ],
    );
    MultiadminObjects {
        deployment,
        service,
    }
}

#[cfg(test)]
mod tests {
    use multigres_api::resolver::{Templates, resolve};
    use multigres_api::v1alpha1::MultigresCluster;

    use super::*;

    fn cluster() -> MultigresCluster {
        serde_yaml::from_str(include_str!("../../fixtures/cluster-external-topo.yaml")).unwrap()
    }

    fn objects(cluster: &MultigresCluster) -> MultiadminObjects {
        let resolved = resolve(cluster, &Templates::default()).unwrap();
        let owner = Owner::with_cluster(cluster, cluster.metadata.name.clone().unwrap()).unwrap();
        build(&owner, &resolved)
    }

    fn args(o: &MultiadminObjects) -> Vec<String> {
        o.deployment
            .spec
            .as_ref()
            .unwrap()
            .template
            .spec
            .as_ref()
            .unwrap()
            .containers[0]
            .args
            .clone()
            .unwrap()
    }

    #[test]
    fn multiadmin_dials_the_external_topology_and_root() {
        let o = objects(&cluster());
        assert_eq!(
            args(&o),
            [
                "--http-port=18000",
                "--grpc-port=18070",
                "--topo-global-server-addresses=etcd-a.infra:2379,etcd-b.infra:2379",
                "--topo-global-root=/teams/db/global",
                "--service-map=grpc-multiadmin",
                "--hostname=$(POD_IP)",
                "--log-level=warn",
            ]
        );
    }

    #[test]
    fn multiadmin_dials_the_managed_topology_when_there_is_one() {
        let mut c = cluster();
        c.spec.global_topo_server =
            Some(serde_yaml::from_str("{etcd: {rootPath: /custom/root}}").unwrap());
        let a = args(&objects(&c));
        assert!(a.contains(&"--topo-global-server-addresses=prod-global-topo.db.svc:2379".into()));
        assert!(a.contains(&"--topo-global-root=/custom/root".into()));
    }

    #[test]
    fn deployment_and_service_follow_the_resolved_spec() {
        let o = objects(&cluster());
        assert_eq!(
            o.deployment.metadata.name.as_deref(),
            Some("prod-multiadmin")
        );
        let owner = &o.deployment.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str()),
            ("MultigresCluster", "prod")
        );
        let spec = o.deployment.spec.as_ref().unwrap();
        assert_eq!(spec.replicas, Some(2));
        let meta = spec.template.metadata.as_ref().unwrap();
        assert_eq!(meta.labels.as_ref().unwrap()["team"], "db");
        assert_eq!(
            meta.labels.as_ref().unwrap()["app.kubernetes.io/component"],
            "multiadmin"
        );
        assert_eq!(
            meta.annotations.as_ref().unwrap()["example.com/owner"],
            "db"
        );
        let pod = spec.template.spec.as_ref().unwrap();
        assert_eq!(pod.image_pull_secrets.as_ref().unwrap()[0].name, "regcred");
        assert_eq!(
            pod.tolerations.as_ref().unwrap()[0].key.as_deref(),
            Some("dedicated")
        );
        let c = &pod.containers[0];
        assert_eq!(
            c.image.as_deref(),
            Some("registry.example.com/multigres:v1")
        );
        assert_eq!(c.image_pull_policy.as_deref(), Some("Always"));
        assert_eq!(
            c.command.as_deref(),
            Some(&["/multigres/bin/multiadmin".to_owned()][..])
        );
        assert!(c.resources.is_some(), "resolver defaults apply");
        assert_eq!(
            c.readiness_probe
                .as_ref()
                .unwrap()
                .http_get
                .as_ref()
                .unwrap()
                .path
                .as_deref(),
            Some("/ready")
        );
        let ports: Vec<_> = o
            .service
            .spec
            .as_ref()
            .unwrap()
            .ports
            .iter()
            .flatten()
            .map(|p| (p.name.clone().unwrap(), p.port))
            .collect();
        assert_eq!(
            ports,
            [("http".to_owned(), 18000), ("grpc".to_owned(), 18070)]
        );
    }
}
