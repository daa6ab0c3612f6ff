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
/// (docs/dev/perf-history.md) while the controllers still had two workers: their
/// peaks 1.5 MiB lower together at 10 clusters and 2.6 MiB at 100. `MALLOC_ARENA_MAX` still
/// overrides it.
#[allow(unsafe_code)] // libc calls, each under a SAFETY comment
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

/// Gives back the memory only start-up needed, once a handler has filled its caches: the free
/// pages of the heap (`malloc_trim`) and the resident pages of its code. Start-up runs code
/// nothing runs again (argument parsing, kubeconfig and TLS set-up, the first lists), and the
/// kernel maps code 64 KiB around every page touched, so most of the binary's `.text` is
/// resident by then. Unmapping the code pages drops them from the process only: they stay in
/// the page cache, and the pages still in use come back on their next call as minor faults.
/// Only code mappings without a private copy of any page are unmapped, so what comes back is
/// what was there (a library whose code the loader relocated would lose its relocations).
#[allow(unsafe_code)] // libc calls, each under a SAFETY comment
pub fn release_startup_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` only returns free heap pages to the kernel.
    unsafe {
        libc::malloc_trim(0);
    }
    #[cfg(target_os = "linux")]
    {
        let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else {
            return;
        };
        for (start, end) in unchanged_code(&smaps) {
            // SAFETY: the range is a whole read-only, executable private mapping of a file
            // with no page of it written, so dropping its pages loses nothing: the next access
            // reads the same bytes back from the file.
            unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED);
            }
        }
    }
}

/// The address ranges in `smaps` (the text of `/proc/self/smaps`) that map a file's code
/// (`r-xp`, not the kernel's own `[vdso]`) without any private, written page
/// (`Anonymous: 0 kB`).
fn unchanged_code(smaps: &str) -> Vec<(usize, usize)> {
    let mut found = Vec::new();
    let mut current = None;
    for line in smaps.lines() {
        if let Some(anonymous) = line.strip_prefix("Anonymous:") {
            if let Some(range) = current.take()
                && anonymous.trim() == "0 kB"
            {
                found.push(range);
            }
        } else if let Some(range) = header(line) {
            current = range;
        }
    }
    found
}

/// For a mapping's header line: `Some(Some(range))` when it maps a file's code, `Some(None)`
/// for any other mapping; `None` for the lines of fields that follow a header.
fn header(line: &str) -> Option<Option<(usize, usize)>> {
    let mut fields = line.split_whitespace();
    let (start, end) = fields.next()?.split_once('-')?;
    let start = usize::from_str_radix(start, 16).ok()?;
    let end = usize::from_str_radix(end, 16).ok()?;
    let perms = fields.next()?;
    let file = fields.nth(3).is_some_and(|path| path.starts_with('/'));
    Some((perms == "r-xp" && file && start < end).then_some((start, end)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_unwritten_code_mappings_of_files_are_released() {
        let smaps = "\
55d0c0a00000-55d0c1200000 r-xp 00600000 fd:01 1234 /usr/bin/resource-handler
Rss:                7000 kB
Anonymous:             0 kB
55d0c1200000-55d0c1300000 r--p 00e00000 fd:01 1234 /usr/bin/resource-handler
Anonymous:             0 kB
7f0000100000-7f0000200000 r-xp 00010000 fd:01 99 /usr/lib/librelocated.so
Anonymous:             4 kB
7f0000000000-7f0000001000 r-xp 00000000 00:00 0
Anonymous:             0 kB
7ffd1b5f0000-7ffd1b5f2000 r-xp 00000000 00:00 0                          [vdso]
Anonymous:             0 kB
";
        assert_eq!(
            unchanged_code(smaps),
            [(0x55d0_c0a0_0000, 0x55d0_c120_0000)]
        );
    }

    #[test]
    fn this_process_keeps_running_after_releasing_its_code() {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        assert!(!unchanged_code(&smaps).is_empty(), "the test binary's code");
        release_startup_memory();
        assert_eq!(header("not a mapping"), None);
    }
}
