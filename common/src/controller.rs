//! The controller kit: what every controller of the three controller handlers shares around
//! kube's `Controller`, used the same way by all nine.
//!
//! - [`Ctx`]: a controller's context, the [`Kit`] (name, handler state, per-object backoff,
//!   event recorder) next to the controller's own inputs (stores, writer, settings).
//! - [`reconcile`]: the one wrapper around a reconcile. It holds every reconcile until the
//!   handler may act (caches listed, leading), opens a tracing span, counts the outcome in the
//!   metrics and `HandlerInfo`, ends the object's failure streak on success, and announces a
//!   failure by the one policy of [`Classify::announce`].
//! - [`error_policy`]: invalid specs wait for a change; anything else is retried with
//!   per-object backoff and jitter.
//! - [`Category`]: the closed set of failure kinds, the `error` label of
//!   `multigres_operator_reconcile_errors_total` in every handler.
//! - [`run`]: starts a controller: its concurrency and debounce, the shutdown, the error
//!   policy, and [`drive`], which logs each outcome.

use std::fmt::Debug;
use std::future::Future;
use std::ops::Deref;
use std::sync::Arc;
use std::time::Instant;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Resource;
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use serde::de::DeserializeOwned;
use tracing::Instrument;

use crate::backoff::{BackoffPolicy, ObjectBackoff};
use crate::events::{Notice, Recorder};
use crate::shutdown::Shutdown;
use crate::state::{HandlerState, UNSYNCED_RETRY};
use crate::telemetry::ErrorChain;

/// What kind of failure a reconcile met: what the metrics count it as, whether retrying can
/// help, and the reason of its Warning when it has no reason of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Category {
    /// The stored object does not match the schema this binary knows, or lacks a label the
    /// operator sets.
    Malformed,
    /// The spec, or what it refers to, cannot be realised until a person changes it.
    InvalidSpec,
    /// Something the object needs is not there or not serving yet (its cluster, its topology
    /// server); it comes by itself.
    Waiting,
    /// A name the object needs belongs to an object it does not control.
    Conflict,
    /// A call to the Kubernetes API failed.
    KubeApi,
    /// A call to a topology server or a multipooler failed.
    DataPlane,
}

impl Category {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Category::Malformed => "malformed",
            Category::InvalidSpec => "invalid_spec",
            Category::Waiting => "waiting",
            Category::Conflict => "conflict",
            Category::KubeApi => "kube_api",
            Category::DataPlane => "data_plane",
        }
    }

    /// The reason of an event or condition about a failure of this kind.
    pub fn reason(self) -> &'static str {
        match self {
            Category::Malformed => "InvalidObject",
            Category::InvalidSpec => "InvalidSpec",
            Category::Waiting => "Waiting",
            Category::Conflict => "NameConflict",
            Category::KubeApi => "KubernetesApiError",
            Category::DataPlane => "DataPlaneError",
        }
    }

    /// True when retrying cannot help until the object (or what it refers to) changes.
    pub fn is_invalid_spec(self) -> bool {
        matches!(self, Category::Malformed | Category::InvalidSpec)
    }
}

/// How a controller's error is treated: its [`Category`], its reason, and whether the
/// reconcile wrapper announces it.
pub trait Classify: std::error::Error + Send + Sync + 'static {
    /// What kind of failure this is.
    fn category(&self) -> Category;

    /// True when retrying cannot help until the spec changes.
    fn is_invalid_spec(&self) -> bool {
        self.category().is_invalid_spec()
    }

    /// The reason of the Warning that announces it (CamelCase).
    fn reason(&self) -> &'static str {
        self.category().reason()
    }

    /// Whether the object's own conditions already tell a person about this failure, so the
    /// wrapper publishes no Warning of its own.
    fn on_conditions(&self) -> bool {
        false
    }

    /// Whether the reconcile wrapper publishes a Warning for this failure, `failures` earlier
    /// ones of the same streak: the one policy of every controller.
    ///
    /// - a wait ([`Category::Waiting`]) never: it ends by itself, and a condition shows it;
    /// - nothing the object's conditions already say ([`Classify::on_conditions`]);
    /// - an invalid spec each time: it waits for a change, so each change that is still
    ///   invalid is announced once, whatever transient failures came before it;
    /// - any other failure once it has lasted [`PERSISTENT`] retries: a conflict or a refused
    ///   write that the next try mends is no news.
    fn announce(&self, failures: u32) -> bool {
        if self.category() == Category::Waiting || self.on_conditions() {
            return false;
        }
        self.is_invalid_spec() || failures == PERSISTENT
    }
}

/// The failures of a streak before the one a Warning announces (see [`Classify::announce`]):
/// with the default backoff the third failure in a row, after about 3 s of retries.
pub const PERSISTENT: u32 = 2;

/// What every controller's context carries, whatever the controller.
pub struct Kit<K: Resource> {
    /// Name of the controller in metrics, `HandlerInfo` and write counts.
    pub name: &'static str,
    /// Where reconciles are counted, and whether the handler may act.
    pub state: HandlerState,
    /// Consecutive failures per object.
    pub backoff: ObjectBackoff<ObjectRef<K>>,
    /// The handler's event recorder.
    pub recorder: Recorder,
}

impl<K: Resource<DynamicType = ()>> Kit<K> {
    /// The kit of controller `name`: no object has failed yet.
    pub fn new(name: &'static str, state: &HandlerState, recorder: &Recorder) -> Self {
        Self {
            name,
            state: state.clone(),
            backoff: ObjectBackoff::new(BackoffPolicy::default()),
            recorder: recorder.clone(),
        }
    }

    /// The kit with failures retried after delays of `policy`.
    pub fn with_backoff(mut self, policy: BackoffPolicy) -> Self {
        self.backoff = ObjectBackoff::new(policy);
        self
    }

    /// Publishes an event about `obj`; a failure to publish is logged, never fatal.
    pub async fn event(&self, obj: &K, type_: EventType, reason: &str, note: String) {
        self.event_about(obj, None, type_, reason, note).await;
    }

    /// Publishes an event about `obj` that concerns `related` too (the pod restarted, the
    /// claim grown): events with different related objects are kept apart rather than folded
    /// into one series. The note is fitted to what the API server accepts.
    pub async fn event_about(
        &self,
        obj: &K,
        related: Option<ObjectReference>,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let notice = Notice {
            type_,
            reason: reason.to_owned(),
            message: note,
        };
        let event = Event {
            secondary: related,
            ..notice.event("Reconcile")
        };
        self.publish_event(&event, &obj.object_ref(&())).await;
    }

    /// Publishes `event` about `reference` (the reconciled object or one of its children),
    /// counted under this controller; a failure to publish is logged, never fatal.
    pub async fn publish_event(&self, event: &Event, reference: &ObjectReference) {
        self.recorder
            .publish_counted(self.name, event, reference)
            .await;
    }
}

/// A controller's context: the [`Kit`] every controller has, and the controller's own inputs
/// `T`, which it reaches as if they were the context's fields.
pub struct Ctx<K: Resource, T> {
    /// What every controller has.
    pub kit: Kit<K>,
    inputs: T,
}

impl<K: Resource<DynamicType = ()>, T> Ctx<K, T> {
    /// The context of a controller named by `kit`, reading `inputs`.
    pub fn new(kit: Kit<K>, inputs: T) -> Arc<Self> {
        Arc::new(Self { kit, inputs })
    }
}

impl<K: Resource, T> Deref for Ctx<K, T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.inputs
    }
}

/// Runs `run`, the reconcile of `obj`, as every controller does (see the module's
/// documentation): nothing runs before the handler may act; the outcome is counted and
/// timed; a success ends `obj`'s failure streak; a failure is announced as
/// [`Classify::announce`] says.
pub async fn reconcile<K, E, T>(
    ctx: &Ctx<K, T>,
    obj: &K,
    run: impl Future<Output = Result<Action, E>>,
) -> Result<Action, E>
where
    K: Resource<DynamicType = ()>,
    E: Classify,
{
    let kit = &ctx.kit;
    if !kit.state.may_reconcile() {
        return Ok(Action::requeue(UNSYNCED_RETRY));
    }
    let key = ObjectRef::from_obj(obj);
    let span = tracing::info_span!("reconcile", controller = kit.name, object = %key);
    let started = Instant::now();
    let result = run.instrument(span).await;
    let outcome = result
        .as_ref()
        .map(|_| ())
        .map_err(|e| e.category().as_str());
    kit.state
        .record_reconcile(kit.name, outcome, started.elapsed());
    match &result {
        Ok(_) => kit.backoff.reset(&key),
        Err(error) if error.announce(kit.backoff.failures(&key)) => {
            let note = ErrorChain(error).to_string();
            kit.event(obj, EventType::Warning, error.reason(), note)
                .await;
        }
        Err(_) => {}
    }
    result
}

/// Invalid specs wait for a change; anything else is retried with per-object backoff.
pub fn error_policy<K, E, T>(obj: Arc<K>, error: &E, ctx: Arc<Ctx<K, T>>) -> Action
where
    K: Resource<DynamicType = ()>,
    E: Classify,
{
    ctx.kit
        .backoff
        .after_error(&ObjectRef::from_obj(&*obj), error.is_invalid_spec())
}

/// Runs `controller` with `config` (how many objects at once, how long a burst of changes
/// settles) until `shutdown`, reconciling with `reconcile` over `ctx` and retrying by
/// [`error_policy`]; each outcome is logged ([`drive`]). Every controller is started this way.
pub fn run<K, E, T, R, Fut>(
    controller: Controller<K>,
    config: controller::Config,
    shutdown: &Shutdown,
    reconcile: R,
    ctx: Arc<Ctx<K, T>>,
) -> impl Future<Output = ()> + Send + use<K, E, T, R, Fut>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    E: Classify,
    T: Send + Sync + 'static,
    R: FnMut(Arc<K>, Arc<Ctx<K, T>>) -> Fut + Send + 'static,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
{
    let name = ctx.kit.name;
    let outcomes = controller
        .with_config(config)
        .graceful_shutdown_on(shutdown.wait())
        .run(reconcile, error_policy, ctx);
    drive(name, outcomes)
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;
    use multigres_proto::operator::v1::{ControllerCounts, LeaderState};

    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("{0:?}")]
    struct Failed(Category);

    impl Classify for Failed {
        fn category(&self) -> Category {
            self.0
        }
    }

    fn object() -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some("a".into()),
                namespace: Some("ns".into()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        }
    }

    async fn ctx(state: &HandlerState) -> Arc<Ctx<ConfigMap, ()>> {
        let client = kube::Client::try_from(kube::Config::new(
            "http://127.0.0.1:9".parse().expect("a URL"),
        ))
        .expect("a client");
        let recorder = Recorder::for_pod(client, "test".into());
        Ctx::new(Kit::new("cell", state, &recorder), ())
    }

    #[test]
    fn a_failure_is_announced_once_it_persists_an_invalid_spec_at_once_and_never_a_wait() {
        assert!(!Failed(Category::KubeApi).announce(0));
        assert!(!Failed(Category::KubeApi).announce(1));
        assert!(Failed(Category::KubeApi).announce(PERSISTENT));
        assert!(!Failed(Category::KubeApi).announce(PERSISTENT + 1));
        assert!(Failed(Category::Malformed).announce(0));
        assert!(
            Failed(Category::InvalidSpec).announce(PERSISTENT + 1),
            "after a streak of transient failures too"
        );
        assert!(!Failed(Category::Waiting).announce(0));
        assert!(Failed(Category::InvalidSpec).is_invalid_spec());
        assert!(!Failed(Category::DataPlane).is_invalid_spec());
    }

    #[tokio::test]
    async fn a_standby_reconciles_nothing_even_with_its_caches_synced() {
        let state = HandlerState::new("cluster-handler", "1").await;
        state.set_ready(true).await;
        state.set_leader_state(LeaderState::Standby).await;
        state.set_lease_reachable(true).await;
        let ctx = ctx(&state).await;
        let ran = AtomicBool::new(false);
        let result = reconcile(&ctx, &object(), async {
            ran.store(true, Ordering::Relaxed);
            Ok::<_, Failed>(Action::await_change())
        })
        .await;
        assert_eq!(result.ok(), Some(Action::requeue(UNSYNCED_RETRY)));
        assert!(!ran.load(Ordering::Relaxed));
    }

    #[tokio::test]
    async fn nothing_is_reconciled_or_counted_before_the_caches_are_listed() {
        let state = HandlerState::new("cluster-handler", "1").await;
        let ctx = ctx(&state).await;
        let ran = AtomicBool::new(false);
        let early = reconcile(&ctx, &object(), async {
            ran.store(true, Ordering::Relaxed);
            Ok::<_, Failed>(Action::await_change())
        })
        .await;
        assert_eq!(early.ok(), Some(Action::requeue(UNSYNCED_RETRY)));
        assert!(!ran.load(Ordering::Relaxed));
        assert!(state.info().controllers.is_empty(), "not counted");
    }

    #[tokio::test]
    async fn a_success_ends_the_failure_streak_and_every_run_is_counted() {
        let state = HandlerState::new("data-handler", "1").await;
        state.set_ready(true).await;
        let ctx = ctx(&state).await;
        let obj = object();
        let key = ObjectRef::from_obj(&obj);
        ctx.kit.backoff.next_delay(&key);
        let failed = reconcile(&ctx, &obj, async {
            Err::<Action, _>(Failed(Category::KubeApi))
        })
        .await;
        assert!(failed.is_err());
        assert_eq!(
            ctx.kit.backoff.failures(&key),
            1,
            "a failure keeps the streak"
        );
        let done = reconcile(&ctx, &obj, async {
            Ok::<_, Failed>(Action::await_change())
        })
        .await;
        assert_eq!(done.ok(), Some(Action::await_change()));
        assert_eq!(ctx.kit.backoff.failures(&key), 0, "a success ends it");
        assert_eq!(
            state.info().controllers,
            [ControllerCounts {
                controller: "cell".to_owned(),
                reconciles: 2,
                errors: 1
            }]
        );
    }

    #[test]
    fn every_category_has_a_snake_case_label_and_a_camel_case_reason() {
        use Category::*;
        for category in [
            Malformed,
            InvalidSpec,
            Waiting,
            Conflict,
            KubeApi,
            DataPlane,
        ] {
            let label = category.as_str();
            assert!(label.chars().all(|c| c.is_ascii_lowercase() || c == '_'));
            assert!(
                category
                    .reason()
                    .starts_with(|c: char| c.is_ascii_uppercase())
            );
        }
    }
}
