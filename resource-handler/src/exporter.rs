//! postgres_exporter beside PostgreSQL in every pool pod (`spec.observability.postgresExporter`,
//! on by default): PostgreSQL's own metrics (connections and their limit, replication, WAL,
//! transactions, database sizes) for Prometheus.
//!
//! - It logs in as the cluster's monitoring role ([`MONITOR_ROLE`], a member of `pg_monitor`,
//!   no superuser) over PostgreSQL's Unix socket, with the password the operator generated in
//!   Secret `<cluster>-monitor-role` (see [`crate::role_secrets`]), which it reads from a file
//!   (`DATA_SOURCE_PASS_FILE`): no password on its command line or in its environment.
//! - It serves `/metrics` over TLS on port 9187 (`pg-metrics`) with a certificate from a CA of
//!   the cluster's own (`<cluster>-postgres-exporter-ca`), valid for [`server_name`]. The
//!   ConfigMap `<cluster>-postgres-exporter` publishes that CA (`ca.crt`) for Prometheus, and
//!   holds the exporter's web configuration (`web-config.yaml`). exporter-toolkit reads the
//!   certificate at every handshake, so a renewed one needs no restart.
//! - Its queries: the exporter's default collectors, plus the long-running-transactions one,
//!   plus the user's ConfigMap key `customQueries` (read at every scrape, so an edit needs no
//!   restart; mounted optional, so a missing one never keeps PostgreSQL from starting).
//!
//! The NetworkPolicy admitting its port is in [`crate::netpol`].

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapProjection, ConfigMapVolumeSource, Container, HTTPGetAction, KeyToPath,
    PodSpec, Probe, ProjectedVolumeSource, ResourceRequirements, SecretProjection,
    SecretVolumeSource, Volume, VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::Api;
use kube::{Resource, ResourceExt};
use multigres_api::labels::{self, Component, Placement};
use multigres_api::managed_roles::{self, PASSWORD_KEY};
use multigres_api::owner::Owner;
use multigres_api::resolver::defaults;
use multigres_api::v1alpha1::{
    MONITOR_ROLE, MultigresClusterSpec, ObservabilityConfig, PostgresExporterConfig,
};
use multigres_common::pki::workload::LeafSpec;
use time::OffsetDateTime;

use crate::contract::{POOLER_DIR, POSTGRES_EXPORTER_PORT, POSTGRES_PORT, flag};
use crate::controller::{Ctx, owned};
use crate::podspec::{RunAs, container_port, container_security, env, mount};
use crate::sync;
use crate::tls::{CA_CRT, SecretFor, TLS_CRT, TLS_KEY, TlsError};

/// The container's name.
pub const CONTAINER: &str = "postgres-exporter";
/// Name of its port (the one a PodMonitor names).
pub const PORT_NAME: &str = "pg-metrics";
/// Key of the exporter's web configuration in the published ConfigMap.
pub const WEB_CONFIG_KEY: &str = "web-config.yaml";
/// Where the exporter finds its certificate, key and web configuration.
const TLS_DIR: &str = "/etc/postgres-exporter/tls";
/// Where it finds the monitoring role's password.
const PASSWORD_DIR: &str = "/etc/postgres-exporter/password";
/// Where it finds the user's queries.
const QUERIES_DIR: &str = "/etc/postgres-exporter/queries";
/// The queries file inside [`QUERIES_DIR`].
const QUERIES_FILE: &str = "queries.yaml";
const TLS_VOLUME: &str = "postgres-exporter-tls";
const PASSWORD_VOLUME: &str = "postgres-exporter-password";
const QUERIES_VOLUME: &str = "postgres-exporter-queries";
/// The data volume, mounted read-only: PostgreSQL's socket directory is on it (pgctld puts the
/// sockets in `<pooler dir>/pg_sockets`).
const DATA_VOLUME: &str = crate::shard::build::DATA_VOLUME;
/// Collectors turned on besides the exporter's defaults (the long-transaction panel and alert
/// read them).
const EXTRA_COLLECTORS: [&str; 1] = ["collector.long_running_transactions"];

/// The DNS name in the exporters' certificate, which Prometheus checks (`serverName`): it
/// scrapes pod addresses, so the name is an identity, not a Service.
pub fn server_name(cluster: &str, namespace: &str) -> String {
    multigres_api::names::internal_identity("postgres-exporter", cluster, namespace)
}

/// The Secret holding the cluster's exporter CA (with its key).
pub fn ca_secret(cluster: &str) -> String {
    multigres_api::names::join(
        &[cluster, "postgres-exporter-ca"],
        multigres_api::names::MAX_DNS_LABEL,
    )
}

/// The Secret holding the exporters' certificate and key.
pub fn tls_secret(cluster: &str) -> String {
    multigres_api::names::join(
        &[cluster, "postgres-exporter-tls"],
        multigres_api::names::MAX_DNS_LABEL,
    )
}

/// The ConfigMap publishing the CA (`ca.crt`) and holding the web configuration.
pub fn config_map(cluster: &str) -> String {
    multigres_api::names::join(
        &[cluster, "postgres-exporter"],
        multigres_api::names::MAX_DNS_LABEL,
    )
}

/// The exporter's web configuration: serve TLS only, with the mounted certificate.
pub fn web_config() -> String {
    format!(
        "# Written by the Multigres operator: postgres_exporter's TLS settings.\n\
         tls_server_config:\n  cert_file: {TLS_DIR}/{TLS_CRT}\n  key_file: {TLS_DIR}/{TLS_KEY}\n  \
         min_version: TLS12\n"
    )
}

/// The exporter settings of `config`, when the exporter runs.
fn settings(config: Option<&ObservabilityConfig>) -> Option<PostgresExporterConfig> {
    PostgresExporterConfig::enabled(config).then(|| {
        config
            .and_then(|c| c.postgres_exporter.clone())
            .unwrap_or_default()
    })
}

fn default_resources() -> ResourceRequirements {
    let q = |v: &str| Quantity(v.to_owned());
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".to_owned(), q("10m")),
            ("memory".to_owned(), q("32Mi")),
        ])),
        limits: Some(BTreeMap::from([("memory".to_owned(), q("128Mi"))])),
        ..Default::default()
    }
}

/// The exporter's command line.
pub fn args(config: &PostgresExporterConfig) -> Vec<String> {
    let mut args = vec![
        flag("web.listen-address", format!(":{POSTGRES_EXPORTER_PORT}")),
        flag("web.config.file", format!("{TLS_DIR}/{WEB_CONFIG_KEY}")),
    ];
    args.extend(EXTRA_COLLECTORS.iter().map(|c| format!("--{c}")));
    if config.custom_queries.is_some() {
        args.push(flag(
            "extend.query-path",
            format!("{QUERIES_DIR}/{QUERIES_FILE}"),
        ));
    }
    args
}

/// An HTTPS probe of the exporter's landing page, which answers without asking PostgreSQL
/// (the kubelet does not verify the certificate; a bare TCP probe would leave a TLS handshake
/// error in the exporter's log at every period).
fn liveness_probe() -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some("/".to_owned()),
            port: IntOrString::Int(POSTGRES_EXPORTER_PORT),
            scheme: Some("HTTPS".to_owned()),
            ..Default::default()
        }),
        period_seconds: Some(10),
        timeout_seconds: Some(3),
        success_threshold: Some(1),
        failure_threshold: Some(3),
        ..Default::default()
    }
}

/// Adds the exporter container and its volumes to pool pod `pod` of cluster `cluster` in
/// `namespace`, when `config` runs it. It runs as PostgreSQL's user `identity` (the socket
/// directory is PostgreSQL's), with a read-only root file system.
pub fn add_to_pool_pod(
    pod: &mut PodSpec,
    cluster: &str,
    config: Option<&ObservabilityConfig>,
    image: &str,
    pull_policy: String,
    identity: RunAs,
) {
    let Some(settings) = settings(config) else {
        return;
    };
    let mut mounts = vec![
        mount(DATA_VOLUME, POOLER_DIR, true),
        mount(TLS_VOLUME, TLS_DIR, true),
        mount(PASSWORD_VOLUME, PASSWORD_DIR, true),
    ];
    let mut volumes = vec![
        Volume {
            name: TLS_VOLUME.to_owned(),
            projected: Some(ProjectedVolumeSource {
                default_mode: Some(0o440),
                sources: Some(vec![
                    VolumeProjection {
                        secret: Some(SecretProjection {
                            name: tls_secret(cluster),
                            items: Some(vec![key(TLS_CRT, TLS_CRT), key(TLS_KEY, TLS_KEY)]),
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                    VolumeProjection {
                        config_map: Some(ConfigMapProjection {
                            name: config_map(cluster),
                            items: Some(vec![key(WEB_CONFIG_KEY, WEB_CONFIG_KEY)]),
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                ]),
            }),
            ..Default::default()
        },
        Volume {
            name: PASSWORD_VOLUME.to_owned(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(multigres_api::names::monitor_role_secret(cluster)),
                items: Some(vec![key(PASSWORD_KEY, PASSWORD_KEY)]),
                default_mode: Some(0o440),
                ..Default::default()
            }),
            ..Default::default()
        },
    ];
    if let Some(queries) = &settings.custom_queries {
        volumes.push(Volume {
            name: QUERIES_VOLUME.to_owned(),
            config_map: Some(ConfigMapVolumeSource {
                name: queries.name.clone(),
                items: Some(vec![key(
                    queries
                        .key
                        .as_deref()
                        .unwrap_or(defaults::EXPORTER_QUERIES_KEY),
                    QUERIES_FILE,
                )]),
                // The database starts without the user's queries rather than not at all.
                optional: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        });
        mounts.push(mount(QUERIES_VOLUME, QUERIES_DIR, true));
    }
    let socket_dir = format!("{POOLER_DIR}/pg_sockets");
    let container = Container {
        name: CONTAINER.to_owned(),
        image: Some(image.to_owned()),
        image_pull_policy: Some(pull_policy),
        args: Some(args(&settings)),
        env: Some(vec![
            env(
                "DATA_SOURCE_URI",
                format!("localhost:{POSTGRES_PORT}/postgres?host={socket_dir}&sslmode=disable"),
            ),
            env("DATA_SOURCE_USER", MONITOR_ROLE),
            env(
                "DATA_SOURCE_PASS_FILE",
                format!("{PASSWORD_DIR}/{PASSWORD_KEY}"),
            ),
        ]),
        ports: Some(vec![container_port(PORT_NAME, POSTGRES_EXPORTER_PORT)]),
        resources: Some(settings.resources.clone().unwrap_or_else(default_resources)),
        // No readiness probe: a pool pod's readiness is PostgreSQL's, and the exporter reports
        // an unreachable database as `pg_up 0` rather than going away.
        liveness_probe: Some(liveness_probe()),
        security_context: Some(container_security(identity, true)),
        volume_mounts: Some(mounts),
        ..Default::default()
    };
    pod.containers.push(container);
    pod.volumes.get_or_insert_default().extend(volumes);
}

fn key(key: &str, path: &str) -> KeyToPath {
    KeyToPath {
        key: key.to_owned(),
        path: path.to_owned(),
        ..Default::default()
    }
}

/// The published ConfigMap: the CA certificate for Prometheus and the exporter's web
/// configuration.
fn published(owner: &Owner, labels: &BTreeMap<String, String>, ca_cert: &str) -> ConfigMap {
    ConfigMap {
        metadata: crate::stateless::metadata(&config_map(&owner.cluster), owner, labels),
        data: Some(BTreeMap::from([
            (CA_CRT.to_owned(), ca_cert.to_owned()),
            (WEB_CONFIG_KEY.to_owned(), web_config()),
        ])),
        ..Default::default()
    }
}

/// Issues (or keeps) the exporters' CA and certificate of a cluster whose pool pods run the
/// exporter and publishes the CA with the web configuration; removes them all when the
/// exporter is off. Returns the certificates made or replaced, for
/// [`crate::tls::announce_issued`].
pub async fn reconcile<K>(
    ctx: &Ctx<K>,
    owner: &Owner,
    cluster: &MultigresClusterSpec,
) -> Result<Vec<String>, TlsError>
where
    K: Resource<DynamicType = ()>,
{
    let component = Component::MetricsTls;
    let ns = owner.namespace.as_str();
    let config_maps = Api::<ConfigMap>::namespaced(ctx.client.clone(), ns);
    let published_name = config_map(&owner.cluster);
    if !managed_roles::monitoring(cluster) {
        crate::tls::prune(ctx, owner, component, &BTreeSet::new()).await?;
        // The cache keeps no labels of ConfigMaps: the published one is told by its name.
        let ours: Vec<_> = owned(&ctx.stores.config_maps, ns, owner.uid())
            .into_iter()
            .filter(|c| c.name_any() == published_name)
            .collect();
        sync::prune(ctx.kit.name, &config_maps, &ours, &BTreeSet::new()).await?;
        return Ok(Vec::new());
    }
    let labels = labels::labels(&owner.cluster, component, &Placement::default());
    let name = server_name(&owner.cluster, ns);
    let leaf = SecretFor {
        name: tls_secret(&owner.cluster),
        spec: LeafSpec::new(name.clone(), [name]),
    };
    let issued = crate::tls::plan(
        owner,
        &labels,
        &ca_secret(&owner.cluster),
        &format!("Multigres postgres_exporter CA {}.{ns}", owner.cluster),
        &[leaf],
        crate::tls::cached(ctx, ns),
        OffsetDateTime::now_utc(),
    )?;
    let ca_cert = issued
        .secrets
        .first()
        .and_then(|ca| crate::tls::stored_pair(Some(ca), CA_CRT, crate::tls::CA_KEY))
        .map(|pair| pair.cert)
        .unwrap_or_default();
    let changes = crate::tls::store(ctx, owner, component, issued).await?;
    let map = published(owner, &labels, &ca_cert);
    sync::ensure(ctx.kit.name, &config_maps, &ctx.stores.config_maps, map).await?;
    Ok(changes)
}

#[cfg(test)]
mod tests;
