use k8s_openapi::api::core::v1::{Container, PodSpec};
use multigres_api::v1alpha1::{CustomQueriesRef, Shard};
use serde_json::{Value, json};

use super::*;
use crate::shard::build::{BackupDeletion, build};

fn shard(observability: Option<&str>) -> Shard {
    let mut shard: Shard =
        serde_yaml::from_str(include_str!("../../fixtures/shard.yaml")).expect("fixture parses");
    if let Some(observability) = observability {
        shard.spec.observability = Some(serde_yaml::from_str(observability).unwrap());
    }
    shard
}

/// The pool pod of zone-a of `shard`.
fn pool_pod(shard: &Shard) -> PodSpec {
    let owner = Owner::of(shard).unwrap();
    let objects = build(&owner, &shard.spec, BackupDeletion::of(shard, &owner)).unwrap();
    let pool = objects.pools.iter().find(|p| p.cell == "zone-a").unwrap();
    let template = &pool.statefulset.spec.as_ref().unwrap().template;
    template.spec.clone().unwrap()
}

fn exporter(pod: &PodSpec) -> Option<&Container> {
    pod.containers.iter().find(|c| c.name == CONTAINER)
}

/// The exporter's volumes of `pod`, by name.
fn volumes(pod: &PodSpec) -> Vec<Value> {
    pod.volumes
        .iter()
        .flatten()
        .filter(|v| v.name.starts_with("postgres-exporter"))
        .map(|v| serde_json::to_value(v).unwrap())
        .collect()
}

#[test]
fn a_default_pool_pod_runs_the_exporter_as_the_fixture_says() {
    let pod = pool_pod(&shard(None));
    let expected: Value =
        serde_yaml::from_str(include_str!("../../fixtures/postgres-exporter.yaml")).unwrap();
    let actual = json!({
        "container": exporter(&pod).expect("an exporter container"),
        "volumes": volumes(&pod),
    });
    assert_eq!(actual, expected);
    let names: Vec<_> = pod.containers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["multipooler", "postgres-exporter"]);
}

#[test]
fn no_credential_reaches_a_command_line_or_an_environment_value() {
    let pod = pool_pod(&shard(None));
    let c = exporter(&pod).unwrap();
    let env: BTreeMap<_, _> = c
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.as_str(), e.value.as_deref().unwrap_or_default()))
        .collect();
    assert_eq!(
        env["DATA_SOURCE_PASS_FILE"],
        "/etc/postgres-exporter/password/password"
    );
    assert!(!env.contains_key("DATA_SOURCE_PASS"));
    assert!(!env.contains_key("DATA_SOURCE_NAME"));
    assert!(
        c.env
            .iter()
            .flatten()
            .all(|e| e.value_from.is_none() && !e.value.as_deref().unwrap().contains('@'))
    );
    let secret = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "postgres-exporter-password")
        .and_then(|v| v.secret.as_ref())
        .unwrap();
    assert_eq!(secret.secret_name.as_deref(), Some("prod-monitor-role"));
}

#[test]
fn turned_off_there_is_no_exporter_and_none_of_its_volumes() {
    let pod = pool_pod(&shard(Some("postgresExporter: {enabled: false}")));
    assert!(exporter(&pod).is_none());
    assert!(volumes(&pod).is_empty());
    assert_eq!(pod.containers.len(), 1);
}

#[test]
fn unset_there_is_no_exporter_so_an_upgrade_changes_no_pool_of_an_older_cluster() {
    let pod = pool_pod(&shard(Some("tracesSampler: always_on")));
    assert!(exporter(&pod).is_none());
    assert!(volumes(&pod).is_empty());
}

#[test]
fn custom_queries_are_an_optional_config_map_key_read_as_the_query_file() {
    let pod = pool_pod(&shard(Some(
        "postgresExporter: {enabled: true, customQueries: {name: my-queries, key: pg.yaml}}",
    )));
    let c = exporter(&pod).unwrap();
    assert!(
        c.args
            .iter()
            .flatten()
            .any(|a| a == "--extend.query-path=/etc/postgres-exporter/queries/queries.yaml")
    );
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "postgres-exporter-queries")
        .and_then(|v| v.config_map.as_ref())
        .unwrap();
    assert_eq!(volume.name, "my-queries");
    assert_eq!(
        volume.optional,
        Some(true),
        "PostgreSQL starts without them"
    );
    let item = &volume.items.as_ref().unwrap()[0];
    assert_eq!(
        (item.key.as_str(), item.path.as_str()),
        ("pg.yaml", "queries.yaml")
    );
    let mounted = c
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == "postgres-exporter-queries")
        .unwrap();
    assert_eq!(mounted.mount_path, "/etc/postgres-exporter/queries");
}

#[test]
fn an_unset_queries_key_is_the_default_file_name() {
    let config = PostgresExporterConfig {
        enabled: Some(true),
        custom_queries: Some(CustomQueriesRef {
            name: "q".into(),
            key: None,
        }),
        ..Default::default()
    };
    let observability = ObservabilityConfig {
        postgres_exporter: Some(config),
        ..Default::default()
    };
    let mut pod = PodSpec::default();
    add_to_pool_pod(
        &mut pod,
        "c",
        Some(&observability),
        "img",
        "Never".into(),
        RunAs {
            user: 999,
            group: 999,
        },
    );
    let volume = pod.volumes.unwrap().pop().unwrap();
    assert_eq!(
        volume.config_map.unwrap().items.unwrap()[0].key,
        "queries.yaml"
    );
}

#[test]
fn the_spec_can_pin_the_image_and_size_the_container() {
    let mut s = shard(Some(
        "postgresExporter: {enabled: true, resources: {limits: {memory: 64Mi}}}",
    ));
    s.spec.images.postgres_exporter = Some(multigres_api::v1alpha1::ImageRef::new(
        "registry.example/pgexp:v1",
    ));
    let pod = pool_pod(&s);
    let c = exporter(&pod).unwrap();
    assert_eq!(c.image.as_deref(), Some("registry.example/pgexp:v1"));
    let resources = c.resources.as_ref().unwrap();
    assert_eq!(resources.limits.as_ref().unwrap()["memory"].0, "64Mi");
    assert!(resources.requests.is_none());
}

#[test]
fn the_web_configuration_serves_the_mounted_certificate() {
    assert_eq!(
        web_config(),
        "# Written by the Multigres operator: postgres_exporter's TLS settings.\n\
         tls_server_config:\n  cert_file: /etc/postgres-exporter/tls/tls.crt\n  \
         key_file: /etc/postgres-exporter/tls/tls.key\n  min_version: TLS12\n"
    );
    let parsed: Value = serde_yaml::from_str(&web_config()).unwrap();
    assert_eq!(parsed["tls_server_config"]["min_version"], "TLS12");
    assert_eq!(
        server_name("prod", "db"),
        "postgres-exporter.prod.db.multigres.internal"
    );
    assert_eq!(ca_secret("prod"), "prod-postgres-exporter-ca");
    assert_eq!(tls_secret("prod"), "prod-postgres-exporter-tls");
    assert_eq!(config_map("prod"), "prod-postgres-exporter");
}

#[test]
fn the_published_config_map_holds_the_ca_and_the_web_configuration() {
    let s = shard(None);
    let owner = Owner::of(&s).unwrap();
    let labels = labels::labels("prod", Component::MetricsTls, &Placement::default());
    let map = published(&owner, &labels, "CA PEM");
    assert_eq!(map.metadata.name.as_deref(), Some("prod-postgres-exporter"));
    let data = map.data.unwrap();
    assert_eq!(data["ca.crt"], "CA PEM");
    assert_eq!(data["web-config.yaml"], web_config());
}
