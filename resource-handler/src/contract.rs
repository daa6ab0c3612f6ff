//! The Multigres process contract the workloads follow: binaries, ports, paths and flag
//! helpers (see `multigres-topo-contract.md` §3–4). Ports follow the upstream operator so a
//! cluster moved between the two keeps its Service ports.

use multigres_api::expansion::literal;
use multigres_api::v1alpha1::{GlobalTopoServerRef, LogLevel};

/// Directory of the Multigres binaries in the `multigres` image (no entrypoint there).
pub const MULTIGRES_BIN: &str = "/multigres/bin";
/// pgctld in the `pgctld` image (whose entrypoint only idles, so it must be overridden).
pub const PGCTLD_BIN: &str = "/usr/local/bin/pgctld";
/// etcd in the etcd image.
pub const ETCD_BIN: &str = "/usr/local/bin/etcd";

/// multiadmin HTTP and gRPC ports.
pub const MULTIADMIN_HTTP: i32 = 18000;
/// multiadmin gRPC port (its API, with `--service-map=grpc-multiadmin`).
pub const MULTIADMIN_GRPC: i32 = 18070;
/// multigateway HTTP and gRPC ports, and the PostgreSQL port clients connect to.
pub const MULTIGATEWAY_HTTP: i32 = 15100;
/// multigateway gRPC port.
pub const MULTIGATEWAY_GRPC: i32 = 15170;
/// multipooler HTTP and gRPC ports.
pub const MULTIPOOLER_HTTP: i32 = 15200;
/// multipooler gRPC port (what multigateway and multiorch dial).
pub const MULTIPOOLER_GRPC: i32 = 15270;
/// multiorch HTTP and gRPC ports.
pub const MULTIORCH_HTTP: i32 = 15300;
/// multiorch gRPC port.
pub const MULTIORCH_GRPC: i32 = 15370;
/// pgctld HTTP and gRPC ports.
pub const PGCTLD_HTTP: i32 = 15400;
/// pgctld gRPC port (`--pgctld-addr` of multipooler), on [`LOOPBACK`] only.
pub const PGCTLD_GRPC: i32 = 15470;
/// The address of pod-local listeners no other pod may reach (pgctld's gRPC).
pub const LOOPBACK: &str = "127.0.0.1";
/// PostgreSQL, in the pool pods and on the gateway.
pub const POSTGRES_PORT: i32 = 5432;
/// postgres_exporter's metrics port in pool pods (its default, as upstream's sidecar uses).
pub const POSTGRES_EXPORTER_PORT: i32 = 9187;
/// multigateway's second PostgreSQL listener (`--pg-replica-port`): connections there are
/// routed to replicas, for reads that may lag the primary. Served by the
/// `<cluster>-multigateway-replica` Service, as the upstream operator does.
pub const POSTGRES_REPLICA_PORT: i32 = 5433;
/// pgBackRest TLS server of pgctld (and what multipooler dials by default).
pub const PGBACKREST_PORT: i32 = 8432;
/// etcd client, peer and metrics (health) ports.
pub const ETCD_CLIENT: i32 = 2379;
/// etcd peer port (member traffic through the headless Service).
pub const ETCD_PEER: i32 = 2380;
/// etcd metrics and health port (`/livez`, `/readyz`).
pub const ETCD_METRICS: i32 = 2381;

/// Data volume of a pool pod, shared by pgctld and multipooler (`--pooler-dir`).
pub const POOLER_DIR: &str = "/var/lib/pooler";
/// `PGDATA`, inside the pooler directory so it lives on the data volume.
pub const PGDATA: &str = "/var/lib/pooler/pg_data";
/// Where the superuser password file is mounted.
pub const PASSWORD_DIR: &str = "/etc/postgres-password";
/// The superuser password file (`POSTGRES_PASSWORD_FILE`).
pub const PASSWORD_FILE: &str = "/etc/postgres-password/password";
/// pgBackRest TLS certificates (`ca.crt`, `pgbackrest.crt`, `pgbackrest.key`).
/// PostgreSQL serves the same certificate (see [`multigres_api::postgres::SERVER_CERT_DIR`]).
pub const PGBACKREST_CERT_DIR: &str = multigres_api::postgres::SERVER_CERT_DIR;
/// pgBackRest encryption keys (`keys.json`).
pub const PGBACKREST_CIPHER_DIR: &str = "/secrets/pgbackrest-cipher";
/// etcd data volume mount; the data directory is a subdirectory so etcd can own it (0700).
pub const ETCD_VOLUME_DIR: &str = "/var/lib/etcd";
/// etcd `--data-dir`.
pub const ETCD_DATA_DIR: &str = "/var/lib/etcd/data";

/// The `/live` endpoint: 200 as soon as the HTTP listener is up.
pub const LIVE: &str = "/live";
/// The `/ready` endpoint: 200 once the process's own ready checks pass, 503 before.
pub const READY: &str = "/ready";

/// Path of a Multigres binary in the `multigres` image.
pub fn multigres_bin(name: &str) -> String {
    format!("{MULTIGRES_BIN}/{name}")
}

/// `--flag=value`: dash-style, always with `=`, which booleans require. The kubelet takes
/// `value` literally ([`multigres_api::expansion::literal`]): it may hold a user's text.
pub fn flag(name: &str, value: impl std::fmt::Display) -> String {
    format!("--{name}={}", literal(&value.to_string()))
}

/// `--flag=value` whose `value` references the container's own variables (`$(POD_NAME)`,
/// `$(POD_IP)`), for the kubelet to expand; only the operator's texts, never a user's.
pub fn flag_expanding(name: &str, value: impl std::fmt::Display) -> String {
    format!("--{name}={value}")
}

/// The two flags every topology client takes: where the global topology lives.
pub fn topo_flags(topo: &GlobalTopoServerRef) -> [String; 2] {
    [
        flag("topo-global-server-addresses", &topo.address),
        flag("topo-global-root", &topo.root_path),
    ]
}

/// `--log-level`, `info` when unset.
pub fn log_level_flag(level: Option<LogLevel>) -> String {
    let level = match level.unwrap_or(LogLevel::Info) {
        LogLevel::Debug => "debug",
        LogLevel::Info => "info",
        LogLevel::Warn => "warn",
        LogLevel::Error => "error",
    };
    flag("log-level", level)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_are_dash_style_with_equals() {
        assert_eq!(flag("buffer-enabled", true), "--buffer-enabled=true");
        assert_eq!(log_level_flag(None), "--log-level=info");
        assert_eq!(log_level_flag(Some(LogLevel::Debug)), "--log-level=debug");
        let topo = GlobalTopoServerRef {
            address: "a:2379,b:2379".into(),
            root_path: "/multigres/global".into(),
            implementation: "etcd".into(),
            ..Default::default()
        };
        assert_eq!(
            topo_flags(&topo),
            [
                "--topo-global-server-addresses=a:2379,b:2379",
                "--topo-global-root=/multigres/global"
            ]
        );
        assert_eq!(multigres_bin("multiorch"), "/multigres/bin/multiorch");
    }

    #[test]
    fn user_values_are_literal_and_only_the_operators_references_expand() {
        let topo = GlobalTopoServerRef {
            address: "$(AWS_ACCESS_KEY_ID).attacker.example:2379".into(),
            root_path: "/multigres/$(AWS_SECRET_ACCESS_KEY)".into(),
            implementation: "etcd".into(),
            ..Default::default()
        };
        assert_eq!(
            topo_flags(&topo),
            [
                "--topo-global-server-addresses=$$(AWS_ACCESS_KEY_ID).attacker.example:2379",
                "--topo-global-root=/multigres/$$(AWS_SECRET_ACCESS_KEY)"
            ]
        );
        assert_eq!(flag("x", "a$b"), "--x=a$$b");
        assert_eq!(
            flag_expanding("hostname", "$(POD_IP)"),
            "--hostname=$(POD_IP)"
        );
    }
}
