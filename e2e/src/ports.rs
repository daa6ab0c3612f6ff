//! Loopback ports for the processes the tests start.
//!
//! A port the kernel picks (`bind` to port 0) comes from the ephemeral range, the same range
//! it takes the source ports of outgoing connections from. Between a test choosing such a port
//! and the component binding it (an API server starts in about a second), any connection, for
//! example a health check of the etcd started just before, may take it as its source port; the
//! component then fails with `address already in use` (seen in a CI-like run: eight tests of
//! one file lost their control plane). Ports handed out here lie below the ephemeral range and
//! below the NodePort range, where nothing but these components listens.

use std::net::{Ipv4Addr, TcpListener};
use std::sync::atomic::{AtomicU32, Ordering};

/// The ports handed out: below the NodePort range (30000-32767) and the kernel's ephemeral
/// range (32768-60999 by default).
const RANGE: std::ops::Range<u32> = 20_000..30_000;

/// A loopback port that nothing listens on now and that this process has not handed out before
/// (unless it went through the whole range since).
pub fn free_loopback_port() -> std::io::Result<u16> {
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    // Start at a place that differs from run to run, so a port left in TIME_WAIT by a previous
    // process is not the first one tried.
    let _ = NEXT.compare_exchange(
        u32::MAX,
        std::process::id() % (RANGE.end - RANGE.start),
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    let size = RANGE.end - RANGE.start;
    for _ in 0..size {
        let offset = NEXT.fetch_add(1, Ordering::Relaxed) % size;
        let port = u16::try_from(RANGE.start + offset).expect("the range is within u16");
        if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
            return Ok(port);
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::AddrInUse,
        format!("no free loopback port in {RANGE:?}"),
    ))
}
