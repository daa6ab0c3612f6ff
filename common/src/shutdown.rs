//! Graceful shutdown: one signal that servers, the leader elector and controllers all wait on.

use std::sync::Arc;

use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

/// A one-way latch: once triggered, every current and future [`Shutdown::wait`] resolves.
///
/// Cheap to clone; clones share the latch.
#[derive(Debug, Clone)]
pub struct Shutdown {
    tx: Arc<watch::Sender<bool>>,
}

impl Default for Shutdown {
    fn default() -> Self {
        Self::new()
    }
}

impl Shutdown {
    /// A latch that has not been triggered.
    pub fn new() -> Self {
        Self {
            tx: Arc::new(watch::channel(false).0),
        }
    }

    /// Triggers the latch; idempotent.
    pub fn trigger(&self) {
        self.tx.send_replace(true);
    }

    /// Whether the latch has been triggered.
    pub fn is_triggered(&self) -> bool {
        *self.tx.borrow()
    }

    /// Resolves once the latch is triggered. The future owns what it needs, so it can be handed
    /// to servers and `Controller::graceful_shutdown_on`.
    pub fn wait(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.tx.subscribe();
        async move {
            // `wait_for` fails only when every clone of the latch is gone, so it can never
            // fire: resolve then too, so nothing waits forever.
            let _ = rx.wait_for(|triggered| *triggered).await;
        }
    }
}

/// Triggers `shutdown` on the first SIGTERM or SIGINT. The handlers are installed before this
/// returns, so a signal that arrives right after is not lost.
pub fn trigger_on_signal(shutdown: Shutdown) -> std::io::Result<()> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        tracing::info!(signal = name, "shutting down");
        shutdown.trigger();
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn wait_resolves_after_trigger_for_every_clone() {
        let shutdown = Shutdown::new();
        let before = shutdown.wait();
        let clone = shutdown.clone();
        assert!(!clone.is_triggered());
        let pending = tokio::time::timeout(Duration::from_millis(50), shutdown.wait()).await;
        assert!(pending.is_err(), "wait resolved before trigger");

        clone.trigger();
        assert!(shutdown.is_triggered());
        tokio::time::timeout(Duration::from_secs(1), before)
            .await
            .expect("waiter created before trigger");
        tokio::time::timeout(Duration::from_secs(1), shutdown.wait())
            .await
            .expect("waiter created after trigger");
    }
}
