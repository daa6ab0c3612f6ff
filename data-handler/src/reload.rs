//! Reload delivery: applies a change of reload-class PostgreSQL settings in place.
//!
//! The resource-handler renders the shard's postgresql.conf into `<shard>-postgres-config`; a
//! change of only reload-class settings rewrites the file (and the fingerprint at its end, the
//! `multigres.config_reload_marker` line) but restarts nothing. This module tells each pool
//! pod's PostgreSQL to read it, as upstream does: for every pod whose stamped reload fingerprint
//! differs from the file's, whose restart fingerprint is current (a pod due for a restart gets
//! the file anyway) and which is not being deleted, the multipooler registered for the pod is
//! asked to `ReloadConfig` with the expected settings. The multipooler reloads only once the
//! mounted file carries all of them, so a file the kubelet has not synced yet is reported, not
//! reloaded, and the call is repeated after [`RETRY`]. A confirmed reload is stamped on the pod
//! as `multigres.com/postgres-reload-hash`.
//!
//! The planning and the reading of a response are pure ([`Desired`], [`to_reload`],
//! [`verdict`]); [`call`] is the RPC.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::ResourceExt;
use multigres_api::labels::CELL;
use multigres_api::postgres::{
    CONFIG_HASH_ANNOTATION, RELOAD_HASH_ANNOTATION, RELOAD_MARKER, conf, split,
};
use multigres_proto::multipooler::multipoolermanagerdata::{
    ReloadConfigRequest, ReloadConfigResponse,
};

use crate::dial::Dial;
use crate::topo::PoolerRecord;

/// How soon a pending reload is tried again (the kubelet syncs a ConfigMap volume within about
/// a minute; upstream retries every 10 s too).
pub const RETRY: Duration = Duration::from_secs(10);
/// Key of the rendered file in the ConfigMap.
pub const CONFIG_KEY: &str = "postgresql.conf";
/// Name of the multipooler's gRPC port in its record's port map.
pub const GRPC_PORT: &str = "grpc";
/// Time allowed for a `ReloadConfig` (the multipooler waits for `pg_conf_load_time()`).
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Why the rendered ConfigMap cannot say what the pods should run.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DesiredError {
    /// The ConfigMap has no rendered file.
    #[error("ConfigMap {name} has no key {CONFIG_KEY}")]
    NoFile { name: String },
    /// The file cannot be read back.
    #[error("ConfigMap {name}, key {CONFIG_KEY}: {source}")]
    Syntax {
        name: String,
        #[source]
        source: conf::SyntaxError,
    },
    /// The file lacks the fingerprint line, or it does not match the file's settings (edited
    /// by hand).
    #[error(
        "ConfigMap {name}, key {CONFIG_KEY}: {RELOAD_MARKER} is {found:?}, but the file's \
         reload-class settings have fingerprint {computed:?}; the resource-handler rewrites it"
    )]
    Marker {
        name: String,
        found: Option<String>,
        computed: String,
    },
}

/// What the rendered file asks of every pool pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Desired {
    /// Fingerprint of the restart-class settings (the pods' `postgres-config-hash`).
    pub restart_hash: String,
    /// Fingerprint of the reload-class settings, stamped on a pod once it reloaded.
    pub reload_hash: String,
    /// The settings the file must carry before a reload counts: every reload-class setting and
    /// the marker (which also catches a removed setting), name → the value as written.
    pub expected: BTreeMap<String, String>,
}

impl Desired {
    /// Reads the rendered file back from the ConfigMap.
    pub fn from_config_map(config_map: &ConfigMap) -> Result<Self, DesiredError> {
        let name = config_map.name_any();
        let text = config_map
            .data
            .as_ref()
            .and_then(|d| d.get(CONFIG_KEY))
            .ok_or_else(|| DesiredError::NoFile { name: name.clone() })?;
        let mut settings = conf::parse(text).map_err(|source| DesiredError::Syntax {
            name: name.clone(),
            source,
        })?;
        let marker = settings.remove(RELOAD_MARKER);
        let split = split(&settings);
        let marker = match marker {
            Some(m) if m == split.reload_hash => m,
            found => {
                return Err(DesiredError::Marker {
                    name,
                    found,
                    computed: split.reload_hash,
                });
            }
        };
        let mut expected = split.reload;
        expected.insert(RELOAD_MARKER.to_owned(), marker.clone());
        Ok(Self {
            restart_hash: split.restart_hash,
            reload_hash: marker,
            expected,
        })
    }
}

/// A pool pod, as far as reloading goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodState {
    /// Pod name.
    pub name: String,
    /// Its cell label.
    pub cell: Option<String>,
    /// Its `postgres-config-hash` (from the template it was created from).
    pub restart_hash: Option<String>,
    /// Its stamped `postgres-reload-hash`.
    pub reload_hash: Option<String>,
    /// Whether it is being deleted.
    pub deleting: bool,
}

impl PodState {
    /// The reload state of `pod`.
    pub fn of(pod: &Pod) -> Self {
        let annotation = |key: &str| pod.annotations().get(key).cloned();
        Self {
            name: pod.name_any(),
            cell: pod.labels().get(CELL).cloned(),
            restart_hash: annotation(CONFIG_HASH_ANNOTATION),
            reload_hash: annotation(RELOAD_HASH_ANNOTATION),
            deleting: pod.metadata.deletion_timestamp.is_some(),
        }
    }
}

/// The pods to reload: not yet stamped with the current reload fingerprint, running the
/// current restart-class settings (a pod due for a restart starts with the new file anyway),
/// and not being deleted.
pub fn to_reload<'p>(desired: &Desired, pods: &'p [PodState]) -> Vec<&'p PodState> {
    pods.iter()
        .filter(|p| !p.deleting)
        .filter(|p| p.reload_hash.as_deref() != Some(desired.reload_hash.as_str()))
        .filter(|p| p.restart_hash.as_deref() == Some(desired.restart_hash.as_str()))
        .collect()
}

/// What a `ReloadConfig` answer means for the pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// PostgreSQL reloaded a file carrying every expected setting: stamp the pod.
    Reloaded,
    /// Not reloaded: the named settings are in the file but PostgreSQL applies them only at
    /// start. A reload never satisfies them; reported, not stamped.
    NeedsRestart(Vec<String>),
    /// Not reloaded: PostgreSQL rejects the file's entry for these settings (name, its
    /// `pg_file_settings.error`). A retry alone does not fix them; reported, not stamped.
    Rejected(Vec<(String, String)>),
    /// No reload yet (the mounted file lags behind, or PostgreSQL is not running): the named
    /// settings do not match yet; try again later.
    NotYet(Vec<String>),
}

/// Reads a `ReloadConfig` answer as upstream's multipooler means it: it compares the file
/// with the expected settings before reloading and reloads only when every one is there and
/// reload-applicable, so a set `config_load_time` (the load time once it advanced past the
/// reload) is the success signal and comes without mismatches. Otherwise nothing was reloaded
/// and the mismatches say why: `needs_restart` when some setting is right but postmaster-only,
/// an `error` when PostgreSQL rejects the file's entry, neither when the file is stale or
/// PostgreSQL is not running.
pub fn verdict(response: &ReloadConfigResponse) -> Verdict {
    let mismatches = &response.mismatches;
    if response.config_load_time.is_some() {
        Verdict::Reloaded
    } else if response.needs_restart {
        Verdict::NeedsRestart(
            mismatches
                .iter()
                .filter(|m| m.requires_restart)
                .map(|m| m.name.clone())
                .collect(),
        )
    } else if mismatches.iter().any(|m| !m.error.is_empty()) {
        Verdict::Rejected(
            mismatches
                .iter()
                .filter(|m| !m.error.is_empty())
                .map(|m| (m.name.clone(), m.error.clone()))
                .collect(),
        )
    } else {
        Verdict::NotYet(mismatches.iter().map(|m| m.name.clone()).collect())
    }
}

/// Where a pooler's management service listens: `http://<hostname>:<grpc port>`, or `None`
/// when its record names no gRPC port.
pub fn address(record: &PoolerRecord) -> Option<String> {
    let port = record.pooler.port_map.get(GRPC_PORT)?;
    let host = record.pooler.hostname.as_str();
    (!host.is_empty()).then(|| format!("http://{host}:{port}"))
}

/// Why a call to a multipooler failed (a reload is tried again after [`RETRY`]).
#[derive(Debug, thiserror::Error)]
pub enum RpcError {
    /// The pooler's address is not a URI.
    #[error("multipooler address {address:?} is invalid")]
    Address {
        address: String,
        #[source]
        source: tonic::transport::Error,
    },
    /// No connection.
    #[error("cannot connect to the multipooler at {address}")]
    Connect {
        address: String,
        #[source]
        source: tonic::transport::Error,
    },
    /// Internal TLS is on and the data-handler's client certificate cannot be read.
    #[error("no client certificate to call the multipooler at {address}: {reason}")]
    Credentials { address: String, reason: String },
    /// The call failed.
    #[error("{rpc} at {address} failed")]
    Call {
        rpc: &'static str,
        address: String,
        #[source]
        source: tonic::Status,
    },
}

impl RpcError {
    /// Whether waiting does not help: the address is not a URI, or the multipooler does not
    /// implement the call (an older version). A refused connection, a timeout or any other
    /// answer may pass.
    pub fn is_invalid(&self) -> bool {
        match self {
            RpcError::Address { .. } => true,
            RpcError::Connect { .. } | RpcError::Credentials { .. } => false,
            RpcError::Call { source, .. } => source.code() == tonic::Code::Unimplemented,
        }
    }
}

/// Calls `MultipoolerManager.ReloadConfig` at `address` with `expected`.
pub async fn call(
    dial: &Dial,
    address: &str,
    expected: &BTreeMap<String, String>,
) -> Result<ReloadConfigResponse, RpcError> {
    let request = ReloadConfigRequest {
        expected_settings: expected.clone().into_iter().collect(),
    };
    dial.connect(address, CALL_TIMEOUT)
        .await?
        .reload_config(request)
        .await
        .map(tonic::Response::into_inner)
        .map_err(|source| RpcError::Call {
            rpc: "ReloadConfig",
            address: address.to_owned(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use multigres_api::postgres::standby::StandbySettings;
    use multigres_api::postgres::{Resources, render};
    use multigres_proto::multipooler::multipoolermanagerdata::SettingMismatch;
    use multigres_proto::topo::Multipooler;

    use super::*;

    fn rendered(config: &[(&str, &str)]) -> ConfigMap {
        let config: BTreeMap<String, String> = config
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let r = render(
            "c/postgres/default/0-inf",
            Resources::default(),
            true,
            None,
            &config,
            &StandbySettings::new(),
        )
        .unwrap();
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some("s-postgres-config".into());
        cm.data = Some(BTreeMap::from([(CONFIG_KEY.to_owned(), r.text)]));
        cm
    }

    fn pod(name: &str, restart: &str, reload: Option<&str>) -> PodState {
        PodState {
            name: name.into(),
            cell: Some("zone-a".into()),
            restart_hash: Some(restart.into()),
            reload_hash: reload.map(Into::into),
            deleting: false,
        }
    }

    #[test]
    fn the_file_gives_the_fingerprints_and_the_expected_settings() {
        let config = [("work_mem", "16MB"), ("shared_buffers", "256MB")];
        let desired = Desired::from_config_map(&rendered(&config)).unwrap();
        let r = render(
            "c/postgres/default/0-inf",
            Resources::default(),
            true,
            None,
            &config
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            &StandbySettings::new(),
        )
        .unwrap();
        assert_eq!(desired.restart_hash, r.split.restart_hash);
        assert_eq!(desired.reload_hash, r.split.reload_hash);
        assert_eq!(desired.expected["work_mem"], "16MB");
        assert_eq!(desired.expected[RELOAD_MARKER], r.split.reload_hash);
        assert!(
            !desired.expected.contains_key("shared_buffers"),
            "restart-class settings are not expected of a reload"
        );
    }

    #[test]
    fn an_edited_or_unmarked_file_is_refused() {
        let mut cm = rendered(&[("work_mem", "16MB")]);
        let text = cm.data.as_mut().unwrap().get_mut(CONFIG_KEY).unwrap();
        *text = text.replace("work_mem = '16MB'", "work_mem = '32MB'");
        assert!(matches!(
            Desired::from_config_map(&cm),
            Err(DesiredError::Marker { .. })
        ));
        cm.data = None;
        assert_eq!(
            Desired::from_config_map(&cm),
            Err(DesiredError::NoFile {
                name: "s-postgres-config".into()
            })
        );
    }

    #[test]
    fn only_current_unstamped_live_pods_are_reloaded() {
        let desired = Desired {
            restart_hash: "r1".into(),
            reload_hash: "l2".into(),
            expected: BTreeMap::new(),
        };
        let mut deleting = pod("p-4", "r1", Some("l1"));
        deleting.deleting = true;
        let pods = [
            pod("p-0", "r1", Some("l1")),
            pod("p-1", "r1", Some("l2")),
            pod("p-2", "r0", Some("l1")),
            pod("p-3", "r1", None),
            deleting,
        ];
        let names: Vec<&str> = to_reload(&desired, &pods)
            .iter()
            .map(|p| p.name.as_str())
            .collect();
        assert_eq!(
            names,
            ["p-0", "p-3"],
            "p-1 is stamped already, p-2 awaits its restart, p-4 is going away"
        );
    }

    fn mismatch(name: &str, error: &str, requires_restart: bool) -> SettingMismatch {
        SettingMismatch {
            name: name.into(),
            error: error.into(),
            requires_restart,
        }
    }

    /// The answers upstream's multipooler gives (`rpc_reload_config.go`).
    #[test]
    fn only_a_confirmed_reload_is_stamped() {
        let reloaded = ReloadConfigResponse {
            config_load_time: Some(prost_types::Timestamp {
                seconds: 1,
                nanos: 0,
            }),
            ..Default::default()
        };
        assert_eq!(verdict(&reloaded), Verdict::Reloaded);
        let stale = ReloadConfigResponse {
            mismatches: vec![mismatch("work_mem", "", false)],
            ..Default::default()
        };
        assert_eq!(verdict(&stale), Verdict::NotYet(vec!["work_mem".into()]));
        let could_not_apply = "setting could not be applied";
        let restart = ReloadConfigResponse {
            mismatches: vec![
                mismatch("work_mem", "", false),
                mismatch("wal_level", could_not_apply, true),
            ],
            needs_restart: true,
            ..Default::default()
        };
        assert_eq!(
            verdict(&restart),
            Verdict::NeedsRestart(vec!["wal_level".into()])
        );
        let invalid = "invalid value for parameter \"work_mem\": \"lots\"";
        let rejected = ReloadConfigResponse {
            mismatches: vec![
                mismatch("work_mem", invalid, false),
                mismatch("maintenance_work_mem", "", false),
            ],
            ..Default::default()
        };
        assert_eq!(
            verdict(&rejected),
            Verdict::Rejected(vec![("work_mem".into(), invalid.into())])
        );
        assert_eq!(
            verdict(&ReloadConfigResponse::default()),
            Verdict::NotYet(vec![]),
            "PostgreSQL not running"
        );
    }

    /// Upstream's answer on the wire, a stale `work_mem` and a restart-only `wal_level`, made
    /// with `protoc --encode=multipoolermanagerdata.ReloadConfigResponse` from upstream's
    /// `multipoolermanagerdata.proto`:
    /// `mismatches { name: "work_mem" } mismatches { name: "wal_level" error: "setting could
    /// not be applied" requires_restart: true } needs_restart: true`.
    #[test]
    fn an_upstream_answer_decodes() {
        use prost::Message;
        const ANSWER_HEX: &str = "120a0a08776f726b5f6d656d122b0a0977616c5f6c6576656c121c7365\
                                  7474696e6720636f756c64206e6f74206265206170706c69656418011801";
        let bytes: Vec<u8> = (0..ANSWER_HEX.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&ANSWER_HEX[i..i + 2], 16).unwrap())
            .collect();
        let response = ReloadConfigResponse::decode(bytes.as_slice()).unwrap();
        assert_eq!(
            response,
            ReloadConfigResponse {
                config_load_time: None,
                mismatches: vec![
                    mismatch("work_mem", "", false),
                    mismatch("wal_level", "setting could not be applied", true),
                ],
                needs_restart: true,
            }
        );
        assert_eq!(response.encode_to_vec(), bytes);
    }

    #[test]
    fn only_a_bad_address_or_a_missing_method_is_invalid() {
        let call = |code| RpcError::Call {
            rpc: "GetBackups",
            address: "http://p-0:15270".into(),
            source: tonic::Status::new(code, "x"),
        };
        assert!(call(tonic::Code::Unimplemented).is_invalid());
        for transient in [
            tonic::Code::Unavailable,
            tonic::Code::DeadlineExceeded,
            tonic::Code::FailedPrecondition,
            tonic::Code::Internal,
        ] {
            assert!(!call(transient).is_invalid(), "{transient:?}");
        }
        let address = tonic::transport::Endpoint::from_shared("not a uri".to_owned()).unwrap_err();
        assert!(
            RpcError::Address {
                address: "not a uri".into(),
                source: address,
            }
            .is_invalid()
        );
    }

    #[test]
    fn the_address_is_the_hostname_and_grpc_port() {
        let mut record = PoolerRecord {
            key: "k".into(),
            revision: 0,
            id: "multipooler-zone-a-p-0".into(),
            pooler: Multipooler {
                hostname: "p-0.svc".into(),
                ..Default::default()
            },
        };
        assert_eq!(address(&record), None);
        record.pooler.port_map.insert(GRPC_PORT.into(), 15270);
        assert_eq!(address(&record).as_deref(), Some("http://p-0.svc:15270"));
    }
}
