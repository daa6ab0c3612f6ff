//! What every controller of the three controller handlers shares around kube's `Controller`:
//! how an error is classified, what happens after one (per-object backoff with jitter, or a
//! wait for a change of the spec), and how each outcome is logged.

use std::sync::Arc;

use futures::{Stream, StreamExt};
use kube::Resource;
use kube::runtime::controller::{self, Action};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;

use crate::backoff::ObjectBackoff;
use crate::telemetry::ErrorChain;

/// Whether an error needs a spec change (wait for one) or may pass (retry with backoff).
pub trait Classify: std::error::Error + Send + Sync + 'static {
    /// True when retrying cannot help until the spec changes.
    fn is_invalid_spec(&self) -> bool;
    /// A short, bounded label for metrics, e.g. `invalid_spec` or `kube_api`.
    fn category(&self) -> &'static str;
}

/// A controller context that keeps each object's failure streak.
pub trait WithBackoff<K: Resource> {
    /// Consecutive failures per object.
    fn backoff(&self) -> &ObjectBackoff<ObjectRef<K>>;
}

/// Invalid specs wait for a change; anything else is retried with per-object backoff.
pub fn error_policy<K, E, C>(obj: Arc<K>, error: &E, ctx: Arc<C>) -> Action
where
    K: Resource<DynamicType = ()>,
    E: Classify,
    C: WithBackoff<K>,
{
    ctx.backoff()
        .after_error(&ObjectRef::from_obj(&*obj), error.is_invalid_spec())
}

/// What one reconcile (or a controller-level failure) of `controller` came to, logged.
pub type Outcome<K, E> = Result<(ObjectRef<K>, Action), controller::Error<E, watcher::Error>>;

/// Logs an outcome: successes and objects gone before their turn at debug level, failures as
/// warnings with their whole cause chain.
pub fn log_outcome<K, E>(controller: &'static str, outcome: Outcome<K, E>)
where
    K: Resource,
    E: std::error::Error + 'static,
{
    match outcome {
        Ok((object, action)) => tracing::debug!(controller, %object, ?action, "reconciled"),
        Err(controller::Error::ReconcilerFailed(error, object)) => {
            tracing::warn!(controller, %object, error = %ErrorChain(&error), "reconcile failed");
        }
        Err(controller::Error::ObjectNotFound(object)) => {
            tracing::debug!(controller, %object, "object gone before its reconcile");
        }
        Err(error) => tracing::warn!(controller, error = %ErrorChain(&error), "controller error"),
    }
}

/// Drives a controller's outcome stream until it ends (on shutdown), logging each outcome.
pub async fn drive<K, E>(controller: &'static str, outcomes: impl Stream<Item = Outcome<K, E>>)
where
    K: Resource,
    E: std::error::Error + 'static,
{
    outcomes
        .for_each(|outcome| {
            log_outcome(controller, outcome);
            std::future::ready(())
        })
        .await;
}
