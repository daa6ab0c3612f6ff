//! How a handler process starts: the allocator's settings, then the async runtime its `main`
//! runs on. A binary's `fn main` is `multigres_common::process::run(Threads::.., async_main())`.

use std::future::Future;

/// The threads a handler's runtime runs its tasks on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Threads {
    /// Every task on the main thread. For the controller handlers: they spend their time
    /// waiting on the API server (at 100 clusters the busiest used 12 s of CPU in the 3
    /// minutes it took them to converge), so worker threads only added their stacks
    /// ([`crate::memory`] has the figure).
    One,
    /// One worker thread per CPU (or `TOKIO_WORKER_THREADS`), as `#[tokio::main]`: for the
    /// webhook-server, which the API server calls for every write and which does TLS
    /// handshakes beside the admission checks.
    PerCpu,
}

/// Runs `main` to completion on a tokio runtime with `threads`, after
/// [`crate::memory::limit_malloc_arenas`]. Call it first, before any other thread exists.
pub fn run<F: Future>(threads: Threads, main: F) -> F::Output {
    crate::memory::limit_malloc_arenas();
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
