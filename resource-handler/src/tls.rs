//! TLS material of the workloads, issued by the operator itself (no cert-manager):
//!
//! - internal mutual TLS (`spec.internalTLS.enabled` for gRPC, `spec.internalTLS.topology` for
//!   etcd): a CA per MultigresCluster and one certificate per process kind, in Secrets named
//!   like the certificate, `<process>.<cluster>.<namespace>.multigres.internal`, mounted at
//!   [`TLS_DIR`] in the multiadmin, multigateway, multiorch and multipooler pods, which get the
//!   gRPC and etcd client TLS flags of the hops that are on; one more for the managed etcd
//!   members ([`etcd_identity`]) and one for the data-handler's client;
//! - client TLS of the gateways (on unless `spec.gatewayTLS.enabled: false`): a CA per
//!   MultigresCluster (`<cluster>-gateway-ca`, its certificate also published for applications
//!   in the ConfigMap of that name) and one certificate (`<cluster>-gateway-tls`) for every
//!   gateway Service name and `spec.certCommonName`, mounted at [`GATEWAY_TLS_DIR`];
//! - pgBackRest TLS per shard when backups are on and no Secret is named: a CA
//!   (`<shard>-pgbackrest-ca`) and a certificate (`<shard>-pgbackrest-tls`) every pool pod
//!   mounts at [`PGBACKREST_CERT_DIR`]; a named Secret is checked for its three keys instead.
//!
//! Certificates are kept while they are good (see [`multigres_common::pki::workload`]), so a
//! reconcile with nothing changed writes nothing; they are replaced when they near their end,
//! when their names no longer match the Services, or when their CA changed.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{
    ConfigMap, KeyToPath, PodSpec, ProjectedVolumeSource, Secret, SecretProjection,
    SecretVolumeSource, Volume, VolumeMount, VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::Api;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use multigres_api::labels::{self, COMPONENT, Component, Placement};
use multigres_api::owner::Owner;
use multigres_api::resolver::{GlobalTopo, ResolvedCluster};
use multigres_api::v1alpha1::{
    BackupConfig, GatewayTlsConfig, GlobalTopoServerRef, InternalTlsConfig, MultigresClusterSpec,
    ShardSpec,
};
use multigres_common::pki::workload::{self, LeafSpec, Outcome};
use multigres_common::pki::{Pair, PkiError};
use time::OffsetDateTime;

use crate::conditions::{Computed, FALSE, TRUE};
use crate::contract::{PGBACKREST_CERT_DIR, flag};
use crate::controller::{Ctx, owned};
use crate::podspec::mount;
use crate::sync::{self, SyncError};

/// Where a process finds its internal certificate, key and the cluster CA.
pub const TLS_DIR: &str = "/etc/multigres/tls";
/// The volume holding them.
pub const TLS_VOLUME: &str = "internal-tls";
/// Where a process finds an external topology server's CA and its client certificate.
pub const TOPO_TLS_DIR: &str = "/etc/multigres/topo-tls";
/// The volume holding them.
const TOPO_TLS_VOLUME: &str = "topo-tls";
/// Where multigateway finds the certificate and key it serves to PostgreSQL clients.
pub const GATEWAY_TLS_DIR: &str = "/etc/multigres/gateway-tls";
/// The volume holding them.
pub const GATEWAY_TLS_VOLUME: &str = "gateway-tls";
/// Pod-template annotation of the gateways: a digest of the certificate they serve.
/// multigateway reads its certificate once, at start, so a new one rolls the gateways.
pub const GATEWAY_CERT_ANNOTATION: &str = "multigres.com/gateway-certificate";
/// pgBackRest certificates volume of pool pods.
pub const PGBACKREST_VOLUME: &str = "pgbackrest-certs";
/// Condition type reporting a shard's pgBackRest TLS material.
pub const PGBACKREST_TLS: &str = "PgBackRestTLSReady";
/// CA certificate key of every TLS Secret.
pub const CA_CRT: &str = "ca.crt";
/// CA private key (only in CA Secrets).
pub const CA_KEY: &str = "ca.key";
/// Certificate key of leaf Secrets (`kubernetes.io/tls`).
pub const TLS_CRT: &str = "tls.crt";
/// Private key of leaf Secrets.
pub const TLS_KEY: &str = "tls.key";
/// How soon a user's missing or incomplete pgBackRest Secret is looked at again (it is read
/// directly, not watched).
pub const RECHECK: Duration = Duration::from_secs(30);
/// Longest Secret name (a DNS subdomain).
const MAX_SECRET_NAME: usize = 253;

/// Name of the managed etcd servers in their internal identity.
const ETCD: &str = "etcd";

/// The Multigres processes that take part in internal mutual TLS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Process {
    /// The cluster's admin API.
    Multiadmin,
    /// A cell's PostgreSQL gateway.
    Multigateway,
    /// A shard's orchestrator in one cell.
    Multiorch,
    /// The pooler next to each PostgreSQL.
    Multipooler,
}

impl Process {
    /// Every process with an internal certificate.
    pub const ALL: [Process; 4] = [
        Process::Multiadmin,
        Process::Multigateway,
        Process::Multiorch,
        Process::Multipooler,
    ];

    /// The binary and container name.
    pub fn as_str(self) -> &'static str {
        match self {
            Process::Multiadmin => "multiadmin",
            Process::Multigateway => "multigateway",
            Process::Multiorch => "multiorch",
            Process::Multipooler => "multipooler",
        }
    }
}

/// The identity of `process` in `cluster`: its certificate's common name and Secret name.
pub fn identity(process: Process, cluster: &str, namespace: &str) -> String {
    multigres_api::names::internal_identity(process.as_str(), cluster, namespace)
}

/// The Secret holding the cluster's internal CA.
pub fn internal_ca_secret(cluster: &str) -> String {
    format!("{cluster}-internal-tls-ca")
}

/// Every Secret name internal TLS of `cluster` needs must fit in 253 characters.
pub fn check_internal_names(cluster: &str, namespace: &str) -> Result<(), String> {
    let longest = identity(Process::Multigateway, cluster, namespace);
    if longest.len() > MAX_SECRET_NAME {
        return Err(format!(
            "spec.internalTLS.enabled: the certificate Secret {longest} would be {} characters, \
             more than the {MAX_SECRET_NAME} a Secret name allows; shorten the cluster name",
            longest.len()
        ));
    }
    Ok(())
}

/// The names a client may use for a Service in `namespace`.
fn service_names(service: &str, namespace: &str) -> [String; 3] {
    [
        format!("{service}.{namespace}"),
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
    ]
}

/// The names of the pods behind a headless Service (`<pod>.<service>.<namespace>.svc`).
fn pod_wildcards(service: &str, namespace: &str) -> [String; 2] {
    [
        format!("*.{service}.{namespace}.svc"),
        format!("*.{service}.{namespace}.svc.cluster.local"),
    ]
}

/// The certificate each process of a resolved cluster needs: its identity (what clients verify
/// with `--multipooler-grpc-server-name`) and the DNS names of its Services and pods.
pub fn internal_leaf_specs(
    cluster: &str,
    namespace: &str,
    resolved: &ResolvedCluster,
) -> Vec<(Process, LeafSpec)> {
    let mut names: BTreeMap<&'static str, BTreeSet<String>> = BTreeMap::new();
    let mut add = |process: Process, more: &[String]| {
        names
            .entry(process.as_str())
            .or_default()
            .extend(more.iter().cloned());
    };
    add(
        Process::Multiadmin,
        &service_names(&crate::names::multiadmin(cluster), namespace),
    );
    // multigateway forwards cancel requests to other gateways with its multipooler client
    // settings, so its certificate also carries the multipooler identity.
    add(
        Process::Multigateway,
        &[identity(Process::Multipooler, cluster, namespace)],
    );
    for cell in &resolved.cells {
        let cell_cr = multigres_api::names::cell(cluster, cell.spec.name.as_str());
        let service = crate::names::multigateway(&cell_cr);
        add(Process::Multigateway, &service_names(&service, namespace));
    }
    for tg in &resolved.table_groups {
        for shard in &tg.shards {
            let shard_cr = multigres_api::names::shard(
                cluster,
                tg.database_name.as_str(),
                tg.table_group_name.as_str(),
                &shard.name,
            );
            let pool_cells: BTreeSet<&str> = shard
                .pools
                .values()
                .flat_map(|p| p.cells.iter().map(|c| c.as_str()))
                .collect();
            let orch_cells: BTreeSet<&str> = if shard.multiorch.cells.is_empty() {
                pool_cells
            } else {
                shard.multiorch.cells.iter().map(|c| c.as_str()).collect()
            };
            for cell in orch_cells {
                let service = crate::names::multiorch(&shard_cr, cell);
                add(Process::Multiorch, &service_names(&service, namespace));
            }
            for (pool_name, pool) in &shard.pools {
                for cell in &pool.cells {
                    let service = crate::names::pool(&shard_cr, pool_name.as_str(), cell.as_str());
                    add(Process::Multipooler, &service_names(&service, namespace));
                    add(Process::Multipooler, &pod_wildcards(&service, namespace));
                }
            }
        }
    }
    Process::ALL
        .into_iter()
        .map(|process| {
            let id = identity(process, cluster, namespace);
            let mut dns = names.remove(process.as_str()).unwrap_or_default();
            dns.insert(id.clone());
            (process, LeafSpec::new(id, dns))
        })
        .collect()
}

/// The identity of the managed etcd servers of `cluster`: their certificate's common name and
/// Secret name.
pub fn etcd_identity(cluster: &str, namespace: &str) -> String {
    multigres_api::names::internal_identity(ETCD, cluster, namespace)
}

/// The certificate every managed etcd member of a resolved cluster serves to clients and
/// presents to its peers: the client Service names of each TopoServer (the global one and every
/// cell's own) and its members' names behind the peer Service.
pub fn etcd_leaf_spec(cluster: &str, namespace: &str, resolved: &ResolvedCluster) -> LeafSpec {
    let global = matches!(resolved.global_topo, GlobalTopo::Managed(_))
        .then(|| multigres_api::names::global_topo_server(cluster));
    let cells = resolved
        .cells
        .iter()
        .filter(|c| c.local_topo.is_some())
        .map(|c| multigres_api::names::local_topo_server(cluster, c.spec.name.as_str()));
    let id = etcd_identity(cluster, namespace);
    let mut dns = BTreeSet::from([id.clone()]);
    for topo_server in global.into_iter().chain(cells) {
        let client = crate::names::topo_client_service(&topo_server);
        dns.extend(service_names(&client, namespace));
        let peer = multigres_api::names::topo_peer_service(&topo_server);
        dns.extend(pod_wildcards(&peer, namespace));
    }
    LeafSpec::new(id, dns)
}

/// The Secret holding a shard's generated pgBackRest CA.
pub fn pgbackrest_ca_secret(shard: &str) -> String {
    format!("{shard}-pgbackrest-ca")
}

/// The Secret holding a shard's generated pgBackRest certificate.
pub fn pgbackrest_tls_secret(shard: &str) -> String {
    format!("{shard}-pgbackrest-tls")
}

/// The Secret the user named for pgBackRest TLS, if any.
pub fn user_pgbackrest_secret(backup: &BackupConfig) -> Option<&str> {
    backup
        .pgbackrest_tls
        .as_ref()
        .and_then(|t| t.secret_name.as_deref())
        .filter(|name| !name.is_empty())
}

/// The pgBackRest certificate of the Shard `shard`: pgBackRest servers of every pool pod
/// present it to each other, so it names every pool pod.
pub fn pgbackrest_leaf_spec(shard: &str, namespace: &str, spec: &ShardSpec) -> LeafSpec {
    let mut dns = vec![
        format!("pgbackrest.{namespace}.svc"),
        format!("pgbackrest.{namespace}.svc.cluster.local"),
    ];
    for (pool_name, pool) in &spec.pools {
        for cell in &pool.cells {
            let service = crate::names::pool(shard, pool_name.as_str(), cell.as_str());
            dns.extend(pod_wildcards(&service, namespace));
        }
    }
    LeafSpec::new("pgbackrest", dns)
}

fn key(key: &str, path: &str) -> KeyToPath {
    KeyToPath {
        key: key.to_owned(),
        path: path.to_owned(),
        ..Default::default()
    }
}

fn projection(secret: &str, items: Vec<KeyToPath>) -> VolumeProjection {
    VolumeProjection {
        secret: Some(SecretProjection {
            name: secret.to_owned(),
            items: Some(items),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The pgBackRest certificates of a pool pod (`ca.crt`, `pgbackrest.crt`, `pgbackrest.key`,
/// the names pgctld and multipooler read), from the user's Secret or the generated pair.
pub fn pgbackrest_volume(shard: &str, backup: &BackupConfig) -> Volume {
    let sources = match user_pgbackrest_secret(backup) {
        Some(name) => vec![projection(
            name,
            vec![
                key(CA_CRT, "ca.crt"),
                key(TLS_CRT, "pgbackrest.crt"),
                key(TLS_KEY, "pgbackrest.key"),
            ],
        )],
        None => vec![
            projection(&pgbackrest_ca_secret(shard), vec![key(CA_CRT, "ca.crt")]),
            projection(
                &pgbackrest_tls_secret(shard),
                vec![
                    key(TLS_CRT, "pgbackrest.crt"),
                    key(TLS_KEY, "pgbackrest.key"),
                ],
            ),
        ],
    };
    Volume {
        name: PGBACKREST_VOLUME.to_owned(),
        projected: Some(ProjectedVolumeSource {
            default_mode: Some(0o440),
            sources: Some(sources),
        }),
        ..Default::default()
    }
}

/// The read-only mount of [`pgbackrest_volume`].
pub fn pgbackrest_mount() -> VolumeMount {
    mount(PGBACKREST_VOLUME, PGBACKREST_CERT_DIR, true)
}

/// Server flags of every process with an internal certificate: serve gRPC with it, require
/// client certificates of the cluster CA, and send the CA along with the chain.
fn server_flags() -> [String; 4] {
    [
        flag("grpc-cert", format!("{TLS_DIR}/{TLS_CRT}")),
        flag("grpc-key", format!("{TLS_DIR}/{TLS_KEY}")),
        flag("grpc-ca", format!("{TLS_DIR}/{CA_CRT}")),
        flag("grpc-server-ca", format!("{TLS_DIR}/{CA_CRT}")),
    ]
}

/// Client flags of the processes that dial multipooler: present the certificate, trust only
/// the cluster CA, and verify the poolers by their shared identity.
fn multipooler_client_flags(cluster: &str, namespace: &str) -> [String; 5] {
    [
        flag("multipooler-grpc-cert", format!("{TLS_DIR}/{TLS_CRT}")),
        flag("multipooler-grpc-key", format!("{TLS_DIR}/{TLS_KEY}")),
        flag("multipooler-grpc-ca", format!("{TLS_DIR}/{CA_CRT}")),
        flag(
            "multipooler-grpc-server-name",
            identity(Process::Multipooler, cluster, namespace),
        ),
        flag("multipooler-grpc-require-tls", true),
    ]
}

/// Client flags of a topology client: present the certificate in `dir` to etcd and, `with_ca`,
/// trust only the CA there. Multigres applies them to every etcd the process dials.
fn topology_client_flags(dir: &str, with_ca: bool) -> Vec<String> {
    let mut args = vec![
        flag("topo-etcd-tls-cert", format!("{dir}/{TLS_CRT}")),
        flag("topo-etcd-tls-key", format!("{dir}/{TLS_KEY}")),
    ];
    if with_ca {
        args.push(flag("topo-etcd-tls-ca", format!("{dir}/{CA_CRT}")));
    }
    args
}

/// Which hops of a process its internal certificate secures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Uses {
    /// gRPC between Multigres processes (`internalTLS.enabled`).
    pub grpc: bool,
    /// The process's etcd connections (`internalTLS.topology`).
    pub topology: bool,
}

impl Uses {
    /// What the cluster's `internalTLS` turns on.
    pub fn of(config: Option<&InternalTlsConfig>) -> Self {
        Self {
            grpc: InternalTlsConfig::is_enabled(config),
            topology: InternalTlsConfig::topology_enabled(config),
        }
    }
}

/// The TLS flags of `process` for the hops in `uses`.
pub fn flags(process: Process, cluster: &str, namespace: &str, uses: Uses) -> Vec<String> {
    let mut args = Vec::new();
    if uses.grpc {
        args.extend(server_flags());
        if process != Process::Multipooler {
            args.extend(multipooler_client_flags(cluster, namespace));
        }
    }
    if uses.topology {
        args.extend(topology_client_flags(TLS_DIR, true));
    }
    args
}

/// Mounts the internal certificate of `process` into `pod` and appends its TLS flags for the
/// hops in `uses` to the container of that name; nothing when `uses` has none.
pub fn mount_internal(
    pod: &mut PodSpec,
    process: Process,
    cluster: &str,
    namespace: &str,
    uses: Uses,
) {
    if uses == Uses::default() {
        return;
    }
    pod.volumes.get_or_insert_default().push(Volume {
        name: TLS_VOLUME.to_owned(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(identity(process, cluster, namespace)),
            default_mode: Some(0o440),
            ..Default::default()
        }),
        ..Default::default()
    });
    let containers = pod.containers.iter_mut();
    for container in containers.filter(|c| c.name == process.as_str()) {
        container
            .volume_mounts
            .get_or_insert_default()
            .push(mount(TLS_VOLUME, TLS_DIR, true));
        container
            .args
            .get_or_insert_default()
            .extend(flags(process, cluster, namespace, uses));
    }
}

/// Mounts an external topology server's Secrets (`topo.ca_secret` as `ca.crt`,
/// `topo.client_cert_secret` as `tls.crt` and `tls.key`) at [`TOPO_TLS_DIR`] and gives the
/// container of `process` the `--topo-etcd-tls-*` flags; nothing when the server takes no
/// client certificate (Multigres dials etcd over TLS only with one).
pub fn mount_external_topology(pod: &mut PodSpec, process: Process, topo: &GlobalTopoServerRef) {
    let Some(client_cert) = &topo.client_cert_secret else {
        return;
    };
    let mut sources = vec![projection(
        client_cert,
        vec![key(TLS_CRT, TLS_CRT), key(TLS_KEY, TLS_KEY)],
    )];
    if let Some(ca) = &topo.ca_secret {
        sources.push(projection(ca, vec![key(CA_CRT, CA_CRT)]));
    }
    let args = topology_client_flags(TOPO_TLS_DIR, topo.ca_secret.is_some());
    pod.volumes.get_or_insert_default().push(Volume {
        name: TOPO_TLS_VOLUME.to_owned(),
        projected: Some(ProjectedVolumeSource {
            default_mode: Some(0o440),
            sources: Some(sources),
        }),
        ..Default::default()
    });
    for container in pod
        .containers
        .iter_mut()
        .filter(|c| c.name == process.as_str())
    {
        container.volume_mounts.get_or_insert_default().push(mount(
            TOPO_TLS_VOLUME,
            TOPO_TLS_DIR,
            true,
        ));
        container.args.get_or_insert_default().extend(args.clone());
    }
}

/// The TLS of `process` in `pod`: its internal certificate for the hops `internal` turns on
/// ([`mount_internal`]) and an external topology server's client certificate
/// ([`mount_external_topology`]); the resolver lets at most one of them reach etcd.
pub fn mount_process_tls(
    pod: &mut PodSpec,
    process: Process,
    owner: &Owner,
    internal: Option<&InternalTlsConfig>,
    topo: &GlobalTopoServerRef,
) {
    let uses = Uses::of(internal);
    mount_internal(pod, process, &owner.cluster, &owner.namespace, uses);
    mount_external_topology(pod, process, topo);
}

/// [`mount_process_tls`] on the pod template of a Deployment.
pub fn mount_process_tls_deployment(
    deployment: &mut Deployment,
    process: Process,
    owner: &Owner,
    internal: Option<&InternalTlsConfig>,
    topo: &GlobalTopoServerRef,
) {
    if let Some(pod) = deployment
        .spec
        .as_mut()
        .and_then(|s| s.template.spec.as_mut())
    {
        mount_process_tls(pod, process, owner, internal, topo);
    }
}

/// The PEM stored under `cert_key` and `key_key` of a Secret, when both are there.
pub fn stored_pair(secret: Option<&Secret>, cert_key: &str, key_key: &str) -> Option<Pair> {
    let data = secret?.data.as_ref()?;
    let text = |k: &str| {
        data.get(k)
            .and_then(|v| String::from_utf8(v.0.clone()).ok())
    };
    Some(Pair {
        cert: text(cert_key)?,
        key: text(key_key)?,
    })
}

/// One Secret this handler issues certificates into.
#[derive(Clone, Debug)]
pub struct SecretFor {
    /// Secret name.
    pub name: String,
    /// What the certificate must say.
    pub spec: LeafSpec,
}

/// What a set of certificates should be stored as, and what changed.
#[derive(Clone, Debug, Default)]
pub struct Issued {
    /// The desired Secrets (the CA first).
    pub secrets: Vec<Secret>,
    /// One line per certificate made or replaced, for events.
    pub changes: Vec<String>,
}

fn secret_object(
    name: &str,
    owner: &Owner,
    labels: &BTreeMap<String, String>,
    type_: &str,
    data: [(&str, &str); 2],
    ca: Option<&str>,
) -> Secret {
    let mut entries: BTreeMap<String, ByteString> = data
        .iter()
        .map(|(k, v)| ((*k).to_owned(), ByteString(v.as_bytes().to_vec())))
        .collect();
    if let Some(ca) = ca {
        entries.insert(CA_CRT.to_owned(), ByteString(ca.as_bytes().to_vec()));
    }
    Secret {
        metadata: crate::stateless::metadata(name, owner, labels),
        type_: Some(type_.to_owned()),
        data: Some(entries),
        ..Default::default()
    }
}

fn note(what: &str, outcome: &Outcome) -> Option<String> {
    match outcome {
        Outcome::Kept => None,
        Outcome::Created => Some(format!("issued {what}")),
        Outcome::Replaced(why) => Some(format!("replaced {what}: {why}")),
    }
}

/// The Secrets of a CA named `ca_name` (common name `ca_common_name`) and of the leaves it
/// signs, keeping every stored certificate that is still good. `stored` looks a Secret up by
/// name. Pure apart from fresh key material.
pub fn plan(
    owner: &Owner,
    labels: &BTreeMap<String, String>,
    ca_name: &str,
    ca_common_name: &str,
    leaves: &[SecretFor],
    stored: impl Fn(&str) -> Option<Secret>,
    now: OffsetDateTime,
) -> Result<Issued, PkiError> {
    let mut issued = Issued::default();
    let stored_ca = stored_pair(stored(ca_name).as_ref(), CA_CRT, CA_KEY);
    let (ca, outcome) = workload::ensure_ca(stored_ca, ca_common_name, now)?;
    issued
        .changes
        .extend(note(&format!("the CA in Secret {ca_name}"), &outcome));
    issued.secrets.push(secret_object(
        ca_name,
        owner,
        labels,
        "Opaque",
        [(CA_CRT, &ca.cert), (CA_KEY, &ca.key)],
        None,
    ));
    for leaf in leaves {
        let stored_secret = stored(&leaf.name);
        let previous = stored_pair(stored_secret.as_ref(), TLS_CRT, TLS_KEY);
        let (pair, outcome) = workload::ensure_leaf(previous, &ca, &leaf.spec, now)?;
        issued.changes.extend(note(
            &format!("the certificate in Secret {}", leaf.name),
            &outcome,
        ));
        issued.secrets.push(secret_object(
            &leaf.name,
            owner,
            labels,
            "kubernetes.io/tls",
            [(TLS_CRT, &pair.cert), (TLS_KEY, &pair.key)],
            Some(&ca.cert),
        ));
    }
    Ok(issued)
}

/// Why a Secret's certificates could not be issued or stored.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The certificate Secrets cannot be named (see [`check_internal_names`]).
    #[error("{0}")]
    InvalidSpec(String),
    /// Key generation or signing failed.
    #[error("issuing certificates")]
    Issue(#[from] PkiError),
    /// Writing a Secret failed.
    #[error(transparent)]
    Sync(#[from] SyncError),
    /// The gateway's cert-manager Certificate could not be written.
    #[error(transparent)]
    CertManager(#[from] cert_manager::CertManagerError),
}

impl TlsError {
    /// Only names that cannot fit need a spec change; the rest is retried.
    pub fn is_invalid_spec(&self) -> bool {
        matches!(self, TlsError::InvalidSpec(_))
    }
}

/// Applies what [`plan`] decided (only Secrets that changed are written) and deletes the
/// Secrets of `component` that `owner` no longer needs; returns the certificates made or
/// replaced, for [`announce_issued`].
pub async fn store<K>(
    ctx: &Ctx<K>,
    owner: &Owner,
    component: Component,
    issued: Issued,
) -> Result<Vec<String>, SyncError>
where
    K: Resource<DynamicType = ()>,
{
    let api = Api::<Secret>::namespaced(ctx.client.clone(), &owner.namespace);
    let keep: BTreeSet<String> = issued.secrets.iter().map(|s| s.name_any()).collect();
    for secret in issued.secrets {
        sync::ensure(ctx.kit.name, &api, &ctx.stores.secrets, secret).await?;
    }
    prune(ctx, owner, component, &keep).await?;
    for change in &issued.changes {
        tracing::info!(name = %owner.name, namespace = %owner.namespace, "{change}");
    }
    Ok(issued.changes)
}

/// Reports the certificates one reconcile made or replaced (from [`store`], for every
/// component it issues) as one event on `obj`. An event per certificate was one Event patched
/// into a series per certificate (eleven for a cluster's internal TLS), a write each, whose
/// note kept only the last: 1,300 of the resource-handler's 8,300 writes while 100 clusters
/// converged.
pub async fn announce_issued<K>(ctx: &Ctx<K>, obj: &K, changes: &[String])
where
    K: Resource<DynamicType = ()>,
{
    if !changes.is_empty() {
        ctx.kit
            .event(
                obj,
                EventType::Normal,
                "CertificateIssued",
                changes.join("; "),
            )
            .await;
    }
}

/// Deletes the Secrets of `component` owned by `owner` whose names are not in `keep`.
pub async fn prune<K>(
    ctx: &Ctx<K>,
    owner: &Owner,
    component: Component,
    keep: &BTreeSet<String>,
) -> Result<(), SyncError>
where
    K: Resource<DynamicType = ()>,
{
    let api = Api::<Secret>::namespaced(ctx.client.clone(), &owner.namespace);
    let ours: Vec<_> = owned(&ctx.stores.secrets, &owner.namespace, owner.uid())
        .into_iter()
        .filter(|s| s.labels().get(COMPONENT).map(String::as_str) == Some(component.as_str()))
        .collect();
    sync::prune(ctx.kit.name, &api, &ours, keep).await?;
    Ok(())
}

/// The cached Secret `name` in `namespace` (only Secrets this operator labels are cached).
pub fn cached<K: Resource<DynamicType = ()>>(
    ctx: &Ctx<K>,
    namespace: &str,
) -> impl Fn(&str) -> Option<Secret> {
    let store = ctx.stores.secrets.clone();
    let namespace = namespace.to_owned();
    move |name| {
        store
            .get(&ObjectRef::new(name).within(&namespace))
            .map(|s| (*s).clone())
    }
}

/// Issues (or keeps) the internal CA and process certificates of a cluster whose internal TLS
/// is on, and removes them when it is off.
pub async fn reconcile_internal<K>(
    ctx: &Ctx<K>,
    owner: &Owner,
    resolved: &ResolvedCluster,
    config: Option<&InternalTlsConfig>,
) -> Result<Vec<String>, TlsError>
where
    K: Resource<DynamicType = ()>,
{
    let component = Component::InternalTls;
    if !InternalTlsConfig::needs_certificates(config) {
        prune(ctx, owner, component, &BTreeSet::new()).await?;
        return Ok(Vec::new());
    }
    let (cluster, ns) = (owner.cluster.as_str(), owner.namespace.as_str());
    check_internal_names(cluster, ns).map_err(TlsError::InvalidSpec)?;
    let labels = labels::labels(cluster, component, &Placement::default());
    let client = multigres_api::names::data_handler_client_tls(cluster, ns);
    let leaves: Vec<SecretFor> = internal_leaf_specs(cluster, ns, resolved)
        .into_iter()
        .map(|(process, spec)| SecretFor {
            name: identity(process, cluster, ns),
            spec,
        })
        .chain([
            SecretFor {
                spec: LeafSpec::new(client.clone(), [client.clone()]),
                name: client,
            },
            SecretFor {
                name: etcd_identity(cluster, ns),
                spec: etcd_leaf_spec(cluster, ns, resolved),
            },
        ])
        .collect();
    let issued = plan(
        owner,
        &labels,
        &internal_ca_secret(cluster),
        &format!("Multigres internal CA {cluster}.{ns}"),
        &leaves,
        cached(ctx, ns),
        OffsetDateTime::now_utc(),
    )?;
    Ok(store(ctx, owner, component, issued).await?)
}

/// The gateway certificate of a resolved cluster: every name a client may use to reach a
/// gateway (the cluster-wide and replica Services, each cell's Service) and `common_name`
/// (`spec.certCommonName`), which is also its subject when set.
pub fn gateway_leaf_spec(
    cluster: &str,
    namespace: &str,
    resolved: &ResolvedCluster,
    common_name: Option<&str>,
) -> LeafSpec {
    let cluster_service = crate::names::cluster_multigateway(cluster);
    let mut dns: Vec<String> = Vec::new();
    let mut services = vec![
        cluster_service.clone(),
        crate::names::cluster_multigateway_replica(cluster),
    ];
    for cell in &resolved.cells {
        let cell_cr = multigres_api::names::cell(cluster, cell.spec.name.as_str());
        services.push(crate::names::multigateway(&cell_cr));
    }
    for service in &services {
        dns.push(service.clone());
        dns.extend(service_names(service, namespace));
    }
    let subject = match common_name.filter(|n| !n.is_empty()) {
        Some(name) => {
            dns.push(name.to_owned());
            name.to_owned()
        }
        None => format!("{cluster_service}.{namespace}.svc"),
    };
    LeafSpec::new(subject, dns)
}

/// The ConfigMap publishing the gateway CA certificate.
fn gateway_ca_config_map(
    owner: &Owner,
    labels: &BTreeMap<String, String>,
    ca_cert: &str,
) -> ConfigMap {
    ConfigMap {
        metadata: crate::stateless::metadata(
            &multigres_api::names::gateway_ca(&owner.cluster),
            owner,
            labels,
        ),
        data: Some(BTreeMap::from([(CA_CRT.to_owned(), ca_cert.to_owned())])),
        ..Default::default()
    }
}

/// Provides the certificate a cluster's gateways serve and publishes the CA that signed it,
/// from the source the spec names: the operator's own gateway CA (issued and kept here),
/// cert-manager (`spec.issuerName`: a Certificate, and the CA from the Secret cert-manager
/// writes) or the user's Secret (`spec.gatewayTLS.secretName`: only read). What another
/// source left behind is removed, and everything when client TLS is off.
pub async fn reconcile_gateway<K>(
    ctx: &Ctx<K>,
    owner: &Owner,
    resolved: &ResolvedCluster,
    cluster: &MultigresClusterSpec,
) -> Result<Vec<String>, TlsError>
where
    K: Resource<DynamicType = ()>,
{
    let component = Component::GatewayTls;
    let ns = owner.namespace.as_str();
    let config_maps = Api::<ConfigMap>::namespaced(ctx.client.clone(), ns);
    // The CA's Secret and the ConfigMap publishing its certificate share this name.
    let published_name = multigres_api::names::gateway_ca(&owner.cluster);
    // The cache keeps no labels of ConfigMaps: the published CA is told by its name.
    let unpublish = || async {
        let published: Vec<_> = owned(&ctx.stores.config_maps, ns, owner.uid())
            .into_iter()
            .filter(|c| c.name_any() == published_name)
            .collect();
        sync::prune(ctx.kit.name, &config_maps, &published, &BTreeSet::new()).await
    };
    let labels = labels::labels(&owner.cluster, component, &Placement::default());
    let leaf_spec = gateway_leaf_spec(
        &owner.cluster,
        ns,
        resolved,
        cluster.cert_common_name.as_deref(),
    );
    let source = GatewaySource::of(cluster);
    if source != GatewaySource::CertManager {
        cert_manager::remove(ctx, owner).await?;
    }
    if source != GatewaySource::Operator {
        prune(ctx, owner, component, &BTreeSet::new()).await?;
    }
    let mut changes = Vec::new();
    let ca_cert = match source {
        GatewaySource::Off => {
            unpublish().await?;
            return Ok(changes);
        }
        GatewaySource::CertManager => {
            let issuer = cluster.issuer_name.as_deref().unwrap_or_default();
            let certificate = cert_manager::gateway_certificate(owner, &labels, issuer, &leaf_spec);
            cert_manager::ensure(ctx, certificate).await?;
            let issued =
                cached(ctx, ns)(&multigres_api::names::gateway_certificate(&owner.cluster));
            match issued {
                Some(secret) => secret_ca(&secret),
                // Not issued yet: the Secret's arrival brings this back.
                None => return Ok(changes),
            }
        }
        GatewaySource::User(name) => {
            let api = Api::<Secret>::namespaced(ctx.client.clone(), ns);
            let secret = api.get_opt(name).await.map_err(|source| SyncError::Get {
                kind: "Secret".to_owned(),
                name: name.to_owned(),
                source,
            })?;
            secret.as_ref().and_then(secret_ca)
        }
        GatewaySource::Operator => {
            let (ca_cert, issued) =
                issue_gateway(ctx, owner, &labels, &published_name, leaf_spec).await?;
            changes = issued;
            Some(ca_cert)
        }
    };
    match ca_cert {
        Some(ca_cert) => {
            let published = gateway_ca_config_map(owner, &labels, &ca_cert);
            sync::ensure(
                ctx.kit.name,
                &config_maps,
                &ctx.stores.config_maps,
                published,
            )
            .await?;
        }
        // An issuer without a CA in its Secrets (a public ACME one, say): clients trust it
        // through their system roots.
        None => {
            unpublish().await?;
        }
    }
    Ok(changes)
}

/// Where a cluster's gateway certificate comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum GatewaySource<'a> {
    /// Client TLS is off.
    Off,
    /// The cluster's own gateway CA.
    Operator,
    /// cert-manager, for `spec.issuerName`.
    CertManager,
    /// The user's Secret of this name.
    User(&'a str),
}

impl<'a> GatewaySource<'a> {
    fn of(cluster: &'a MultigresClusterSpec) -> Self {
        let tls = cluster.gateway_tls.as_ref();
        if !GatewayTlsConfig::is_enabled(tls) {
            GatewaySource::Off
        } else if cluster.issuer_name.is_some() {
            GatewaySource::CertManager
        } else if let Some(name) = tls.and_then(|t| t.secret_name.as_deref()) {
            GatewaySource::User(name)
        } else {
            GatewaySource::Operator
        }
    }
}

/// The `ca.crt` of a TLS Secret, if it has a non-empty one.
fn secret_ca(secret: &Secret) -> Option<String> {
    let ca = secret.data.as_ref()?.get(CA_CRT)?;
    let ca = String::from_utf8(ca.0.clone()).ok()?;
    (!ca.trim().is_empty()).then_some(ca)
}

/// Issues (or keeps) the gateway CA and leaf certificate; returns the CA certificate and the
/// certificates made or replaced.
async fn issue_gateway<K>(
    ctx: &Ctx<K>,
    owner: &Owner,
    labels: &BTreeMap<String, String>,
    published_name: &str,
    leaf_spec: LeafSpec,
) -> Result<(String, Vec<String>), TlsError>
where
    K: Resource<DynamicType = ()>,
{
    let ns = owner.namespace.as_str();
    let leaf = SecretFor {
        name: multigres_api::names::gateway_tls(&owner.cluster),
        spec: leaf_spec,
    };
    let issued = plan(
        owner,
        labels,
        published_name,
        &format!("Multigres gateway CA {}.{ns}", owner.cluster),
        &[leaf],
        cached(ctx, ns),
        OffsetDateTime::now_utc(),
    )?;
    let ca_cert = issued
        .secrets
        .first()
        .and_then(|ca| stored_pair(Some(ca), CA_CRT, CA_KEY))
        .map(|pair| pair.cert)
        .unwrap_or_default();
    let changes = store(ctx, owner, Component::GatewayTls, issued).await?;
    Ok((ca_cert, changes))
}

/// A short digest of the certificate in a gateway Secret, for [`GATEWAY_CERT_ANNOTATION`].
pub fn certificate_digest(secret: &Secret) -> Option<String> {
    let cert = secret.data.as_ref()?.get(TLS_CRT)?;
    Some(format!("{:016x}", sync::fnv1a64(&cert.0)))
}

/// Mounts the gateway certificate of Secret `secret` into a multigateway Deployment and
/// passes multigateway the flags that serve it (and refuse plaintext when `required`);
/// `digest` rolls the pods when the certificate changes.
pub fn mount_gateway(deployment: &mut Deployment, secret: &str, required: bool, digest: &str) {
    let Some(template) = deployment.spec.as_mut().map(|s| &mut s.template) else {
        return;
    };
    template
        .metadata
        .get_or_insert_default()
        .annotations
        .get_or_insert_default()
        .insert(GATEWAY_CERT_ANNOTATION.to_owned(), digest.to_owned());
    let Some(pod) = template.spec.as_mut() else {
        return;
    };
    pod.volumes.get_or_insert_default().push(Volume {
        name: GATEWAY_TLS_VOLUME.to_owned(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret.to_owned()),
            default_mode: Some(0o440),
            items: Some(vec![key(TLS_CRT, TLS_CRT), key(TLS_KEY, TLS_KEY)]),
            ..Default::default()
        }),
        ..Default::default()
    });
    let containers = pod.containers.iter_mut();
    for container in containers.filter(|c| c.name == Process::Multigateway.as_str()) {
        container.volume_mounts.get_or_insert_default().push(mount(
            GATEWAY_TLS_VOLUME,
            GATEWAY_TLS_DIR,
            true,
        ));
        let args = container.args.get_or_insert_default();
        args.push(flag(
            "pg-tls-cert-file",
            format!("{GATEWAY_TLS_DIR}/{TLS_CRT}"),
        ));
        args.push(flag(
            "pg-tls-key-file",
            format!("{GATEWAY_TLS_DIR}/{TLS_KEY}"),
        ));
        if required {
            args.push(flag("pg-require-ssl", true));
        }
    }
}

/// Which keys of a user's pgBackRest Secret are missing, as a condition.
pub fn check_user_secret(name: &str, secret: Option<&Secret>) -> Computed {
    let Some(secret) = secret else {
        return Computed::new(
            PGBACKREST_TLS,
            FALSE,
            "SecretNotFound",
            format!(
                "spec.backup.pgbackrestTLS.secretName: Secret {name} does not exist; create it \
                 with keys ca.crt, tls.crt and tls.key, or unset secretName to have the \
                 operator generate the certificates"
            ),
        );
    };
    let data = secret.data.as_ref();
    let missing: Vec<&str> = [CA_CRT, TLS_CRT, TLS_KEY]
        .into_iter()
        .filter(|k| data.and_then(|d| d.get(*k)).is_none_or(|v| v.0.is_empty()))
        .collect();
    if missing.is_empty() {
        Computed::new(
            PGBACKREST_TLS,
            TRUE,
            "SecretProvided",
            format!("pgBackRest uses the certificates of Secret {name}"),
        )
    } else {
        Computed::new(
            PGBACKREST_TLS,
            FALSE,
            "SecretIncomplete",
            format!(
                "spec.backup.pgbackrestTLS.secretName: Secret {name} lacks key {}; it needs \
                 ca.crt, tls.crt and tls.key",
                missing.join(", ")
            ),
        )
    }
}

/// Whether `cond` says something other than the stored condition of its type.
pub fn is_new(observed: Option<&[Condition]>, cond: &Computed) -> bool {
    !observed.unwrap_or_default().iter().any(|c| {
        c.type_ == cond.type_
            && c.status == cond.status
            && c.reason == cond.reason
            && c.message == cond.message
    })
}

/// A Warning event when `cond` newly reports a problem (once, not on every reconcile).
pub async fn warn_if_new<K>(
    ctx: &Ctx<K>,
    obj: &K,
    observed: Option<&[Condition]>,
    cond: Option<&Computed>,
) where
    K: Resource<DynamicType = ()>,
{
    if let Some(cond) = cond.filter(|c| !c.is_true() && is_new(observed, c)) {
        ctx.kit
            .event(obj, EventType::Warning, cond.reason, cond.message.clone())
            .await;
    }
}

/// Why a user's Secret could not be read.
#[derive(Debug, thiserror::Error)]
#[error("reading Secret {name}")]
pub struct ReadError {
    /// The Secret.
    pub name: String,
    /// The API error.
    #[source]
    pub source: kube::Error,
}

/// Ensures a shard's pgBackRest TLS material: checks the user's Secret (read directly, never
/// cached), or issues `<shard>-pgbackrest-ca` and `<shard>-pgbackrest-tls`. Without backups
/// the generated Secrets are removed and no condition is reported.
pub async fn reconcile_pgbackrest<K>(
    ctx: &Ctx<K>,
    obj: &K,
    owner: &Owner,
    spec: &ShardSpec,
) -> Result<Option<Computed>, PgBackRestError>
where
    K: Resource<DynamicType = ()>,
{
    let component = Component::PgBackRestTls;
    let ns = owner.namespace.as_str();
    let Some(backup) = spec.backup.as_ref() else {
        prune(ctx, owner, component, &BTreeSet::new()).await?;
        return Ok(None);
    };
    if let Some(name) = user_pgbackrest_secret(backup) {
        prune(ctx, owner, component, &BTreeSet::new()).await?;
        let api = Api::<Secret>::namespaced(ctx.client.clone(), ns);
        let secret = api.get_opt(name).await.map_err(|source| ReadError {
            name: name.to_owned(),
            source,
        })?;
        return Ok(Some(check_user_secret(name, secret.as_ref())));
    }
    let at = Placement {
        database: Some(spec.database_name.as_str()),
        table_group: Some(spec.table_group_name.as_str()),
        shard: Some(spec.shard_name.as_str()),
        ..Default::default()
    };
    let labels = labels::labels(&owner.cluster, component, &at);
    let leaf = SecretFor {
        name: pgbackrest_tls_secret(&owner.name),
        spec: pgbackrest_leaf_spec(&owner.name, ns, spec),
    };
    let issued = plan(
        owner,
        &labels,
        &pgbackrest_ca_secret(&owner.name),
        &format!("Multigres pgBackRest CA {}", owner.name),
        &[leaf],
        cached(ctx, ns),
        OffsetDateTime::now_utc(),
    )
    .map_err(TlsError::from)?;
    let changes = store(ctx, owner, component, issued)
        .await
        .map_err(TlsError::from)?;
    announce_issued(ctx, obj, &changes).await;
    Ok(Some(Computed::new(
        PGBACKREST_TLS,
        TRUE,
        "Generated",
        format!(
            "pgBackRest uses the generated Secrets {} and {}",
            pgbackrest_ca_secret(&owner.name),
            pgbackrest_tls_secret(&owner.name)
        ),
    )))
}

/// Why a shard's pgBackRest TLS material could not be ensured; always transient.
#[derive(Debug, thiserror::Error)]
pub enum PgBackRestError {
    /// Issuing or storing the generated certificates failed.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// Reading the user's Secret failed.
    #[error(transparent)]
    Read(#[from] ReadError),
}

impl From<SyncError> for PgBackRestError {
    fn from(error: SyncError) -> Self {
        PgBackRestError::Tls(TlsError::Sync(error))
    }
}

pub mod cert_manager;

#[cfg(test)]
mod tests;
