//! Standalone etcd on loopback.
//!
//! Launches the real etcd binary on `127.0.0.1` with free client and peer ports and a data
//! directory of the caller's choice (a temporary one by default). Used as the Multigres topology
//! server in component tests and as the kube-apiserver's storage in the control-plane harness.
//! The process can be stopped and restarted on the same ports and data directory, which is how
//! tests simulate an etcd outage, and it is killed when the handle is dropped.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use crate::process::{ProcessError, Supervised};
use crate::toolchain::{self, ToolchainError};

/// Environment variable naming an etcd binary to use instead of the toolchain's, e.g. Debian's
/// `/usr/bin/etcd` for quick local experiments.
pub const ETCD_BIN_ENV: &str = "MULTIGRES_ETCD_BIN";

/// How many log lines an error message quotes.
const LOG_TAIL_LINES: usize = 40;

/// Errors starting or stopping etcd.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    #[error("locating the etcd binary: {0}")]
    Binary(#[from] ToolchainError),
    #[error(transparent)]
    Process(#[from] ProcessError),
    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
    #[error("etcd exited during startup ({status}); log tail:\n{log}")]
    Exited { status: ExitStatus, log: String },
    #[error("etcd at {url} was not healthy within {timeout:?}; log tail:\n{log}")]
    Unhealthy {
        url: String,
        timeout: Duration,
        log: String,
    },
}

/// Server certificate files for serving the client port over TLS.
#[derive(Debug, Clone)]
pub struct EtcdTls {
    /// Serving certificate (PEM); must name `127.0.0.1`.
    pub cert_file: PathBuf,
    /// Its private key (PEM).
    pub key_file: PathBuf,
    /// When set, clients must present a certificate signed by this CA (`--client-cert-auth`).
    pub client_ca_file: Option<PathBuf>,
}

/// How to launch etcd. `EtcdConfig::default()` gives a single plaintext member on a temporary
/// data directory, using `$MULTIGRES_ETCD_BIN` or else the toolchain's etcd.
#[derive(Debug, Clone)]
pub struct EtcdConfig {
    /// The etcd binary; `None` means `$MULTIGRES_ETCD_BIN`, else `toolchain::binary("etcd")`.
    pub binary: Option<PathBuf>,
    /// The data directory; `None` means a fresh temporary directory removed on drop.
    pub data_dir: Option<PathBuf>,
    /// Member name (`--name`).
    pub name: String,
    /// Serve the client port over TLS; `None` means plain HTTP.
    pub tls: Option<EtcdTls>,
    /// Arguments appended after the ones the launcher sets (quotas, log level, ...).
    pub extra_args: Vec<String>,
    /// How long to wait for `/health` to report healthy after each (re)start.
    pub startup_timeout: Duration,
    /// How long `stop` (and drop) waits after SIGTERM before SIGKILL. etcd's graceful shutdown
    /// waits seconds for open client streams, so the default is zero: an abrupt stop, like a
    /// crash (committed data survives it; `--unsafe-no-fsync` only risks it on a machine crash).
    pub stop_grace: Duration,
}

impl Default for EtcdConfig {
    fn default() -> Self {
        Self {
            binary: None,
            data_dir: None,
            name: "default".to_string(),
            tls: None,
            extra_args: Vec::new(),
            startup_timeout: Duration::from_secs(30),
            stop_grace: Duration::ZERO,
        }
    }
}

/// A running (or stopped) etcd member. Dropping it stops the process like `stop`.
#[derive(Debug)]
pub struct EtcdProcess {
    // Declared first so the process is stopped before the work directory is removed.
    child: Option<Supervised>,
    binary: PathBuf,
    config: EtcdConfig,
    data_dir: PathBuf,
    launches: u32,
    client_port: u16,
    peer_port: u16,
    health_port: u16,
    // While stopped, sockets bound (not listening) to the three ports: another process picking
    // a free port cannot be handed one of them (and answer the handlers' etcd client in etcd's
    // place), and a connection attempt is still refused as with nothing there.
    reserved: Vec<TcpSocket>,
    // Holds the logs and, by default, the data directory; removed on drop.
    work_dir: tempfile::TempDir,
}

impl EtcdProcess {
    /// Starts etcd on free loopback ports and waits until `/health` reports healthy.
    pub async fn start(config: EtcdConfig) -> Result<Self, EtcdError> {
        let binary = match &config.binary {
            Some(path) => path.clone(),
            None => match std::env::var_os(ETCD_BIN_ENV) {
                Some(path) => PathBuf::from(path),
                None => toolchain::binary("etcd")?,
            },
        };
        let work_dir = tempfile::Builder::new()
            .prefix("etcd-")
            .tempdir()
            .map_err(|source| EtcdError::Io {
                context: "creating a temporary directory".into(),
                source,
            })?;
        let data_dir = config
            .data_dir
            .clone()
            .unwrap_or_else(|| work_dir.path().join("data"));
        let mut etcd = Self {
            child: None,
            binary,
            config,
            data_dir,
            launches: 0,
            client_port: free_port()?,
            peer_port: free_port()?,
            health_port: free_port()?,
            reserved: Vec::new(),
            work_dir,
        };
        etcd.launch().await?;
        Ok(etcd)
    }

    /// The client URL, `http://127.0.0.1:<port>` (`https://` with TLS).
    pub fn client_url(&self) -> String {
        let scheme = if self.config.tls.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    /// The client address as `host:port`, the form Multigres topology records use.
    pub fn client_addr(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    /// The client port.
    pub fn client_port(&self) -> u16 {
        self.client_port
    }

    /// The peer port.
    pub fn peer_port(&self) -> u16 {
        self.peer_port
    }

    /// Plain-HTTP URL serving `/health` and `/metrics`, also when the client port uses TLS.
    pub fn health_url(&self) -> String {
        format!("http://127.0.0.1:{}/health", self.health_port)
    }

    /// The data directory, kept across `stop`/`restart`.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The log (stdout and stderr) of the current or latest run; each run has its own file.
    pub fn log_path(&self) -> PathBuf {
        self.work_dir
            .path()
            .join(format!("etcd-{}.log", self.launches))
    }

    /// The process id while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Supervised::pid)
    }

    /// Whether the etcd process is still alive.
    pub fn is_running(&self) -> bool {
        self.child
            .as_ref()
            .is_some_and(|child| child.exit_status().is_none())
    }

    /// Stops etcd (SIGTERM, then SIGKILL after `stop_grace`) and waits for it to exit. The
    /// data directory and ports are kept for `restart`: the ports stay reserved until then.
    /// Stopping a stopped etcd does nothing.
    pub fn stop(&mut self) {
        if let Some(child) = self.child.take() {
            child.stop(self.config.stop_grace);
            self.reserved = [self.client_port, self.peer_port, self.health_port]
                .into_iter()
                .filter_map(reserve)
                .collect();
        }
    }

    /// Starts etcd again on the same ports and data directory (stopping it first if running) and
    /// waits until it is healthy.
    pub async fn restart(&mut self) -> Result<(), EtcdError> {
        self.stop();
        self.launch().await
    }

    async fn launch(&mut self) -> Result<(), EtcdError> {
        self.launches += 1;
        let client_url = self.client_url();
        let peer_url = format!("http://127.0.0.1:{}", self.peer_port);
        let mut args = vec![
            format!("--name={}", self.config.name),
            format!("--data-dir={}", self.data_dir.display()),
            format!("--listen-client-urls={client_url}"),
            format!("--advertise-client-urls={client_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster={}={peer_url}", self.config.name),
            format!(
                "--listen-metrics-urls=http://127.0.0.1:{}",
                self.health_port
            ),
            "--unsafe-no-fsync".to_string(),
        ];
        if let Some(tls) = &self.config.tls {
            args.push(format!("--cert-file={}", tls.cert_file.display()));
            args.push(format!("--key-file={}", tls.key_file.display()));
            if let Some(ca) = &tls.client_ca_file {
                args.push(format!("--trusted-ca-file={}", ca.display()));
                args.push("--client-cert-auth".to_string());
            }
        }
        args.extend(self.config.extra_args.iter().cloned());
        self.reserved.clear();
        let child = Supervised::spawn("etcd", &self.binary, &args, &[], &self.log_path())?;
        self.child = Some(child);
        self.wait_healthy().await
    }

    async fn wait_healthy(&mut self) -> Result<(), EtcdError> {
        let timeout = self.config.startup_timeout;
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.as_ref().and_then(Supervised::exit_status) {
                let log = self.log_tail();
                self.child = None;
                return Err(EtcdError::Exited { status, log });
            }
            if health_ok(self.health_port).await {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let log = self.log_tail();
                self.stop();
                return Err(EtcdError::Unhealthy {
                    url: self.health_url(),
                    timeout,
                    log,
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn log_tail(&self) -> String {
        crate::process::tail(&self.log_path(), LOG_TAIL_LINES)
    }
}

impl Drop for EtcdProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A socket bound to loopback `port` without listening, or `None` if the port is taken (by
/// then someone else holds it; the restart will say so).
fn reserve(port: u16) -> Option<TcpSocket> {
    let socket = TcpSocket::new_v4().ok()?;
    // Connections etcd closed leave TIME_WAIT entries on its ports; they must not stop the
    // reservation. Nothing else binds these ports: they lie outside the ephemeral range
    // (`crate::ports`).
    socket.set_reuseaddr(true).ok()?;
    socket
        .bind(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
        .ok()?;
    Some(socket)
}

fn free_port() -> Result<u16, EtcdError> {
    let io = |source| EtcdError::Io {
        context: "picking a free loopback port".into(),
        source,
    };
    crate::ports::free_loopback_port().map_err(io)
}

/// One plain HTTP/1.1 `GET /health`; true when etcd answers `"health":"true"`.
async fn health_ok(port: u16) -> bool {
    let attempt = async {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
        let request =
            format!("GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await.ok()?;
        Some(String::from_utf8_lossy(&response).contains("\"health\":\"true\""))
    };
    tokio::time::timeout(Duration::from_secs(2), attempt)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;
    use crate::pki::Pki;

    fn process_exists(pid: u32) -> bool {
        Path::new(&format!("/proc/{pid}")).exists()
    }

    #[tokio::test]
    async fn start_stop_restart_and_drop() {
        let mut etcd = EtcdProcess::start(EtcdConfig::default())
            .await
            .expect("etcd starts");
        assert!(etcd.is_running());
        assert!(
            health_ok(etcd.client_port()).await,
            "plain client port serves /health"
        );
        assert!(etcd.data_dir().join("member").is_dir());
        let url = etcd.client_url();
        assert_eq!(url, format!("http://{}", etcd.client_addr()));

        let first_pid = etcd.pid().expect("running etcd has a pid");
        etcd.stop();
        assert!(!etcd.is_running());
        assert!(!process_exists(first_pid));
        assert!(!health_ok(etcd.client_port()).await);

        etcd.restart().await.expect("etcd restarts");
        assert_eq!(etcd.client_url(), url, "restart keeps the client port");
        assert!(health_ok(etcd.client_port()).await);
        assert!(etcd.log_path().ends_with("etcd-2.log"));

        let pid = etcd.pid().expect("restarted etcd has a pid");
        let work_dir = etcd.log_path().parent().map(Path::to_path_buf);
        drop(etcd);
        assert!(!process_exists(pid), "drop stops etcd");
        assert!(
            work_dir.is_some_and(|d| !d.exists()),
            "drop removes the work dir"
        );
    }

    #[tokio::test]
    async fn caller_data_dir_and_extra_args_are_used() {
        let dir = tempfile::tempdir().expect("tempdir");
        let data_dir = dir.path().join("etcd-data");
        let config = EtcdConfig {
            data_dir: Some(data_dir.clone()),
            name: "member-a".to_string(),
            extra_args: vec!["--quota-backend-bytes=134217728".to_string()],
            ..EtcdConfig::default()
        };
        let etcd = EtcdProcess::start(config).await.expect("etcd starts");
        assert_eq!(etcd.data_dir(), data_dir);
        assert!(data_dir.join("member").is_dir());
        drop(etcd);
        assert!(
            data_dir.is_dir(),
            "a caller's data dir outlives the process"
        );
    }

    #[tokio::test]
    async fn tls_client_port_and_plain_health_port() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pki = Pki::generate(dir.path(), &[Ipv4Addr::LOCALHOST]).expect("certificates");
        let config = EtcdConfig {
            tls: Some(EtcdTls {
                cert_file: pki.apiserver_cert.clone(),
                key_file: pki.apiserver_key.clone(),
                client_ca_file: Some(pki.ca_cert.clone()),
            }),
            ..EtcdConfig::default()
        };
        let etcd = EtcdProcess::start(config)
            .await
            .expect("etcd starts with TLS");
        assert_eq!(etcd.client_url(), format!("https://{}", etcd.client_addr()));
        assert!(etcd.health_url().starts_with("http://"));
        assert!(
            !health_ok(etcd.client_port()).await,
            "the client port does not answer plain HTTP"
        );
    }

    #[tokio::test]
    async fn bad_arguments_report_the_exit_and_log() {
        let config = EtcdConfig {
            extra_args: vec!["--no-such-flag".to_string()],
            ..EtcdConfig::default()
        };
        let err = EtcdProcess::start(config)
            .await
            .expect_err("etcd rejects an unknown flag");
        match err {
            EtcdError::Exited { log, .. } => assert!(log.contains("no-such-flag"), "{log}"),
            other => panic!("unexpected error: {other}"),
        }
    }
}
