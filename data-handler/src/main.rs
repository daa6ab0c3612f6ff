//! data-handler: registers cells and databases in the Multigres topology (etcd) and publishes
//! what it reads there (pod roles) on Shard status.

use std::convert::Infallible;

use clap::Parser;
use multigres_common::HandlerRuntime;
use multigres_common::cli::{self, CommonArgs, HandlerSpec, LeaderElectionArgs};

const SPEC: HandlerSpec = HandlerSpec {
    name: "data-handler",
    version: env!("CARGO_PKG_VERSION"),
    grpc_bind_address: ":9443",
    metrics_bind_address: ":8083",
    leader_election_id: "multigres-operator-data-handler",
};

/// Flags of the data-handler.
#[derive(Debug, Parser)]
#[command(name = "data-handler", version, about)]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    leader: LeaderElectionArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli: Cli = cli::parse(&SPEC);
    let runtime = HandlerRuntime::start(SPEC, &cli.common).await?;
    runtime
        .run(Some(&cli.leader), |ctx| async move {
            ctx.state.set_serving(true).await;
            ctx.shutdown.wait().await;
            Ok::<(), Infallible>(())
        })
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_parse_with_this_binary_defaults() {
        let cli: Cli = cli::try_parse_from(&SPEC, ["data-handler"]).unwrap();
        assert_eq!(cli.common.grpc_bind_address.port(), 9443);
        assert_eq!(cli.common.metrics_bind_address.addr().unwrap().port(), 8083);
        assert_eq!(
            cli.leader.leader_election_id,
            "multigres-operator-data-handler"
        );
    }
}
