//! How the data-handler reaches a cluster's multipoolers. Without internal TLS it dials them in
//! plaintext. With `spec.internalTLS.enabled` they require a client certificate of the
//! cluster's internal CA, and the data-handler presents its own: the resource-handler issues it
//! with the processes' certificates, in Secret `data-handler.<cluster>.<namespace>.multigres.internal`
//! (client and server usage, no other name), and the data-handler reads it with a get, at most
//! once a minute per cluster. It verifies each multipooler as the Multigres processes do, by
//! the multipooler identity `multipooler.<cluster>.<namespace>.multigres.internal`.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use multigres_api::names;
use multigres_api::v1alpha1::{InternalTlsConfig, Shard};
use multigres_proto::multipooler::multipoolermanager::multipooler_manager_client::MultipoolerManagerClient;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::reload::RpcError;

/// Time allowed to connect to a multipooler.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a read client certificate is used before the Secret is read again. The
/// resource-handler renews a certificate 30 days before it ends, so a minute is never late.
pub const REREAD: Duration = Duration::from_secs(60);
/// The Secret keys of the client certificate (a `kubernetes.io/tls` Secret plus its CA).
const KEYS: [&str; 3] = ["ca.crt", "tls.crt", "tls.key"];

/// How to dial one cluster's multipoolers.
#[derive(Clone, Debug)]
pub enum Dial {
    /// Plaintext: internal TLS is off.
    Plain,
    /// Mutual TLS with the data-handler's client certificate.
    Tls(ClientTlsConfig),
    /// Internal TLS is on but the client certificate cannot be read yet: every call fails
    /// with this reason (the resource-handler has not issued it, or the Secret is incomplete).
    Unavailable(String),
}

impl Dial {
    /// A `MultipoolerManager` client of the multipooler at `address` (`http://<host>:<port>`,
    /// as [`crate::reload::address`] gives it; dialled as `https` with TLS), whose calls may
    /// take up to `timeout`.
    pub async fn connect(
        &self,
        address: &str,
        timeout: Duration,
    ) -> Result<MultipoolerManagerClient<Channel>, RpcError> {
        self.channel(address, timeout)
            .await
            .map(MultipoolerManagerClient::new)
    }

    /// A connection to the multipooler at `address`, for any of its services.
    pub async fn channel(&self, address: &str, timeout: Duration) -> Result<Channel, RpcError> {
        let invalid = |source| RpcError::Address {
            address: address.to_owned(),
            source,
        };
        let endpoint = match self {
            Dial::Plain => Endpoint::from_shared(address.to_owned()).map_err(invalid)?,
            Dial::Tls(config) => {
                let tls = address.replacen("http://", "https://", 1);
                Endpoint::from_shared(tls)
                    .and_then(|e| e.tls_config(config.clone()))
                    .map_err(invalid)?
            }
            Dial::Unavailable(reason) => {
                return Err(RpcError::Credentials {
                    address: address.to_owned(),
                    reason: reason.clone(),
                });
            }
        };
        endpoint
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(timeout)
            .connect()
            .await
            .map_err(|source| RpcError::Connect {
                address: address.to_owned(),
                source,
            })
    }
}

/// The client certificates read so far, per cluster.
pub struct Credentials {
    client: kube::Client,
    read: Mutex<HashMap<String, (Instant, ClientTlsConfig)>>,
}

impl Credentials {
    /// Credentials whose Secrets are read with `client`.
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            read: Mutex::new(HashMap::new()),
        }
    }

    /// How to dial the multipoolers of `shard`, of cluster `cluster` in `namespace`.
    pub async fn dial(&self, shard: &Shard, namespace: &str, cluster: &str) -> Dial {
        if !InternalTlsConfig::is_enabled(shard.spec.internal_tls.as_ref()) {
            return Dial::Plain;
        }
        let slot = format!("{namespace}/{cluster}");
        if let Some((at, config)) = self.read.lock().expect("not poisoned").get(&slot)
            && at.elapsed() < REREAD
        {
            return Dial::Tls(config.clone());
        }
        let name = names::data_handler_client_tls(cluster, namespace);
        let secret = Api::<Secret>::namespaced(self.client.clone(), namespace)
            .get_opt(&name)
            .await;
        let config = match secret {
            Ok(Some(secret)) => client_config(&secret, cluster, namespace),
            Ok(None) => Err(
                "not issued yet (the resource-handler issues it with the cluster's \
                             internal certificates)"
                    .to_owned(),
            ),
            Err(error) => Err(format!("cannot be read: {error}")),
        };
        match config {
            Ok(config) => {
                let stored = (Instant::now(), config.clone());
                let mut read = self.read.lock().expect("not poisoned");
                // Expired entries would be read again anyway: dropping them keeps clusters
                // deleted long ago out of memory.
                read.retain(|_, (at, _)| at.elapsed() < REREAD);
                read.insert(slot, stored);
                Dial::Tls(config)
            }
            Err(why) => Dial::Unavailable(format!(
                "the data-handler's client certificate, Secret {namespace}/{name}, {why}"
            )),
        }
    }
}

/// The TLS settings from the client certificate Secret of `cluster`: pure.
fn client_config(
    secret: &Secret,
    cluster: &str,
    namespace: &str,
) -> Result<ClientTlsConfig, String> {
    let data = secret.data.clone().unwrap_or_default();
    let [ca, cert, key] = KEYS.map(|k| data.get(k).map(|b| b.0.clone()).filter(|b| !b.is_empty()));
    match (ca, cert, key) {
        (Some(ca), Some(cert), Some(key)) => Ok(ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(ca))
            .identity(Identity::from_pem(cert, key))
            .domain_name(names::internal_identity("multipooler", cluster, namespace))),
        _ => Err(format!("lacks one of the keys {}", KEYS.join(", "))),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::ByteString;

    use super::*;

    #[test]
    fn an_incomplete_secret_names_the_keys_it_needs() {
        let mut secret = Secret {
            data: Some(BTreeMap::from([(
                "ca.crt".to_owned(),
                ByteString(b"pem".to_vec()),
            )])),
            ..Default::default()
        };
        let error = client_config(&secret, "c", "ns").unwrap_err();
        assert_eq!(error, "lacks one of the keys ca.crt, tls.crt, tls.key");
        for key in ["tls.crt", "tls.key"] {
            secret
                .data
                .as_mut()
                .unwrap()
                .insert(key.to_owned(), ByteString(b"pem".to_vec()));
        }
        assert!(client_config(&secret, "c", "ns").is_ok());
    }

    #[tokio::test]
    async fn an_unavailable_certificate_fails_each_call_with_its_reason() {
        let dial = Dial::Unavailable("Secret ns/x not issued yet".into());
        let error = dial
            .connect("http://p-0.svc:15270", Duration::from_secs(1))
            .await
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            "no client certificate to call the multipooler at http://p-0.svc:15270: Secret \
             ns/x not issued yet"
        );
        assert!(!error.is_invalid(), "the Secret may come: try again");
    }
}
