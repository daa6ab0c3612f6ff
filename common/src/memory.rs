//! What the handlers do to stay small, in one place: the allocator and code-page calls are
//! here; every other piece is listed below with where it lives, what it saves and how it was
//! measured. The figures are `just bench` runs (`--clusters 10,100 --runs 1`, peak RSS as it
//! prints it), each piece on its own build against the build before it; the runs and their
//! conditions are in docs/dev/perf-history.md under the session named. A piece whose figure
//! no longer pays for what a reader must know to change the code around it should go.
//!
//! | piece | where | what it saves |
//! |---|---|---|
//! | release profile for size: fat LTO, one codegen unit, `opt-level = "z"`, abort on panic | `Cargo.toml`, `[profile.release]` | at start 4-6 MiB per handler (default profile to `s`, session 12); `z` over `s` 0.6-0.8 MiB per handler, the three controllers together 44.8 → 41.5 MiB at 10 clusters, 78.3 → 74.9 at 100 (session 13) |
//! | one malloc arena ([`limit_malloc_arenas`]) | here | together 42.7 → 41.2 MiB at 10 clusters, 76.6 → 74.0 at 100 (session 15) |
//! | packed relative relocations (`-z pack-relative-relocs`) | `common/handler_build.rs`, the handlers' build script | 0.4-0.6 MiB per handler at start; together 41.2 → 39.4 MiB at 10, 74.0 → 72.7 at 100 (session 15) |
//! | one thread per controller handler ([`crate::process::Threads::One`]) | `common::process` | together 39.4 → 37.7 MiB at 10, 72.7 → 70.1 at 100; converging was not slower (session 15) |
//! | start-up memory given back ([`release_startup_memory`]) | here, called by [`crate::shared_watch`] once every cache is listed | at start 1.9-3.4 MiB per controller (cluster-handler 9.0 → 6.1, data-handler 9.5 → 6.1; session 16). Not at load: converging faults the code back in |
//! | one HTTP/2 connection to the API server | [`crate::client::counting_client`] | sockets of the resource-handler while 10 clusters converge: 70 → 6 (session 13). Forced by kube's client, which speaks HTTP/1.1 only (kube-rs pull request 1823, open) |
//! | managed fields and `last-applied-configuration` not cached | [`crate::shared_watch`] | a copy of the whole object on anything applied with client-side `kubectl apply` (session 17; the benchmark applies server-side) |
//! | pools boxed in every spec (`api::v1alpha1::Pools`) | api crate | 0.7 MB per 100 Shards in every handler's cache (heaptrack, session 17) |
//! | slimmed children cached with a digest of what they drop | `resource-handler/src/slim_cache.rs` | the resource-handler's heap in use at 100 clusters 23.5 → 21.7 MB (session 16); its peak at 100, labels nobody reads dropped and pools boxed, 33.7 → 29.8 MiB (session 17); rendered ConfigMaps slimmed too, with kube's event recorder replaced, 30.4 → 27.9 MiB (session 18); NetworkPolicies slimmed too (700 at 100 clusters, 2.6 MB of heap when cached whole, heaptrack), 45.9-46.1 → 43.7 MiB (2026-12-06, perf-history) |
//!
//! Not memory work, and so not here: the status pacer ([`crate::status_pacer`], fewer status
//! writes while objects converge: at 100 clusters cluster statuses 794 → 509, Shard statuses
//! 701 → 293) and the shared watches' fan-out ([`crate::shared_watch`], forced by kube-rs
//! issue 1590).

/// Makes every thread allocate from glibc's one main arena. By default glibc gives threads
/// arenas of their own (up to eight per CPU) so they do not wait on each other's lock, and
/// each arena keeps its own free pages resident: the webhook-server's workers, and in every
/// handler the blocking pool's threads (name lookups, credential refreshes). Allocation is a
/// small share of a handler's work, so one lock costs little. Measured by `bench`
/// (docs/dev/perf-history.md) while the controllers still had two workers: their
/// peaks 1.5 MiB lower together at 10 clusters and 2.6 MiB at 100. `MALLOC_ARENA_MAX` still
/// overrides it.
#[allow(unsafe_code)] // libc calls, each under a SAFETY comment
pub fn limit_malloc_arenas() {
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
