//! The directory of a filesystem backup repository inside the pool pods
//! (`backup.filesystem.path`), where the shard's backup volume is mounted. Mounted over PGDATA
//! (`/var/lib/pooler`) it would shadow the data directory of every pool pod with one shared
//! volume, which PostgreSQL's lock file cannot protect across pods; over another mount of the
//! pod it makes the StatefulSet invalid; over a system directory it hides the image's files.
//! So the path must be absolute, normalized, and neither be, lie inside, nor contain a
//! directory of [`RESERVED`]. Checked by CEL in the CRD schema ([`schema`]); [`problem`] is the
//! same rule in Rust, for the tests that keep [`RESERVED`] in step with the pool pod's mounts.

use schemars::{Schema, SchemaGenerator, json_schema};

/// Directories the pool pod mounts or the images need: PGDATA's parent, the PostgreSQL socket,
/// the password, pgBackRest's certificates and cipher key, Multigres' binaries, and the system
/// directories (`/etc` holds every other mount: TLS, the rendered PostgreSQL configuration,
/// the OpenTelemetry sampling file).
pub const RESERVED: [&str; 17] = [
    "/var/lib/pooler",
    "/var/run/postgresql",
    "/etc",
    "/dev",
    "/proc",
    "/sys",
    "/run",
    "/var/run",
    "/tmp",
    "/certs/pgbackrest",
    "/secrets/pgbackrest-cipher",
    "/multigres/bin",
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib64",
];

/// Longest path admitted. It bounds the CEL rules' cost estimate, which the API server multiplies
/// by the most shards a cluster may list: at 512 the reserved-directory rule exceeded its budget.
pub const MAX_LEN: usize = 256;

/// Message of the first rule (the API server prefixes the field's path).
const ABSOLUTE: &str = "must be an absolute directory other than /, such as /backups";
/// Message of the second rule.
const NORMALIZED: &str = "must be normalized: no //, no . or .. segment and no trailing /";

fn reserved_message() -> String {
    format!(
        "must not be, lie inside or contain a directory the pool pods mount or need ({}); \
         use a directory of its own such as /backups",
        RESERVED.join(", ")
    )
}

/// Why `path` cannot hold the backup repository; `None` when it can.
pub fn problem(path: &str) -> Option<String> {
    if !path.starts_with('/') || path == "/" {
        return Some(ABSOLUTE.to_owned());
    }
    let dotted = path
        .split('/')
        .any(|segment| segment == "." || segment == "..");
    if path.contains("//") || path.ends_with('/') || dotted {
        return Some(NORMALIZED.to_owned());
    }
    let clashes = |dir: &str| {
        path == dir
            || path
                .strip_prefix(dir)
                .is_some_and(|rest| rest.starts_with('/'))
            || dir
                .strip_prefix(path)
                .is_some_and(|rest| rest.starts_with('/'))
    };
    RESERVED
        .iter()
        .any(|dir| clashes(dir))
        .then(reserved_message)
}

/// The schema of the field: a string of at most [`MAX_LEN`] characters with the three rules of
/// [`problem`] in CEL.
pub(crate) fn schema(_: &mut SchemaGenerator) -> Schema {
    let list = RESERVED
        .iter()
        .map(|dir| format!("'{dir}'"))
        .collect::<Vec<_>>()
        .join(", ");
    json_schema!({
        "type": "string",
        "minLength": 1,
        "maxLength": MAX_LEN,
        "x-kubernetes-validations": [
            {
                "rule": "self.startsWith('/') && self != '/'",
                "message": ABSOLUTE,
            },
            {
                "rule": "!self.contains('//') && !self.endsWith('/') && !self.matches('/[.][.]?(/|$)')",
                "message": NORMALIZED,
            },
            {
                "rule": format!(
                    "![{list}].exists(d, self == d || self.startsWith(d + '/') || d.startsWith(self + '/'))"
                ),
                "message": reserved_message(),
            },
        ],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_directory_of_its_own_holds_backups() {
        for good in [
            "/backups",
            "/mnt/backups",
            "/var/backups",
            "/data/pg.backups",
            "/etc2",
        ] {
            assert_eq!(problem(good), None, "{good}");
        }
        for (bad, why) in [
            ("backups", ABSOLUTE),
            ("/", ABSOLUTE),
            ("", ABSOLUTE),
            ("/backups/", NORMALIZED),
            ("//backups", NORMALIZED),
            ("/backups/../var/lib/pooler", NORMALIZED),
            ("/./backups", NORMALIZED),
            ("/backups/..", NORMALIZED),
        ] {
            assert_eq!(problem(bad).as_deref(), Some(why), "{bad}");
        }
        for bad in [
            "/var/lib/pooler",
            "/var/lib/pooler/pg_data",
            "/var/lib",
            "/var",
            "/etc/postgres-password",
            "/etc",
            "/tmp/x",
            "/certs",
            "/secrets",
            "/multigres",
            "/usr/local/bin",
        ] {
            assert!(
                problem(bad).is_some_and(|p| p.contains("/var/lib/pooler, /var/run/postgresql")),
                "{bad}"
            );
        }
    }
}
