//! The rendered `postgresql.conf` of a shard: the operator's defaults (some sized from the
//! pools' memory, CPU and disk), then the `postgresConfigRef` content verbatim, then the
//! `postgresConfig` map; later lines win, as PostgreSQL reads them. The effective settings are
//! split into those that need a restart and those a reload applies, each with a fingerprint.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use sha2::{Digest, Sha256};

use super::RELOAD_MARKER;
use super::catalog;
use super::conf::{self, SyntaxError, quote};
use super::connections::{PoolCapacity, pool_capacity};
use super::limits;
use super::standby::{self, Held, StandbySettings};
use super::validate::{Problem, validate};
use crate::quantity::Quantity;
use crate::resolver::defaults;
use crate::v1alpha1::{PostgresConfigRef, ShardSpec};

/// Settings every shard gets whatever its size: Multigres' requirements (logical WAL, SCRAM)
/// and upstream's defaults for logging, locale and extensions, except `log_statement`.
///
/// `log_statement` is `none`, where pgctld's template has `ddl`: `ddl` logs every
/// `CREATE ROLE`/`ALTER ROLE … PASSWORD '…'` with the password in clear text, and the logs are
/// the container's, readable by anyone with `pods/log` and kept by log collectors. PostgreSQL
/// cannot log DDL but hide passwords (CloudNativePG documents the same leak and turns statement
/// logging off around the passwords it sets itself). A user may still choose `ddl`, `mod` or
/// `all` in `postgresConfig`; admission warns what that logs.
pub const BASELINE: [(&str, &str); 32] = [
    ("authentication_timeout", "1min"),
    ("auto_explain.log_min_duration", "10s"),
    ("checkpoint_completion_target", "0.9"),
    ("checkpoint_flush_after", "256kB"),
    ("cron.database_name", "postgres"),
    ("default_statistics_target", "100"),
    ("default_text_search_config", "pg_catalog.english"),
    ("effective_io_concurrency", "0"),
    ("hot_standby_feedback", "on"),
    ("jit_provider", "llvmjit"),
    ("lc_messages", "en_US.UTF-8"),
    ("lc_monetary", "en_US.UTF-8"),
    ("lc_numeric", "en_US.UTF-8"),
    ("lc_time", "en_US.UTF-8"),
    ("log_line_prefix", "%h %m [%p] %q%u@%d "),
    ("log_statement", "none"),
    ("log_timezone", "UTC"),
    ("max_connections", "60"),
    ("max_replication_slots", "25"),
    ("max_wal_senders", "25"),
    ("password_encryption", "scram-sha-256"),
    ("random_page_cost", "1.1"),
    ("row_security", "on"),
    ("ssl", "off"),
    ("ssl_ciphers", "HIGH:MEDIUM:+3DES:!aNULL"),
    ("ssl_ecdh_curve", "prime256v1"),
    ("ssl_min_protocol_version", "TLSv1.2"),
    ("ssl_passphrase_command_supports_reload", "off"),
    ("ssl_prefer_server_ciphers", "on"),
    ("timezone", "UTC"),
    ("wal_level", "logical"),
    ("wal_log_hints", "on"),
];

/// Where a pool pod's PostgreSQL finds the certificate it serves: the shard's pgBackRest
/// certificate (`pgbackrest.crt`, `pgbackrest.key`; its CA signs every pool pod's names),
/// mounted whenever the shard has backups, which every resolved shard has.
pub const SERVER_CERT_DIR: &str = "/certs/pgbackrest";

/// The settings that make PostgreSQL serve TLS with the shard's certificate (replacing the
/// baseline's `ssl = off`). Replicas ask for it by default (`sslmode=prefer` in the
/// `primary_conninfo` multipooler writes), and pg_hba admits replication over TLS only.
fn server_tls() -> [(&'static str, String); 3] {
    [
        ("ssl", "on".to_owned()),
        ("ssl_cert_file", format!("{SERVER_CERT_DIR}/pgbackrest.crt")),
        ("ssl_key_file", format!("{SERVER_CERT_DIR}/pgbackrest.key")),
    ]
}

/// Whether the pool pods of a shard hold a server certificate (see [`SERVER_CERT_DIR`]).
pub fn serves_tls(spec: &ShardSpec) -> bool {
    spec.backup.is_some()
}

/// Connections the sizing divides memory among (the baseline `max_connections`).
const SIZING_CONNECTIONS: u64 = 60;
/// WAL segment size in MB (PostgreSQL's default).
const WAL_SEGMENT_MB: u64 = 16;
const KB: u64 = 1024;
const MB_IN_KB: u64 = 1024;
const GB_IN_KB: u64 = 1024 * 1024;

/// What the sizing reads from a shard's pools.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Resources {
    /// Largest postgres container memory over the pools (limit, else request), in bytes.
    pub memory_bytes: Option<u64>,
    /// Largest postgres container CPU over the pools (limit, else request), in millicores.
    pub cpu_millis: Option<u64>,
    /// Smallest data volume over the pools, in bytes.
    pub disk_bytes: Option<u64>,
    /// Smallest postgres container memory limit over the pools that set one, in bytes: the
    /// shared memory of every pod must fit it.
    pub memory_limit_bytes: Option<u64>,
}

impl Resources {
    /// The inputs of a shard: every pod of every pool must fit the rendered file.
    pub fn of_shard(spec: &ShardSpec) -> Self {
        let mut resources = Resources::default();
        for pool in spec.pools.values() {
            let req = pool.postgres.as_ref().and_then(|c| c.resources.as_ref());
            let amount = |name: &str| {
                req.and_then(|r| {
                    let limit = r.limits.as_ref().and_then(|l| l.get(name));
                    limit
                        .or_else(|| r.requests.as_ref().and_then(|l| l.get(name)))
                        .and_then(|q| quantity(&q.0))
                })
            };
            let limit = req
                .and_then(|r| r.limits.as_ref()?.get("memory"))
                .and_then(|q| quantity(&q.0))
                .map(floor);
            if let Some(limit) = limit {
                let smallest = resources.memory_limit_bytes.map_or(limit, |l| l.min(limit));
                resources.memory_limit_bytes = Some(smallest);
            }
            let max = |a: Option<u64>, b: Option<u64>| a.max(b);
            resources.memory_bytes = max(resources.memory_bytes, amount("memory").map(floor));
            resources.cpu_millis = max(
                resources.cpu_millis,
                amount("cpu").map(|cores| floor(cores * 1000.0)),
            );
            let size = pool
                .storage
                .as_ref()
                .and_then(|s| s.size.as_deref())
                .unwrap_or(defaults::POOL_STORAGE);
            if let Some(bytes) = quantity(size).map(floor) {
                resources.disk_bytes = Some(resources.disk_bytes.map_or(bytes, |d| d.min(bytes)));
            }
        }
        resources
    }

    /// The settings sized from these resources; sizes without an input keep the baseline.
    fn sized(&self) -> BTreeMap<&'static str, String> {
        let mut workers = 6;
        let mut parallel = 2;
        let mut per_gather = 1;
        let mut maintenance_workers = 1;
        if let Some(cores) = self.cpu_millis.map(|m| m / 1000).filter(|c| *c >= 4) {
            (workers, parallel) = (cores, cores);
            per_gather = cores / 2;
            maintenance_workers = (cores / 2).min(4);
        }
        let mut memory = BTreeMap::from([
            ("shared_buffers", 64 * MB_IN_KB),
            ("effective_cache_size", 192 * MB_IN_KB),
            ("maintenance_work_mem", 16 * MB_IN_KB),
            ("wal_buffers", 1920),
            ("work_mem", 1092),
        ]);
        if let Some(total) = self.memory_bytes.map(|b| b / KB).filter(|kb| *kb > 0) {
            let shared = total / 4;
            memory.insert("shared_buffers", shared);
            memory.insert("effective_cache_size", total * 3 / 4);
            memory.insert("maintenance_work_mem", (total / 16).min(2 * GB_IN_KB));
            memory.insert("wal_buffers", (shared * 3 / 100).clamp(32, 16 * MB_IN_KB));
            let work = (total - shared) / (SIZING_CONNECTIONS * 3) / per_gather.max(1);
            memory.insert("work_mem", work.max(64));
        }
        let mut wal = BTreeMap::from([
            ("min_wal_size", 80),
            ("max_wal_size", 1024),
            ("wal_keep_size", 1000),
            ("max_slot_wal_keep_size", 1024),
        ]);
        if let Some(volume) = self.disk_bytes.map(|b| b / (KB * KB)) {
            let max_wal = (volume / 4).clamp(64.max(4 * WAL_SEGMENT_MB), 4096);
            wal.insert("max_wal_size", max_wal);
            wal.insert(
                "min_wal_size",
                (max_wal / 4).clamp(32.max(2 * WAL_SEGMENT_MB), 1024),
            );
            wal.insert(
                "wal_keep_size",
                (volume / 8).clamp(32.max(WAL_SEGMENT_MB), 1000),
            );
            wal.insert("max_slot_wal_keep_size", max_wal);
        }
        let mut sized: BTreeMap<&'static str, String> = memory
            .into_iter()
            .map(|(name, kb)| (name, memory_value(kb)))
            .collect();
        sized.extend(wal.into_iter().map(|(name, mb)| (name, format!("{mb}MB"))));
        sized.extend([
            ("max_worker_processes", workers.to_string()),
            ("max_parallel_workers", parallel.to_string()),
            ("max_parallel_workers_per_gather", per_gather.to_string()),
            (
                "max_parallel_maintenance_workers",
                maintenance_workers.to_string(),
            ),
        ]);
        sized
    }
}

/// A memory size in kB written as PostgreSQL would: whole MB when it divides evenly.
fn memory_value(kb: u64) -> String {
    if kb.is_multiple_of(MB_IN_KB) {
        format!("{}MB", kb / MB_IN_KB)
    } else {
        format!("{kb}kB")
    }
}

/// Rounds down to whole bytes or millicores.
fn floor(value: f64) -> u64 {
    value.max(0.0) as u64
}

/// A Kubernetes quantity (`512Mi`, `1.5G`, `250m`, `1e9`) as a number; `None` when it is not
/// one or is below zero (the API server validated it already, so the sizing simply keeps its
/// default).
fn quantity(text: &str) -> Option<f64> {
    Quantity::parse(text.trim())
        .ok()
        .filter(|q| !q.is_negative())
        .map(Quantity::to_f64)
}

/// Why a shard's postgresql.conf cannot be rendered.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    /// The `postgresConfig` map has entries PostgreSQL would refuse.
    #[error("invalid postgresConfig: {}", join(.0))]
    Invalid(Vec<Problem>),
    /// The `postgresConfigRef` content is not postgresql.conf syntax.
    #[error(
        "postgresConfigRef ConfigMap {name:?} key {key:?} is not valid postgresql.conf: {source}"
    )]
    Reference {
        /// The ConfigMap.
        name: String,
        /// Its key.
        key: String,
        /// The offending line.
        #[source]
        source: SyntaxError,
    },
    /// The `postgresConfigRef` content sets parameters the same rules as `postgresConfig`
    /// refuse.
    #[error(
        "postgresConfigRef ConfigMap {name:?} key {key:?} is refused and not rendered (the \
         pods keep their last postgresql.conf): {}",
        problems.iter().map(|p| format!("{}: {}", p.name, p.message)).collect::<Vec<_>>().join("; ")
    )]
    ReferenceRefused {
        /// The ConfigMap.
        name: String,
        /// Its key.
        key: String,
        /// Each refused parameter.
        problems: Vec<Problem>,
    },
}

fn join(problems: &[Problem]) -> String {
    problems
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// The effective settings split by how a change of them is applied, with a fingerprint each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Split {
    /// Settings PostgreSQL reads only at start (context `postmaster` or `internal`), plus any
    /// it does not know (extensions' and `include` lines), which are assumed to need a start.
    pub restart: BTreeMap<String, String>,
    /// Settings a reload (SIGHUP) applies.
    pub reload: BTreeMap<String, String>,
    /// Fingerprint of `restart`; a change means every pod restarts.
    pub restart_hash: String,
    /// Fingerprint of `reload`; a change alone means PostgreSQL reloads its file.
    pub reload_hash: String,
}

/// The effective settings of a file split into restart-class and reload-class.
pub fn split(settings: &BTreeMap<String, String>) -> Split {
    let (restart, reload): (BTreeMap<_, _>, BTreeMap<_, _>) = settings
        .clone()
        .into_iter()
        .partition(|(name, _)| catalog::lookup(name).is_none_or(|s| s.context.needs_restart()));
    Split {
        restart_hash: fingerprint(&restart),
        reload_hash: fingerprint(&reload),
        restart,
        reload,
    }
}

/// First 16 hex digits of the SHA-256 of `name=value` lines in name order.
fn fingerprint(settings: &BTreeMap<String, String>) -> String {
    let mut hasher = Sha256::new();
    for (name, value) in settings {
        hasher.update(name.as_bytes());
        hasher.update(b"=");
        hasher.update(value.as_bytes());
        hasher.update(b"\n");
    }
    hasher
        .finalize()
        .iter()
        .take(8)
        .fold(String::with_capacity(16), |mut hex, byte| {
            let _ = write!(hex, "{byte:02x}");
            hex
        })
}

/// A rendered postgresql.conf and how its settings apply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rendered {
    /// The file, ending with the reload marker line.
    pub text: String,
    /// Its effective settings (without the marker), split.
    pub split: Split,
    /// What multipooler's pools may take of its `max_connections`.
    pub pool: PoolCapacity,
    /// Settings asked below what the servers may already run, rendered at that value.
    pub held: Vec<Held>,
}

/// `cluster_name` of a shard's servers: `<cluster>/<database>/<tablegroup>/<shard>`.
pub fn cluster_name(cluster: &str, spec: &ShardSpec) -> String {
    format!(
        "{cluster}/{}/{}/{}",
        spec.database_name.as_str(),
        spec.table_group_name.as_str(),
        spec.shard_name.as_str()
    )
}

/// The postgresql.conf of a shard of `cluster`, with `reference` the content of its
/// `postgresConfigRef` when it has one.
pub fn render_shard(
    cluster: &str,
    spec: &ShardSpec,
    reference: Option<&str>,
    floor: &StandbySettings,
) -> Result<Rendered, RenderError> {
    render(
        &cluster_name(cluster, spec),
        Resources::of_shard(spec),
        serves_tls(spec),
        spec.postgres_config_ref.as_ref().zip(reference),
        &spec.postgres_config,
        floor,
    )
}

/// The settings PostgreSQL allocates as shared memory at start, in a pod's memory limit.
const SHARED_MEMORY: [&str; 2] = ["shared_buffers", "wal_buffers"];

/// Why `settings`' shared memory does not fit `limit` bytes (`None`: it fits, or no limit): the
/// server would fail to start or be OOM-killed, replica after replica in the rollout.
fn shared_memory_problem(
    settings: &BTreeMap<String, String>,
    limit: Option<u64>,
) -> Option<Problem> {
    let limit = limit?;
    let total: f64 = SHARED_MEMORY
        .iter()
        .filter_map(|name| limits::memory_bytes(name, settings.get(*name)?))
        .sum();
    let fits = total <= limit as f64;
    (!fits).then(|| Problem {
        name: "shared_buffers".to_owned(),
        message: format!(
            "shared_buffers plus wal_buffers need {:.0} MiB of shared memory, more than the \
             smallest postgres memory limit of the shard's pools ({} MiB): PostgreSQL would fail \
             to start or be OOM-killed; lower them or raise the limit",
            total / 1_048_576.0,
            limit >> 20
        ),
    })
}

/// The postgresql.conf for servers named `cluster_name` with `resources` (and a server
/// certificate when `tls`): baseline and sized defaults, then the referenced ConfigMap's
/// content, then `config`, then any hot-standby-sensitive setting held at `floor` (see
/// [`super::standby`]), then the reload marker.
pub fn render(
    cluster_name: &str,
    resources: Resources,
    tls: bool,
    reference: Option<(&PostgresConfigRef, &str)>,
    config: &BTreeMap<String, String>,
    floor: &StandbySettings,
) -> Result<Rendered, RenderError> {
    let problems = validate(config);
    if !problems.is_empty() {
        return Err(RenderError::Invalid(problems));
    }
    let mut defaults: BTreeMap<&str, String> = BASELINE
        .iter()
        .map(|(name, value)| (*name, (*value).to_owned()))
        .collect();
    defaults.extend(resources.sized());
    if tls {
        defaults.extend(server_tls());
    }
    defaults.insert("cluster_name", cluster_name.to_owned());

    let mut settings: BTreeMap<String, String> = defaults
        .iter()
        .map(|(name, value)| ((*name).to_owned(), value.clone()))
        .collect();
    let mut text = String::from(
        "# PostgreSQL configuration rendered by the multigres operator; do not edit.\n\
         # Later lines win. port, listen_addresses, unix_socket_directories, data_directory,\n\
         # hba_file and ident_file are set by pgctld on its command line.\n\
         \n\
         # Operator defaults, sized from the pools' memory, CPU and disk.\n",
    );
    for (name, value) in &defaults {
        let _ = writeln!(text, "{name} = {}", quote(value));
    }
    let mut sets_shared_memory = false;
    if let Some((r, content)) = reference {
        let referenced = conf::parse(content).map_err(|source| RenderError::Reference {
            name: r.name.clone(),
            key: r.key.clone(),
            source,
        })?;
        let problems = validate(&referenced);
        if !problems.is_empty() {
            return Err(RenderError::ReferenceRefused {
                name: r.name.clone(),
                key: r.key.clone(),
                problems,
            });
        }
        sets_shared_memory = SHARED_MEMORY.iter().any(|n| referenced.contains_key(*n));
        settings.extend(referenced);
        let _ = writeln!(
            text,
            "\n# postgresConfigRef: ConfigMap {}, key {}.",
            r.name, r.key
        );
        text.push_str(content);
        if !content.ends_with('\n') {
            text.push('\n');
        }
    }
    if !config.is_empty() {
        text.push_str("\n# postgresConfig.\n");
        for (name, value) in config {
            let _ = writeln!(text, "{name} = {}", quote(value));
            settings.insert(name.to_ascii_lowercase(), value.clone());
        }
    }
    // The webhook checks `postgresConfig` against the memory limit at admission; the referenced
    // ConfigMap is edited without it, so its shared memory is checked here.
    if let Some((r, _)) = reference.filter(|_| sets_shared_memory)
        && let Some(problem) = shared_memory_problem(&settings, resources.memory_limit_bytes)
    {
        return Err(RenderError::ReferenceRefused {
            name: r.name.clone(),
            key: r.key.clone(),
            problems: vec![problem],
        });
    }
    let held = standby::below(&settings, floor);
    if !held.is_empty() {
        text.push_str(
            "\n# Held at the values the servers may already run: a standby cannot start below \
             its primary's.\n",
        );
        for h in &held {
            let _ = writeln!(text, "{} = {}", h.name, h.held);
            settings.insert(h.name.clone(), h.held.to_string());
        }
    }
    let pool = pool_capacity(&settings).map_err(|message| {
        RenderError::Invalid(vec![Problem {
            name: "max_connections".to_owned(),
            message,
        }])
    })?;
    let split = split(&settings);
    let _ = write!(
        text,
        "\n# Fingerprint of the settings a reload applies: tells whether PostgreSQL read this file.\n\
         {RELOAD_MARKER} = {}\n",
        quote(&split.reload_hash)
    );
    Ok(Rendered {
        text,
        split,
        pool,
        held,
    })
}

#[cfg(test)]
mod tests;
