//! PostgreSQL configuration of a shard: the settings catalog, validation of the user's
//! `postgresConfig`, and the rendered `postgresql.conf` with the two fingerprints that decide
//! how a change is applied (a restart of every pod, replicas first, or a reload in place).
//! Pure: the caller reads any `postgresConfigRef` ConfigMap and passes its content in.

pub mod catalog;
pub mod conf;
pub mod connections;
pub mod limits;
pub mod policy;
mod render;
pub mod standby;
mod validate;

pub use render::{
    BASELINE, RenderError, Rendered, Resources, SERVER_CERT_DIR, Split, cluster_name, render,
    render_shard, serves_tls, split,
};
pub use validate::{Problem, validate};

/// Parameter appended to every rendered file with the fingerprint of the reload-class
/// settings, so whoever triggers a reload can check PostgreSQL read the current file (also
/// when a setting was removed).
pub const RELOAD_MARKER: &str = "multigres.config_reload_marker";

/// Annotation with the fingerprint of the restart-class settings: on the rendered ConfigMap and
/// the pool pod template (a change restarts the pods in order), hence on every pool pod.
pub const CONFIG_HASH_ANNOTATION: &str = "multigres.com/postgres-config-hash";

/// Annotation with the fingerprint of the reload-class settings: on the rendered ConfigMap, and
/// on a pool pod once its PostgreSQL confirmed it reloaded a file with those settings (stamped
/// by the data-handler). Never on the pod template, so a change restarts nothing.
pub const RELOAD_HASH_ANNOTATION: &str = "multigres.com/postgres-reload-hash";
