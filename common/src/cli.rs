//! Command-line flags every handler binary shares.
//!
//! A controller binary's flags are [`ControllerArgs`] with its own flattened in; the
//! webhook-server defines its own `clap::Parser` and flattens [`CommonArgs`] into it. Both
//! parse with [`parse`], so the defaults that differ per binary (ports, Lease name) and its
//! name, version and description come from its [`HandlerSpec`].

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use clap::{ArgAction, Args, Parser, ValueEnum};
use multigres_api::duration::parse_go;

/// What distinguishes one handler binary from another at startup.
///
/// Defaults are distinct per binary so all four can run side by side on one host (tests, demo):
///
/// | binary | gRPC | metrics |
/// |---|---|---|
/// | cluster-handler | 9441 | 8081 |
/// | resource-handler | 9442 | 8082 |
/// | data-handler | 9443 | 8083 |
/// | webhook-server | 9444 | 8084 (admission HTTPS on 8443) |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandlerSpec {
    /// Binary name, also used in the field manager `multigres-operator/<name>`.
    pub name: &'static str,
    /// Version reported by `HandlerInfo` and `--version`.
    pub version: &'static str,
    /// What `--help` says the binary does (its crate's description).
    pub about: &'static str,
    /// Default of `--grpc-bind-address`.
    pub grpc_bind_address: &'static str,
    /// Default of `--metrics-bind-address`.
    pub metrics_bind_address: &'static str,
    /// Default of `--leader-election-id` (the Lease name).
    pub leader_election_id: &'static str,
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum LogFormat {
    /// One JSON object per line, for log collectors.
    #[default]
    Json,
    /// Human-readable lines, for local runs.
    Text,
}

/// A listen address that can be switched off with `0`, as controller-runtime's
/// `--metrics-bind-address` can.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BindAddress {
    /// The server is not started.
    Disabled,
    /// The server listens here.
    Enabled(SocketAddr),
}

impl BindAddress {
    /// The address to listen on, if enabled.
    pub fn addr(self) -> Option<SocketAddr> {
        match self {
            Self::Disabled => None,
            Self::Enabled(addr) => Some(addr),
        }
    }
}

impl FromStr for BindAddress {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "0" {
            return Ok(Self::Disabled);
        }
        parse_listen_addr(s).map(Self::Enabled)
    }
}

/// Parses a listen address in Go style as well as Rust style: `:8080` means every interface,
/// `127.0.0.1:8080` and `[::1]:8080` are taken as they are.
pub fn parse_listen_addr(s: &str) -> Result<SocketAddr, String> {
    if let Some(port) = s.strip_prefix(':') {
        let port: u16 = port
            .parse()
            .map_err(|_| format!("invalid port in listen address {s:?}"))?;
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port));
    }
    s.parse()
        .map_err(|_| format!("invalid listen address {s:?}: expected HOST:PORT or :PORT"))
}

/// Flags shared by all four binaries.
#[derive(Debug, Clone, Args)]
pub struct CommonArgs {
    /// Address of the gRPC server (grpc.health.v1 and HandlerInfo), as HOST:PORT or :PORT.
    #[arg(long, value_parser = parse_listen_addr)]
    pub grpc_bind_address: SocketAddr,

    /// Address of the Prometheus /metrics endpoint, as HOST:PORT or :PORT; `0` disables it.
    #[arg(long)]
    pub metrics_bind_address: BindAddress,

    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Json)]
    pub log_format: LogFormat,

    /// Log filter (for example `info` or `info,kube=debug`); RUST_LOG is used when not given.
    #[arg(long)]
    pub log_level: Option<String>,

    /// Path of a kubeconfig file; without it, KUBECONFIG, ~/.kube/config, then the in-cluster
    /// service account are tried in that order.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
}

/// Flags of the active/standby controllers (not the webhook, whose replicas are all active).
#[derive(Debug, Clone, Args)]
pub struct LeaderElectionArgs {
    /// Campaign for a coordination.k8s.io Lease and act only while holding it.
    #[arg(
        long,
        action = ArgAction::Set,
        num_args = 0..=1,
        default_value_t = false,
        default_missing_value = "true"
    )]
    pub leader_elect: bool,

    /// Namespace of the Lease; defaults to POD_NAMESPACE, then the client's namespace (the
    /// in-cluster namespace file or the kubeconfig context).
    #[arg(long, env = "POD_NAMESPACE")]
    pub leader_election_namespace: Option<String>,

    /// Name of the Lease.
    #[arg(long)]
    pub leader_election_id: String,

    /// How long a Lease stays valid after its last renewal before standbys may take it over.
    #[arg(long, value_parser = parse_go, default_value = "15s")]
    pub leader_election_lease_duration: Duration,

    /// How long the leader keeps trying to renew before it gives up leadership.
    #[arg(long, value_parser = parse_go, default_value = "10s")]
    pub leader_election_renew_deadline: Duration,

    /// Interval between attempts to acquire or renew the Lease.
    #[arg(long, value_parser = parse_go, default_value = "2s")]
    pub leader_election_retry_period: Duration,
}

impl LeaderElectionArgs {
    /// Checks the timing flags relate as leader election needs: the leader must give up before
    /// a standby may take over, and must get several attempts before it gives up.
    pub fn validate(&self) -> Result<(), String> {
        if self.leader_election_renew_deadline >= self.leader_election_lease_duration {
            return Err(
                "--leader-election-renew-deadline must be shorter than --leader-election-lease-duration"
                    .to_owned(),
            );
        }
        if self.leader_election_retry_period >= self.leader_election_renew_deadline {
            return Err(
                "--leader-election-retry-period must be shorter than --leader-election-renew-deadline"
                    .to_owned(),
            );
        }
        Ok(())
    }
}

/// The namespaces a controller handler serves.
#[derive(Debug, Clone, Args)]
pub struct ScopeArgs {
    /// Serve only this namespace (the ClusterRole may then be bound with a RoleBinding there);
    /// every namespace when unset.
    #[arg(long, env = "WATCH_NAMESPACE")]
    pub watch_namespace: Option<String>,
}

impl ScopeArgs {
    /// The scope the flag names.
    pub fn scope(self) -> crate::watch::Scope {
        crate::watch::Scope::of(self.watch_namespace)
    }
}

/// The flags of a controller binary (every handler but the webhook-server, whose replicas are
/// all active): the shared ones, and the binary's own as `own`.
#[derive(Debug, Parser)]
pub struct ControllerArgs<Own: Args> {
    #[command(flatten)]
    pub common: CommonArgs,
    #[command(flatten)]
    pub leader: LeaderElectionArgs,
    #[command(flatten)]
    pub scope: ScopeArgs,
    #[command(flatten)]
    pub own: Own,
}

/// Builds the binary's command with the per-binary defaults of the shared flags.
///
/// Panics if `P` does not flatten [`CommonArgs`]: that is a programming error caught by each
/// binary's own flag test.
pub fn command<P: Parser>(spec: &HandlerSpec) -> clap::Command {
    let mut cmd = P::command()
        .name(spec.name)
        .version(spec.version)
        .about(spec.about)
        .mut_arg("grpc_bind_address", |a| {
            a.default_value(spec.grpc_bind_address).required(false)
        })
        .mut_arg("metrics_bind_address", |a| {
            a.default_value(spec.metrics_bind_address).required(false)
        });
    if cmd
        .get_arguments()
        .any(|a| a.get_id() == "leader_election_id")
    {
        cmd = cmd.mut_arg("leader_election_id", |a| {
            a.default_value(spec.leader_election_id).required(false)
        });
    }
    cmd
}

/// Parses the given arguments (first one is the program name) into the binary's parser.
pub fn try_parse_from<P, I, T>(spec: &HandlerSpec, args: I) -> Result<P, clap::Error>
where
    P: Parser,
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let mut cmd = command::<P>(spec);
    let matches = cmd.try_get_matches_from_mut(args)?;
    P::from_arg_matches(&matches).map_err(|e| e.format(&mut cmd))
}

/// Parses the process arguments, printing help or errors and exiting as clap does.
pub fn parse<P: Parser>(spec: &HandlerSpec) -> P {
    try_parse_from(spec, std::env::args_os()).unwrap_or_else(|e| e.exit())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: HandlerSpec = HandlerSpec {
        name: "test-handler",
        version: "0.0.0",
        about: "A handler for tests.",
        grpc_bind_address: ":9441",
        metrics_bind_address: ":8081",
        leader_election_id: "multigres-operator-test-handler",
    };

    /// A controller's own flags.
    #[derive(Debug, Args)]
    struct Own {
        /// A flag of this binary's only.
        #[arg(long, default_value_t = 3)]
        replicas: u32,
    }

    type Controller = ControllerArgs<Own>;

    #[derive(Debug, Parser)]
    struct NoLeader {
        #[command(flatten)]
        common: CommonArgs,
    }

    fn parse_controller(args: &[&str]) -> Result<Controller, clap::Error> {
        try_parse_from(
            &SPEC,
            std::iter::once("test-handler").chain(args.iter().copied()),
        )
    }

    #[test]
    fn the_binary_names_itself_and_keeps_its_own_flags() {
        let cmd = command::<Controller>(&SPEC);
        assert_eq!(cmd.get_name(), "test-handler");
        assert_eq!(cmd.get_version(), Some("0.0.0"));
        assert_eq!(
            cmd.get_about().map(|about| about.to_string()).as_deref(),
            Some("A handler for tests.")
        );
        assert_eq!(parse_controller(&[]).unwrap().own.replicas, 3);
        assert_eq!(parse_controller(&["--replicas=5"]).unwrap().own.replicas, 5);
    }

    #[test]
    fn the_scope_is_every_namespace_unless_one_is_named() {
        use crate::watch::Scope;
        let scope = |args: &[&str]| parse_controller(args).unwrap().scope.scope();
        assert_eq!(scope(&[]), Scope::All);
        assert_eq!(scope(&["--watch-namespace="]), Scope::All);
        assert_eq!(
            scope(&["--watch-namespace=team-a"]),
            Scope::Namespace("team-a".to_owned())
        );
    }

    #[test]
    fn defaults_come_from_the_spec() {
        let cli = parse_controller(&[]).unwrap();
        assert_eq!(
            cli.common.grpc_bind_address,
            "0.0.0.0:9441".parse().unwrap()
        );
        assert_eq!(
            cli.common.metrics_bind_address,
            BindAddress::Enabled("0.0.0.0:8081".parse().unwrap())
        );
        assert_eq!(cli.common.log_format, LogFormat::Json);
        assert_eq!(cli.common.log_level, None);
        assert_eq!(cli.common.kubeconfig, None);
        assert!(!cli.leader.leader_elect);
        assert_eq!(
            cli.leader.leader_election_id,
            "multigres-operator-test-handler"
        );
        assert_eq!(
            cli.leader.leader_election_lease_duration,
            Duration::from_secs(15)
        );
        assert_eq!(
            cli.leader.leader_election_renew_deadline,
            Duration::from_secs(10)
        );
        assert_eq!(
            cli.leader.leader_election_retry_period,
            Duration::from_secs(2)
        );
        cli.leader.validate().unwrap();
    }

    #[test]
    fn explicit_flags_override_defaults() {
        let cli = parse_controller(&[
            "--grpc-bind-address=127.0.0.1:0",
            "--metrics-bind-address",
            "[::1]:9090",
            "--log-format=text",
            "--log-level=debug,kube=info",
            "--kubeconfig=/tmp/kc",
            "--leader-elect",
            "--leader-election-namespace=ops",
            "--leader-election-id=my-lease",
            "--leader-election-lease-duration=4s",
            "--leader-election-renew-deadline=3s",
            "--leader-election-retry-period=500ms",
        ])
        .unwrap();
        assert_eq!(cli.common.grpc_bind_address, "127.0.0.1:0".parse().unwrap());
        assert_eq!(
            cli.common.metrics_bind_address,
            BindAddress::Enabled("[::1]:9090".parse().unwrap())
        );
        assert_eq!(cli.common.log_format, LogFormat::Text);
        assert_eq!(cli.common.log_level.as_deref(), Some("debug,kube=info"));
        assert_eq!(cli.common.kubeconfig, Some(PathBuf::from("/tmp/kc")));
        assert!(cli.leader.leader_elect);
        assert_eq!(cli.leader.leader_election_namespace.as_deref(), Some("ops"));
        assert_eq!(cli.leader.leader_election_id, "my-lease");
        assert_eq!(
            cli.leader.leader_election_retry_period,
            Duration::from_millis(500)
        );
        cli.leader.validate().unwrap();
    }

    #[test]
    fn metrics_zero_disables_the_endpoint() {
        let cli = parse_controller(&["--metrics-bind-address=0"]).unwrap();
        assert_eq!(cli.common.metrics_bind_address, BindAddress::Disabled);
        assert_eq!(cli.common.metrics_bind_address.addr(), None);
    }

    #[test]
    fn leader_elect_accepts_go_style_values() {
        assert!(
            parse_controller(&["--leader-elect=true"])
                .unwrap()
                .leader
                .leader_elect
        );
        assert!(
            !parse_controller(&["--leader-elect=false"])
                .unwrap()
                .leader
                .leader_elect
        );
        assert!(parse_controller(&["--leader-elect=maybe"]).is_err());
    }

    #[test]
    fn bad_values_are_refused() {
        assert!(parse_controller(&["--grpc-bind-address=nowhere"]).is_err());
        assert!(parse_controller(&["--metrics-bind-address=:99999"]).is_err());
        assert!(parse_controller(&["--log-format=xml"]).is_err());
        assert!(parse_controller(&["--leader-election-retry-period=2"]).is_err());
    }

    #[test]
    fn timing_flags_must_nest() {
        let cli = parse_controller(&["--leader-election-renew-deadline=20s"]).unwrap();
        assert!(cli.leader.validate().is_err());
        let cli = parse_controller(&["--leader-election-retry-period=10s"]).unwrap();
        assert!(cli.leader.validate().is_err());
    }

    #[test]
    fn binaries_without_leader_election_parse_without_its_flags() {
        let cli: NoLeader = try_parse_from(&SPEC, ["webhook"]).unwrap();
        assert_eq!(cli.common.grpc_bind_address.port(), 9441);
        assert!(try_parse_from::<NoLeader, _, _>(&SPEC, ["webhook", "--leader-elect"]).is_err());
    }

    #[test]
    fn listen_addresses() {
        assert_eq!(
            parse_listen_addr(":80").unwrap(),
            "0.0.0.0:80".parse().unwrap()
        );
        assert_eq!(
            parse_listen_addr("127.0.0.1:0").unwrap(),
            "127.0.0.1:0".parse().unwrap()
        );
        assert!(parse_listen_addr(":").is_err());
        assert!(parse_listen_addr("localhost:80").is_err());
        assert_eq!("0".parse::<BindAddress>().unwrap(), BindAddress::Disabled);
    }
}
