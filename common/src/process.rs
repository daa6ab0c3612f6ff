//! How a handler process starts: the allocator's settings, then the async runtime its `main`
//! runs on. A binary's `fn main` is `multigres_common::process::run(async_main())`.

use std::future::Future;

/// Runs `main` to completion on a multi-threaded tokio runtime (as `#[tokio::main]` does, with
/// the same worker count: the CPUs available, or `TOKIO_WORKER_THREADS`), after
/// [`limit_malloc_arenas`]. Call it first, before any other thread exists.
pub fn run<F: Future>(main: F) -> F::Output {
    limit_malloc_arenas();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("the tokio runtime starts")
        .block_on(main)
}

/// Makes every thread allocate from glibc's one main arena. By default glibc gives threads
/// arenas of their own (up to eight per CPU) so they do not wait on each other's lock, and
/// each arena keeps its own free pages resident; a handler's threads take turns on the same
/// objects (a watch caches what one thread read, a reconcile on another reads and frees it),
/// and allocation is a small share of their work, so one lock costs little. Measured by
/// `bench` (docs/performance.md, session 15): the three controllers' peaks 1.5 MiB lower
/// together at 10 clusters and 2.6 MiB at 100. `MALLOC_ARENA_MAX` still overrides it.
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
