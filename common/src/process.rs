//! How a handler process starts: the allocator's settings, then the async runtime its `main`
//! runs on. A binary's `fn main` is `multigres_common::process::run(Threads::.., async_main())`.

use std::future::Future;

/// The threads a handler's runtime runs its tasks on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Threads {
    /// Every task on the main thread. For the controller handlers: they spend their time
    /// waiting on the API server (at 100 clusters the busiest used 12 s of CPU in the 3
    /// minutes it took them to converge), so worker threads only added their stacks.
    One,
    /// One worker thread per CPU (or `TOKIO_WORKER_THREADS`), as `#[tokio::main]`: for the
    /// webhook-server, which the API server calls for every write and which does TLS
    /// handshakes beside the admission checks.
    PerCpu,
}

/// Runs `main` to completion on a tokio runtime with `threads`, after
/// [`limit_malloc_arenas`]. Call it first, before any other thread exists.
pub fn run<F: Future>(threads: Threads, main: F) -> F::Output {
    limit_malloc_arenas();
    let mut builder = match threads {
        Threads::One => tokio::runtime::Builder::new_current_thread(),
        Threads::PerCpu => tokio::runtime::Builder::new_multi_thread(),
    };
    builder
        .enable_all()
        .build()
        .expect("the tokio runtime starts")
        .block_on(main)
}

/// Makes every thread allocate from glibc's one main arena. By default glibc gives threads
/// arenas of their own (up to eight per CPU) so they do not wait on each other's lock, and
/// each arena keeps its own free pages resident: the webhook-server's workers, and in every
/// handler the blocking pool's threads (name lookups, credential refreshes). Allocation is a
/// small share of a handler's work, so one lock costs little. Measured by `bench`
/// (docs/performance.md, session 15) while the controllers still had two workers: their
/// peaks 1.5 MiB lower together at 10 clusters and 2.6 MiB at 100. `MALLOC_ARENA_MAX` still
/// overrides it.
fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: `mallopt` only sets a parameter of glibc's allocator, and no other thread
        // exists yet to allocate concurrently.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 1);
        }
    }
}
