use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use multigres_api::v1alpha1::Cell;

use super::*;

const FIXTURE: &str = include_str!("../../../fixtures/cell.yaml");

fn fixture() -> Cell {
    serde_yaml::from_str(FIXTURE).expect("fixture parses")
}

fn objects(cell: &Cell) -> CellObjects {
    build(&Owner::of(cell).unwrap(), &cell.spec)
}

#[test]
fn multigateway_runs_with_the_exact_flags() {
    let cell = fixture();
    let objects = objects(&cell);
    let pod = objects
        .deployment
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap();
    let c = &pod.containers[0];
    assert_eq!(c.name, "multigateway");
    assert_eq!(
        c.command.as_deref(),
        Some(&["/multigres/bin/multigateway".to_owned()][..])
    );
    assert_eq!(
        c.args.as_deref().unwrap(),
        [
            "--http-port=15100",
            "--grpc-port=15170",
            "--pg-port=5432",
            "--pg-replica-port=5433",
            "--topo-global-server-addresses=prod-global-topo.db.svc:2379",
            "--topo-global-root=/multigres/global",
            "--cell=zone-a",
            "--service-id=$(POD_NAME)",
            "--hostname=$(POD_IP)",
            "--log-level=debug",
            "--lameduck-period=5s",
            "--onclose-timeout=1s",
            "--buffer-enabled=true",
            "--buffer-window=5s",
            "--buffer-size=500",
        ]
    );
    let env: Vec<_> = c.env.iter().flatten().map(|e| e.name.as_str()).collect();
    assert_eq!(env, ["POD_NAME", "POD_NAMESPACE", "POD_IP"]);
    let ports: Vec<_> = c
        .ports
        .iter()
        .flatten()
        .map(|p| (p.name.as_deref().unwrap(), p.container_port))
        .collect();
    assert_eq!(
        ports,
        [
            ("http", 15100),
            ("grpc", 15170),
            ("postgres", 5432),
            ("pg-replica", 5433)
        ]
    );
    let probe = |p: &Option<k8s_openapi::api::core::v1::Probe>| {
        let get = p.as_ref().unwrap().http_get.clone().unwrap();
        (get.path.unwrap(), get.port)
    };
    assert_eq!(
        probe(&c.startup_probe),
        ("/live".into(), IntOrString::Int(15100))
    );
    assert_eq!(
        probe(&c.liveness_probe),
        ("/live".into(), IntOrString::Int(15100))
    );
    assert_eq!(
        probe(&c.readiness_probe),
        ("/ready".into(), IntOrString::Int(15100))
    );
}

#[test]
fn unset_buffer_settings_emit_no_flag() {
    let mut cell = fixture();
    cell.spec.multigateway.buffer = None;
    cell.spec.log_levels = None;
    let args = multigateway_args(&cell.spec);
    assert!(args.iter().all(|a| !a.starts_with("--buffer")), "{args:?}");
    assert!(args.contains(&"--log-level=info".to_owned()));
}

#[test]
fn pods_pull_schedule_and_label_as_resolved() {
    let objects = objects(&fixture());
    let spec = objects.deployment.spec.as_ref().unwrap();
    assert_eq!(spec.replicas, Some(2));
    assert_eq!(
        objects.deployment.metadata.name.as_deref(),
        Some("prod-zone-a-multigateway")
    );
    let template = &spec.template;
    let labels = template.metadata.as_ref().unwrap().labels.as_ref().unwrap();
    assert_eq!(labels["team"], "db");
    assert_eq!(
        labels["app.kubernetes.io/component"], "multigateway",
        "user labels never override the operator's"
    );
    assert_eq!(labels["multigres.com/cell"], "zone-a");
    let annotations = template
        .metadata
        .as_ref()
        .unwrap()
        .annotations
        .as_ref()
        .unwrap();
    assert_eq!(annotations["example.com/team"], "db");
    let pod = template.spec.as_ref().unwrap();
    assert_eq!(pod.image_pull_secrets.as_ref().unwrap()[0].name, "regcred");
    assert_eq!(
        pod.node_selector.as_ref().unwrap()["topology.k8s.aws/zone-id"],
        "use1-az1"
    );
    assert_eq!(
        pod.tolerations.as_ref().unwrap()[0].key.as_deref(),
        Some("dedicated")
    );
    let c = &pod.containers[0];
    assert_eq!(
        c.image.as_deref(),
        Some("ghcr.io/multigres/multigres:sha-66d2310")
    );
    assert_eq!(c.image_pull_policy.as_deref(), Some("IfNotPresent"));
    let sc = c.security_context.as_ref().unwrap();
    assert_eq!(
        (
            sc.read_only_root_filesystem,
            sc.run_as_non_root,
            sc.allow_privilege_escalation
        ),
        (Some(true), Some(true), Some(false))
    );
    assert_eq!(
        pod.security_context
            .as_ref()
            .unwrap()
            .seccomp_profile
            .as_ref()
            .unwrap()
            .type_,
        "RuntimeDefault"
    );
    let selector = spec.selector.match_labels.as_ref().unwrap();
    assert!(
        !selector.contains_key("team"),
        "selectors carry only identity labels"
    );
}

#[test]
fn service_exposes_postgres_to_clients() {
    let objects = objects(&fixture());
    let svc = objects.service.spec.as_ref().unwrap();
    assert_eq!(
        objects.service.metadata.name.as_deref(),
        Some("prod-zone-a-multigateway")
    );
    let ports: Vec<_> = svc
        .ports
        .iter()
        .flatten()
        .map(|p| (p.name.as_deref().unwrap(), p.port))
        .collect();
    assert_eq!(
        ports,
        [
            ("postgres", 5432),
            ("pg-replica", 5433),
            ("http", 15100),
            ("grpc", 15170)
        ]
    );
    assert_eq!(
        svc.selector.as_ref(),
        objects
            .deployment
            .spec
            .as_ref()
            .unwrap()
            .selector
            .match_labels
            .as_ref()
    );
}

#[test]
fn a_region_cell_is_pinned_to_its_region() {
    let mut cell = fixture();
    cell.spec.zone_id = None;
    cell.spec.region = Some(multigres_api::v1alpha1::Region::new("us-east-1"));
    assert_eq!(
        cell_node_selector(&cell.spec),
        BTreeMap::from([(
            "topology.kubernetes.io/region".to_owned(),
            "us-east-1".to_owned()
        )])
    );
}

#[test]
fn a_zone_cell_is_pinned_by_the_well_known_zone_label() {
    let mut cell = fixture();
    cell.spec.zone_id = None;
    cell.spec.zone = Some(multigres_api::v1alpha1::Zone::new("europe-west1-b"));
    assert_eq!(
        cell_node_selector(&cell.spec),
        BTreeMap::from([(
            "topology.kubernetes.io/zone".to_owned(),
            "europe-west1-b".to_owned()
        )])
    );
}

#[test]
fn internal_tls_mounts_the_gateway_certificate_and_adds_its_flags() {
    let mut cell = fixture();
    cell.spec.internal_tls = Some(multigres_api::v1alpha1::InternalTlsConfig {
        enabled: Some(true),
        topology: None,
    });
    let objects = objects(&cell);
    let pod = objects.deployment.spec.unwrap().template.spec.unwrap();
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == crate::tls::TLS_VOLUME)
        .unwrap();
    let cluster = Owner::of(&cell).unwrap().cluster;
    let ns = cell.metadata.namespace.clone().unwrap();
    assert_eq!(
        volume.secret.as_ref().unwrap().secret_name,
        Some(format!("multigateway.{cluster}.{ns}.multigres.internal"))
    );
    let args = pod.containers[0].args.clone().unwrap();
    let tail = &args[args.len() - 9..];
    assert_eq!(
        tail,
        crate::tls::flags(
            crate::tls::Process::Multigateway,
            &cluster,
            &ns,
            crate::tls::Uses::of(cell.spec.internal_tls.as_ref())
        )
    );
}

#[test]
fn the_gateways_budget_never_lets_a_drain_take_the_only_gateway() {
    let mut cell = fixture();
    let max_unavailable = |cell: &Cell| {
        objects(cell)
            .pdb
            .map(|pdb| pdb.spec.unwrap().max_unavailable.unwrap())
    };
    cell.spec.multigateway.stateless.replicas = Some(1);
    assert_eq!(max_unavailable(&cell), Some(IntOrString::Int(0)));
    cell.spec.multigateway.stateless.replicas = Some(3);
    assert_eq!(max_unavailable(&cell), Some(IntOrString::Int(1)));
    let objects = objects(&cell);
    let pdb = objects.pdb.unwrap();
    assert_eq!(
        pdb.spec.unwrap().selector.unwrap().match_labels,
        objects.deployment.spec.unwrap().selector.match_labels,
        "the budget selects exactly the gateway's pods"
    );
    cell.spec.multigateway.stateless.replicas = Some(0);
    assert_eq!(max_unavailable(&cell), None, "nothing to protect");
}

#[test]
fn a_gateway_moved_off_a_cordoned_node_keeps_its_mark() {
    let mut deployment = objects(&fixture()).deployment;
    assert_eq!(stateless::last_moved_off(Some(&deployment)), None);
    stateless::moved_off(&mut deployment, "node-a/gw-1");
    assert_eq!(
        stateless::last_moved_off(Some(&deployment)),
        Some("node-a/gw-1")
    );
    let template = &deployment.spec.as_ref().unwrap().template;
    assert_eq!(
        template
            .metadata
            .as_ref()
            .unwrap()
            .annotations
            .as_ref()
            .unwrap()[multigres_api::labels::DRAINED_NODE],
        "node-a/gw-1",
        "the pod template changes, so the Deployment starts a pod elsewhere"
    );
}
