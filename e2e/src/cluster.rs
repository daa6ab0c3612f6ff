//! A real Kubernetes control plane on 127.0.0.1: etcd, kube-apiserver (RBAC, default admission
//! plugins), kube-controller-manager, kube-scheduler and kwok with fake Nodes in three zones, plus
//! the project's CRDs. Tests get real schema validation, CEL, server-side apply, garbage
//! collection and workload controllers without containers; nothing listens beyond loopback.
//!
//! Every process is supervised by [`crate::process`], so none survives the harness. Logs go to
//! `<dir>/logs/<component>.log`; startup errors carry the tail of the relevant logs.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, Node, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde_json::json;
use tempfile::TempDir;

// Re-exported: `cluster::{ZONE_LABEL, ..., REGION}` is the public path tests and binaries use.
pub use crate::labels::{REGION, REGION_LABEL, ZONE_ID_LABEL, ZONE_LABEL};
use crate::manifest::{self, FIELD_MANAGER, ManifestError, Mode};
use crate::nodes::{self, NodesError, RealNodes};
use crate::pki::{Pki, PkiError};
use crate::process::{ProcessError, Supervised};
use crate::toolchain::{self, ToolchainError};

/// The only address anything binds to or dials.
const LOOPBACK: Ipv4Addr = Ipv4Addr::LOCALHOST;
/// Service ClusterIPs: allocated, never routed.
const SERVICE_CIDR: &str = "198.19.0.0/16";
/// Pod IPs handed out by kwok (RFC 2544 benchmarking range, never routed).
const POD_CIDR: &str = "198.18.0.0/16";
/// The `kubernetes` Service's ClusterIP (the first address of [`SERVICE_CIDR`]).
const KUBERNETES_SERVICE_IP: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 1);
/// Environment for every child: never send loopback traffic through a proxy.
const NO_PROXY: &str = "127.0.0.1,localhost";
/// How long a component gets between SIGTERM and SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// Zones of the shared real-node cluster's nodes: one per zone, and a second in `zone-a`, so
/// that a cell's pods have somewhere to go when a node is drained.
pub const REAL_NODE_ZONES: [&str; 4] = ["zone-a", "zone-b", "zone-c", "zone-a"];
/// Lines of log quoted in startup errors.
const LOG_TAIL_LINES: usize = 40;
/// Every request at level Metadata (who, verb, object, response code; no bodies), logged when
/// the response starts (watches) and completes; `RequestReceived` would only log it twice.
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
";

/// Errors starting or using the local control plane.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error(transparent)]
    Toolchain(#[from] ToolchainError),
    #[error(transparent)]
    Pki(#[from] PkiError),
    #[error(transparent)]
    Process(#[from] ProcessError),
    #[error(transparent)]
    Nodes(#[from] NodesError),
    #[error("this cluster has no real nodes")]
    NoRealNodes,
    #[error(transparent)]
    Manifest(Box<ManifestError>),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("loading kubeconfig {path}: {source}")]
    Kubeconfig {
        path: PathBuf,
        source: kube::config::KubeconfigError,
    },
    #[error("{what}: {source}")]
    Kube { what: String, source: kube::Error },
    #[error("{component} exited during startup ({status}); last lines of {log}:\n{tail}")]
    Exited {
        component: String,
        status: std::process::ExitStatus,
        log: PathBuf,
        tail: String,
    },
    #[error("timed out after {waited:?} waiting for {what}; last log lines:\n{logs}")]
    Timeout {
        what: String,
        waited: Duration,
        logs: String,
    },
    #[error("the TokenRequest for ServiceAccount {account} returned no token")]
    NoToken { account: String },
    #[error("kubectl {args} failed ({status}):\n{stderr}")]
    Kubectl {
        args: String,
        status: std::process::ExitStatus,
        stderr: String,
    },
}

impl From<ManifestError> for ClusterError {
    fn from(e: ManifestError) -> Self {
        ClusterError::Manifest(Box::new(e))
    }
}

impl ClusterError {
    fn kube(what: impl Into<String>) -> impl FnOnce(kube::Error) -> ClusterError {
        let what = what.into();
        move |source| ClusterError::Kube { what, source }
    }

    fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ClusterError {
        let what = what.into();
        move |source| ClusterError::Io { what, source }
    }
}

/// How to start a [`LocalCluster`].
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// Working directory (certificates, kubeconfigs, etcd data, logs). `None`: a fresh temp dir,
    /// removed on stop. `Some`: created if missing and kept on stop (logs stay for inspection);
    /// etcd data from an earlier run is wiped at start.
    pub state_dir: Option<PathBuf>,
    /// CustomResourceDefinitions to install (every `*.yaml` in the directory). `None`: none,
    /// for a test of an install (the Helm chart) that brings its own.
    pub crd_dir: Option<PathBuf>,
    /// One fake Node per zone, named `kwok-node-<zone>`.
    pub zones: Vec<String>,
    /// Budget for each wait during startup (API server ready, CRDs established, Nodes ready).
    pub wait_timeout: Duration,
    /// Real nodes instead of kwok's fakes: one per zone, named `node-<zone>`, with containerd, a
    /// kubelet, kube-proxy, CoreDNS and a local-path provisioner (see [`crate::nodes`]). Only
    /// inside the sandbox `e2e/run-e2e.sh` creates.
    pub real_nodes: bool,
    /// Write the API server's audit log (every request at level Metadata, one JSON line per
    /// request stage after `RequestReceived`) to `<dir>/logs/audit.log`, so a benchmark can count
    /// requests per user and verb. Off by default: it costs the API server some CPU.
    pub audit: bool,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            state_dir: None,
            crd_dir: Some(Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds")),
            zones: ["zone-a", "zone-b", "zone-c"].map(String::from).to_vec(),
            wait_timeout: Duration::from_secs(90),
            real_nodes: false,
            audit: false,
        }
    }
}

/// Memory use of one control-plane process, read from `/proc`.
#[derive(Debug, Clone)]
pub struct ComponentMemory {
    /// Component name (`etcd`, `kube-apiserver`, ...).
    pub component: String,
    /// Current resident set size in bytes.
    pub rss_bytes: u64,
    /// Peak resident set size in bytes (`VmHWM`).
    pub peak_rss_bytes: u64,
}

/// A running local control plane; stopped (no process left) on [`LocalCluster::stop`] or drop.
#[derive(Debug)]
pub struct LocalCluster {
    dir: PathBuf,
    /// The temp dir when no state dir was given; removed on stop.
    temp_dir: Mutex<Option<TempDir>>,
    stopped: AtomicBool,
    pki: Pki,
    server: String,
    kubeconfig: PathBuf,
    config: Config,
    components: Vec<Supervised>,
    /// kube-apiservers started by [`LocalCluster::restart_apiserver`], newest last; the newest
    /// replaces the one in `components`.
    restarted_apiservers: Mutex<Vec<Supervised>>,
    node_names: Vec<String>,
    startup: Duration,
    /// The audit log, when [`ClusterOptions::audit`] is set.
    audit_log: Option<PathBuf>,
    /// Real nodes, when [`ClusterOptions::real_nodes`] is set.
    real_nodes: Mutex<Option<RealNodes>>,
}

impl LocalCluster {
    /// Starts every component, creates the fake Nodes, installs the CRDs and returns once Nodes
    /// are schedulable and CRDs established.
    pub async fn start(opts: ClusterOptions) -> Result<LocalCluster, ClusterError> {
        let began = Instant::now();
        let (dir, temp_dir) = match &opts.state_dir {
            None => {
                let tmp = tempfile::Builder::new()
                    .prefix("multigres-e2e-")
                    .tempdir()
                    .map_err(ClusterError::io("creating the cluster temp dir"))?;
                (tmp.path().to_path_buf(), Some(tmp))
            }
            Some(dir) => (dir.clone(), None),
        };
        for sub in ["logs", "pki", "kwok"] {
            std::fs::create_dir_all(dir.join(sub)).map_err(ClusterError::io(format!(
                "creating {}",
                dir.join(sub).display()
            )))?;
        }
        let etcd_data = dir.join("etcd");
        if etcd_data.exists() {
            std::fs::remove_dir_all(&etcd_data).map_err(ClusterError::io(format!(
                "removing stale {}",
                etcd_data.display()
            )))?;
        }

        if opts.real_nodes {
            nodes::prepare_sandbox(opts.zones.len(), SERVICE_CIDR)?;
        }
        let pki = Pki::generate(
            &dir.join("pki"),
            &[LOOPBACK, nodes::CONTROL_PLANE_IP, KUBERNETES_SERVICE_IP],
        )?;
        let [apiserver_port, etcd_client_port, etcd_peer_port] = free_ports()?;
        let server = format!("https://{LOOPBACK}:{apiserver_port}");
        let kubeconfig = dir.join("admin.kubeconfig");
        write_kubeconfig(
            &kubeconfig,
            &server,
            &pki.ca_cert,
            json!({"client-certificate": pki.admin_cert, "client-key": pki.admin_key}),
        )?;
        let config = load_config(&kubeconfig).await?;

        let audit_log = opts.audit.then(|| dir.join("logs").join("audit.log"));
        let mut cluster = LocalCluster {
            dir,
            temp_dir: Mutex::new(temp_dir),
            stopped: AtomicBool::new(false),
            pki,
            server,
            kubeconfig,
            config,
            components: Vec::new(),
            restarted_apiservers: Mutex::new(Vec::new()),
            node_names: crate::nodes::unique_names(
                if opts.real_nodes { "node" } else { "kwok-node" },
                &opts.zones,
            ),
            startup: Duration::ZERO,
            audit_log,
            real_nodes: Mutex::new(None),
        };
        // From here on, an early return drops `cluster`, which stops what was started.
        cluster
            .start_etcd_and_apiserver(
                &etcd_data,
                [apiserver_port, etcd_client_port, etcd_peer_port],
                opts.wait_timeout,
                opts.real_nodes,
            )
            .await?;
        if opts.real_nodes {
            cluster.start_real_nodes(&opts).await?;
            cluster.startup = began.elapsed();
            tracing::info!(
                startup = ?cluster.startup,
                server = %cluster.server,
                dir = %cluster.dir.display(),
                "local control plane with real nodes ready"
            );
            return Ok(cluster);
        }
        let stages = stages_dir()?;
        cluster.start_scheduler()?;
        cluster.start_kwok(&stages)?;
        let client = cluster.client()?;
        let storage_class =
            manifest::read_documents(&stages.join("volume/fast/storage-class.yaml"))?;
        for doc in &storage_class {
            manifest::apply(&client, doc, None, Mode::Apply).await?;
        }
        // CRDs before the controller manager, so its garbage collector discovers them at once.
        if let Some(crd_dir) = &opts.crd_dir {
            cluster
                .install_crds(&client, crd_dir, opts.wait_timeout)
                .await?;
        }
        cluster.start_controller_manager(false)?;
        cluster.create_nodes(&client, &opts.zones).await?;
        cluster
            .wait_nodes_schedulable(&client, opts.wait_timeout)
            .await?;

        cluster.startup = began.elapsed();
        tracing::info!(
            startup = ?cluster.startup,
            server = %cluster.server,
            dir = %cluster.dir.display(),
            "local control plane ready"
        );
        Ok(cluster)
    }

    /// One control plane per process, started on first use and stopped when the process exits
    /// (from an `atexit` hook, since statics are never dropped). For test binaries whose tests
    /// each work in their own namespace.
    pub async fn shared() -> Result<&'static LocalCluster, &'static ClusterError> {
        static SHARED: SharedCluster = tokio::sync::OnceCell::const_new();
        extern "C" fn stop_shared() {
            if let Some(Ok(cluster)) = SHARED.get() {
                cluster.shutdown();
            }
        }
        start_shared(&SHARED, ClusterOptions::default(), stop_shared).await
    }

    /// Like [`LocalCluster::shared`], without the CRDs: for tests of the Helm chart, whose
    /// install creates them. (Deleting CRDs a test installed waits on the API server's cleanup
    /// of each one, which took over 60 s under the load of a full run.)
    pub async fn shared_without_crds() -> Result<&'static LocalCluster, &'static ClusterError> {
        static SHARED: SharedCluster = tokio::sync::OnceCell::const_new();
        extern "C" fn stop_shared() {
            if let Some(Ok(cluster)) = SHARED.get() {
                cluster.shutdown();
            }
        }
        let opts = ClusterOptions {
            crd_dir: None,
            ..ClusterOptions::default()
        };
        start_shared(&SHARED, opts, stop_shared).await
    }

    /// Like [`LocalCluster::shared`], with real nodes ([`REAL_NODE_ZONES`]): for the test
    /// binaries of the real-node tier.
    pub async fn shared_real_nodes() -> Result<&'static LocalCluster, &'static ClusterError> {
        static SHARED: SharedCluster = tokio::sync::OnceCell::const_new();
        extern "C" fn stop_shared() {
            if let Some(Ok(cluster)) = SHARED.get() {
                cluster.shutdown();
            }
        }
        let opts = ClusterOptions {
            real_nodes: true,
            zones: REAL_NODE_ZONES.map(String::from).to_vec(),
            ..ClusterOptions::default()
        };
        start_shared(&SHARED, opts, stop_shared).await
    }

    async fn start_etcd_and_apiserver(
        &mut self,
        etcd_data: &Path,
        [apiserver_port, client_port, peer_port]: [u16; 3],
        timeout: Duration,
        real_nodes: bool,
    ) -> Result<(), ClusterError> {
        let client_url = format!("http://{LOOPBACK}:{client_port}");
        let peer_url = format!("http://{LOOPBACK}:{peer_port}");
        self.spawn(
            "etcd",
            &[
                "--name=node0".into(),
                format!("--data-dir={}", etcd_data.display()),
                format!("--listen-client-urls={client_url}"),
                format!("--advertise-client-urls={client_url}"),
                format!("--listen-peer-urls={peer_url}"),
                format!("--initial-advertise-peer-urls={peer_url}"),
                format!("--initial-cluster=node0={peer_url}"),
                "--initial-cluster-state=new".into(),
                "--auto-compaction-retention=1".into(),
                "--unsafe-no-fsync=true".into(),
                "--log-level=warn".into(),
                // As kubeadm sets it: the API server's watch caches advance on progress
                // notices even for kinds nobody writes, so after an API server restart a
                // list answers with a version its watch cache can resume from (KEP-1904).
                // With etcd's 10-minute default, watches of idle kinds fail with 410 Gone
                // after every re-list until something of that kind changes.
                "--watch-progress-notify-interval=5s".into(),
            ],
            &[],
        )?;
        let pki = &self.pki;
        let mut args = vec![
            format!("--etcd-servers={client_url}"),
            format!("--secure-port={apiserver_port}"),
            format!("--service-cluster-ip-range={SERVICE_CIDR}"),
            format!("--tls-cert-file={}", pki.apiserver_cert.display()),
            format!("--tls-private-key-file={}", pki.apiserver_key.display()),
            format!("--client-ca-file={}", pki.ca_cert.display()),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            format!(
                "--service-account-signing-key-file={}",
                pki.sa_key.display()
            ),
            format!("--service-account-key-file={}", pki.sa_pub.display()),
            "--allow-privileged=true".into(),
            format!("--cert-dir={}", self.dir.join("pki").display()),
        ];
        if real_nodes {
            // Pods reach the API server through the `kubernetes` Service, whose endpoint is the
            // advertised address (127.0.0.1 inside a pod is the pod); the API server reaches
            // kubelets (logs, exec, port-forward) on their InternalIP with a client certificate.
            let (kubelet_cert, kubelet_key) = pki.client(
                "apiserver-kubelet-client",
                "kube-apiserver-kubelet-client",
                Some("system:masters"),
            )?;
            args.extend([
                "--bind-address=0.0.0.0".into(),
                format!("--advertise-address={}", nodes::CONTROL_PLANE_IP),
                "--authorization-mode=Node,RBAC".into(),
                format!("--kubelet-client-certificate={}", kubelet_cert.display()),
                format!("--kubelet-client-key={}", kubelet_key.display()),
                format!("--kubelet-certificate-authority={}", pki.ca_cert.display()),
                "--kubelet-preferred-address-types=InternalIP".into(),
            ]);
        } else {
            args.extend([
                format!("--bind-address={LOOPBACK}"),
                format!("--advertise-address={LOOPBACK}"),
                "--endpoint-reconciler-type=none".into(),
                "--authorization-mode=RBAC".into(),
            ]);
        }
        if let Some(log) = &self.audit_log {
            let policy = self.dir.join("audit-policy.yaml");
            std::fs::write(&policy, AUDIT_POLICY)
                .map_err(ClusterError::io(format!("writing {}", policy.display())))?;
            args.extend([
                format!("--audit-policy-file={}", policy.display()),
                format!("--audit-log-path={}", log.display()),
                "--audit-log-format=json".into(),
                "--audit-log-mode=blocking".into(),
                // Never rotate (0 would mean lumberjack's default of 100 MB): readers keep
                // byte offsets into the one file.
                "--audit-log-maxsize=1000000".into(),
            ]);
        }
        self.spawn("kube-apiserver", &args, &[])?;

        let client = self.client()?;
        let deadline = Instant::now() + timeout;
        loop {
            self.check_alive()?;
            let request = http::Request::get("/readyz")
                .body(Vec::new())
                .expect("static request");
            match client.request_text(request).await {
                Ok(body) if body.trim() == "ok" => return Ok(()),
                _ if Instant::now() >= deadline => {
                    return Err(self.timeout(
                        "kube-apiserver /readyz",
                        timeout,
                        &["kube-apiserver", "etcd"],
                    ));
                }
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    /// The real-node tier: scheduler and controller manager, containerd and a kubelet per zone,
    /// kube-proxy, the CRDs, CoreDNS and the local-path StorageClass; returns once every Node
    /// is Ready and cluster DNS answers (its pod is Ready).
    async fn start_real_nodes(&mut self, opts: &ClusterOptions) -> Result<(), ClusterError> {
        self.start_scheduler()?;
        let client = self.client()?;
        if let Some(crd_dir) = &opts.crd_dir {
            self.install_crds(&client, crd_dir, opts.wait_timeout)
                .await?;
        }
        self.start_controller_manager(true)?;
        let real = RealNodes::start(
            &self.dir,
            &opts.zones,
            &self.pki,
            &self.server,
            &self.config,
        )?;
        let waited = real.wait_ready(&client, opts.wait_timeout * 2).await;
        *self.real_nodes.lock().unwrap_or_else(|p| p.into_inner()) = Some(real);
        waited?;
        for doc in nodes::addon_manifests() {
            let doc: kube::api::DynamicObject =
                serde_json::from_value(doc).expect("the add-on literals are Kubernetes objects");
            manifest::apply(&client, &doc, None, Mode::Apply).await?;
        }
        let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client, "kube-system");
        let deadline = Instant::now() + opts.wait_timeout;
        loop {
            self.check_alive()?;
            let ready = pods
                .list(&ListParams::default().labels("k8s-app=kube-dns"))
                .await
                .map_err(ClusterError::kube("listing the CoreDNS pods"))?
                .items
                .iter()
                .any(|pod| {
                    pod.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|cs| {
                            cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                        })
                });
            if ready {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(self.timeout(
                    "the CoreDNS pod to be Ready",
                    opts.wait_timeout,
                    &["kube-scheduler", "kube-controller-manager"],
                ));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// The real nodes, when the cluster has them: their names, zones, addresses and directories.
    pub fn real_nodes(&self) -> Vec<nodes::RealNode> {
        self.real_nodes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|real| real.nodes().to_vec())
            .unwrap_or_default()
    }

    /// Stops the real node `name` abruptly (see [`RealNodes::power_off`]).
    pub fn power_off(&self, name: &str) -> Result<(), ClusterError> {
        let mut real = self.real_nodes.lock().unwrap_or_else(|p| p.into_inner());
        let real = real.as_mut().ok_or(ClusterError::NoRealNodes)?;
        Ok(real.power_off(name)?)
    }

    /// Starts the real node `name` again after [`LocalCluster::power_off`].
    pub fn power_on(&self, name: &str) -> Result<(), ClusterError> {
        let mut real = self.real_nodes.lock().unwrap_or_else(|p| p.into_inner());
        let real = real.as_mut().ok_or(ClusterError::NoRealNodes)?;
        Ok(real.power_on(name, &self.pki, &self.server, &self.dir.join("logs"))?)
    }

    fn start_scheduler(&mut self) -> Result<(), ClusterError> {
        let args = vec![
            format!("--kubeconfig={}", self.kubeconfig.display()),
            format!("--bind-address={LOOPBACK}"),
            "--secure-port=0".into(),
            "--leader-elect=false".into(),
        ];
        self.spawn("kube-scheduler", &args, &[])
    }

    fn start_kwok(&mut self, stages: &Path) -> Result<(), ClusterError> {
        let mut args = vec![
            format!("--kubeconfig={}", self.kubeconfig.display()),
            // Only the fake Nodes: real ones (kubelets) must keep their own pods.
            "--manage-all-nodes=false".into(),
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake".into(),
            format!("--cidr={POD_CIDR}"),
            "--node-lease-duration-seconds=40".into(),
        ];
        for file in kwok_stage_files(stages)? {
            args.push(format!("--config={}", file.display()));
        }
        let workdir = self.dir.join("kwok");
        let workdir = workdir.to_string_lossy().into_owned();
        self.spawn("kwok", &args, &[("KWOK_WORKDIR", &workdir)])
    }

    /// kube-controller-manager as in a real cluster: its own identity
    /// (`system:kube-controller-manager`) and one service account per controller, so the
    /// garbage collector deletes as `system:serviceaccount:kube-system:generic-garbage-collector`
    /// (which the operator's webhook lets delete its child objects), not as the admin.
    ///
    /// With kwok's nodes (`routes_traffic` false) the Endpoints and EndpointSlice controllers
    /// stay off: no packet reaches a kwok pod and nothing in that tier reads those objects,
    /// while keeping them in step with every Service and pod made 14 % of the API requests of
    /// `faults.rs`.
    fn start_controller_manager(&mut self, routes_traffic: bool) -> Result<(), ClusterError> {
        let (cert, key) =
            self.pki
                .client("controller-manager", "system:kube-controller-manager", None)?;
        let kubeconfig = self.dir.join("controller-manager.kubeconfig");
        write_kubeconfig(
            &kubeconfig,
            &self.server,
            &self.pki.ca_cert,
            json!({"client-certificate": cert, "client-key": key}),
        )?;
        let mut args = vec![
            format!("--kubeconfig={}", kubeconfig.display()),
            "--use-service-account-credentials=true".into(),
            format!("--bind-address={LOOPBACK}"),
            "--secure-port=0".into(),
            "--leader-elect=false".into(),
            format!(
                "--service-account-private-key-file={}",
                self.pki.sa_key.display()
            ),
            format!("--root-ca-file={}", self.pki.ca_cert.display()),
            "--node-monitor-period=5s".into(),
            "--node-monitor-grace-period=40s".into(),
            "--kube-api-qps=100".into(),
            "--kube-api-burst=200".into(),
        ];
        if !routes_traffic {
            args.push(
                "--controllers=*,-endpoints-controller,-endpointslice-controller,\
                 -endpointslice-mirroring-controller"
                    .into(),
            );
        }
        self.spawn("kube-controller-manager", &args, &[])
    }

    async fn install_crds(
        &self,
        client: &Client,
        crd_dir: &Path,
        timeout: Duration,
    ) -> Result<(), ClusterError> {
        let mut names = Vec::new();
        for file in manifest::yaml_files(crd_dir)? {
            for doc in manifest::read_documents(&file)? {
                let applied = manifest::apply(client, &doc, None, Mode::Apply).await?;
                names.extend(applied.metadata.name);
            }
        }
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        let deadline = Instant::now() + timeout;
        for name in &names {
            loop {
                let crd = crds
                    .get(name)
                    .await
                    .map_err(ClusterError::kube(format!("reading CRD {name}")))?;
                let established = crd
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True");
                if established {
                    break;
                }
                if Instant::now() >= deadline {
                    return Err(self.timeout(
                        &format!("CRD {name} to be Established"),
                        timeout,
                        &["kube-apiserver"],
                    ));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        tracing::info!(count = names.len(), dir = %crd_dir.display(), "CRDs established");
        Ok(())
    }

    async fn create_nodes(&self, client: &Client, zones: &[String]) -> Result<(), ClusterError> {
        let nodes: Api<Node> = Api::all(client.clone());
        for (i, (zone, name)) in zones.iter().zip(&self.node_names).enumerate() {
            let node: Node = serde_json::from_value(json!({
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "annotations": {
                        "kwok.x-k8s.io/node": "fake",
                        "node.alpha.kubernetes.io/ttl": "0",
                    },
                    "labels": {
                        "kubernetes.io/hostname": name,
                        "kubernetes.io/os": "linux",
                        "kubernetes.io/arch": "amd64",
                        "type": "kwok",
                        ZONE_LABEL: zone,
                        ZONE_ID_LABEL: zone,
                        REGION_LABEL: REGION,
                    },
                },
                "status": {
                    "allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110"},
                    "capacity": {"cpu": "32", "memory": "256Gi", "pods": "110"},
                    // TEST-NET-1: bookkeeping only, never routed.
                    "addresses": [{"type": "InternalIP", "address": format!("192.0.2.{}", i + 1)}],
                },
            }))
            .expect("the Node literal matches the Node schema");
            nodes
                .create(&PostParams::default(), &node)
                .await
                .map_err(ClusterError::kube(format!("creating Node {name}")))?;
        }
        Ok(())
    }

    async fn wait_nodes_schedulable(
        &self,
        client: &Client,
        timeout: Duration,
    ) -> Result<(), ClusterError> {
        let nodes: Api<Node> = Api::all(client.clone());
        let deadline = Instant::now() + timeout;
        loop {
            self.check_alive()?;
            let list = nodes
                .list(&ListParams::default())
                .await
                .map_err(ClusterError::kube("listing Nodes"))?;
            let ready = list
                .items
                .iter()
                .filter(|n| {
                    self.node_names
                        .contains(n.metadata.name.as_ref().unwrap_or(&String::new()))
                })
                .filter(|n| node_schedulable(n))
                .count();
            if ready == self.node_names.len() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(self.timeout(
                    &format!(
                        "{} Nodes to be Ready without taints ({ready} are)",
                        self.node_names.len()
                    ),
                    timeout,
                    &["kwok", "kube-controller-manager"],
                ));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    fn spawn(
        &mut self,
        name: &str,
        args: &[String],
        extra_env: &[(&str, &str)],
    ) -> Result<(), ClusterError> {
        let program = toolchain::binary(name)?;
        let mut envs = vec![("NO_PROXY", NO_PROXY), ("no_proxy", NO_PROXY)];
        envs.extend_from_slice(extra_env);
        let log = self.dir.join("logs").join(format!("{name}.log"));
        let process = Supervised::spawn(name, &program, args, &envs, &log)?;
        tracing::debug!(component = name, pid = process.pid(), "started");
        self.components.push(process);
        Ok(())
    }

    /// Fails with the component's log tail if any component has exited.
    fn check_alive(&self) -> Result<(), ClusterError> {
        for c in &self.components {
            if let Some(status) = c.exit_status() {
                return Err(ClusterError::Exited {
                    component: c.name().to_string(),
                    status,
                    log: c.log_path().to_path_buf(),
                    tail: c.log_tail(LOG_TAIL_LINES),
                });
            }
        }
        Ok(())
    }

    fn timeout(&self, what: &str, waited: Duration, components: &[&str]) -> ClusterError {
        let logs = self
            .components
            .iter()
            .filter(|c| components.contains(&c.name()))
            .map(|c| {
                format!(
                    "==> {} <==\n{}",
                    c.log_path().display(),
                    c.log_tail(LOG_TAIL_LINES)
                )
            })
            .collect::<Vec<_>>()
            .join("\n");
        ClusterError::Timeout {
            what: what.to_string(),
            waited,
            logs,
        }
    }

    /// A fresh admin client (`system:masters`). Clients are bound to the Tokio runtime that
    /// created them, so each test should make its own rather than share one.
    pub fn client(&self) -> Result<Client, ClusterError> {
        Client::try_from(self.config.clone()).map_err(ClusterError::kube("building a kube client"))
    }

    /// A client authenticating with another kubeconfig, e.g. one from
    /// [`LocalCluster::service_account_kubeconfig`].
    pub async fn client_for_kubeconfig(&self, path: &Path) -> Result<Client, ClusterError> {
        Client::try_from(load_config(path).await?).map_err(ClusterError::kube(format!(
            "building a client from {}",
            path.display()
        )))
    }

    /// The admin client configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Path of the admin kubeconfig (client certificate in group `system:masters`).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The API server URL, `https://127.0.0.1:<port>`.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The generated certificates (for example the CA, to sign a webhook's serving certificate).
    pub fn pki(&self) -> &Pki {
        &self.pki
    }

    /// The working directory (logs under `logs/`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Names of the fake Nodes, one per zone.
    pub fn node_names(&self) -> &[String] {
        &self.node_names
    }

    /// The API server's audit log (JSON lines), when started with [`ClusterOptions::audit`].
    pub fn audit_log(&self) -> Option<&Path> {
        self.audit_log.as_deref()
    }

    /// Wall-clock time `start` took.
    pub fn startup_time(&self) -> Duration {
        self.startup
    }

    /// Current and peak RSS of every running component.
    pub fn memory(&self) -> Vec<ComponentMemory> {
        self.components
            .iter()
            .filter_map(|c| {
                c.memory().map(|(rss, peak)| ComponentMemory {
                    component: c.name().to_string(),
                    rss_bytes: rss,
                    peak_rss_bytes: peak,
                })
            })
            .collect()
    }

    /// Runs the real kubectl against this cluster; returns stdout, or an error with stderr when
    /// kubectl exits non-zero.
    pub async fn kubectl(&self, args: &[&str]) -> Result<String, ClusterError> {
        self.kubectl_with_stdin(args, None).await
    }

    /// Like [`LocalCluster::kubectl`], feeding `stdin` (e.g. a manifest for `-f -`).
    pub async fn kubectl_with_stdin(
        &self,
        args: &[&str],
        stdin: Option<&str>,
    ) -> Result<String, ClusterError> {
        use tokio::io::AsyncWriteExt;
        let program = toolchain::binary("kubectl")?;
        let cache = self.dir.join("kubectl-cache");
        let mut command = tokio::process::Command::new(program);
        command
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .arg(format!("--cache-dir={}", cache.display()))
            .args(args)
            .env("NO_PROXY", NO_PROXY)
            .env("no_proxy", NO_PROXY)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        let mut child = command
            .spawn()
            .map_err(ClusterError::io("starting kubectl"))?;
        let mut pipe = child.stdin.take().expect("stdin is piped");
        if let Some(input) = stdin {
            pipe.write_all(input.as_bytes())
                .await
                .map_err(ClusterError::io("writing kubectl stdin"))?;
        }
        drop(pipe);
        let out = child
            .wait_with_output()
            .await
            .map_err(ClusterError::io("running kubectl"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(ClusterError::Kubectl {
                args: args.join(" "),
                status: out.status,
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            })
        }
    }

    /// Creates (or keeps) a namespace and waits for its `default` ServiceAccount, so pods can be
    /// created in it straight away.
    pub async fn create_namespace(&self, name: &str) -> Result<(), ClusterError> {
        let client = self.client()?;
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let ns: Namespace = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name},
        }))
        .expect("static Namespace");
        namespaces
            .patch(name, &PatchParams::apply(FIELD_MANAGER), &Patch::Apply(&ns))
            .await
            .map_err(ClusterError::kube(format!("creating namespace {name}")))?;
        let accounts: Api<ServiceAccount> = Api::namespaced(client, name);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let found = accounts
                .get_opt("default")
                .await
                .map_err(ClusterError::kube(format!(
                    "reading {name}/default ServiceAccount"
                )))?;
            if found.is_some() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(self.timeout(
                    &format!("ServiceAccount {name}/default"),
                    Duration::from_secs(30),
                    &["kube-controller-manager"],
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Ensures ServiceAccount `namespace/name` exists, mints a token for it (TokenRequest, valid
    /// for `validity`) and writes a kubeconfig that authenticates as it; returns its path. Lets a
    /// handler run under its own identity so RBAC rules are exercised.
    pub async fn service_account_kubeconfig(
        &self,
        namespace: &str,
        name: &str,
        validity: Duration,
    ) -> Result<PathBuf, ClusterError> {
        let accounts: Api<ServiceAccount> = Api::namespaced(self.client()?, namespace);
        let sa: ServiceAccount = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": name, "namespace": namespace},
        }))
        .expect("static ServiceAccount");
        accounts
            .patch(name, &PatchParams::apply(FIELD_MANAGER), &Patch::Apply(&sa))
            .await
            .map_err(ClusterError::kube(format!(
                "creating ServiceAccount {namespace}/{name}"
            )))?;
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: Vec::new(),
                expiration_seconds: Some(i64::try_from(validity.as_secs()).unwrap_or(i64::MAX)),
                ..Default::default()
            },
            ..Default::default()
        };
        let token = accounts
            .create_token_request(name, &PostParams::default(), &request)
            .await
            .map_err(ClusterError::kube(format!(
                "requesting a token for {namespace}/{name}"
            )))?
            .status
            .map(|s| s.token)
            .filter(|token| !token.is_empty())
            .ok_or_else(|| ClusterError::NoToken {
                account: format!("{namespace}/{name}"),
            })?;
        let path = self.dir.join(format!("sa-{namespace}-{name}.kubeconfig"));
        write_kubeconfig(
            &path,
            &self.server,
            &self.pki.ca_cert,
            json!({"token": token}),
        )?;
        Ok(path)
    }

    /// Stops kube-apiserver (SIGTERM, as a rolling restart or a node reboot would), leaves it
    /// down for `down`, then starts it again with the same flags, port and etcd, and returns
    /// once `/readyz` answers `ok`. Clients keep working afterwards; their open watches break,
    /// which is the point: handlers must notice and re-establish them on their own.
    pub async fn restart_apiserver(&self, down: Duration) -> Result<(), ClusterError> {
        let original = self
            .components
            .iter()
            .find(|c| c.name() == "kube-apiserver")
            .expect("kube-apiserver is started with the cluster");
        let generation = {
            let restarted = self
                .restarted_apiservers
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            restarted.last().unwrap_or(original).stop(STOP_GRACE);
            restarted.len() + 1
        };
        tokio::time::sleep(down).await;
        let log = self
            .dir
            .join("logs")
            .join(format!("kube-apiserver.{generation}.log"));
        let process = Supervised::spawn(
            "kube-apiserver",
            &toolchain::binary("kube-apiserver")?,
            original.args(),
            &[("NO_PROXY", NO_PROXY), ("no_proxy", NO_PROXY)],
            &log,
        )?;
        let pid = process.pid();
        self.restarted_apiservers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(process);
        let client = self.client()?;
        let timeout = Duration::from_secs(90);
        let deadline = Instant::now() + timeout;
        loop {
            let request = http::Request::get("/readyz")
                .body(Vec::new())
                .expect("static request");
            match client.request_text(request).await {
                Ok(body) if body.trim() == "ok" => break,
                _ if Instant::now() >= deadline => {
                    return Err(ClusterError::Timeout {
                        what: "the restarted kube-apiserver's /readyz".to_owned(),
                        waited: timeout,
                        logs: crate::process::tail(&log, LOG_TAIL_LINES),
                    });
                }
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
        tracing::info!(pid, "kube-apiserver restarted");
        Ok(())
    }

    /// Stops every component (SIGTERM in reverse start order, SIGKILL after a grace period) and
    /// removes the temp dir.
    pub fn stop(self) {
        self.shutdown();
    }

    fn shutdown(&self) {
        if self.stopped.swap(true, Ordering::SeqCst) {
            return;
        }
        let began = Instant::now();
        if let Some(mut real) = self
            .real_nodes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            real.stop(&self.dir);
        }
        let restarted = self
            .restarted_apiservers
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        for component in restarted.iter().rev().chain(self.components.iter().rev()) {
            component.stop(STOP_GRACE);
        }
        drop(
            self.temp_dir
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take(),
        );
        tracing::info!(took = ?began.elapsed(), "local control plane stopped");
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A cluster started on first use and kept for the whole test process.
type SharedCluster = tokio::sync::OnceCell<Result<LocalCluster, ClusterError>>;

#[allow(unsafe_code)] // libc calls, each under a SAFETY comment
async fn start_shared(
    cell: &'static SharedCluster,
    opts: ClusterOptions,
    stop: extern "C" fn(),
) -> Result<&'static LocalCluster, &'static ClusterError> {
    cell.get_or_init(|| async {
        let started = LocalCluster::start(opts).await;
        if started.is_ok() {
            // SAFETY: registers a plain `extern "C" fn()` with the C runtime; it only touches
            // a static that is initialised by then.
            unsafe {
                libc::atexit(stop);
            }
        }
        started
    })
    .await
    .as_ref()
}

/// Schedulable: `Ready=True` and none of the node-lifecycle taints (`node.kubernetes.io/*`).
fn node_schedulable(node: &Node) -> bool {
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    let tainted = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key.starts_with("node.kubernetes.io/")));
    ready && !tainted
}

/// The kwok stage files shipped next to the toolchain binaries (`<bin>/../kwok-stages`).
fn stages_dir() -> Result<PathBuf, ClusterError> {
    let kwok = toolchain::binary("kwok")?;
    let bin = kwok.parent().unwrap_or(Path::new("/"));
    Ok(bin.join("../kwok-stages"))
}

/// Node initialisation, lease heartbeats, pod readiness/completion/deletion and fake volume
/// provisioning: kwokctl's defaults plus `volume/fast` (whose StorageClass is applied to the API
/// server instead, since kwok skips kinds it does not know), with its claim provisioning
/// replaced by `e2e/kwok/pvc-provision.yaml`, which leaves binding to kube-controller-manager
/// (the file says why).
fn kwok_stage_files(stages: &Path) -> Result<Vec<PathBuf>, ClusterError> {
    let ours = Path::new(env!("CARGO_MANIFEST_DIR")).join("kwok");
    let mut files = Vec::new();
    for sub in [
        "node/fast",
        "node/heartbeat-with-lease",
        "pod/fast",
        "volume/fast",
    ] {
        let found = manifest::yaml_files(&stages.join(sub))?
            .into_iter()
            .filter(|f| {
                let name = f.file_name().unwrap_or_default();
                name != "kustomization.yaml"
                    && name != "storage-class.yaml"
                    && !ours.join(name).exists()
            })
            .collect::<Vec<_>>();
        if found.is_empty() {
            return Err(ClusterError::Io {
                what: format!("finding kwok stages in {}", stages.join(sub).display()),
                source: std::io::ErrorKind::NotFound.into(),
            });
        }
        files.extend(found);
    }
    files.extend(manifest::yaml_files(&ours)?);
    Ok(files)
}

/// Distinct free TCP ports on loopback ([`crate::ports`]).
fn free_ports<const N: usize>() -> Result<[u16; N], ClusterError> {
    let mut ports = [0; N];
    for port in &mut ports {
        *port =
            crate::ports::free_loopback_port().map_err(ClusterError::io("finding a free port"))?;
    }
    Ok(ports)
}

/// Writes a single-context kubeconfig for `server` with the given `users[].user` entry.
fn write_kubeconfig(
    path: &Path,
    server: &str,
    ca: &Path,
    user: serde_json::Value,
) -> Result<(), ClusterError> {
    let doc = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {"server": server, "certificate-authority": ca}}],
        "users": [{"name": "user", "user": user}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": "user"}}],
        "current-context": "local",
    });
    let text = serde_yaml::to_string(&doc).map_err(|e| ClusterError::Io {
        what: format!("serialising {}", path.display()),
        source: std::io::Error::other(e),
    })?;
    std::fs::write(path, text).map_err(ClusterError::io(format!("writing {}", path.display())))
}

/// Loads a kubeconfig into a client configuration that never uses a proxy (loopback only).
async fn load_config(path: &Path) -> Result<Config, ClusterError> {
    let kubeconfig_err = |source| ClusterError::Kubeconfig {
        path: path.to_path_buf(),
        source,
    };
    let kubeconfig = Kubeconfig::read_from(path).map_err(kubeconfig_err)?;
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(kubeconfig_err)?;
    config.proxy_url = None;
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(conditions: serde_json::Value, taints: serde_json::Value) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": "n"},
            "spec": {"taints": taints},
            "status": {"conditions": conditions},
        }))
        .unwrap()
    }

    #[test]
    fn schedulable_needs_ready_and_no_lifecycle_taint() {
        let ready = json!([{"type": "Ready", "status": "True"}]);
        let not_ready = json!([{"type": "Ready", "status": "False"}]);
        let not_ready_taint =
            json!([{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]);
        let user_taint = json!([{"key": "example.com/dedicated", "effect": "NoSchedule"}]);
        assert!(node_schedulable(&node(ready.clone(), json!([]))));
        assert!(node_schedulable(&node(ready.clone(), user_taint)));
        assert!(!node_schedulable(&node(ready, not_ready_taint)));
        assert!(!node_schedulable(&node(not_ready, json!([]))));
    }

    #[tokio::test]
    async fn kubeconfig_round_trips_through_kube() {
        let dir = tempfile::tempdir().unwrap();
        let pki = Pki::generate(dir.path(), &[LOOPBACK]).unwrap();
        let path = dir.path().join("kubeconfig");
        write_kubeconfig(
            &path,
            "https://127.0.0.1:6443",
            &pki.ca_cert,
            json!({"token": "abc"}),
        )
        .unwrap();
        let config = load_config(&path).await.unwrap();
        assert_eq!(config.cluster_url.to_string(), "https://127.0.0.1:6443/");
        assert!(config.root_cert.is_some_and(|certs| certs.len() == 1));
        assert!(config.proxy_url.is_none());
    }
}
