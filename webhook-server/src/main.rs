//! webhook-server: mutating and validating admission for the multigres.com kinds, with its own
//! TLS certificate management. All replicas are active (no leader election).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{ArgAction, Args, Parser};
use multigres_api::duration::parse_go;
use multigres_common::HandlerRuntime;
use multigres_common::cli::{self, CommonArgs, HandlerSpec, parse_listen_addr};
use multigres_common::pki::webhook::{Lifetimes, Sans};
use multigres_common::process::Threads;
use webhook_server::rules::children::{Operators, ServiceAccount};
use webhook_server::server::{RunningWebhook, WebhookOptions};
use webhook_server::tls::manager::{CertificateSource, ManagedCertificates};

const SPEC: HandlerSpec = HandlerSpec {
    name: "webhook-server",
    version: env!("CARGO_PKG_VERSION"),
    about: env!("CARGO_PKG_DESCRIPTION"),
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

    /// Directory of a mounted certificate (tls.crt and tls.key, e.g. from cert-manager). When
    /// both files exist they are served and watched, and nothing is generated or rotated;
    /// otherwise the server manages its own CA and certificate in a Secret.
    #[arg(long, default_value = "/var/run/secrets/webhook")]
    webhook_cert_dir: PathBuf,

    /// Name of the Service in front of the webhook (the certificate's DNS name).
    #[arg(long, default_value = "multigres-operator-webhook-service")]
    webhook_service_name: String,

    /// Namespace of that Service and of the certificate Secret; defaults to POD_NAMESPACE, then
    /// the client's namespace.
    #[arg(long, env = "POD_NAMESPACE")]
    webhook_service_namespace: Option<String>,

    /// Address of the admission HTTPS server, as HOST:PORT or :PORT.
    #[arg(long, value_parser = parse_listen_addr, default_value = ":8443")]
    webhook_bind_address: SocketAddr,

    /// More names for the generated certificate, comma-separated: DNS names or IP addresses
    /// (e.g. 127.0.0.1 for a webhook registered by URL on loopback).
    #[arg(long, value_delimiter = ',')]
    webhook_extra_sans: Vec<String>,

    /// Secret holding the generated CA and serving certificate.
    #[arg(long, default_value = "multigres-webhook-certs")]
    webhook_cert_secret_name: String,

    /// MutatingWebhookConfigurations whose caBundle is kept current, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "multigres-operator-mutating-webhook-configuration"
    )]
    webhook_mutating_configurations: Vec<String>,

    /// ValidatingWebhookConfigurations whose caBundle is kept current, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "multigres-operator-validating-webhook-configuration"
    )]
    webhook_validating_configurations: Vec<String>,

    /// How often the certificate is checked: renewal of the generated one, or changes of the
    /// mounted files.
    #[arg(long, value_parser = parse_go, default_value = "1m")]
    webhook_cert_check_interval: Duration,

    /// ServiceAccounts allowed to write Cell, TableGroup, Shard and TopoServer, comma-separated,
    /// as NAMESPACE:NAME or NAME (in the webhook's namespace).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "multigres-operator-cluster-handler,multigres-operator-resource-handler,multigres-operator-data-handler"
    )]
    operator_service_accounts: Vec<String>,
}

/// Flags of the webhook-server (its name, version and description come from `SPEC`).
#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    webhook: WebhookArgs,
}

impl WebhookArgs {
    fn options(&self, namespace: &str) -> anyhow::Result<WebhookOptions> {
        // Empty entries (a stray comma from templating) are skipped, not errors.
        let accounts = self
            .operator_service_accounts
            .iter()
            .map(|sa| sa.trim())
            .filter(|sa| !sa.is_empty())
            .map(|sa| ServiceAccount::parse(sa, namespace))
            .collect::<Result<Vec<_>, _>>()
            .map_err(anyhow::Error::msg)
            .context("--operator-service-accounts")?;
        let managed = ManagedCertificates {
            namespace: namespace.to_owned(),
            secret_name: self.webhook_cert_secret_name.clone(),
            sans: Sans::for_service(
                &self.webhook_service_name,
                namespace,
                &self.webhook_extra_sans,
            ),
            lifetimes: Lifetimes::default(),
            check_interval: self.webhook_cert_check_interval,
            mutating_configurations: self.webhook_mutating_configurations.clone(),
            validating_configurations: self.webhook_validating_configurations.clone(),
        };
        Ok(WebhookOptions {
            bind_address: self.webhook_bind_address,
            certificates: CertificateSource::detect(
                self.webhook_cert_dir.clone(),
                self.webhook_cert_check_interval,
                managed,
            ),
            operators: Operators::new(&accounts),
        })
    }
}

fn main() -> anyhow::Result<()> {
    multigres_common::process::run(Threads::PerCpu, async_main())
}

async fn async_main() -> anyhow::Result<()> {
    let cli: Cli = cli::parse(&SPEC);
    let runtime = HandlerRuntime::start(SPEC, &cli.common).await?;
    let webhook = cli.webhook;
    let namespace = webhook
        .webhook_service_namespace
        .clone()
        .unwrap_or_else(|| runtime.client().default_namespace().to_owned());
    let options = webhook.options(&namespace)?;
    tracing::info!(
        enabled = webhook.webhook_enable,
        certificates = match &options.certificates {
            CertificateSource::Files { .. } => "files",
            CertificateSource::Managed(_) => "managed",
        },
        cert_dir = %webhook.webhook_cert_dir.display(),
        service = %webhook.webhook_service_name,
        %namespace,
        bind_address = %webhook.webhook_bind_address,
        "webhook configuration"
    );
    runtime
        .run(None, |ctx| async move {
            if !webhook.webhook_enable {
                tracing::info!("admission disabled by --webhook-enable=false");
                ctx.state.set_ready(true).await;
                ctx.shutdown.wait().await;
                return Ok(());
            }
            let running = RunningWebhook::start(options, ctx.client, ctx.state).await?;
            ctx.shutdown.wait().await;
            running.stop().await
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
    fn certificate_and_identity_flags_build_the_options() {
        let cli: Cli = cli::try_parse_from(
            &SPEC,
            [
                "webhook-server",
                "--webhook-cert-dir=/nonexistent/webhook-certs",
                "--webhook-service-name=hooks",
                "--webhook-extra-sans=127.0.0.1,hooks.example",
                "--webhook-cert-secret-name=hooks-tls",
                "--webhook-mutating-configurations=m1,m2",
                "--webhook-cert-check-interval=30s",
                "--operator-service-accounts=,ops:handler,other:x,",
            ],
        )
        .unwrap();
        let options = cli.webhook.options("ops").unwrap();
        let CertificateSource::Managed(managed) = &options.certificates else {
            panic!("no files in the cert dir, so self-managed");
        };
        assert_eq!(managed.namespace, "ops");
        assert_eq!(managed.secret_name, "hooks-tls");
        assert_eq!(
            managed.sans.dns_names,
            [
                "hooks.example",
                "hooks.ops.svc",
                "hooks.ops.svc.cluster.local"
            ]
        );
        assert_eq!(
            managed.sans.ip_addresses,
            ["127.0.0.1".parse::<std::net::IpAddr>().unwrap()]
        );
        assert_eq!(managed.mutating_configurations, ["m1", "m2"]);
        assert_eq!(
            managed.validating_configurations,
            ["multigres-operator-validating-webhook-configuration"]
        );
        assert_eq!(managed.check_interval, Duration::from_secs(30));
        let operators = webhook_server::rules::children::check(
            "Cell",
            &kube::core::admission::Operation::Create,
            "system:serviceaccount:other:x",
            None,
            None,
            &options.operators,
        );
        assert!(operators.allowed(), "{operators:?}");

        let bad: Cli = cli::try_parse_from(
            &SPEC,
            ["webhook-server", "--operator-service-accounts=a:b:c"],
        )
        .unwrap();
        assert!(bad.webhook.options("ops").is_err());
    }

    #[test]
    fn default_operator_accounts_live_in_the_webhook_namespace() {
        let cli: Cli = cli::try_parse_from(&SPEC, ["webhook-server"]).unwrap();
        assert_eq!(
            cli.webhook.operator_service_accounts,
            [
                "multigres-operator-cluster-handler",
                "multigres-operator-resource-handler",
                "multigres-operator-data-handler"
            ]
        );
    }

    #[test]
    fn leader_election_is_not_offered() {
        assert!(
            cli::try_parse_from::<Cli, _, _>(&SPEC, ["webhook-server", "--leader-elect"]).is_err()
        );
    }
}
