use k8s_openapi::api::apps::v1::DeploymentSpec;
use k8s_openapi::api::core::v1::{Container, PodTemplateSpec};
use multigres_api::resolver::{Templates, resolve};
use multigres_api::v1alpha1::{MultigresCluster, PgBackRestTlsConfig, Shard};

use super::*;

fn cluster() -> MultigresCluster {
    serde_yaml::from_str(include_str!("../../fixtures/cluster-external-topo.yaml")).unwrap()
}

fn shard() -> Shard {
    serde_yaml::from_str(include_str!("../../fixtures/shard.yaml")).unwrap()
}

fn now() -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap()
}

#[test]
fn identities_follow_the_upstream_scheme_and_fit_a_secret_name() {
    assert_eq!(
        identity(Process::Multipooler, "prod", "db"),
        "multipooler.prod.db.multigres.internal"
    );
    assert_eq!(internal_ca_secret("prod"), "prod-internal-tls-ca");
    assert!(check_internal_names(&"c".repeat(63), &"n".repeat(63)).is_ok());
    let error = check_internal_names(&"c".repeat(200), &"n".repeat(63)).unwrap_err();
    assert!(error.contains("spec.internalTLS.enabled"), "{error}");
    assert!(error.contains("shorten the cluster name"), "{error}");
}

#[test]
fn process_certificates_name_their_services_and_identity() {
    let c = cluster();
    let resolved = resolve(&c, &Templates::default()).unwrap();
    let specs = internal_leaf_specs("prod", "db", &resolved);
    let find = |p: Process| specs.iter().find(|(q, _)| *q == p).unwrap().1.clone();
    assert_eq!(specs.len(), 4);

    let admin = find(Process::Multiadmin);
    assert_eq!(admin.common_name, "multiadmin.prod.db.multigres.internal");
    assert!(
        admin
            .dns_names
            .contains(&"prod-multiadmin.db.svc".to_owned())
    );
    assert!(admin.dns_names.contains(&admin.common_name));

    let gateway = find(Process::Multigateway);
    for name in [
        "multigateway.prod.db.multigres.internal",
        "multipooler.prod.db.multigres.internal",
        "prod-zone-a-multigateway.db.svc",
        "prod-zone-a-multigateway.db.svc.cluster.local",
    ] {
        assert!(gateway.dns_names.contains(&name.to_owned()), "{name}");
    }

    // The fixture's default database gets one shard with one pool in zone-a.
    let shard_cr = "prod-postgres-default-0-inf";
    let orch = find(Process::Multiorch);
    let orch_service = format!("{}.db.svc", crate::names::multiorch(shard_cr, "zone-a"));
    assert!(
        orch.dns_names.contains(&orch_service),
        "{:?}",
        orch.dns_names
    );

    let pooler = find(Process::Multipooler);
    let pool_services: Vec<_> = resolved.table_groups[0].shards[0]
        .pools
        .keys()
        .map(|pool| crate::names::pool(shard_cr, pool.as_str(), "zone-a"))
        .collect();
    assert!(!pool_services.is_empty());
    for service in pool_services {
        let wildcard = format!("*.{service}.db.svc");
        assert!(pooler.dns_names.contains(&wildcard), "{wildcard}");
    }
}

const GRPC: Uses = Uses {
    grpc: true,
    topology: false,
};

#[test]
fn each_process_gets_its_exact_tls_flags() {
    assert_eq!(
        flags(Process::Multipooler, "prod", "db", GRPC),
        [
            "--grpc-cert=/etc/multigres/tls/tls.crt",
            "--grpc-key=/etc/multigres/tls/tls.key",
            "--grpc-ca=/etc/multigres/tls/ca.crt",
            "--grpc-server-ca=/etc/multigres/tls/ca.crt",
        ]
    );
    for process in [
        Process::Multiadmin,
        Process::Multigateway,
        Process::Multiorch,
    ] {
        let args = flags(process, "prod", "db", GRPC);
        assert_eq!(
            args[4..],
            [
                "--multipooler-grpc-cert=/etc/multigres/tls/tls.crt",
                "--multipooler-grpc-key=/etc/multigres/tls/tls.key",
                "--multipooler-grpc-ca=/etc/multigres/tls/ca.crt",
                "--multipooler-grpc-server-name=multipooler.prod.db.multigres.internal",
                "--multipooler-grpc-require-tls=true",
            ],
            "{process:?}"
        );
    }
}

#[test]
fn topology_tls_adds_the_etcd_client_flags_to_every_process_alone_or_with_grpc() {
    let etcd = [
        "--topo-etcd-tls-cert=/etc/multigres/tls/tls.crt",
        "--topo-etcd-tls-key=/etc/multigres/tls/tls.key",
        "--topo-etcd-tls-ca=/etc/multigres/tls/ca.crt",
    ];
    let topology = Uses {
        grpc: false,
        topology: true,
    };
    let both = Uses {
        grpc: true,
        topology: true,
    };
    for process in Process::ALL {
        assert_eq!(flags(process, "prod", "db", topology), etcd, "{process:?}");
        let all = flags(process, "prod", "db", both);
        assert_eq!(all[all.len() - 3..], etcd, "{process:?}");
        assert_eq!(all.len(), flags(process, "prod", "db", GRPC).len() + 3);
        assert!(flags(process, "prod", "db", Uses::default()).is_empty());
    }
    let mut untouched = deployment_of("multiorch");
    let pod = pod_mut(&mut untouched);
    mount_internal(pod, Process::Multiorch, "prod", "db", Uses::default());
    assert_eq!(
        untouched,
        deployment_of("multiorch"),
        "nothing on, nothing mounted"
    );
}

/// The pod template of `deployment`, to mount into.
fn pod_mut(deployment: &mut Deployment) -> &mut PodSpec {
    deployment
        .spec
        .as_mut()
        .unwrap()
        .template
        .spec
        .as_mut()
        .unwrap()
}

/// A Deployment running `process` and a sidecar, each with one argument.
fn deployment_of(process: &str) -> Deployment {
    let container = |name: &str| Container {
        name: name.to_owned(),
        args: Some(vec!["--cell=a".to_owned()]),
        ..Default::default()
    };
    Deployment {
        spec: Some(DeploymentSpec {
            template: PodTemplateSpec {
                spec: Some(PodSpec {
                    containers: vec![container(process), container("sidecar")],
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[test]
fn the_certificate_is_mounted_only_into_its_process() {
    let mut deployment = deployment_of("multiorch");
    let owner = owner();
    let topo = GlobalTopoServerRef::default();
    mount_process_tls_deployment(&mut deployment, Process::Multiorch, &owner, None, &topo);
    assert_eq!(
        deployment,
        deployment_of("multiorch"),
        "internal TLS off: nothing"
    );
    let pod = pod_mut(&mut deployment);
    mount_internal(pod, Process::Multiorch, "prod", "db", GRPC);
    let pod = deployment.spec.unwrap().template.spec.unwrap();
    let volume = &pod.volumes.unwrap()[0];
    assert_eq!(volume.name, TLS_VOLUME);
    assert_eq!(
        volume.secret.as_ref().unwrap().secret_name.as_deref(),
        Some("multiorch.prod.db.multigres.internal")
    );
    let orch = &pod.containers[0];
    let mounts = orch.volume_mounts.as_ref().unwrap();
    assert_eq!(
        (mounts[0].mount_path.as_str(), mounts[0].read_only),
        (TLS_DIR, Some(true))
    );
    let args = orch.args.as_ref().unwrap();
    assert_eq!(args[0], "--cell=a");
    assert_eq!(args.len(), 10);
    let sidecar = &pod.containers[1];
    assert!(sidecar.volume_mounts.is_none());
    assert_eq!(sidecar.args.as_ref().unwrap().len(), 1);
}

#[test]
fn pgbackrest_certificates_come_from_the_users_secret_or_the_generated_pair() {
    let mut backup = shard().spec.backup.unwrap();
    let user = pgbackrest_volume("s", &backup);
    let sources = user.projected.unwrap().sources.unwrap();
    assert_eq!(sources.len(), 1);
    let secret = sources[0].secret.as_ref().unwrap();
    assert_eq!(secret.name, "pgbackrest-tls");
    let paths: Vec<_> = secret
        .items
        .iter()
        .flatten()
        .map(|i| (i.key.as_str(), i.path.as_str()))
        .collect();
    assert_eq!(
        paths,
        [
            ("ca.crt", "ca.crt"),
            ("tls.crt", "pgbackrest.crt"),
            ("tls.key", "pgbackrest.key")
        ]
    );

    for tls in [
        None,
        Some(PgBackRestTlsConfig {
            secret_name: Some(String::new()),
        }),
    ] {
        backup.pgbackrest_tls = tls;
        let generated = pgbackrest_volume("s", &backup);
        let sources = generated.projected.unwrap().sources.unwrap();
        let names: Vec<_> = sources
            .iter()
            .map(|s| s.secret.as_ref().unwrap().name.as_str())
            .collect();
        assert_eq!(names, ["s-pgbackrest-ca", "s-pgbackrest-tls"]);
    }
}

#[test]
fn the_pgbackrest_certificate_names_every_pool_pod() {
    let s = shard();
    let spec = pgbackrest_leaf_spec("prod-postgres-default-0-inf", "db", &s.spec);
    assert_eq!(spec.common_name, "pgbackrest");
    let zone_a = crate::names::pool("prod-postgres-default-0-inf", "main", "zone-a");
    let zone_b = crate::names::pool("prod-postgres-default-0-inf", "main", "zone-b");
    for name in [
        "pgbackrest.db.svc".to_owned(),
        "pgbackrest.db.svc.cluster.local".to_owned(),
        format!("*.{zone_a}.db.svc"),
        format!("*.{zone_b}.db.svc.cluster.local"),
    ] {
        assert!(spec.dns_names.contains(&name), "{name}");
    }
    assert_eq!(spec.dns_names.len(), 6);
}

fn owner() -> Owner {
    Owner::of(&shard()).unwrap()
}

fn leaves() -> Vec<SecretFor> {
    vec![SecretFor {
        name: "s-pgbackrest-tls".to_owned(),
        spec: pgbackrest_leaf_spec("s", "db", &shard().spec),
    }]
}

#[test]
fn a_second_plan_keeps_every_stored_secret_byte_for_byte() {
    let labels = BTreeMap::from([("k".to_owned(), "v".to_owned())]);
    let first = plan(
        &owner(),
        &labels,
        "s-pgbackrest-ca",
        "ca",
        &leaves(),
        |_| None,
        now(),
    )
    .unwrap();
    assert_eq!(first.secrets.len(), 2);
    assert_eq!(first.changes.len(), 2, "{:?}", first.changes);
    let ca = &first.secrets[0];
    assert_eq!(ca.type_.as_deref(), Some("Opaque"));
    let keys = |s: &Secret| s.data.as_ref().unwrap().keys().cloned().collect::<Vec<_>>();
    assert_eq!(keys(ca), ["ca.crt", "ca.key"]);
    let leaf = &first.secrets[1];
    assert_eq!(leaf.type_.as_deref(), Some("kubernetes.io/tls"));
    assert_eq!(keys(leaf), ["ca.crt", "tls.crt", "tls.key"]);
    assert_eq!(
        leaf.metadata.owner_references.as_ref().unwrap()[0].kind,
        "Shard"
    );
    assert_eq!(leaf.metadata.labels.as_ref(), Some(&labels));

    let stored = first.secrets.clone();
    let lookup = |name: &str| stored.iter().find(|s| s.name_any() == name).cloned();
    let later = now() + time::Duration::days(100);
    let second = plan(
        &owner(),
        &labels,
        "s-pgbackrest-ca",
        "ca",
        &leaves(),
        lookup,
        later,
    )
    .unwrap();
    assert!(second.changes.is_empty(), "{:?}", second.changes);
    assert_eq!(second.secrets, first.secrets);
    // What is applied is stamped from these objects, so equal objects mean no write.
    let stamped = |s: &Secret| {
        let mut s = s.clone();
        sync::stamp(&mut s);
        s
    };
    assert!(sync::up_to_date(
        &stamped(&second.secrets[1]),
        &stamped(&first.secrets[1])
    ));
}

#[test]
fn a_leaf_of_a_replaced_ca_is_reissued() {
    let labels = BTreeMap::new();
    let first = plan(&owner(), &labels, "ca", "ca", &leaves(), |_| None, now()).unwrap();
    // The CA Secret was lost: a new CA, so the stored leaf no longer verifies.
    let leaf = first.secrets[1].clone();
    let lookup = move |name: &str| (name == "s-pgbackrest-tls").then(|| leaf.clone());
    let second = plan(&owner(), &labels, "ca", "ca", &leaves(), lookup, now()).unwrap();
    assert_eq!(second.changes.len(), 2);
    assert!(
        second.changes[1].contains("does not verify"),
        "{:?}",
        second.changes
    );
    assert_ne!(second.secrets[1], first.secrets[1]);
}

#[test]
fn a_users_secret_must_hold_all_three_keys() {
    let missing = check_user_secret("mine", None);
    assert_eq!((missing.status, missing.reason), (FALSE, "SecretNotFound"));
    assert!(missing.message.contains("Secret mine does not exist"));
    let secret = |keys: &[&str]| Secret {
        data: Some(
            keys.iter()
                .map(|k| ((*k).to_owned(), ByteString(b"x".to_vec())))
                .collect(),
        ),
        ..Default::default()
    };
    let partial = check_user_secret("mine", Some(&secret(&["ca.crt", "tls.crt"])));
    assert_eq!(
        (partial.status, partial.reason),
        (FALSE, "SecretIncomplete")
    );
    assert!(
        partial.message.contains("Secret mine lacks key tls.key"),
        "{}",
        partial.message
    );
    let full = check_user_secret("mine", Some(&secret(&["ca.crt", "tls.crt", "tls.key"])));
    assert_eq!((full.status, full.reason), (TRUE, "SecretProvided"));
}

#[test]
fn a_problem_is_warned_about_once() {
    let cond = check_user_secret("mine", None);
    let stored = Condition {
        type_: cond.type_.to_owned(),
        status: cond.status.to_owned(),
        reason: cond.reason.to_owned(),
        message: cond.message.clone(),
        last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ),
        observed_generation: None,
    };
    assert!(is_new(None, &cond));
    assert!(!is_new(Some(std::slice::from_ref(&stored)), &cond));
    let other = check_user_secret("other", None);
    assert!(is_new(Some(&[stored]), &other));
}

#[test]
fn the_gateway_certificate_names_every_gateway_service_and_the_common_name() {
    let resolved = resolve(&cluster(), &Templates::default()).unwrap();
    let plain = gateway_leaf_spec("prod", "db", &resolved, None);
    assert_eq!(plain.common_name, "prod-multigateway.db.svc");
    for name in [
        "prod-multigateway",
        "prod-multigateway.db.svc",
        "prod-multigateway.db.svc.cluster.local",
        "prod-multigateway-replica.db.svc",
        "prod-zone-a-multigateway.db",
        "prod-zone-a-multigateway.db.svc.cluster.local",
    ] {
        assert!(
            plain.dns_names.contains(&name.to_owned()),
            "{name}: {plain:?}"
        );
    }
    let named = gateway_leaf_spec("prod", "db", &resolved, Some("db.example.com"));
    assert_eq!(named.common_name, "db.example.com");
    assert!(named.dns_names.contains(&"db.example.com".to_owned()));
    assert_eq!(named.dns_names.len(), plain.dns_names.len() + 1);
    assert_eq!(gateway_leaf_spec("prod", "db", &resolved, Some("")), plain);
}

#[test]
fn the_gateway_serves_its_certificate_and_rolls_when_it_changes() {
    let mut offered = deployment_of("multigateway");
    mount_gateway(&mut offered, "prod-gateway-tls", false, "0123");
    let template = &offered.spec.as_ref().unwrap().template;
    let annotations = template.metadata.as_ref().unwrap().annotations.as_ref();
    assert_eq!(
        annotations
            .unwrap()
            .get(GATEWAY_CERT_ANNOTATION)
            .map(String::as_str),
        Some("0123")
    );
    let pod = template.spec.as_ref().unwrap();
    let volume = &pod.volumes.as_ref().unwrap()[0];
    let secret = volume.secret.as_ref().unwrap();
    assert_eq!(secret.secret_name.as_deref(), Some("prod-gateway-tls"));
    assert_eq!(secret.default_mode, Some(0o440));
    let gateway = &pod.containers[0];
    assert_eq!(
        gateway.args.as_deref().unwrap(),
        [
            "--cell=a",
            "--pg-tls-cert-file=/etc/multigres/gateway-tls/tls.crt",
            "--pg-tls-key-file=/etc/multigres/gateway-tls/tls.key",
        ]
    );
    assert_eq!(
        gateway.volume_mounts.as_ref().unwrap()[0].mount_path,
        GATEWAY_TLS_DIR
    );
    assert!(pod.containers[1].volume_mounts.is_none());

    let mut required = deployment_of("multigateway");
    mount_gateway(&mut required, "prod-gateway-tls", true, "0123");
    let args = required.spec.unwrap().template.spec.unwrap().containers[0]
        .args
        .clone()
        .unwrap();
    assert_eq!(
        args.last().map(String::as_str),
        Some("--pg-require-ssl=true")
    );

    let secret = |cert: &str| Secret {
        data: Some(BTreeMap::from([(
            TLS_CRT.to_owned(),
            ByteString(cert.as_bytes().to_vec()),
        )])),
        ..Default::default()
    };
    let digest = certificate_digest(&secret("a")).unwrap();
    assert_eq!(digest.len(), 16);
    assert_eq!(certificate_digest(&secret("a")), Some(digest.clone()));
    assert_ne!(certificate_digest(&secret("b")), Some(digest));
    assert_eq!(certificate_digest(&Secret::default()), None);
}

#[test]
fn the_etcd_certificate_names_every_managed_topo_server_and_its_members() {
    let mut c = cluster();
    c.spec.global_topo_server = None;
    let own: multigres_api::v1alpha1::CellConfig = serde_yaml::from_str(
        "{name: zone-b, zoneId: use1-az2, spec: {localTopoServer: {etcd: {}}}}",
    )
    .unwrap();
    c.spec.cells.push(own);
    let resolved = resolve(&c, &Templates::default()).unwrap();
    let etcd = etcd_leaf_spec("prod", "db", &resolved);
    assert_eq!(etcd.common_name, "etcd.prod.db.multigres.internal");
    for name in [
        "etcd.prod.db.multigres.internal",
        "prod-global-topo.db.svc",
        "prod-global-topo.db.svc.cluster.local",
        "*.prod-global-topo-peer.db.svc",
        "prod-zone-b-local-topo.db.svc",
        "*.prod-zone-b-local-topo-peer.db.svc",
    ] {
        assert!(
            etcd.dns_names.contains(&name.to_owned()),
            "{name}: {:?}",
            etcd.dns_names
        );
    }
    assert!(
        !etcd.dns_names.iter().any(|n| n.contains("zone-a")),
        "a cell on the global topology has no etcd of its own: {:?}",
        etcd.dns_names
    );
    let external = resolve(&cluster(), &Templates::default()).unwrap();
    assert_eq!(
        etcd_leaf_spec("prod", "db", &external).dns_names,
        ["etcd.prod.db.multigres.internal".to_owned()],
        "an external global topology: no managed etcd to name"
    );
}

#[test]
fn an_external_topology_client_certificate_is_mounted_with_the_etcd_flags() {
    let mut deployment = deployment_of("multigateway");
    let owner = owner();
    let topo = GlobalTopoServerRef {
        ca_secret: Some("etcd-ca".into()),
        client_cert_secret: Some("etcd-client".into()),
        ..Default::default()
    };
    mount_process_tls_deployment(&mut deployment, Process::Multigateway, &owner, None, &topo);
    let pod = deployment.spec.unwrap().template.spec.unwrap();
    let volume = &pod.volumes.unwrap()[0];
    assert_eq!(volume.name, "topo-tls");
    let sources = volume.projected.as_ref().unwrap().sources.clone().unwrap();
    let named: Vec<(String, Vec<String>)> = sources
        .iter()
        .map(|p| {
            let secret = p.secret.as_ref().unwrap();
            let keys = secret
                .items
                .iter()
                .flatten()
                .map(|k| k.key.clone())
                .collect();
            (secret.name.clone(), keys)
        })
        .collect();
    assert_eq!(
        named,
        [
            (
                "etcd-client".to_owned(),
                vec!["tls.crt".to_owned(), "tls.key".to_owned()]
            ),
            ("etcd-ca".to_owned(), vec!["ca.crt".to_owned()]),
        ]
    );
    let gateway = &pod.containers[0];
    assert_eq!(
        gateway.args.as_ref().unwrap()[1..],
        [
            "--topo-etcd-tls-cert=/etc/multigres/topo-tls/tls.crt",
            "--topo-etcd-tls-key=/etc/multigres/topo-tls/tls.key",
            "--topo-etcd-tls-ca=/etc/multigres/topo-tls/ca.crt",
        ]
    );
    assert_eq!(
        gateway.volume_mounts.as_ref().unwrap()[0].mount_path,
        "/etc/multigres/topo-tls"
    );
    assert!(
        pod.containers[1].args.as_ref().unwrap().len() == 1,
        "the sidecar is left alone"
    );
}
