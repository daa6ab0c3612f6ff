//! data-handler: registers cells and databases in the Multigres topology (etcd) and publishes
//! what it reads there (pod roles) on Shard status.

use std::time::Duration;

use clap::Args;
use data_handler::Settings;
use multigres_api::duration::parse_go;
use multigres_common::cli::HandlerSpec;

const SPEC: HandlerSpec = HandlerSpec {
    name: data_handler::NAME,
    version: env!("CARGO_PKG_VERSION"),
    about: env!("CARGO_PKG_DESCRIPTION"),
    grpc_bind_address: ":9443",
    metrics_bind_address: ":8083",
    leader_election_id: "multigres-operator-data-handler",
};

/// Timings of the topology controllers.
#[derive(Debug, Args)]
struct TopologyArgs {
    /// How often a registered cluster and its cells are checked against etcd (reachability,
    /// records edited behind the operator's back).
    #[arg(long, value_parser = parse_go, default_value = "30s")]
    topo_check_period: Duration,
    /// How long a deleted cluster or cell may fail to deregister (for example while its etcd is
    /// unreachable) before its finalizer is released anyway, with a Warning event.
    #[arg(long, value_parser = parse_go, default_value = "2m")]
    topo_unreachable_timeout: Duration,
    /// Longest retry delay while the topology server is failing; registration resumes within
    /// this long after it is back.
    #[arg(long, value_parser = parse_go, default_value = "30s")]
    topo_retry_max: Duration,
    /// Time allowed to connect to an etcd endpoint.
    #[arg(long, value_parser = parse_go, default_value = "5s")]
    topo_connect_timeout: Duration,
    /// Time allowed for each etcd request.
    #[arg(long, value_parser = parse_go, default_value = "10s")]
    topo_request_timeout: Duration,
    /// How often pool pod roles (primary / replica) are read from the pooler records.
    #[arg(long, value_parser = parse_go, default_value = "10s")]
    roles_poll_period: Duration,
}

impl From<TopologyArgs> for Settings {
    fn from(args: TopologyArgs) -> Self {
        Settings {
            check_period: args.topo_check_period,
            unreachable_timeout: args.topo_unreachable_timeout,
            roles_period: args.roles_poll_period,
            connect_timeout: args.topo_connect_timeout,
            request_timeout: args.topo_request_timeout,
            retry_max: args.topo_retry_max,
        }
    }
}

fn main() -> anyhow::Result<()> {
    multigres_common::controller_main(SPEC, |ctx, scope, topology: TopologyArgs| {
        data_handler::run(ctx, scope, Settings::from(topology))
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use multigres_common::cli::{self, ControllerArgs};

    use super::*;

    type Cli = ControllerArgs<TopologyArgs>;

    #[test]
    fn flags_parse_with_this_binary_defaults() {
        let cli: Cli = cli::try_parse_from(&SPEC, ["data-handler"]).unwrap();
        assert_eq!(cli.common.grpc_bind_address.port(), 9443);
        assert_eq!(cli.common.metrics_bind_address.addr().unwrap().port(), 8083);
        assert_eq!(
            cli.leader.leader_election_id,
            "multigres-operator-data-handler"
        );
        let settings = Settings::from(cli.own);
        assert_eq!(settings.check_period, Duration::from_secs(30));
        assert_eq!(settings.unreachable_timeout, Duration::from_secs(120));
        assert_eq!(settings.roles_period, Duration::from_secs(10));
        assert_eq!(settings.retry_max, Duration::from_secs(30));
    }

    #[test]
    fn timings_are_go_durations() {
        let cli: Cli = cli::try_parse_from(
            &SPEC,
            [
                "data-handler",
                "--topo-unreachable-timeout=10s",
                "--topo-check-period=500ms",
                "--roles-poll-period=1s",
            ],
        )
        .unwrap();
        let settings = Settings::from(cli.own);
        assert_eq!(settings.unreachable_timeout, Duration::from_secs(10));
        assert_eq!(settings.check_period, Duration::from_millis(500));
        assert_eq!(settings.roles_period, Duration::from_secs(1));
        assert!(
            cli::try_parse_from::<Cli, _, _>(&SPEC, ["data-handler", "--topo-check-period=10"])
                .is_err(),
            "a duration needs a unit"
        );
    }
}
