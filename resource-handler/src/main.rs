//! resource-handler: runs the workloads behind TopoServer, Cell, Shard and MultigresCluster
//! (etcd and Multigres StatefulSets, Deployments, Services, PDBs) and reports their readiness.

use clap::Args;
use multigres_api::observability::InheritedEnv;
use multigres_common::cli::HandlerSpec;

const SPEC: HandlerSpec = HandlerSpec {
    name: "resource-handler",
    version: env!("CARGO_PKG_VERSION"),
    about: env!("CARGO_PKG_DESCRIPTION"),
    grpc_bind_address: ":9442",
    metrics_bind_address: ":8082",
    leader_election_id: "multigres-operator-resource-handler",
};

/// The resource-handler's own flags.
#[derive(Debug, Args)]
struct WorkloadArgs {
    /// Namespace the operator's handlers run in: the clusters' NetworkPolicies admit its pods
    /// (the data-handler dials etcd and the multipoolers). Defaults to POD_NAMESPACE, then the
    /// client's namespace.
    #[arg(long, env = "POD_NAMESPACE")]
    operator_namespace: Option<String>,
    /// How long a pool pod's PostgreSQL may keep failing to start, rewind or restore before its
    /// multipooler quarantines it (`--postgres-unrecoverable-timeout`) and the handler replaces
    /// the pod and its volume from the newest backup; a Go duration, `0s` turns both off.
    /// Changing it changes every pool pod's template (an ordered restart).
    #[arg(long, env = "POOLER_UNRECOVERABLE_TIMEOUT", default_value = "5m", value_parser = multigres_api::duration::parse_go)]
    pooler_unrecoverable_timeout: std::time::Duration,
}

fn main() -> anyhow::Result<()> {
    multigres_common::controller_main(SPEC, |ctx, scope, own: WorkloadArgs| {
        // Read once: the fallback of every cluster's data-plane telemetry.
        let telemetry = InheritedEnv::from_vars(std::env::vars());
        let operator_namespace = own
            .operator_namespace
            .filter(|ns| !ns.is_empty())
            .unwrap_or_else(|| ctx.client.default_namespace().to_owned());
        resource_handler::run(
            ctx,
            scope,
            telemetry,
            operator_namespace,
            own.pooler_unrecoverable_timeout,
        )
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use multigres_common::cli::{self, ControllerArgs};

    use super::*;

    type Cli = ControllerArgs<WorkloadArgs>;

    #[test]
    fn writes_and_events_name_this_binary() {
        let manager = multigres_common::apply::field_manager(SPEC.name);
        assert_eq!(resource_handler::sync::FIELD_MANAGER, manager);
        assert_eq!(resource_handler::controller::REPORTER, manager);
    }

    #[test]
    fn flags_parse_with_this_binary_defaults() {
        let cli: Cli = cli::try_parse_from(&SPEC, ["resource-handler"]).unwrap();
        assert_eq!(cli.common.grpc_bind_address.port(), 9442);
        assert_eq!(cli.common.metrics_bind_address.addr().unwrap().port(), 8082);
        assert_eq!(
            cli.leader.leader_election_id,
            "multigres-operator-resource-handler"
        );
        assert_eq!(
            cli.own.pooler_unrecoverable_timeout,
            std::time::Duration::from_secs(300)
        );
        let off: Cli = cli::try_parse_from(
            &SPEC,
            ["resource-handler", "--pooler-unrecoverable-timeout=0s"],
        )
        .unwrap();
        assert!(off.own.pooler_unrecoverable_timeout.is_zero());
        let bad = cli::try_parse_from::<Cli, _, _>(
            &SPEC,
            ["resource-handler", "--pooler-unrecoverable-timeout=soon"],
        );
        assert!(bad.is_err());
    }
}
