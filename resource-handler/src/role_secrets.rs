//! The Secrets of the PostgreSQL roles whose passwords the operator generates (see
//! [`multigres_api::managed_roles`]); the data-handler reads them with a GET and keeps the
//! roles in every shard's PostgreSQL:
//!
//! - `<cluster>-web-ui-role`, always: keys `username` ([`WEB_UI_ROLE`], `multiadmin_web`) and
//!   `password`. multiadmin-web logs in with it ([`crate::multiadmin::web`]), so the UI holds
//!   no superuser password;
//! - `<cluster>-monitor-role`, while pool pods run postgres_exporter: keys `username`
//!   ([`MONITOR_ROLE`], `multigres_monitor`, a member of `pg_monitor`) and `password`. Pool
//!   pods mount it and the exporter reads the password from the file;
//! - `<cluster>-app`, while the application role is on and `spec.applicationRole` names no
//!   `passwordSecret`: keys `username`, `password`, `dbname` (`postgres`), `host` (the
//!   cluster-wide gateway Service, `<cluster>-multigateway.<namespace>.svc`), `port` (its
//!   PostgreSQL port) and `uri`, a libpq connection URI of all of them, with `sslmode=require`
//!   where the gateways serve TLS and `sslmode=disable` where they do not (verifying the
//!   gateway takes its CA, the ConfigMap `<cluster>-gateway-ca`, and `sslmode=verify-full`).
//!
//! A password is generated once, when the Secret has none (it does not exist, or its
//! `password` key is missing or empty): 32 alphanumeric characters from the operating
//! system's random source, so it never needs escaping in a URI or in SQL. One that is there is
//! never changed (an application may be using it, and a user may have set it); only the other
//! keys follow the spec, and the `uri` the stored password. Nothing is written when nothing
//! changed.
//!
//! The Secrets carry the operator's labels (component [`COMPONENT_VALUE`]), so the labelled
//! Secret cache sees them and the multiadmin controller is woken when one is edited or
//! deleted, and a controller owner reference to the MultigresCluster: they go with the
//! cluster. A Secret the cluster no longer wants (the user named their own `passwordSecret`,
//! or turned the application role off) is left in place: an application may still use the
//! credential, and the role may still exist in PostgreSQL.
//!
//! No password (nor any other key's value) appears in a log line, an event or an error: they
//! name the Secret only.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::Resource;
use kube::api::Api;
use kube::runtime::events::EventType;
use multigres_api::labels::{self, COMPONENT, Component, Placement};
use multigres_api::managed_roles::{self, PASSWORD_KEY};
use multigres_api::owner::Owner;
use multigres_api::v1alpha1::{
    ApplicationRoleConfig, GatewayTlsConfig, MONITOR_ROLE, MultigresClusterSpec, WEB_UI_ROLE,
};
use rand::TryRngCore;
use rand::rand_core::OsError;
use rand::rngs::OsRng;

use crate::contract::POSTGRES_PORT;
use crate::controller::Ctx;
use crate::sync::{self, SyncError};

/// `app.kubernetes.io/component` of the generated role Secrets. No other component's prune
/// deletes Secrets of this one.
pub const COMPONENT_VALUE: &str = "postgres-role";
/// The role's name.
pub const USERNAME_KEY: &str = "username";
/// The database to connect to.
pub const DBNAME_KEY: &str = "dbname";
/// The in-cluster DNS name of the cluster-wide gateway Service.
pub const HOST_KEY: &str = "host";
/// Its PostgreSQL port.
pub const PORT_KEY: &str = "port";
/// A libpq connection URI of the other keys.
pub const URI_KEY: &str = "uri";
/// Length of a generated password.
pub const PASSWORD_LENGTH: usize = 32;
/// Type of a Secret this module creates.
const OPAQUE: &str = "Opaque";

/// Where an application reaches the cluster, for the keys of the application role's Secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Connection {
    /// The cluster-wide gateway Service's in-cluster DNS name.
    pub host: String,
    /// Its PostgreSQL port.
    pub port: i32,
    /// The database.
    pub dbname: String,
    /// Whether the gateways serve TLS (`sslmode=require` in the URI).
    pub tls: bool,
}

/// One generated role Secret as the spec wants it, apart from its password.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wanted {
    /// The Secret's name.
    pub name: String,
    /// The role's name (`username`).
    pub username: String,
    /// The connection keys; `None`: the Secret holds the role's name and password only.
    pub connection: Option<Connection>,
}

/// The generated role Secrets cluster `cluster` in `namespace` with `spec` wants: the web UI
/// role's, the monitoring role's while the exporter runs, then the application role's when the
/// operator generates its password.
pub fn wanted(spec: &MultigresClusterSpec, cluster: &str, namespace: &str) -> Vec<Wanted> {
    let mut out = vec![Wanted {
        name: multigres_api::names::web_ui_role_secret(cluster),
        username: WEB_UI_ROLE.to_owned(),
        connection: None,
    }];
    if managed_roles::monitoring(spec) {
        out.push(Wanted {
            name: multigres_api::names::monitor_role_secret(cluster),
            username: MONITOR_ROLE.to_owned(),
            connection: None,
        });
    }
    let application = ApplicationRoleConfig::role_name(spec.application_role.as_ref());
    let secret = managed_roles::generated_application_secret(spec, cluster);
    if let (Some(username), Some(name)) = (application, secret) {
        out.push(Wanted {
            name,
            username: username.to_owned(),
            connection: Some(Connection {
                host: format!(
                    "{}.{namespace}.svc",
                    crate::names::cluster_multigateway(cluster)
                ),
                port: POSTGRES_PORT,
                dbname: multigres_api::DEFAULT_DATABASE.to_owned(),
                tls: GatewayTlsConfig::is_enabled(spec.gateway_tls.as_ref()),
            }),
        });
    }
    out
}

/// The password `secret` holds, unless it has none: no Secret, no `password` key, or an
/// empty one.
pub fn stored_password(secret: Option<&Secret>) -> Option<&[u8]> {
    let password = secret?.data.as_ref()?.get(PASSWORD_KEY)?;
    (!password.0.is_empty()).then_some(password.0.as_slice())
}

/// `bytes` percent-encoded for the user-information part of a URI: everything but the
/// unreserved characters (RFC 3986) is escaped, so a password a user set by hand with `@`,
/// `:` or `/` in it still makes a valid URI. A generated one is left as it is.
fn encode_userinfo(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for &b in bytes {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The libpq connection URI of role `username` with `password` at `connection`.
pub fn uri(username: &str, password: &[u8], connection: &Connection) -> String {
    let Connection {
        host,
        port,
        dbname,
        tls,
    } = connection;
    let sslmode = if *tls { "require" } else { "disable" };
    format!(
        "postgresql://{}:{}@{host}:{port}/{dbname}?sslmode={sslmode}",
        encode_userinfo(username.as_bytes()),
        encode_userinfo(password),
    )
}

/// A fresh password: [`PASSWORD_LENGTH`] characters drawn uniformly from `[A-Za-z0-9]` with
/// the operating system's random source.
pub fn generate_password() -> Result<String, OsError> {
    generate_password_with(|buf| OsRng.try_fill_bytes(buf))
}

/// [`generate_password`] with the random bytes of `fill`. A byte maps to one of the 62
/// characters only below 248 (4 × 62), so every character is equally likely.
fn generate_password_with<E>(
    mut fill: impl FnMut(&mut [u8]) -> Result<(), E>,
) -> Result<String, E> {
    const ALPHABET: &[u8; 62] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    const LIMIT: u8 = 248;
    let mut password = String::with_capacity(PASSWORD_LENGTH);
    let mut buf = [0u8; 64];
    while password.len() < PASSWORD_LENGTH {
        fill(&mut buf)?;
        for &b in buf.iter().filter(|&&b| b < LIMIT) {
            if password.len() == PASSWORD_LENGTH {
                break;
            }
            password.push(char::from(ALPHABET[usize::from(b % 62)]));
        }
    }
    Ok(password)
}

/// What to apply for one generated role Secret.
#[derive(Clone, Debug)]
pub struct Planned {
    /// The Secret, complete for every key this handler owns.
    pub secret: Secret,
    /// Whether its password is a new one (none was stored).
    pub generated: bool,
}

/// The Secret `wanted` as it should be stored, given the `stored` one: its password kept when
/// it has one, else one from `generate`; every other key from `wanted`. Pure apart from
/// `generate`, which is called only when a password is needed.
pub fn plan<E>(
    owner: &Owner,
    wanted: &Wanted,
    stored: Option<&Secret>,
    generate: impl FnOnce() -> Result<String, E>,
) -> Result<Planned, E> {
    let (password, generated) = match stored_password(stored) {
        Some(kept) => (kept.to_vec(), false),
        None => (generate()?.into_bytes(), true),
    };
    let text = |v: String| ByteString(v.into_bytes());
    let mut data = BTreeMap::from([(USERNAME_KEY.to_owned(), text(wanted.username.clone()))]);
    if let Some(connection) = &wanted.connection {
        data.extend([
            (DBNAME_KEY.to_owned(), text(connection.dbname.clone())),
            (HOST_KEY.to_owned(), text(connection.host.clone())),
            (PORT_KEY.to_owned(), text(connection.port.to_string())),
            (
                URI_KEY.to_owned(),
                text(uri(&wanted.username, &password, connection)),
            ),
        ]);
    }
    data.insert(PASSWORD_KEY.to_owned(), ByteString(password));
    let mut labels = labels::labels(&owner.cluster, Component::Multiadmin, &Placement::default());
    labels.insert(COMPONENT.to_owned(), COMPONENT_VALUE.to_owned());
    // A Secret's type cannot change: one made by someone else keeps its own.
    let type_ = stored
        .and_then(|s| s.type_.clone())
        .unwrap_or_else(|| OPAQUE.to_owned());
    Ok(Planned {
        secret: Secret {
            metadata: crate::stateless::metadata(&wanted.name, owner, &labels),
            type_: Some(type_),
            data: Some(data),
            ..Default::default()
        },
        generated,
    })
}

/// Why a generated role Secret could not be ensured; always transient. Each names the Secret,
/// never what it holds.
#[derive(Debug, thiserror::Error)]
pub enum RoleSecretError {
    /// Reading the Secret (not in the cache) failed.
    #[error("reading Secret {name}")]
    Read {
        /// The Secret.
        name: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// The operating system's random source failed.
    #[error("generating the password of Secret {name}")]
    Generate {
        /// The Secret.
        name: String,
        /// The random source's error.
        #[source]
        source: OsError,
    },
    /// Writing the Secret failed.
    #[error("writing Secret {name}")]
    Write {
        /// The Secret.
        name: String,
        /// The API error.
        #[source]
        source: SyncError,
    },
}

/// Ensures the generated role Secrets of the cluster `owner` stands for, with `spec`; reports
/// the passwords generated (by role and Secret name) as one event on `obj`: an event per
/// password would be one Event patched into a series per role, a write each, whose note keeps
/// only the last role.
pub async fn reconcile<K>(
    ctx: &Ctx<K>,
    obj: &K,
    owner: &Owner,
    spec: &MultigresClusterSpec,
) -> Result<(), RoleSecretError>
where
    K: Resource<DynamicType = ()>,
{
    let ns = owner.namespace.as_str();
    let api = Api::<Secret>::namespaced(ctx.client.clone(), ns);
    let cached = crate::tls::cached(ctx, ns);
    let mut generated = Vec::new();
    // The passwords already generated are announced also when a later Secret fails: the next
    // reconcile finds them stored and would never say they were generated.
    let result = async {
        for wanted in wanted(spec, &owner.cluster, ns) {
            let name = wanted.name.clone();
            let stored = match cached(&name) {
                Some(secret) => Some(secret),
                // Not in the cache (not made yet, or its labels were removed): only a GET tells
                // whether it exists, so that a stored password is never replaced.
                None => api
                    .get_opt(&name)
                    .await
                    .map_err(|source| RoleSecretError::Read {
                        name: name.clone(),
                        source,
                    })?,
            };
            let planned =
                plan(owner, &wanted, stored.as_ref(), generate_password).map_err(|source| {
                    RoleSecretError::Generate {
                        name: name.clone(),
                        source,
                    }
                })?;
            let fresh = planned.generated;
            sync::ensure(ctx.kit.name, &api, &ctx.stores.secrets, planned.secret)
                .await
                .map_err(|source| RoleSecretError::Write {
                    name: name.clone(),
                    source,
                })?;
            if fresh {
                let note = format!(
                    "generated the password of PostgreSQL role {} in Secret {name}",
                    wanted.username
                );
                tracing::info!(cluster = %owner.cluster, namespace = ns, secret = %name, "{note}");
                generated.push(note);
            }
        }
        Ok(())
    }
    .await;
    if !generated.is_empty() {
        ctx.kit
            .event(
                obj,
                EventType::Normal,
                "PasswordGenerated",
                generated.join("; "),
            )
            .await;
    }
    result
}

#[cfg(test)]
mod tests {
    use multigres_api::v1alpha1::{
        MultigresCluster, ObservabilityConfig, PostgresExporterConfig, RolePasswordSecret,
    };

    use super::*;

    fn cluster() -> MultigresCluster {
        serde_yaml::from_str(include_str!("../fixtures/cluster-external-topo.yaml")).unwrap()
    }

    fn owner(c: &MultigresCluster) -> Owner {
        Owner::with_cluster(c, "prod".into()).unwrap()
    }

    fn fixed(password: &str) -> impl FnOnce() -> Result<String, std::convert::Infallible> {
        let password = password.to_owned();
        move || Ok(password)
    }

    fn never() -> Result<String, std::convert::Infallible> {
        panic!("a stored password must be kept, not replaced")
    }

    fn value(secret: &Secret, key: &str) -> String {
        let data = secret.data.as_ref().unwrap();
        String::from_utf8(data[key].0.clone()).unwrap()
    }

    fn keys(secret: &Secret) -> Vec<&str> {
        let data = secret.data.as_ref().unwrap();
        data.keys().map(String::as_str).collect()
    }

    fn app(c: &MultigresCluster) -> Wanted {
        wanted(&c.spec, "prod", "db").pop().unwrap()
    }

    #[test]
    fn a_default_cluster_wants_the_web_ui_monitoring_and_application_secrets() {
        let c = cluster();
        let wanted = wanted(&c.spec, "prod", "db");
        assert_eq!(
            wanted,
            [
                Wanted {
                    name: "prod-web-ui-role".into(),
                    username: "multiadmin_web".into(),
                    connection: None,
                },
                Wanted {
                    name: "prod-monitor-role".into(),
                    username: "multigres_monitor".into(),
                    connection: None,
                },
                Wanted {
                    name: "prod-app".into(),
                    username: "app".into(),
                    connection: Some(Connection {
                        host: "prod-multigateway.db.svc".into(),
                        port: 5432,
                        dbname: "postgres".into(),
                        tls: true,
                    }),
                },
            ]
        );
    }

    #[test]
    fn no_application_secret_for_a_users_password_or_a_disabled_role() {
        let mut c = cluster();
        c.spec.application_role = Some(ApplicationRoleConfig {
            password_secret: Some(RolePasswordSecret {
                name: "mine".into(),
                key: None,
            }),
            ..Default::default()
        });
        let names = |c: &MultigresCluster| -> Vec<String> {
            wanted(&c.spec, "prod", "db")
                .into_iter()
                .map(|w| w.name)
                .collect()
        };
        assert_eq!(names(&c), ["prod-web-ui-role", "prod-monitor-role"]);
        c.spec.application_role = Some(ApplicationRoleConfig {
            enabled: Some(false),
            ..Default::default()
        });
        assert_eq!(names(&c), ["prod-web-ui-role", "prod-monitor-role"]);
    }

    #[test]
    fn no_monitoring_secret_without_the_exporter() {
        let mut c = cluster();
        c.spec.observability = Some(ObservabilityConfig {
            postgres_exporter: Some(PostgresExporterConfig {
                enabled: Some(false),
                ..Default::default()
            }),
            ..Default::default()
        });
        let names: Vec<String> = wanted(&c.spec, "prod", "db")
            .into_iter()
            .map(|w| w.name)
            .collect();
        assert_eq!(names, ["prod-web-ui-role", "prod-app"]);
    }

    #[test]
    fn the_application_secret_holds_every_connection_key() {
        let c = cluster();
        let planned = plan(&owner(&c), &app(&c), None, fixed("Abc123")).unwrap();
        assert!(planned.generated);
        let s = &planned.secret;
        assert_eq!(
            keys(s),
            ["dbname", "host", "password", "port", "uri", "username"]
        );
        assert_eq!(value(s, "username"), "app");
        assert_eq!(value(s, "password"), "Abc123");
        assert_eq!(value(s, "dbname"), "postgres");
        assert_eq!(value(s, "host"), "prod-multigateway.db.svc");
        assert_eq!(value(s, "port"), "5432");
        assert_eq!(
            value(s, "uri"),
            "postgresql://app:Abc123@prod-multigateway.db.svc:5432/postgres?sslmode=require"
        );
        assert_eq!(s.type_.as_deref(), Some("Opaque"));
        assert_eq!(s.metadata.name.as_deref(), Some("prod-app"));
        assert_eq!(s.metadata.namespace.as_deref(), Some("db"));
        let labels = s.metadata.labels.as_ref().unwrap();
        assert_eq!(labels["app.kubernetes.io/managed-by"], "multigres-operator");
        assert_eq!(labels["app.kubernetes.io/component"], "postgres-role");
        assert_eq!(labels["multigres.com/cluster"], "prod");
        let owners = s.metadata.owner_references.as_ref().unwrap();
        assert_eq!(
            (
                owners[0].kind.as_str(),
                owners[0].name.as_str(),
                owners[0].controller
            ),
            ("MultigresCluster", "prod", Some(true))
        );
    }

    #[test]
    fn the_web_ui_secret_holds_its_role_and_password_only() {
        let c = cluster();
        let web = wanted(&c.spec, "prod", "db").remove(0);
        let planned = plan(&owner(&c), &web, None, fixed("Xyz789")).unwrap();
        let s = &planned.secret;
        assert_eq!(s.metadata.name.as_deref(), Some("prod-web-ui-role"));
        assert_eq!(keys(s), ["password", "username"]);
        assert_eq!(value(s, "username"), "multiadmin_web");
        assert_eq!(value(s, "password"), "Xyz789");
    }

    #[test]
    fn a_stored_password_is_kept_and_the_other_keys_follow_the_spec() {
        let mut c = cluster();
        let first = plan(&owner(&c), &app(&c), None, fixed("Abc123"))
            .unwrap()
            .secret;
        // The role is renamed and client TLS turned off.
        c.spec.application_role = Some(ApplicationRoleConfig {
            name: Some("shop".into()),
            ..Default::default()
        });
        c.spec.gateway_tls = Some(serde_yaml::from_str("{enabled: false}").unwrap());
        let again = plan(&owner(&c), &app(&c), Some(&first), never).unwrap();
        assert!(!again.generated);
        let s = &again.secret;
        assert_eq!(value(s, "password"), "Abc123");
        assert_eq!(value(s, "username"), "shop");
        assert_eq!(
            value(s, "uri"),
            "postgresql://shop:Abc123@prod-multigateway.db.svc:5432/postgres?sslmode=disable"
        );
    }

    #[test]
    fn an_unchanged_spec_plans_the_same_secret() {
        let c = cluster();
        let first = plan(&owner(&c), &app(&c), None, fixed("Abc123"))
            .unwrap()
            .secret;
        let again = plan(&owner(&c), &app(&c), Some(&first), never)
            .unwrap()
            .secret;
        assert_eq!(again, first, "nothing to write");
    }

    #[test]
    fn a_missing_or_empty_password_is_generated_again() {
        let c = cluster();
        let mut emptied = plan(&owner(&c), &app(&c), None, fixed("Abc123"))
            .unwrap()
            .secret;
        emptied
            .data
            .as_mut()
            .unwrap()
            .insert(PASSWORD_KEY.into(), ByteString(Vec::new()));
        let planned = plan(&owner(&c), &app(&c), Some(&emptied), fixed("New456")).unwrap();
        assert!(planned.generated);
        assert_eq!(value(&planned.secret, "password"), "New456");
        emptied.data.as_mut().unwrap().remove(PASSWORD_KEY);
        let planned = plan(&owner(&c), &app(&c), Some(&emptied), fixed("New789")).unwrap();
        assert!(planned.generated);
        assert!(value(&planned.secret, "uri").contains(":New789@"));
    }

    #[test]
    fn a_password_set_by_hand_is_kept_and_escaped_in_the_uri() {
        let c = cluster();
        let stored = Secret {
            type_: Some("kubernetes.io/basic-auth".into()),
            data: Some(BTreeMap::from([(
                PASSWORD_KEY.to_owned(),
                ByteString(b"p@ss:w/rd %".to_vec()),
            )])),
            ..Default::default()
        };
        let planned = plan(&owner(&c), &app(&c), Some(&stored), never).unwrap();
        let s = &planned.secret;
        assert_eq!(value(s, "password"), "p@ss:w/rd %");
        assert_eq!(
            value(s, "uri"),
            "postgresql://app:p%40ss%3Aw%2Frd%20%25@prod-multigateway.db.svc:5432/postgres?sslmode=require"
        );
        assert_eq!(
            s.type_.as_deref(),
            Some("kubernetes.io/basic-auth"),
            "a Secret's type cannot change"
        );
    }

    #[test]
    fn generated_passwords_are_32_alphanumeric_characters() {
        let a = generate_password().unwrap();
        let b = generate_password().unwrap();
        for p in [&a, &b] {
            assert_eq!(p.len(), PASSWORD_LENGTH);
            assert!(p.bytes().all(|b| b.is_ascii_alphanumeric()), "{p}");
        }
        assert_ne!(a, b);
    }

    #[test]
    fn bytes_past_the_last_whole_alphabet_are_skipped() {
        // 248..=255 would favour the first eight characters: they are drawn again.
        let mut calls = 0;
        let password = generate_password_with(|buf: &mut [u8]| {
            calls += 1;
            let fill = if calls == 1 { 255 } else { 62 + 1 };
            buf.fill(fill);
            Ok::<_, std::convert::Infallible>(())
        })
        .unwrap();
        assert_eq!(calls, 2);
        assert_eq!(password, "B".repeat(PASSWORD_LENGTH));
    }
}
