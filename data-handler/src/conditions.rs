//! The two conditions this handler owns on Cells and MultigresClusters, `TopoServerReachable`
//! and `TopologyRegistered`, and the events their transitions publish. Pure.
//!
//! Other handlers own other condition types on the same objects. Status is written with
//! server-side apply and `conditions` is a list-map keyed by `type`, so sending only these two
//! leaves every other entry alone.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use multigres_common::conditions::{Computed, FALSE, TRUE};
use multigres_common::events::Notice;
use multigres_common::telemetry::ErrorChain;
use serde_json::{Value, json};

use crate::target::{EXTERNAL_FIELD, INTERNAL_FIELD};
use crate::topo::TopoError;

/// Whether the operator can talk to the topology server.
pub const TOPO_SERVER_REACHABLE: &str = "TopoServerReachable";
/// Whether the object's records are in the topology as the spec says.
pub const TOPOLOGY_REGISTERED: &str = "TopologyRegistered";
/// The condition types this handler owns, in the order it writes them.
pub const OWNED: [&str; 2] = [TOPO_SERVER_REACHABLE, TOPOLOGY_REGISTERED];

/// This handler's conditions after applying `computed` over the object's `existing` list:
/// only the owned types, in [`OWNED`] order, each keeping its `lastTransitionTime` unless its
/// status changed. The flag says whether anything differs from `existing`.
pub fn merge(
    existing: &[Condition],
    computed: &[Computed],
    generation: Option<i64>,
    now: Timestamp,
) -> (Vec<Condition>, bool) {
    let mut ours: Vec<Condition> = existing
        .iter()
        .filter(|c| OWNED.contains(&c.type_.as_str()))
        .cloned()
        .collect();
    let mut changed = false;
    for c in computed {
        changed |= c.set_on(&mut ours, generation, now);
    }
    ours.sort_by_key(|c| OWNED.iter().position(|t| *t == c.type_));
    (ours, changed)
}

/// The status apply body carrying only `conditions`.
pub fn status_body(conditions: &[Condition]) -> Value {
    json!({ "conditions": conditions })
}

/// `TopoServerReachable` after talking to the server described by `server` (`None` error:
/// it answered). Errors that come from the records, not the server, count as reachable.
pub fn reachable(server: &str, error: Option<&TopoError>) -> Computed {
    let t = TOPO_SERVER_REACHABLE;
    match error {
        Some(e @ (TopoError::Unavailable { .. } | TopoError::Timeout { .. })) => Computed::no(
            t,
            "Unreachable",
            format!(
                "Cannot reach {server}: {}. Check that etcd is running and reachable from the \
                 data-handler (DNS name, port, network policies); retrying with backoff.",
                ErrorChain(e)
            ),
        ),
        Some(e @ TopoError::Rejected { .. }) => Computed::no(
            t,
            "Rejected",
            format!(
                "{server} refused the request: {}. Check the client certificate in \
                 {EXTERNAL_FIELD}.clientCertSecret (with {INTERNAL_FIELD}, the data-handler's \
                 own, issued by the resource-handler) and the etcd user's permissions on the \
                 root.",
                ErrorChain(e)
            ),
        ),
        Some(e @ TopoError::BadAnswer { .. }) => Computed::no(
            t,
            "NotEtcd",
            format!(
                "{server} answered, but not as etcd does: {e}. Check that the endpoints in \
                 {EXTERNAL_FIELD}.endpoints are etcd's client port, not a proxy or another \
                 service; retrying with backoff."
            ),
        ),
        Some(e @ TopoError::Config(_)) => Computed::no(
            t,
            "TLSConfigInvalid",
            format!(
                "Cannot set up the connection to {server}: {e}. Check the certificates in the \
                 Secrets named by {EXTERNAL_FIELD}.caSecret and clientCertSecret (with \
                 {INTERNAL_FIELD}, the data-handler's client certificate Secret)."
            ),
        ),
        _ => Computed::yes(t, "Reachable", format!("{server} answered.")),
    }
}

/// Events for condition changes from `old` to `new`: a Warning (with the condition's reason)
/// when one of ours becomes `False` or stays `False` for a new reason, and a Normal `Recovered`
/// when one becomes `True` after being `False`. A pass that changes nothing publishes nothing.
pub fn transitions(old: &[Condition], new: &[Condition]) -> Vec<Notice> {
    let mut out = Vec::new();
    for now in new {
        let was = old.iter().find(|c| c.type_ == now.type_);
        match (was.map(|c| c.status.as_str()), now.status.as_str()) {
            (prev, FALSE) if prev != Some(FALSE) || was.is_some_and(|w| w.reason != now.reason) => {
                out.push(Notice::warning(now.reason.clone(), now.message.clone()));
            }
            (Some(FALSE), TRUE) => out.push(Notice::normal(
                "Recovered",
                format!("{} is True again: {}", now.type_, now.message),
            )),
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use kube::runtime::events::EventType;

    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(seconds).unwrap()
    }

    fn condition(type_: &str, status: &str, reason: &str, time: i64) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: "m".into(),
            observed_generation: Some(1),
            last_transition_time: Time(at(time)),
        }
    }

    fn unavailable() -> TopoError {
        TopoError::Unavailable {
            operation: "get".into(),
            source: etcd_client::Error::InvalidArgs("connection refused".into()),
        }
    }

    #[test]
    fn merge_keeps_other_types_out_and_times_stable() {
        let existing = vec![
            condition("Available", TRUE, "Ready", 10),
            condition(TOPOLOGY_REGISTERED, TRUE, "Registered", 20),
        ];
        let computed = [
            Computed::yes(TOPOLOGY_REGISTERED, "Registered", "m"),
            Computed::no(TOPO_SERVER_REACHABLE, "Unreachable", "down"),
        ];
        let (ours, changed) = merge(&existing, &computed, Some(1), at(100));
        assert!(changed, "TopoServerReachable is new");
        assert_eq!(
            ours.iter().map(|c| c.type_.as_str()).collect::<Vec<_>>(),
            OWNED,
            "only our types, in order"
        );
        assert_eq!(
            ours[1].last_transition_time,
            Time(at(20)),
            "unchanged status"
        );
        assert_eq!(ours[0].last_transition_time, Time(at(100)));

        let (again, changed) = merge(&ours, &computed, Some(1), at(200));
        assert!(!changed, "the same computation writes nothing");
        assert_eq!(again, ours);
        assert_eq!(
            status_body(&again)["conditions"].as_array().unwrap().len(),
            2
        );
    }

    #[test]
    fn reachability_follows_the_error_class() {
        let server = "etcd at 127.0.0.1:2379 (root /multigres/global)";
        let down = reachable(server, Some(&unavailable()));
        assert_eq!((down.status, down.reason), (FALSE, "Unreachable"));
        assert!(down.message.contains("127.0.0.1:2379"), "{}", down.message);
        assert!(
            down.message.contains("connection refused"),
            "{}",
            down.message
        );
        let up = reachable(server, None);
        assert_eq!((up.status, up.reason), (TRUE, "Reachable"));
        let foreign = TopoError::OwnedByOther {
            record: "cell a".into(),
            owner: "x/y".into(),
        };
        assert_eq!(reachable(server, Some(&foreign)).status, TRUE);
        let tls = reachable(server, Some(&TopoError::Config("bad pem".into())));
        assert_eq!((tls.status, tls.reason), (FALSE, "TLSConfigInvalid"));
        assert!(tls.message.contains("caSecret"), "{}", tls.message);
    }

    #[test]
    fn transitions_warn_once_and_announce_recovery() {
        let up = vec![condition(TOPO_SERVER_REACHABLE, TRUE, "Reachable", 1)];
        let down = vec![condition(TOPO_SERVER_REACHABLE, FALSE, "Unreachable", 2)];
        let notices = transitions(&up, &down);
        assert_eq!(notices.len(), 1);
        assert_eq!(notices[0].type_, EventType::Warning);
        assert_eq!(notices[0].reason, "Unreachable");
        assert!(
            transitions(&down, &down).is_empty(),
            "still down: no repeat"
        );
        let recovered = transitions(&down, &up);
        assert_eq!(recovered[0].type_, EventType::Normal);
        assert_eq!(recovered[0].reason, "Recovered");
        assert!(transitions(&[], &up).is_empty(), "first True is not news");
        let other_reason = vec![condition(TOPO_SERVER_REACHABLE, FALSE, "Rejected", 3)];
        assert_eq!(transitions(&down, &other_reason).len(), 1);
    }
}
