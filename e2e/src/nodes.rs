//! Real nodes beside the local control plane: per node a containerd (Debian's, with runc and the
//! CNI plugins) and a kubelet built with the control plane; one kube-proxy and one NetworkPolicy
//! enforcer (kube-network-policies) for the shared network namespace; CoreDNS as a pod; and a
//! local-path provisioner that gives each claim a directory under the run's state directory.
//! Pods really run, from images imported into every node.
//!
//! Everything happens inside the sandbox `e2e/run-e2e.sh` creates (private network, mount and PID
//! namespaces): node addresses live on its loopback, Service IPs are routed to it, and whatever
//! escapes teardown (a mount, a shim, a bridge) dies with it. Cgroups are the one thing a
//! namespace does not scope, so each node's cgroup root is removed explicitly.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, Config};
use multigres_api::volumes::parse_bytes;
use serde_json::json;

use crate::node_images;
use crate::pki::{Pki, PkiError};
use crate::process::{ProcessError, Supervised};

/// Environment variable set by the sandbox wrapper (`e2e/run-e2e.sh`, `deploy/demo.sh`): real
/// nodes change addresses, routes, mounts and sysctls, which only a private sandbox may take.
pub const SANDBOX_ENV: &str = "MULTIGRES_E2E_SANDBOX";
/// Environment variable with the host PID of the sandbox wrapper: PIDs inside are private to each
/// sandbox (every test binary may be PID 2), so cgroup roots, which are not, carry this one.
pub const SANDBOX_ID_ENV: &str = "MULTIGRES_E2E_SANDBOX_ID";
/// Environment variable naming a file of `<image reference> <OCI archive path>` lines: the images
/// imported into every real node (written by `e2e/images/build.sh` and `just image`).
pub const IMAGES_ENV: &str = "MULTIGRES_IMAGES";
/// The sandbox ("pause") image every pod starts with.
pub const PAUSE_IMAGE: &str = "localhost/multigres/pause:1";
/// Cluster DNS.
pub const COREDNS_IMAGE: &str = "localhost/multigres/coredns:v1.15.0";
/// Where pods reach the API server, and where anything a pod must dial listens (127.0.0.1 inside
/// a pod is the pod itself).
pub const CONTROL_PLANE_IP: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 100);
/// Pod addresses: node `i` hands out `10.244.<i+1>.0/24`.
pub const POD_CIDR: &str = "10.244.0.0/16";
/// The cluster DNS Service's ClusterIP (in the control plane's Service range).
pub const DNS_SERVICE_IP: &str = "198.19.0.10";
/// StorageClass of the local-path provisioner (the default class on real-node clusters).
pub const STORAGE_CLASS: &str = "local-path";
/// Provisioner name the scheduler sees on that class (any name but `no-provisioner` makes it
/// pick a node first and wait for a volume, as with a dynamic provisioner).
const PROVISIONER: &str = "e2e.multigres.com/local-path";
/// How long a component gets between SIGTERM and SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// One name per entry of `zones`: `<prefix>-<zone>`, and `<prefix>-<zone>-<n>` for the `n`th
/// node of a zone that has several.
pub fn unique_names(prefix: &str, zones: &[String]) -> Vec<String> {
    let mut seen = BTreeMap::<&str, usize>::new();
    zones
        .iter()
        .map(|zone| {
            let n = seen.entry(zone.as_str()).or_default();
            *n += 1;
            match *n {
                1 => format!("{prefix}-{zone}"),
                n => format!("{prefix}-{zone}-{n}"),
            }
        })
        .collect()
}

/// Errors starting or stopping real nodes.
#[derive(Debug, thiserror::Error)]
pub enum NodesError {
    #[error(
        "real nodes change addresses, routes and mounts, so they run only inside the private sandbox \
         that e2e/run-e2e.sh or deploy/demo.sh creates ({SANDBOX_ENV}=1 is not set)"
    )]
    NoSandbox,
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("`{command}` failed ({status}): {stderr}")]
    Command {
        command: String,
        status: std::process::ExitStatus,
        stderr: String,
    },
    #[error(
        "{0} not found: install Debian's containerd, runc, containernetworking-plugins and iptables (e2e/toolchain/packages.sh)"
    )]
    MissingProgram(String),
    #[error(
        "no image list: set {IMAGES_ENV} to a file of `<reference> <archive>` lines (e2e/run-e2e.sh does)"
    )]
    NoImages,
    #[error("the image list has no {0}; build it with e2e/images/build.sh")]
    MissingImage(String),
    #[error(transparent)]
    Pki(#[from] PkiError),
    #[error(transparent)]
    Toolchain(#[from] crate::toolchain::ToolchainError),
    #[error(transparent)]
    Process(#[from] ProcessError),
    #[error("no real node is named {0}")]
    NoSuchNode(String),
    #[error("timed out after {waited:?} waiting for {what}")]
    Timeout { what: String, waited: Duration },
}

pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> NodesError {
    let what = what.into();
    move |source| NodesError::Io { what, source }
}

/// One real node: its name, zone, address and the directories its processes use.
#[derive(Debug, Clone)]
pub struct RealNode {
    /// Node name (`node-<zone>`).
    pub name: String,
    /// `topology.kubernetes.io/zone` of the node.
    pub zone: String,
    /// The node's InternalIP (on the sandbox's loopback).
    pub ip: Ipv4Addr,
    /// `<state>/nodes/<name>`.
    pub dir: PathBuf,
    index: usize,
}

impl RealNode {
    /// containerd's socket for `ctr -a`.
    pub fn containerd_socket(&self) -> PathBuf {
        self.dir.join("containerd.sock")
    }

    /// The node's cgroup root, pre-created in every cgroup v1 hierarchy.
    fn cgroup_root(&self) -> String {
        format!("{}{}", cgroup_prefix(), self.index)
    }

    fn pod_subnet(&self) -> String {
        format!("10.244.{}.0/24", self.index + 1)
    }

    fn bridge(&self) -> String {
        format!("mgbr{}", self.index)
    }
}

/// The running real nodes of a cluster; [`RealNodes::stop`] (or drop) tears everything down.
#[derive(Debug)]
pub struct RealNodes {
    nodes: Vec<RealNode>,
    images: BTreeMap<String, PathBuf>,
    /// containerds, kubelets and kube-proxy, in start order.
    components: Vec<Supervised>,
    provisioner_stop: Arc<AtomicBool>,
    provisioner: Option<std::thread::JoinHandle<()>>,
    stopped: bool,
}

/// The images whose build every node also holds under a second tag, [`next_tag`]: a running
/// cluster's Multigres and PostgreSQL images can then be changed (`data_plane` step 8b) without
/// building either twice.
const NEXT_TAGGED: [&str; 2] = [
    "localhost/multigres/multigres:",
    "localhost/multigres/pgctld:",
];

/// What [`next_tag`] appends.
pub const NEXT_SUFFIX: &str = "-next";

/// The second tag of `reference` (one of [`NEXT_TAGGED`]) on every node: the same build.
pub fn next_tag(reference: &str) -> String {
    format!("{reference}{NEXT_SUFFIX}")
}

/// The images a real-node cluster imports: `$MULTIGRES_IMAGES`, one `<reference> <archive>` per
/// line, and the [`next_tag`] of each of [`NEXT_TAGGED`] with the same archive.
pub fn image_list() -> Result<BTreeMap<String, PathBuf>, NodesError> {
    let path = std::env::var_os(IMAGES_ENV).ok_or(NodesError::NoImages)?;
    let text = std::fs::read_to_string(&path).map_err(io(format!(
        "reading the image list {}",
        Path::new(&path).display()
    )))?;
    let listed: BTreeMap<String, PathBuf> = text
        .lines()
        .filter_map(|line| line.split_once(' '))
        .map(|(reference, archive)| (reference.trim().to_owned(), PathBuf::from(archive.trim())))
        .collect();
    let next: Vec<(String, PathBuf)> = listed
        .iter()
        .filter(|(reference, _)| NEXT_TAGGED.iter().any(|p| reference.starts_with(p)))
        .map(|(reference, archive)| (next_tag(reference), archive.clone()))
        .collect();
    Ok(listed.into_iter().chain(next).collect())
}

/// A program from the machine's packages (containerd, ctr, ip, iptables), found on PATH.
pub fn system_program(name: &str) -> Result<PathBuf, NodesError> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| NodesError::MissingProgram(name.to_owned()))
}

/// Runs a short command; its stderr goes into the error.
pub fn run(program: &Path, args: &[&str]) -> Result<String, NodesError> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(io(format!("running {}", program.display())))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(NodesError::Command {
            command: format!("{} {}", program.display(), args.join(" ")),
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        })
    }
}

/// The start of the cgroup roots of this process's nodes: `multigres-e2e-<sandbox>-<pid>-`, unique
/// on the host while two sandboxes run real nodes at once; `e2e/sandbox.sh` removes what its own
/// sandbox left.
pub fn cgroup_prefix() -> String {
    let sandbox = std::env::var(SANDBOX_ID_ENV).unwrap_or_else(|_| "host".to_owned());
    format!("multigres-e2e-{sandbox}-{}-", std::process::id())
}

/// Prepares the sandbox's network before the control plane starts: loopback up, the control
/// plane and node addresses on it, Service IPs routed to it (routing happens before kube-proxy's
/// DNAT), forwarding and bridge netfilter on, and a private `/run/containerd` (shim sockets).
pub fn prepare_sandbox(node_count: usize, service_cidr: &str) -> Result<(), NodesError> {
    if std::env::var_os(SANDBOX_ENV).is_none_or(|v| v != "1") {
        return Err(NodesError::NoSandbox);
    }
    let ip = system_program("ip")?;
    run(&ip, &["link", "set", "lo", "up"])?;
    let mut addresses = vec![CONTROL_PLANE_IP];
    addresses.extend((0..node_count).map(node_ip));
    let present = run(&ip, &["-4", "addr", "show", "dev", "lo"])?;
    for address in addresses {
        if !present.contains(&format!("inet {address}/")) {
            run(&ip, &["addr", "add", &format!("{address}/32"), "dev", "lo"])?;
        }
    }
    let routes = run(&ip, &["route", "show", service_cidr])?;
    if routes.trim().is_empty() {
        run(&ip, &["route", "add", service_cidr, "dev", "lo"])?;
    }
    for (key, value) in [
        ("net/ipv4/ip_forward", "1"),
        ("net/bridge/bridge-nf-call-iptables", "1"),
        ("net/ipv4/conf/all/route_localnet", "1"),
    ] {
        let path = Path::new("/proc/sys").join(key);
        std::fs::write(&path, value).map_err(io(format!("setting {}", path.display())))?;
    }
    let run_dir = Path::new("/run/containerd");
    std::fs::create_dir_all(run_dir).map_err(io("creating /run/containerd"))?;
    let mounted = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(io("reading /proc/self/mountinfo"))?
        .lines()
        .any(|line| line.split(' ').nth(4) == Some("/run/containerd"));
    if !mounted {
        run(
            &system_program("mount")?,
            &["-t", "tmpfs", "tmpfs", "/run/containerd"],
        )?;
    }
    Ok(())
}

/// InternalIP of node `index`.
pub fn node_ip(index: usize) -> Ipv4Addr {
    Ipv4Addr::new(
        10,
        250,
        0,
        u8::try_from(index + 1).expect("fewer than 255 nodes"),
    )
}

impl RealNodes {
    /// Starts containerd (its root holding every listed image: [`node_images`]) and a kubelet
    /// for each zone, then kube-proxy and the provisioner. The API server must already run;
    /// Nodes are not awaited here (see [`RealNodes::wait_ready`]).
    pub fn start(
        state: &Path,
        zones: &[String],
        pki: &Pki,
        server: &str,
        config: &Config,
    ) -> Result<RealNodes, NodesError> {
        let images = image_list()?;
        for wanted in [PAUSE_IMAGE, COREDNS_IMAGE] {
            if !images.contains_key(wanted) {
                return Err(NodesError::MissingImage(wanted.to_owned()));
            }
        }
        let mut real = RealNodes {
            nodes: zones
                .iter()
                .enumerate()
                .zip(unique_names("node", zones))
                .map(|((index, zone), name)| RealNode {
                    dir: state.join("nodes").join(&name),
                    name,
                    zone: zone.clone(),
                    ip: node_ip(index),
                    index,
                })
                .collect(),
            images,
            components: Vec::new(),
            provisioner_stop: Arc::new(AtomicBool::new(false)),
            provisioner: None,
            stopped: false,
        };
        let logs = state.join("logs");
        for node in real.nodes.clone() {
            node_images::prepare_root(&real.images, &node.dir.join("root"), &logs)?;
            real.start_containerd(&node, &logs)?;
        }
        for node in &real.nodes {
            let socket = node.containerd_socket();
            node_images::check_listed(&real.images, &socket.to_string_lossy(), &node.name)?;
        }
        real.start_kubelets(&real.nodes.clone(), pki, server, &logs)?;
        real.start_kube_proxy(state, pki, server, &logs)?;
        real.start_network_policies(state, pki, server, &logs)?;
        real.start_provisioner(state, config.clone());
        Ok(real)
    }

    /// The nodes, in zone order.
    pub fn nodes(&self) -> &[RealNode] {
        &self.nodes
    }

    fn start_containerd(&mut self, node: &RealNode, logs: &Path) -> Result<(), NodesError> {
        for sub in ["root", "state", "cni/net.d", "cni/ipam", "opt"] {
            std::fs::create_dir_all(node.dir.join(sub))
                .map_err(io(format!("creating {}", node.dir.join(sub).display())))?;
        }
        let cni = json!({
            "cniVersion": "0.4.0",
            "name": "pods",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": node.bridge(),
                    "isGateway": true,
                    "ipMasq": true,
                    "hairpinMode": true,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": node.pod_subnet()}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": node.dir.join("cni/ipam"),
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": true}},
            ],
        });
        let conflist = node.dir.join("cni/net.d/10-pods.conflist");
        std::fs::write(&conflist, cni.to_string())
            .map_err(io(format!("writing {}", conflist.display())))?;
        let dir = node.dir.display();
        let config = format!(
            r#"version = 2
root = "{dir}/root"
state = "{dir}/state"
[grpc]
  address = "{dir}/containerd.sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "{dir}/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  disable_hugetlb_controller = true
  tolerate_missing_hugetlb_controller = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    snapshotter = "overlayfs"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{dir}/cni/net.d"
"#
        );
        let config_path = node.dir.join("containerd.toml");
        std::fs::write(&config_path, config)
            .map_err(io(format!("writing {}", config_path.display())))?;
        let process = Supervised::spawn(
            &format!("containerd-{}", node.name),
            &system_program("containerd")?,
            &[format!("--config={}", config_path.display())],
            &[],
            &logs.join(format!("containerd-{}.log", node.name)),
        )?;
        self.components.push(process);
        let socket = node.containerd_socket();
        wait_until(
            &format!("{} to exist", socket.display()),
            Duration::from_secs(30),
            || socket.exists(),
        )
    }

    fn start_kubelet(
        &mut self,
        node: &RealNode,
        pki: &Pki,
        server: &str,
        logs: &Path,
    ) -> Result<(), NodesError> {
        let root = node.dir.join("kubelet");
        let pod_logs = node.dir.join("pod-logs");
        for dir in [&root, &pod_logs] {
            std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
        }
        let resolv = node.dir.join("resolv.conf");
        std::fs::write(&resolv, "").map_err(io(format!("writing {}", resolv.display())))?;
        create_cgroup_root(&node.cgroup_root())?;
        let (client_cert, client_key) = pki.client(
            &format!("kubelet-{}", node.name),
            &format!("system:node:{}", node.name),
            Some("system:nodes"),
        )?;
        let (serving_cert, serving_key) =
            pki.serving(&format!("kubelet-serving-{}", node.name), node.ip)?;
        let kubeconfig = node.dir.join("kubelet.kubeconfig");
        write_kubeconfig(&kubeconfig, server, &pki.ca_cert, &client_cert, &client_key)?;
        let config = json!({
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": node.ip.to_string(),
            "port": 10250,
            "readOnlyPort": 0,
            "healthzPort": 0,
            "tlsCertFile": serving_cert,
            "tlsPrivateKeyFile": serving_key,
            "authentication": {
                "anonymous": {"enabled": false},
                "webhook": {"enabled": false},
                "x509": {"clientCAFile": pki.ca_cert},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": format!("/{}", node.cgroup_root()),
            "failCgroupV1": false,
            "failSwapOn": false,
            "enforceNodeAllocatable": [],
            "evictionHard": {},
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "clusterDNS": [DNS_SERVICE_IP],
            "clusterDomain": "cluster.local",
            "resolvConf": resolv,
            "podLogsDir": pod_logs,
            "containerRuntimeEndpoint": format!("unix://{}", node.containerd_socket().display()),
            "serializeImagePulls": false,
            "maxPods": 110,
            "nodeStatusReportFrequency": "10s",
            "syncFrequency": "10s",
        });
        let config_path = node.dir.join("kubelet.yaml");
        std::fs::write(&config_path, config.to_string())
            .map_err(io(format!("writing {}", config_path.display())))?;
        let labels = format!(
            "topology.kubernetes.io/zone={zone},topology.k8s.aws/zone-id={zone},\
             topology.kubernetes.io/region={region},type=real",
            zone = node.zone,
            region = crate::labels::REGION,
        );
        let process = Supervised::spawn(
            &format!("kubelet-{}", node.name),
            &crate::toolchain::binary("kubelet")?,
            &[
                format!("--config={}", config_path.display()),
                format!("--kubeconfig={}", kubeconfig.display()),
                format!("--root-dir={}", root.display()),
                format!("--hostname-override={}", node.name),
                format!("--node-ip={}", node.ip),
                format!("--node-labels={labels}"),
                "--v=1".into(),
            ],
            &[],
            &logs.join(format!("kubelet-{}.log", node.name)),
        )?;
        self.components.push(process);
        Ok(())
    }

    fn start_kube_proxy(
        &mut self,
        state: &Path,
        pki: &Pki,
        server: &str,
        logs: &Path,
    ) -> Result<(), NodesError> {
        let (cert, key) = pki.client("kube-proxy", "system:kube-proxy", None)?;
        let kubeconfig = state.join("kube-proxy.kubeconfig");
        write_kubeconfig(&kubeconfig, server, &pki.ca_cert, &cert, &key)?;
        let first = &self.nodes[0];
        let config = json!({
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": kubeconfig},
            "hostnameOverride": first.name,
            "bindAddress": first.ip.to_string(),
            "healthzBindAddress": "",
            "mode": "iptables",
            "clusterCIDR": POD_CIDR,
            "conntrack": {"maxPerCore": 0, "min": 0},
        });
        let config_path = state.join("kube-proxy.yaml");
        std::fs::write(&config_path, config.to_string())
            .map_err(io(format!("writing {}", config_path.display())))?;
        let process = Supervised::spawn(
            "kube-proxy",
            &crate::toolchain::binary("kube-proxy")?,
            &[format!("--config={}", config_path.display())],
            &[],
            &logs.join("kube-proxy.log"),
        )?;
        self.components.push(process);
        Ok(())
    }

    /// NetworkPolicies are enforced as a cluster with Calico or Cilium enforces them: by
    /// kube-network-policies (`e2e/toolchain/netpol`), one controller for every node, since
    /// they share the sandbox's network namespace. Without it the policies the operator writes
    /// would be objects nobody acts on, and no test could show a refusal.
    fn start_network_policies(
        &mut self,
        state: &Path,
        pki: &Pki,
        server: &str,
        logs: &Path,
    ) -> Result<(), NodesError> {
        let (cert, key) = pki.client("netpol", "netpol", Some("system:masters"))?;
        let kubeconfig = state.join("netpol.kubeconfig");
        write_kubeconfig(&kubeconfig, server, &pki.ca_cert, &cert, &key)?;
        let process = Supervised::spawn(
            "netpol",
            &crate::toolchain::binary("netpol")?,
            &[
                format!("--kubeconfig={}", kubeconfig.display()),
                format!("--pod-cidr={POD_CIDR}"),
                "--v=1".to_owned(),
            ],
            &[],
            &logs.join("netpol.log"),
        )?;
        self.components.push(process);
        Ok(())
    }

    fn start_provisioner(&mut self, state: &Path, config: Config) {
        let stop = self.provisioner_stop.clone();
        let volumes = state.join("volumes");
        // Its own thread and runtime: the cluster outlives the test runtime that started it.
        let handle = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a current-thread runtime");
            runtime.block_on(provision_loop(config, volumes, stop));
        });
        self.provisioner = Some(handle);
    }

    /// Supervised processes that have exited, with their status, for startup diagnostics.
    pub fn exited(&self) -> Option<(&Supervised, std::process::ExitStatus)> {
        self.components
            .iter()
            .find_map(|c| c.exit_status().map(|status| (c, status)))
    }

    /// Log paths of the node components (for timeout messages).
    pub fn components(&self) -> &[Supervised] {
        &self.components
    }

    /// The listed image archives by reference.
    pub fn images(&self) -> &BTreeMap<String, PathBuf> {
        &self.images
    }

    /// Stops the provisioner, kube-proxy and the kubelets, kills every container (everything in
    /// the nodes' cgroups, then the shims), stops containerd, unmounts what the nodes mounted
    /// under `state`, removes the bridges and the cgroup roots. Idempotent.
    pub fn stop(&mut self, state: &Path) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        self.provisioner_stop.store(true, Ordering::SeqCst);
        if let Some(handle) = self.provisioner.take() {
            let _ = handle.join();
        }
        let (containerds, others): (Vec<_>, Vec<_>) = self
            .components
            .drain(..)
            .partition(|c| c.name().starts_with("containerd-"));
        for component in others.iter().rev() {
            component.stop(STOP_GRACE);
        }
        for node in &self.nodes {
            kill_cgroup(&node.cgroup_root());
        }
        kill_shims(&state.join("nodes"));
        for component in containerds.iter().rev() {
            component.stop(STOP_GRACE);
        }
        unmount_under(state);
        if let Ok(ip) = system_program("ip") {
            for node in &self.nodes {
                let _ = run(&ip, &["link", "delete", &node.bridge()]);
            }
        }
        for node in &self.nodes {
            remove_cgroup_root(&node.cgroup_root());
            // containerd's image content and snapshots: gigabytes per node, of no use once the
            // node is gone (logs and volumes stay with a kept state directory).
            let _ = std::fs::remove_dir_all(node.dir.join("root"));
        }
    }

    /// Stops the node `name` as a power loss would: its kubelet, every process of its pods and
    /// its containerd are killed at once (SIGKILL, no grace), so nothing on the node says
    /// goodbye to the API server or to a peer. Its directories (volumes, images, the kubelet's
    /// state) stay for [`RealNodes::power_on`].
    pub fn power_off(&mut self, name: &str) -> Result<(), NodesError> {
        let node = self.node(name)?;
        let (gone, kept): (Vec<_>, Vec<_>) = self.components.drain(..).partition(|c| {
            c.name() == format!("kubelet-{name}") || c.name() == format!("containerd-{name}")
        });
        self.components = kept;
        for component in gone.iter().filter(|c| c.name().starts_with("kubelet-")) {
            component.stop(Duration::ZERO);
        }
        kill_cgroup(&node.cgroup_root());
        kill_shims(&node.dir);
        for component in gone.iter().filter(|c| c.name().starts_with("containerd-")) {
            component.stop(Duration::ZERO);
        }
        Ok(())
    }

    /// Starts the containerd and the kubelet of a node [`RealNodes::power_off`] stopped, as a
    /// machine booting again would: the kubelet finds its pods' volumes and starts their
    /// containers anew.
    pub fn power_on(
        &mut self,
        name: &str,
        pki: &Pki,
        server: &str,
        logs: &Path,
    ) -> Result<(), NodesError> {
        let node = self.node(name)?;
        self.start_containerd(&node, logs)?;
        self.start_kubelets(&[node], pki, server, logs)
    }

    /// Starts the kubelets of `nodes`, whose containerds run. containerd's socket exists before
    /// its CRI plugin serves, and a kubelet that finds the CRI not initialized exits: each is
    /// started again until all stay up.
    fn start_kubelets(
        &mut self,
        nodes: &[RealNode],
        pki: &Pki,
        server: &str,
        logs: &Path,
    ) -> Result<(), NodesError> {
        let mut down = nodes.to_vec();
        for _ in 0..20 {
            for node in &down {
                self.start_kubelet(node, pki, server, logs)?;
            }
            std::thread::sleep(Duration::from_secs(3));
            down.retain(|node| {
                let kubelet = format!("kubelet-{}", node.name);
                let exited = self
                    .components
                    .iter()
                    .position(|c| c.name() == kubelet && c.exit_status().is_some());
                exited
                    .inspect(|&index| drop(self.components.remove(index)))
                    .is_some()
            });
            if down.is_empty() {
                return Ok(());
            }
        }
        let names: Vec<&str> = down.iter().map(|node| node.name.as_str()).collect();
        Err(NodesError::Timeout {
            what: format!("the kubelets of {} to stay up", names.join(", ")),
            waited: Duration::from_secs(60),
        })
    }

    fn node(&self, name: &str) -> Result<RealNode, NodesError> {
        self.nodes
            .iter()
            .find(|n| n.name == name)
            .cloned()
            .ok_or_else(|| NodesError::NoSuchNode(name.to_owned()))
    }

    /// Waits until every real Node is Ready.
    pub async fn wait_ready(&self, client: &Client, timeout: Duration) -> Result<(), NodesError> {
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
        let deadline = Instant::now() + timeout;
        loop {
            let mut ready = 0;
            for node in &self.nodes {
                if let Ok(Some(found)) = nodes.get_opt(&node.name).await {
                    let is_ready = found
                        .status
                        .and_then(|s| s.conditions)
                        .unwrap_or_default()
                        .iter()
                        .any(|c| c.type_ == "Ready" && c.status == "True");
                    ready += usize::from(is_ready);
                }
            }
            if ready == self.nodes.len() {
                return Ok(());
            }
            if let Some((component, status)) = self.exited() {
                return Err(NodesError::Io {
                    what: format!("{} exited ({status})", component.name()),
                    source: std::io::Error::other(component.log_tail(30)),
                });
            }
            if Instant::now() >= deadline {
                return Err(NodesError::Timeout {
                    what: format!("{} real Nodes to be Ready ({ready} are)", self.nodes.len()),
                    waited: timeout,
                });
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

impl Drop for RealNodes {
    fn drop(&mut self) {
        if !self.stopped {
            let state = self
                .nodes
                .first()
                .and_then(|n| n.dir.parent())
                .and_then(Path::parent)
                .map(Path::to_path_buf)
                .unwrap_or_default();
            self.stop(&state);
        }
    }
}

fn write_kubeconfig(
    path: &Path,
    server: &str,
    ca: &Path,
    cert: &Path,
    key: &Path,
) -> Result<(), NodesError> {
    let doc = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {"server": server, "certificate-authority": ca}}],
        "users": [{"name": "user", "user": {"client-certificate": cert, "client-key": key}}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": "user"}}],
        "current-context": "local",
    });
    std::fs::write(path, doc.to_string()).map_err(io(format!("writing {}", path.display())))
}

pub(crate) fn wait_until(
    what: &str,
    timeout: Duration,
    done: impl Fn() -> bool,
) -> Result<(), NodesError> {
    let deadline = Instant::now() + timeout;
    while !done() {
        if Instant::now() >= deadline {
            return Err(NodesError::Timeout {
                what: what.to_owned(),
                waited: timeout,
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// Mount points of the cgroup v1 hierarchies (`/sys/fs/cgroup/<controller>`), and with
/// `unified` the cgroup2 mount beside them too (runc also creates the containers' cgroups there).
fn cgroup_hierarchies(unified: bool) -> Vec<PathBuf> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let fstype = right.split(' ').next()?;
            let mount_point = left.split(' ').nth(4)?;
            (fstype == "cgroup" || (unified && fstype == "cgroup2"))
                .then(|| PathBuf::from(mount_point))
        })
        .collect()
}

/// Creates `/<root>` in every cgroup v1 hierarchy (cpuset needs its CPUs and memory nodes copied
/// from the parent before anything can join).
fn create_cgroup_root(root: &str) -> Result<(), NodesError> {
    for hierarchy in cgroup_hierarchies(false) {
        let dir = hierarchy.join(root);
        std::fs::create_dir_all(&dir).map_err(io(format!("creating cgroup {}", dir.display())))?;
        for file in ["cpuset.cpus", "cpuset.mems"] {
            if let Ok(value) = std::fs::read_to_string(hierarchy.join(file)) {
                std::fs::write(dir.join(file), value.trim())
                    .map_err(io(format!("writing {}", dir.join(file).display())))?;
            }
        }
    }
    Ok(())
}

/// Every cgroup directory under `/<root>` in every hierarchy, deepest first.
fn cgroup_dirs(root: &str) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    walk(&entry.path(), out);
                }
            }
        }
        out.push(dir.to_path_buf());
    }
    let mut out = Vec::new();
    for hierarchy in cgroup_hierarchies(true) {
        let dir = hierarchy.join(root);
        if dir.is_dir() {
            walk(&dir, &mut out);
        }
    }
    out
}

/// SIGKILLs every process in the node's cgroups (containers and their shims' children).
#[allow(unsafe_code)] // libc calls, each under a SAFETY comment
fn kill_cgroup(root: &str) {
    for _ in 0..50 {
        let mut found = false;
        for dir in cgroup_dirs(root) {
            for pid in std::fs::read_to_string(dir.join("cgroup.procs"))
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.trim().parse::<libc::pid_t>().ok())
            {
                found = true;
                // SAFETY: kill(2) has no memory effects; a vanished pid gives ESRCH.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
        }
        if !found {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn remove_cgroup_root(root: &str) {
    for _ in 0..50 {
        let dirs = cgroup_dirs(root);
        if dirs.is_empty() {
            return;
        }
        for dir in dirs {
            let _ = std::fs::remove_dir(&dir);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Processes whose command line mentions `needle` (the shims name their containerd's socket).
pub fn processes_mentioning(needle: &str) -> Vec<libc::pid_t> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid: libc::pid_t = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            (pid != libc::pid_t::try_from(std::process::id()).ok()? && cmdline.contains(needle))
                .then_some(pid)
        })
        .collect()
}

/// Kills the containerd shims of the nodes under `dir` (a shim names its containerd's socket).
#[allow(unsafe_code)] // libc calls, each under a SAFETY comment
fn kill_shims(dir: &Path) {
    let needle = format!("{}/", dir.display());
    for _ in 0..50 {
        let shims: Vec<_> = processes_mentioning(&needle)
            .into_iter()
            .filter(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .is_ok_and(|comm| comm.starts_with("containerd-shim"))
            })
            .collect();
        if shims.is_empty() {
            return;
        }
        for pid in shims {
            // SAFETY: kill(2) has no memory effects.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Mount points at or under `dir`, deepest first.
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let prefix = dir.to_string_lossy().into_owned();
    let mut found: Vec<PathBuf> = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(unescape_mount_path)
        .filter(|path| path.starts_with(&prefix))
        .map(PathBuf::from)
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found.dedup();
    found
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape_mount_path(raw: &str) -> String {
    raw.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

#[allow(unsafe_code)] // libc calls, each under a SAFETY comment
fn unmount_under(dir: &Path) {
    for _ in 0..5 {
        let mounts = mounts_under(dir);
        if mounts.is_empty() {
            return;
        }
        for mount in mounts {
            let Ok(path) = std::ffi::CString::new(mount.to_string_lossy().as_bytes()) else {
                continue;
            };
            // SAFETY: umount2(2) with a valid NUL-terminated path; MNT_DETACH never blocks.
            unsafe {
                libc::umount2(path.as_ptr(), libc::MNT_DETACH);
            }
        }
    }
}

/// Gives every claim of the [`STORAGE_CLASS`] a hostPath volume on the node the scheduler picked
/// (`volume.kubernetes.io/selected-node`), in `<volumes>/<namespace>-<claim>-<claim uid>`, owned by
/// the user of the pod that mounts it (hostPath ignores `fsGroup`). Volumes are never deleted: the
/// class retains them, as the operator's default `pvcDeletionPolicy` expects of real storage. The
/// uid in the path gives a claim made again under a deleted one's name (a StatefulSet replacing a
/// lost volume) an empty volume, as real storage would, not the deleted claim's data.
///
/// The class allows expansion, and the loop expands as an external resizer does (the CSI
/// external-resizer a real class names): a bound claim that requests more than its volume holds
/// gets a volume of that capacity, and the claim's `status.capacity` says so. The volumes are
/// directories on the host's disk, so nothing is really reserved: a size is a number the
/// operator reads, not a quota PostgreSQL could hit.
async fn provision_loop(config: Config, volumes: PathBuf, stop: Arc<AtomicBool>) {
    let Ok(client) = Client::try_from(config) else {
        return;
    };
    let claims: Api<PersistentVolumeClaim> = Api::all(client.clone());
    let volumes_api: Api<PersistentVolume> = Api::all(client.clone());
    let pods: Api<Pod> = Api::all(client);
    while !stop.load(Ordering::SeqCst) {
        if let Ok(list) = claims.list(&ListParams::default()).await {
            for claim in list.items {
                if let Err(error) = provision(&claim, &volumes, &volumes_api, &pods).await {
                    tracing::warn!(%error, claim = ?claim.metadata.name, "provisioning a local volume");
                }
                if let Err(error) = expand(&claim, &claims, &volumes_api).await {
                    tracing::warn!(%error, claim = ?claim.metadata.name, "expanding a local volume");
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn provision(
    claim: &PersistentVolumeClaim,
    volumes: &Path,
    volumes_api: &Api<PersistentVolume>,
    pods: &Api<Pod>,
) -> Result<(), kube::Error> {
    let spec = claim.spec.clone().unwrap_or_default();
    let bound = spec.volume_name.as_deref().is_some_and(|v| !v.is_empty());
    let ours = spec.storage_class_name.as_deref() == Some(STORAGE_CLASS);
    let annotations = claim.metadata.annotations.clone().unwrap_or_default();
    let Some(node) = annotations.get("volume.kubernetes.io/selected-node") else {
        return Ok(());
    };
    if bound || !ours || claim.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let namespace = claim.metadata.namespace.clone().unwrap_or_default();
    let name = claim.metadata.name.clone().unwrap_or_default();
    let uid = claim.metadata.uid.clone().unwrap_or_default();
    let pv_name = format!("local-{}", &uid[..uid.len().min(36)]);
    if volumes_api.get_opt(&pv_name).await?.is_some() {
        return Ok(());
    }
    let (user, group) = claim_owner(pods, &namespace, &name).await?;
    let path = volumes.join(format!("{namespace}-{name}-{uid}"));
    if let Err(error) = std::fs::create_dir_all(&path) {
        tracing::warn!(%error, path = %path.display(), "creating a local volume directory");
        return Ok(());
    }
    let _ = std::os::unix::fs::chown(&path, Some(user), Some(group));
    let storage = spec
        .resources
        .and_then(|r| r.requests)
        .and_then(|r| r.get("storage").cloned())
        .map_or_else(|| json!("1Gi"), |q| json!(q));
    let access_modes = spec
        .access_modes
        .unwrap_or_else(|| vec!["ReadWriteOnce".into()]);
    let mut pv = json!({
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": pv_name, "annotations": {"e2e.multigres.com/claim": format!("{namespace}/{name}")}},
        "spec": {
            "capacity": {"storage": storage},
            "accessModes": access_modes,
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": STORAGE_CLASS,
            "claimRef": {"namespace": namespace, "name": name, "uid": uid},
            "hostPath": {"path": path, "type": "Directory"},
        },
    });
    // Every node of this tier runs on one machine and sees its filesystem, as every node of a
    // real cluster mounts one NFS share: a ReadWriteMany volume is offered to all of them, any
    // other one only to the node the scheduler chose.
    if !access_modes.iter().any(|m| m == "ReadWriteMany") {
        pv["spec"]["nodeAffinity"] = json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]},
        ]}]}});
    }
    let pv: PersistentVolume =
        serde_json::from_value(pv).expect("the PersistentVolume literal matches its schema");
    volumes_api.create(&PostParams::default(), &pv).await?;
    Ok(())
}

/// Gives a bound claim of the [`STORAGE_CLASS`] that requests more than its volume's capacity
/// that capacity: the volume's first, then the claim's `status.capacity`, as the external
/// resizer does once the storage grew (kube-controller-manager leaves a class it has no plugin
/// for to such a resizer, with an `ExternalExpanding` event).
async fn expand(
    claim: &PersistentVolumeClaim,
    claims: &Api<PersistentVolumeClaim>,
    volumes_api: &Api<PersistentVolume>,
) -> Result<(), kube::Error> {
    let spec = claim.spec.clone().unwrap_or_default();
    let Some(volume) = spec.volume_name.filter(|v| !v.is_empty()) else {
        return Ok(());
    };
    if spec.storage_class_name.as_deref() != Some(STORAGE_CLASS) {
        return Ok(());
    }
    let storage = |q: Option<&Quantity>| q.and_then(|q| parse_bytes(&q.0));
    let Some(wanted) = spec.resources.as_ref().and_then(|r| r.requests.as_ref()) else {
        return Ok(());
    };
    let wanted = wanted.get("storage").cloned();
    let Some(want) = storage(wanted.as_ref()) else {
        return Ok(());
    };
    let given = claim
        .status
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| storage(c.get("storage")));
    if given.is_some_and(|g| g >= want) {
        return Ok(());
    }
    let Some(pv) = volumes_api.get_opt(&volume).await? else {
        return Ok(());
    };
    let held = storage(
        pv.spec
            .as_ref()
            .and_then(|s| s.capacity.as_ref())
            .and_then(|c| c.get("storage")),
    );
    if held.is_none_or(|h| h < want) {
        volumes_api
            .patch(
                &volume,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"capacity": {"storage": wanted}}})),
            )
            .await?;
    }
    let namespace = claim.metadata.namespace.clone().unwrap_or_default();
    let name = claim.metadata.name.clone().unwrap_or_default();
    Api::<PersistentVolumeClaim>::namespaced(claims.clone().into_client(), &namespace)
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"capacity": {"storage": wanted}}})),
        )
        .await?;
    tracing::info!(claim = %format!("{namespace}/{name}"), size = ?wanted, "expanded a local volume");
    Ok(())
}

/// The uid and gid that should own a new volume: the `runAsUser` and `fsGroup` (else
/// `runAsGroup`) of a pod that mounts the claim (by name, or as its generic ephemeral volume);
/// root when none says.
async fn claim_owner(
    pods: &Api<Pod>,
    namespace: &str,
    claim: &str,
) -> Result<(u32, u32), kube::Error> {
    let in_namespace: Api<Pod> = Api::namespaced(pods.clone().into_client(), namespace);
    for pod in in_namespace.list(&ListParams::default()).await?.items {
        let Some(spec) = pod.spec else { continue };
        let pod_name = pod.metadata.name.unwrap_or_default();
        // A generic ephemeral volume's claim is `<pod>-<volume>`.
        let mounts = spec.volumes.unwrap_or_default().iter().any(|v| {
            v.persistent_volume_claim
                .as_ref()
                .is_some_and(|c| c.claim_name == claim)
                || (v.ephemeral.is_some() && format!("{pod_name}-{}", v.name) == claim)
        });
        if !mounts {
            continue;
        }
        let context = spec.security_context.unwrap_or_default();
        let container_user = spec
            .containers
            .iter()
            .find_map(|c| c.security_context.as_ref().and_then(|s| s.run_as_user));
        let user = context.run_as_user.or(container_user).unwrap_or(0);
        let group = context.fs_group.or(context.run_as_group).unwrap_or(0);
        return Ok((
            u32::try_from(user).unwrap_or(0),
            u32::try_from(group).unwrap_or(0),
        ));
    }
    Ok((0, 0))
}

/// What a real-node cluster installs once its Nodes are Ready: the cluster DNS as a pod (CoreDNS answering `*.cluster.local` from the API (no upstream: the
/// sandbox has no network beyond itself) on an unprivileged port behind the `kube-dns` Service,
/// and the default StorageClass of the local-path provisioner.
pub fn addon_manifests() -> Vec<serde_json::Value> {
    let corefile = ".:1053 {\n    errors\n    ready :8181\n    kubernetes cluster.local in-addr.arpa ip6.arpa {\n        pods insecure\n        fallthrough in-addr.arpa ip6.arpa\n    }\n    cache 5\n}\n";
    let labels = json!({"k8s-app": "kube-dns"});
    vec![
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": {"name": "coredns", "namespace": "kube-system"}}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "e2e:coredns"},
        "rules": [
            {"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"], "verbs": ["list", "watch"]},
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
        ]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": "e2e:coredns"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "e2e:coredns"},
               "subjects": [{"kind": "ServiceAccount", "name": "coredns", "namespace": "kube-system"}]}),
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "coredns", "namespace": "kube-system"},
               "data": {"Corefile": corefile}}),
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "coredns", "namespace": "kube-system", "labels": labels},
        "spec": {
            // Two, in different zones, as a production cluster runs it: a zone lost must not
            // take the cluster's name service with it.
            "replicas": 2,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "topologySpreadConstraints": [{
                        "maxSkew": 1,
                        "topologyKey": "topology.kubernetes.io/zone",
                        "whenUnsatisfiable": "ScheduleAnyway",
                        "labelSelector": {"matchLabels": labels},
                    }],
                    "serviceAccountName": "coredns",
                    "dnsPolicy": "Default",
                    "securityContext": {"runAsUser": 65532, "runAsGroup": 65532, "runAsNonRoot": true},
                    "containers": [{
                        "name": "coredns",
                        "image": COREDNS_IMAGE,
                        "imagePullPolicy": "Never",
                        "args": ["-conf", "/etc/coredns/Corefile"],
                        "ports": [
                            {"name": "dns", "containerPort": 1053, "protocol": "UDP"},
                            {"name": "dns-tcp", "containerPort": 1053, "protocol": "TCP"},
                        ],
                        "readinessProbe": {"httpGet": {"path": "/ready", "port": 8181}, "periodSeconds": 2},
                        "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns"}],
                    }],
                    "volumes": [{"name": "config", "configMap": {"name": "coredns"}}],
                },
            },
        }}),
        json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": labels},
        "spec": {
            "clusterIP": DNS_SERVICE_IP,
            "selector": labels,
            "ports": [
                {"name": "dns", "port": 53, "targetPort": 1053, "protocol": "UDP"},
                {"name": "dns-tcp", "port": 53, "targetPort": 1053, "protocol": "TCP"},
            ],
        }}),
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
               "metadata": {"name": STORAGE_CLASS,
                            "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
               "provisioner": PROVISIONER,
               "reclaimPolicy": "Retain",
               "allowVolumeExpansion": true,
               "volumeBindingMode": "WaitForFirstConsumer"}),
    ]
}
