//! The serving step of the Shard controller: whether the primary's PostgreSQL accepts client
//! connections, published as the condition `PrimaryServing`.
//!
//! Nothing else shows it. A primary whose PostgreSQL refuses clients (every connection slot
//! taken: `FATAL: sorry, too many clients already`) stays Ready, keeps its role, and Multigres
//! itself reports it as up (lines of Multigres 6bd80b9b, the commit
//! `proto/proto/multigres/UPSTREAM` names):
//! - `Status.postgres_ready` (`proto/multipoolermanagerdata.proto:231-234`) is pg_isready's
//!   verdict: the multipooler asks pgctld (`go/services/multipooler/internal/manager/
//!   rpc_initialization.go:140-154`), which runs `pg_isready` (`go/cmd/pgctld/command/
//!   status.go:246-258`). pg_isready (libpq's `PQping`) counts every answer but SQLSTATE `57P03`
//!   (cannot_connect_now) as accepting, `53300` (too_many_connections) included: on PostgreSQL
//!   17 with every slot taken, it printed `accepting connections` and exited 0 while each new
//!   connection, the superuser's too, got `FATAL: sorry, too many clients already`.
//! - `Status.postgres_status` comes from `SELECT pg_is_in_recovery()` through the multipooler's
//!   own regular pool (`.../manager/pg_replication.go:68-74`, `.../executor/
//!   internal_query.go:146-147`) and turns `UNKNOWN` (`rpc_initialization.go:165-167`) only
//!   while that pool holds no idle connection: the cohort then shows the primary as not
//!   streaming, with no error and no cause.
//! - The gateway hands the error to its client only; its status page lists each pooler's
//!   leadership and lifecycle (`go/services/multigateway/status.go:109-116`).
//!
//! So the data-handler asks the primary the way a gateway does: one statement through the
//! primary's multipooler (`MultipoolerService.ExecuteQuery`, as the superuser the multipooler is
//! configured with, like [`crate::postgres_roles`]), which takes a connection of the
//! multipooler's pool for that role (`go/services/multipooler/internal/executor/
//! executor.go:206-209`). PostgreSQL's refusal comes back in the gRPC status details
//! (`mtrpc.RPCError.pg_diagnostic`, `go/common/mterrors/grpc.go:53-74`). The statement also
//! counts the connection slots in use: the superuser may still get in, through a pooled
//! connection or the slots reserved for it, while every other role is refused. The
//! multipooler's own pools stay below that limit (`multigres_api::postgres::connections`), so
//! reaching it means connections outside them hold the slots.
//!
//! Safe on every pass: no credential leaves the multipooler (the operator never reads the
//! superuser password, and runs no command), the statement only reads `pg_stat_activity` and
//! settings, and the call, connection included, is bounded by [`TIMEOUT`].
//!
//! Reading the probe is pure ([`assess`], [`next`]); [`probe`] asks; the Shard controller
//! writes the condition with its other status fields, and its transitions as events.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use multigres_api::v1alpha1::ShardStatus;
use multigres_common::conditions::{Computed, FALSE};
use multigres_common::telemetry::ErrorChain;
use multigres_proto::multipooler::mtrpc::RpcError as MultigresError;
use multigres_proto::multipooler::multipoolerservice::multipooler_service_client::MultipoolerServiceClient;
use prost::Message as _;

use crate::dial::Dial;
use crate::postgres_roles::Session;
use crate::reload::{self, RpcError};
use crate::roles::{self, PoolPod, ShardKey};
use crate::topo::PoolerRecord;

pub use multigres_api::v1alpha1::PRIMARY_SERVING;
/// Reason: the probe got a connection and the slots ordinary roles may take are not all used.
const ACCEPTS: &str = "PrimaryAcceptsConnections";
/// Reason: PostgreSQL answered `too many clients`, or every slot ordinary roles may take is in
/// use.
const SLOTS_EXHAUSTED: &str = "ConnectionSlotsExhausted";
/// Reason: PostgreSQL refused the connection for another reason (shutting down, starting up,
/// authentication, out of memory).
const REFUSING: &str = "PrimaryRefusingConnections";
/// Reason (`Unknown`): no pool pod serves as the primary.
const NO_PRIMARY: &str = "NoPrimary";
/// Reason (`Unknown`): the primary's multipooler did not answer.
const UNREACHABLE: &str = "PrimaryUnreachable";
/// Reason (`Unknown`): the multipooler answered something that does not say.
const PROBE_FAILED: &str = "ProbeFailed";
/// How soon the shard is read again while its primary refuses connections, so the condition
/// clears soon after it recovers.
pub const POLL: Duration = Duration::from_secs(5);
/// Time allowed for the probe, connection included.
const TIMEOUT: Duration = Duration::from_secs(3);
/// SQLSTATE too_many_connections.
const TOO_MANY_CONNECTIONS: &str = "53300";
/// The runbook the messages point to.
const RUNBOOK: &str = "docs/runbooks/MultigresShardPrimaryRefusingConnections.md";
/// Characters of an error quoted in a message, at most: the multipooler's errors may run to
/// 8 KiB.
const QUOTED: usize = 400;
/// The probe: client connections in use, `max_connections`, and the slots reserved for
/// superusers and for `pg_use_reserved_connections` (PostgreSQL 16 on; absent before), as one
/// line of numbers.
const SLOTS: &str = "SELECT count(*) FILTER (WHERE backend_type = 'client backend') || ' ' || \
                     current_setting('max_connections') || ' ' || \
                     current_setting('superuser_reserved_connections') || ' ' || \
                     coalesce(current_setting('reserved_connections', true), '0') \
                     FROM pg_stat_activity";

/// What the probe of the primary found.
#[derive(Debug, Clone, PartialEq)]
pub enum Probe {
    /// No pool pod serves as the primary.
    NoPrimary,
    /// The primary's multipooler could not be asked, or did not answer in time.
    Unanswered {
        /// The primary pod.
        pod: String,
        /// Why.
        why: String,
    },
    /// The multipooler answered with an error.
    Failed {
        /// The primary pod.
        pod: String,
        /// The error's SQLSTATE (Multigres's own codes start with `MT`), when it carries one.
        code: Option<String>,
        /// The error as the multipooler gave it.
        message: String,
    },
    /// The statement ran.
    Answered {
        /// The primary pod.
        pod: String,
        /// Its answer.
        answer: String,
    },
}

/// Probes the primary among `pods` (roles as `poolers` say) through its multipooler, as
/// `superuser`.
pub async fn probe(
    dial: &Dial,
    key: ShardKey<'_>,
    superuser: &str,
    pods: &[PoolPod],
    poolers: &BTreeMap<String, Option<Vec<PoolerRecord>>>,
) -> Probe {
    let Some((pod, record)) = roles::primary(key, pods, poolers) else {
        return Probe::NoPrimary;
    };
    let pod = pod.name.clone();
    let Some(address) = reload::address(record) else {
        return Probe::Unanswered {
            pod,
            why: "its pooler record names no gRPC address".to_owned(),
        };
    };
    let session = Session {
        key,
        superuser: superuser.to_owned(),
        address,
    };
    match tokio::time::timeout(TIMEOUT, ask(dial, &session)).await {
        Ok(Ok(answer)) => match session.first_value(answer) {
            Ok(answer) => Probe::Answered { pod, answer },
            Err(why) => Probe::Failed {
                pod,
                code: None,
                message: why,
            },
        },
        Ok(Err(error)) => failure(pod, &error),
        Err(_) => Probe::Unanswered {
            pod,
            why: format!("no answer within {} s", TIMEOUT.as_secs()),
        },
    }
}

/// Runs the probe statement on the primary.
async fn ask(
    dial: &Dial,
    session: &Session<'_>,
) -> Result<multigres_proto::multipooler::multipoolerservice::ExecuteQueryResponse, RpcError> {
    let channel = dial.channel(&session.address, TIMEOUT).await?;
    MultipoolerServiceClient::new(channel)
        .execute_query(session.request(SLOTS))
        .await
        .map(tonic::Response::into_inner)
        .map_err(|source| RpcError::Call {
            rpc: "ExecuteQuery",
            address: session.address.clone(),
            source,
        })
}

/// The probe of `pod` that failed with `error`: unanswered, unless the multipooler answered
/// with an error of its own or of PostgreSQL.
fn failure(pod: String, error: &RpcError) -> Probe {
    let RpcError::Call { source, .. } = error else {
        return Probe::Unanswered {
            pod,
            why: ErrorChain(error).to_string(),
        };
    };
    let code = sqlstate(source);
    let transport = matches!(
        source.code(),
        tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
    );
    if code.is_none() && transport {
        return Probe::Unanswered {
            pod,
            why: ErrorChain(error).to_string(),
        };
    }
    Probe::Failed {
        pod,
        code,
        message: source.message().to_owned(),
    }
}

/// `google.rpc.Status`, in which gRPC carries an error's details (header
/// `grpc-status-details-bin`); only the details are read.
#[derive(Clone, PartialEq, prost::Message)]
struct Details {
    #[prost(message, repeated, tag = "3")]
    details: Vec<prost_types::Any>,
}

/// The SQLSTATE of the PostgreSQL (or Multigres) error `status` carries: the multipooler sends
/// it as an `mtrpc.RPCError` detail (`go/common/mterrors/grpc.go:63-73`).
fn sqlstate(status: &tonic::Status) -> Option<String> {
    Details::decode(status.details())
        .ok()?
        .details
        .iter()
        .filter(|any| any.type_url.ends_with("/mtrpc.RPCError"))
        .find_map(|any| {
            MultigresError::decode(any.value.as_slice())
                .ok()?
                .pg_diagnostic
        })
        .map(|diagnostic| diagnostic.code)
        .filter(|code| !code.is_empty())
}

/// The connection slots of the primary, as the probe reads them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Slots {
    /// Client connections (`pg_stat_activity` backends of type `client backend`), the probe's
    /// own included.
    used: u64,
    /// `max_connections`.
    max: u64,
    /// `superuser_reserved_connections`.
    superuser_reserved: u64,
    /// `reserved_connections`.
    reserved: u64,
}

impl Slots {
    /// The probe's answer, four numbers.
    fn parse(answer: &str) -> Option<Self> {
        let numbers: Vec<u64> = answer
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()
            .ok()?;
        match numbers[..] {
            [used, max, superuser_reserved, reserved] => Some(Self {
                used,
                max,
                superuser_reserved,
                reserved,
            }),
            _ => None,
        }
    }

    /// The slots a role with neither SUPERUSER nor `pg_use_reserved_connections` may take:
    /// PostgreSQL refuses such a role once the others are in use.
    fn open(self) -> u64 {
        self.max
            .saturating_sub(self.superuser_reserved + self.reserved)
    }

    fn exhausted(self) -> bool {
        self.used >= self.open()
    }
}

/// What SQLSTATE `code` says about a connection: the `False` reason when PostgreSQL refused it
/// (connection exception, invalid authorization, unknown database, insufficient resources,
/// shutting down or starting up); `None` for an error that came after a connection was made,
/// or Multigres's own (`MT…`, such as a planned failover in progress).
fn refusal(code: &str) -> Option<&'static str> {
    if code == TOO_MANY_CONNECTIONS {
        return Some(SLOTS_EXHAUSTED);
    }
    let refused = ["08", "28", "3D", "53"]
        .iter()
        .any(|class| code.starts_with(class))
        || ["57P01", "57P02", "57P03", "57P04"].contains(&code);
    refused.then_some(REFUSING)
}

/// `text` cut to [`QUOTED`] characters.
fn quote(text: &str) -> String {
    match text.char_indices().nth(QUOTED) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

/// `PrimaryServing` as `probe` shows it.
pub fn assess(probe: &Probe) -> Computed {
    let t = PRIMARY_SERVING;
    match probe {
        Probe::NoPrimary => Computed::unknown(
            t,
            NO_PRIMARY,
            "no pool pod serves as the primary, so none is probed: multiorch elects one (the \
             alert MultigresShardPrimaryLost fires when none is for a minute)",
        ),
        Probe::Unanswered { pod, why } => Computed::unknown(
            t,
            UNREACHABLE,
            format!(
                "the multipooler of primary {pod} did not answer the probe ({}), so whether \
                 its PostgreSQL accepts connections is not known; CohortHealthy says whether it \
                 answers at all",
                quote(why)
            ),
        ),
        Probe::Failed { pod, code, message } => {
            let quoted = match code {
                Some(code) => format!("`{}` (SQLSTATE {code})", quote(message)),
                None => format!("`{}`", quote(message)),
            };
            match code.as_deref().and_then(refusal) {
                Some(SLOTS_EXHAUSTED) => Computed::no(
                    t,
                    SLOTS_EXHAUSTED,
                    format!(
                        "primary {pod} refuses connections: every connection slot is taken \
                         (its multipooler answered {quoted}), and clients through the gateways \
                         get the same error. Find who holds the slots on the primary (SELECT \
                         usename, application_name, client_addr, state, count(*) FROM \
                         pg_stat_activity GROUP BY 1, 2, 3, 4) and end them \
                         (pg_terminate_backend), or raise max_connections; see {RUNBOOK}"
                    ),
                ),
                Some(reason) => Computed::no(
                    t,
                    reason,
                    format!(
                        "primary {pod} refuses connections: its multipooler answered {quoted}, \
                         and clients through the gateways get the same error. Read the \
                         primary's PostgreSQL log (kubectl logs {pod} -c postgres); see \
                         {RUNBOOK}"
                    ),
                ),
                None => Computed::unknown(
                    t,
                    PROBE_FAILED,
                    format!(
                        "the multipooler of primary {pod} answered the probe with {quoted}, \
                         which does not say whether PostgreSQL accepts connections (a planned \
                         failover answers so while it runs); probed again at the next pass"
                    ),
                ),
            }
        }
        Probe::Answered { pod, answer } => match Slots::parse(answer) {
            Some(slots) if slots.exhausted() => Computed::no(
                t,
                SLOTS_EXHAUSTED,
                format!(
                    "primary {pod} refuses connections to every role without SUPERUSER: all {} \
                     connection slots such roles may take are in use (max_connections {}, {} \
                     reserved for superusers, {} for pg_use_reserved_connections), so \
                     multipooler pools that need a new connection fail with `remaining \
                     connection slots are reserved`. Find who holds them on the primary (SELECT \
                     usename, application_name, client_addr, state, count(*) FROM \
                     pg_stat_activity GROUP BY 1, 2, 3, 4) and end them \
                     (pg_terminate_backend), or raise max_connections; see {RUNBOOK}",
                    slots.open(),
                    slots.max,
                    slots.superuser_reserved,
                    slots.reserved
                ),
            ),
            Some(_) => Computed::yes(
                t,
                ACCEPTS,
                format!("primary {pod} accepts connections and has connection slots free"),
            ),
            None => Computed::unknown(
                t,
                PROBE_FAILED,
                format!(
                    "the multipooler of primary {pod} answered the probe with `{}`, not the \
                     connection counts asked for; probed again at the next pass",
                    quote(answer)
                ),
            ),
        },
    }
}

/// The stored `PrimaryServing`, as a list of zero or one condition.
pub fn stored(status: Option<&ShardStatus>) -> Vec<Condition> {
    status
        .into_iter()
        .flat_map(|s| &s.conditions)
        .filter(|c| c.type_ == PRIMARY_SERVING)
        .cloned()
        .collect()
}

/// `stored` with `PrimaryServing` as `probe` shows it; `lastTransitionTime` moves only when its
/// status does, and a probe that finds the same writes nothing. A shard that never had the
/// condition gets none while it has no primary: one still bootstrapping (or on nodes that run
/// no PostgreSQL) costs no write.
pub fn next(
    stored: &[Condition],
    probe: &Probe,
    now: Timestamp,
    generation: Option<i64>,
) -> Vec<Condition> {
    if stored.is_empty() && *probe == Probe::NoPrimary {
        return Vec::new();
    }
    let mut conditions = stored.to_vec();
    assess(probe).set_on(&mut conditions, generation, now);
    conditions
}

/// Whether `conditions` say the primary refuses connections: the shard is read again every
/// [`POLL`] until it accepts them.
pub fn refusing(conditions: &[Condition]) -> bool {
    conditions
        .iter()
        .any(|c| c.type_ == PRIMARY_SERVING && c.status == FALSE)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use multigres_common::conditions::{TRUE, UNKNOWN};
    use multigres_proto::multipooler::query::PgDiagnostic;
    use tonic::codegen::Bytes;

    use super::*;

    const POD: &str = "prod-postgres-default-0-inf-pool-main-zone-a-0";

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(second).unwrap()
    }

    fn answered(answer: &str) -> Probe {
        Probe::Answered {
            pod: POD.to_owned(),
            answer: answer.to_owned(),
        }
    }

    fn failed(code: Option<&str>, message: &str) -> Probe {
        Probe::Failed {
            pod: POD.to_owned(),
            code: code.map(str::to_owned),
            message: message.to_owned(),
        }
    }

    /// A multipooler's error as `mterrors.ToGRPC` sends it: the message, and PostgreSQL's
    /// diagnostic in an `mtrpc.RPCError` detail.
    fn multipooler_error(code: tonic::Code, sqlstate: &str, message: &str) -> tonic::Status {
        let error = MultigresError {
            message: message.to_owned(),
            pg_diagnostic: Some(PgDiagnostic {
                severity: "FATAL".to_owned(),
                code: sqlstate.to_owned(),
                message: "sorry, too many clients already".to_owned(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let details = Details {
            details: vec![prost_types::Any {
                type_url: "type.googleapis.com/mtrpc.RPCError".to_owned(),
                value: error.encode_to_vec(),
            }],
        };
        tonic::Status::with_details(code, message, Bytes::from(details.encode_to_vec()))
    }

    fn call_error(source: tonic::Status) -> RpcError {
        RpcError::Call {
            rpc: "ExecuteQuery",
            address: "http://p-0:15270".to_owned(),
            source,
        }
    }

    fn status_reason(probe: &Probe) -> (&'static str, &'static str) {
        let c = assess(probe);
        (c.status, c.reason)
    }

    #[test]
    fn free_slots_mean_serving() {
        assert_eq!(status_reason(&answered("12 60 3 0")), (TRUE, ACCEPTS));
        assert_eq!(
            assess(&answered("12 60 3 0")).message,
            assess(&answered("40 60 3 0")).message,
            "the count is not in the message, so a busier primary writes nothing new"
        );
    }

    #[test]
    fn the_slots_ordinary_roles_may_take_all_used_mean_exhausted() {
        let full = assess(&answered("57 60 3 0"));
        assert_eq!((full.status, full.reason), (FALSE, SLOTS_EXHAUSTED));
        assert!(
            full.message.contains("all 57 connection slots"),
            "{}",
            full.message
        );
        assert!(full.message.contains(RUNBOOK), "{}", full.message);
        assert_eq!(
            status_reason(&answered("56 60 3 0")),
            (TRUE, ACCEPTS),
            "one slot left"
        );
        assert_eq!(
            status_reason(&answered("55 60 3 2")),
            (FALSE, SLOTS_EXHAUSTED),
            "reserved_connections count too"
        );
        assert_eq!(
            status_reason(&answered("60 60 3 0")),
            (FALSE, SLOTS_EXHAUSTED),
            "superusers in their reserved slots"
        );
    }

    #[test]
    fn a_refusal_quotes_postgresql_and_names_its_sqlstate() {
        let message = "failed to get connection for user postgres: FATAL: sorry, too many \
                       clients already";
        let c = assess(&failed(Some("53300"), message));
        assert_eq!((c.status, c.reason), (FALSE, SLOTS_EXHAUSTED));
        assert!(
            c.message
                .contains("`failed to get connection for user postgres: FATAL: sorry, too many clients already` (SQLSTATE 53300)"),
            "{}",
            c.message
        );
        assert!(c.message.contains(POD), "{}", c.message);
        for code in ["57P03", "08006", "28P01", "3D000", "53200"] {
            assert_eq!(
                status_reason(&failed(Some(code), "refused")),
                (FALSE, REFUSING),
                "{code}"
            );
        }
    }

    #[test]
    fn errors_after_connecting_or_from_multigres_say_nothing() {
        for code in [Some("MTF01"), Some("57014"), Some("42501"), None] {
            assert_eq!(
                status_reason(&failed(code, "planned failover in progress")),
                (UNKNOWN, PROBE_FAILED),
                "{code:?}"
            );
        }
        assert_eq!(status_reason(&answered("")), (UNKNOWN, PROBE_FAILED));
        assert_eq!(status_reason(&answered("1 2 3")), (UNKNOWN, PROBE_FAILED));
        assert_eq!(status_reason(&Probe::NoPrimary), (UNKNOWN, NO_PRIMARY));
        let silent = Probe::Unanswered {
            pod: POD.to_owned(),
            why: "connection refused".to_owned(),
        };
        assert_eq!(status_reason(&silent), (UNKNOWN, UNREACHABLE));
    }

    #[test]
    fn long_errors_are_cut() {
        let c = assess(&failed(Some("57P03"), &"x".repeat(10_000)));
        assert!(c.message.len() < 1_000, "{}", c.message.len());
        assert!(c.message.contains("…"));
    }

    #[test]
    fn the_sqlstate_is_read_from_the_multipoolers_error_details() {
        let error = call_error(multipooler_error(
            tonic::Code::Unknown,
            "53300",
            "failed to get connection for user postgres: FATAL: sorry, too many clients already",
        ));
        assert_eq!(
            failure(POD.to_owned(), &error),
            failed(
                Some("53300"),
                "failed to get connection for user postgres: FATAL: sorry, too many clients already"
            )
        );
        let unavailable = call_error(multipooler_error(
            tonic::Code::Unavailable,
            "57P03",
            "database is temporarily unavailable; please retry",
        ));
        assert!(
            matches!(failure(POD.to_owned(), &unavailable), Probe::Failed { code: Some(c), .. } if c == "57P03"),
            "a refusal the multipooler marks retryable is still a refusal"
        );
    }

    #[test]
    fn transport_errors_are_unanswered() {
        let error = call_error(tonic::Status::unavailable("tcp connect error"));
        assert!(matches!(
            failure(POD.to_owned(), &error),
            Probe::Unanswered { .. }
        ));
        let credentials = RpcError::Credentials {
            address: "http://p-0:15270".to_owned(),
            reason: "no client certificate yet".to_owned(),
        };
        assert!(matches!(
            failure(POD.to_owned(), &credentials),
            Probe::Unanswered { why, .. } if why.contains("no client certificate yet")
        ));
        let plain = call_error(tonic::Status::permission_denied("denied"));
        assert_eq!(failure(POD.to_owned(), &plain), failed(None, "denied"));
    }

    #[test]
    fn the_condition_moves_only_when_the_probe_finds_something_new() {
        let refused = failed(Some("53300"), "FATAL: sorry, too many clients already");
        let first = next(&[], &refused, at(100), Some(2));
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].last_transition_time, Time(at(100)));
        assert!(refusing(&first));
        let again = next(&first, &refused, at(200), Some(2));
        assert_eq!(again, first, "the same refusal writes nothing");
        let recovered = next(&again, &answered("10 60 3 0"), at(300), Some(2));
        assert_eq!(recovered[0].status, TRUE);
        assert_eq!(recovered[0].last_transition_time, Time(at(300)));
        assert!(!refusing(&recovered));
    }

    #[test]
    fn no_primary_writes_nothing_until_there_was_a_condition() {
        assert!(next(&[], &Probe::NoPrimary, at(100), Some(1)).is_empty());
        let refused = next(&[], &failed(Some("57P03"), "starting up"), at(100), Some(1));
        let lost = next(&refused, &Probe::NoPrimary, at(200), Some(1));
        assert_eq!(
            (lost[0].status.as_str(), lost[0].reason.as_str()),
            (UNKNOWN, NO_PRIMARY),
            "a refusal is not left standing once the primary is gone"
        );
    }

    #[test]
    fn only_primary_serving_is_taken_from_the_stored_status() {
        let condition = |type_: &str| Condition {
            type_: type_.to_owned(),
            status: TRUE.to_owned(),
            reason: "R".to_owned(),
            message: "m".to_owned(),
            observed_generation: None,
            last_transition_time: Time(at(0)),
        };
        let status = ShardStatus {
            conditions: vec![condition("CohortHealthy"), condition(PRIMARY_SERVING)],
            ..Default::default()
        };
        assert_eq!(stored(Some(&status)), vec![condition(PRIMARY_SERVING)]);
        assert!(stored(None).is_empty());
    }
}
