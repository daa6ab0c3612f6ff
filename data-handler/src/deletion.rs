//! When a finalizer stops trying to deregister: pure, so the rule is tested without etcd.
//!
//! Deregistering is retried with backoff while it fails, but nothing may block deletion
//! forever. The finalizer is released (with a Warning event saying what may remain) once the
//! server is known to be gone for good (its managed TopoServer is being deleted or no longer
//! exists: its records go with it) or once deletion has been failing for longer than the
//! configured timeout.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use multigres_api::v1alpha1::TopoServer;

use crate::target::Server;

/// The server holding a cluster's topology, as far as deletion cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerState {
    /// It may still answer: an external server, or a managed one still present.
    Present,
    /// It is going away with its data.
    Gone {
        /// Why, for the event.
        why: String,
    },
}

/// The state of `server` given its TopoServer as cached (`None` when absent).
pub fn server_state(server: &Server, topo_server: Option<&TopoServer>) -> ServerState {
    let Server::Managed { topo_server: name } = server else {
        return ServerState::Present;
    };
    match topo_server {
        None => ServerState::Gone {
            why: format!("its TopoServer {name} no longer exists"),
        },
        Some(t) if t.metadata.deletion_timestamp.is_some() => ServerState::Gone {
            why: format!("its TopoServer {name} is being deleted"),
        },
        Some(_) => ServerState::Present,
    }
}

/// What to do after a failed deregistration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Try again later (with backoff).
    Retry,
    /// Release the finalizer without deregistering, and say why.
    GiveUp {
        /// Why, for the event.
        why: String,
    },
}

/// The verdict after a failure, for an object being deleted since `since` (`None` when the
/// timestamp is missing, which counts as just now), at `now`, with the give-up `timeout`.
pub fn after_failure(
    server: &ServerState,
    since: Option<Timestamp>,
    now: Timestamp,
    timeout: Duration,
) -> Verdict {
    if let ServerState::Gone { why } = server {
        return Verdict::GiveUp { why: why.clone() };
    }
    // A deletionTimestamp is truncated to the second: the deletion began before `since` + 1 s,
    // so only what elapsed since then surely counts (never giving up early).
    let elapsed = since.map_or(0, |s| {
        now.as_millisecond()
            .saturating_sub(s.as_second().saturating_add(1).saturating_mul(1000))
    });
    let elapsed = Duration::from_millis(u64::try_from(elapsed).unwrap_or(0));
    if elapsed >= timeout {
        Verdict::GiveUp {
            why: format!(
                "deregistration kept failing for {} after deletion started (limit {}, set by --topo-unreachable-timeout)",
                human(elapsed),
                human(timeout)
            ),
        }
    } else {
        Verdict::Retry
    }
}

/// `1h2m3s`, `2m0s`, `45s`: a duration to whole seconds, for messages.
pub fn human(duration: Duration) -> String {
    let total = duration.as_secs();
    let (h, m, s) = (total / 3600, total / 60 % 60, total % 60);
    match (h, m) {
        (0, 0) => format!("{s}s"),
        (0, _) => format!("{m}m{s}s"),
        _ => format!("{h}h{m}m{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use multigres_api::v1alpha1::TopoServerSpec;

    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(seconds).unwrap()
    }

    const TIMEOUT: Duration = Duration::from_secs(120);

    #[test]
    fn an_external_server_is_retried_until_the_timeout() {
        let present = ServerState::Present;
        assert_eq!(
            after_failure(&present, Some(at(1000)), at(1120), TIMEOUT),
            Verdict::Retry,
            "a deletion stamped at second 1000 may have begun at 1000.999"
        );
        let Verdict::GiveUp { why } = after_failure(&present, Some(at(1000)), at(1121), TIMEOUT)
        else {
            panic!("past the timeout");
        };
        assert!(why.contains("2m0s"), "{why}");
        assert!(why.contains("--topo-unreachable-timeout"), "{why}");
        assert_eq!(
            after_failure(&present, None, at(5000), TIMEOUT),
            Verdict::Retry,
            "no deletion timestamp counts as just now"
        );
        assert_eq!(
            after_failure(&present, Some(at(2000)), at(1000), TIMEOUT),
            Verdict::Retry,
            "clock skew never gives up early"
        );
    }

    #[test]
    fn a_managed_server_going_away_gives_up_at_once() {
        let managed = Server::Managed {
            topo_server: "prod-global-topo".into(),
        };
        let mut topo = TopoServer::new("prod-global-topo", TopoServerSpec::default());
        assert_eq!(server_state(&managed, Some(&topo)), ServerState::Present);
        topo.metadata.deletion_timestamp = Some(Time(at(10)));
        let gone = server_state(&managed, Some(&topo));
        assert_eq!(
            after_failure(&gone, Some(at(1000)), at(1001), TIMEOUT),
            Verdict::GiveUp {
                why: "its TopoServer prod-global-topo is being deleted".into()
            }
        );
        assert_eq!(
            server_state(&managed, None),
            ServerState::Gone {
                why: "its TopoServer prod-global-topo no longer exists".into()
            }
        );
        assert_eq!(server_state(&Server::External, None), ServerState::Present);
    }

    #[test]
    fn durations_read_like_go() {
        assert_eq!(human(Duration::from_secs(45)), "45s");
        assert_eq!(human(Duration::from_secs(125)), "2m5s");
        assert_eq!(human(Duration::from_secs(3723)), "1h2m3s");
    }
}
