//! Locates the control-plane binaries built by `e2e/toolchain/build.sh` (kube-apiserver,
//! kube-controller-manager, kube-scheduler, kubectl, etcd, kwok, helm, promtool).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Environment variable that points straight at a directory holding the binaries.
pub const BIN_DIR_ENV: &str = "MULTIGRES_TOOLCHAIN_BIN";

/// Errors locating or building the toolchain.
#[derive(Debug, thiserror::Error)]
pub enum ToolchainError {
    #[error("running {script}: {source}")]
    Spawn {
        script: PathBuf,
        source: std::io::Error,
    },
    #[error("{script} failed ({status}); its output:\n{stderr}")]
    Build {
        script: PathBuf,
        status: std::process::ExitStatus,
        stderr: String,
    },
    #[error("{0} is not an executable file; run e2e/toolchain/build.sh")]
    Missing(PathBuf),
}

/// The directory holding the control-plane binaries: `$MULTIGRES_TOOLCHAIN_BIN` if set, else the
/// output of `e2e/toolchain/build.sh` (which builds them once per machine and caches them).
pub fn bin_dir() -> Result<&'static Path, &'static ToolchainError> {
    static DIR: OnceLock<Result<PathBuf, ToolchainError>> = OnceLock::new();
    DIR.get_or_init(locate).as_deref()
}

/// Full path of one toolchain binary, checked to exist.
pub fn binary(name: &str) -> Result<PathBuf, ToolchainError> {
    let dir = bin_dir().map_err(|e| ToolchainError::Missing(PathBuf::from(e.to_string())))?;
    let path = dir.join(name);
    if path.is_file() {
        Ok(path)
    } else {
        Err(ToolchainError::Missing(path))
    }
}

fn locate() -> Result<PathBuf, ToolchainError> {
    if let Some(dir) = std::env::var_os(BIN_DIR_ENV) {
        return Ok(PathBuf::from(dir));
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("toolchain/build.sh");
    let out = Command::new("bash")
        .arg(&script)
        .output()
        .map_err(|source| ToolchainError::Spawn {
            script: script.clone(),
            source,
        })?;
    if !out.status.success() {
        return Err(ToolchainError::Build {
            script,
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
    Ok(PathBuf::from(dir))
}
