//! webhook-server: mutating and validating admission for the multigres.com kinds, with its own
//! TLS certificate management. All replicas are active (no leader election).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{ArgAction, Args, Parser};
use multigres_common::HandlerRuntime;
use multigres_common::cli::{self, CommonArgs, HandlerSpec, parse_listen_addr};

const SPEC: HandlerSpec = HandlerSpec {
    name: "webhook-server",
    version: env!("CARGO_PKG_VERSION"),
    grpc_bind_address: ":9444",
    metrics_bind_address: ":8084",
    leader_election_id: "multigres-operator-webhook-server",
};

/// Admission flags, named as in the upstream operator so deployments carry over.
#[derive(Debug, Clone, Args)]
struct WebhookArgs {
    /// Serve admission requests.
    #[arg(
        long,
        action = ArgAction::Set,
        num_args = 0..=1,
        default_value_t = true,
        default_missing_value = "true"
    )]
    webhook_enable: bool,

    /// Directory holding tls.crt and tls.key (mounted by cert-manager, or written by the server).
    #[arg(long, default_value = "/var/run/secrets/webhook")]
    webhook_cert_dir: PathBuf,

    /// Name of the Service in front of the webhook (the certificate's DNS name).
    #[arg(long, default_value = "multigres-operator-webhook-service")]
    webhook_service_name: String,

    /// Namespace of that Service; defaults to POD_NAMESPACE, then the client's namespace.
    #[arg(long, env = "POD_NAMESPACE")]
    webhook_service_namespace: Option<String>,

    /// Address of the admission HTTPS server, as HOST:PORT or :PORT.
    #[arg(long, value_parser = parse_listen_addr, default_value = ":8443")]
    webhook_bind_address: SocketAddr,
}

/// Flags of the webhook-server.
#[derive(Debug, Parser)]
#[command(name = "webhook-server", version, about)]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    webhook: WebhookArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli: Cli = cli::parse(&SPEC);
    let runtime = HandlerRuntime::start(SPEC, &cli.common).await?;
    let webhook = cli.webhook;
    let service_namespace = webhook
        .webhook_service_namespace
        .clone()
        .unwrap_or_else(|| runtime.client().default_namespace().to_owned());
    tracing::info!(
        enabled = webhook.webhook_enable,
        cert_dir = %webhook.webhook_cert_dir.display(),
        service = %webhook.webhook_service_name,
        namespace = %service_namespace,
        bind_address = %webhook.webhook_bind_address,
        "webhook configuration"
    );
    runtime
        .run(None, |ctx| async move {
            tracing::warn!(
                "the admission server is not implemented yet: no certificate is loaded, so \
                 grpc.health.v1 stays NOT_SERVING"
            );
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
    fn seed_flags_have_the_seed_defaults() {
        let cli: Cli = cli::try_parse_from(&SPEC, ["webhook-server"]).unwrap();
        assert_eq!(cli.common.grpc_bind_address.port(), 9444);
        assert_eq!(cli.common.metrics_bind_address.addr().unwrap().port(), 8084);
        assert!(cli.webhook.webhook_enable);
        assert_eq!(
            cli.webhook.webhook_cert_dir,
            PathBuf::from("/var/run/secrets/webhook")
        );
        assert_eq!(
            cli.webhook.webhook_service_name,
            "multigres-operator-webhook-service"
        );
        assert_eq!(cli.webhook.webhook_bind_address.port(), 8443);
    }

    #[test]
    fn seed_flags_accept_go_style_values() {
        let cli: Cli = cli::try_parse_from(
            &SPEC,
            [
                "webhook-server",
                "--webhook-enable=false",
                "--webhook-cert-dir=/certs",
                "--webhook-service-name=hooks",
                "--webhook-service-namespace=ops",
                "--webhook-bind-address=127.0.0.1:9000",
            ],
        )
        .unwrap();
        assert!(!cli.webhook.webhook_enable);
        assert_eq!(cli.webhook.webhook_cert_dir, PathBuf::from("/certs"));
        assert_eq!(cli.webhook.webhook_service_name, "hooks");
        assert_eq!(
            cli.webhook.webhook_service_namespace.as_deref(),
            Some("ops")
        );
        assert_eq!(
            cli.webhook.webhook_bind_address,
            "127.0.0.1:9000".parse().unwrap()
        );
    }

    #[test]
    fn leader_election_is_not_offered() {
        assert!(
            cli::try_parse_from::<Cli, _, _>(&SPEC, ["webhook-server", "--leader-elect"]).is_err()
        );
    }
}
