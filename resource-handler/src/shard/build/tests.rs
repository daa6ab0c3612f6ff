use k8s_openapi::api::core::v1::Probe;
use multigres_api::names::MAX_STATEFULSET;
use multigres_api::v1alpha1::{GoDuration, ImageRef, Shard};

use super::*;

const FIXTURE: &str = include_str!("../../../fixtures/shard.yaml");

fn fixture() -> Shard {
    serde_yaml::from_str(FIXTURE).expect("fixture parses")
}

fn objects(shard: &Shard) -> ShardObjects {
    let owner = Owner::of(shard).unwrap();
    build(&owner, &shard.spec, BackupDeletion::of(shard, &owner)).unwrap()
}

fn pool<'a>(o: &'a ShardObjects, cell: &str) -> &'a PoolObjects {
    o.pools.iter().find(|p| p.cell == cell).unwrap()
}

fn pod(p: &PoolObjects) -> &PodSpec {
    p.statefulset
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
}

fn probe(p: &Option<Probe>) -> (String, IntOrString) {
    let get = p.as_ref().unwrap().http_get.clone().unwrap();
    (get.path.unwrap(), get.port)
}

#[test]
fn one_statefulset_per_pool_per_cell_and_one_multiorch_per_cell() {
    let o = objects(&fixture());
    let sets: Vec<_> = o
        .pools
        .iter()
        .map(|p| p.statefulset.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(
        sets,
        [
            "prod-postgres-default-0-inf-pool-main-zone-a",
            "prod-postgres-default-0-inf-pool-main-zone-b"
        ]
    );
    assert!(sets.iter().all(|s| s.len() <= MAX_STATEFULSET));
    let orchs: Vec<_> = o
        .multiorch
        .iter()
        .map(|m| m.deployment.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(
        orchs,
        [
            "prod-postgres-default-0-inf-multiorch-zone-a",
            "prod-postgres-default-0-inf-multiorch-zone-b"
        ]
    );
    let spec = pool(&o, "zone-a").statefulset.spec.as_ref().unwrap();
    assert_eq!(spec.replicas, Some(2));
    assert_eq!(
        spec.update_strategy.as_ref().unwrap().type_.as_deref(),
        Some("OnDelete"),
        "the handler decides the restart order"
    );
    assert_eq!(
        spec.service_name.as_deref(),
        Some("prod-postgres-default-0-inf-pool-main-zone-a")
    );
    let selector = spec.selector.match_labels.as_ref().unwrap();
    assert_eq!(selector["multigres.com/pool"], "main");
    assert_eq!(selector["multigres.com/cell"], "zone-a");
    assert_eq!(selector["app.kubernetes.io/component"], "shard-pool");
}

#[test]
fn pgctld_is_a_native_sidecar_with_the_exact_flags() {
    let o = objects(&fixture());
    let pod = pod(pool(&o, "zone-a"));
    let init = pod.init_containers.as_ref().unwrap();
    assert_eq!(init.len(), 1);
    let pg = &init[0];
    assert_eq!(pg.name, "postgres");
    assert_eq!(pg.restart_policy.as_deref(), Some("Always"));
    assert_eq!(
        pg.image.as_deref(),
        Some("ghcr.io/multigres/pgctld:sha-66d2310")
    );
    assert_eq!(
        pg.command.as_deref(),
        Some(&["/usr/local/bin/pgctld".to_owned()][..])
    );
    assert_eq!(
        pg.args.as_deref().unwrap(),
        [
            "server",
            "--pooler-dir=/var/lib/pooler",
            "--grpc-port=15470",
            "--grpc-bind-address=127.0.0.1",
            "--http-port=15400",
            "--pg-port=5432",
            "--pg-listen-addresses=*",
            "--grpc-socket-file=/var/lib/pooler/pgctld.sock",
            "--log-level=warn",
            "--pgbackrest-cert-dir=/certs/pgbackrest",
            "--pgbackrest-port=8432",
        ]
    );
    let env: BTreeMap<_, _> = pg
        .env
        .iter()
        .flatten()
        .filter_map(|e| Some((e.name.as_str(), e.value.as_deref()?)))
        .collect();
    assert_eq!(env["PGDATA"], "/var/lib/pooler/pg_data");
    assert_eq!(env["POSTGRES_USER"], "postgres");
    assert_eq!(
        env["POSTGRES_PASSWORD_FILE"],
        "/etc/postgres-password/password"
    );
    assert_eq!(env["POSTGRES_INITDB_ARGS"], "--data-checksums");
    assert_eq!(
        probe(&pg.startup_probe),
        ("/live".into(), IntOrString::Int(15400))
    );
    assert_eq!(
        probe(&pg.readiness_probe),
        ("/ready".into(), IntOrString::Int(15400))
    );
    let sc = pg.security_context.as_ref().unwrap();
    assert_eq!(
        (sc.run_as_user, sc.run_as_non_root),
        (Some(999), Some(true))
    );
}

#[test]
fn multipooler_has_the_exact_flags_and_a_stable_service_id() {
    let o = objects(&fixture());
    let pod = pod(pool(&o, "zone-b"));
    let mp = &pod.containers[0];
    assert_eq!(mp.name, "multipooler");
    assert_eq!(
        mp.command.as_deref(),
        Some(&["/multigres/bin/multipooler".to_owned()][..])
    );
    let svc = "prod-postgres-default-0-inf-pool-main-zone-b";
    let expected = [
        "--http-port=15200".to_owned(),
        "--grpc-port=15270".to_owned(),
        "--pooler-dir=/var/lib/pooler".to_owned(),
        "--socket-file=/var/lib/pooler/pg_sockets/.s.PGSQL.5432".to_owned(),
        "--topo-global-server-addresses=prod-global-topo.db.svc:2379".to_owned(),
        "--topo-global-root=/multigres/global".to_owned(),
        "--cell=zone-b".to_owned(),
        "--database=postgres".to_owned(),
        "--table-group=default".to_owned(),
        "--shard=0-inf".to_owned(),
        // The pod name: StatefulSet pods keep it across restarts.
        "--service-id=$(POD_NAME)".to_owned(),
        format!("--hostname=$(POD_NAME).{svc}.db.svc"),
        "--pgctld-addr=127.0.0.1:15470".to_owned(),
        "--pg-port=5432".to_owned(),
        "--log-level=debug".to_owned(),
        "--pgbackrest-cert-file=/certs/pgbackrest/pgbackrest.crt".to_owned(),
        "--pgbackrest-key-file=/certs/pgbackrest/pgbackrest.key".to_owned(),
        "--pgbackrest-ca-file=/certs/pgbackrest/ca.crt".to_owned(),
    ];
    assert_eq!(mp.args.as_deref().unwrap(), expected);
    let ports: Vec<_> = mp
        .ports
        .iter()
        .flatten()
        .map(|p| (p.name.as_deref().unwrap(), p.container_port))
        .collect();
    assert_eq!(ports, [("http", 15200), ("grpc", 15270)]);
    assert_eq!(
        probe(&mp.liveness_probe),
        ("/live".into(), IntOrString::Int(15200))
    );
    assert_eq!(
        probe(&mp.readiness_probe),
        ("/ready".into(), IntOrString::Int(15200))
    );
    assert_eq!(
        mp.security_context.as_ref().unwrap().run_as_user,
        Some(999),
        "multipooler shares PGDATA with postgres, so it runs as the same user"
    );
}

#[test]
fn both_processes_share_the_data_volume_and_secrets() {
    let o = objects(&fixture());
    let pod = pod(pool(&o, "zone-a"));
    let mounts = |c: &Container| -> Vec<(String, String)> {
        c.volume_mounts
            .iter()
            .flatten()
            .map(|m| (m.name.clone(), m.mount_path.clone()))
            .collect()
    };
    let pg = mounts(&pod.init_containers.as_ref().unwrap()[0]);
    assert_eq!(pg, mounts(&pod.containers[0]));
    let expected: Vec<(String, String)> = [
        ("data", "/var/lib/pooler"),
        ("postgres-password", "/etc/postgres-password"),
        ("postgres-socket", "/var/run/postgresql"),
        ("backup", "/backups"),
        ("pgbackrest-certs", "/certs/pgbackrest"),
    ]
    .map(|(a, b)| (a.to_owned(), b.to_owned()))
    .to_vec();
    assert_eq!(pg, expected);
    let volumes = pod.volumes.as_ref().unwrap();
    let password = volumes
        .iter()
        .find(|v| v.name == "postgres-password")
        .unwrap();
    let secret = password.secret.as_ref().unwrap();
    assert_eq!(secret.secret_name.as_deref(), Some("pg-superuser"));
    assert_eq!(secret.items.as_ref().unwrap()[0].path, "password");
    let backup = volumes.iter().find(|v| v.name == "backup").unwrap();
    assert_eq!(
        backup.persistent_volume_claim.as_ref().unwrap().claim_name,
        "prod-postgres-default-0-inf-backup"
    );
    let certs = volumes
        .iter()
        .find(|v| v.name == "pgbackrest-certs")
        .unwrap();
    let items = certs.projected.as_ref().unwrap().sources.as_ref().unwrap()[0]
        .secret
        .as_ref()
        .unwrap()
        .items
        .clone()
        .unwrap();
    let renamed: Vec<_> = items
        .iter()
        .map(|i| (i.key.as_str(), i.path.as_str()))
        .collect();
    assert_eq!(
        renamed,
        [
            ("ca.crt", "ca.crt"),
            ("tls.crt", "pgbackrest.crt"),
            ("tls.key", "pgbackrest.key")
        ]
    );
}

#[test]
fn pool_pods_outlast_the_graceful_shutdown_of_multipooler() {
    let o = objects(&fixture());
    let p = pool(&o, "zone-a");
    let grace = pod(p).termination_grace_period_seconds.unwrap();
    assert_eq!(grace, 60);
    assert!(
        grace >= MULTIPOOLER_ONTERM_SECONDS + 15,
        "{grace} s leaves too little beyond multipooler's {MULTIPOOLER_ONTERM_SECONDS} s"
    );
    let pooler = pod(p)
        .containers
        .iter()
        .find(|c| c.name == "multipooler")
        .unwrap();
    assert!(
        pooler
            .args
            .iter()
            .flatten()
            .all(|a| !a.starts_with("--onterm-timeout")),
        "multipooler keeps upstream's default onterm timeout"
    );
}

#[test]
fn pool_pods_are_hardened_placed_and_pull_with_secrets() {
    let o = objects(&fixture());
    let pod = pod(pool(&o, "zone-b"));
    assert_eq!(pod.image_pull_secrets.as_ref().unwrap()[0].name, "regcred");
    assert!(
        pod.init_containers
            .iter()
            .flatten()
            .chain(&pod.containers)
            .all(|c| c.image_pull_policy.as_deref() == Some("Always"))
    );
    assert_eq!(
        pod.node_selector.as_ref().unwrap()["topology.k8s.aws/zone-id"],
        "use1-az2"
    );
    assert!(pod.affinity.as_ref().unwrap().pod_anti_affinity.is_some());
    assert_eq!(
        pod.tolerations.as_ref().unwrap()[0].value.as_deref(),
        Some("db")
    );
    let psc = pod.security_context.as_ref().unwrap();
    assert_eq!((psc.fs_group, psc.run_as_non_root), (Some(999), Some(true)));
    assert_eq!(
        psc.seccomp_profile.as_ref().unwrap().type_,
        "RuntimeDefault"
    );
    assert_eq!(pod.automount_service_account_token, Some(false));
    for c in pod.init_containers.iter().flatten().chain(&pod.containers) {
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!(sc.allow_privilege_escalation, Some(false), "{}", c.name);
        assert_eq!(
            sc.capabilities.as_ref().unwrap().drop.as_deref(),
            Some(&["ALL".to_owned()][..])
        );
        assert!(c.resources.is_some(), "{}", c.name);
    }
}

#[test]
fn volumes_storage_and_retention_follow_the_pool() {
    let o = objects(&fixture());
    let p = pool(&o, "zone-a");
    assert_eq!(p.storage_size, "5Gi");
    let spec = p.statefulset.spec.as_ref().unwrap();
    let retention = spec
        .persistent_volume_claim_retention_policy
        .as_ref()
        .unwrap();
    assert_eq!(
        (
            retention.when_deleted.as_deref(),
            retention.when_scaled.as_deref()
        ),
        (Some("Retain"), Some("Retain")),
        "the StatefulSet keeps scaled-away claims: the handler deletes them"
    );
    assert!(
        p.delete_scaled_claims,
        "the pool's policy (whenScaled: Delete) wins over the shard's"
    );
    let claim = &spec.volume_claim_templates.as_ref().unwrap()[0];
    assert_eq!(
        claim
            .spec
            .as_ref()
            .unwrap()
            .resources
            .as_ref()
            .unwrap()
            .requests
            .as_ref()
            .unwrap()["storage"],
        Quantity("5Gi".into())
    );
    assert_eq!(
        claim.metadata.labels.as_ref().unwrap()["multigres.com/pool"],
        "main"
    );
    let backup = o.backup.as_ref().unwrap();
    assert_eq!(
        backup.metadata.name.as_deref(),
        Some("prod-postgres-default-0-inf-backup")
    );
    assert_eq!(
        backup.spec.as_ref().unwrap().access_modes.as_deref(),
        Some(&["ReadWriteMany".to_owned()][..])
    );
    assert!(
        backup.metadata.owner_references.is_none(),
        "whenDeleted is Delete, but the backups' deletion is not confirmed: the volume is kept"
    );
    let confirmed = |value: &str| {
        let mut shard = fixture();
        shard.annotations_mut().insert(
            multigres_api::confirm::DELETE_BACKUPS.to_owned(),
            value.to_owned(),
        );
        objects(&shard).backup.unwrap().metadata.owner_references
    };
    assert_eq!(
        confirmed("prod").unwrap()[0].kind,
        "Shard",
        "whenDeleted is Delete and cluster prod confirmed: the volume goes with the Shard"
    );
    assert!(
        confirmed("other").is_none(),
        "a confirmation naming another cluster"
    );

    let mut retained = fixture();
    retained.spec.pvc_deletion_policy = None;
    assert!(
        objects(&retained)
            .backup
            .unwrap()
            .metadata
            .owner_references
            .is_none()
    );
}

#[test]
fn services_and_pdbs_cover_each_pool_in_each_cell() {
    let o = objects(&fixture());
    let p = pool(&o, "zone-a");
    let svc = p.service.spec.as_ref().unwrap();
    assert_eq!(svc.cluster_ip.as_deref(), Some("None"));
    assert_eq!(svc.publish_not_ready_addresses, Some(true));
    let ports: Vec<_> = svc.ports.iter().flatten().map(|p| p.port).collect();
    assert_eq!(ports, [15200, 15270, 5432]);
    assert_eq!(svc.selector.as_ref(), Some(&p.selector));
    let pdb = p.pdb.spec.as_ref().unwrap();
    assert_eq!(
        (&pdb.max_unavailable, &pdb.min_available),
        (&None, &None),
        "filled in from the pods"
    );
    let selector = pdb.selector.as_ref().unwrap();
    assert_eq!(selector.match_labels.as_ref(), Some(&p.selector));
    let role = |s: &LabelSelector| {
        let r = &s.match_expressions.as_ref().unwrap()[0];
        (r.key.clone(), r.operator.clone(), r.values.clone().unwrap())
    };
    assert_eq!(
        role(selector),
        (
            ROLE.to_owned(),
            "NotIn".to_owned(),
            vec!["primary".to_owned()]
        ),
        "replicas only: a pod two budgets select could not be evicted at all"
    );

    // The primary: no eviction while another pod can take over; the budget selects the
    // shard's pool pods in every pool and cell.
    let primary = o.primary_pdb.as_ref().unwrap();
    let spec = primary.spec.as_ref().unwrap();
    assert_eq!(spec.max_unavailable, Some(IntOrString::Int(0)));
    let selector = spec.selector.as_ref().unwrap();
    assert_eq!(
        role(selector),
        (ROLE.to_owned(), "In".to_owned(), vec!["primary".to_owned()])
    );
    let labels = selector.match_labels.as_ref().unwrap();
    assert!(
        !labels.contains_key(multigres_api::labels::CELL)
            && !labels.contains_key(multigres_api::labels::POOL)
    );
    assert_eq!(
        labels.get(multigres_api::labels::SHARD).map(String::as_str),
        Some("0-inf")
    );
    assert!(kube::ResourceExt::name_any(primary).ends_with("-primary"));

    // A one-pod shard has no one to hand over to: no primary budget.
    let mut single = fixture();
    for pool in single.spec.pools.values_mut() {
        pool.cells.truncate(1);
        pool.replicas_per_cell = Some(1);
    }
    assert!(objects(&single).primary_pdb.is_none());
}

#[test]
fn multiorch_watches_the_shard_with_a_stable_id() {
    let o = objects(&fixture());
    let m = o.multiorch.iter().find(|m| m.cell == "zone-b").unwrap();
    let spec = m.deployment.spec.as_ref().unwrap();
    assert_eq!(
        spec.strategy.as_ref().unwrap().type_.as_deref(),
        Some("Recreate"),
        "two multiorch with one id must never overlap"
    );
    let pod = spec.template.spec.as_ref().unwrap();
    let c = &pod.containers[0];
    assert_eq!(
        c.args.as_deref().unwrap(),
        [
            "--http-port=15300",
            "--grpc-port=15370",
            "--topo-global-server-addresses=prod-global-topo.db.svc:2379",
            "--topo-global-root=/multigres/global",
            "--cell=zone-b",
            "--watch-targets=postgres/default/0-inf",
            "--service-id=prod-postgres-default-0-inf-multiorch-zone-b",
            "--hostname=$(POD_IP)",
            "--log-level=info",
        ]
    );
    assert_eq!(
        pod.node_selector.as_ref().unwrap()["topology.k8s.aws/zone-id"],
        "use1-az2"
    );
    assert_eq!(
        pod.tolerations.as_ref().unwrap()[0].key.as_deref(),
        Some("dedicated")
    );
    assert_eq!(pod.image_pull_secrets.as_ref().unwrap()[0].name, "regcred");
    let ports: Vec<_> = m
        .service
        .spec
        .as_ref()
        .unwrap()
        .ports
        .iter()
        .flatten()
        .map(|p| p.port)
        .collect();
    assert_eq!(ports, [15300, 15370]);
    assert_eq!(multiorch_service_id("d", 2), "$(POD_NAME)");
}

#[test]
fn multiorch_gets_the_failover_grace_the_spec_sets_and_only_that() {
    let orch_args = |shard: &Shard| {
        let o = objects(shard);
        let spec = o.multiorch[0].deployment.spec.clone().unwrap();
        spec.template.spec.unwrap().containers[0]
            .args
            .clone()
            .unwrap()
    };
    let grace = |args: &[String]| -> Vec<String> {
        args.iter()
            .filter(|a| a.starts_with("--leader-failover-grace-period"))
            .cloned()
            .collect()
    };
    let mut shard = fixture();
    assert!(
        grace(&orch_args(&shard)).is_empty(),
        "unset: multiorch's own"
    );
    shard.spec.multiorch.leader_failover_grace_period_base = Some(GoDuration::new("1s"));
    shard.spec.multiorch.leader_failover_grace_period_max_jitter = Some(GoDuration::new("2s"));
    let args = orch_args(&shard);
    assert_eq!(
        grace(&args),
        [
            "--leader-failover-grace-period-base=1s",
            "--leader-failover-grace-period-max-jitter=2s",
        ]
    );
    assert_eq!(
        args.last().unwrap(),
        "--leader-failover-grace-period-max-jitter=2s"
    );
    shard.spec.multiorch.leader_failover_grace_period_base = None;
    assert_eq!(
        grace(&orch_args(&shard)),
        ["--leader-failover-grace-period-max-jitter=2s"],
        "each flag on its own"
    );
}

#[test]
fn s3_backups_need_no_volume_but_credentials() {
    let mut shard = fixture();
    shard.spec.backup = Some(
        serde_yaml::from_str(
            "{type: s3, s3: {bucket: b, region: eu-west-1, credentialsSecret: aws}}",
        )
        .unwrap(),
    );
    let o = objects(&shard);
    assert!(o.backup.is_none());
    let pod = pod(pool(&o, "zone-a"));
    assert!(pod.volumes.iter().flatten().all(|v| v.name != "backup"));
    let env = pod.containers[0].env.clone().unwrap();
    let region = env.iter().find(|e| e.name == "AWS_REGION").unwrap();
    assert_eq!(region.value.as_deref(), Some("eu-west-1"));
    let key = env.iter().find(|e| e.name == "AWS_ACCESS_KEY_ID").unwrap();
    let secret = key
        .value_from
        .as_ref()
        .unwrap()
        .secret_key_ref
        .as_ref()
        .unwrap();
    assert_eq!(
        (secret.name.as_str(), secret.key.as_str()),
        ("aws", "AWS_ACCESS_KEY_ID")
    );
}

#[test]
fn empty_multiorch_cells_default_to_the_pools_cells_and_bad_pools_are_refused() {
    let mut shard = fixture();
    shard.spec.multiorch.cells.clear();
    assert_eq!(multiorch_cells(&shard.spec), ["zone-a", "zone-b"]);
    let owner = Owner::of(&shard).unwrap();
    let mut no_cells = shard.spec.clone();
    no_cells.pools.values_mut().for_each(|p| p.cells.clear());
    assert_eq!(
        build(&owner, &no_cells, BackupDeletion::Unconfirmed),
        Err(BuildError::PoolWithoutCells {
            pool: "main".to_owned()
        })
    );
    let mut no_pools = shard.spec.clone();
    no_pools.pools.clear();
    assert_eq!(
        build(&owner, &no_pools, BackupDeletion::Unconfirmed),
        Err(BuildError::NoPools)
    );
}

#[test]
fn build_errors_name_the_field_and_what_it_allows() {
    assert_eq!(
        BuildError::NoPools.to_string(),
        "spec.pools is empty: a shard needs at least one pool"
    );
    assert_eq!(
        BuildError::PoolWithoutCells {
            pool: "main".to_owned()
        }
        .to_string(),
        "spec.pools.main.cells is empty: a pool runs in at least one cell"
    );
    assert_eq!(
        BuildError::RecoveryWithoutS3.to_string(),
        "spec.backup.recovery: the recovered data becomes the first backup of this shard's own \
         repository, which must be S3 (spec.backup.type: s3)"
    );
}

#[test]
fn internal_tls_reaches_multiorch_and_multipooler_but_not_pgctld() {
    let mut shard = fixture();
    let plain = objects(&shard);
    shard.spec.internal_tls = Some(multigres_api::v1alpha1::InternalTlsConfig {
        enabled: Some(true),
        topology: None,
    });
    let o = objects(&shard);
    let tls_volume = |pod: &PodSpec| {
        pod.volumes
            .iter()
            .flatten()
            .find(|v| v.name == crate::tls::TLS_VOLUME)
            .and_then(|v| v.secret.as_ref()?.secret_name.clone())
    };
    let has_flag = |c: &Container, f: &str| c.args.iter().flatten().any(|a| a.starts_with(f));

    let pool_pod = pod(pool(&o, "zone-a"));
    assert_eq!(
        tls_volume(pool_pod).as_deref(),
        Some("multipooler.prod.db.multigres.internal")
    );
    let pooler = &pool_pod.containers[0];
    assert!(has_flag(pooler, "--grpc-cert=/etc/multigres/tls/tls.crt"));
    assert!(!has_flag(pooler, "--multipooler-grpc-server-name"));
    let pgctld = &pool_pod.init_containers.as_ref().unwrap()[0];
    assert!(!has_flag(pgctld, "--grpc-cert"));

    let orch_pod = o.multiorch[0].deployment.spec.as_ref().unwrap();
    let orch_pod = orch_pod.template.spec.as_ref().unwrap();
    assert_eq!(
        tls_volume(orch_pod).as_deref(),
        Some("multiorch.prod.db.multigres.internal")
    );
    assert!(has_flag(
        &orch_pod.containers[0],
        "--multipooler-grpc-server-name=multipooler.prod.db.multigres.internal"
    ));

    // Off (the fixture's default): no volume, no flags.
    assert_eq!(tls_volume(pod(pool(&plain, "zone-a"))), None);
    assert!(!has_flag(
        &pod(pool(&plain, "zone-a")).containers[0],
        "--grpc-cert"
    ));
}

#[test]
fn backups_without_a_named_secret_use_the_generated_pgbackrest_certificates() {
    let mut shard = fixture();
    shard.spec.backup.as_mut().unwrap().pgbackrest_tls = None;
    let o = objects(&shard);
    let pool_pod = pod(pool(&o, "zone-a"));
    let volume = pool_pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == crate::tls::PGBACKREST_VOLUME)
        .unwrap();
    let names: Vec<_> = volume
        .projected
        .as_ref()
        .unwrap()
        .sources
        .iter()
        .flatten()
        .map(|s| s.secret.as_ref().unwrap().name.clone())
        .collect();
    assert_eq!(
        names,
        [
            "prod-postgres-default-0-inf-pgbackrest-ca",
            "prod-postgres-default-0-inf-pgbackrest-tls"
        ]
    );
    let args = |c: &Container| c.args.clone().unwrap_or_default();
    let pgctld = &pool_pod.init_containers.as_ref().unwrap()[0];
    assert!(args(pgctld).contains(&"--pgbackrest-cert-dir=/certs/pgbackrest".to_owned()));
    assert!(
        args(&pool_pod.containers[0])
            .contains(&"--pgbackrest-ca-file=/certs/pgbackrest/ca.crt".to_owned())
    );

    // No backups: neither certificates nor flags.
    shard.spec.backup = None;
    let o = objects(&shard);
    let pool_pod = pod(pool(&o, "zone-a"));
    assert!(
        pool_pod
            .volumes
            .iter()
            .flatten()
            .all(|v| v.name != crate::tls::PGBACKREST_VOLUME)
    );
    let pgctld = &pool_pod.init_containers.as_ref().unwrap()[0];
    assert!(args(pgctld).iter().all(|a| !a.starts_with("--pgbackrest")));
}

#[test]
fn pool_pods_without_an_affinity_prefer_a_zone_then_a_node_each_across_the_shard() {
    let mut shard = fixture();
    for pool in shard.spec.pools.values_mut() {
        pool.affinity = None;
    }
    let o = objects(&shard);
    let anti = pod(pool(&o, "zone-b"))
        .affinity
        .clone()
        .unwrap()
        .pod_anti_affinity
        .unwrap();
    let preferred = anti
        .preferred_during_scheduling_ignored_during_execution
        .unwrap();
    let keys: Vec<(&str, i32)> = preferred
        .iter()
        .map(|t| (t.pod_affinity_term.topology_key.as_str(), t.weight))
        .collect();
    assert_eq!(
        keys,
        [
            ("topology.kubernetes.io/zone", 100),
            ("kubernetes.io/hostname", 50)
        ]
    );
    let term = &preferred[1].pod_affinity_term;
    let selects = term
        .label_selector
        .as_ref()
        .unwrap()
        .match_labels
        .as_ref()
        .unwrap();
    assert_eq!(
        selects["multigres.com/shard"],
        shard.spec.shard_name.as_str()
    );
    assert!(
        !selects.contains_key("multigres.com/cell") && !selects.contains_key("multigres.com/pool"),
        "every pool pod of the shard, in every cell: {selects:?}"
    );
    assert!(
        anti.required_during_scheduling_ignored_during_execution
            .is_none(),
        "only preferred: fewer nodes than pods still schedule"
    );
}

/// The args and env of every container of `pod`, by container, as YAML (keys sorted): what
/// the kubelet reads for `$(NAME)` expansion.
fn args_and_env(pod: &PodSpec) -> String {
    let containers: Vec<_> = pod
        .init_containers
        .iter()
        .flatten()
        .chain(&pod.containers)
        .map(|c| {
            let env: Vec<_> = c
                .env
                .iter()
                .flatten()
                .filter_map(|e| Some(format!("{}={}", e.name, e.value.as_deref()?)))
                .collect();
            serde_json::json!({"name": c.name, "args": c.args, "env": env})
        })
        .collect();
    serde_yaml::to_string(&containers).unwrap()
}

#[test]
fn user_text_reaches_args_and_env_with_every_dollar_doubled() {
    let mut shard = fixture();
    shard.spec.global_topo_server.address = "http://$(AWS_ACCESS_KEY_ID).x.example:2379".into();
    shard.spec.global_topo_server.root_path = "/multigres/$(AWS_SECRET_ACCESS_KEY)".into();
    shard.spec.initdb_args = Some("--locale=$(AWS_SECRET_ACCESS_KEY)".into());
    shard.spec.postgres_superuser = Some("pg$(USER)".into());
    shard.spec.backup = Some(
        serde_yaml::from_str(
            "{type: s3, s3: {bucket: b, region: 'eu-$(AWS_SECRET_ACCESS_KEY)', \
             credentialsSecret: s3-keys}}",
        )
        .unwrap(),
    );
    let o = objects(&shard);
    let svc = "prod-postgres-default-0-inf-pool-main-zone-a";
    let expected = format!(
        "\
- args:
  - server
  - --pooler-dir=/var/lib/pooler
  - --grpc-port=15470
  - --grpc-bind-address=127.0.0.1
  - --http-port=15400
  - --pg-port=5432
  - --pg-listen-addresses=*
  - --grpc-socket-file=/var/lib/pooler/pgctld.sock
  - --log-level=warn
  - --pgbackrest-cert-dir=/certs/pgbackrest
  - --pgbackrest-port=8432
  env:
  - PGDATA=/var/lib/pooler/pg_data
  - POSTGRES_USER=pg$$(USER)
  - POSTGRES_PASSWORD_FILE=/etc/postgres-password/password
  - AWS_REGION=eu-$$(AWS_SECRET_ACCESS_KEY)
  - POSTGRES_INITDB_ARGS=--locale=$$(AWS_SECRET_ACCESS_KEY)
  name: postgres
- args:
  - --http-port=15200
  - --grpc-port=15270
  - --pooler-dir=/var/lib/pooler
  - --socket-file=/var/lib/pooler/pg_sockets/.s.PGSQL.5432
  - --topo-global-server-addresses=http://$$(AWS_ACCESS_KEY_ID).x.example:2379
  - --topo-global-root=/multigres/$$(AWS_SECRET_ACCESS_KEY)
  - --cell=zone-a
  - --database=postgres
  - --table-group=default
  - --shard=0-inf
  - --service-id=$(POD_NAME)
  - --hostname=$(POD_NAME).{svc}.db.svc
  - --pgctld-addr=127.0.0.1:15470
  - --pg-port=5432
  - --log-level=debug
  - --pgbackrest-cert-file=/certs/pgbackrest/pgbackrest.crt
  - --pgbackrest-key-file=/certs/pgbackrest/pgbackrest.key
  - --pgbackrest-ca-file=/certs/pgbackrest/ca.crt
  env:
  - PGDATA=/var/lib/pooler/pg_data
  - POSTGRES_USER=pg$$(USER)
  - POSTGRES_PASSWORD_FILE=/etc/postgres-password/password
  - AWS_REGION=eu-$$(AWS_SECRET_ACCESS_KEY)
  name: multipooler
- args:
  - --web.listen-address=:9187
  - --web.config.file=/etc/postgres-exporter/tls/web-config.yaml
  - --collector.long_running_transactions
  env:
  - DATA_SOURCE_URI=localhost:5432/postgres?host=/var/lib/pooler/pg_sockets&sslmode=disable
  - DATA_SOURCE_USER=multigres_monitor
  - DATA_SOURCE_PASS_FILE=/etc/postgres-exporter/password/password
  name: postgres-exporter
"
    );
    assert_eq!(args_and_env(pod(pool(&o, "zone-a"))), expected);
    let orch = &o.multiorch[0].deployment;
    let orch_args = orch
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
        .unwrap();
    assert!(
        orch_args.contains(&"--topo-global-root=/multigres/$$(AWS_SECRET_ACCESS_KEY)".to_owned()),
        "{orch_args:?}"
    );
    assert!(orch_args.contains(&"--hostname=$(POD_IP)".to_owned()));
}

/// Each data-plane image changes its own container of every pool pod template and nothing
/// else, so each alone makes the pool pods outdated and starts the cohort-gated rollout. The
/// kwok tier rolls a multipooler image change (`e2e/tests/resource_handler.rs`); real pods roll
/// both images changed at once (`e2e/tests/data_plane.rs`).
#[test]
fn each_data_plane_image_changes_only_its_own_container_of_the_pool_pods() {
    let before = objects(&fixture());
    let next = || ImageRef::new("registry.example/next:2");
    for container in ["multipooler", "postgres"] {
        let mut shard = fixture();
        let images = &mut shard.spec.images;
        match container {
            "multipooler" => images.multipooler = next(),
            _ => images.postgres = next(),
        }
        let after = objects(&shard);
        assert_eq!(after.pools.len(), before.pools.len());
        for (old, new) in before.pools.iter().zip(&after.pools) {
            let old_pod = pod(old);
            let old_image = |name: &str| {
                let all = old_pod.init_containers.iter().flatten();
                all.chain(&old_pod.containers)
                    .find(|c| c.name == name)
                    .and_then(|c| c.image.clone())
            };
            let mut restored = pod(new).clone();
            let mut changed = Vec::new();
            let init = restored.init_containers.iter_mut().flatten();
            for c in init.chain(restored.containers.iter_mut()) {
                let was = old_image(&c.name);
                if c.image != was {
                    changed.push((c.name.clone(), c.image.clone()));
                    c.image = was;
                }
            }
            let want = (container.to_owned(), Some(next().as_str().to_owned()));
            assert_eq!(changed, [want], "{}", old.cell);
            assert_eq!(
                &restored, old_pod,
                "{container}: nothing but its image changed"
            );
        }
    }
}
