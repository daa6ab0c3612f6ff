use k8s_openapi::api::core::v1::{Container, PodSpec};
use kube::runtime::reflector;
use kube::runtime::watcher::Event;

use super::super::build::{BackupDeletion, build};
use super::*;

const FIXTURE: &str = include_str!("../../../fixtures/shard.yaml");

fn fixture() -> Shard {
    serde_yaml::from_str(FIXTURE).expect("fixture parses")
}

fn with_config(entries: &[(&str, &str)]) -> Shard {
    let mut shard = fixture();
    shard.spec.postgres_config = entries
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    shard
}

/// The objects of `shard` with its file mounted, as the reconcile applies them.
fn mounted(shard: &Shard) -> (ShardObjects, Rendered) {
    let owner = Owner::of(shard).unwrap();
    let rendered = render_shard(&owner.cluster, &shard.spec, None, &Default::default()).unwrap();
    let mut objects = build(&owner, &shard.spec, BackupDeletion::of(shard, &owner)).unwrap();
    mount_into(&mut objects, "cfg", &rendered);
    (objects, rendered)
}

fn line<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
    let prefix = format!("{name} = ");
    text.lines().filter(|l| l.starts_with(&prefix)).collect()
}

fn pod_spec(objects: &ShardObjects, index: usize) -> &PodSpec {
    let set = objects.pools[index].statefulset.spec.as_ref().unwrap();
    set.template.spec.as_ref().unwrap()
}

fn container<'a>(pod: &'a PodSpec, name: &str) -> &'a Container {
    pod.init_containers
        .iter()
        .flatten()
        .chain(&pod.containers)
        .find(|c| c.name == name)
        .unwrap()
}

#[test]
fn the_config_map_holds_the_rendered_file_and_both_fingerprints_and_is_owned_by_the_shard() {
    let shard = with_config(&[("work_mem", "8MB")]);
    let owner = Owner::of(&shard).unwrap();
    let rendered = render_shard("prod", &shard.spec, None, &Default::default()).unwrap();
    let cm = config_map(&owner, &shard, &rendered);
    assert_eq!(cm.name_any(), "prod-postgres-default-0-inf-postgres-config");
    assert_eq!(cm.namespace().as_deref(), Some("db"));
    assert_eq!(
        cm.data.as_ref().unwrap()[CONFIG_KEY],
        rendered.text,
        "the file as rendered"
    );
    assert!(
        rendered
            .text
            .contains("\n# postgresConfig.\nwork_mem = '8MB'\n")
    );
    assert_eq!(
        cm.annotations()[CONFIG_HASH],
        rendered.split.restart_hash,
        "restart fingerprint"
    );
    assert_eq!(cm.annotations()[RELOAD_HASH], rendered.split.reload_hash);
    let hba = &cm.data.as_ref().unwrap()[HBA_TEMPLATE_KEY];
    let rules: Vec<Vec<&str>> = hba
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert!(
        rules.contains(&vec![
            "hostssl",
            "replication",
            "all",
            "0.0.0.0/0",
            "scram-sha-256"
        ]),
        "replicas in other pods may stream from the primary, over TLS: {rules:?}"
    );
    assert!(
        rules
            .iter()
            .all(|r| r[0] != "host" || r[1] != "replication"),
        "no plaintext replication: {rules:?}"
    );
    assert_eq!(
        line(&rendered.text, "ssl"),
        ["ssl = 'on'"],
        "the primary serves the TLS the replicas must use"
    );
    let mut without_backups = shard.clone();
    without_backups.spec.backup = None;
    let plain = hba_template(&without_backups.spec);
    assert!(plain.contains("\nhost    replication  all   0.0.0.0/0  scram-sha-256\n"));
    assert!(
        !plain.contains("hostssl"),
        "no certificate, no TLS-only rule"
    );
    assert!(
        rules.iter().all(|r| r.last() == Some(&"scram-sha-256")),
        "every rule asks for a password: {rules:?}"
    );
    assert!(
        !hba.contains("{{"),
        "no template action: pgctld renders it as a Go template"
    );
    let owners = cm.owner_references();
    assert_eq!(owners.len(), 1);
    assert_eq!(
        (owners[0].kind.as_str(), owners[0].uid.as_str()),
        ("Shard", "0b7c6f1e-0000-4000-8000-000000000003")
    );
    assert_eq!(
        cm.labels()
            .get("app.kubernetes.io/managed-by")
            .map(String::as_str),
        Some("multigres-operator"),
        "labelled, so the handler's ConfigMap watch sees it"
    );
}

#[test]
fn pgctld_mounts_the_file_and_every_pod_template_carries_only_the_restart_fingerprint() {
    let (objects, rendered) = mounted(&fixture());
    assert_eq!(objects.pools.len(), 2);
    for (index, pool) in objects.pools.iter().enumerate() {
        let template = &pool.statefulset.spec.as_ref().unwrap().template;
        let annotations = template.metadata.as_ref().unwrap().annotations.as_ref();
        let annotations = annotations.unwrap();
        assert_eq!(annotations[CONFIG_HASH], rendered.split.restart_hash);
        assert!(!annotations.contains_key(RELOAD_HASH));
        let pod = pod_spec(&objects, index);
        let volume = pod
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == "postgres-config")
            .unwrap();
        assert_eq!(volume.config_map.as_ref().unwrap().name, "cfg");
        let pgctld = container(pod, "postgres");
        let mount = pgctld
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.name == "postgres-config")
            .unwrap();
        assert_eq!(
            (mount.mount_path.as_str(), mount.read_only),
            ("/etc/pgctld/postgres-config", Some(true))
        );
        let extra = pgctld
            .env
            .iter()
            .flatten()
            .find(|e| e.name == "POSTGRES_INITDB_EXTRA_CONF")
            .unwrap();
        assert_eq!(
            extra.value.as_deref(),
            Some("/etc/pgctld/postgres-config/postgresql.conf")
        );
        let initdb = pgctld
            .env
            .iter()
            .flatten()
            .find(|e| e.name == "POSTGRES_INITDB_ARGS")
            .unwrap();
        assert_eq!(initdb.value.as_deref(), Some("--data-checksums"));
        assert!(
            pgctld
                .args
                .iter()
                .flatten()
                .any(|a| a == "--pg-hba-template=/etc/pgctld/postgres-config/pg_hba_template.conf"),
            "pgctld writes pg_hba.conf from the mounted template: {:?}",
            pgctld.args
        );
        let pooler = container(pod, "multipooler");
        assert!(
            pooler
                .volume_mounts
                .iter()
                .flatten()
                .all(|m| m.name != "postgres-config"),
            "only pgctld reads the file"
        );
    }
}

#[test]
fn a_reload_only_change_keeps_the_pod_template_and_a_restart_change_changes_it() {
    let (base, base_rendered) = mounted(&with_config(&[("work_mem", "8MB")]));
    let (reload, reload_rendered) = mounted(&with_config(&[("work_mem", "16MB")]));
    assert_ne!(base_rendered.text, reload_rendered.text, "the file changes");
    assert_eq!(
        base.pools, reload.pools,
        "no StatefulSet change, so no pod restarts"
    );
    let (restart, _) = mounted(&with_config(&[
        ("work_mem", "8MB"),
        ("shared_buffers", "256MB"),
    ]));
    let template = |o: &ShardObjects| o.pools[0].statefulset.spec.clone().unwrap().template;
    assert_ne!(template(&base), template(&restart));
}

#[test]
fn the_referenced_content_or_which_configmap_or_key_is_missing() {
    let reference = PostgresConfigRef {
        name: "tuning".into(),
        key: "pg.conf".into(),
    };
    let missing = referenced_content(&reference, "db", None).unwrap_err();
    assert_eq!(
        missing.to_string(),
        "postgresConfigRef: ConfigMap \"tuning\" not found in namespace \"db\"; create it with \
         key \"pg.conf\" or remove postgresConfigRef"
    );
    assert!(missing.is_invalid_spec(), "waits for the ConfigMap");
    let cm = |data: &[(&str, &str)]| ConfigMap {
        data: Some(
            data.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        ),
        ..Default::default()
    };
    let no_key = referenced_content(&reference, "db", Some(&cm(&[("a", "x"), ("b", "y")])));
    assert_eq!(
        no_key.unwrap_err().to_string(),
        "postgresConfigRef: ConfigMap \"tuning\" has no key \"pg.conf\" (it has: a, b)"
    );
    let empty = referenced_content(&reference, "db", Some(&ConfigMap::default()));
    assert_eq!(
        empty.unwrap_err().to_string(),
        "postgresConfigRef: ConfigMap \"tuning\" has no key \"pg.conf\" (it has: none)"
    );
    let found = referenced_content(
        &reference,
        "db",
        Some(&cm(&[("pg.conf", "work_mem = 1MB")])),
    );
    assert_eq!(found.unwrap(), "work_mem = 1MB");
}

/// A pool pod running restart fingerprint `hash` that confirmed the reload fingerprint
/// `reloaded` (stamped by the data-handler), if any.
fn stamped_pod(hash: &str, reloaded: Option<&str>, terminating: bool) -> Pod {
    let mut pod = Pod::default();
    pod.annotations_mut()
        .insert(CONFIG_HASH.to_owned(), hash.to_owned());
    if let Some(reloaded) = reloaded {
        pod.annotations_mut()
            .insert(RELOAD_HASH.to_owned(), reloaded.to_owned());
    }
    if terminating {
        pod.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(1).unwrap()));
    }
    pod
}

#[test]
fn progress_is_reported_until_every_wanted_pod_runs_the_current_restart_fingerprint() {
    let (objects, rendered) = mounted(&fixture());
    let reloaded = rendered.split.reload_hash.clone();
    let pod = |hash: &str, terminating| stamped_pod(hash, Some(&reloaded), terminating);
    // Two cells, two pods each.
    let current = &rendered.split.restart_hash;
    let t = |s| Timestamp::from_second(s).unwrap();
    let rolling = [pod(current, false), pod("old", false), pod(current, false)];
    let s = progress(None, &rendered, &objects, &rolling, t(10));
    assert_eq!(
        (s.in_progress, s.last_applied_at.clone()),
        (Some(true), None)
    );

    let done = [
        pod(current, false),
        pod(current, false),
        pod(current, false),
        pod(current, false),
    ];
    let settled = progress(Some(&s), &rendered, &objects, &done, t(20));
    assert_eq!(settled.in_progress, Some(false));
    assert_eq!(
        settled.last_applied_at,
        Some(Time(t(20))),
        "stamped on settling"
    );
    assert_eq!(settled.error, None);

    let later = progress(Some(&settled), &rendered, &objects, &done, t(30));
    assert_eq!(
        later, settled,
        "unchanged while nothing changes: no status write"
    );

    let terminating = [
        pod(current, true),
        pod(current, false),
        pod(current, false),
        pod(current, false),
    ];
    let again = progress(Some(&settled), &rendered, &objects, &terminating, t(40));
    assert_eq!(
        again.in_progress,
        Some(true),
        "a terminating pod does not count"
    );
    assert_eq!(
        again.last_applied_at,
        Some(Time(t(20))),
        "kept while in progress"
    );
    let resettled = progress(Some(&again), &rendered, &objects, &done, t(50));
    assert_eq!(resettled.last_applied_at, Some(Time(t(50))));
}

#[test]
fn a_reload_not_yet_confirmed_by_every_pod_is_in_progress() {
    let (objects, rendered) = mounted(&fixture());
    let (restart, reload) = (&rendered.split.restart_hash, &rendered.split.reload_hash);
    let t = |s| Timestamp::from_second(s).unwrap();
    let confirmed = || stamped_pod(restart, Some(reload), false);
    let settled = progress(
        None,
        &rendered,
        &objects,
        &[confirmed(), confirmed(), confirmed(), confirmed()],
        t(10),
    );
    assert_eq!(settled.in_progress, Some(false));
    for pending in [
        stamped_pod(restart, Some("previous"), false),
        stamped_pod(restart, None, false),
    ] {
        let s = progress(
            Some(&settled),
            &rendered,
            &objects,
            &[confirmed(), confirmed(), confirmed(), pending],
            t(20),
        );
        assert_eq!(s.in_progress, Some(true), "a pod has not reloaded yet");
        assert_eq!(s.last_applied_at, settled.last_applied_at);
    }
}

/// `status` as the API server stores it and hands it back (a `Time` keeps whole seconds).
fn stored(status: &PostgresConfigStatus) -> PostgresConfigStatus {
    serde_json::from_value(serde_json::to_value(status).unwrap()).unwrap()
}

#[test]
fn a_config_settling_again_within_the_second_of_the_last_one_is_stamped_later() {
    // A reload-class change settles, then a restart-class change rolls out and settles on
    // every pod within the same second (pods restart in well under a second on fast nodes).
    let (objects, before) = mounted(&fixture());
    let (_, after) = mounted(&with_config(&[("shared_buffers", "1GB")]));
    assert_ne!(before.split.restart_hash, after.split.restart_hash);
    let at = |s, ms| Timestamp::new(s, ms * 1_000_000).unwrap();
    let pods = |r: &Rendered| {
        let (restart, reload) = (&r.split.restart_hash, &r.split.reload_hash);
        vec![stamped_pod(restart, Some(reload), false); 4]
    };
    let settled = stored(&progress(
        None,
        &before,
        &objects,
        &pods(&before),
        at(10, 200),
    ));
    assert_eq!(settled.in_progress, Some(false));
    let rolling = progress(
        Some(&settled),
        &after,
        &objects,
        &pods(&before),
        at(10, 400),
    );
    assert_eq!(rolling.in_progress, Some(true));
    assert_eq!(rolling.last_applied_at, settled.last_applied_at);
    let rolling = stored(&rolling);
    let done = stored(&progress(
        Some(&rolling),
        &after,
        &objects,
        &pods(&after),
        at(10, 900),
    ));
    assert_eq!(done.in_progress, Some(false));
    let (new, old) = (
        done.last_applied_at.clone(),
        settled.last_applied_at.clone(),
    );
    assert!(
        new.as_ref().map(|t| t.0) > old.as_ref().map(|t| t.0),
        "stamped anew: {new:?} after {old:?}"
    );
    // Later reconciles change nothing: no status write.
    for later in [at(10, 950), at(11, 500), at(60, 0)] {
        let again = progress(Some(&done), &after, &objects, &pods(&after), later);
        assert_eq!(again, done, "idempotent at {later}");
    }
}

#[test]
fn a_failure_keeps_the_progress_and_reports_the_error() {
    let previous = PostgresConfigStatus {
        in_progress: Some(false),
        last_applied_at: Some(Time(Timestamp::from_second(5).unwrap())),
        error: None,
        held_settings: Vec::new(),
    };
    let error = ConfigError::MissingKey {
        name: "tuning".into(),
        key: "pg.conf".into(),
        keys: vec![],
    };
    let failed = failed(Some(&previous), &error);
    assert_eq!(failed.in_progress, Some(false));
    assert_eq!(failed.last_applied_at, previous.last_applied_at);
    assert_eq!(
        failed.error.as_deref(),
        Some("postgresConfigRef: ConfigMap \"tuning\" has no key \"pg.conf\" (it has: none)")
    );
}

#[test]
fn events_say_whether_a_change_restarts_pods() {
    let (_, base) = mounted(&with_config(&[("work_mem", "8MB")]));
    let owner = Owner::of(&fixture()).unwrap();
    let stored = config_map(&owner, &fixture(), &base);
    assert_eq!(change_note(None, &base), None, "a new file is no change");
    assert_eq!(change_note(Some(&stored), &base), None);
    let (_, reload) = mounted(&with_config(&[("work_mem", "16MB")]));
    assert!(
        change_note(Some(&stored), &reload)
            .unwrap()
            .contains("no pod restarts")
    );
    let (_, restart) = mounted(&with_config(&[("shared_buffers", "1GB")]));
    assert!(
        change_note(Some(&stored), &restart)
            .unwrap()
            .contains("replicas first and the primary last")
    );
}

#[test]
fn a_referenced_configmap_maps_to_the_shards_naming_it_in_its_namespace() {
    let (store, mut writer) = reflector::store::<Guard>();
    let shard = |name: &str, ns: &str, reference: Option<&str>| {
        let mut s = fixture();
        s.metadata.name = Some(name.into());
        s.metadata.namespace = Some(ns.into());
        s.spec.postgres_config_ref = reference.map(|r| PostgresConfigRef {
            name: r.into(),
            key: "pg.conf".into(),
        });
        multigres_common::guard::Guarded(Ok(s))
    };
    for s in [
        shard("a", "db", Some("tuning")),
        shard("b", "db", None),
        shard("c", "other", Some("tuning")),
        shard("d", "db", Some("else")),
    ] {
        writer.apply_watcher_event(&Event::Apply(s));
    }
    let mut changed = PartialObjectMeta::<ConfigMap>::default();
    changed.metadata.name = Some("tuning".into());
    changed.metadata.namespace = Some("db".into());
    let names: Vec<String> = referencing(&store, &changed)
        .into_iter()
        .map(|r| r.name)
        .collect();
    assert_eq!(names, ["a"]);
}

#[test]
fn a_refused_referenced_configmap_is_reported_by_name_key_and_parameter_and_mounts_nothing() {
    let mut shard = fixture();
    shard.spec.postgres_config_ref = Some(PostgresConfigRef {
        name: "tuning".into(),
        key: "extra.conf".into(),
    });
    let owner = Owner::of(&shard).unwrap();
    let mut objects = build(&owner, &shard.spec, BackupDeletion::of(&shard, &owner)).unwrap();
    let untouched = objects.pools[0].statefulset.clone();
    let content = "work_mem = 8MB\ninclude_if_exists '/etc/postgres-password/password'\n";
    let error = desired(
        &owner,
        &shard,
        Some(content),
        &Default::default(),
        &mut objects,
    )
    .unwrap_err();
    assert!(error.is_invalid_spec(), "only an edit fixes it");
    assert_eq!(
        error.to_string(),
        "postgresConfigRef ConfigMap \"tuning\" key \"extra.conf\" is refused and not rendered \
         (the pods keep their last postgresql.conf): include_if_exists: cannot be set: reads \
         another file of the pod into the configuration; write the settings themselves"
    );
    assert_eq!(
        objects.pools[0].statefulset, untouched,
        "nothing of the refused file reaches the pod template"
    );
    let status = failed(None, &error);
    assert!(
        status
            .error
            .as_deref()
            .is_some_and(|e| e.contains("ConfigMap \"tuning\" key \"extra.conf\"")
                && e.contains("include_if_exists")),
        "{status:?}"
    );
}

#[test]
fn only_the_configmaps_shards_name_are_watched_once_each() {
    let shard = |name: &str, ns: &str, reference: Option<&str>| {
        let mut s = fixture();
        s.metadata.name = Some(name.into());
        s.metadata.namespace = Some(ns.into());
        s.spec.postgres_config_ref = reference.map(|r| PostgresConfigRef {
            name: r.into(),
            key: "pg.conf".into(),
        });
        Arc::new(multigres_common::guard::Guarded(Ok(s)))
    };
    let shards = [
        shard("a", "db", Some("tuning")),
        shard("b", "db", None),
        shard("c", "other", Some("tuning")),
        shard("d", "db", Some("tuning")),
        Arc::new(multigres_common::guard::Guarded(Err(
            multigres_common::guard::InvalidObject {
                error: "spec: invalid type".into(),
                metadata: Default::default(),
            },
        ))),
    ];
    let watched: Vec<(String, String)> = referenced_config_maps(&shards).into_iter().collect();
    assert_eq!(
        watched,
        [
            ("db".to_owned(), "tuning".to_owned()),
            ("other".to_owned(), "tuning".to_owned())
        ]
    );
    assert!(referenced_config_maps(&[]).is_empty());
}

#[test]
fn multipooler_pools_fit_within_max_connections() {
    let pooler_args = |shard: &Shard| {
        let (objects, _) = mounted(shard);
        let pod = pod_spec(&objects, 0);
        container(pod, "multipooler")
            .args
            .clone()
            .unwrap_or_default()
    };
    let default = pooler_args(&fixture());
    assert!(
        default.contains(&"--connpool-global-capacity=47".to_owned()),
        "{default:?}"
    );
    assert!(
        default.contains(&"--connpool-admin-capacity=5".to_owned()),
        "{default:?}"
    );
    let larger = pooler_args(&with_config(&[("max_connections", "200")]));
    assert!(
        larger.contains(&"--connpool-global-capacity=187".to_owned()),
        "{larger:?}"
    );

    let too_small = with_config(&[("max_connections", "10")]);
    let owner = Owner::of(&too_small).unwrap();
    let error =
        render_shard(&owner.cluster, &too_small.spec, None, &Default::default()).unwrap_err();
    let text = error.to_string();
    assert!(text.contains("postgresConfig.max_connections"), "{text}");
    assert!(text.contains("at least 14"), "{text}");
}

/// A pod view stamped with `stamp` (the hot-standby-settings annotation value).
fn stamped_view(name: &str, stamp: &str) -> PodView {
    PodView {
        standby: standby::parse_standby(stamp),
        ..PodView::ready(name, super::super::rollout::Role::Replica)
    }
}

#[test]
fn a_lowered_standby_setting_is_held_at_what_the_file_or_a_pod_runs() {
    let owner = Owner::of(&fixture()).unwrap();
    let running = with_config(&[("max_connections", "80")]);
    let stored = config_map(
        &owner,
        &running,
        &render_shard(&owner.cluster, &running.spec, None, &Default::default()).unwrap(),
    );
    // The stored file says 80 connections and 6 workers (from the CPU); a pod stamped with
    // fewer connections does not lower the floor, and its 30 WAL senders raise it.
    let pods = [stamped_view("p-0", "max_connections=60,max_wal_senders=30")];
    // The cache keeps no file content: the ConfigMap's annotation alone carries its values.
    let mut cached = stored.clone();
    crate::slim_cache::slim(&mut cached);
    assert!(cached.data.is_none());
    assert_eq!(floor(Some(&cached), &[])["max_connections"], 80);
    let floor = floor(Some(&cached), &pods);
    assert_eq!(floor["max_connections"], 80);
    assert_eq!(floor["max_worker_processes"], 6);
    assert_eq!(floor["max_wal_senders"], 30);

    let lowered = with_config(&[("max_connections", "40"), ("work_mem", "8MB")]);
    let rendered = render_shard(&owner.cluster, &lowered.spec, None, &floor).unwrap();
    assert_eq!(
        rendered
            .held
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        [
            "max_connections 80 (asked 40)",
            "max_wal_senders 30 (asked 25)"
        ]
    );
    assert_eq!(
        line(&rendered.text, "max_connections").last(),
        Some(&"max_connections = 80")
    );
    // The pools stay sized by the 80 connections the servers run.
    let before = render_shard(&owner.cluster, &running.spec, None, &Default::default()).unwrap();
    assert_eq!(rendered.pool, before.pool);
    let note = held_note(&rendered).unwrap();
    assert!(
        note.starts_with(
            "kept max_connections 80 (asked 40), max_wal_senders 30 (asked 25) at the value"
        ),
        "{note}"
    );
    assert!(held_note(&before).is_none());

    // Without a stored file or stamps nothing is held: a new shard renders what it is asked.
    let fresh = render_shard(
        &owner.cluster,
        &lowered.spec,
        None,
        &super::floor(None, &[]),
    );
    assert!(fresh.unwrap().held.is_empty());
}
