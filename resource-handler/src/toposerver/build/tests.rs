use k8s_openapi::api::core::v1::{Container, LocalObjectReference};
use multigres_api::v1alpha1::{ImagePullPolicy, TopoServer};

use super::*;

const FIXTURE: &str = include_str!("../../../fixtures/toposerver.yaml");

fn fixture() -> TopoServer {
    serde_yaml::from_str(FIXTURE).expect("fixture parses")
}

fn build_fixture(topo: &TopoServer, level: Level, pull: &PullSettings) -> TopoObjects {
    let owner = Owner::of(topo).unwrap();
    build(&TopoInput {
        owner: &owner,
        level,
        spec: &topo.spec,
        pull,
        tls: false,
    })
    .unwrap()
}

fn pull() -> PullSettings {
    PullSettings::new(
        Some(ImagePullPolicy::Always),
        &[LocalObjectReference {
            name: "regcred".into(),
        }],
    )
}

fn pod_of(objects: &TopoObjects) -> &PodSpec {
    objects
        .statefulset
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
}

fn etcd_container(objects: &TopoObjects) -> &Container {
    let pod = pod_of(objects);
    assert_eq!(pod.containers.len(), 1);
    &pod.containers[0]
}

#[test]
fn etcd_is_bootstrapped_statically_through_the_peer_service() {
    let objects = build_fixture(&fixture(), Level::Global, &pull());
    let c = etcd_container(&objects);
    assert_eq!(
        c.command.as_deref(),
        Some(&["/usr/local/bin/etcd".to_owned()][..])
    );
    let peer = "prod-global-topo-peer.db.svc";
    let expected = [
        "--name=$(POD_NAME)".to_owned(),
        "--data-dir=/var/lib/etcd/data".to_owned(),
        "--listen-client-urls=http://0.0.0.0:2379".to_owned(),
        format!("--advertise-client-urls=http://$(POD_NAME).{peer}:2379"),
        "--listen-peer-urls=http://0.0.0.0:2380".to_owned(),
        format!("--initial-advertise-peer-urls=http://$(POD_NAME).{peer}:2380"),
        "--listen-metrics-urls=http://0.0.0.0:2381".to_owned(),
        format!(
            "--initial-cluster=prod-global-topo-0=http://prod-global-topo-0.{peer}:2380,\
             prod-global-topo-1=http://prod-global-topo-1.{peer}:2380,\
             prod-global-topo-2=http://prod-global-topo-2.{peer}:2380"
        ),
        "--initial-cluster-state=new".to_owned(),
        "--initial-cluster-token=prod-global-topo.db".to_owned(),
        "--auto-compaction-retention=1".to_owned(),
    ];
    assert_eq!(c.args.as_deref(), Some(&expected[..]));
    let ports: Vec<_> = c
        .ports
        .iter()
        .flatten()
        .map(|p| (p.name.as_deref().unwrap(), p.container_port))
        .collect();
    assert_eq!(ports, [("client", 2379), ("peer", 2380), ("metrics", 2381)]);
    let path = |p: &Option<k8s_openapi::api::core::v1::Probe>| {
        let get = p.as_ref().unwrap().http_get.as_ref().unwrap();
        (get.path.clone().unwrap(), get.port.clone())
    };
    assert_eq!(
        path(&c.startup_probe),
        ("/readyz".into(), IntOrString::Int(2381))
    );
    assert_eq!(
        path(&c.liveness_probe),
        ("/livez".into(), IntOrString::Int(2381))
    );
    assert_eq!(
        path(&c.readiness_probe),
        ("/readyz".into(), IntOrString::Int(2381))
    );
}

#[test]
fn statefulset_names_services_and_pdb() {
    let objects = build_fixture(&fixture(), Level::Global, &pull());
    let sts = &objects.statefulset;
    assert_eq!(sts.metadata.name.as_deref(), Some("prod-global-topo"));
    assert_eq!(sts.metadata.namespace.as_deref(), Some("db"));
    let owner = &sts.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.controller),
        ("TopoServer", Some(true))
    );
    let spec = sts.spec.as_ref().unwrap();
    assert_eq!(spec.replicas, Some(3));
    assert_eq!(spec.service_name.as_deref(), Some("prod-global-topo-peer"));
    assert_eq!(spec.pod_management_policy.as_deref(), Some("Parallel"));
    let selector = spec.selector.match_labels.as_ref().unwrap();
    assert_eq!(selector["app.kubernetes.io/component"], "global-topo");
    assert_eq!(selector["multigres.com/cluster"], "prod");
    assert!(!selector.contains_key("app.kubernetes.io/managed-by"));

    let peer = objects.peer_service.spec.as_ref().unwrap();
    assert_eq!(
        objects.peer_service.metadata.name.as_deref(),
        Some("prod-global-topo-peer")
    );
    assert_eq!(peer.cluster_ip.as_deref(), Some("None"));
    assert_eq!(peer.publish_not_ready_addresses, Some(true));
    let client = objects.client_service.spec.as_ref().unwrap();
    assert_eq!(
        objects.client_service.metadata.name.as_deref(),
        Some("prod-global-topo"),
        "the name names::topo_client_address dials"
    );
    let client_ports: Vec<_> = client.ports.iter().flatten().map(|p| p.port).collect();
    assert_eq!(client_ports, [2379]);
    assert_eq!(client.selector.as_ref(), Some(selector));

    let pdb = objects.pdb.spec.as_ref().unwrap();
    assert_eq!(pdb.max_unavailable, Some(IntOrString::Int(1)));
    assert_eq!(
        pdb.selector.as_ref().unwrap().match_labels.as_ref(),
        Some(selector)
    );
}

#[test]
fn volumes_follow_storage_and_pvc_policy() {
    let objects = build_fixture(&fixture(), Level::Global, &pull());
    let spec = objects.statefulset.spec.as_ref().unwrap();
    let retention = spec
        .persistent_volume_claim_retention_policy
        .as_ref()
        .unwrap();
    assert_eq!(retention.when_deleted.as_deref(), Some("Delete"));
    assert_eq!(retention.when_scaled.as_deref(), Some("Retain"));
    let claim = &spec.volume_claim_templates.as_ref().unwrap()[0];
    assert_eq!(claim.metadata.name.as_deref(), Some("data"));
    assert_eq!(
        claim.metadata.labels.as_ref().unwrap()["app.kubernetes.io/managed-by"],
        "multigres-operator",
        "PVCs carry the labels the handler watches and lists them by"
    );
    let claim_spec = claim.spec.as_ref().unwrap();
    assert_eq!(claim_spec.storage_class_name.as_deref(), Some("fast"));
    assert_eq!(
        claim_spec
            .resources
            .as_ref()
            .unwrap()
            .requests
            .as_ref()
            .unwrap()["storage"],
        Quantity("2Gi".into())
    );
    assert_eq!(objects.storage_size, "2Gi");

    let mut unset = fixture();
    unset.spec.pvc_deletion_policy = None;
    unset.spec.etcd.as_mut().unwrap().pvc_deletion_policy = None;
    let objects = build_fixture(&unset, Level::Global, &pull());
    let retention = objects
        .statefulset
        .spec
        .unwrap()
        .persistent_volume_claim_retention_policy
        .unwrap();
    assert_eq!(
        (
            retention.when_deleted.as_deref(),
            retention.when_scaled.as_deref()
        ),
        (Some("Retain"), Some("Retain")),
        "data is kept unless asked otherwise"
    );
}

#[test]
fn pods_are_hardened_and_pull_with_the_cluster_settings() {
    let objects = build_fixture(&fixture(), Level::Global, &pull());
    let pod = objects
        .statefulset
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap();
    assert_eq!(pod.image_pull_secrets.as_ref().unwrap()[0].name, "regcred");
    assert_eq!(pod.automount_service_account_token, Some(false));
    let psc = pod.security_context.as_ref().unwrap();
    assert_eq!(psc.run_as_non_root, Some(true));
    assert_eq!(psc.fs_group, Some(65532));
    assert_eq!(pod.node_selector.as_ref().unwrap()["disktype"], "ssd");
    assert_eq!(
        pod.tolerations.as_ref().unwrap()[0].value.as_deref(),
        Some("etcd")
    );
    let c = &pod.containers[0];
    assert_eq!(
        c.image.as_deref(),
        Some("gcr.io/etcd-development/etcd:v3.6.7")
    );
    assert_eq!(c.image_pull_policy.as_deref(), Some("Always"));
    let sc = c.security_context.as_ref().unwrap();
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    let mounts: Vec<_> = c
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| (m.name.as_str(), m.mount_path.as_str()))
        .collect();
    assert_eq!(mounts, [("data", "/var/lib/etcd"), ("tmp", "/tmp")]);
    assert_eq!(
        c.resources.as_ref().unwrap().limits.as_ref().unwrap()["memory"],
        Quantity("512Mi".into())
    );
}

#[test]
fn a_cell_local_topo_server_selects_only_its_own_pods() {
    let global = build_fixture(&fixture(), Level::Global, &pull());
    let local = build_fixture(&fixture(), Level::Cell("zone-a".into()), &pull());
    let selector = |o: &TopoObjects| {
        o.statefulset
            .spec
            .as_ref()
            .unwrap()
            .selector
            .match_labels
            .clone()
            .unwrap()
    };
    let (g, l) = (selector(&global), selector(&local));
    assert_eq!(l["app.kubernetes.io/component"], "local-topo");
    assert_eq!(l["multigres.com/cell"], "zone-a");
    assert!(
        !g.iter().all(|(k, v)| l.get(k) == Some(v)),
        "the global selector must not match local-topo pods"
    );
}

#[test]
fn even_or_missing_members_are_refused() {
    let mut even = fixture();
    even.spec.etcd.as_mut().unwrap().replicas = Some(4);
    let owner = Owner::of(&even).unwrap();
    let input = TopoInput {
        owner: &owner,
        level: Level::Global,
        spec: &even.spec,
        pull: &pull(),
        tls: false,
    };
    assert_eq!(
        build(&input).map(|_| ()),
        Err(BuildError::MemberCount { replicas: 4 })
    );
    let mut negative = even.clone();
    negative.spec.etcd.as_mut().unwrap().replicas = Some(-1);
    assert_eq!(
        build(&TopoInput {
            spec: &negative.spec,
            ..input.clone()
        })
        .map(|_| ()),
        Err(BuildError::MemberCount { replicas: -1 })
    );
    let mut none = even.clone();
    none.spec.etcd = None;
    let input = TopoInput {
        spec: &none.spec,
        ..input
    };
    assert_eq!(build(&input).map(|_| ()), Err(BuildError::NoEtcd));
}

#[test]
fn build_errors_name_the_field_and_what_it_allows() {
    assert_eq!(
        BuildError::NoEtcd.to_string(),
        "spec.etcd is required: the operator only runs etcd"
    );
    assert_eq!(
        BuildError::MemberCount { replicas: 4 }.to_string(),
        "spec.etcd.replicas is 4: etcd needs an odd number of members (1, 3, 5)"
    );
}

#[test]
fn topology_tls_serves_clients_and_peers_with_the_etcd_certificate_and_requires_one() {
    let topo = fixture();
    let owner = Owner::of(&topo).unwrap();
    let input = TopoInput {
        owner: &owner,
        level: Level::Global,
        spec: &topo.spec,
        pull: &pull(),
        tls: true,
    };
    let objects = build(&input).unwrap();
    let c = etcd_container(&objects);
    let args = c.args.clone().unwrap();
    let peer = "prod-global-topo-peer.db.svc";
    for url in [
        "--listen-client-urls=https://0.0.0.0:2379".to_owned(),
        format!("--advertise-client-urls=https://$(POD_NAME).{peer}:2379"),
        "--listen-peer-urls=https://0.0.0.0:2380".to_owned(),
        format!("--initial-advertise-peer-urls=https://$(POD_NAME).{peer}:2380"),
        // Health and metrics stay plaintext: the probes read them without a certificate.
        "--listen-metrics-urls=http://0.0.0.0:2381".to_owned(),
    ] {
        assert!(args.contains(&url), "{url} in {args:?}");
    }
    let initial = args
        .iter()
        .find(|a| a.starts_with("--initial-cluster="))
        .unwrap();
    assert_eq!(initial.matches("=https://").count(), 3, "{initial}");
    assert!(!initial.contains("http://"), "{initial}");
    assert_eq!(
        args[args.len() - 10..],
        [
            "--cert-file=/etc/etcd/tls/tls.crt",
            "--key-file=/etc/etcd/tls/tls.key",
            "--trusted-ca-file=/etc/etcd/tls/ca.crt",
            "--client-cert-auth=true",
            "--peer-cert-file=/etc/etcd/tls/tls.crt",
            "--peer-key-file=/etc/etcd/tls/tls.key",
            "--peer-trusted-ca-file=/etc/etcd/tls/ca.crt",
            "--peer-client-cert-auth=true",
            "--peer-skip-client-san-verification=true",
            "--tls-min-version=TLS1.2",
        ]
    );
    let mounts = c.volume_mounts.clone().unwrap();
    let tls = mounts.iter().find(|m| m.name == "etcd-tls").unwrap();
    assert_eq!(
        (tls.mount_path.as_str(), tls.read_only),
        ("/etc/etcd/tls", Some(true))
    );
    let volume = pod_of(&objects)
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "etcd-tls")
        .unwrap();
    assert_eq!(
        volume.secret.as_ref().unwrap().secret_name.as_deref(),
        Some("etcd.prod.db.multigres.internal")
    );
    let plain = build_fixture(&topo, Level::Global, &pull());
    let plain_args = etcd_container(&plain).args.clone().unwrap();
    assert!(
        plain_args
            .iter()
            .all(|a| !a.contains("https://") && !a.contains("tls"))
    );
}
