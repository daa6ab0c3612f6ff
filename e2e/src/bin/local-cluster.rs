//! `local-cluster`: run the real local control plane (etcd, kube-apiserver,
//! kube-controller-manager, kube-scheduler, kwok with three fake Nodes, the project's CRDs) by
//! hand or from `just demo`.
//!
//! ```text
//! local-cluster up   --state-dir DIR [--crds deploy/crds] [--real-nodes [--prometheus]]  # until SIGINT/SIGTERM
//! local-cluster down --state-dir DIR [--timeout-seconds 60] # stops the `up` running on DIR
//! ```
//!
//! `up` writes `DIR/local-cluster.pid` at once and `DIR/kubeconfig` (admin, `system:masters`)
//! only when the cluster is ready, so a script can start it in the background and wait for that
//! file:
//!
//! ```text
//! local-cluster up --state-dir "$dir" &
//! until [ -f "$dir/kubeconfig" ]; do kill -0 $! || exit 1; sleep 1; done
//! KUBECONFIG="$dir/kubeconfig" kubectl get nodes
//! local-cluster down --state-dir "$dir"
//! ```
//!
//! On stop every component is terminated and `DIR/kubeconfig` and the pid file are removed;
//! component logs stay in `DIR/logs/`. If `up` itself dies, the kernel kills the components.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use clap::{Parser, Subcommand};
use multigres_e2e::cluster::{ClusterOptions, LocalCluster};
use multigres_e2e::nodes::CONTROL_PLANE_IP;
use multigres_e2e::prometheus::{self, Prometheus};
use tokio::signal::unix::{SignalKind, signal};

#[derive(Parser)]
#[command(about = "Run the real local Kubernetes control plane used by the e2e tests and the demo")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start the control plane and keep it running until SIGINT or SIGTERM.
    Up {
        /// Working directory: kubeconfig, certificates, logs, etcd data.
        #[arg(long)]
        state_dir: PathBuf,
        /// Directory of CRD manifests to install.
        #[arg(long)]
        crds: Option<PathBuf>,
        /// Real nodes (containerd, kubelet, kube-proxy, CoreDNS) instead of kwok's fakes; only
        /// inside e2e/sandbox.sh, with $MULTIGRES_IMAGES listing the images to import.
        #[arg(long)]
        real_nodes: bool,
        /// Also a Prometheus on the control plane's address (port 9090) that scrapes the
        /// handlers as the chart's ServiceMonitor says, evaluates its PrometheusRule and
        /// receives the data plane's OTLP metrics.
        #[arg(long, requires = "real_nodes")]
        prometheus: bool,
    },
    /// Stop the control plane started by `up` on the same state directory.
    Down {
        #[arg(long)]
        state_dir: PathBuf,
        /// How long to wait for `up` to finish stopping.
        #[arg(long, default_value_t = 60)]
        timeout_seconds: u64,
    },
}

const PID_FILE: &str = "local-cluster.pid";
const KUBECONFIG: &str = "kubeconfig";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,kube_client::client::builder=off".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Cmd::Up {
            state_dir,
            crds,
            real_nodes,
            prometheus,
        } => up(&state_dir, crds, real_nodes, prometheus).await,
        Cmd::Down {
            state_dir,
            timeout_seconds,
        } => down(&state_dir, Duration::from_secs(timeout_seconds)),
    }
}

async fn up(
    dir: &Path,
    crds: Option<PathBuf>,
    real_nodes: bool,
    prometheus: bool,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let dir = dir
        .canonicalize()
        .with_context(|| format!("resolving {}", dir.display()))?;
    let pid_file = dir.join(PID_FILE);
    if let Some(pid) = running_pid(&pid_file) {
        bail!(
            "local-cluster {pid} is already running on {}",
            dir.display()
        );
    }
    std::fs::write(&pid_file, std::process::id().to_string())
        .with_context(|| format!("writing {}", pid_file.display()))?;
    let kubeconfig = dir.join(KUBECONFIG);
    let _ = std::fs::remove_file(&kubeconfig);

    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let defaults = ClusterOptions::default();
    let opts = ClusterOptions {
        state_dir: Some(dir.clone()),
        real_nodes,
        crd_dir: crds.or(defaults.crd_dir.clone()),
        ..defaults
    };
    // Dropping a half-started cluster (on a signal) stops what it had started.
    let started = tokio::select! {
        started = LocalCluster::start(opts) => started.context("starting the local control plane"),
        _ = sigint.recv() => Err(anyhow!("interrupted during startup")),
        _ = sigterm.recv() => Err(anyhow!("terminated during startup")),
    };
    let cluster = match started {
        Ok(cluster) => cluster,
        Err(e) => {
            let _ = std::fs::remove_file(&pid_file);
            return Err(e);
        }
    };

    let prometheus = match prometheus {
        true => {
            let server = Prometheus::start(&cluster, prometheus::CHART_DEFAULT_VALUES)
                .await
                .map_err(|e| anyhow!("starting Prometheus: {e}"))?;
            println!(
                "Prometheus ready at http://{CONTROL_PLANE_IP}:{}, OTLP metrics to {}",
                prometheus::PORT,
                server.otlp_endpoint()
            );
            Some(server)
        }
        false => None,
    };

    // Publish the kubeconfig atomically: its presence means "ready".
    let staging = dir.join(format!("{KUBECONFIG}.tmp"));
    std::fs::copy(cluster.kubeconfig(), &staging).context("writing the kubeconfig")?;
    std::fs::rename(&staging, &kubeconfig).context("publishing the kubeconfig")?;
    let version = cluster.client()?.apiserver_version().await?;
    let rss: u64 = cluster.memory().iter().map(|m| m.rss_bytes).sum();
    println!(
        "local control plane {} ready in {:.1}s at {} ({} MiB RSS); export KUBECONFIG={}",
        version.git_version,
        cluster.startup_time().as_secs_f64(),
        cluster.server(),
        rss / (1024 * 1024),
        kubeconfig.display()
    );

    tokio::select! {
        _ = sigint.recv() => {}
        _ = sigterm.recv() => {}
    }
    let _ = std::fs::remove_file(&kubeconfig);
    drop(prometheus);
    cluster.stop();
    let _ = std::fs::remove_file(&pid_file);
    println!("local control plane stopped");
    Ok(())
}

#[allow(unsafe_code)] // libc calls, each under a SAFETY comment
fn down(dir: &Path, timeout: Duration) -> anyhow::Result<()> {
    let pid_file = dir.join(PID_FILE);
    let Some(pid) = running_pid(&pid_file) else {
        println!("no local-cluster running on {}", dir.display());
        return Ok(());
    };
    // SAFETY: kill(2) only sends a signal to the pid recorded by `up`.
    if unsafe { libc::kill(pid, libc::SIGTERM) } != 0 {
        return Err(std::io::Error::last_os_error()).context(format!("signalling {pid}"));
    }
    let deadline = Instant::now() + timeout;
    while process_alive(pid) {
        if Instant::now() >= deadline {
            bail!("local-cluster {pid} still running after {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    println!("local-cluster {pid} stopped");
    Ok(())
}

/// The pid recorded in `pid_file`, if that process is still running `local-cluster`.
fn running_pid(pid_file: &Path) -> Option<libc::pid_t> {
    let pid: libc::pid_t = std::fs::read_to_string(pid_file)
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
    let ours = std::env::current_exe().ok()?;
    (exe.file_name() == ours.file_name() && process_alive(pid)).then_some(pid)
}

/// Alive and not a zombie.
fn process_alive(pid: libc::pid_t) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| {
            stat.rsplit_once(") ")
                .is_some_and(|(_, rest)| !rest.starts_with('Z'))
        })
        .unwrap_or(false)
}
