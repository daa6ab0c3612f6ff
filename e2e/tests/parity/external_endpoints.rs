//! External gateway, external admin web and multiadmin web (`spec.externalGateway`,
//! `spec.externalAdminWeb`, `spec.multiadminWeb`): the cluster-wide multigateway Service and the
//! multiadmin-web Deployment and Service appear with exactly the contents the spec asks for;
//! a load balancer's ingress (written by the test, standing in for the cloud controller, which
//! this control plane does not run) becomes the cluster's reported endpoint with
//! `EndpointReady`; disabling the features turns the Services back into plain ClusterIP ones
//! and removes the status fields and conditions, leaving the cluster-handler's alone.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{EnvVar, Service};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use multigres_api::v1alpha1::MultigresCluster;
use multigres_e2e::harness::{
    Stack, WAIT, admin, apply_yaml, control_plane, eventually, fresh_namespace,
};
use serde_json::json;

const CLUSTER: &str = r#"
apiVersion: multigres.com/v1alpha1
kind: MultigresCluster
metadata:
  name: ext
spec:
  images:
    imagePullSecrets: [{name: regcred}]
    multiadminWeb: registry.example.com/multiadmin-web:v2
  globalTopoServer:
    external:
      endpoints: [http://127.0.0.1:23790]
      rootPath: /ext/global
  postgresSuperuser: dba
  postgresPasswordSecretRef: {name: pg, key: password}
  multiadminWeb:
    spec:
      replicas: 2
      podLabels: {team: ui}
      podAnnotations: {example.com/owner: ui}
      resources:
        requests: {cpu: 20m, memory: 32Mi}
        limits: {memory: 96Mi}
  externalGateway:
    enabled: true
    externalIPs: [203.0.113.10, 203.0.113.11]
    annotations:
      lb.example.com/scheme: internet-facing
      lb.example.com/idle-timeout: "300"
  externalAdminWeb:
    enabled: true
    annotations:
      lb.example.com/scheme: internal
  cells:
    - {name: zone-a, zoneId: zone-a}
"#;

/// The handlers' bookkeeping annotation, which is not the user's.
const APPLIED_HASH: &str = "multigres.com/applied-hash";

fn user_annotations(s: &Service) -> BTreeMap<String, String> {
    let mut a = s.metadata.annotations.clone().unwrap_or_default();
    a.remove(APPLIED_HASH);
    a
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn condition<'a>(c: &'a MultigresCluster, type_: &str) -> Option<&'a Condition> {
    c.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
}

/// `(status, reason)` of a condition, for messages.
fn state(c: &MultigresCluster, type_: &str) -> Option<(String, String)> {
    condition(c, type_).map(|c| (c.status.clone(), c.reason.clone()))
}

fn endpoints(c: &MultigresCluster) -> (Option<String>, Option<String>) {
    let s = c.status.clone().unwrap_or_default();
    (
        s.gateway.map(|g| g.external_endpoint),
        s.admin_web.map(|g| g.external_endpoint),
    )
}

async fn get<K>(api: &Api<K>, name: &str) -> Result<K, String>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.get_opt(name)
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("{name} does not exist yet"))
}

#[tokio::test]
async fn external_endpoints_and_multiadmin_web_follow_the_spec() {
    let cluster = control_plane().await;
    let ns = fresh_namespace(cluster, "parity-ext").await;
    let stack = Stack::start(cluster, &ns, None).await;
    apply_yaml(cluster, &ns, CLUSTER).await;
    let client = admin(cluster);
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let clusters: Api<MultigresCluster> = Api::namespaced(client.clone(), &ns);

    // The cluster-wide gateway Service: every cell's gateways, exposed as the spec says.
    let gateway = eventually("the exposed gateway Service", WAIT, || async {
        let s = get(&services, "ext-multigateway").await?;
        let t = s.spec.as_ref().and_then(|s| s.type_.clone());
        (t.as_deref() == Some("LoadBalancer"))
            .then_some(s)
            .ok_or_else(|| format!("type {t:?}"))
    })
    .await;
    let spec = gateway.spec.clone().unwrap();
    assert_eq!(
        spec.external_ips.as_deref(),
        Some(&["203.0.113.10".to_owned(), "203.0.113.11".to_owned()][..])
    );
    assert_eq!(
        user_annotations(&gateway),
        map(&[
            ("lb.example.com/idle-timeout", "300"),
            ("lb.example.com/scheme", "internet-facing")
        ])
    );
    assert_eq!(
        spec.selector.clone().unwrap(),
        map(&[
            ("app.kubernetes.io/component", "multigateway"),
            ("app.kubernetes.io/instance", "ext"),
            ("multigres.com/cluster", "ext"),
        ])
    );
    let ports: Vec<_> = spec
        .ports
        .iter()
        .flatten()
        .map(|p| (p.name.clone(), p.port, p.target_port.clone()))
        .collect();
    assert_eq!(
        ports,
        [(
            Some("postgres".to_owned()),
            5432,
            Some(IntOrString::String("postgres".into()))
        )]
    );
    let owner = &gateway.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("MultigresCluster", "ext")
    );

    // multiadmin-web: its Service exposed, its Deployment from the resolved spec.
    // Applied together with the gateway Service, not after it: it may appear a moment later.
    let web = eventually("the multiadmin-web Service", WAIT, || async {
        get(&services, "ext-multiadmin-web").await
    })
    .await;
    let web_spec = web.spec.clone().unwrap();
    assert_eq!(web_spec.type_.as_deref(), Some("LoadBalancer"));
    assert_eq!(web_spec.external_ips, None);
    assert_eq!(
        user_annotations(&web),
        map(&[("lb.example.com/scheme", "internal")])
    );
    let web_ports: Vec<_> = web_spec
        .ports
        .iter()
        .flatten()
        .map(|p| (p.name.clone(), p.port))
        .collect();
    assert_eq!(web_ports, [(Some("http".to_owned()), 18100)]);
    let ui = eventually("the multiadmin-web Deployment", WAIT, || async {
        get(&deployments, "ext-multiadmin-web").await
    })
    .await;
    let ui_spec = ui.spec.clone().unwrap();
    assert_eq!(ui_spec.replicas, Some(2));
    let template = ui_spec.template;
    let meta = template.metadata.unwrap();
    assert_eq!(meta.labels.unwrap()["team"], "ui");
    assert_eq!(meta.annotations.unwrap()["example.com/owner"], "ui");
    let pod = template.spec.unwrap();
    assert_eq!(pod.image_pull_secrets.unwrap()[0].name, "regcred");
    let c = &pod.containers[0];
    assert_eq!(
        c.image.as_deref(),
        Some("registry.example.com/multiadmin-web:v2")
    );
    assert_eq!((c.command.as_ref(), c.args.as_ref()), (None, None));
    let resources = c.resources.clone().unwrap();
    assert_eq!(resources.requests.unwrap()["cpu"].0, "20m");
    assert_eq!(resources.limits.unwrap()["memory"].0, "96Mi");
    let env: BTreeMap<String, EnvVar> = c
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.clone(), e.clone()))
        .collect();
    let value = |name: &str| env.get(name).and_then(|e| e.value.clone());
    assert_eq!(
        value("MULTIADMIN_API_URL").as_deref(),
        Some("http://ext-multiadmin:18000")
    );
    assert_eq!(value("POSTGRES_HOST").as_deref(), Some("ext-multigateway"));
    assert_eq!(value("POSTGRES_PORT").as_deref(), Some("5432"));
    // Its own read-only role, not the superuser (`dba`), with the generated password.
    assert_eq!(value("POSTGRES_USER").as_deref(), Some("multiadmin_web"));
    assert_eq!(value("PORT").as_deref(), Some("18100"));
    let password = env["POSTGRES_PASSWORD"]
        .value_from
        .clone()
        .unwrap()
        .secret_key_ref
        .unwrap();
    assert_eq!(
        (password.name, password.key),
        ("ext-web-ui-role".into(), "password".into())
    );
    let probe = c.readiness_probe.clone().unwrap().http_get.unwrap();
    assert_eq!(
        (probe.path.as_deref(), probe.port),
        (Some("/"), IntOrString::Int(18100))
    );

    // The gateway's external IP is its endpoint once a gateway pod is ready; the UI has no
    // address until a load balancer provisions one, and says so.
    let c = eventually("the gateway endpoint is ready", WAIT, || async {
        let c = get(&clusters, "ext").await?;
        let ready =
            state(&c, "GatewayExternalReady") == Some(("True".into(), "EndpointReady".into()));
        ready.then_some(c.clone()).ok_or_else(|| {
            format!(
                "{:?} {:?}",
                endpoints(&c),
                state(&c, "GatewayExternalReady")
            )
        })
    })
    .await;
    assert_eq!(
        endpoints(&c),
        (Some("203.0.113.10".into()), Some(String::new()))
    );
    let awaiting = condition(&c, "AdminWebExternalReady").unwrap();
    assert_eq!(
        (awaiting.status.as_str(), awaiting.reason.as_str()),
        ("False", "AwaitingEndpoint")
    );
    assert!(
        awaiting.message.contains("load-balancer controller")
            && awaiting
                .message
                .contains("spec.externalAdminWeb.externalIPs"),
        "{}",
        awaiting.message
    );
    assert_eq!(awaiting.observed_generation, c.metadata.generation);
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    eventually("an event says the UI awaits its endpoint", WAIT, || async {
        let list = events
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        list.items
            .iter()
            .any(|e| e.reason.as_deref() == Some("AwaitingEndpoint"))
            .then_some(())
            .ok_or_else(|| "no AwaitingEndpoint event".to_owned())
    })
    .await;

    // The cloud controller's part: ingress addresses on both Services.
    let ingress =
        |address: serde_json::Value| json!({"status": {"loadBalancer": {"ingress": [address]}}});
    services
        .patch_status(
            "ext-multiadmin-web",
            &PatchParams::default(),
            &Patch::Merge(ingress(json!({"hostname": "ui.example.test"}))),
        )
        .await
        .unwrap();
    services
        .patch_status(
            "ext-multigateway",
            &PatchParams::default(),
            &Patch::Merge(ingress(json!({"ip": "198.51.100.7"}))),
        )
        .await
        .unwrap();
    eventually(
        "both endpoints come from the load balancer",
        WAIT,
        || async {
            let c = get(&clusters, "ext").await?;
            let want = (
                Some("198.51.100.7".to_owned()),
                Some("ui.example.test".to_owned()),
            );
            let ready =
                state(&c, "AdminWebExternalReady") == Some(("True".into(), "EndpointReady".into()));
            (endpoints(&c) == want && ready)
                .then_some(())
                .ok_or_else(|| {
                    format!(
                        "{:?} {:?}",
                        endpoints(&c),
                        state(&c, "AdminWebExternalReady")
                    )
                })
        },
    )
    .await;

    // Converged: nothing more to write while nothing changes.
    let before = stack.resource_handler.settled(Duration::from_secs(3)).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        stack.resource_handler.writes().await,
        before,
        "idle costs nothing"
    );

    // An annotation removed from the spec disappears from the Service.
    clusters
        .patch(
            "ext",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"externalGateway": {"annotations": {
                "lb.example.com/idle-timeout": null
            }}}})),
        )
        .await
        .unwrap();
    eventually("the removed annotation is gone", WAIT, || async {
        let s = get(&services, "ext-multigateway").await?;
        let a = user_annotations(&s);
        (a == map(&[("lb.example.com/scheme", "internet-facing")]))
            .then_some(())
            .ok_or_else(|| format!("{a:?}"))
    })
    .await;

    // Disabled: plain ClusterIP Services, no endpoints, no conditions of ours; the
    // cluster-handler's conditions stay.
    clusters
        .patch(
            "ext",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {
                "externalGateway": {"enabled": false},
                "externalAdminWeb": {"enabled": false}
            }})),
        )
        .await
        .unwrap();
    for name in ["ext-multigateway", "ext-multiadmin-web"] {
        eventually(&format!("{name} is ClusterIP again"), WAIT, || async {
            let s = get(&services, name).await?;
            let spec = s.spec.clone().unwrap_or_default();
            let plain = spec.type_.as_deref() == Some("ClusterIP")
                && spec.external_ips.is_none()
                && user_annotations(&s).is_empty()
                && spec.ports.iter().flatten().all(|p| p.node_port.is_none());
            plain
                .then_some(())
                .ok_or_else(|| format!("{:?} {:?}", spec, user_annotations(&s)))
        })
        .await;
    }
    let c = eventually("the external status is removed", WAIT, || async {
        let c = get(&clusters, "ext").await?;
        let gone = endpoints(&c) == (None, None)
            && condition(&c, "GatewayExternalReady").is_none()
            && condition(&c, "AdminWebExternalReady").is_none();
        gone.then_some(c.clone()).ok_or_else(|| {
            format!(
                "{:?} {:?}",
                endpoints(&c),
                c.status.as_ref().map(|s| &s.conditions)
            )
        })
    })
    .await;
    assert!(
        condition(&c, "Available").is_some(),
        "the cluster-handler's conditions are left alone: {:?}",
        c.status
    );
}
