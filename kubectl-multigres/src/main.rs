//! `kubectl-multigres`: on PATH, `kubectl multigres <command>` runs it. Only wiring: the commands
//! live in the library.

use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use k8s_openapi::jiff::Timestamp;
use kube::{Client, Config};
use kubectl_multigres::maintenance::{self, Switch};
use kubectl_multigres::{backup, psql, status, switchover, view};

/// Status, switchover, backup, psql, pause, resume, restart, hibernate and wake for Multigres
/// clusters.
#[derive(Parser)]
#[command(name = "kubectl multigres", version)]
struct Cli {
    /// Namespace of the cluster (default: the kubeconfig context's).
    #[arg(short, long, global = true)]
    namespace: Option<String>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// One screen: phases, gateways per cell, each shard's pods with role, cohort and
    /// replication, the last backup, and every condition that is not OK.
    Status {
        /// The MultigresCluster.
        cluster: String,
    },
    /// Asks the primary of a shard to hand over (annotation `multigres.com/switchover`);
    /// multiorch appoints the new primary among the cohort's replicas.
    Switchover {
        /// A Shard, or a MultigresCluster with a single shard.
        target: String,
        /// Wait until another pod is the primary, printing progress.
        #[arg(long)]
        wait: bool,
        /// How long `--wait` waits, in seconds.
        #[arg(long, default_value_t = 300)]
        timeout: u64,
    },
    /// Asks for a backup of every shard now (annotation `multigres.com/backup-request`, with the
    /// UTC time as the request id); taken on a replica, as scheduled backups are.
    Backup {
        /// The MultigresCluster.
        cluster: String,
        /// Kind of backup (default: the schedule's type, else full).
        #[arg(long = "type", value_parser = ["full", "diff", "incr"])]
        kind: Option<String>,
        /// Wait until every shard answered, printing progress; exits 1 if a shard failed.
        #[arg(long)]
        wait: bool,
        /// How long `--wait` waits (a duration such as 30m or 1h30m).
        #[arg(long, default_value = "30m", value_parser = multigres_api::duration::parse_go)]
        timeout: Duration,
    },
    /// Stops the operator from changing the cluster's workloads (annotation
    /// `multigres.com/paused`); status keeps being reported.
    Pause {
        /// The MultigresCluster.
        cluster: String,
    },
    /// Lets the operator change the cluster's workloads again, applying what waited.
    Resume {
        /// The MultigresCluster.
        cluster: String,
    },
    /// Stops every pod of the cluster's data plane and keeps its volumes, topology, backups and
    /// Secrets (annotation `multigres.com/hibernate`); no backup runs while it sleeps.
    Hibernate {
        /// The MultigresCluster.
        cluster: String,
    },
    /// Starts a hibernated cluster's pods again, on the same volumes.
    Wake {
        /// The MultigresCluster.
        cluster: String,
    },
    /// Releases the pool pod restarts the cluster's Shards hold under
    /// `multigres.com/restart-policy: supervised`.
    Restart {
        /// The MultigresCluster.
        cluster: String,
    },
    /// psql through the cluster's multigateway, as the superuser; arguments after `--` go to
    /// psql (e.g. `-- -c 'select 1'`).
    Psql {
        /// The MultigresCluster.
        cluster: String,
        /// Connect through this cell's gateway instead of the cluster-wide Service.
        #[arg(long)]
        cell: Option<String>,
        /// Arguments passed to psql.
        #[arg(last = true)]
        psql_args: Vec<String>,
    },
}

#[tokio::main]
async fn main() -> Result<()> {
    let cli = Cli::parse();
    let config = Config::infer()
        .await
        .context("no Kubernetes configuration (KUBECONFIG, ~/.kube/config or in-cluster)")?;
    let namespace = cli
        .namespace
        .unwrap_or_else(|| config.default_namespace.clone());
    let client = Client::try_from(config).context("building the Kubernetes client")?;
    match cli.command {
        Command::Status { cluster } => {
            let view = view::load(&client, &namespace, &cluster).await?;
            print!("{}", status::render(&view, Timestamp::now()));
        }
        Command::Switchover {
            target,
            wait,
            timeout,
        } => {
            let timeout = Duration::from_secs(timeout);
            switchover::run(&client, &namespace, &target, wait, timeout).await?;
        }
        Command::Backup {
            cluster,
            kind,
            wait,
            timeout,
        } => {
            backup::run(
                &client,
                &namespace,
                &cluster,
                kind.as_deref(),
                wait,
                timeout,
            )
            .await?;
        }
        Command::Pause { cluster } => {
            maintenance::run(&client, &namespace, &cluster, Switch::Pause, true).await?
        }
        Command::Resume { cluster } => {
            maintenance::run(&client, &namespace, &cluster, Switch::Pause, false).await?
        }
        Command::Hibernate { cluster } => {
            maintenance::run(&client, &namespace, &cluster, Switch::Hibernate, true).await?
        }
        Command::Wake { cluster } => {
            maintenance::run(&client, &namespace, &cluster, Switch::Hibernate, false).await?
        }
        Command::Restart { cluster } => maintenance::restart(&client, &namespace, &cluster).await?,
        Command::Psql {
            cluster,
            cell,
            psql_args,
        } => {
            let code =
                psql::run(&client, &namespace, &cluster, cell.as_deref(), &psql_args).await?;
            std::process::exit(code);
        }
    }
    Ok(())
}
