//! Where the operator reaches a cluster's global topology, and the connections it keeps open.
//!
//! [`Target`] is pure: computed from the cluster and a resolved `GlobalTopoServerRef` (the
//! cluster's, a Cell's or a Shard's); so is [`CellTopo`], how a cell's own topology (where its
//! poolers register) is reached. [`Connections`] reads the TLS Secrets a target names and keeps
//! one [`TopoStore`] per distinct target, so reconciles reuse connections.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use multigres_api::names;
use multigres_api::resolver::defaults;
use multigres_api::v1alpha1::{
    CellSpec, ExternalTopoServerSpec, GlobalTopoServerRef, InternalTlsConfig, MultigresCluster,
    TopoServer,
};
use multigres_common::controller::Category;

use crate::topo::{CellTls, EtcdConnection, TlsPem, TopoConfig, TopoError, TopoStore, qualified};

/// Key of the CA certificate in `caSecret` (and accepted in `clientCertSecret`).
pub const CA_KEY: &str = "ca.crt";
/// Key of the client certificate in `clientCertSecret`.
pub const CERT_KEY: &str = "tls.crt";
/// Key of the client private key in `clientCertSecret`.
pub const KEY_KEY: &str = "tls.key";

/// The field naming an external topology server, for messages.
pub const EXTERNAL_FIELD: &str = "spec.globalTopoServer.external";
/// The field of a Cell naming its own external topology server, for messages (written as
/// `localTopoServer.external` in the cluster's cell or its CellTemplate).
pub const CELL_EXTERNAL_FIELD: &str = "spec.topoServer.external";

/// The field turning on TLS to the managed etcd servers, for messages: the data-handler then
/// dials them with its own client certificate, which also holds the internal CA.
pub const INTERNAL_FIELD: &str = "spec.internalTLS.topology";

/// Which kind of server holds the global topology.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Server {
    /// An etcd the operator runs: the TopoServer of this name.
    Managed {
        /// Name of the TopoServer.
        topo_server: String,
    },
    /// An etcd the user runs.
    External,
}

/// Secrets holding the TLS material for an etcd: an external one's, or the data-handler's own
/// client certificate for the managed ones.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TlsSecrets {
    /// The field naming the server (global or a cell's) or [`INTERNAL_FIELD`], for messages.
    pub field: &'static str,
    /// Secret with `ca.crt`.
    pub ca: String,
    /// Secret with `tls.crt` and `tls.key`, for client-certificate authentication.
    pub client_cert: Option<String>,
}

/// Where and how to reach a cluster's global topology.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// etcd endpoints as the operator dials them.
    pub endpoints: Vec<String>,
    /// Key prefix of the global records.
    pub root: String,
    /// TLS Secrets, when the server uses TLS.
    pub tls: Option<TlsSecrets>,
    /// Managed or external.
    pub server: Server,
}

/// Why a cluster's topology settings cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    /// An https:// endpoint without the CA to verify it.
    #[error(
        "endpoint {endpoint} uses https:// but {field}.caSecret is not set; name a Secret holding the CA certificate as `ca.crt`"
    )]
    TlsWithoutCa {
        field: &'static str,
        endpoint: String,
    },
    /// TLS Secrets named for a plain http:// endpoint.
    #[error(
        "{field}.caSecret or clientCertSecret is set but endpoint {endpoint} is plain http://; use https:// endpoints for TLS"
    )]
    TlsOnPlainEndpoint {
        field: &'static str,
        endpoint: String,
    },
    /// A client certificate without the CA to verify the server.
    #[error(
        "{field}.clientCertSecret is set without caSecret; the CA that signed the etcd server certificate is needed too"
    )]
    ClientCertWithoutCa { field: &'static str },
    /// Nothing to dial.
    #[error("the global topology server has no endpoints")]
    NoEndpoints,
}

impl TlsSecrets {
    /// The data-handler's client certificate Secret of `cluster` (`ca.crt`, `tls.crt`,
    /// `tls.key`, issued by the resource-handler), for the managed etcd servers.
    /// `None` when `config` leaves topology TLS off.
    pub fn internal(
        config: Option<&InternalTlsConfig>,
        cluster: &str,
        namespace: &str,
    ) -> Option<Self> {
        if !InternalTlsConfig::topology_enabled(config) {
            return None;
        }
        let secret = names::data_handler_client_tls(cluster, namespace);
        Some(Self {
            field: INTERNAL_FIELD,
            ca: secret.clone(),
            client_cert: Some(secret),
        })
    }

    /// The fields to name when the CA or the client certificate cannot be read.
    fn fields(&self) -> (String, String) {
        if self.field == INTERNAL_FIELD {
            let issued = format!("{INTERNAL_FIELD} (the data-handler's client certificate)");
            return (issued.clone(), issued);
        }
        (
            format!("{}.caSecret", self.field),
            format!("{}.clientCertSecret", self.field),
        )
    }
}

impl Target {
    /// The target of `cluster` whose global topology `topo_ref` resolves to: an external server's
    /// endpoints (with their scheme) and TLS Secrets come from the cluster spec, a managed
    /// server's address from `topo_ref`; the root always from `topo_ref`.
    pub fn new(
        cluster: &MultigresCluster,
        topo_ref: &GlobalTopoServerRef,
    ) -> Result<Self, TargetError> {
        let external = cluster
            .spec
            .global_topo_server
            .as_ref()
            .and_then(|g| g.external.as_ref());
        let target = match external {
            Some(external) => {
                let namespace = cluster.metadata.namespace.as_deref().unwrap_or_default();
                // Plaintext only: an https:// endpoint is verified against the name written.
                let endpoints: Vec<String> = external_endpoints(external)
                    .iter()
                    .map(|e| match e.starts_with("https://") {
                        true => e.clone(),
                        false => qualified(e, namespace),
                    })
                    .collect();
                let tls = external_tls(external, &endpoints, EXTERNAL_FIELD)?;
                Target {
                    endpoints,
                    root: topo_ref.root_path.clone(),
                    tls,
                    server: Server::External,
                }
            }
            None => Target {
                endpoints: split_addresses(&topo_ref.address),
                root: topo_ref.root_path.clone(),
                tls: TlsSecrets::internal(
                    cluster.spec.internal_tls.as_ref(),
                    cluster.metadata.name.as_deref().unwrap_or_default(),
                    cluster.metadata.namespace.as_deref().unwrap_or_default(),
                ),
                server: Server::Managed {
                    topo_server: names::global_topo_server(
                        cluster.metadata.name.as_deref().unwrap_or_default(),
                    ),
                },
            },
        };
        if target.endpoints.is_empty() {
            return Err(TargetError::NoEndpoints);
        }
        Ok(target)
    }

    /// "etcd at a, b (root /r)", for messages.
    pub fn describe(&self) -> String {
        format!("etcd at {} (root {})", self.endpoints.join(", "), self.root)
    }
}

/// An external server's endpoints as the operator dials them (with their scheme).
fn external_endpoints(external: &ExternalTopoServerSpec) -> Vec<String> {
    external
        .endpoints
        .iter()
        .map(|e| e.as_str().trim_end_matches('/').to_owned())
        .collect()
}

/// The TLS Secrets of an external server named by `field`, checked against its endpoints:
/// https:// needs a CA, http:// takes no TLS, a client certificate needs the CA too.
fn external_tls(
    external: &ExternalTopoServerSpec,
    endpoints: &[String],
    field: &'static str,
) -> Result<Option<TlsSecrets>, TargetError> {
    let ca = external.ca_secret.clone().filter(|s| !s.is_empty());
    let client_cert = external
        .client_cert_secret
        .clone()
        .filter(|s| !s.is_empty());
    let tls = match (ca, client_cert) {
        (Some(ca), client_cert) => Some(TlsSecrets {
            field,
            ca,
            client_cert,
        }),
        (None, Some(_)) => return Err(TargetError::ClientCertWithoutCa { field }),
        (None, None) => None,
    };
    for endpoint in endpoints {
        let https = endpoint.starts_with("https://");
        if https && tls.is_none() {
            return Err(TargetError::TlsWithoutCa {
                field,
                endpoint: endpoint.clone(),
            });
        }
        if !https && tls.is_some() {
            return Err(TargetError::TlsOnPlainEndpoint {
                field,
                endpoint: endpoint.clone(),
            });
        }
    }
    Ok(tls)
}

/// How a cell's own topology, where its poolers register, is reached. Its addresses come from
/// the cell's record in the global topology; the TLS settings from the Cell, since a cell with
/// its own etcd has its own (a managed one is dialled with the data-handler's certificate when
/// topology TLS is on, an external one with its own Secrets), and the global server's would
/// fail its handshake or leak its client certificate there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CellTopo {
    /// The cell keeps its records on the global topology server.
    Global,
    /// The cell has its own etcd: managed, or external, with these TLS Secrets.
    Own {
        /// The server's TLS Secrets; `None` for plaintext.
        tls: Option<TlsSecrets>,
    },
}

impl CellTopo {
    /// How the cell of `spec`, in `cluster` of `namespace`, is reached.
    pub fn of(spec: &CellSpec, cluster: &str, namespace: &str) -> Result<Self, TargetError> {
        let local = spec.topo_server.as_ref();
        match (
            local.and_then(|l| l.etcd.as_ref()),
            local.and_then(|l| l.external.as_ref()),
        ) {
            (Some(_), _) => Ok(CellTopo::Own {
                tls: TlsSecrets::internal(spec.internal_tls.as_ref(), cluster, namespace),
            }),
            (None, Some(external)) => Ok(CellTopo::Own {
                tls: external_tls(external, &external_endpoints(external), CELL_EXTERNAL_FIELD)?,
            }),
            (None, None) => Ok(CellTopo::Global),
        }
    }
}

/// The managed TopoServer `target` waits for before it is dialled: its name while that
/// TopoServer does not exist or is not `Available` yet (etcd still starting), `None` once it
/// serves or when the server is external. Dialling earlier would only report an outage.
pub fn waiting_for<'t>(target: &'t Target, topo_server: Option<&TopoServer>) -> Option<&'t str> {
    let Server::Managed { topo_server: name } = &target.server else {
        return None;
    };
    let available = topo_server
        .and_then(|t| t.status.as_ref())
        .is_some_and(|s| multigres_common::conditions::is_true(&s.conditions, "Available"));
    (!available).then_some(name.as_str())
}

/// `host:port,host:port` as a list.
pub fn split_addresses(addresses: &str) -> Vec<String> {
    addresses
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The global topology reference of `cluster` without resolving templates, for deleting it
/// (a template it used may be gone by then): an external server from the spec; a managed one
/// from its TopoServer, `None` when that TopoServer no longer exists.
pub fn deletion_topo_ref(
    cluster: &MultigresCluster,
    topo_server: Option<&TopoServer>,
) -> Option<GlobalTopoServerRef> {
    let namespace = cluster.metadata.namespace.as_deref().unwrap_or_default();
    let external = cluster
        .spec
        .global_topo_server
        .as_ref()
        .and_then(|g| g.external.as_ref());
    let (address, root) = match external {
        Some(external) => (String::new(), external.root_path.clone()),
        None => {
            let topo_server = topo_server?;
            let name = topo_server.metadata.name.as_deref().unwrap_or_default();
            (
                names::topo_client_address(name, namespace),
                topo_server
                    .spec
                    .etcd
                    .as_ref()
                    .and_then(|e| e.root_path.clone()),
            )
        }
    };
    Some(GlobalTopoServerRef {
        address,
        root_path: root.unwrap_or_else(|| defaults::GLOBAL_ROOT.to_owned()),
        implementation: defaults::TOPO_IMPLEMENTATION.to_owned(),
        ..Default::default()
    })
}

/// Why a connection could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// A named TLS Secret does not exist (yet).
    #[error("Secret {namespace}/{name} named in {field} does not exist; create it")]
    SecretMissing {
        namespace: String,
        name: String,
        field: String,
    },
    /// A TLS Secret lacks a key the connection needs.
    #[error("Secret {namespace}/{name} named in {field} has no key {key}")]
    SecretKeyMissing {
        namespace: String,
        name: String,
        field: String,
        key: &'static str,
    },
    /// The API server did not hand out the Secret (RBAC, outage).
    #[error("cannot read Secret {namespace}/{name}")]
    SecretRead {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    /// The etcd client could not be built from the material (bad PEM).
    #[error(transparent)]
    Topo(#[from] TopoError),
}

impl ConnectError {
    /// What kind of failure this is, for every controller that connects.
    pub fn category(&self) -> Category {
        match self {
            ConnectError::SecretMissing { .. } | ConnectError::SecretKeyMissing { .. } => {
                Category::Waiting
            }
            ConnectError::SecretRead { .. } => Category::KubeApi,
            ConnectError::Topo(_) => Category::DataPlane,
        }
    }
}

/// The cache key of a connection: the endpoints, root and TLS material it was made with.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    endpoints: Vec<String>,
    root: String,
    tls_digest: Option<u64>,
    /// Where the one-label hosts of its Cell records resolve.
    namespace: String,
}

impl Key {
    /// What the connection under the store depends on: not the root.
    fn link(&self) -> (Vec<String>, Option<u64>) {
        (self.endpoints.clone(), self.tls_digest)
    }
}

/// The open stores, and the etcd connections under them: one per endpoints and TLS material,
/// shared by the stores of every root there (clusters registering in one etcd under their own
/// roots would otherwise hold a connection each).
#[derive(Default)]
struct Pool {
    stores: HashMap<Key, Arc<TopoStore>>,
    links: HashMap<(Vec<String>, Option<u64>), EtcdConnection>,
}

/// Open topology connections, shared by every controller of the handler.
pub struct Connections {
    client: kube::Client,
    connect_timeout: Duration,
    request_timeout: Duration,
    pool: Mutex<Pool>,
    /// TLS Secrets read in the last [`crate::dial::REREAD`], by namespace and name: every
    /// reconcile of a cluster with topology TLS opens its stores, and would otherwise GET the
    /// same Secret each time.
    secrets: Mutex<HashMap<(String, String), (Instant, Secret)>>,
}

impl Connections {
    /// Connections whose TLS Secrets are read with `client`, with the given etcd timeouts.
    pub fn new(client: kube::Client, connect_timeout: Duration, request_timeout: Duration) -> Self {
        Self {
            client,
            connect_timeout,
            request_timeout,
            pool: Mutex::new(Pool::default()),
            secrets: Mutex::new(HashMap::new()),
        }
    }

    /// The store for `target`, whose Secrets live in `namespace`: reused when nothing changed
    /// (same endpoints, root and TLS material), otherwise made anew.
    pub async fn open(
        &self,
        namespace: &str,
        target: &Target,
    ) -> Result<Arc<TopoStore>, ConnectError> {
        let tls = match &target.tls {
            Some(secrets) => Some(self.tls_material(namespace, secrets).await?),
            None => None,
        };
        let key = Key {
            endpoints: target.endpoints.clone(),
            root: target.root.clone(),
            tls_digest: tls.as_ref().map(TlsPem::digest),
            namespace: namespace.to_owned(),
        };
        if let Some(store) = self.locked().stores.get(&key) {
            return Ok(store.clone());
        }
        let config = TopoConfig {
            endpoints: target.endpoints.clone(),
            global_root: target.root.clone(),
            tls,
            connect_timeout: self.connect_timeout,
            request_timeout: self.request_timeout,
            namespace: Some(namespace.to_owned()),
        };
        let open = self.locked().links.get(&key.link()).cloned();
        let link = match open {
            Some(link) => link,
            None => EtcdConnection::open(&config).await?,
        };
        let mut pool = self.locked();
        let link = pool.links.entry(key.link()).or_insert(link).clone();
        let store = Arc::new(TopoStore::over(&link, config));
        Ok(pool.stores.entry(key).or_insert(store).clone())
    }

    /// How to reach the cell topology `cell`, whose Secrets live in `namespace`: the TLS
    /// material read from its Secrets.
    pub async fn cell_tls(
        &self,
        namespace: &str,
        cell: &CellTopo,
    ) -> Result<CellTls, ConnectError> {
        Ok(match cell {
            CellTopo::Global => CellTls::Global,
            CellTopo::Own { tls: None } => CellTls::Own(None),
            CellTopo::Own { tls: Some(secrets) } => {
                CellTls::Own(Some(self.tls_material(namespace, secrets).await?))
            }
        })
    }

    /// Closes the store of `target` (any TLS material), and its etcd connection once no other
    /// root uses it.
    pub fn forget(&self, target: &Target) {
        let mut pool = self.locked();
        pool.stores
            .retain(|key, _| key.endpoints != target.endpoints || key.root != target.root);
        let Pool { stores, links } = &mut *pool;
        links.retain(|link, _| stores.keys().any(|key| key.link() == *link));
    }

    fn read_secrets(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<(String, String), (Instant, Secret)>> {
        // Nothing panics while the lock is held; recover the map if something ever does.
        self.secrets
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn locked(&self) -> std::sync::MutexGuard<'_, Pool> {
        // Nothing panics while the lock is held; recover the map if something ever does.
        self.pool
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    async fn tls_material(
        &self,
        namespace: &str,
        secrets: &TlsSecrets,
    ) -> Result<TlsPem, ConnectError> {
        let (ca_field, cert_field) = secrets.fields();
        let ca_secret = self.secret(namespace, &secrets.ca, &ca_field).await?;
        let ca = secret_key(&ca_secret, namespace, &secrets.ca, &ca_field, CA_KEY)?;
        let (client_cert, client_key) = match &secrets.client_cert {
            Some(name) => {
                let field = cert_field;
                let secret = match *name == secrets.ca {
                    true => ca_secret,
                    false => self.secret(namespace, name, &field).await?,
                };
                (
                    Some(secret_key(&secret, namespace, name, &field, CERT_KEY)?),
                    Some(secret_key(&secret, namespace, name, &field, KEY_KEY)?),
                )
            }
            None => (None, None),
        };
        Ok(TlsPem {
            ca,
            client_cert,
            client_key,
            server_name: None,
        })
    }

    async fn secret(
        &self,
        namespace: &str,
        name: &str,
        field: &str,
    ) -> Result<Secret, ConnectError> {
        let slot = (namespace.to_owned(), name.to_owned());
        let fresh = |at: &Instant| at.elapsed() < crate::dial::REREAD;
        if let Some((at, secret)) = self.read_secrets().get(&slot)
            && fresh(at)
        {
            return Ok(secret.clone());
        }
        let api: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        match api.get_opt(name).await {
            Ok(Some(secret)) => {
                let mut read = self.read_secrets();
                // Expired entries would be read again anyway: dropping them keeps the Secrets
                // of clusters deleted long ago out of memory.
                read.retain(|_, (at, _)| fresh(at));
                read.insert(slot, (Instant::now(), secret.clone()));
                Ok(secret)
            }
            Ok(None) => Err(ConnectError::SecretMissing {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                field: field.to_owned(),
            }),
            Err(source) => Err(ConnectError::SecretRead {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                source,
            }),
        }
    }
}

fn secret_key(
    secret: &Secret,
    namespace: &str,
    name: &str,
    field: &str,
    key: &'static str,
) -> Result<Vec<u8>, ConnectError> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|b| b.0.clone())
        .filter(|b| !b.is_empty())
        .ok_or_else(|| ConnectError::SecretKeyMissing {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            field: field.to_owned(),
            key,
        })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use k8s_openapi::jiff::Timestamp;
    use multigres_api::v1alpha1::{
        EndpointUrl, EtcdSpec, ExternalTopoServerSpec, GlobalTopoServerSpec, LocalTopoServerSpec,
        TopoServerSpec, TopoServerStatus,
    };

    use super::*;

    fn cluster(external: Option<ExternalTopoServerSpec>) -> MultigresCluster {
        let mut c = MultigresCluster::new("prod", Default::default());
        c.metadata.namespace = Some("team-a".into());
        c.spec.global_topo_server = external.map(|e| GlobalTopoServerSpec {
            external: Some(e),
            ..Default::default()
        });
        c
    }

    fn external(
        endpoints: &[&str],
        ca: Option<&str>,
        cert: Option<&str>,
    ) -> ExternalTopoServerSpec {
        ExternalTopoServerSpec {
            endpoints: endpoints.iter().map(|e| EndpointUrl::new(*e)).collect(),
            ca_secret: ca.map(str::to_owned),
            client_cert_secret: cert.map(str::to_owned),
            root_path: Some("/custom".into()),
            ..Default::default()
        }
    }

    fn topo_ref(address: &str, root: &str) -> GlobalTopoServerRef {
        GlobalTopoServerRef {
            address: address.into(),
            root_path: root.into(),
            implementation: "etcd".into(),
            ..Default::default()
        }
    }

    #[test]
    fn managed_server_is_dialled_at_its_service() {
        let target = Target::new(
            &cluster(None),
            &topo_ref("prod-global-topo.team-a.svc:2379", "/multigres/global"),
        )
        .unwrap();
        assert_eq!(target.endpoints, ["prod-global-topo.team-a.svc:2379"]);
        assert_eq!(target.root, "/multigres/global");
        assert_eq!(target.tls, None);
        assert_eq!(
            target.server,
            Server::Managed {
                topo_server: "prod-global-topo".into()
            }
        );
        assert_eq!(
            target.describe(),
            "etcd at prod-global-topo.team-a.svc:2379 (root /multigres/global)"
        );
        let mut secure = cluster(None);
        secure.spec.internal_tls = Some(InternalTlsConfig {
            enabled: Some(true),
            topology: Some(true),
        });
        let address = topo_ref("prod-global-topo.team-a.svc:2379", "/multigres/global");
        let client = "data-handler.prod.team-a.multigres.internal".to_owned();
        assert_eq!(
            Target::new(&secure, &address).unwrap().tls,
            Some(TlsSecrets {
                field: INTERNAL_FIELD,
                ca: client.clone(),
                client_cert: Some(client),
            }),
            "topology TLS: the data-handler's own certificate, with the internal CA in it"
        );
    }

    #[test]
    fn external_server_keeps_schemes_and_names_its_secrets() {
        let c = cluster(Some(external(
            &["https://a:2379/", "https://b:2379"],
            Some("etcd-ca"),
            Some("etcd-client"),
        )));
        let target = Target::new(&c, &topo_ref("a:2379,b:2379", "/custom")).unwrap();
        assert_eq!(target.endpoints, ["https://a:2379", "https://b:2379"]);
        assert_eq!(
            target.tls,
            Some(TlsSecrets {
                field: EXTERNAL_FIELD,
                ca: "etcd-ca".into(),
                client_cert: Some("etcd-client".into())
            })
        );
        assert_eq!(target.server, Server::External);
    }

    #[test]
    fn a_plaintext_service_name_is_dialled_in_the_clusters_namespace() {
        let c = cluster(Some(external(&["http://topo-etcd:2379"], None, None)));
        let target = Target::new(&c, &topo_ref("topo-etcd:2379", "/custom")).unwrap();
        assert_eq!(target.endpoints, ["http://topo-etcd.team-a.svc:2379"]);
    }

    #[test]
    fn inconsistent_tls_settings_are_refused_with_the_field_to_fix() {
        let tref = topo_ref("a:1", "/r");
        let err = Target::new(
            &cluster(Some(external(&["https://a:1"], None, None))),
            &tref,
        )
        .unwrap_err();
        assert_eq!(
            err,
            TargetError::TlsWithoutCa {
                field: EXTERNAL_FIELD,
                endpoint: "https://a:1".into()
            }
        );
        assert!(
            err.to_string()
                .contains("spec.globalTopoServer.external.caSecret"),
            "{err}"
        );
        let err = Target::new(
            &cluster(Some(external(&["http://a:1"], Some("ca"), None))),
            &tref,
        )
        .unwrap_err();
        assert!(matches!(err, TargetError::TlsOnPlainEndpoint { .. }));
        let err = Target::new(
            &cluster(Some(external(&["https://a:1"], None, Some("cert")))),
            &tref,
        )
        .unwrap_err();
        assert_eq!(
            err,
            TargetError::ClientCertWithoutCa {
                field: EXTERNAL_FIELD
            }
        );
        assert_eq!(
            Target::new(&cluster(None), &topo_ref(" , ", "/r")).unwrap_err(),
            TargetError::NoEndpoints
        );
    }

    fn cell_topo(spec: &CellSpec) -> Result<CellTopo, TargetError> {
        CellTopo::of(spec, "prod", "db")
    }

    fn cell(topo_server: Option<LocalTopoServerSpec>) -> CellSpec {
        CellSpec {
            topo_server,
            ..Default::default()
        }
    }

    #[test]
    fn a_cell_is_reached_with_its_own_topology_settings() {
        assert_eq!(cell_topo(&cell(None)), Ok(CellTopo::Global));
        let managed = LocalTopoServerSpec {
            etcd: Some(EtcdSpec::default()),
            ..Default::default()
        };
        assert_eq!(
            cell_topo(&cell(Some(managed.clone()))),
            Ok(CellTopo::Own { tls: None }),
            "a managed etcd without topology TLS is plaintext"
        );
        let mut secure = cell(Some(managed));
        secure.internal_tls = Some(InternalTlsConfig {
            enabled: None,
            topology: Some(true),
        });
        assert_eq!(
            cell_topo(&secure),
            Ok(CellTopo::Own {
                tls: Some(TlsSecrets {
                    field: INTERNAL_FIELD,
                    ca: "data-handler.prod.db.multigres.internal".into(),
                    client_cert: Some("data-handler.prod.db.multigres.internal".into()),
                })
            }),
            "with topology TLS, a managed etcd is dialled with the data-handler's certificate"
        );
        let own = |e: ExternalTopoServerSpec| LocalTopoServerSpec {
            external: Some(e),
            ..Default::default()
        };
        assert_eq!(
            cell_topo(&cell(Some(own(external(
                &["https://zone-a-etcd:2379"],
                Some("zone-a-ca"),
                Some("zone-a-client"),
            ))))),
            Ok(CellTopo::Own {
                tls: Some(TlsSecrets {
                    field: CELL_EXTERNAL_FIELD,
                    ca: "zone-a-ca".into(),
                    client_cert: Some("zone-a-client".into()),
                })
            })
        );
        assert_eq!(
            cell_topo(&cell(Some(own(external(
                &["http://zone-a-etcd:2379"],
                None,
                None
            ))))),
            Ok(CellTopo::Own { tls: None })
        );
        let err = cell_topo(&cell(Some(own(external(
            &["https://zone-a-etcd:2379"],
            None,
            None,
        )))))
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("spec.topoServer.external.caSecret"),
            "{err}"
        );
    }

    #[test]
    fn deletion_reference_needs_no_templates() {
        let ext = cluster(Some(external(&["http://a:1"], None, None)));
        let r = deletion_topo_ref(&ext, None).unwrap();
        assert_eq!(r.root_path, "/custom");

        let managed = cluster(None);
        assert_eq!(deletion_topo_ref(&managed, None), None, "TopoServer gone");
        let mut topo = TopoServer::new("prod-global-topo", TopoServerSpec::default());
        let r = deletion_topo_ref(&managed, Some(&topo)).unwrap();
        assert_eq!(r.address, "prod-global-topo.team-a.svc:2379");
        assert_eq!(r.root_path, "/multigres/global");
        topo.spec.etcd = Some(EtcdSpec {
            root_path: Some("/from-template".into()),
            ..Default::default()
        });
        assert_eq!(
            deletion_topo_ref(&managed, Some(&topo)).unwrap().root_path,
            "/from-template"
        );
    }

    #[test]
    fn a_managed_server_is_dialled_once_available() {
        let managed = Target::new(
            &cluster(None),
            &topo_ref("prod-global-topo.team-a.svc:2379", "/r"),
        )
        .unwrap();
        assert_eq!(waiting_for(&managed, None), Some("prod-global-topo"));
        let mut topo = TopoServer::new("prod-global-topo", TopoServerSpec::default());
        assert_eq!(waiting_for(&managed, Some(&topo)), Some("prod-global-topo"));
        let available = |status: &str| TopoServerStatus {
            conditions: vec![Condition {
                type_: "Available".into(),
                status: status.into(),
                reason: "r".into(),
                message: "m".into(),
                observed_generation: None,
                last_transition_time: Time(Timestamp::UNIX_EPOCH),
            }],
            ..Default::default()
        };
        topo.status = Some(available("False"));
        assert_eq!(waiting_for(&managed, Some(&topo)), Some("prod-global-topo"));
        topo.status = Some(available("True"));
        assert_eq!(waiting_for(&managed, Some(&topo)), None);
        let external = Target::new(
            &cluster(Some(external(&["http://a:1"], None, None))),
            &topo_ref("a:1", "/r"),
        )
        .unwrap();
        assert_eq!(waiting_for(&external, None), None);
    }

    #[test]
    fn addresses_are_split_and_trimmed() {
        assert_eq!(split_addresses("a:1, b:2,,"), ["a:1", "b:2"]);
        assert!(split_addresses("").is_empty());
    }
}
