//! What every end-to-end test needs around the control plane: the shared cluster, a namespace
//! of its own, polling with a deadline, and the handler binaries run the way they run in
//! production: as their own ServiceAccount, with only the rules shipped in `deploy/rbac`.
//!
//! Handlers are started with `--watch-namespace` so tests sharing one control plane do not see
//! each other's objects.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use multigres_api::v1alpha1::Shard;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::cluster::LocalCluster;
use crate::manifest::{self, Mode};
use crate::process::Supervised;

/// The four handler binaries, by package (and binary) name.
pub const HANDLERS: [&str; 4] = [
    "cluster-handler",
    "resource-handler",
    "data-handler",
    "webhook-server",
];

/// Bound for anything the handlers and the control plane normally do within seconds.
pub const WAIT: Duration = Duration::from_secs(60);

/// The log line each controller handler writes once its caches are filled and it reconciles.
pub const READY_MESSAGE: &str = "caches synced; serving";

/// The log line the webhook-server writes once it answers admission requests (its readiness).
pub const ADMISSION_MESSAGE: &str = "admission server listening";

/// The ServiceAccount (and handler) name of the webhook-server.
pub const WEBHOOK: &str = "webhook-server";

/// What `name` logs when it is ready: the webhook answers admissions, the others reconcile.
fn ready_message(name: &str) -> &'static str {
    if name == WEBHOOK {
        ADMISSION_MESSAGE
    } else {
        READY_MESSAGE
    }
}

/// A path relative to the repository root.
pub fn repo_path(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(relative)
}

/// The control plane shared by every test of this test binary (started on first use).
pub async fn control_plane() -> &'static LocalCluster {
    LocalCluster::shared()
        .await
        .unwrap_or_else(|e| panic!("starting the local control plane: {e}"))
}

/// A namespace no other test of this process uses: `<prefix>-<n>`.
pub async fn fresh_namespace(cluster: &LocalCluster, prefix: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let name = format!("{prefix}-{}", NEXT.fetch_add(1, Ordering::Relaxed));
    cluster
        .create_namespace(&name)
        .await
        .unwrap_or_else(|e| panic!("creating namespace {name}: {e}"));
    name
}

/// Retries `check` every 200 ms until it returns `Ok`, for at most `timeout`; panics with its
/// last error.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        match check().await {
            Ok(value) => return value,
            Err(last) if Instant::now() >= deadline => {
                // A summary of a failed run may keep only the lines before the panic: name
                // what timed out there too.
                println!("timed out after {timeout:?}: {what}");
                panic!("{what}: not reached within {timeout:?}; last: {last}");
            }
            Err(_) => {}
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Environment variable naming a directory of already-built handler binaries, used instead of
/// building them (the benchmark runs release builds it did not compile itself).
pub const HANDLER_DIR_ENV: &str = "MULTIGRES_HANDLER_DIR";

/// The kubectl plugin's package (and binary) name.
pub const PLUGIN: &str = "kubectl-multigres";

/// The handler binary `name`, from [`HANDLER_DIR_ENV`] or else built once per test process with
/// the profile and target directory of the running test.
pub fn handler_binary(name: &str) -> PathBuf {
    if let Some(dir) = std::env::var_os(HANDLER_DIR_ENV) {
        return PathBuf::from(dir).join(name);
    }
    built_dir().join(name)
}

/// The kubectl plugin (`kubectl-multigres`), built with the handlers: what a user runs as
/// `kubectl multigres`.
pub fn plugin_binary() -> PathBuf {
    built_dir().join(PLUGIN)
}

/// Runs the plugin with `args` against `cluster` (its admin kubeconfig), as a user would run
/// `kubectl multigres`; its standard output, or what it printed when it failed.
pub async fn run_plugin(cluster: &LocalCluster, args: &[&str]) -> Result<String, String> {
    let output = tokio::process::Command::new(plugin_binary())
        .args(args)
        .env("KUBECONFIG", cluster.kubeconfig())
        .output()
        .await
        .map_err(|e| format!("running {PLUGIN}: {e}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    match output.status.success() {
        true => Ok(stdout),
        false => Err(format!(
            "{PLUGIN} {}: {}\n{stdout}{}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        )),
    }
}

/// Builds the handlers and the plugin once per test process, with the profile and target
/// directory of the running test; the directory of the binaries.
fn built_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        // A test runs as <target>/<profile>/deps/<test>-<hash>.
        let exe = std::env::current_exe().expect("test executable path");
        let profile_dir = exe
            .ancestors()
            .nth(2)
            .expect("profile directory above deps/")
            .to_path_buf();
        let target_dir = profile_dir.parent().expect("target directory");
        let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") | None => "dev".to_owned(),
            Some(other) => other.to_owned(),
        };
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
        let mut command = Command::new(cargo);
        command
            .current_dir(repo_path(""))
            .args(["build", "--quiet", "--profile", &profile, "--target-dir"])
            .arg(target_dir);
        for package in HANDLERS.iter().chain([&PLUGIN]) {
            command.args(["-p", package]);
        }
        let status = command.status().expect("running cargo build");
        assert!(
            status.success(),
            "cargo build of the handlers and the plugin: {status}"
        );
        profile_dir
    })
}

/// Grants ServiceAccount `<handler>` in `namespace` every ClusterRole of
/// `deploy/rbac/<handler>.yaml`, bound in that namespace only, and returns a kubeconfig with a
/// token of that ServiceAccount once the grant is in effect.
pub async fn grant_shipped_rbac(cluster: &LocalCluster, namespace: &str, handler: &str) -> PathBuf {
    let admin = cluster.client().expect("admin client");
    let file = format!("{handler}.yaml");
    let rbac = std::fs::read_to_string(repo_path(&format!("deploy/rbac/{file}")))
        .unwrap_or_else(|e| panic!("reading deploy/rbac/{file}: {e}"));
    let docs = manifest::parse_documents(&rbac, Path::new(&file)).expect("RBAC documents");
    for doc in &docs {
        manifest::apply(&admin, doc, None, Mode::Apply)
            .await
            .unwrap_or_else(|e| panic!("applying {file}: {e}"));
    }
    let roles = docs
        .iter()
        .filter(|d| d.types.as_ref().is_some_and(|t| t.kind == "ClusterRole"));
    for role in roles {
        let role = role.metadata.name.clone().expect("ClusterRole name");
        let binding: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": role, "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": handler, "namespace": namespace}],
        }))
        .expect("RoleBinding");
        manifest::apply(&admin, &binding, Some(namespace), Mode::Apply)
            .await
            .unwrap_or_else(|e| panic!("binding {role}: {e}"));
    }
    bind_cluster_scoped_rules(&admin, &docs, namespace, handler).await;
    let kubeconfig = cluster
        .service_account_kubeconfig(namespace, handler, Duration::from_secs(24 * 3600))
        .await
        .unwrap_or_else(|e| panic!("kubeconfig of {handler}: {e}"));
    let as_handler = cluster
        .client_for_kubeconfig(&kubeconfig)
        .await
        .expect("client of the handler");
    // Every handler may list MultigresClusters; the first successful list shows the grant
    // has reached the authorizer's cache.
    let clusters: Api<DynamicObject> =
        Api::namespaced_with(as_handler, namespace, &multigres_clusters());
    eventually("the RoleBindings take effect", WAIT, || async {
        clusters
            .list(&ListParams::default().limit(1))
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
    .await;
    kubeconfig
}

/// Resources with no namespace that a shipped ClusterRole names (nodes to find cordons, the
/// kube-system namespace for this Kubernetes cluster's identity).
const CLUSTER_SCOPED: [&str; 2] = ["nodes", "namespaces"];

/// Binds cluster-wide the rules of the shipped ClusterRoles `docs` that name only resources
/// without a namespace, as an install whose handler runs with `--watch-namespace` does
/// (`deploy/rbac/resource-handler.yaml` says so): a RoleBinding grants nothing on them.
async fn bind_cluster_scoped_rules(
    admin: &Client,
    docs: &[DynamicObject],
    namespace: &str,
    handler: &str,
) {
    let roles = docs
        .iter()
        .filter(|d| d.types.as_ref().is_some_and(|t| t.kind == "ClusterRole"));
    for role in roles {
        let rules: Vec<&serde_json::Value> = role.data["rules"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|rule| {
                let resources = rule["resources"].as_array().into_iter().flatten();
                let mut resources = resources.peekable();
                resources.peek().is_some()
                    && resources.all(|r| r.as_str().is_some_and(|r| CLUSTER_SCOPED.contains(&r)))
            })
            .collect();
        if rules.is_empty() {
            continue;
        }
        let name = format!(
            "{namespace}-{}-cluster-scoped",
            role.metadata.name.clone().unwrap_or_default()
        );
        let objects = [
            json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": name}, "rules": rules,
            }),
            json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                "subjects": [{"kind": "ServiceAccount", "name": handler, "namespace": namespace}],
            }),
        ];
        for object in objects {
            let object: DynamicObject = serde_json::from_value(object).expect("an RBAC object");
            manifest::apply(admin, &object, None, Mode::Apply)
                .await
                .unwrap_or_else(|e| panic!("binding {name} cluster-wide: {e}"));
        }
    }
}

/// Binds the webhook-server's shipped roles (`deploy/webhook/rbac.yaml`) to ServiceAccount
/// `webhook-server` in `system`: cluster-wide, and its certificate Secret role in `system`.
/// With `registrations`, it may also patch the caBundle of the registrations
/// `<registrations>-mutating` and `<registrations>-validating` (tests that register the webhooks
/// under their own names so others' registrations are left alone). Returns its kubeconfig.
pub async fn grant_webhook_rbac(
    cluster: &LocalCluster,
    system: &str,
    registrations: Option<&str>,
) -> PathBuf {
    let admin = admin(cluster);
    let file = "deploy/webhook/rbac.yaml";
    let rbac = std::fs::read_to_string(repo_path(file)).expect("webhook RBAC");
    let mut docs = manifest::parse_documents(&rbac, Path::new(file)).expect("RBAC documents");
    let subject = json!([{"kind": "ServiceAccount", "name": WEBHOOK, "namespace": system}]);
    let binding = |kind: &str, name: String, role: &str, namespace: Option<&str>| {
        serde_json::from_value::<DynamicObject>(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind,
            "metadata": {"name": name, "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": subject,
        }))
        .expect("binding")
    };
    docs.push(binding(
        "ClusterRoleBinding",
        format!("{system}-webhook-server"),
        "multigres-operator-webhook-server",
        None,
    ));
    docs.push(binding(
        "RoleBinding",
        "webhook-server-certificates".to_owned(),
        "multigres-operator-webhook-server-certificates",
        Some(system),
    ));
    if let Some(users) = registrations {
        let role = format!("{users}-webhook-registrations");
        docs.push(
            serde_json::from_value(json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": role},
                "rules": [
                    {"apiGroups": ["admissionregistration.k8s.io"],
                     "resources": ["mutatingwebhookconfigurations"],
                     "resourceNames": [format!("{users}-mutating")], "verbs": ["get", "patch"]},
                    {"apiGroups": ["admissionregistration.k8s.io"],
                     "resources": ["validatingwebhookconfigurations"],
                     "resourceNames": [format!("{users}-validating")], "verbs": ["get", "patch"]},
                ],
            }))
            .expect("registrations role"),
        );
        docs.push(binding("ClusterRoleBinding", role.clone(), &role, None));
    }
    for doc in &docs {
        let namespace = doc.metadata.namespace.clone();
        manifest::apply(&admin, doc, namespace.as_deref(), Mode::Apply)
            .await
            .unwrap_or_else(|e| panic!("applying the webhook's RBAC: {e}"));
    }
    cluster
        .service_account_kubeconfig(system, WEBHOOK, Duration::from_secs(24 * 3600))
        .await
        .unwrap_or_else(|e| panic!("kubeconfig of the webhook-server: {e}"))
}

/// The webhook-server on a fixed loopback port (so a restarted process serves the
/// registrations already in place), managing its own certificate in a directory of its own.
pub struct WebhookServer {
    /// The process; declared first so it stops before its certificate directory is removed.
    pub process: HandlerProcess,
    /// Its admission (HTTPS) address.
    pub address: SocketAddr,
    _certs: tempfile::TempDir,
}

impl WebhookServer {
    /// Starts the webhook-server with `kubeconfig` (see [`grant_webhook_rbac`]), its Service
    /// namespace `system`, `operators` (`namespace:name` ServiceAccounts allowed to write
    /// children) and, with `registrations`, the names of the registrations it patches; returns
    /// once it answers admissions. It checks its certificate every second, so tests see a
    /// rotation at once.
    pub async fn spawn(
        kubeconfig: &Path,
        system: &str,
        operators: &str,
        registrations: Option<&str>,
    ) -> WebhookServer {
        Self::spawn_with(kubeconfig, system, operators, registrations, Some("1s")).await
    }

    /// [`WebhookServer::spawn`] with the certificate checked every `cert_check_interval`, or as
    /// shipped (`None`), as the benchmark runs it.
    pub async fn spawn_with(
        kubeconfig: &Path,
        system: &str,
        operators: &str,
        registrations: Option<&str>,
        cert_check_interval: Option<&str>,
    ) -> WebhookServer {
        let certs = tempfile::Builder::new()
            .prefix("multigres-webhook-certs-")
            .tempdir()
            .expect("certificate directory");
        let address = std::net::SocketAddr::from((
            std::net::Ipv4Addr::LOCALHOST,
            crate::ports::free_loopback_port().expect("a free loopback port"),
        ));
        let mut flags = vec![
            format!("--webhook-bind-address={address}"),
            format!("--webhook-service-namespace={system}"),
            "--webhook-extra-sans=127.0.0.1".to_owned(),
            format!("--webhook-cert-dir={}", certs.path().display()),
            format!("--operator-service-accounts={operators}"),
        ];
        if let Some(interval) = cert_check_interval {
            flags.push(format!("--webhook-cert-check-interval={interval}"));
        }
        if let Some(users) = registrations {
            flags.push(format!(
                "--webhook-mutating-configurations={users}-mutating"
            ));
            flags.push(format!(
                "--webhook-validating-configurations={users}-validating"
            ));
        }
        let process = HandlerProcess::spawn(WEBHOOK, kubeconfig, &flags).await;
        let listening = process.admission_addr().await;
        assert_eq!(listening, address, "the webhook listens where it was told");
        WebhookServer {
            process,
            address,
            _certs: certs,
        }
    }
}

/// The shipped webhook registrations (`deploy/webhook/webhook-configurations.yaml`, failure
/// policy, rules and timeouts as shipped), pointed at `https://<address>` and limited to the
/// namespaces `namespace_selector` selects; renamed `<rename>-mutating` and
/// `<rename>-validating` when `rename` is given.
pub fn webhook_registrations(
    address: SocketAddr,
    namespace_selector: serde_json::Value,
    rename: Option<&str>,
) -> Vec<DynamicObject> {
    let file = "deploy/webhook/webhook-configurations.yaml";
    let text = std::fs::read_to_string(repo_path(file)).expect("webhook registrations");
    manifest::parse_documents(&text, Path::new(file))
        .expect("registration documents")
        .into_iter()
        .map(|doc| {
            let mut value = serde_json::to_value(&doc).expect("registration as JSON");
            if let Some(prefix) = rename {
                let suffix = match value["kind"].as_str() {
                    Some("MutatingWebhookConfiguration") => "mutating",
                    _ => "validating",
                };
                value["metadata"] = json!({"name": format!("{prefix}-{suffix}")});
            }
            for webhook in value["webhooks"].as_array_mut().expect("webhooks") {
                let path = webhook["clientConfig"]["service"]["path"]
                    .as_str()
                    .expect("webhook path")
                    .to_owned();
                webhook["clientConfig"] = json!({"url": format!("https://{address}{path}")});
                webhook["namespaceSelector"] = namespace_selector.clone();
            }
            serde_json::from_value(value).expect("registration")
        })
        .collect()
}

/// The selector of exactly one namespace, for [`webhook_registrations`].
pub fn only_namespace(namespace: &str) -> serde_json::Value {
    json!({"matchLabels": {"kubernetes.io/metadata.name": namespace}})
}

/// The pool pods of `cluster` not being deleted: name → (uid, Ready). Comparing two readings
/// shows which pods a change restarted and in which order they came back.
pub async fn pool_pods(
    client: &Client,
    namespace: &str,
    cluster: &str,
) -> BTreeMap<String, (String, bool)> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    pods.list(&ListParams::default().labels(&format!(
        "app.kubernetes.io/component=shard-pool,multigres.com/cluster={cluster}"
    )))
    .await
    .unwrap_or_else(|e| panic!("listing the pool pods of {cluster}: {e}"))
    .items
    .into_iter()
    .filter(|p| p.metadata.deletion_timestamp.is_none())
    .map(|p| {
        let ready = p
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        let name = p.metadata.name.unwrap_or_default();
        (name, (p.metadata.uid.unwrap_or_default(), ready))
    })
    .collect()
}

/// Lets the fake volumes of the kwok tier grow: volume expansion needs a StorageClass that
/// allows it, and kwok's own accepts the flag.
pub async fn allow_volume_expansion(client: &Client) {
    let classes: Api<StorageClass> = Api::all(client.clone());
    classes
        .patch(
            "kwok-volume",
            &PatchParams::default(),
            &Patch::Merge(json!({"allowVolumeExpansion": true})),
        )
        .await
        .unwrap_or_else(|e| panic!("allowing volume expansion on kwok-volume: {e}"));
}

/// The field manager tests write `Shard.status.podRoles` with, standing in for the
/// data-handler where none runs.
pub const DATA_HANDLER_STAND_IN: &str = "e2e-data-handler";

/// Publishes the roles of Shard `shard`'s pool pods `pods` on its status as the data-handler
/// does (a server-side apply of `status.podRoles`, with field manager [`DATA_HANDLER_STAND_IN`]):
/// `primary` is `PRIMARY`, every other pod `REPLICA`. For tests in which no data-handler runs:
/// a Shard is `Available` only once its roles name a primary among its pool pods.
pub async fn publish_roles<I, S>(shards: &Api<Shard>, shard: &str, pods: I, primary: &str)
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let roles: BTreeMap<String, &str> = pods
        .into_iter()
        .map(|p| {
            let pod = p.as_ref().to_owned();
            let role = if pod == primary { "PRIMARY" } else { "REPLICA" };
            (pod, role)
        })
        .collect();
    publish_status(shards, shard, json!({"podRoles": roles})).await;
}

/// Server-side applies `status` (the data-handler's fields) on Shard `shard`, with field
/// manager [`DATA_HANDLER_STAND_IN`]: the fields it leaves out that this manager set go.
pub async fn publish_status(shards: &Api<Shard>, shard: &str, status: serde_json::Value) {
    shards
        .patch_status(
            shard,
            &PatchParams::apply(DATA_HANDLER_STAND_IN).force(),
            &Patch::Apply(json!({
                "apiVersion": "multigres.com/v1alpha1", "kind": "Shard",
                "metadata": {"name": shard},
                "status": status,
            })),
        )
        .await
        .unwrap_or_else(|e| panic!("publishing the status of {shard}: {e}"));
}

/// Stands in for multiorch and the data-handler where neither runs (fake nodes, no
/// data-handler): every Shard in `namespace` whose `status.podRoles` names no primary among its
/// existing pool pods gets roles for them with [`publish_roles`], ordinal 0 of its first pool
/// StatefulSet (by name) as the primary. Call it while waiting for Shards, or the clusters they
/// belong to, to become Available; a Shard that has its primary is left alone.
pub async fn elect_primaries(client: &Client, namespace: &str) -> Result<(), String> {
    let shards: Api<Shard> = Api::namespaced(client.clone(), namespace);
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let pool = ListParams::default().labels("app.kubernetes.io/component=shard-pool");
    let pods = pods.list(&pool).await.map_err(|e| e.to_string())?.items;
    for shard in shards
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?
    {
        let mine: BTreeSet<String> = pods
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none() && is_pool_pod_of(p, &shard))
            .map(ResourceExt::name_any)
            .collect();
        let roles = shard.status.as_ref().map(|s| &s.pod_roles);
        let has_primary = roles
            .into_iter()
            .flatten()
            .any(|(pod, role)| role == "PRIMARY" && mine.contains(pod));
        let first = mine.iter().find(|p| p.rsplit('-').next() == Some("0"));
        if let (false, Some(primary)) = (has_primary, first) {
            publish_roles(&shards, &shard.name_any(), &mine, primary).await;
        }
    }
    Ok(())
}

/// Whether `pod` is a pool pod of `shard` (by the labels the resource-handler gives it).
fn is_pool_pod_of(pod: &Pod, shard: &Shard) -> bool {
    shard
        .labels()
        .get(multigres_api::labels::CLUSTER)
        .is_some_and(|cluster| multigres_api::labels::in_shard(pod.labels(), cluster, &shard.spec))
}

/// `multigres.com/v1alpha1` MultigresCluster, for dynamic clients.
pub fn multigres_clusters() -> ApiResource {
    ApiResource {
        group: "multigres.com".to_owned(),
        version: "v1alpha1".to_owned(),
        api_version: "multigres.com/v1alpha1".to_owned(),
        kind: "MultigresCluster".to_owned(),
        plural: "multigresclusters".to_owned(),
    }
}

/// The controllers' own write counter (what each write was for;
/// `multigres_common::metrics::API_WRITES_TOTAL`, a dev-dependency only here).
const API_WRITES: &str = "multigres_operator_api_writes_total";
/// The client's count of every mutating request (no write path bypasses it;
/// `multigres_common::metrics::KUBE_WRITE_REQUESTS_TOTAL`).
const KUBE_WRITE_REQUESTS: &str = "multigres_operator_kube_write_requests_total";

/// The longest a handler defers a status write while few objects converge, as in these tests
/// (`multigres_common::status_pacer::MIN_INTERVAL`, a dev-dependency only here).
pub const STATUS_PACING: Duration = Duration::from_secs(5);

/// How long a negative check ("nothing was restarted", "the children did not move") waits
/// after the change: longer than every periodic re-check of the handlers (the
/// resource-handler's 5 s poll of restarts and volumes, [`STATUS_PACING`]), so a defect that
/// acts on the next requeue rather than at once is seen.
pub const FULL_CYCLE: Duration = Duration::from_secs(7);

/// A running handler process, its log and the addresses it bound.
pub struct HandlerProcess {
    name: String,
    /// Declared before the log directory so the process stops before its log is removed.
    process: Supervised,
    log_dir: tempfile::TempDir,
    grpc: SocketAddr,
    metrics: SocketAddr,
}

/// Finds the "servers listening" line of a JSON log and returns the gRPC and metrics addresses.
pub fn listening_addrs(log: &str) -> Option<(SocketAddr, SocketAddr)> {
    log.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find(|entry| entry["message"] == "servers listening")
        .and_then(|entry| {
            let addr = |field: &str| entry[field].as_str()?.parse().ok();
            Some((addr("grpc_addr")?, addr("metrics_addr")?))
        })
}

impl HandlerProcess {
    /// Starts handler `name` on loopback ports chosen by the OS, logging JSON at info, with
    /// `extra` flags; returns once it listens.
    pub async fn spawn(name: &str, kubeconfig: &Path, extra: &[String]) -> HandlerProcess {
        let log_dir = tempfile::Builder::new()
            .prefix(&format!("multigres-{name}-"))
            .tempdir()
            .expect("log directory");
        let mut args = vec![
            format!("--kubeconfig={}", kubeconfig.display()),
            "--grpc-bind-address=127.0.0.1:0".to_owned(),
            "--metrics-bind-address=127.0.0.1:0".to_owned(),
            "--log-format=json".to_owned(),
            "--log-level=info".to_owned(),
        ];
        args.extend_from_slice(extra);
        let log = log_dir.path().join(format!("{name}.0.log"));
        let (process, grpc, metrics) = launch(name, &args, &log).await;
        HandlerProcess {
            name: name.to_owned(),
            process,
            log_dir,
            grpc,
            metrics,
        }
    }

    /// Grants `handler` its shipped RBAC in `namespace`, starts it watching only that
    /// namespace with `extra` flags, and waits until its caches are synced.
    pub async fn start_in(
        cluster: &LocalCluster,
        handler: &str,
        namespace: &str,
        extra: &[&str],
    ) -> HandlerProcess {
        let kubeconfig = grant_shipped_rbac(cluster, namespace, handler).await;
        let mut args = vec![format!("--watch-namespace={namespace}")];
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        let process = Self::spawn(handler, &kubeconfig, &args).await;
        process.wait_ready().await;
        process
    }

    /// Starts the same command line again after the process exited (or was killed or
    /// stopped), logging to a new file in the same directory, and waits until it is ready.
    pub async fn restart(&mut self) {
        assert!(
            !self.process.is_running(),
            "{} is still running; kill it first",
            self.name
        );
        let generation = std::fs::read_dir(self.log_dir.path())
            .map(|d| d.count())
            .unwrap_or(0);
        let log = self
            .log_dir
            .path()
            .join(format!("{}.{generation}.log", self.name));
        let args = self.process.args().to_vec();
        let (process, grpc, metrics) = launch(&self.name, &args, &log).await;
        self.process = process;
        self.grpc = grpc;
        self.metrics = metrics;
        self.wait_ready().await;
    }

    /// Waits until the handler logs that it is ready: caches synced, or for the
    /// webhook-server, the admission server listening.
    pub async fn wait_ready(&self) {
        self.wait_logged(ready_message(&self.name)).await;
    }

    /// Waits for the first log entry with `message` in this run's log and returns it.
    async fn wait_logged(&self, message: &str) -> serde_json::Value {
        eventually(&format!("{} logs {message:?}", self.name), WAIT, || async {
            let text = self.log();
            if let Some(status) = self.process.exit_status() {
                panic!("{} exited ({status}):\n{text}", self.name);
            }
            text.lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .find(|e| e["message"] == message)
                .ok_or(text)
        })
        .await
    }

    /// The webhook-server's admission (HTTPS) address, once it listens.
    pub async fn admission_addr(&self) -> SocketAddr {
        let entry = self.wait_logged(ADMISSION_MESSAGE).await;
        entry["address"]
            .as_str()
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("{ADMISSION_MESSAGE:?} without an address: {entry}"))
    }

    /// The handler's name (its binary).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Process id.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Its gRPC (health and HandlerInfo) address.
    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc
    }

    /// Everything it logged so far (this run only).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.process.log_path()).unwrap_or_default()
    }

    /// Current and peak resident set size in bytes.
    pub fn memory(&self) -> Option<(u64, u64)> {
        self.process.memory()
    }

    /// `Some(status)` once the process has exited.
    pub fn exit_status(&self) -> Option<std::process::ExitStatus> {
        self.process.exit_status()
    }

    /// Sends `signal` to the process (SIGKILL to simulate a crash, SIGTERM to stop it).
    #[allow(unsafe_code)] // libc calls, each under a SAFETY comment
    pub fn signal(&self, signal: libc::c_int) {
        let pid = libc::pid_t::try_from(self.process.pid()).expect("pid fits pid_t");
        // SAFETY: kill(2) only sends a signal to our own child; no memory is involved.
        let rc = unsafe { libc::kill(pid, signal) };
        assert_eq!(rc, 0, "signalling {}", self.name);
    }

    /// Stops the process: SIGTERM, then SIGKILL after ten seconds.
    pub fn stop(&self) {
        self.process.stop(Duration::from_secs(10));
    }

    /// Waits for the process to exit and returns its exit code (`None` if a signal ended it).
    pub async fn wait_exit(&self) -> Option<i32> {
        eventually(&format!("{} exits", self.name), WAIT, || async {
            self.process
                .exit_status()
                .map(|s| s.code())
                .ok_or_else(|| self.process.log_tail(20))
        })
        .await
    }

    /// Its `/metrics` page.
    pub async fn metrics(&self) -> String {
        let mut stream = TcpStream::connect(self.metrics)
            .await
            .unwrap_or_else(|e| panic!("{} metrics at {}: {e}", self.name, self.metrics));
        let request = format!(
            "GET /metrics HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            self.metrics
        );
        stream
            .write_all(request.as_bytes())
            .await
            .expect("metrics request");
        let mut response = String::new();
        stream
            .read_to_string(&mut response)
            .await
            .expect("metrics response");
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        response
    }

    /// Sum of counter or gauge `name` over the series whose label set contains `label` (for
    /// example `kind="Shard"`; empty for all series).
    pub async fn counter(&self, name: &str, label: &str) -> u64 {
        self.metrics()
            .await
            .lines()
            .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(label))
            .filter_map(|l| l.rsplit_once(' ')?.1.trim().parse::<f64>().ok())
            .sum::<f64>() as u64
    }

    /// Every Kubernetes write the handler made: what its controllers counted, keyed
    /// `controller/kind/verb`, and every mutating request its client sent, keyed
    /// `kube/resource[/subresource]/verb` (counted in the client, so a write path that forgets
    /// to count still shows here; Lease renewals left out).
    pub async fn writes(&self) -> BTreeMap<String, u64> {
        let metrics = self.metrics().await;
        let series = |name: &'static str| {
            metrics.lines().filter_map(move |line| {
                let rest = line.strip_prefix(name)?.strip_prefix('{')?;
                let (labels, value) = rest.split_once("} ")?;
                let label = |key: &str| {
                    labels
                        .split(',')
                        .find_map(|kv| kv.strip_prefix(&format!("{key}=\"")))
                        .map(|v| v.trim_end_matches('"').to_owned())
                        .unwrap_or_default()
                };
                let key = match name {
                    API_WRITES => {
                        format!(
                            "{}/{}/{}",
                            label("controller"),
                            label("kind"),
                            label("verb")
                        )
                    }
                    // A Lease renewal is the leader's heartbeat, not a write objects cause.
                    _ if label("resource") == "leases" => return None,
                    _ => match label("subresource").as_str() {
                        "" => format!("kube/{}/{}", label("resource"), label("verb")),
                        sub => format!("kube/{}/{sub}/{}", label("resource"), label("verb")),
                    },
                };
                Some((key, value.trim().parse().ok()?))
            })
        };
        series(API_WRITES)
            .chain(series(KUBE_WRITE_REQUESTS))
            .collect()
    }

    /// Waits until the write counters have held still for `quiet` (the handler converged) and
    /// returns them. Handlers defer a converging object's progress-only status writes by up to
    /// [`STATUS_PACING`], so stillness counts only once it lasted longer than that.
    pub async fn settled(&self, quiet: Duration) -> BTreeMap<String, u64> {
        let quiet = quiet.max(STATUS_PACING + Duration::from_secs(1));
        let mut last = self.writes().await;
        let mut still_since = Instant::now();
        let deadline = Instant::now() + WAIT + quiet;
        while still_since.elapsed() < quiet {
            assert!(
                Instant::now() < deadline,
                "{}: writes never settle: {last:?}\n{}",
                self.name,
                self.process.log_tail(40)
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
            let now = self.writes().await;
            if now != last {
                last = now;
                still_since = Instant::now();
            }
        }
        last
    }
}

/// Starts handler `name` with `args`, logging to `log`, and waits until it listens.
async fn launch(name: &str, args: &[String], log: &Path) -> (Supervised, SocketAddr, SocketAddr) {
    let process = Supervised::spawn(name, &handler_binary(name), args, &[], log)
        .unwrap_or_else(|e| panic!("starting {name}: {e}"));
    let (grpc, metrics) = eventually(&format!("{name} listens"), WAIT, || async {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        // A handler that listened and then exited (say, on a bad kubeconfig) is returned, so
        // the test can look at how it exited.
        if let Some(addrs) = listening_addrs(&text) {
            return Ok(addrs);
        }
        if let Some(status) = process.exit_status() {
            panic!("{name} exited early ({status}):\n{text}");
        }
        Err(text)
    })
    .await;
    (process, grpc, metrics)
}

impl Drop for HandlerProcess {
    /// A failing test shows what the handler logged.
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- {} log (last 80 lines) ---\n{}",
                self.name,
                self.process.log_tail(80)
            );
        }
    }
}

/// The three controller handlers serving one namespace, as in production but scoped to it.
pub struct Stack {
    pub cluster_handler: HandlerProcess,
    pub resource_handler: HandlerProcess,
    /// Present when the test has a reachable topology etcd (kwok pods run no etcd).
    pub data_handler: Option<HandlerProcess>,
}

impl Stack {
    /// Starts the cluster-handler and resource-handler in `namespace`; the data-handler too
    /// when `data_handler_flags` is given (its `--topo-*` tuning, for example).
    pub async fn start(
        cluster: &LocalCluster,
        namespace: &str,
        data_handler_flags: Option<&[&str]>,
    ) -> Stack {
        let cluster_handler =
            HandlerProcess::start_in(cluster, "cluster-handler", namespace, &[]).await;
        let resource_handler =
            HandlerProcess::start_in(cluster, "resource-handler", namespace, &[]).await;
        let data_handler = match data_handler_flags {
            Some(flags) => {
                Some(HandlerProcess::start_in(cluster, "data-handler", namespace, flags).await)
            }
            None => None,
        };
        Stack {
            cluster_handler,
            resource_handler,
            data_handler,
        }
    }

    /// Every running handler of the stack.
    pub fn handlers(&self) -> Vec<&HandlerProcess> {
        let mut all = vec![&self.cluster_handler, &self.resource_handler];
        all.extend(self.data_handler.as_ref());
        all
    }
}

/// A client acting as the cluster administrator (the test, or the user).
pub fn admin(cluster: &LocalCluster) -> Client {
    cluster.client().expect("admin client")
}

/// Server-side applies every document of `yaml` into `namespace` as the user would
/// (`kubectl apply --server-side`).
pub async fn apply_yaml(cluster: &LocalCluster, namespace: &str, yaml: &str) {
    let client = admin(cluster);
    for doc in manifest::parse_documents(yaml, Path::new("inline.yaml")).expect("YAML documents") {
        manifest::apply(&client, &doc, Some(namespace), Mode::Apply)
            .await
            .unwrap_or_else(|e| panic!("applying {:?}: {e}", doc.metadata.name));
    }
}

/// Every kind the handlers (and the workload controllers acting for them) create for a cluster,
/// Pods included; all carry the `multigres.com/cluster` label.
pub fn cluster_object_kinds() -> Vec<ApiResource> {
    [
        ("multigres.com", "v1alpha1", "TopoServer", "toposervers"),
        ("multigres.com", "v1alpha1", "Cell", "cells"),
        ("multigres.com", "v1alpha1", "TableGroup", "tablegroups"),
        ("multigres.com", "v1alpha1", "Shard", "shards"),
        ("apps", "v1", "StatefulSet", "statefulsets"),
        ("apps", "v1", "Deployment", "deployments"),
        ("", "v1", "Pod", "pods"),
        ("", "v1", "Service", "services"),
        ("", "v1", "ConfigMap", "configmaps"),
        ("", "v1", "Secret", "secrets"),
        ("", "v1", "PersistentVolumeClaim", "persistentvolumeclaims"),
        (
            "policy",
            "v1",
            "PodDisruptionBudget",
            "poddisruptionbudgets",
        ),
    ]
    .into_iter()
    .map(|(g, v, k, p)| ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(g, v, k), p))
    .collect()
}

/// Every object of `kinds` in `namespace` labelled as part of cluster `name`.
pub async fn cluster_objects(
    client: &Client,
    namespace: &str,
    name: &str,
    kinds: &[ApiResource],
) -> Vec<(ApiResource, DynamicObject)> {
    let selector = ListParams::default().labels(&format!("multigres.com/cluster={name}"));
    let mut out = Vec::new();
    for resource in kinds {
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, resource);
        let listed = api
            .list(&selector)
            .await
            .unwrap_or_else(|e| panic!("listing {}: {e}", resource.plural));
        out.extend(listed.items.into_iter().map(|o| (resource.clone(), o)));
    }
    out
}

/// Runs the real helm with its own cache and config directories; returns whether it succeeded,
/// its stdout and its stderr. `kubeconfig` is given for commands that talk to a cluster.
pub async fn run_helm(args: &[&str], kubeconfig: Option<&Path>) -> (bool, String, String) {
    static HOME: OnceLock<tempfile::TempDir> = OnceLock::new();
    let home = HOME.get_or_init(|| {
        tempfile::Builder::new()
            .prefix("multigres-helm-")
            .tempdir()
            .expect("helm home")
    });
    let program = crate::toolchain::binary("helm").unwrap_or_else(|e| panic!("{e}"));
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .env("HELM_CACHE_HOME", home.path().join("cache"))
        .env("HELM_CONFIG_HOME", home.path().join("config"))
        .env("HELM_DATA_HOME", home.path().join("data"))
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env("no_proxy", "127.0.0.1,localhost")
        .kill_on_drop(true);
    if let Some(path) = kubeconfig {
        command.arg(format!("--kubeconfig={}", path.display()));
    }
    let out = command.output().await.expect("running helm");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `helm template` of the repository's chart as release `release` in `namespace` for
/// Kubernetes 1.36, with `sets` as `--set` values, as parsed documents.
pub async fn helm_template(
    release: &str,
    namespace: &str,
    sets: &[&str],
) -> Vec<serde_json::Value> {
    let chart = repo_path("deploy/helm/multigres-operator");
    let mut args = vec![
        "template",
        release,
        chart.to_str().expect("utf-8 path"),
        "--namespace",
        namespace,
        "--kube-version",
        "1.36.0",
    ];
    for set in sets {
        args.extend(["--set", set]);
    }
    yaml_documents(&helm(&args, None).await)
}

/// The YAML documents of `text` (what `helm template` prints), empty ones left out.
pub fn yaml_documents(text: &str) -> Vec<serde_json::Value> {
    serde_yaml::Deserializer::from_str(text)
        .filter_map(|doc| {
            let value = <serde_json::Value as serde::Deserialize>::deserialize(doc)
                .expect("rendered YAML parses");
            (!value.is_null()).then_some(value)
        })
        .collect()
}

/// Runs helm; returns stdout, or panics with stderr.
pub async fn helm(args: &[&str], kubeconfig: Option<&Path>) -> String {
    let (ok, stdout, stderr) = run_helm(args, kubeconfig).await;
    assert!(ok, "helm {} failed:\n{stderr}", args.join(" "));
    stdout
}
