//! A backup repository belongs to one cluster. A cluster whose S3 repository (endpoint, bucket
//! and key prefix) is already another cluster's is refused, naming that cluster.
//!
//! Two clusters sharing a pgBackRest repository corrupt each other's recovery. A pooler on an
//! empty volume restores whatever complete backup the repository holds (Multigres
//! `go/services/multipooler/internal/manager/postgres_monitor.go:1126-1142`), so one cluster's
//! pods come up with the other's data. Each cluster's retention also expires the other's
//! backups. Multigres keeps every repository at `/<key prefix>/multigres`
//! (`go/common/backup/config.go:224-229`, one stanza named `multigres`), so the key prefix alone
//! tells repositories apart.
//!
//! What the other clusters use is read from their Shards: the spec the cluster-handler resolved
//! and wrote, listed across namespaces (see `crate::admission`). A cluster's own Shards do not
//! count, so the documented recovery still works: the same cluster applied again over its
//! repository. Only clusters of this Kubernetes cluster are seen here; the marker the
//! resource-handler writes into each repository before its pods start (its
//! `shard::repository`) also stops a cluster of another Kubernetes cluster.

use std::collections::BTreeMap;

use kube::ResourceExt;
use multigres_api::labels::CLUSTER;
use multigres_api::resolver;
use multigres_api::v1alpha1::{
    BackupConfig, BackupType, MultigresCluster, RecoverableWindow, S3BackupConfig, Shard,
};

use super::view::View;
use crate::rules::Templates;
use crate::violation::Findings;

/// Where an S3 repository lives, as Multigres renders it for pgBackRest.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Repository {
    /// The S3 endpoint (Multigres uses `s3.<region>.amazonaws.com` when none is given).
    endpoint: String,
    bucket: String,
    /// The key prefix without leading or trailing slashes.
    prefix: String,
}

impl Repository {
    /// The S3 repository `backup` writes to; `None` for a filesystem one (a volume of the
    /// cluster's own namespace).
    pub fn of(backup: &BackupConfig) -> Option<Self> {
        let s3 = backup
            .s3
            .as_ref()
            .filter(|_| backup.type_ == BackupType::S3)?;
        Some(Self::of_s3(s3))
    }

    /// The S3 repository `s3` names (a recovery source, or a cluster's own).
    pub fn of_s3(s3: &S3BackupConfig) -> Self {
        let endpoint = match s3.endpoint.as_deref() {
            Some(endpoint) if !endpoint.is_empty() => endpoint.to_owned(),
            _ => format!("s3.{}.amazonaws.com", s3.region),
        };
        Self {
            endpoint,
            bucket: s3.bucket.clone(),
            prefix: s3
                .key_prefix
                .as_deref()
                .unwrap_or_default()
                .trim_matches('/')
                .to_owned(),
        }
    }
}

impl std::fmt::Display for Repository {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "s3://{}/{} at {}",
            self.bucket, self.prefix, self.endpoint
        )
    }
}

/// The S3 repositories `cluster` writes to (resolved with `templates`), each with the field
/// that sets its key prefix. Empty when the cluster does not resolve: that is refused anyway.
pub fn wanted(cluster: &MultigresCluster, templates: &Templates) -> BTreeMap<Repository, String> {
    let Ok(resolved) = resolver::resolve(cluster, templates) else {
        return BTreeMap::new();
    };
    let view = View::new(&cluster.spec, templates, &resolved);
    let mut wanted = BTreeMap::new();
    for shard in &view.shards {
        let Some(repository) = shard.resolved.backup.as_ref().and_then(Repository::of) else {
            continue;
        };
        let field = shard.backup_field(&cluster.spec, "s3.keyPrefix", |b| {
            b.s3.as_ref().is_some_and(|s| s.key_prefix.is_some())
        });
        wanted.entry(repository).or_insert(field);
    }
    wanted
}

/// The cluster (`namespace/name`) whose Shards already write to each repository, among
/// `shards`, leaving out cluster `own` (`namespace`, `name`).
pub fn owners(shards: &[Shard], own: (&str, &str)) -> BTreeMap<Repository, String> {
    let mut owners = BTreeMap::new();
    for shard in shards {
        let namespace = shard.namespace().unwrap_or_default();
        let Some(cluster) = shard.labels().get(CLUSTER) else {
            continue;
        };
        if (namespace.as_str(), cluster.as_str()) == own {
            continue;
        }
        if let Some(repository) = shard.spec.backup.as_ref().and_then(Repository::of) {
            owners
                .entry(repository)
                .or_insert_with(|| format!("{namespace}/{cluster}"));
        }
    }
    owners
}

/// Checks each time target of a recovery (`backup.recovery.target.time`) against the window a
/// Shard of `shards` that writes the source repository publishes
/// (`status.recoverableWindow`). Before its earliest moment nothing can reach it (no backup
/// ended before it), which is refused, naming the window; after its latest, the WAL up to the
/// target may not be archived yet (the window is read once a minute), which warns. Sources no
/// Shard here writes are checked by the recovery Job itself.
pub fn check_targets(
    findings: &mut Findings,
    cluster: &MultigresCluster,
    templates: &Templates,
    shards: &[Shard],
) {
    let Ok(resolved) = resolver::resolve(cluster, templates) else {
        return;
    };
    let view = View::new(&cluster.spec, templates, &resolved);
    for shard in &view.shards {
        let Some(recovery) = shard
            .resolved
            .backup
            .as_ref()
            .and_then(|b| b.recovery.as_ref())
        else {
            continue;
        };
        let Some(time) = recovery.target.as_ref().and_then(|t| t.time.as_ref()) else {
            continue;
        };
        let source = Some(Repository::of_s3(&recovery.source));
        let Some(writer) = shards.iter().find(|s| {
            let key = format!(
                "{}/{}/{}",
                s.spec.database_name.as_str(),
                s.spec.table_group_name.as_str(),
                s.spec.shard_name.as_str()
            );
            s.spec.backup.as_ref().and_then(Repository::of) == source && key == shard.key
        }) else {
            continue;
        };
        let Some(window) = writer
            .status
            .as_ref()
            .and_then(|s| s.recoverable_window.as_ref())
        else {
            continue;
        };
        let owner = format!(
            "{}/{}",
            writer.namespace().unwrap_or_default(),
            writer.labels().get(CLUSTER).cloned().unwrap_or_default()
        );
        let field = shard.backup_field(&cluster.spec, "recovery.target.time", |b| {
            b.recovery.is_some()
        });
        let described = describe(window);
        match (&window.earliest, &window.latest) {
            // pgBackRest needs a backup that ended strictly before the target.
            (Some(earliest), _) if time.0 <= earliest.0 => findings.violation(
                field,
                format!(
                    "{} is before the recoverable window of MultigresCluster {owner}'s \
                     repository ({described}): no backup there ended before it",
                    time.0
                ),
            ),
            (_, Some(latest)) if time.0 > latest.0 => findings.warning(
                field,
                format!(
                    "{} is after the latest moment MultigresCluster {owner}'s repository is \
                     known to hold ({described}); the recovery fails, naming the window, unless \
                     its WAL is archived by the time the recovery runs",
                    time.0
                ),
            ),
            _ => {}
        }
    }
}

/// A published recoverable window as messages give it.
fn describe(window: &RecoverableWindow) -> String {
    let at = |t: &Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>| {
        t.as_ref()
            .map_or_else(|| "unknown".to_owned(), |t| t.0.to_string())
    };
    format!(
        "from {} (end of backup {}) to {} (WAL {})",
        at(&window.earliest),
        window.earliest_backup.as_deref().unwrap_or("unknown"),
        at(&window.latest),
        window.latest_wal.as_deref().unwrap_or("unknown")
    )
}

/// Refuses each of the `wanted` repositories that one of the `owners` already writes to.
pub fn refuse_taken(
    findings: &mut Findings,
    wanted: &BTreeMap<Repository, String>,
    owners: &BTreeMap<Repository, String>,
) {
    for (repository, field) in wanted {
        if let Some(owner) = owners.get(repository) {
            findings.violation(
                field.clone(),
                format!(
                    "the backup repository {repository} is MultigresCluster {owner}'s: two \
                     clusters writing one repository restore each other's data and expire each \
                     other's backups; give this cluster its own keyPrefix"
                ),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::rules::cluster::tests::{cluster, fields, with};

    fn s3(prefix: &str) -> String {
        format!("backup: {{type: s3, s3: {{bucket: b, region: eu-west-1, keyPrefix: {prefix}}}}}")
    }

    /// The Shard fixture of the resource-handler, of cluster `cluster` in `namespace`, backing
    /// up to bucket `b` under `prefix`.
    fn shard_of(namespace: &str, cluster: &str, prefix: &str) -> Shard {
        let mut shard: Shard = serde_yaml::from_str(include_str!(
            "../../../../resource-handler/fixtures/shard.yaml"
        ))
        .unwrap();
        shard.metadata.namespace = Some(namespace.to_owned());
        shard
            .labels_mut()
            .insert(CLUSTER.to_owned(), cluster.to_owned());
        shard.spec.backup = Some(
            serde_json::from_value(json!({"type": "s3", "s3": {"bucket": "b",
                "region": "eu-west-1", "keyPrefix": prefix}}))
            .unwrap(),
        );
        shard
    }

    #[test]
    fn another_clusters_repository_is_refused_and_its_own_is_not() {
        let new = cluster(&with(&s3("/prod/")));
        let wanted = wanted(&new, &Templates::default());
        assert_eq!(wanted.len(), 1, "{wanted:?}");
        let others = [
            shard_of("other", "prod", "prod"),
            shard_of("ns", "c", "prod"),
            shard_of("other", "stage", "stage"),
        ];
        let mut findings = Findings::default();
        refuse_taken(&mut findings, &wanted, &owners(&others, ("ns", "c")));
        assert_eq!(fields(&findings), ["spec.backup.s3.keyPrefix"]);
        assert!(
            findings.violations[0]
                .message
                .contains("MultigresCluster other/prod's"),
            "{:?}",
            findings.violations
        );
        let mut findings = Findings::default();
        refuse_taken(&mut findings, &wanted, &owners(&others[1..], ("ns", "c")));
        assert!(
            findings.violations.is_empty(),
            "its own, and another prefix"
        );
    }

    #[test]
    fn repositories_are_told_apart_by_endpoint_bucket_and_prefix_only() {
        let backup =
            |value: serde_json::Value| -> BackupConfig { serde_json::from_value(value).unwrap() };
        let aws =
            backup(json!({"type": "s3", "s3": {"bucket": "b", "region": "r", "keyPrefix": "p/"}}));
        let same = backup(
            json!({"type": "s3", "s3": {"bucket": "b", "region": "r", "keyPrefix": "/p",
                                                      "endpoint": "s3.r.amazonaws.com"}}),
        );
        let minio = backup(
            json!({"type": "s3", "s3": {"bucket": "b", "region": "r", "keyPrefix": "p",
                                                       "endpoint": "http://minio:9000"}}),
        );
        assert_eq!(Repository::of(&aws), Repository::of(&same));
        assert_ne!(Repository::of(&aws), Repository::of(&minio));
        let filesystem = backup(json!({"type": "filesystem", "filesystem": {"path": "/backups"}}));
        assert_eq!(Repository::of(&filesystem), None);
    }

    #[test]
    fn a_target_time_before_the_sources_window_is_refused_naming_it() {
        let mut prod = shard_of("prod-ns", "prod", "prod");
        prod.status = Some(
            serde_json::from_value(json!({"recoverableWindow": {
                "earliest": "2026-12-05T09:00:00Z", "earliestBackup": "20261205-085959F",
                "latest": "2026-12-05T10:00:00Z", "latestWal": "000000010000000000000009"}}))
            .unwrap(),
        );
        let restoring = |time: &str| {
            cluster(&with(&format!(
                "backup: {{type: s3, s3: {{bucket: b, region: eu-west-1, keyPrefix: staging}}, \
                 recovery: {{source: {{bucket: b, region: eu-west-1, keyPrefix: prod}}, \
                 target: {{time: '{time}'}}}}}}"
            )))
        };
        let check = |time: &str| {
            let mut findings = Findings::default();
            check_targets(
                &mut findings,
                &restoring(time),
                &Templates::default(),
                &[prod.clone()],
            );
            findings
        };
        let before = check("2026-12-05T08:30:00Z");
        assert_eq!(fields(&before), ["spec.backup.recovery.target.time"]);
        let message = &before.violations[0].message;
        assert!(
            message.contains(
                "MultigresCluster prod-ns/prod's repository (from 2026-12-05T09:00:00Z \
                 (end of backup 20261205-085959F) to 2026-12-05T10:00:00Z (WAL \
                 000000010000000000000009))"
            ),
            "{message}"
        );
        assert!(check("2026-12-05T09:30:00Z").allowed());
        let after = check("2026-12-05T10:30:00Z");
        assert!(after.allowed());
        assert!(
            after.warnings[0].contains("unless its WAL is archived"),
            "{after:?}"
        );
    }
}
