//! The certificate lifecycle against a real local API server, checked with a real TLS client
//! that trusts only the webhook's own CA: the first replica creates the Secret and sets the
//! caBundle, a second replica reuses the Secret, renewal swaps the certificate without dropping
//! an established connection, and mounted files are served, reloaded and never rotated.

mod support;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, PostParams};
use multigres_common::pki;
use multigres_common::pki::webhook::{self as serving, Lifetimes, Sans};
use multigres_common::state::HandlerState;
use serde_json::json;
use support::{HttpsConnection, control_plane, fixture, namespace, operators};
use webhook_server::server::{RunningWebhook, WebhookOptions};
use webhook_server::tls::manager::{CertificateSource, ManagedCertificates};

const VALIDATE_CELL: &str = "/validate-multigres-com-v1alpha1-cell";

fn loopback() -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, 0))
}

fn managed(
    ns: &str,
    lifetimes: Lifetimes,
    check: Duration,
    config: Option<&str>,
) -> ManagedCertificates {
    ManagedCertificates {
        namespace: ns.to_owned(),
        secret_name: "webhook-certs".to_owned(),
        sans: Sans::for_service("hooks", ns, &["127.0.0.1".to_owned()]),
        lifetimes,
        check_interval: check,
        mutating_configurations: Vec::new(),
        validating_configurations: config.into_iter().map(str::to_owned).collect(),
    }
}

async fn start(managed: ManagedCertificates) -> (RunningWebhook, HandlerState) {
    let client = control_plane().await.client().unwrap();
    let state = HandlerState::new("webhook-server", "test").await;
    let webhook = RunningWebhook::start(
        WebhookOptions {
            bind_address: loopback(),
            certificates: CertificateSource::Managed(managed),
            operators: operators(),
        },
        client,
        state.clone(),
    )
    .await
    .unwrap();
    (webhook, state)
}

/// Polls `check` every 50 ms until it returns `Some`, for at most `timeout`.
async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn secret_material(secrets: &Api<Secret>) -> Option<(String, String)> {
    let secret = secrets.get_opt("webhook-certs").await.unwrap()?;
    let data = secret.data?;
    let text = |k: &str| String::from_utf8(data.get(k)?.0.clone()).ok();
    Some((text("ca.crt")?, text("tls.crt")?))
}

/// One admission round trip on `connection`, checking the answer is a real AdmissionReview.
async fn round_trip(connection: &mut HttpsConnection) {
    let (status, body) = connection
        .post(
            VALIDATE_CELL,
            fixture("cell-update-by-operator", "ns").as_bytes(),
        )
        .await
        .unwrap();
    assert_eq!(status, 200);
    let review: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(review["response"]["allowed"], true, "{review:#}");
}

#[tokio::test]
async fn first_replica_creates_the_secret_and_the_second_reuses_it() {
    let cluster = control_plane().await;
    let ns = namespace(cluster, "certs").await;
    let client = cluster.client().unwrap();

    // A webhook configuration registered before the first start, without a caBundle.
    let configs: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let config_name = format!("{ns}-validating");
    let config: ValidatingWebhookConfiguration = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": config_name},
        "webhooks": [{
            "name": "vcell.multigres.com",
            "clientConfig": {"url": "https://127.0.0.1:1/validate-multigres-com-v1alpha1-cell"},
            "rules": [{"apiGroups": ["multigres.com"], "apiVersions": ["v1alpha1"],
                       "operations": ["UPDATE"], "resources": ["cells"]}],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
        }],
    }))
    .unwrap();
    configs
        .create(&PostParams::default(), &config)
        .await
        .unwrap();

    let settings = managed(
        &ns,
        Lifetimes::default(),
        Duration::from_millis(200),
        Some(&config_name),
    );
    let (first, first_state) = start(settings.clone()).await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let (ca, cert) = eventually("the Secret", Duration::from_secs(30), || {
        secret_material(&secrets)
    })
    .await;
    eventually("SERVING", Duration::from_secs(10), || async {
        first_state.is_serving().then_some(())
    })
    .await;
    assert_eq!(
        first.certificates().cert_pem().as_deref(),
        Some(cert.as_str())
    );

    // The caBundle is the CA from the Secret.
    let bundle = eventually("the caBundle", Duration::from_secs(10), || async {
        let config = configs.get(&config_name).await.unwrap();
        config.webhooks?[0].client_config.ca_bundle.clone()
    })
    .await;
    assert_eq!(String::from_utf8(bundle.0).unwrap(), ca);

    // A real TLS client trusting only that CA connects by IP SAN and gets an answer.
    let mut connection = HttpsConnection::connect(first.local_addr(), &ca, "127.0.0.1")
        .await
        .unwrap();
    round_trip(&mut connection).await;
    // ... and by the Service DNS name.
    let mut by_name = HttpsConnection::connect(first.local_addr(), &ca, &format!("hooks.{ns}.svc"))
        .await
        .unwrap();
    round_trip(&mut by_name).await;

    // A second replica adopts the same certificate instead of making its own.
    let (second, second_state) = start(settings).await;
    eventually(
        "the second replica serving",
        Duration::from_secs(10),
        || async { second_state.is_serving().then_some(()) },
    )
    .await;
    assert_eq!(
        second.certificates().cert_pem().as_deref(),
        Some(cert.as_str())
    );
    let mut other = HttpsConnection::connect(second.local_addr(), &ca, "127.0.0.1")
        .await
        .unwrap();
    assert_eq!(other.peer_certificate(), connection.peer_certificate());
    round_trip(&mut other).await;
    assert_eq!(
        secret_material(&secrets).await,
        Some((ca, cert)),
        "nothing was rewritten"
    );

    first.stop().await.unwrap();
    second.stop().await.unwrap();
    configs
        .delete(&config_name, &DeleteParams::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn renewal_swaps_the_certificate_without_dropping_connections() {
    let cluster = control_plane().await;
    let ns = namespace(cluster, "rotate").await;
    let client = cluster.client().unwrap();
    // Serving certificates valid for 9 s (plus 0.9 s backdating): renewed with 3.3 s left.
    let lifetimes = Lifetimes {
        ca: Duration::from_secs(3600),
        serving: Duration::from_secs(9),
    };
    let (webhook, _) = start(managed(&ns, lifetimes, Duration::from_millis(200), None)).await;
    let secrets: Api<Secret> = Api::namespaced(client, &ns);
    let (ca, first_cert) = eventually("the Secret", Duration::from_secs(30), || {
        secret_material(&secrets)
    })
    .await;
    eventually(
        "the certificate loaded",
        Duration::from_secs(10),
        || async { webhook.certificates().is_loaded().then_some(()) },
    )
    .await;

    let mut established = HttpsConnection::connect(webhook.local_addr(), &ca, "127.0.0.1")
        .await
        .unwrap();
    round_trip(&mut established).await;
    let old_peer = established.peer_certificate();

    let renewed = eventually("the renewal", Duration::from_secs(20), || async {
        let (_, cert) = secret_material(&secrets).await?;
        (cert != first_cert).then_some(cert)
    })
    .await;
    eventually(
        "the new certificate served",
        Duration::from_secs(10),
        || async {
            (webhook.certificates().cert_pem().as_deref() == Some(renewed.as_str())).then_some(())
        },
    )
    .await;
    assert_eq!(
        secret_material(&secrets).await.unwrap().0,
        ca,
        "a serving renewal keeps the CA"
    );

    // The established connection keeps working, still on the old certificate...
    round_trip(&mut established).await;
    assert_eq!(established.peer_certificate(), old_peer);
    // ... while a new connection gets the renewed one.
    let mut fresh = HttpsConnection::connect(webhook.local_addr(), &ca, "127.0.0.1")
        .await
        .unwrap();
    round_trip(&mut fresh).await;
    assert_ne!(fresh.peer_certificate(), old_peer);
    let served = pki::bundle_ders(&renewed).unwrap().remove(0);
    assert_eq!(fresh.peer_certificate(), served.to_vec());

    webhook.stop().await.unwrap();
}

#[tokio::test]
async fn corrupt_secret_is_replaced() {
    let cluster = control_plane().await;
    let ns = namespace(cluster, "corrupt").await;
    let client = cluster.client().unwrap();
    let secrets: Api<Secret> = Api::namespaced(client, &ns);
    let junk: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "webhook-certs"},
        "type": "kubernetes.io/tls",
        "stringData": {"tls.crt": "junk", "tls.key": "junk", "ca.crt": "junk", "ca.key": "junk"},
    }))
    .unwrap();
    secrets.create(&PostParams::default(), &junk).await.unwrap();
    let (webhook, state) = start(managed(
        &ns,
        Lifetimes::default(),
        Duration::from_millis(200),
        None,
    ))
    .await;
    let (ca, _) = eventually("a valid Secret", Duration::from_secs(30), || async {
        secret_material(&secrets)
            .await
            .filter(|(ca, _)| ca != "junk")
    })
    .await;
    eventually("SERVING", Duration::from_secs(10), || async {
        state.is_serving().then_some(())
    })
    .await;
    let mut connection = HttpsConnection::connect(webhook.local_addr(), &ca, "127.0.0.1")
        .await
        .unwrap();
    round_trip(&mut connection).await;
    webhook.stop().await.unwrap();
}

#[tokio::test]
async fn mounted_files_are_served_reloaded_and_never_rotated() {
    let dir = tempfile::tempdir().unwrap();
    let sans = Sans::for_service("hooks", "files", &["127.0.0.1".to_owned()]);
    // Already inside its renewal window: a managed webhook would replace it at once.
    let lifetimes = Lifetimes {
        ca: Duration::from_secs(3600),
        serving: Duration::from_secs(3600),
    };
    let old = time::OffsetDateTime::now_utc() - Duration::from_secs(3000);
    let first = serving::generate(&sans, lifetimes, old).unwrap();
    std::fs::write(dir.path().join("tls.crt"), &first.cert).unwrap();
    std::fs::write(dir.path().join("tls.key"), &first.key).unwrap();

    let source = CertificateSource::detect(
        dir.path().to_owned(),
        Duration::from_millis(100),
        managed("unused", lifetimes, Duration::from_secs(60), None),
    );
    assert!(matches!(source, CertificateSource::Files { .. }));
    let state = HandlerState::new("webhook-server", "test").await;
    // No API server is needed in this mode: nothing is read or written there.
    let webhook = RunningWebhook::start(
        WebhookOptions {
            bind_address: loopback(),
            certificates: source,
            operators: operators(),
        },
        support::unused_client(),
        state.clone(),
    )
    .await
    .unwrap();
    eventually("SERVING", Duration::from_secs(10), || async {
        state.is_serving().then_some(())
    })
    .await;
    let mut connection =
        HttpsConnection::connect(webhook.local_addr(), &first.ca_bundle, "127.0.0.1")
            .await
            .unwrap();
    round_trip(&mut connection).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        webhook.certificates().cert_pem().as_deref(),
        Some(first.cert.as_str()),
        "files are never rotated"
    );

    // cert-manager renews: new files (from another CA) are picked up without a restart.
    let second =
        serving::generate(&sans, Lifetimes::default(), time::OffsetDateTime::now_utc()).unwrap();
    std::fs::write(dir.path().join("tls.key"), &second.key).unwrap();
    std::fs::write(dir.path().join("tls.crt"), &second.cert).unwrap();
    eventually("the reload", Duration::from_secs(10), || async {
        (webhook.certificates().cert_pem().as_deref() == Some(second.cert.as_str())).then_some(())
    })
    .await;
    round_trip(&mut connection).await;
    let mut fresh = HttpsConnection::connect(webhook.local_addr(), &second.ca_bundle, "127.0.0.1")
        .await
        .unwrap();
    round_trip(&mut fresh).await;
    webhook.stop().await.unwrap();
}

#[tokio::test]
async fn without_a_certificate_health_stays_not_serving() {
    control_plane().await;
    // The Secret's namespace does not exist, so no certificate can be stored or loaded.
    let (webhook, state) = start(managed(
        "no-such-namespace",
        Lifetimes::default(),
        Duration::from_millis(100),
        None,
    ))
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!state.is_serving());
    assert!(!webhook.certificates().is_loaded());
    let any_ca = serving::generate(
        &Sans::default(),
        Lifetimes::default(),
        time::OffsetDateTime::now_utc(),
    )
    .unwrap()
    .ca_bundle;
    assert!(
        HttpsConnection::connect(webhook.local_addr(), &any_ca, "127.0.0.1")
            .await
            .is_err(),
        "no handshake without a certificate"
    );
    webhook.stop().await.unwrap();
}
