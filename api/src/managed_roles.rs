//! The PostgreSQL roles a cluster's shards should hold, from its spec: the web UI's read-only
//! role, postgres_exporter's monitoring role, the application role and the declared ones. Pure: the resource-handler generates the
//! Secrets these name, the data-handler keeps the roles in PostgreSQL.

use k8s_openapi::jiff::Timestamp;

use crate::names;
use crate::v1alpha1::{
    ApplicationRoleConfig, MONITOR_ROLE, MultigresClusterSpec, PG_MONITOR, PostgresExporterConfig,
    RolePasswordSecret, SUPERUSER_EQUIVALENT_ROLES, WEB_UI_ROLE,
};

/// The tables the web UI reads (`web/multiadmin/lib/db.ts` in Multigres): all its role may
/// read.
pub const WEB_UI_READS: [&str; 2] = ["multigres.tablegroup", "multigres.shard"];

/// The key, in a generated role Secret, of the password.
pub const PASSWORD_KEY: &str = "password";

/// One role as every shard's PostgreSQL should hold it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredRole {
    /// Role name (a lowercase identifier, checked by admission).
    pub name: String,
    /// Whether it should exist; `false` drops it.
    pub present: bool,
    /// `LOGIN` or `NOLOGIN`.
    pub login: bool,
    /// `CONNECTION LIMIT`; -1 is none.
    pub connection_limit: i32,
    /// `VALID UNTIL`; `None` is never.
    pub valid_until: Option<Timestamp>,
    /// Roles it is a member of, sorted; other memberships are revoked.
    pub in_roles: Vec<String>,
    /// Where its password is; `None`: it has none.
    pub password: Option<PasswordSource>,
    /// Whether it owns the schema of its name (the application role).
    pub owns_schema: bool,
    /// Tables it may read (`schema.table`), granted once they exist.
    pub reads: Vec<String>,
}

/// A Secret key holding a role's password.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PasswordSource {
    /// Secret name, in the cluster's namespace.
    pub secret: String,
    /// Key in its data.
    pub key: String,
    /// Whether the resource-handler generates it (so a missing one is only not made yet).
    pub generated: bool,
}

impl PasswordSource {
    fn declared(secret: &RolePasswordSecret) -> Self {
        Self {
            secret: secret.name.clone(),
            key: secret.key().to_owned(),
            generated: false,
        }
    }

    fn generated(secret: String) -> Self {
        Self {
            secret,
            key: PASSWORD_KEY.to_owned(),
            generated: true,
        }
    }
}

/// A declared role that the API rules should have refused (an object stored before they
/// existed, or written around admission).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RoleSpecError {
    /// `validUntil` is no RFC 3339 time.
    #[error(
        "spec.roles[{name}].validUntil: {value:?} is not an RFC 3339 time such as 2027-01-01T00:00:00Z"
    )]
    ValidUntil { name: String, value: String },
    /// A name the operator keeps for itself, or a membership that would make a superuser.
    #[error("spec.roles[{name}]: {why}")]
    Reserved { name: String, why: String },
}

/// The superuser's name in `spec`.
pub fn superuser(spec: &MultigresClusterSpec) -> &str {
    spec.postgres_superuser
        .as_deref()
        .unwrap_or(crate::resolver::defaults::POSTGRES_SUPERUSER)
}

/// The application role's generated Secret, when the operator generates one.
pub fn generated_application_secret(spec: &MultigresClusterSpec, cluster: &str) -> Option<String> {
    let config = spec.application_role.as_ref();
    ApplicationRoleConfig::role_name(config)?;
    match config.and_then(|c| c.password_secret.as_ref()) {
        Some(_) => None,
        None => Some(names::application_role_secret(cluster)),
    }
}

/// Whether the cluster's pool pods run postgres_exporter, and so its monitoring role exists.
pub fn monitoring(spec: &MultigresClusterSpec) -> bool {
    PostgresExporterConfig::enabled(spec.observability.as_ref())
}

/// The roles of cluster `cluster` with `spec`, the operator's own first.
pub fn desired(
    spec: &MultigresClusterSpec,
    cluster: &str,
) -> Result<Vec<DesiredRole>, RoleSpecError> {
    let superuser = superuser(spec);
    let mut roles = vec![DesiredRole {
        name: WEB_UI_ROLE.to_owned(),
        present: true,
        login: true,
        connection_limit: -1,
        valid_until: None,
        in_roles: Vec::new(),
        password: Some(PasswordSource::generated(names::web_ui_role_secret(
            cluster,
        ))),
        owns_schema: false,
        reads: WEB_UI_READS.map(str::to_owned).to_vec(),
    }];
    // Present only while the exporter runs: no unused login role with a credential.
    roles.push(DesiredRole {
        name: MONITOR_ROLE.to_owned(),
        present: monitoring(spec),
        login: true,
        connection_limit: -1,
        valid_until: None,
        in_roles: vec![PG_MONITOR.to_owned()],
        password: Some(PasswordSource::generated(names::monitor_role_secret(
            cluster,
        ))),
        owns_schema: false,
        reads: Vec::new(),
    });
    let config = spec.application_role.as_ref();
    if let Some(name) = ApplicationRoleConfig::role_name(config) {
        let password = match config.and_then(|c| c.password_secret.as_ref()) {
            Some(secret) => PasswordSource::declared(secret),
            None => PasswordSource::generated(names::application_role_secret(cluster)),
        };
        roles.push(DesiredRole {
            name: name.to_owned(),
            present: true,
            login: true,
            connection_limit: -1,
            valid_until: None,
            in_roles: Vec::new(),
            password: Some(password),
            owns_schema: true,
            reads: Vec::new(),
        });
    }
    for role in &spec.roles {
        let reserved = |why: &str| RoleSpecError::Reserved {
            name: role.name.clone(),
            why: why.to_owned(),
        };
        if roles.iter().any(|r| r.name == role.name) || role.name == superuser {
            return Err(reserved(
                "the operator keeps a role of this name; choose another",
            ));
        }
        if role.name.starts_with("pg_") {
            return Err(reserved("names starting with pg_ are PostgreSQL's"));
        }
        if role.in_roles.iter().any(|r| {
            r == superuser || r == &role.name || SUPERUSER_EQUIVALENT_ROLES.contains(&r.as_str())
        }) {
            return Err(reserved(
                "inRoles names the superuser, the role itself or a superuser-equivalent role",
            ));
        }
        let valid_until = role
            .valid_until
            .as_ref()
            .map(|value| {
                value
                    .parse::<Timestamp>()
                    .map_err(|_| RoleSpecError::ValidUntil {
                        name: role.name.clone(),
                        value: value.clone(),
                    })
            })
            .transpose()?;
        let mut in_roles = role.in_roles.clone();
        in_roles.sort();
        in_roles.dedup();
        roles.push(DesiredRole {
            name: role.name.clone(),
            present: role.present(),
            login: role.login.unwrap_or(true),
            connection_limit: role.connection_limit.unwrap_or(-1),
            valid_until,
            in_roles,
            password: role.password_secret.as_ref().map(PasswordSource::declared),
            owns_schema: false,
            reads: Vec::new(),
        });
    }
    Ok(roles)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(yaml: &str) -> MultigresClusterSpec {
        serde_yaml::from_str(yaml).expect("valid spec")
    }

    const BASE: &str = "postgresPasswordSecretRef: {name: pw, key: password}\n";

    /// [`BASE`] as the webhook defaults a new cluster: with the exporter.
    const CREATED: &str = "postgresPasswordSecretRef: {name: pw, key: password}\n\
                           observability: {postgresExporter: {enabled: true}}\n";

    #[test]
    fn by_default_a_cluster_has_the_web_ui_role_and_an_application_role_with_a_generated_secret() {
        let roles = desired(&spec(CREATED), "shop").unwrap();
        let names: Vec<&str> = roles.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["multiadmin_web", "multigres_monitor", "app"]);
        let monitor = &roles[1];
        assert!(monitor.present && monitor.login && !monitor.owns_schema);
        assert_eq!(monitor.in_roles, ["pg_monitor"]);
        assert_eq!(
            monitor.password.as_ref().map(|p| p.secret.as_str()),
            Some("shop-monitor-role")
        );
        let app = &roles[2];
        assert!(app.owns_schema && app.login && app.present);
        assert_eq!(
            app.password,
            Some(PasswordSource {
                secret: "shop-app".into(),
                key: "password".into(),
                generated: true
            })
        );
        assert_eq!(roles[0].reads, ["multigres.tablegroup", "multigres.shard"]);
        assert_eq!(
            generated_application_secret(&spec(BASE), "shop").as_deref(),
            Some("shop-app")
        );
    }

    #[test]
    fn the_application_role_can_be_renamed_given_a_password_or_turned_off() {
        let own = spec(&format!(
            "{BASE}applicationRole: {{name: shop, passwordSecret: {{name: shop-pw, key: pw}}}}"
        ));
        let roles = desired(&own, "c").unwrap();
        assert_eq!(roles[2].name, "shop");
        assert_eq!(roles[2].password.as_ref().unwrap().secret, "shop-pw");
        assert_eq!(roles[2].password.as_ref().unwrap().key, "pw");
        assert!(!roles[2].password.as_ref().unwrap().generated);
        assert_eq!(generated_application_secret(&own, "c"), None);
        let off = spec(&format!("{BASE}applicationRole: {{enabled: false}}"));
        assert_eq!(desired(&off, "c").unwrap().len(), 2);
        assert_eq!(generated_application_secret(&off, "c"), None);
    }

    #[test]
    fn the_monitoring_role_goes_with_the_exporter() {
        let off = spec(&format!(
            "{BASE}observability: {{postgresExporter: {{enabled: false}}}}"
        ));
        let roles = desired(&off, "c").unwrap();
        assert_eq!(roles[1].name, "multigres_monitor");
        assert!(!roles[1].present);
        assert!(!monitoring(&off));
        assert!(monitoring(&spec(CREATED)));
        assert!(
            !monitoring(&spec(BASE)),
            "unset: a cluster created before the exporter runs none"
        );
    }

    #[test]
    fn declared_roles_get_their_defaults_and_sorted_memberships() {
        let declared = spec(&format!(
            "{BASE}roles:\n- name: reporting\n  inRoles: [pg_read_all_data, pg_monitor, pg_monitor]\n  \
             validUntil: '2027-01-01T00:00:00Z'\n  passwordSecret: {{name: reporting}}\n\
             - name: gone\n  ensure: absent\n  login: false\n  connectionLimit: 3\n"
        ));
        let roles = desired(&declared, "c").unwrap();
        let reporting = &roles[3];
        assert_eq!(reporting.in_roles, ["pg_monitor", "pg_read_all_data"]);
        assert_eq!(reporting.valid_until.unwrap().as_second(), 1_798_761_600);
        assert_eq!(reporting.password.as_ref().unwrap().key, "password");
        assert!(reporting.login && reporting.present && reporting.connection_limit == -1);
        let gone = &roles[4];
        assert!(!gone.present && !gone.login && gone.connection_limit == 3);
        assert_eq!(gone.password, None);
    }

    #[test]
    fn roles_admission_should_have_refused_are_refused_with_the_field() {
        for (yaml, message) in [
            (
                "roles: [{name: app}]",
                "spec.roles[app]: the operator keeps a role of this name",
            ),
            (
                "roles: [{name: postgres}]",
                "spec.roles[postgres]: the operator keeps",
            ),
            (
                "roles: [{name: multiadmin_web}]",
                "spec.roles[multiadmin_web]: the operator keeps",
            ),
            (
                "roles: [{name: multigres_monitor}]",
                "spec.roles[multigres_monitor]: the operator keeps",
            ),
            ("roles: [{name: pg_x}]", "names starting with pg_"),
            (
                "roles: [{name: r, inRoles: [postgres]}]",
                "inRoles names the superuser",
            ),
            (
                "roles: [{name: r, inRoles: [pg_read_server_files]}]",
                "superuser-equivalent",
            ),
            (
                "roles: [{name: r, validUntil: soon}]",
                "spec.roles[r].validUntil: \"soon\" is not an RFC 3339",
            ),
        ] {
            let error = desired(&spec(&format!("{BASE}{yaml}")), "c").unwrap_err();
            assert!(error.to_string().contains(message), "{yaml}: {error}");
        }
    }
}
