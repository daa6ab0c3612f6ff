//! An event recorder that sends what kube's `Recorder` sends but remembers less of it.
//!
//! kube's `Recorder` keeps every Event it published for six minutes, to patch a repeat (the
//! same type, action, reason, object and related object) into a series instead of creating
//! another Event; it keeps each whole, with a key of clones of the object references, a few
//! KiB each (0.7 MB of the data-handler's heap at 100 clusters). [`Recorder`] keeps what the
//! series needs: a 64-bit digest of the key, the Event's name, the count and the time of the
//! last occurrence.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Reporter};
use kube::{Api, Client};

/// How long a published Event is remembered for a repeat to join its series (kube's figure).
const CACHE_TTL: SignedDuration = SignedDuration::from_mins(6);

/// What is remembered of a published Event.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Published {
    /// The Event's name, which a repeat patches.
    name: String,
    /// Occurrences so far: 1 until the first repeat.
    count: i32,
    /// The last occurrence.
    last: Timestamp,
}

/// Publishes Events about objects as kube's `Recorder` does (see the module's documentation).
/// Cloning it shares what it remembers.
#[derive(Clone)]
pub struct Recorder {
    client: Client,
    reporter: Arc<Reporter>,
    published: Arc<Mutex<HashMap<u64, Published>>>,
}

impl Recorder {
    /// A recorder reporting as `reporter`.
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Self {
            client,
            reporter: Arc::new(reporter),
            published: Arc::default(),
        }
    }

    /// The recorder of a handler's replica: reporting as `controller` (the handler's field
    /// manager), the instance named by the pod (`POD_NAME`) so an Event says which replica
    /// published it.
    pub fn for_pod(client: Client, controller: String) -> Self {
        Self::new(
            client,
            Reporter {
                controller,
                instance: std::env::var("POD_NAME").ok(),
            },
        )
    }

    /// Publishes `ev` about `reference`: a new Event, or a patch of the series of the same
    /// event published less than [`CACHE_TTL`] ago. Events of a cluster-scoped object go to the
    /// `default` namespace.
    pub async fn publish(
        &self,
        ev: &Event,
        reference: &ObjectReference,
    ) -> Result<(), kube::Error> {
        let now = Timestamp::now();
        let key = key(ev, reference);
        let repeat = {
            let mut published = self
                .published
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            published.retain(|_, p| p.last + CACHE_TTL > now);
            published.get(&key).cloned()
        };
        let namespace = reference.namespace.as_deref().unwrap_or("default");
        let events = Api::<K8sEvent>::namespaced(self.client.clone(), namespace);
        let remembered = match repeat {
            Some(previous) => {
                let seen = repeated(previous, now);
                events
                    .patch(
                        &seen.name,
                        &PatchParams::default(),
                        &Patch::Merge(&series_patch(&seen)),
                    )
                    .await?;
                seen
            }
            None => {
                let event = new_event(&self.reporter, ev, reference, now);
                events.create(&PostParams::default(), &event).await?;
                Published {
                    name: event.metadata.name.unwrap_or_default(),
                    count: 1,
                    last: now,
                }
            }
        };
        self.published
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key, remembered);
        Ok(())
    }

    /// Publishes `ev` about `reference` (see [`Recorder::publish`]), counted under `controller`
    /// in `multigres_operator_api_writes_total`; a failure is logged, never fatal: a lost Event
    /// must not fail the reconcile that had news.
    pub async fn publish_counted(
        &self,
        controller: &'static str,
        ev: &Event,
        reference: &ObjectReference,
    ) {
        crate::metrics::record_api_write(controller, "Event", "event");
        if let Err(error) = self.publish(ev, reference).await {
            tracing::warn!(
                reason = %ev.reason,
                object = ?reference.name,
                error = %crate::telemetry::ErrorChain(&error),
                "cannot publish an event"
            );
        }
    }
}

/// A digest of what makes two events one series: type, action, reason, the object and the
/// related object (the reporter is the recorder's own).
fn key(ev: &Event, regarding: &ObjectReference) -> u64 {
    let mut hasher = DefaultHasher::new();
    matches!(ev.type_, EventType::Warning).hash(&mut hasher);
    ev.action.hash(&mut hasher);
    ev.reason.hash(&mut hasher);
    hash_reference(regarding, &mut hasher);
    ev.secondary.is_some().hash(&mut hasher);
    if let Some(related) = &ev.secondary {
        hash_reference(related, &mut hasher);
    }
    hasher.finish()
}

fn hash_reference(reference: &ObjectReference, hasher: &mut DefaultHasher) {
    let ObjectReference {
        api_version,
        field_path,
        kind,
        name,
        namespace,
        resource_version,
        uid,
    } = reference;
    for field in [
        api_version,
        field_path,
        kind,
        name,
        namespace,
        resource_version,
        uid,
    ] {
        field.hash(hasher);
    }
}

/// The series after one more occurrence of `previous` at `now`.
fn repeated(previous: Published, now: Timestamp) -> Published {
    Published {
        count: previous.count + 1,
        last: now,
        ..previous
    }
}

/// The merge patch that records `seen`'s series on its Event (the rest of the Event is as
/// created).
fn series_patch(seen: &Published) -> K8sEvent {
    K8sEvent {
        series: Some(EventSeries {
            count: seen.count,
            last_observed_time: MicroTime(seen.last),
        }),
        ..K8sEvent::default()
    }
}

/// The longest note the API server accepts in an Event (1 kB): a longer one is refused, and
/// the Event lost with it.
pub const MAX_NOTE: usize = 1000;

/// `note` cut to [`MAX_NOTE`] bytes at a character boundary, ending in `...` when cut.
pub fn fitted_note(note: &str) -> String {
    if note.len() <= MAX_NOTE {
        return note.to_owned();
    }
    let mut end = MAX_NOTE - 3;
    while !note.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &note[..end])
}

/// An event to publish about the reconciled object, as the handlers compute it: one type for
/// every handler, so that every Event's note is fitted to what the API server accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    /// Normal or Warning.
    pub type_: EventType,
    /// CamelCase reason.
    pub reason: String,
    /// What happened, for a person.
    pub message: String,
}

impl Notice {
    /// A Normal event.
    pub fn normal(reason: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            type_: EventType::Normal,
            reason: reason.into(),
            message: message.into(),
        }
    }

    /// A Warning event.
    pub fn warning(reason: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            type_: EventType::Warning,
            reason: reason.into(),
            message: message.into(),
        }
    }

    /// The event, with `action` saying what the controller was doing; its note fitted (see
    /// [`fitted_note`]) so that a long message never gets the Event refused.
    pub fn event(&self, action: &str) -> Event {
        Event {
            type_: self.type_,
            reason: self.reason.clone(),
            note: Some(fitted_note(&self.message)),
            action: action.to_owned(),
            secondary: None,
        }
    }
}

/// The Event kube's `Recorder` creates for the first occurrence of `ev` about `reference`, its
/// note fitted (see [`fitted_note`]).
fn new_event(
    reporter: &Reporter,
    ev: &Event,
    reference: &ObjectReference,
    now: Timestamp,
) -> K8sEvent {
    K8sEvent {
        action: Some(ev.action.clone()),
        reason: Some(ev.reason.clone()),
        event_time: Some(MicroTime(now)),
        regarding: Some(reference.clone()),
        note: ev.note.as_deref().map(fitted_note),
        metadata: ObjectMeta {
            namespace: reference.namespace.clone(),
            name: Some(format!(
                "{}.{:x}",
                reference.name.as_ref().unwrap_or(&reporter.controller),
                now.as_nanosecond()
            )),
            ..ObjectMeta::default()
        },
        reporting_controller: Some(reporter.controller.clone()),
        reporting_instance: Some(
            reporter
                .instance
                .clone()
                .unwrap_or_else(|| reporter.controller.clone()),
        ),
        type_: Some(
            match ev.type_ {
                EventType::Normal => "Normal",
                EventType::Warning => "Warning",
            }
            .to_owned(),
        ),
        related: ev.secondary.clone(),
        ..K8sEvent::default()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn event(reason: &str, note: &str) -> Event {
        Event {
            type_: EventType::Normal,
            reason: reason.to_owned(),
            note: Some(note.to_owned()),
            action: "Reconcile".to_owned(),
            secondary: None,
        }
    }

    fn pod(name: &str) -> ObjectReference {
        ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(name.into()),
            namespace: Some("ns".into()),
            uid: Some(format!("uid-{name}")),
            ..ObjectReference::default()
        }
    }

    #[test]
    fn one_series_per_type_action_reason_object_and_related_object() {
        let base = key(&event("Restarted", "a"), &pod("p-0"));
        assert_eq!(
            base,
            key(&event("Restarted", "another note"), &pod("p-0")),
            "the note is no part of the key (as in kube)"
        );
        assert_ne!(base, key(&event("Scaled", "a"), &pod("p-0")));
        assert_ne!(base, key(&event("Restarted", "a"), &pod("p-1")));
        let mut warning = event("Restarted", "a");
        warning.type_ = EventType::Warning;
        assert_ne!(base, key(&warning, &pod("p-0")));
        let mut action = event("Restarted", "a");
        action.action = "Delete".into();
        assert_ne!(base, key(&action, &pod("p-0")));
        let mut related = event("Restarted", "a");
        related.secondary = Some(pod("p-1"));
        assert_ne!(base, key(&related, &pod("p-0")));
        let mut other_related = event("Restarted", "a");
        other_related.secondary = Some(pod("p-2"));
        assert_ne!(key(&related, &pod("p-0")), key(&other_related, &pod("p-0")));
        let mut newer = pod("p-0");
        newer.resource_version = Some("8".into());
        assert_ne!(base, key(&event("Restarted", "a"), &newer));
    }

    #[test]
    fn a_long_note_is_cut_to_what_the_api_server_accepts() {
        let reporter = Reporter {
            controller: "multigres-operator/resource-handler".into(),
            instance: None,
        };
        let now: Timestamp = "2026-01-02T03:04:05Z".parse().unwrap();
        let long = format!("{}é{}", "a".repeat(995), "b".repeat(100));
        let created = new_event(&reporter, &event("Warned", &long), &pod("p-0"), now);
        let note = created.note.unwrap();
        assert!(note.len() <= MAX_NOTE, "{}", note.len());
        assert!(note.ends_with("..."));
        assert!(note.starts_with(&"a".repeat(995)));
        assert_eq!(fitted_note("short"), "short");
    }

    #[test]
    fn a_notice_fits_its_note_and_warns_only_on_a_first_transient_failure() {
        let long = "x".repeat(3 * MAX_NOTE);
        let ev = Notice::warning("ApplyFailed", long).event("Reconcile");
        let note = ev.note.unwrap();
        assert_eq!(note.len(), MAX_NOTE);
        assert!(note.ends_with("..."));
        assert_eq!(
            (ev.reason.as_str(), ev.action.as_str()),
            ("ApplyFailed", "Reconcile")
        );
        assert_eq!(
            Notice::normal("Recovered", "fine")
                .event("Check")
                .note
                .as_deref(),
            Some("fine")
        );
    }

    #[test]
    fn the_first_event_is_what_kubes_recorder_creates() {
        let reporter = Reporter {
            controller: "multigres-operator/resource-handler".into(),
            instance: None,
        };
        let now: Timestamp = "2026-01-02T03:04:05Z".parse().unwrap();
        let mut ev = event("Restarted", "pod p-0 restarted");
        ev.secondary = Some(pod("p-1"));
        let created = serde_json::to_value(new_event(&reporter, &ev, &pod("p-0"), now)).unwrap();
        let name = format!("p-0.{:x}", now.as_nanosecond());
        assert_eq!(
            created,
            json!({
                "apiVersion": "events.k8s.io/v1",
                "kind": "Event",
                "metadata": {"name": name, "namespace": "ns"},
                "action": "Reconcile",
                "reason": "Restarted",
                "note": "pod p-0 restarted",
                "eventTime": "2026-01-02T03:04:05.000000Z",
                "regarding": serde_json::to_value(pod("p-0")).unwrap(),
                "related": serde_json::to_value(pod("p-1")).unwrap(),
                "reportingController": "multigres-operator/resource-handler",
                "reportingInstance": "multigres-operator/resource-handler",
                "type": "Normal",
            })
        );
    }

    #[test]
    fn a_repeat_patches_only_the_series_counting_from_two() {
        let first: Timestamp = "2026-01-02T03:04:05Z".parse().unwrap();
        let published = Published {
            name: "p-0.1".into(),
            count: 1,
            last: first,
        };
        let later = first + SignedDuration::from_secs(30);
        let seen = repeated(published, later);
        assert_eq!(
            (seen.name.as_str(), seen.count, seen.last),
            ("p-0.1", 2, later)
        );
        assert_eq!(
            serde_json::to_value(series_patch(&seen)).unwrap(),
            json!({
                "apiVersion": "events.k8s.io/v1",
                "kind": "Event",
                "metadata": {},
                "series": {"count": 2, "lastObservedTime": "2026-01-02T03:04:35.000000Z"},
            })
        );
        assert_eq!(repeated(seen, later).count, 3);
    }
}
