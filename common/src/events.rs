//! Events: kube's `Recorder` (which folds a repeat into a series), with every note fitted to
//! what the API server accepts and every Event counted as a write of its controller, and
//! [`Notice`], the one event type the handlers compute.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{self, Event, EventType, Reporter};

/// Publishes Events about objects through kube's `Recorder`. Cloning it shares what it
/// remembers of the Events it published (kube keeps each for six minutes, to patch a repeat
/// into a series instead of creating another Event).
#[derive(Clone)]
pub struct Recorder(events::Recorder);

impl Recorder {
    /// The recorder of a handler's replica: reporting as `controller` (the handler's field
    /// manager), the instance named by the pod (`POD_NAME`) so an Event says which replica
    /// published it.
    pub fn for_pod(client: Client, controller: String) -> Self {
        Self(events::Recorder::new(
            client,
            Reporter {
                controller,
                instance: std::env::var("POD_NAME").ok(),
            },
        ))
    }

    /// Publishes `ev` about `reference`, its note fitted (see [`fitted_note`]), counted under
    /// `controller` in `multigres_operator_api_writes_total`; a failure is logged, never fatal:
    /// a lost Event must not fail the reconcile that had news. Events of a cluster-scoped
    /// object go to the `default` namespace.
    pub async fn publish_counted(
        &self,
        controller: &'static str,
        ev: &Event,
        reference: &ObjectReference,
    ) {
        crate::metrics::record_api_write(controller, "Event", "event");
        let fitted = Event {
            type_: ev.type_,
            reason: ev.reason.clone(),
            note: ev.note.as_deref().map(fitted_note),
            action: ev.action.clone(),
            secondary: ev.secondary.clone(),
        };
        if let Err(error) = self.0.publish(&fitted, reference).await {
            tracing::warn!(
                reason = %ev.reason,
                object = ?reference.name,
                error = %crate::telemetry::ErrorChain(&error),
                "cannot publish an event"
            );
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_note_is_cut_to_what_the_api_server_accepts() {
        let long = format!("{}é{}", "a".repeat(995), "b".repeat(100));
        let note = fitted_note(&long);
        assert!(note.len() <= MAX_NOTE, "{}", note.len());
        assert!(note.ends_with("..."));
        assert!(note.starts_with(&"a".repeat(995)));
        assert_eq!(fitted_note("short"), "short");
    }

    #[test]
    fn a_notice_fits_its_note() {
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
}
