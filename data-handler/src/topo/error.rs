//! Errors of the topology store, classified so a controller knows whether to retry.

use std::time::Duration;

use super::durability::DurabilityPolicyName;
use super::wire::WireError;

/// Why stored bytes could not be read as the expected record.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error(transparent)]
    Decode(#[from] prost::DecodeError),
    #[error(transparent)]
    Wire(#[from] WireError),
}

/// A topology store failure.
///
/// [`TopoError::is_transient`] tells retryable conditions (etcd unreachable or slow, a lost
/// compare-and-swap race) from ones that need a change elsewhere first (a malformed record, an
/// invalid spec, a cell still in use).
#[derive(Debug, thiserror::Error)]
pub enum TopoError {
    #[error("etcd unavailable during {operation}: {source}")]
    Unavailable {
        operation: String,
        #[source]
        source: etcd_client::Error,
    },
    #[error("etcd {operation} did not complete within {after:?}")]
    Timeout { operation: String, after: Duration },
    #[error("{key} changed concurrently; gave up after {attempts} compare-and-swap attempt(s)")]
    Conflict { key: String, attempts: u32 },
    #[error("etcd rejected {operation}: {source}")]
    Rejected {
        operation: String,
        #[source]
        source: etcd_client::Error,
    },
    #[error("record {key} is malformed: {source}")]
    Malformed {
        key: String,
        #[source]
        source: RecordError,
    },
    #[error("invalid {what}: {reason}")]
    InvalidSpec { what: String, reason: String },
    #[error(
        "unknown durability policy {given:?}; allowed values: {}",
        DurabilityPolicyName::ALLOWED.join(", ")
    )]
    UnknownDurabilityPolicy { given: String },
    #[error("cell {cell:?} is still referenced by database record(s) {databases:?}")]
    CellReferenced {
        cell: String,
        databases: Vec<String>,
    },
    #[error(
        "{record} is registered by MultigresCluster {owner}; clusters sharing a topology root must not share cell or database names"
    )]
    OwnedByOther { record: String, owner: String },
    #[error("cell {cell:?} is not registered in the global topology")]
    CellNotRegistered { cell: String },
    #[error("topology client configuration: {0}")]
    Config(String),
    /// The endpoint answered, but not as etcd does (a fake server, a broken proxy): transient,
    /// as the endpoint may be fixed or the spec pointed elsewhere.
    #[error("{endpoints} answered {operation} not as etcd does: {reason}")]
    BadAnswer {
        operation: String,
        endpoints: String,
        reason: String,
    },
}

impl TopoError {
    /// True when retrying the same call later can succeed without any other change.
    ///
    /// `CellReferenced` and `CellNotRegistered` are not transient: they clear only once the
    /// Database records (or the Cell record) change, which the caller's next reconcile does.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Self::Unavailable { .. }
                | Self::Timeout { .. }
                | Self::Conflict { .. }
                | Self::BadAnswer { .. }
        )
    }

    /// Classifies an etcd client error: transport failures and the gRPC codes etcd uses for
    /// overload, leader changes and timeouts are `Unavailable`; everything else is `Rejected`.
    pub(crate) fn from_etcd(operation: &str, source: etcd_client::Error) -> Self {
        use tonic::Code;
        let transient = match &source {
            etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
            etcd_client::Error::GRpcStatus(status) => matches!(
                status.code(),
                Code::Unavailable
                    | Code::DeadlineExceeded
                    | Code::ResourceExhausted
                    | Code::Aborted
                    | Code::Cancelled
                    | Code::Unknown
            ),
            _ => false,
        };
        let operation = operation.to_string();
        if transient {
            Self::Unavailable { operation, source }
        } else {
            Self::Rejected { operation, source }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_codes_are_classified() {
        let unavailable = etcd_client::Error::GRpcStatus(tonic::Status::unavailable("down"));
        assert!(TopoError::from_etcd("get", unavailable).is_transient());
        let denied = etcd_client::Error::GRpcStatus(tonic::Status::permission_denied("no"));
        let err = TopoError::from_etcd("put", denied);
        assert!(!err.is_transient());
        assert!(err.to_string().contains("put"), "{err}");
        let bad_args = etcd_client::Error::InvalidArgs("x".into());
        assert!(!TopoError::from_etcd("txn", bad_args).is_transient());
    }

    #[test]
    fn retry_classes() {
        let timeout = TopoError::Timeout {
            operation: "get".into(),
            after: Duration::from_secs(1),
        };
        assert!(timeout.is_transient());
        let conflict = TopoError::Conflict {
            key: "k".into(),
            attempts: 3,
        };
        assert!(conflict.is_transient());
        let malformed = TopoError::Malformed {
            key: "k".into(),
            source: RecordError::Wire(WireError::FieldZero),
        };
        assert!(!malformed.is_transient());
        let referenced = TopoError::CellReferenced {
            cell: "z".into(),
            databases: vec!["postgres".into()],
        };
        assert!(!referenced.is_transient());
        assert!(referenced.to_string().contains("postgres"));
        let foreign = TopoError::OwnedByOther {
            record: "database postgres".into(),
            owner: "team-a/prod".into(),
        };
        assert!(!foreign.is_transient());
        assert!(foreign.to_string().contains("team-a/prod"), "{foreign}");
    }
}
