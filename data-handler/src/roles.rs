//! Which pool pod is the primary, from the pooler records multipoolers publish in their cell
//! topology: pure.
//!
//! A pooler's record is matched to its pod as upstream does it: the record's id name (the
//! pooler's `--service-id`) equals the pod name, or its hostname is the pod name or starts with
//! `<pod>.` (the pod's DNS name under its headless Service). The role is PRIMARY when the record
//! routes as primary (`routing_state.role`) and no other routes as primary under a higher rule
//! (see [`primary`]) and its pooler, when asked, does not deny it (see [`as_answered`]),
//! QUARANTINED when its pooler gave up on its PostgreSQL (see [`quarantined`]), REPLICA
//! otherwise; records of poolers that shut down are ignored. When a pod has several
//! records (it was recreated with the same name), the most recently updated wins.

use std::collections::{BTreeMap, BTreeSet};

use multigres_common::events::Notice;
use multigres_proto::topo::{PoolerLifecycleStatus, RoutingRole, RoutingState};

use crate::topo::PoolerRecord;

pub use multigres_api::v1alpha1::{
    POD_ROLE_PRIMARY as PRIMARY, POD_ROLE_QUARANTINED as QUARANTINED, POD_ROLE_REPLICA as REPLICA,
};

/// The shard a Shard object stands for in the topology.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardKey<'a> {
    /// Database name.
    pub database: &'a str,
    /// Table group name.
    pub table_group: &'a str,
    /// Shard name.
    pub shard: &'a str,
}

/// A pool pod of the shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolPod {
    /// Pod name.
    pub name: String,
    /// Its cell (label `multigres.com/cell`), when labelled.
    pub cell: Option<String>,
}

/// The label value for a published role: `primary` or `replica`.
pub fn label_value(role: &str) -> String {
    role.to_ascii_lowercase()
}

/// The role of each pod that has a pooler record of `shard`, keyed by pod name.
///
/// `poolers` holds the records read from each cell, or `None` for a cell that could not be
/// read; a pod in such a cell keeps its role from `previous` (the published one) rather than
/// losing it during a topology outage.
pub fn roles(
    shard: ShardKey<'_>,
    pods: &[PoolPod],
    poolers: &BTreeMap<String, Option<Vec<PoolerRecord>>>,
    previous: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let leader = primary(shard, pods, poolers).map(|(pod, _)| pod.name.as_str());
    let mut out = BTreeMap::new();
    for pod in pods {
        let unread = match &pod.cell {
            Some(cell) => poolers.get(cell).is_some_and(Option::is_none),
            None => poolers.values().any(Option::is_none),
        };
        let role = match pooler_of(shard, pod, poolers) {
            Some(_) if leader == Some(pod.name.as_str()) => Some(PRIMARY.to_owned()),
            Some(record) if quarantine_reason(record).is_some() => Some(QUARANTINED.to_owned()),
            Some(_) => Some(REPLICA.to_owned()),
            None if unread => previous.get(&pod.name).map(|role| match leader {
                Some(_) if role == PRIMARY => REPLICA.to_owned(),
                _ => role.clone(),
            }),
            None => None,
        };
        if let Some(role) = role {
            out.insert(pod.name.clone(), role);
        }
    }
    out
}

/// `poolers` as the poolers answer now: a record of `shard` that routes as primary for a pod in
/// `not_primary` (its pooler, asked just now, said it is not the writable primary) reads as a
/// replica's. Such a record is stale. A recreated pod's pooler writes its own record once the
/// topology server serves, and until then its earlier process's record still claims PRIMARY,
/// while the gateways, which route by what each pooler streams to them, have no primary.
pub fn as_answered(
    shard: ShardKey<'_>,
    poolers: &BTreeMap<String, Option<Vec<PoolerRecord>>>,
    not_primary: &BTreeSet<String>,
) -> BTreeMap<String, Option<Vec<PoolerRecord>>> {
    let mut out = poolers.clone();
    let stale = out
        .values_mut()
        .flatten()
        .flatten()
        .filter(|r| r.is_primary() && of_shard(r, shard))
        .filter(|r| not_primary.iter().any(|pod| serves_pod(r, pod)));
    for record in stale {
        record.pooler.routing_state = Some(RoutingState {
            role: RoutingRole::Replica as i32,
            rule: None,
        });
    }
    out
}

/// Margin for the clocks of the API server (a pod's creation time) and of the node (a
/// pooler's record time) in [`stale`].
const CLOCK_MARGIN_SECONDS: i64 = 5;

/// The records among `records` of `shard` that an earlier pod wrote: each names a pod of
/// `created` (pod name to its creation time, in seconds) and its lifecycle time is before that
/// pod was created, so no process of the pod can have written it. A cluster deleted and applied
/// again leaves them behind when its topology server stopped with the pods (their poolers could
/// not mark themselves shut down), and a gateway that dials one before its pod's new pooler
/// listens backs off for up to half a minute. Shut-down records are not stale; a record without
/// a lifecycle time is never judged. With the pod of each.
pub fn stale<'r, 'p>(
    shard: ShardKey<'_>,
    created: &'p BTreeMap<String, i64>,
    records: &'r [PoolerRecord],
) -> Vec<(&'r PoolerRecord, &'p str)> {
    records
        .iter()
        .filter(|r| of_shard(r, shard))
        .filter_map(|r| {
            let lifecycle = r.pooler.lifecycle_status.as_ref()?;
            if lifecycle.status() == PoolerLifecycleStatus::LifecycleShutdown {
                return None;
            }
            let written = lifecycle.updated.as_ref()?.seconds;
            created
                .iter()
                .find(|(pod, _)| serves_pod(r, pod))
                .filter(|(_, at)| written + CLOCK_MARGIN_SECONDS < **at)
                .map(|(pod, _)| (r, pod.as_str()))
        })
        .collect()
}

/// The record of the pooler serving `pod` among the readable cells' records of `shard`: the
/// most recently updated one of a pooler that did not shut down.
pub fn pooler_of<'r>(
    shard: ShardKey<'_>,
    pod: &PoolPod,
    poolers: &'r BTreeMap<String, Option<Vec<PoolerRecord>>>,
) -> Option<&'r PoolerRecord> {
    let cells: Vec<&Option<Vec<PoolerRecord>>> = match &pod.cell {
        Some(cell) => poolers.get(cell).into_iter().collect(),
        None => poolers.values().collect(),
    };
    let read: Vec<&PoolerRecord> = cells
        .iter()
        .filter_map(|c| c.as_ref())
        .flatten()
        .filter(|r| of_shard(r, shard) && serves_pod(r, &pod.name))
        .collect();
    newest(&read)
}

/// The shard's primary among `pods`, with its pooler record (see [`pooler_of`]): of the
/// records that route as primary, the one with the highest write authority
/// (`routing_state.rule`), as the gateways rank competing primaries. A primary lost with its
/// node cannot update its record, which claims PRIMARY under the older rule until it returns
/// and demotes itself. Any pooler of a shard would do for what the shard shares (its backup
/// repository); the primary is the one asked, as upstream does.
pub fn primary<'p, 'r>(
    shard: ShardKey<'_>,
    pods: &'p [PoolPod],
    poolers: &'r BTreeMap<String, Option<Vec<PoolerRecord>>>,
) -> Option<(&'p PoolPod, &'r PoolerRecord)> {
    pods.iter()
        .filter_map(|pod| {
            pooler_of(shard, pod, poolers)
                .filter(|r| r.is_primary())
                .map(|r| (pod, r))
        })
        .rev()
        .max_by_key(|(_, record)| authority(record))
}

/// The rule a record claims write authority under, `(coordinator_term, leader_subterm)`;
/// `(0, 0)` when it names none.
fn authority(record: &PoolerRecord) -> (i64, i64) {
    record
        .pooler
        .routing_state
        .as_ref()
        .and_then(|state| state.rule.as_ref())
        .map_or((0, 0), |rule| (rule.coordinator_term, rule.leader_subterm))
}

/// Whether `record` is a pooler of `shard`.
pub(crate) fn of_shard(record: &PoolerRecord, shard: ShardKey<'_>) -> bool {
    record.pooler.shard_key.as_ref().is_some_and(|k| {
        k.database == shard.database && k.table_group == shard.table_group && k.shard == shard.shard
    })
}

/// Whether `record` is the pooler of pod `pod` (by service id or hostname).
pub(crate) fn serves_pod(record: &PoolerRecord, pod: &str) -> bool {
    let pooler = &record.pooler;
    let hostname = pooler.hostname.as_str();
    pooler.id.as_ref().is_some_and(|id| id.name == pod)
        || hostname == pod
        || hostname
            .strip_prefix(pod)
            .is_some_and(|rest| rest.starts_with('.'))
}

/// The most recently updated record of a pooler that did not shut down; primaries win ties.
fn newest<'r>(records: &[&'r PoolerRecord]) -> Option<&'r PoolerRecord> {
    records
        .iter()
        .copied()
        .filter(|r| {
            r.pooler
                .lifecycle_status
                .as_ref()
                .is_none_or(|l| l.status() != PoolerLifecycleStatus::LifecycleShutdown)
        })
        .max_by_key(|r| {
            let updated = r
                .pooler
                .lifecycle_status
                .as_ref()
                .and_then(|l| l.updated.as_ref())
                .map(|t| (t.seconds, t.nanos));
            (updated, r.is_primary())
        })
}

/// Why the pooler of `record` quarantined itself, when it did (`LIFECYCLE_QUARANTINED`: its
/// PostgreSQL failed to start, rewind or restore for longer than
/// `--postgres-unrecoverable-timeout`, and it left the consensus cohort).
pub fn quarantine_reason(record: &PoolerRecord) -> Option<&str> {
    record
        .pooler
        .lifecycle_status
        .as_ref()
        .filter(|l| l.status() == PoolerLifecycleStatus::LifecycleQuarantined)
        .map(|l| l.reason.as_str())
}

/// A Warning for each pod that `next` publishes QUARANTINED and `previous` did not, with its
/// pooler's reason: the resource-handler replaces its volume once the rest of the shard can
/// spare it (docs/operations.md, "A replica that cannot recover").
pub fn quarantined(
    shard: ShardKey<'_>,
    pods: &[PoolPod],
    poolers: &BTreeMap<String, Option<Vec<PoolerRecord>>>,
    previous: &BTreeMap<String, String>,
    next: &BTreeMap<String, String>,
) -> Vec<(String, Notice)> {
    pods.iter()
        .filter(|pod| next.get(&pod.name).map(String::as_str) == Some(QUARANTINED))
        .filter(|pod| previous.get(&pod.name).map(String::as_str) != Some(QUARANTINED))
        .map(|pod| {
            let reason = pooler_of(shard, pod, poolers)
                .and_then(quarantine_reason)
                .filter(|r| !r.is_empty())
                .unwrap_or("no reason given");
            let notice = Notice::warning(
                "PoolerQuarantined",
                format!(
                    "the multipooler of pod {} quarantined itself: {reason}. It serves nothing \
                     and is out of the consensus cohort; the operator deletes its volume and \
                     pod once the rest of the shard is Ready and a backup exists, so it is \
                     rebuilt from the backup",
                    pod.name
                ),
            );
            (pod.name.clone(), notice)
        })
        .collect()
}

/// The event for a change of primary between the published roles `previous` and `next`, with
/// the pod it is about: a first (or, after a failover, a new) primary, a primary that moved
/// (switchover), or none left (writes fail until multiorch elects one). `None` when the
/// primary stayed.
pub fn primary_change(
    previous: &BTreeMap<String, String>,
    next: &BTreeMap<String, String>,
) -> Option<(String, Notice)> {
    let primary = |roles: &BTreeMap<String, String>| {
        roles
            .iter()
            .find(|(_, role)| role.as_str() == PRIMARY)
            .map(|(pod, _)| pod.clone())
    };
    match (primary(previous), primary(next)) {
        (None, Some(new)) => {
            let notice = Notice::normal(
                "PrimaryElected",
                format!("pod {new} is the primary (read from the topology)"),
            );
            Some((new, notice))
        }
        (Some(old), Some(new)) if old != new => {
            let notice = Notice::normal(
                "PrimaryChanged",
                format!(
                    "the primary moved from pod {old} to pod {new} (multiorch; read from the \
                     topology)"
                ),
            );
            Some((new, notice))
        }
        (Some(old), None) => {
            let notice = Notice::warning(
                "NoPrimary",
                format!(
                    "pod {old} is no longer the primary and no pod is: writes fail until \
                     multiorch elects one (see the multiorch and multipooler logs)"
                ),
            );
            Some((old, notice))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use multigres_proto::topo::{
        Id, Multipooler, PoolerLifecycle, RoutingRole, RoutingState, RuleNumber, ShardKey as Key,
        id,
    };

    use super::*;

    const SHARD: ShardKey<'static> = ShardKey {
        database: "postgres",
        table_group: "default",
        shard: "0-inf",
    };

    fn record(service_id: &str, hostname: &str, role: RoutingRole) -> PoolerRecord {
        PoolerRecord {
            key: format!("/multigres/zone-a/poolers/multipooler-zone-a-{service_id}/Pooler"),
            revision: 0,
            id: format!("multipooler-zone-a-{service_id}"),
            pooler: Multipooler {
                id: Some(Id {
                    component: id::ComponentType::Multipooler as i32,
                    cell: "zone-a".into(),
                    name: service_id.into(),
                }),
                shard_key: Some(Key {
                    database: "postgres".into(),
                    table_group: "default".into(),
                    shard: "0-inf".into(),
                }),
                hostname: hostname.into(),
                routing_state: Some(RoutingState {
                    role: role as i32,
                    rule: None,
                }),
                ..Default::default()
            },
        }
    }

    fn with_lifecycle(mut r: PoolerRecord, status: PoolerLifecycleStatus, at: i64) -> PoolerRecord {
        r.pooler.lifecycle_status = Some(PoolerLifecycle {
            status: status as i32,
            reason: String::new(),
            updated: Some(prost_types::Timestamp {
                seconds: at,
                nanos: 0,
            }),
        });
        r
    }

    fn pod(name: &str, cell: &str) -> PoolPod {
        PoolPod {
            name: name.into(),
            cell: Some(cell.into()),
        }
    }

    fn read(records: Vec<PoolerRecord>) -> BTreeMap<String, Option<Vec<PoolerRecord>>> {
        BTreeMap::from([("zone-a".to_owned(), Some(records))])
    }

    #[test]
    fn pods_are_matched_by_service_id_or_hostname() {
        let pods = [
            pod("prod-pool-0", "zone-a"),
            pod("prod-pool-1", "zone-a"),
            pod("prod-pool-2", "zone-a"),
            pod("prod-pool-3", "zone-a"),
        ];
        let poolers = read(vec![
            record("prod-pool-0", "10.0.0.1", RoutingRole::Replica),
            record(
                "random12",
                "prod-pool-1.prod-pool.team-a.svc",
                RoutingRole::Primary,
            ),
            record("other", "prod-pool-2", RoutingRole::Replica),
            // A longer pod name sharing the prefix is not prod-pool-3's record.
            record("prod-pool-30", "prod-pool-30.svc", RoutingRole::Primary),
        ]);
        let roles = roles(SHARD, &pods, &poolers, &BTreeMap::new());
        assert_eq!(
            roles,
            BTreeMap::from([
                ("prod-pool-0".to_owned(), REPLICA.to_owned()),
                ("prod-pool-1".to_owned(), PRIMARY.to_owned()),
                ("prod-pool-2".to_owned(), REPLICA.to_owned()),
            ])
        );
        assert_eq!(label_value(PRIMARY), "primary");
    }

    #[test]
    fn a_primary_record_its_pooler_denies_is_read_as_a_replica() {
        // The cluster was recreated on its kept volumes: p-0's record from before still claims
        // PRIMARY, but its new pooler answers that it is a replica (no primary elected yet).
        let mut other_shard = record("p-0", "", RoutingRole::Primary);
        other_shard.pooler.shard_key.as_mut().unwrap().table_group = "orders".into();
        let poolers = read(vec![
            record("p-0", "", RoutingRole::Primary),
            record("p-1", "", RoutingRole::Replica),
            other_shard,
        ]);
        let pods = [pod("p-0", "zone-a"), pod("p-1", "zone-a")];
        let answered = as_answered(SHARD, &poolers, &BTreeSet::from(["p-0".to_owned()]));
        assert_eq!(
            roles(SHARD, &pods, &answered, &BTreeMap::new()),
            BTreeMap::from([
                ("p-0".to_owned(), REPLICA.to_owned()),
                ("p-1".to_owned(), REPLICA.to_owned()),
            ])
        );
        let records = answered["zone-a"].as_ref().unwrap();
        assert!(records[2].is_primary(), "another shard's record is kept");
        // A pooler that did not deny it (it did not answer, or said PRIMARY) keeps its role.
        let kept = as_answered(SHARD, &poolers, &BTreeSet::from(["p-1".to_owned()]));
        assert_eq!(
            primary(SHARD, &pods, &kept).map(|(pod, _)| pod.name.as_str()),
            Some("p-0")
        );
    }

    #[test]
    fn records_written_before_their_pod_was_created_are_stale() {
        let created = BTreeMap::from([("p-0".to_owned(), 1_000), ("p-1".to_owned(), 1_000)]);
        let old = with_lifecycle(
            record("p-0", "", RoutingRole::Primary),
            PoolerLifecycleStatus::LifecycleActive,
            400,
        );
        // Written by the pod's own pooler (after it was created, or within the clock margin).
        let own = with_lifecycle(
            record("p-1", "", RoutingRole::Replica),
            PoolerLifecycleStatus::LifecycleStarting,
            997,
        );
        let shut = with_lifecycle(
            record("p-0", "", RoutingRole::Replica),
            PoolerLifecycleStatus::LifecycleShutdown,
            10,
        );
        let no_pod = with_lifecycle(
            record("p-9", "", RoutingRole::Replica),
            PoolerLifecycleStatus::LifecycleActive,
            10,
        );
        let mut other_shard = old.clone();
        other_shard.pooler.shard_key.as_mut().unwrap().table_group = "orders".into();
        let untimed = record("p-1", "", RoutingRole::Replica);
        let records = [old, own, shut, no_pod, other_shard, untimed];
        let found: Vec<(&str, &str)> = stale(SHARD, &created, &records)
            .into_iter()
            .map(|(r, pod)| (r.key.as_str(), pod))
            .collect();
        assert_eq!(
            found,
            [(
                "/multigres/zone-a/poolers/multipooler-zone-a-p-0/Pooler",
                "p-0"
            )]
        );
    }

    #[test]
    fn other_shards_and_shut_down_poolers_are_ignored() {
        let mut other_shard = record("p-0", "", RoutingRole::Primary);
        other_shard.pooler.shard_key.as_mut().unwrap().table_group = "orders".into();
        let stopped = with_lifecycle(
            record("p-1", "", RoutingRole::Primary),
            PoolerLifecycleStatus::LifecycleShutdown,
            50,
        );
        let poolers = read(vec![other_shard, stopped]);
        let pods = [pod("p-0", "zone-a"), pod("p-1", "zone-a")];
        assert!(roles(SHARD, &pods, &poolers, &BTreeMap::new()).is_empty());
    }

    #[test]
    fn the_newest_record_of_a_pod_wins() {
        let old_primary = with_lifecycle(
            record("p-0", "", RoutingRole::Primary),
            PoolerLifecycleStatus::LifecycleActive,
            10,
        );
        let new_replica = with_lifecycle(
            record("p-0", "", RoutingRole::Replica),
            PoolerLifecycleStatus::LifecycleActive,
            20,
        );
        let poolers = read(vec![old_primary, new_replica]);
        let roles = roles(SHARD, &[pod("p-0", "zone-a")], &poolers, &BTreeMap::new());
        assert_eq!(roles["p-0"], REPLICA);
    }

    #[test]
    fn an_unreadable_cell_keeps_published_roles() {
        let previous = BTreeMap::from([
            ("b-0".to_owned(), PRIMARY.to_owned()),
            ("a-0".to_owned(), PRIMARY.to_owned()),
        ]);
        let poolers = BTreeMap::from([
            (
                "zone-a".to_owned(),
                Some(vec![record("a-0", "", RoutingRole::Replica)]),
            ),
            ("zone-b".to_owned(), None),
        ]);
        let pods = [
            pod("a-0", "zone-a"),
            pod("b-0", "zone-b"),
            pod("a-1", "zone-a"),
        ];
        let roles = roles(SHARD, &pods, &poolers, &previous);
        assert_eq!(
            roles,
            BTreeMap::from([
                ("a-0".to_owned(), REPLICA.to_owned()),
                ("b-0".to_owned(), PRIMARY.to_owned()),
            ]),
            "zone-b was not read: b-0 keeps PRIMARY; a-1 has no record yet"
        );
    }

    #[test]
    fn the_primary_is_the_pod_whose_record_routes_as_primary() {
        let pods = [pod("p-0", "zone-a"), pod("p-1", "zone-a")];
        let poolers = read(vec![
            record("p-0", "", RoutingRole::Replica),
            record("p-1", "", RoutingRole::Primary),
            // A record of a pod that is gone is nobody's primary.
            record("p-9", "", RoutingRole::Primary),
        ]);
        let (pod, record) = primary(SHARD, &pods, &poolers).unwrap();
        assert_eq!(
            (pod.name.as_str(), record.id.as_str()),
            ("p-1", "multipooler-zone-a-p-1")
        );
        assert_eq!(primary(SHARD, &pods[..1], &poolers), None);
        let unread = BTreeMap::from([("zone-a".to_owned(), None)]);
        assert_eq!(primary(SHARD, &pods, &unread), None);
    }

    #[test]
    fn of_two_primary_claims_the_higher_rule_wins_as_the_gateways_rank_them() {
        let under = |mut r: PoolerRecord, term: i64| {
            r.pooler.routing_state.as_mut().unwrap().rule = Some(RuleNumber {
                coordinator_term: term,
                leader_subterm: 0,
            });
            r
        };
        let pods = [pod("p-0", "zone-a"), pod("p-1", "zone-a")];
        // p-0's node was lost while it was primary: its record still claims term 3.
        let poolers = read(vec![
            under(record("p-0", "", RoutingRole::Primary), 3),
            under(record("p-1", "", RoutingRole::Primary), 4),
        ]);
        let (pod, _) = primary(SHARD, &pods, &poolers).unwrap();
        assert_eq!(pod.name, "p-1");
        let published = roles(SHARD, &pods, &poolers, &BTreeMap::new());
        assert_eq!(
            published,
            BTreeMap::from([
                ("p-0".to_owned(), REPLICA.to_owned()),
                ("p-1".to_owned(), PRIMARY.to_owned()),
            ])
        );
    }

    #[test]
    fn unlabelled_pods_are_looked_up_in_every_cell() {
        let poolers = BTreeMap::from([
            ("zone-a".to_owned(), Some(vec![])),
            (
                "zone-b".to_owned(),
                Some(vec![record("x-0", "", RoutingRole::Primary)]),
            ),
        ]);
        let pods = [PoolPod {
            name: "x-0".into(),
            cell: None,
        }];
        assert_eq!(
            roles(SHARD, &pods, &poolers, &BTreeMap::new())["x-0"],
            PRIMARY
        );
    }

    #[test]
    fn a_quarantined_pooler_is_published_as_such_and_told_once_with_its_reason() {
        let pods = [
            pod("p-0", "zone-a"),
            pod("p-1", "zone-a"),
            pod("p-2", "zone-a"),
        ];
        let mut sick = with_lifecycle(
            record("p-2", "", RoutingRole::Replica),
            PoolerLifecycleStatus::LifecycleQuarantined,
            900,
        );
        if let Some(l) = sick.pooler.lifecycle_status.as_mut() {
            l.reason = "postgres failed to recover for 30s across 4 attempts".into();
        }
        let poolers = read(vec![
            record("p-0", "", RoutingRole::Primary),
            record("p-1", "", RoutingRole::Replica),
            sick,
        ]);
        let before = BTreeMap::from([
            ("p-0".to_owned(), PRIMARY.to_owned()),
            ("p-1".to_owned(), REPLICA.to_owned()),
            ("p-2".to_owned(), REPLICA.to_owned()),
        ]);
        let published = roles(SHARD, &pods, &poolers, &before);
        assert_eq!(published["p-0"], PRIMARY);
        assert_eq!(published["p-1"], REPLICA);
        assert_eq!(published["p-2"], QUARANTINED);
        assert_eq!(label_value(&published["p-2"]), "quarantined");

        let told = quarantined(SHARD, &pods, &poolers, &before, &published);
        assert_eq!(told.len(), 1);
        let (about, notice) = &told[0];
        assert_eq!(about, "p-2");
        assert_eq!(notice.reason, "PoolerQuarantined");
        assert!(
            notice.message.contains("across 4 attempts"),
            "{}",
            notice.message
        );
        assert!(quarantined(SHARD, &pods, &poolers, &published, &published).is_empty());
    }

    #[test]
    fn a_change_of_primary_is_told_once_with_both_pods() {
        let roles = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(p, r)| ((*p).to_owned(), (*r).to_owned()))
                .collect()
        };
        let none = roles(&[("p-0", REPLICA), ("p-1", REPLICA)]);
        let first = roles(&[("p-0", PRIMARY), ("p-1", REPLICA)]);
        let moved = roles(&[("p-0", REPLICA), ("p-1", PRIMARY)]);
        let (pod, elected) = primary_change(&none, &first).unwrap();
        assert_eq!(
            (pod.as_str(), elected.reason.as_str()),
            ("p-0", "PrimaryElected")
        );
        assert!(elected.message.contains("p-0"));
        let (pod, changed) = primary_change(&first, &moved).unwrap();
        assert_eq!(
            (pod.as_str(), changed.reason.as_str()),
            ("p-1", "PrimaryChanged")
        );
        assert!(changed.message.contains("from pod p-0 to pod p-1"));
        let (pod, lost) = primary_change(&moved, &none).unwrap();
        assert_eq!(pod, "p-1");
        assert_eq!(
            (lost.type_, lost.reason.as_str()),
            (kube::runtime::events::EventType::Warning, "NoPrimary")
        );
        assert!(primary_change(&first, &first).is_none());
        assert!(primary_change(&none, &none).is_none());
        assert!(primary_change(&BTreeMap::new(), &none).is_none());
    }
}
