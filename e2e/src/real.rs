//! Shared steps of the real-node tier: the operator installed by `helm install` from the image
//! `just image` builds, the locally built data-plane images put into a MultigresCluster, and SQL
//! through multigateway with a real PostgreSQL client.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service};
use kube::{Api, Client};
use serde_json::{Value, json};
use tokio_postgres::{NoTls, SimpleQueryMessage};

use crate::cluster::LocalCluster;
use crate::harness::{self, repo_path};
use crate::manifest::{self, Mode};
use crate::nodes;

/// The chart's release name in the tests.
pub const RELEASE: &str = "multigres-operator";
/// Where the chart runs the handlers.
pub const OPERATOR_NAMESPACE: &str = "multigres-system";
/// The operator's image as `just image` names it.
pub const OPERATOR_IMAGE_PREFIX: &str = "localhost/multigres-operator:";
/// etcd for a managed topology, built from the toolchain's etcd.
pub const ETCD_IMAGE_PREFIX: &str = "localhost/multigres/etcd:";
/// multigateway, multiorch, multipooler and multiadmin, built from the Multigres snapshot.
pub const MULTIGRES_IMAGE_PREFIX: &str = "localhost/multigres/multigres:";
/// pgctld with PostgreSQL 17 and pgBackRest.
pub const PGCTLD_IMAGE_PREFIX: &str = "localhost/multigres/pgctld:";
/// The multiadmin web UI, built from the snapshot's `web/multiadmin`.
pub const MULTIADMIN_WEB_IMAGE_PREFIX: &str = "localhost/multigres/multiadmin-web:";

/// The control plane with real nodes (`REAL_NODE_ZONES`) shared by the tests of this process.
pub async fn real_cluster() -> &'static LocalCluster {
    LocalCluster::shared_real_nodes()
        .await
        .unwrap_or_else(|e| panic!("starting the control plane with real nodes: {e}"))
}

/// The reference of the listed image whose name starts with `prefix` (its build's own tag, not
/// a [`nodes::next_tag`]).
pub fn image(prefix: &str) -> String {
    nodes::image_list()
        .unwrap_or_else(|e| panic!("{e}"))
        .into_keys()
        .find(|reference| reference.starts_with(prefix) && !reference.ends_with(nodes::NEXT_SUFFIX))
        .unwrap_or_else(|| panic!("no {prefix}* image in ${}", nodes::IMAGES_ENV))
}

/// Whether the pod's Ready condition is True.
pub fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// A pool pod's PostgreSQL failing this long is quarantined and replaced (the chart's default is
/// 5m; backups.rs waits for it once). No real-node story keeps a PostgreSQL failing on purpose
/// otherwise, and restores or first backups in progress do not count towards it.
const POOLER_UNRECOVERABLE_TIMEOUT: &str = "poolerUnrecoverableTimeout=30s";

/// `helm install` of the chart with the operator's image (never pulled: it was imported into
/// every node) and short Leases, once per process; the shared real-node control plane.
pub async fn operator_installed() -> &'static LocalCluster {
    static INSTALLED: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    let cluster = real_cluster().await;
    INSTALLED
        .get_or_init(|| {
            let chart = repo_path("deploy/helm/multigres-operator");
            let operator = image(OPERATOR_IMAGE_PREFIX);
            async move {
                install_operator(cluster, &chart, &operator, &[POOLER_UNRECOVERABLE_TIMEOUT]).await;
            }
        })
        .await;
    cluster
}

/// The chart's `image.repository=` and `image.tag=` values (for `--set`) naming `reference`.
pub fn image_values(reference: &str) -> [String; 2] {
    let (repository, tag) = reference.rsplit_once(':').expect("a tagged reference");
    [
        format!("image.repository={repository}"),
        format!("image.tag={tag}"),
    ]
}

/// `helm install` of `chart` with the operator image `reference` (never pulled: it was
/// imported into every node), short Leases and the `extra` values (`key=value`).
pub async fn install_operator(
    cluster: &LocalCluster,
    chart: &std::path::Path,
    reference: &str,
    extra: &[&str],
) {
    let [repository, tag] = image_values(reference);
    let mut args = vec![
        "install",
        RELEASE,
        chart.to_str().expect("a UTF-8 path"),
        "--namespace",
        OPERATOR_NAMESPACE,
        "--create-namespace",
        "--wait",
        "--timeout",
        "5m",
        "--set",
        &repository,
        "--set",
        &tag,
        "--set",
        "image.pullPolicy=Never",
        "--set",
        "leaderElection.leaseDuration=4s",
        "--set",
        "leaderElection.renewDeadline=3s",
        "--set",
        "leaderElection.retryPeriod=500ms",
    ];
    for value in extra {
        args.extend(["--set", value]);
    }
    let out = harness::helm(&args, Some(cluster.kubeconfig())).await;
    assert!(out.contains("STATUS: deployed"), "{out}");
    webhook_reachable(cluster).await;
}

/// How long the webhook's route may take after its pod is Ready: a bound for a loaded machine
/// (one fresh-clone run saw the first admission time out at 10 s; how much longer it would
/// have taken was not measured).
const WEBHOOK_ROUTE: Duration = Duration::from_secs(120);

/// Waits until the API server reaches the webhook-server through its Service. `helm --wait`
/// returns once the pod is Ready, but the Service's route to it (kube-proxy's rules) can
/// follow later, and an admission sent before then times out after 10 s (`failed calling
/// webhook ... context deadline exceeded`), as a user's first `kubectl apply` right after the
/// install would. A server-side dry run of a MultigresCluster passes through both of its
/// webhooks and stores nothing; any answer but that failure (the webhook's own denial
/// included) shows the route works.
async fn webhook_reachable(cluster: &LocalCluster) {
    let client = cluster.client().expect("a client of the real-node cluster");
    let probe: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "multigres.com/v1alpha1",
        "kind": "MultigresCluster",
        "metadata": {"name": "webhook-probe"},
        "spec": {},
    }))
    .expect("a MultigresCluster literal");
    harness::eventually(
        "the API server reaches the webhook through its Service",
        WEBHOOK_ROUTE,
        || async {
            let Err(e) =
                manifest::apply(&client, &probe, Some(OPERATOR_NAMESPACE), Mode::DryRun).await
            else {
                return Ok(());
            };
            match e.rejection_message() {
                Some(message) if !message.contains("failed calling webhook") => Ok(()),
                _ => Err(e.to_string()),
            }
        },
    )
    .await;
}

/// Points a document of a sample (JSON) at the locally built images, never pulled: a
/// MultigresCluster's `spec.images`, and the etcd image of a managed global topology server
/// wherever it is described (inline or by default in the cluster, or in a CoreTemplate); an
/// external topology server or one named by template is left alone.
pub fn use_local_images(kind: &str, doc: &mut Value) {
    let etcd = json!(image(ETCD_IMAGE_PREFIX));
    match kind {
        "MultigresCluster" => {
            let multigres = image(MULTIGRES_IMAGE_PREFIX);
            doc["spec"]["images"] = json!({
                "imagePullPolicy": "Never",
                "multigateway": multigres,
                "multiorch": multigres,
                "multipooler": multigres,
                "multiadmin": multigres,
                "postgres": image(PGCTLD_IMAGE_PREFIX),
                "multiadminWeb": image(MULTIADMIN_WEB_IMAGE_PREFIX),
            });
            let topo = &doc["spec"]["globalTopoServer"];
            if topo.get("external").is_none() && topo.get("templateRef").is_none() {
                doc["spec"]["globalTopoServer"]["etcd"]["image"] = etcd;
            }
        }
        "CoreTemplate" if doc["spec"]["globalTopoServer"].get("etcd").is_some() => {
            doc["spec"]["globalTopoServer"]["etcd"]["image"] = etcd;
        }
        _ => {}
    }
}

/// How to reach PostgreSQL as the superuser: through a multigateway Service or one pod.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// IP address (a ClusterIP or a pod IP).
    pub host: String,
    /// Port (5432 for the gateway and PostgreSQL).
    pub port: u16,
    /// The superuser password from the cluster's Secret.
    pub password: String,
}

impl Endpoint {
    /// The cluster's read-write multigateway Service `<cluster>-multigateway` (port 5432), with
    /// the password of `spec.postgresPasswordSecretRef`; an error until both exist.
    pub async fn gateway(
        client: &Client,
        namespace: &str,
        cluster: &str,
    ) -> Result<Endpoint, String> {
        let name = format!("{cluster}-multigateway");
        let service = Api::<Service>::namespaced(client.clone(), namespace)
            .get(&name)
            .await
            .map_err(|e| format!("reading Service {name}: {e}"))?;
        let host = service
            .spec
            .and_then(|s| s.cluster_ip)
            .filter(|ip| ip != "None")
            .ok_or_else(|| format!("Service {name} has no ClusterIP"))?;
        Ok(Endpoint {
            host,
            port: 5432,
            password: superuser_password(client, namespace, cluster).await?,
        })
    }

    /// The multigateway Service of one cell (port 5432): a client that stays in its cell, as
    /// one must while another zone is down.
    pub async fn cell_gateway(
        client: &Client,
        namespace: &str,
        cluster: &str,
        cell: &str,
    ) -> Result<Endpoint, String> {
        let (_, host) = cell_gateway_service(client, namespace, cluster, cell).await?;
        Ok(Endpoint {
            host,
            port: 5432,
            password: superuser_password(client, namespace, cluster).await?,
        })
    }

    /// PostgreSQL of one pool pod, straight to its pod IP (pg_hba admits any address with
    /// SCRAM), to see what that instance holds.
    pub fn pod(pod: &Pod, password: &str) -> Option<Endpoint> {
        Some(Endpoint {
            host: pod.status.as_ref()?.pod_ip.clone()?,
            port: 5432,
            password: password.to_owned(),
        })
    }

    /// One connection as the superuser; the error as text.
    pub async fn connect(&self) -> Result<tokio_postgres::Client, String> {
        self.connect_as("postgres", &self.password).await
    }

    /// Runs `sql` (simple protocol) as role `user` with `password`, on a fresh connection.
    pub async fn query_as(&self, user: &str, password: &str, sql: &str) -> Result<Rows, String> {
        let client = self.connect_as(user, password).await?;
        run(&client, sql).await
    }

    /// One connection as role `user` with `password`; the error as text.
    pub async fn connect_as(
        &self,
        user: &str,
        password: &str,
    ) -> Result<tokio_postgres::Client, String> {
        let mut config = tokio_postgres::Config::new();
        config
            .host(&self.host)
            .port(self.port)
            .user(user)
            .password(password)
            .dbname("postgres")
            .connect_timeout(Duration::from_secs(5));
        let (client, connection) = config.connect(NoTls).await.map_err(|e| error_text(&e))?;
        tokio::spawn(connection);
        Ok(client)
    }

    /// Runs `sql` (simple protocol) on a fresh connection: the rows, each a list of values.
    pub async fn query(&self, sql: &str) -> Result<Rows, String> {
        let client = self.connect().await?;
        run(&client, sql).await
    }
}

/// A cell's multigateway Service: its name and ClusterIP.
pub async fn cell_gateway_service(
    client: &Client,
    namespace: &str,
    cluster: &str,
    cell: &str,
) -> Result<(String, String), String> {
    let selector = format!(
        "{}={cluster},{}={cell},{}=multigateway",
        multigres_api::labels::CLUSTER,
        multigres_api::labels::CELL,
        multigres_api::labels::COMPONENT,
    );
    let services = Api::<Service>::namespaced(client.clone(), namespace)
        .list(&kube::api::ListParams::default().labels(&selector))
        .await
        .map_err(|e| format!("listing Services {selector}: {e}"))?;
    services
        .items
        .into_iter()
        .find_map(|s| {
            let ip = s.spec?.cluster_ip.filter(|ip| ip != "None")?;
            Some((s.metadata.name?, ip))
        })
        .ok_or_else(|| format!("no Service with a ClusterIP selects {selector}"))
}

/// `sql` through the gateway Service `service` with the host's `psql` and
/// `sslmode=verify-full`, as an application in the cluster connects: libpq checks the
/// certificate for `<service>.<namespace>.svc` against the CA the operator publishes
/// (ConfigMap `<cluster>-gateway-ca`) and dials the ClusterIP `ip`. psql's unaligned output,
/// or its error.
pub async fn verified_tls_query(
    client: &Client,
    namespace: &str,
    cluster: &str,
    (service, ip): (&str, &str),
    sql: &str,
) -> Result<String, String> {
    let name = multigres_api::names::gateway_ca(cluster);
    let map = Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .get(&name)
        .await
        .map_err(|e| format!("reading ConfigMap {name}: {e}"))?;
    let ca = map
        .data
        .and_then(|d| d.get("ca.crt").cloned())
        .ok_or_else(|| format!("ConfigMap {name} has no ca.crt"))?;
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let ca_file = dir.path().join("ca.crt");
    std::fs::write(&ca_file, ca).map_err(|e| e.to_string())?;
    let conninfo = format!(
        "host={service}.{namespace}.svc hostaddr={ip} port=5432 user=postgres dbname=postgres \
         sslmode=verify-full sslrootcert={} connect_timeout=5",
        ca_file.display()
    );
    let output = tokio::time::timeout(
        Duration::from_secs(15),
        tokio::process::Command::new("psql")
            .args([conninfo.as_str(), "-XAtc", sql])
            .env(
                "PGPASSWORD",
                superuser_password(client, namespace, cluster).await?,
            )
            .kill_on_drop(true)
            .output(),
    )
    .await
    .map_err(|_| "psql: no answer within 15 s".to_owned())?
    .map_err(|e| format!("running psql: {e}"))?;
    match output.status.success() {
        true => Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned()),
        false => Err(format!(
            "psql ({conninfo}): {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )),
    }
}

/// Rows of a simple query, each a list of text values (None for NULL).
pub type Rows = Vec<Vec<Option<String>>>;

/// Runs `sql` on `client`; bounded to 10 s so a stalled statement fails rather than hangs.
pub async fn run(client: &tokio_postgres::Client, sql: &str) -> Result<Rows, String> {
    let messages = tokio::time::timeout(Duration::from_secs(10), client.simple_query(sql))
        .await
        .map_err(|_| format!("{sql:?}: no answer within 10 s"))?
        .map_err(|e| format!("{sql:?}: {}", error_text(&e)))?;
    Ok(messages
        .into_iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(row) => Some(
                (0..row.len())
                    .map(|i| row.get(i).map(str::to_owned))
                    .collect(),
            ),
            _ => None,
        })
        .collect())
}

/// The server's message when there is one (`FATAL: ...`), else the client's with its causes.
fn error_text(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return format!("{}: {}", db.severity(), db.message());
    }
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

/// A connection kept across statements and made again after an error: a client's view of a
/// steady stream of queries.
pub struct Session {
    endpoint: Endpoint,
    client: Option<tokio_postgres::Client>,
}

impl Session {
    /// Connects on first use.
    pub fn new(endpoint: Endpoint) -> Session {
        Session {
            endpoint,
            client: None,
        }
    }

    /// Runs `sql`; after any error the next call connects again.
    pub async fn run(&mut self, sql: &str) -> Result<Rows, String> {
        if self.client.as_ref().is_none_or(|c| c.is_closed()) {
            self.client = Some(self.endpoint.connect().await?);
        }
        let client = self.client.as_ref().expect("connected above");
        let result = run(client, sql).await;
        if result.is_err() {
            self.client = None;
        }
        result
    }
}

/// The password of the cluster's `spec.postgresPasswordSecretRef`.
async fn superuser_password(
    client: &Client,
    namespace: &str,
    cluster: &str,
) -> Result<String, String> {
    let clusters: Api<kube::api::DynamicObject> =
        Api::namespaced_with(client.clone(), namespace, &harness::multigres_clusters());
    let object = clusters
        .get(cluster)
        .await
        .map_err(|e| format!("reading MultigresCluster {cluster}: {e}"))?;
    let reference = &object.data["spec"]["postgresPasswordSecretRef"];
    let name = reference["name"]
        .as_str()
        .ok_or("no spec.postgresPasswordSecretRef.name")?;
    let key = reference["key"].as_str().unwrap_or("password");
    let secret = Api::<Secret>::namespaced(client.clone(), namespace)
        .get(name)
        .await
        .map_err(|e| format!("reading Secret {name}: {e}"))?;
    let value = secret.data.as_ref().and_then(|d| d.get(key));
    let value = value.ok_or_else(|| format!("Secret {name} has no key {key}"))?;
    String::from_utf8(value.0.clone()).map_err(|_| format!("Secret {name}: {key} is not UTF-8"))
}
