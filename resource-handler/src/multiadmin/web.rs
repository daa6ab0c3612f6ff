//! MultigresCluster → multiadmin-web: the web UI (a Next.js server) in front of multiadmin's
//! HTTP API, which also reads the catalog through the cluster's multigateway. One Deployment and
//! one Service per cluster, from the resolved `multiadminWeb` spec.
//!
//! The image runs its own entrypoint (`node server.js`) as its own user (`nextjs`, 1001); the
//! root filesystem stays read-only with writable `/tmp` and Next.js cache directories. Unlike
//! the upstream operator, the UI does not log in as the superuser: its catalog queries use the
//! operator's read-only role [`WEB_UI_ROLE`] (`multiadmin_web`, which may read only the tables
//! the UI reads) with the password the operator generates in Secret `<cluster>-web-ui-role`
//! ([`crate::role_secrets`]), so the UI holds no superuser password at all.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{
    EnvVar, EnvVarSource, PodSpec, SecretKeySelector, Service, Volume,
};
use multigres_api::labels::{self, Component, Placement};
use multigres_api::managed_roles::PASSWORD_KEY;
use multigres_api::owner::Owner;
use multigres_api::resolver::{ResolvedCluster, defaults};
use multigres_api::v1alpha1::WEB_UI_ROLE;

use crate::contract::{MULTIADMIN_HTTP, POSTGRES_PORT};
use crate::podspec::{
    Probes, PullSettings, RunAs, container_port, container_security, env, mount, pod_security,
    service_port,
};
use crate::stateless::{self, Process, Workload};

/// HTTP port of multiadmin-web (the image's `PORT`, as the upstream operator serves it).
pub const MULTIADMIN_WEB_HTTP: i32 = 18100;

/// The image's own user and group (`nextjs:nodejs`), which own its files.
pub const WEB_RUN_AS: RunAs = RunAs {
    user: 1001,
    group: 1001,
};

/// Where Next.js writes its fetch and image caches (the image's working directory is `/app`).
pub const NEXT_CACHE_DIR: &str = "/app/.next/cache";
const NEXT_CACHE_VOLUME: &str = "next-cache";

/// The UI answers `/` once the server listens; Node starts in seconds but pulls are slow.
const STARTUP_BUDGET_SECONDS: i32 = 150;

/// The database the UI reads the catalog from (the only one v1alpha1 allows).
const CATALOG_DATABASE: &str = "postgres";

/// The multiadmin-web objects of one cluster.
#[derive(Clone, Debug, PartialEq)]
pub struct WebObjects {
    /// The multiadmin-web Deployment.
    pub deployment: Deployment,
    /// Its Service (HTTP), which `externalAdminWeb` exposes.
    pub service: Service,
}

fn secret_env(name: &str, secret: String, key: &str) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret,
                key: key.to_owned(),
                optional: Some(false),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The UI's environment: where it listens, multiadmin's API, and how it reaches PostgreSQL
/// through the cluster-wide gateway Service, as [`WEB_UI_ROLE`] with the password in Secret
/// `<cluster>-web-ui-role`. Without `with_password` the UI holds none: its PostgreSQL client
/// connects without TLS (`web/multiadmin/lib/db.ts`, `ssl: false`), so where the gateways
/// require TLS the password could never be used and is only a liability.
pub fn web_env(cluster: &str, with_password: bool) -> Vec<EnvVar> {
    let mut env_vars = vec![
        env("HOSTNAME", "::"),
        env("PORT", MULTIADMIN_WEB_HTTP.to_string()),
        env(
            "MULTIADMIN_API_URL",
            format!(
                "http://{}:{MULTIADMIN_HTTP}",
                crate::names::multiadmin(cluster)
            ),
        ),
        env("POSTGRES_HOST", crate::names::cluster_multigateway(cluster)),
        env("POSTGRES_PORT", POSTGRES_PORT.to_string()),
        env("POSTGRES_DATABASE", CATALOG_DATABASE),
        env("POSTGRES_USER", WEB_UI_ROLE),
    ];
    if with_password {
        env_vars.push(secret_env(
            "POSTGRES_PASSWORD",
            multigres_api::names::web_ui_role_secret(cluster),
            PASSWORD_KEY,
        ));
    }
    env_vars
}

/// Builds multiadmin-web for a resolved cluster owned by `owner`; `with_password`: whether the
/// UI gets its role's password (see [`web_env`]).
pub fn build(owner: &Owner, resolved: &ResolvedCluster, with_password: bool) -> WebObjects {
    let at = Placement::default();
    let labels = labels::labels(&owner.cluster, Component::MultiadminWeb, &at);
    let selector = labels::selector(&owner.cluster, Component::MultiadminWeb, &at);
    let name = crate::names::multiadmin_web(&owner.cluster);
    let images = &resolved.images;
    let pull = PullSettings::new(Some(images.pull_policy), &images.pull_secrets);
    let mut deployment = stateless::deployment(Workload {
        name: name.clone(),
        owner,
        labels: labels.clone(),
        selector: selector.clone(),
        spec: &resolved.multiadmin_web,
        default_replicas: defaults::MULTIADMIN_WEB_REPLICAS,
        tolerations: Vec::new(),
        node_selector: Default::default(),
        pull: &pull,
        process: Process {
            name: "multiadmin-web",
            image: images.multiadmin_web.as_str().to_owned(),
            command: String::new(),
            args: Vec::new(),
            ports: vec![container_port("http", MULTIADMIN_WEB_HTTP)],
            probes: Probes::new("/", "/", "/", MULTIADMIN_WEB_HTTP, STARTUP_BUDGET_SECONDS),
        },
        recreate: false,
    });
    if let Some(pod) = deployment
        .spec
        .as_mut()
        .and_then(|s| s.template.spec.as_mut())
    {
        run_image_entrypoint(pod, web_env(&owner.cluster, with_password));
    }
    let service = stateless::service(
        &name,
        owner,
        &labels,
        &selector,
        vec![service_port("http", MULTIADMIN_WEB_HTTP)],
    );
    WebObjects {
        deployment,
        service,
    }
}

/// Turns the Multigres daemon pod into the web UI's: the image's entrypoint and user, its
/// environment added, and a writable Next.js cache.
fn run_image_entrypoint(pod: &mut PodSpec, web_env: Vec<EnvVar>) {
    pod.security_context = Some(pod_security(WEB_RUN_AS, WEB_RUN_AS.group));
    pod.volumes.get_or_insert_with(Vec::new).push(Volume {
        name: NEXT_CACHE_VOLUME.to_owned(),
        empty_dir: Some(Default::default()),
        ..Default::default()
    });
    for container in &mut pod.containers {
        container.command = None;
        container.args = None;
        container
            .env
            .get_or_insert_with(Vec::new)
            .extend(web_env.clone());
        container.security_context = Some(container_security(WEB_RUN_AS, true));
        container
            .volume_mounts
            .get_or_insert_with(Vec::new)
            .push(mount(NEXT_CACHE_VOLUME, NEXT_CACHE_DIR, false));
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    use multigres_api::resolver::{Templates, resolve};
    use multigres_api::v1alpha1::MultigresCluster;

    use super::*;

    fn cluster() -> MultigresCluster {
        let mut c: MultigresCluster =
            serde_yaml::from_str(include_str!("../../fixtures/cluster-external-topo.yaml"))
                .unwrap();
        c.spec.multiadmin_web = Some(
            serde_yaml::from_str(
                "{spec: {replicas: 3, podLabels: {team: ui}, podAnnotations: {a.example/x: y}, \
                 resources: {limits: {memory: 300Mi}}, \
                 affinity: {podAntiAffinity: {preferredDuringSchedulingIgnoredDuringExecution: \
                 [{weight: 1, podAffinityTerm: {topologyKey: kubernetes.io/hostname}}]}}}}",
            )
            .unwrap(),
        );
        c.spec.postgres_superuser = Some("admin".into());
        c
    }

    fn objects(c: &MultigresCluster) -> WebObjects {
        let resolved = resolve(c, &Templates::default()).unwrap();
        let owner = Owner::with_cluster(c, "prod".into()).unwrap();
        build(&owner, &resolved, true)
    }

    #[test]
    fn deployment_follows_the_resolved_multiadmin_web_spec() {
        let o = objects(&cluster());
        assert_eq!(
            o.deployment.metadata.name.as_deref(),
            Some("prod-multiadmin-web")
        );
        let spec = o.deployment.spec.as_ref().unwrap();
        assert_eq!(spec.replicas, Some(3));
        let selector = spec.selector.match_labels.as_ref().unwrap();
        assert_eq!(selector["app.kubernetes.io/component"], "multiadmin-web");
        let meta = spec.template.metadata.as_ref().unwrap();
        assert_eq!(meta.labels.as_ref().unwrap()["team"], "ui");
        assert_eq!(meta.annotations.as_ref().unwrap()["a.example/x"], "y");
        let pod = spec.template.spec.as_ref().unwrap();
        assert!(pod.affinity.as_ref().unwrap().pod_anti_affinity.is_some());
        assert_eq!(pod.image_pull_secrets.as_ref().unwrap()[0].name, "regcred");
        assert_eq!(
            pod.tolerations, None,
            "multiadmin's placement is not the UI's"
        );
        assert_eq!(
            pod.security_context.as_ref().unwrap().run_as_user,
            Some(1001)
        );
        let c = &pod.containers[0];
        assert_eq!(c.name, "multiadmin-web");
        assert_eq!(
            c.image.as_deref(),
            Some(defaults::MULTIADMIN_WEB_IMAGE),
            "the fixture pins multiadmin only"
        );
        assert_eq!(c.image_pull_policy.as_deref(), Some("Always"));
        assert_eq!((c.command.as_ref(), c.args.as_ref()), (None, None));
        let limits = c.resources.as_ref().unwrap().limits.as_ref().unwrap();
        assert_eq!(limits["memory"].0, "300Mi");
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!(
            (sc.run_as_user, sc.read_only_root_filesystem),
            (Some(1001), Some(true))
        );
        let mounts: Vec<_> = c
            .volume_mounts
            .iter()
            .flatten()
            .map(|m| m.mount_path.as_str())
            .collect();
        assert!(mounts.contains(&"/tmp") && mounts.contains(&NEXT_CACHE_DIR));
        let probe = c
            .readiness_probe
            .as_ref()
            .unwrap()
            .http_get
            .as_ref()
            .unwrap();
        assert_eq!(
            (probe.path.as_deref(), &probe.port),
            (Some("/"), &IntOrString::Int(18100))
        );
        assert_eq!(
            c.startup_probe.as_ref().unwrap().failure_threshold,
            Some(30)
        );
    }

    #[test]
    fn ui_reaches_multiadmin_and_the_cluster_gateway_as_its_own_role() {
        let o = objects(&cluster());
        let pod = o.deployment.spec.unwrap().template.spec.unwrap();
        let env = pod.containers[0].env.clone().unwrap();
        let value = |name: &str| {
            env.iter()
                .find(|e| e.name == name)
                .and_then(|e| e.value.clone())
                .unwrap_or_else(|| panic!("{name} missing"))
        };
        assert_eq!(value("HOSTNAME"), "::");
        assert_eq!(value("PORT"), "18100");
        assert_eq!(value("MULTIADMIN_API_URL"), "http://prod-multiadmin:18000");
        assert_eq!(value("POSTGRES_HOST"), "prod-multigateway");
        assert_eq!(value("POSTGRES_PORT"), "5432");
        assert_eq!(value("POSTGRES_DATABASE"), "postgres");
        assert_eq!(
            value("POSTGRES_USER"),
            "multiadmin_web",
            "not the superuser (admin)"
        );
        let password = env.iter().find(|e| e.name == "POSTGRES_PASSWORD").unwrap();
        let secret = password
            .value_from
            .as_ref()
            .unwrap()
            .secret_key_ref
            .as_ref()
            .unwrap();
        assert_eq!(
            (secret.name.as_str(), secret.key.as_str(), secret.optional),
            ("prod-web-ui-role", "password", Some(false)),
            "the generated role Secret, not the superuser's (pg)"
        );
        assert!(
            env.iter().all(|e| e
                .value_from
                .as_ref()
                .and_then(|v| v.secret_key_ref.as_ref())
                .is_none_or(|r| r.name != "pg")),
            "no superuser password: {env:?}"
        );
    }

    #[test]
    fn without_a_password_the_ui_holds_none() {
        let env = web_env("prod", false);
        assert!(env.iter().all(|e| e.name != "POSTGRES_PASSWORD"), "{env:?}");
        assert!(
            env.iter()
                .any(|e| e.name == "POSTGRES_USER" && e.value.as_deref() == Some("multiadmin_web"))
        );
    }

    #[test]
    fn service_serves_http_on_18100() {
        let o = objects(&cluster());
        let spec = o.service.spec.unwrap();
        assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
        let ports: Vec<_> = spec
            .ports
            .iter()
            .flatten()
            .map(|p| (p.name.clone().unwrap(), p.port, p.target_port.clone()))
            .collect();
        assert_eq!(
            ports,
            [(
                "http".to_owned(),
                18100,
                Some(IntOrString::String("http".into()))
            )]
        );
        assert_eq!(
            spec.selector.unwrap()["app.kubernetes.io/component"],
            "multiadmin-web"
        );
    }
}
