//! Child processes that cannot outlive the harness.
//!
//! Every component runs in its own process group (so a stop reaches anything it forks) with
//! `PR_SET_PDEATHSIG=SIGKILL`, so the kernel kills it when the harness dies, even on a panic, a
//! `process::exit` that skips destructors, or SIGKILL. The death signal fires when the *thread*
//! that forked exits, not the process, so every child is forked by one dedicated spawner thread
//! that lives as long as the process.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Sender};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Errors starting or stopping a supervised process.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("creating log file {path}: {source}")]
    Log {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("starting {name} ({program}): {source}")]
    Spawn {
        name: String,
        program: PathBuf,
        source: std::io::Error,
    },
    #[error("the process spawner thread is gone")]
    SpawnerGone,
}

type SpawnRequest = (Command, Sender<std::io::Result<Child>>);

/// Sends commands to the long-lived spawner thread and returns the spawned child.
fn spawn_on_long_lived_thread(command: Command) -> Result<std::io::Result<Child>, ProcessError> {
    static SPAWNER: OnceLock<Mutex<Sender<SpawnRequest>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("e2e-spawner".into())
            .spawn(move || {
                for (mut command, reply) in rx {
                    // The requester may have given up; nothing to do then.
                    let _ = reply.send(command.spawn());
                }
            })
            .expect("spawning the e2e-spawner thread");
        Mutex::new(tx)
    });
    let (reply_tx, reply_rx) = mpsc::channel();
    spawner
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .send((command, reply_tx))
        .map_err(|_| ProcessError::SpawnerGone)?;
    reply_rx.recv().map_err(|_| ProcessError::SpawnerGone)
}

/// A running component whose stdout and stderr go to a log file.
#[derive(Debug)]
pub struct Supervised {
    name: String,
    args: Vec<String>,
    log: PathBuf,
    child: Mutex<Option<Child>>,
    pid: u32,
}

impl Supervised {
    /// Starts `program` with `args` and `envs`, logging both output streams to `log` (appended:
    /// a component started again, as a node powered on, keeps its earlier log).
    pub fn spawn(
        name: &str,
        program: &Path,
        args: &[String],
        envs: &[(&str, &str)],
        log: &Path,
    ) -> Result<Supervised, ProcessError> {
        let log_err = |source| ProcessError::Log {
            path: log.to_path_buf(),
            source,
        };
        let out = File::options()
            .create(true)
            .append(true)
            .open(log)
            .map_err(log_err)?;
        let err = out.try_clone().map_err(log_err)?;
        let mut command = Command::new(program);
        command
            .args(args)
            .envs(envs.iter().copied())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        die_with_parent(&mut command);
        let child = spawn_on_long_lived_thread(command)?.map_err(|source| ProcessError::Spawn {
            name: name.to_string(),
            program: program.to_path_buf(),
            source,
        })?;
        Ok(Supervised {
            name: name.to_string(),
            args: args.to_vec(),
            log: log.to_path_buf(),
            pid: child.id(),
            child: Mutex::new(Some(child)),
        })
    }

    /// The component's name (as used in errors and the log file name).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The arguments it was started with.
    pub fn args(&self) -> &[String] {
        &self.args
    }

    /// Process id (also the process group id).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Path of the combined stdout/stderr log.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// `Some(status)` once the process has exited (it is then reaped).
    pub fn exit_status(&self) -> Option<ExitStatus> {
        let mut guard = self.child.lock().unwrap_or_else(|p| p.into_inner());
        match guard.as_mut() {
            Some(child) => child.try_wait().ok().flatten(),
            None => None,
        }
    }

    /// Whether the process still runs: neither exited nor stopped.
    pub fn is_running(&self) -> bool {
        let mut guard = self.child.lock().unwrap_or_else(|p| p.into_inner());
        guard
            .as_mut()
            .is_some_and(|child| matches!(child.try_wait(), Ok(None)))
    }

    /// The last `lines` lines of the log, for error messages.
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.log, lines)
    }

    /// Current and peak resident set size in bytes (`VmRSS`, `VmHWM`), if the process is alive.
    pub fn memory(&self) -> Option<(u64, u64)> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).ok()?;
        let field = |key: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .map(|kb| kb * 1024)
        };
        Some((field("VmRSS:")?, field("VmHWM:")?))
    }

    /// Sends SIGTERM to the process group, waits up to `grace`, then SIGKILLs it; idempotent.
    pub fn stop(&self, grace: Duration) {
        let mut guard = self.child.lock().unwrap_or_else(|p| p.into_inner());
        let Some(mut child) = guard.take() else {
            return;
        };
        signal_group(self.pid, libc::SIGTERM);
        let deadline = Instant::now() + grace;
        loop {
            match child.try_wait() {
                Ok(Some(_)) | Err(_) => break,
                Ok(None) if Instant::now() >= deadline => {
                    signal_group(self.pid, libc::SIGKILL);
                    let _ = child.wait();
                    break;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        // Anything the component forked into its group goes with it.
        signal_group(self.pid, libc::SIGKILL);
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(10));
    }
}

/// Puts the child in its own process group and asks the kernel to SIGKILL it when the spawning
/// thread dies.
#[allow(unsafe_code)] // libc calls, each under a SAFETY comment
fn die_with_parent(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    let parent = std::process::id();
    command.process_group(0);
    // SAFETY: the closure runs between fork and exec and only calls the async-signal-safe
    // functions prctl(2) and getppid(2), allocating nothing.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died before prctl took effect.
            if libc::getppid() as u32 != parent {
                return Err(std::io::Error::other("parent exited during spawn"));
            }
            Ok(())
        });
    }
}

#[allow(unsafe_code)] // libc calls, each under a SAFETY comment
fn signal_group(pgid: u32, signal: libc::c_int) {
    let Ok(pgid) = libc::pid_t::try_from(pgid) else {
        return;
    };
    // SAFETY: kill(2) with a negative pid signals that process group; it has no memory effects.
    // ESRCH (group already gone) is the expected outcome after an exit and is ignored.
    unsafe {
        libc::kill(-pgid, signal);
    }
}

/// The last `lines` lines of a file (reads at most the final 64 KiB).
pub fn tail(path: &Path, lines: usize) -> String {
    const MAX: u64 = 64 * 1024;
    let Ok(mut file) = File::open(path) else {
        return format!("(no log at {})", path.display());
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = file.seek(SeekFrom::Start(len.saturating_sub(MAX)));
    let mut bytes = Vec::new();
    let _ = file.read_to_end(&mut bytes);
    let text = String::from_utf8_lossy(&bytes);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alive(pid: u32) -> bool {
        // A reaped or never-existing pid has no /proc entry; a zombie would show state Z.
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| !s.contains(") Z "))
            .unwrap_or(false)
    }

    #[test]
    fn stop_terminates_the_whole_process_group() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("sh.log");
        // The shell forks a grandchild that ignores nothing and would outlive a plain kill.
        let args = vec![
            "-c".to_string(),
            "sleep 300 & echo child=$!; wait".to_string(),
        ];
        let p = Supervised::spawn("sh", Path::new("/bin/sh"), &args, &[], &log).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let grandchild = loop {
            let text = std::fs::read_to_string(&log).unwrap();
            if let Some(pid) = text.trim().strip_prefix("child=") {
                break pid.parse::<u32>().unwrap();
            }
            assert!(Instant::now() < deadline, "no grandchild pid in {text:?}");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(alive(p.pid()) && alive(grandchild));
        p.stop(Duration::from_secs(5));
        let deadline = Instant::now() + Duration::from_secs(5);
        while alive(grandchild) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(!alive(p.pid()), "child survived stop");
        assert!(!alive(grandchild), "grandchild survived stop");
    }

    #[test]
    fn child_survives_the_requesting_thread_and_leads_its_group() {
        // Spawned from a short-lived thread: the fork happens on the long-lived spawner thread,
        // so the parent-death signal must not fire when the requesting thread ends.
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("sleep.log");
        let args = vec!["300".to_string()];
        let p = std::thread::spawn(move || {
            Supervised::spawn("sleep", Path::new("/bin/sleep"), &args, &[], &log).unwrap()
        })
        .join()
        .unwrap();
        std::thread::sleep(Duration::from_millis(200));
        assert!(alive(p.pid()), "child died with the short-lived thread");
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", p.pid())).unwrap();
        // Field 5 of /proc/<pid>/stat is the process group id.
        let after_comm = stat.rsplit_once(") ").unwrap().1;
        let pgrp: u32 = after_comm.split(' ').nth(2).unwrap().parse().unwrap();
        assert_eq!(pgrp, p.pid());
        p.stop(Duration::from_secs(5));
        assert!(!alive(p.pid()));
    }

    /// Set in the re-executed copy of the test binary: where to write the child's pid.
    const ORPHAN_PIDFILE_ENV: &str = "MULTIGRES_E2E_ORPHAN_PIDFILE";

    #[test]
    fn child_is_killed_when_the_harness_exits_without_cleanup() {
        if let Some(pidfile) = std::env::var_os(ORPHAN_PIDFILE_ENV) {
            // Re-executed copy: start a child, then exit without running any destructor.
            let log = PathBuf::from(&pidfile).with_extension("log");
            let p = Supervised::spawn("sleep", Path::new("/bin/sleep"), &["300".into()], &[], &log)
                .unwrap();
            std::fs::write(&pidfile, p.pid().to_string()).unwrap();
            std::process::exit(0);
        }
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("child.pid");
        let status = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "process::tests::child_is_killed_when_the_harness_exits_without_cleanup",
            ])
            .env(ORPHAN_PIDFILE_ENV, &pidfile)
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success());
        let pid: u32 = std::fs::read_to_string(&pidfile).unwrap().parse().unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while alive(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(!alive(pid), "child {pid} outlived the harness process");
    }

    #[test]
    fn tail_returns_the_last_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let text: String = (1..=100).map(|i| format!("line {i}\n")).collect();
        std::fs::write(&path, text).unwrap();
        assert_eq!(tail(&path, 3), "line 98\nline 99\nline 100");
    }
}
