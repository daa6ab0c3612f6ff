use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, ServiceStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::*;

fn cluster(extra: &str) -> MultigresCluster {
    let mut c: MultigresCluster =
        serde_yaml::from_str(include_str!("../../../fixtures/cluster-external-topo.yaml")).unwrap();
    c.metadata.generation = Some(4);
    let extra: MultigresCluster = serde_yaml::from_str(&format!(
        "{{apiVersion: multigres.com/v1alpha1, kind: MultigresCluster, metadata: {{name: x}}, \
         spec: {{postgresPasswordSecretRef: {{name: pg, key: password}}, {extra}}}}}"
    ))
    .unwrap();
    c.spec.external_gateway = extra.spec.external_gateway;
    c.spec.external_admin_web = extra.spec.external_admin_web;
    c
}

const ENABLED: &str = "externalGateway: {enabled: true, externalIPs: [203.0.113.10, \
                       '2001:db8::10'], annotations: {lb.example/scheme: internet-facing}}, \
                       externalAdminWeb: {enabled: true, annotations: {lb.example/x: y}}";

fn owner(c: &MultigresCluster) -> Owner {
    Owner::with_cluster(c, "prod".into()).unwrap()
}

fn exposed_gateway(c: &MultigresCluster) -> Service {
    let mut s = gateway_service(&owner(c));
    expose(&mut s, Exposed::Gateway.enabled(c));
    s
}

fn with_ingress(mut s: Service, ingress: LoadBalancerIngress) -> Service {
    s.status = Some(ServiceStatus {
        load_balancer: Some(LoadBalancerStatus {
            ingress: Some(vec![ingress]),
        }),
        ..Default::default()
    });
    s
}

#[test]
fn cluster_gateway_service_selects_every_cells_gateways() {
    let s = gateway_service(&owner(&cluster("")));
    assert_eq!(s.metadata.name.as_deref(), Some("prod-multigateway"));
    let spec = s.spec.unwrap();
    assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
    let selector = spec.selector.unwrap();
    assert_eq!(selector["app.kubernetes.io/component"], "multigateway");
    assert_eq!(selector["multigres.com/cluster"], "prod");
    assert!(
        !selector.contains_key("multigres.com/cell"),
        "spans all cells"
    );
    let ports = spec.ports.unwrap();
    assert_eq!(ports.len(), 1);
    assert_eq!(
        (
            ports[0].name.as_deref(),
            ports[0].port,
            &ports[0].target_port
        ),
        (
            Some("postgres"),
            5432,
            &Some(IntOrString::String("postgres".into()))
        )
    );
    assert_eq!(s.metadata.annotations, None);
}

#[test]
fn the_replica_service_reaches_every_cells_replica_port_and_is_never_exposed() {
    let s = gateway_replica_service(&owner(&cluster(ENABLED)));
    assert_eq!(
        s.metadata.name.as_deref(),
        Some("prod-multigateway-replica")
    );
    let spec = s.spec.unwrap();
    assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
    assert_eq!(spec.external_ips, None);
    let selector = spec.selector.unwrap();
    assert_eq!(selector["app.kubernetes.io/component"], "multigateway");
    assert_eq!(selector["multigres.com/cluster"], "prod");
    assert!(!selector.contains_key("multigres.com/cell"));
    let ports = spec.ports.unwrap();
    assert_eq!(
        ports
            .iter()
            .map(|p| (p.name.as_deref(), p.port, p.target_port.clone()))
            .collect::<Vec<_>>(),
        [(
            Some("pg-replica"),
            5433,
            Some(IntOrString::String("pg-replica".into()))
        )]
    );
}

#[test]
fn enabled_exposure_is_a_load_balancer_with_ips_and_annotations() {
    let s = exposed_gateway(&cluster(ENABLED));
    let spec = s.spec.as_ref().unwrap();
    assert_eq!(spec.type_.as_deref(), Some("LoadBalancer"));
    assert_eq!(
        spec.external_ips.as_deref(),
        Some(&["203.0.113.10".to_owned(), "2001:db8::10".to_owned()][..])
    );
    assert_eq!(
        s.metadata.annotations.as_ref().unwrap()["lb.example/scheme"],
        "internet-facing"
    );
}

#[test]
fn source_ranges_limit_the_load_balancer_only_when_set() {
    let c = cluster(
        "externalGateway: {enabled: true, loadBalancerSourceRanges: [203.0.113.0/24, \
         '2001:db8::/32']}, externalAdminWeb: {enabled: true}",
    );
    let spec = exposed_gateway(&c).spec.unwrap();
    assert_eq!(
        spec.load_balancer_source_ranges.as_deref(),
        Some(&["203.0.113.0/24".to_owned(), "2001:db8::/32".to_owned()][..])
    );
    let mut web = gateway_service(&owner(&c));
    expose(&mut web, Exposed::AdminWeb.enabled(&c));
    let web = web.spec.unwrap();
    assert_eq!(web.type_.as_deref(), Some("LoadBalancer"));
    assert_eq!(web.load_balancer_source_ranges, None, "every address");
}

#[test]
fn disabled_exposure_leaves_a_plain_cluster_ip() {
    let c = cluster(
        "externalGateway: {enabled: false, externalIPs: [203.0.113.10], \
         annotations: {lb.example/x: y}}",
    );
    assert_eq!(exposed_gateway(&c), gateway_service(&owner(&c)));
    let (status, _) = status(&c, observed(None, 3), observed(None, 1), at(1));
    assert_eq!(
        (status.gateway, status.admin_web, status.conditions.len()),
        (None, None, 0)
    );
}

#[test]
fn invalid_ips_and_reserved_annotations_name_the_field() {
    let bad_ip = cluster("externalGateway: {enabled: true, externalIPs: [999.1.1.1]}");
    let e = validate(Exposed::Gateway, &bad_ip).unwrap_err();
    assert_eq!(e.field, "spec.externalGateway.externalIPs[0]");
    assert!(
        e.problem.contains("\"999.1.1.1\" is not an IP address"),
        "{e}"
    );
    let reserved = cluster("externalAdminWeb: {enabled: true, annotations: {multigres.com/x: y}}");
    let e = validate(Exposed::AdminWeb, &reserved).unwrap_err();
    assert_eq!(
        e.field,
        "spec.externalAdminWeb.annotations[\"multigres.com/x\"]"
    );
    assert!(validate(Exposed::Gateway, &reserved).is_ok());
    let disabled = cluster("externalGateway: {enabled: false, externalIPs: [999.1.1.1]}");
    assert!(validate(Exposed::Gateway, &disabled).is_ok());
}

#[test]
fn endpoint_prefers_the_provisioned_ingress_then_the_first_external_ip() {
    let c = cluster(ENABLED);
    let config = Exposed::Gateway.enabled(&c).unwrap();
    let s = exposed_gateway(&c);
    assert_eq!(endpoint(config, Some(&s)).as_deref(), Some("203.0.113.10"));
    let by_ip = with_ingress(
        s.clone(),
        LoadBalancerIngress {
            ip: Some("198.51.100.7".into()),
            hostname: Some("lb.example.com".into()),
            ..Default::default()
        },
    );
    assert_eq!(
        endpoint(config, Some(&by_ip)).as_deref(),
        Some("198.51.100.7")
    );
    let by_name = with_ingress(
        s.clone(),
        LoadBalancerIngress {
            hostname: Some("lb.example.com".into()),
            ..Default::default()
        },
    );
    assert_eq!(
        endpoint(config, Some(&by_name)).as_deref(),
        Some("lb.example.com")
    );
    let web = Exposed::AdminWeb.enabled(&c).unwrap();
    assert_eq!(endpoint(web, None), None, "no IPs, nothing provisioned");
    let mut stale = by_ip;
    stale.spec.as_mut().unwrap().type_ = Some("ClusterIP".into());
    assert_eq!(
        endpoint(web, Some(&stale)),
        None,
        "an ingress left on a ClusterIP Service is not an endpoint"
    );
}

fn observed(service: Option<&Service>, ready_pods: i32) -> Observed<'_> {
    Observed {
        service,
        ready_pods,
    }
}

fn at(s: i64) -> Timestamp {
    Timestamp::from_second(s).unwrap()
}

fn reasons(status: &MultigresClusterStatus) -> Vec<(String, String, String)> {
    status
        .conditions
        .iter()
        .map(|c| (c.type_.clone(), c.status.clone(), c.reason.clone()))
        .collect()
}

fn triple(t: &str, s: &str, r: &str) -> (String, String, String) {
    (t.into(), s.into(), r.into())
}

#[test]
fn conditions_say_what_is_missing() {
    let c = cluster(ENABLED);
    let web_svc = {
        let mut s = Service::default();
        expose(&mut s, Exposed::AdminWeb.enabled(&c));
        s
    };
    let (s, transitions) = status(&c, observed(None, 0), observed(Some(&web_svc), 1), at(1));
    assert_eq!(
        reasons(&s),
        [
            triple(GATEWAY_EXTERNAL_READY, FALSE, NO_READY_GATEWAYS),
            triple(ADMIN_WEB_EXTERNAL_READY, FALSE, AWAITING_ENDPOINT),
        ]
    );
    assert_eq!(transitions.len(), 2);
    assert_eq!(
        s.gateway.as_ref().unwrap().external_endpoint,
        "203.0.113.10"
    );
    assert_eq!(s.admin_web.as_ref().unwrap().external_endpoint, "");
    let awaiting = &s.conditions[1].message;
    assert!(
        awaiting.contains("load-balancer controller")
            && awaiting.contains("spec.externalAdminWeb.externalIPs"),
        "{awaiting}"
    );
    assert!(
        s.conditions
            .iter()
            .all(|c| c.observed_generation == Some(4))
    );

    // The load balancer provisions the UI's address and gateways become ready.
    let provisioned = with_ingress(
        web_svc,
        LoadBalancerIngress {
            hostname: Some("ui.example.com".into()),
            ..Default::default()
        },
    );
    let mut stored = c.clone();
    stored.status = Some(s.clone());
    let (s2, transitions) = status(
        &stored,
        observed(None, 2),
        observed(Some(&provisioned), 1),
        at(9),
    );
    assert_eq!(
        reasons(&s2),
        [
            triple(GATEWAY_EXTERNAL_READY, TRUE, ENDPOINT_READY),
            triple(ADMIN_WEB_EXTERNAL_READY, TRUE, ENDPOINT_READY),
        ]
    );
    assert_eq!(transitions.len(), 2);
    assert_eq!(s2.admin_web.unwrap().external_endpoint, "ui.example.com");
    assert_eq!(s2.conditions[0].last_transition_time, Time(at(9)));
    assert_eq!(
        s2.conditions[1].message,
        "http://ui.example.com:18100 is served by 1 ready multiadmin-web pod(s)"
    );
    let (_, none) = status(&stored, observed(None, 0), observed(None, 0), at(10));
    assert!(
        none.iter().all(|c| c.type_ != GATEWAY_EXTERNAL_READY),
        "same reason, no transition"
    );
}

#[test]
fn differs_only_on_owned_fields_and_sees_removals() {
    let c = cluster(ENABLED);
    let (desired, _) = status(&c, observed(None, 1), observed(None, 1), at(1));
    assert!(differs(&c, &desired), "nothing stored yet");
    let mut stored = c.clone();
    let mut s = desired.clone();
    s.phase = Some(multigres_api::v1alpha1::Phase::Healthy);
    s.conditions.push(Condition {
        type_: "Available".into(),
        status: TRUE.into(),
        reason: "AllCellsReady".into(),
        message: "m".into(),
        observed_generation: Some(4),
        last_transition_time: Time(at(0)),
    });
    stored.status = Some(s);
    let (again, _) = status(&stored, observed(None, 1), observed(None, 1), at(5));
    assert!(
        !differs(&stored, &again),
        "other handlers' fields do not count"
    );
    assert_eq!(
        again.conditions.len(),
        2,
        "only our condition types are sent"
    );

    // Disabling both: the stored endpoints and conditions must go.
    let mut disabled = stored.clone();
    disabled.spec.external_gateway = None;
    disabled.spec.external_admin_web = None;
    let (gone, _) = status(&disabled, observed(None, 1), observed(None, 1), at(6));
    assert_eq!(gone, MultigresClusterStatus::default());
    assert!(differs(&disabled, &gone));
}
