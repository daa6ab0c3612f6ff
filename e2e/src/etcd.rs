//! Standalone etcd on loopback.
//!
//! Launches the real etcd binary on `127.0.0.1` with free client and peer ports and a data
//! directory of the caller's choice (a temporary one by default). Used as the Multigres topology
//! server in component tests and as the kube-apiserver's storage in the control-plane harness.
//! The process can be stopped and restarted on the same ports and data directory, which is how
//! tests simulate an etcd outage, and it is killed when the handle is dropped.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::toolchain::{self, ToolchainError};

/// Environment variable naming an etcd binary to use instead of the toolchain's, e.g. Debian's
/// `/usr/bin/etcd` for quick local experiments.
pub const ETCD_BIN_ENV: &str = "MULTIGRES_ETCD_BIN";

/// How many bytes of the etcd log an error message quotes.
const LOG_TAIL_BYTES: usize = 4000;

/// Errors starting or stopping etcd.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    #[error("locating the etcd binary: {0}")]
    Binary(#[from] ToolchainError),
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

impl EtcdError {
    fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            context: context.into(),
            source,
        }
    }
}

/// How to launch etcd. `EtcdConfig::default()` gives a single-member etcd on a temporary data
/// directory, using `$MULTIGRES_ETCD_BIN` or else the toolchain's etcd.
#[derive(Debug, Clone)]
pub struct EtcdConfig {
    /// The etcd binary; `None` means `$MULTIGRES_ETCD_BIN`, else `toolchain::binary("etcd")`.
    pub binary: Option<PathBuf>,
    /// The data directory; `None` means a fresh temporary directory removed on drop.
    pub data_dir: Option<PathBuf>,
    /// Member name (`--name`).
    pub name: String,
    /// Arguments appended after the ones the launcher sets (TLS, quotas, log level, ...).
    pub extra_args: Vec<String>,
    /// How long to wait for `/health` to report healthy after each (re)start.
    pub startup_timeout: Duration,
}

impl Default for EtcdConfig {
    fn default() -> Self {
        Self {
            binary: None,
            data_dir: None,
            name: "default".to_string(),
            extra_args: Vec::new(),
            startup_timeout: Duration::from_secs(30),
        }
    }
}

/// A running (or stopped) etcd member. Dropping it kills the process.
#[derive(Debug)]
pub struct EtcdProcess {
    child: Option<Child>,
    binary: PathBuf,
    config: EtcdConfig,
    data_dir: PathBuf,
    log_path: PathBuf,
    client_port: u16,
    peer_port: u16,
    // Holds the log file and, by default, the data directory; removed on drop.
    _work_dir: tempfile::TempDir,
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
            .map_err(|e| EtcdError::io("creating a temporary directory", e))?;
        let data_dir = config
            .data_dir
            .clone()
            .unwrap_or_else(|| work_dir.path().join("data"));
        let log_path = work_dir.path().join("etcd.log");
        let client_port = free_port()?;
        let peer_port = free_port()?;
        let mut etcd = Self {
            child: None,
            binary,
            config,
            data_dir,
            log_path,
            client_port,
            peer_port,
            _work_dir: work_dir,
        };
        etcd.launch().await?;
        Ok(etcd)
    }

    /// The client URL, `http://127.0.0.1:<port>`.
    pub fn client_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
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

    /// The data directory, kept across `stop`/`restart`.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The file receiving etcd's stdout and stderr (appended to across restarts).
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The process id while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the etcd process is still alive.
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Kills etcd abruptly (like a crash or a node loss) and waits for it to exit. The data
    /// directory and ports are kept for `restart`. Stopping a stopped etcd does nothing.
    pub fn stop(&mut self) -> Result<(), EtcdError> {
        if let Some(mut child) = self.child.take() {
            kill_and_reap(&mut child).map_err(|e| EtcdError::io("killing etcd", e))?;
        }
        Ok(())
    }

    /// Starts etcd again on the same ports and data directory (stopping it first if running) and
    /// waits until it is healthy.
    pub async fn restart(&mut self) -> Result<(), EtcdError> {
        self.stop()?;
        self.launch().await
    }

    async fn launch(&mut self) -> Result<(), EtcdError> {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .map_err(|e| EtcdError::io(format!("opening {}", self.log_path.display()), e))?;
        let log_err = log
            .try_clone()
            .map_err(|e| EtcdError::io("duplicating the log file handle", e))?;
        let client_url = self.client_url();
        let peer_url = format!("http://127.0.0.1:{}", self.peer_port);
        let child = Command::new(&self.binary)
            .arg("--name")
            .arg(&self.config.name)
            .arg("--data-dir")
            .arg(&self.data_dir)
            .arg("--listen-client-urls")
            .arg(&client_url)
            .arg("--advertise-client-urls")
            .arg(&client_url)
            .arg("--listen-peer-urls")
            .arg(&peer_url)
            .arg("--initial-advertise-peer-urls")
            .arg(&peer_url)
            .arg("--initial-cluster")
            .arg(format!("{}={peer_url}", self.config.name))
            .arg("--unsafe-no-fsync")
            .args(&self.config.extra_args)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            // Its own process group, so a terminal's Ctrl-C reaches the test first and the test's
            // drop handlers do the cleanup.
            .process_group(0)
            .spawn()
            .map_err(|e| EtcdError::io(format!("spawning {}", self.binary.display()), e))?;
        self.child = Some(child);
        self.wait_healthy().await
    }

    async fn wait_healthy(&mut self) -> Result<(), EtcdError> {
        let timeout = self.config.startup_timeout;
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                self.child = None;
                return Err(EtcdError::Exited {
                    status,
                    log: self.log_tail(),
                });
            }
            if health_ok(self.client_port).await {
                return Ok(());
            }
            if Instant::now() >= deadline {
                self.stop()?;
                return Err(EtcdError::Unhealthy {
                    url: self.client_url(),
                    timeout,
                    log: self.log_tail(),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn log_tail(&self) -> String {
        let mut text = String::new();
        if let Ok(mut file) = File::open(&self.log_path) {
            let mut bytes = Vec::new();
            if file.read_to_end(&mut bytes).is_ok() {
                let start = bytes.len().saturating_sub(LOG_TAIL_BYTES);
                text = String::from_utf8_lossy(&bytes[start..]).into_owned();
            }
        }
        text
    }
}

impl Drop for EtcdProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Nothing useful can be done with a failure here; the process is gone or unkillable.
            let _ = kill_and_reap(&mut child);
        }
    }
}

fn kill_and_reap(child: &mut Child) -> std::io::Result<()> {
    if child.try_wait()?.is_none() {
        child.kill()?;
    }
    child.wait().map(|_| ())
}

fn free_port() -> Result<u16, EtcdError> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .map_err(|e| EtcdError::io("binding a free loopback port", e))?;
    let port = listener
        .local_addr()
        .map_err(|e| EtcdError::io("reading the bound port", e))?
        .port();
    Ok(port)
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
    use super::*;

    fn process_exists(pid: u32) -> bool {
        Path::new(&format!("/proc/{pid}")).exists()
    }

    #[tokio::test]
    async fn start_stop_restart_and_drop() {
        let mut etcd = EtcdProcess::start(EtcdConfig::default())
            .await
            .expect("etcd starts");
        assert!(etcd.is_running());
        assert!(health_ok(etcd.client_port()).await);
        assert!(etcd.data_dir().join("member").is_dir());
        let url = etcd.client_url();
        assert_eq!(url, format!("http://{}", etcd.client_addr()));

        let first_pid = etcd.pid().expect("running etcd has a pid");
        etcd.stop().expect("etcd stops");
        assert!(!etcd.is_running());
        assert!(!process_exists(first_pid));
        assert!(!health_ok(etcd.client_port()).await);

        etcd.restart().await.expect("etcd restarts");
        assert_eq!(etcd.client_url(), url, "restart keeps the client port");
        assert!(health_ok(etcd.client_port()).await);

        let pid = etcd.pid().expect("restarted etcd has a pid");
        let work_dir = etcd.log_path().parent().map(Path::to_path_buf);
        drop(etcd);
        assert!(!process_exists(pid), "drop kills etcd");
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
