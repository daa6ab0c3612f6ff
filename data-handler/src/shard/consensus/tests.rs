use multigres_common::conditions::{FALSE, TRUE, UNKNOWN};
use multigres_proto::multipooler::multipoolermanagerdata::{StandbyReplicationStatus, Status};
use multigres_proto::topo::{
    ConsensusStatus, DurabilityPolicy, Id, PoolerPosition, RuleNumber, RulePosition,
};

use super::*;

const POLICY: (&str, QuorumType, i32) = ("AT_LEAST_2", QuorumType::AtLeastN, 2);

fn id(name: &str) -> Id {
    Id {
        cell: cell_of(name).to_owned(),
        name: name.to_owned(),
        ..Default::default()
    }
}

/// Pods are named `<cell>-<n>`.
fn cell_of(name: &str) -> &str {
    name.split_once('-').unwrap().0
}

fn rule(term: i64, leader: &str, members: &[&str], policy: (&str, QuorumType, i32)) -> ShardRule {
    ShardRule {
        rule_number: Some(RuleNumber {
            coordinator_term: term,
            leader_subterm: 0,
        }),
        leader_id: Some(id(leader)),
        cohort_members: members.iter().map(|m| id(m)).collect(),
        durability_policy: Some(DurabilityPolicy {
            policy_name: policy.0.to_owned(),
            quorum_type: policy.1 as i32,
            required_count: policy.2,
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn pod(name: &str) -> PoolPod {
    PoolPod {
        name: name.to_owned(),
        cell: Some(cell_of(name).to_owned()),
    }
}

/// The primary's answer: PostgreSQL a ready primary at WAL position `lsn`.
fn primary(name: &str, rule: &ShardRule, lsn: &str) -> Answer {
    let mut status = Status {
        postgres_ready: true,
        wal_position: lsn.to_owned(),
        ..Default::default()
    };
    status.set_postgres_status(PostgresStatus::Primary);
    status.set_pooler_type(PoolerType::Primary);
    answer(name, status, rule)
}

/// A standby's answer: its WAL receiver in state `receiver`, replayed up to `replayed`.
fn standby(name: &str, rule: &ShardRule, receiver: &str, replayed: &str) -> Answer {
    let mut status = Status {
        postgres_ready: true,
        replication_status: Some(StandbyReplicationStatus {
            wal_receiver_status: receiver.to_owned(),
            last_replay_lsn: replayed.to_owned(),
            ..Default::default()
        }),
        ..Default::default()
    };
    status.set_postgres_status(PostgresStatus::Standby);
    answer(name, status, rule)
}

fn answer(name: &str, status: Status, rule: &ShardRule) -> Answer {
    Answer {
        pod: pod(name),
        status: Some(StatusResponse {
            status: Some(status),
            consensus_status: Some(ConsensusStatus {
                current_position: Some(PoolerPosition {
                    position: Some(RulePosition {
                        decision: Some(rule.clone()),
                        proposal: None,
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
    }
}

fn silent(name: &str) -> Answer {
    Answer {
        pod: pod(name),
        status: None,
    }
}

fn published(answers: &[Answer]) -> Published {
    next(
        &Published::default(),
        answers,
        Timestamp::from_second(1_000).unwrap(),
        Some(1),
    )
}

fn condition<'p>(published: &'p Published, type_: &str) -> &'p Condition {
    published
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .unwrap_or_else(|| panic!("no {type_} in {:?}", published.conditions))
}

fn assert_condition(published: &Published, type_: &str, status: &str, reason: &str) {
    let c = condition(published, type_);
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        (status, reason),
        "{type_}: {}",
        c.message
    );
}

#[test]
fn three_streaming_members_survive_the_loss_of_any_one() {
    let r = rule(3, "a-0", &["a-0", "a-1", "a-2"], POLICY);
    let p = published(&[
        primary("a-0", &r, "0/5000000"),
        standby("a-1", &r, "streaming", "0/5000000"),
        standby("a-2", &r, "streaming", "0/4F00001"),
    ]);
    let cohort = p.cohort.as_ref().unwrap();
    assert_eq!(cohort.summary, "3/3 AT_LEAST_2");
    assert_eq!(cohort.leader.as_deref(), Some("a-0"));
    assert_eq!(cohort.required, Some(2));
    assert_eq!(cohort.pods["a-0"].replication, Replication::Primary);
    assert_eq!(cohort.pods["a-1"].replication, Replication::Streaming);
    assert_eq!(
        cohort.pods["a-2"].lag_mebibytes, None,
        "1 MiB less a byte is below the published unit"
    );
    assert_condition(&p, COHORT_HEALTHY, TRUE, "CohortComplete");
    assert_condition(&p, FAILURE_TOLERANT, TRUE, "SurvivesOnePodLoss");
    for name in ["a-0", "a-1", "a-2"] {
        assert_eq!(p.label(name), Some(COHORT_MEMBER), "{name}");
    }
}

#[test]
fn two_pods_under_at_least_2_say_one_loss_stops_writes_and_what_survives_it() {
    let r = rule(1, "a-0", &["a-0", "a-1"], POLICY);
    let p = published(&[
        primary("a-0", &r, "0/3000000"),
        standby("a-1", &r, "streaming", "0/3000000"),
    ]);
    assert_condition(&p, COHORT_HEALTHY, TRUE, "CohortComplete");
    assert_condition(&p, FAILURE_TOLERANT, FALSE, "OnePodLossStopsWrites");
    let message = &condition(&p, FAILURE_TOLERANT).message;
    assert!(message.contains("at least 3 pool pods"), "{message}");
}

#[test]
fn a_restarted_pod_not_yet_readded_is_outside_and_gates_on_it() {
    let r = rule(4, "a-1", &["a-0", "a-1"], POLICY);
    let p = published(&[
        standby("a-0", &r, "streaming", "0/3000000"),
        primary("a-1", &r, "0/3000000"),
        standby("a-2", &r, "streaming", "0/3000000"),
    ]);
    assert_condition(&p, COHORT_HEALTHY, FALSE, "PodsOutsideCohort");
    assert!(condition(&p, COHORT_HEALTHY).message.contains("a-2"));
    assert_condition(&p, FAILURE_TOLERANT, FALSE, "OnePodLossStopsWrites");
    assert_eq!(p.label("a-2"), Some(COHORT_OUTSIDE));
    assert_eq!(p.label("a-0"), Some(COHORT_MEMBER));
    assert_eq!(p.cohort.as_ref().unwrap().summary, "2/2 AT_LEAST_2");
}

#[test]
fn a_leader_the_rule_does_not_list_as_a_member_takes_part() {
    // Seen on real pods after a switchover and a re-creation: term 4 led by a-1, cohort
    // {a-0, a-2}; multiorch never adds the leader.
    let r = rule(4, "a-1", &["a-0", "a-2"], POLICY);
    let p = published(&[
        standby("a-0", &r, "streaming", "0/3000000"),
        primary("a-1", &r, "0/3000000"),
        standby("a-2", &r, "streaming", "0/3000000"),
    ]);
    let cohort = p.cohort.as_ref().unwrap();
    assert_eq!(cohort.summary, "3/3 AT_LEAST_2");
    assert!(!cohort.pods["a-1"].member);
    assert_condition(&p, COHORT_HEALTHY, TRUE, "CohortComplete");
    assert_condition(&p, FAILURE_TOLERANT, TRUE, "SurvivesOnePodLoss");
    for name in ["a-0", "a-1", "a-2"] {
        assert_eq!(p.label(name), Some(COHORT_MEMBER), "{name}");
    }
    let (counts, _) = super::counts(cohort);
    assert_eq!((counts.members, counts.healthy, counts.pods), (3, 3, 3));
}

#[test]
fn a_member_without_a_pod_is_named_as_missing() {
    let r = rule(2, "a-0", &["a-0", "a-1", "a-2"], POLICY);
    let p = published(&[
        primary("a-0", &r, "0/3000000"),
        standby("a-1", &r, "streaming", "0/3000000"),
    ]);
    let cohort = p.cohort.as_ref().unwrap();
    assert_eq!(cohort.missing, ["a-2"]);
    assert_eq!(cohort.summary, "2/3 AT_LEAST_2");
    assert_condition(&p, COHORT_HEALTHY, FALSE, "MembersWithoutPods");
    // {a-0, a-1} of a 3-member cohort: losing either leaves 1, no majority of 3.
    assert_condition(&p, FAILURE_TOLERANT, FALSE, "OnePodLossStopsWrites");
}

#[test]
fn a_member_that_does_not_stream_or_answer_is_not_healthy() {
    let r = rule(2, "a-0", &["a-0", "a-1", "a-2"], POLICY);
    let p = published(&[
        primary("a-0", &r, "0/9000000"),
        standby("a-1", &r, "starting", "0/3000000"),
        silent("a-2"),
    ]);
    let cohort = p.cohort.as_ref().unwrap();
    assert_eq!(cohort.pods["a-1"].replication, Replication::NotStreaming);
    assert_eq!(cohort.pods["a-1"].lag_mebibytes, Some(96));
    assert_eq!(cohort.pods["a-2"].replication, Replication::Unreachable);
    assert_condition(&p, COHORT_HEALTHY, FALSE, "MembersNotStreaming");
    let message = &condition(&p, COHORT_HEALTHY).message;
    assert!(
        message.contains("a-1 (it does not stream") && message.contains("a-2 (its multipooler"),
        "{message}"
    );
    assert_eq!(p.label("a-1"), Some(COHORT_OUTSIDE));
}

#[test]
fn the_highest_decided_rule_wins_over_a_stale_pooler() {
    let old = rule(1, "a-0", &["a-0", "a-1"], POLICY);
    let new = rule(2, "a-1", &["a-0", "a-1", "a-2"], POLICY);
    let p = published(&[
        standby("a-0", &old, "streaming", "0/1000000"),
        primary("a-1", &new, "0/1000000"),
        standby("a-2", &new, "streaming", "0/1000000"),
    ]);
    let cohort = p.cohort.as_ref().unwrap();
    assert_eq!(cohort.leader.as_deref(), Some("a-1"));
    assert!(cohort.pods.values().all(|p| p.member));
}

#[test]
fn multi_cell_policies_count_cells() {
    let policy = ("MULTI_CELL_AT_LEAST_2", QuorumType::MultiCellAtLeastN, 2);
    let spread = rule(1, "a-0", &["a-0", "b-0", "c-0"], policy);
    let p = published(&[
        primary("a-0", &spread, "0/1000000"),
        standby("b-0", &spread, "streaming", "0/1000000"),
        standby("c-0", &spread, "streaming", "0/1000000"),
    ]);
    assert_condition(&p, FAILURE_TOLERANT, TRUE, "SurvivesOnePodLoss");
    let two_cells = rule(1, "a-0", &["a-0", "a-1", "b-0"], policy);
    let p = published(&[
        primary("a-0", &two_cells, "0/1000000"),
        standby("a-1", &two_cells, "streaming", "0/1000000"),
        standby("b-0", &two_cells, "streaming", "0/1000000"),
    ]);
    assert_condition(&p, FAILURE_TOLERANT, FALSE, "OnePodLossStopsWrites");
    assert!(
        condition(&p, FAILURE_TOLERANT)
            .message
            .contains("at least 3 cells")
    );
}

#[test]
fn no_answer_keeps_the_cohort_and_says_it_is_unknown() {
    let r = rule(1, "a-0", &["a-0", "a-1", "a-2"], POLICY);
    let before = published(&[
        primary("a-0", &r, "0/1000000"),
        standby("a-1", &r, "streaming", "0/1000000"),
        standby("a-2", &r, "streaming", "0/1000000"),
    ]);
    let after = next(
        &before,
        &[silent("a-0"), silent("a-1"), silent("a-2")],
        Timestamp::from_second(2_000).unwrap(),
        Some(1),
    );
    assert_eq!(after.cohort, before.cohort);
    assert_condition(&after, COHORT_HEALTHY, UNKNOWN, "CohortUnreadable");
    assert_condition(&after, FAILURE_TOLERANT, TRUE, "SurvivesOnePodLoss");
    assert_eq!(after.label("a-1"), Some(COHORT_MEMBER));
}

#[test]
fn an_unchanged_cohort_publishes_the_same_values() {
    let r = rule(1, "a-0", &["a-0", "a-1", "a-2"], POLICY);
    let answers = [
        primary("a-0", &r, "0/1000000"),
        standby("a-1", &r, "streaming", "0/1000000"),
        standby("a-2", &r, "streaming", "0/1000000"),
    ];
    let first = published(&answers);
    let again = next(
        &first,
        &answers,
        Timestamp::from_second(5_000).unwrap(),
        Some(1),
    );
    assert_eq!(again, first);
}

#[test]
fn the_gauges_count_members_healthy_ones_and_pods() {
    let r = rule(2, "a-0", &["a-0", "a-1", "a-2"], POLICY);
    let p = published(&[
        primary("a-0", &r, "0/9000000"),
        standby("a-1", &r, "streaming", "0/8000000"),
    ]);
    let (counts, lag) = super::counts(p.cohort.as_ref().unwrap());
    assert_eq!(
        counts,
        gauges::Cohort {
            members: 3,
            healthy: 2,
            required: 2,
            pods: 2
        }
    );
    assert_eq!(lag, [("a-1".to_owned(), 16 << 20)]);
}

/// The Shard status the data-handler publishes: `published` and the topology's `roles`.
fn status_of(published: &Published, roles: &[(&str, &str)]) -> ShardStatus {
    ShardStatus {
        cohort: published.cohort.clone(),
        conditions: published.conditions.clone(),
        pod_roles: roles
            .iter()
            .map(|(pod, role)| ((*pod).to_owned(), (*role).to_owned()))
            .collect(),
        ..Default::default()
    }
}

#[test]
fn the_primaries_gauge_counts_a_primary_the_topology_names_and_that_answers() {
    let r = rule(1, "a-0", &["a-0", "a-1", "a-2"], POLICY);
    let p = published(&[
        primary("a-0", &r, "0/1000000"),
        standby("a-1", &r, "streaming", "0/1000000"),
        standby("a-2", &r, "streaming", "0/1000000"),
    ]);
    let roles = [("a-0", "PRIMARY"), ("a-1", "REPLICA"), ("a-2", "REPLICA")];
    assert_eq!(primaries(&status_of(&p, &roles)), 1);
}

#[test]
fn a_primary_lost_with_its_node_is_no_primary_though_its_record_claims_the_role() {
    let r = rule(1, "a-0", &["a-0", "a-1", "a-2"], POLICY);
    let p = published(&[
        silent("a-0"),
        standby("a-1", &r, "connecting", "0/1000000"),
        standby("a-2", &r, "connecting", "0/1000000"),
    ]);
    let roles = [("a-0", "PRIMARY"), ("a-1", "REPLICA"), ("a-2", "REPLICA")];
    assert_eq!(primaries(&status_of(&p, &roles)), 0);
}

#[test]
fn no_primary_while_no_multipooler_answers_or_every_pod_is_gone() {
    let r = rule(1, "a-0", &["a-0", "a-1"], POLICY);
    let before = published(&[
        primary("a-0", &r, "0/1000000"),
        standby("a-1", &r, "streaming", "0/1000000"),
    ]);
    let roles = [("a-0", "PRIMARY"), ("a-1", "REPLICA")];
    let unread = next(
        &before,
        &[silent("a-0"), silent("a-1")],
        Timestamp::from_second(2_000).unwrap(),
        Some(1),
    );
    assert_eq!(unread.cohort, before.cohort);
    assert_eq!(primaries(&status_of(&unread, &roles)), 0);
    assert_eq!(primaries(&status_of(&before, &[])), 0);
}

#[test]
fn lsns_are_byte_positions() {
    assert_eq!(lsn("0/0"), Some(0));
    assert_eq!(lsn("1/10"), Some((1 << 32) + 16));
    assert_eq!(lsn("16/B374D848"), Some(0x16_B374_D848));
    assert_eq!(lsn(""), None);
    assert_eq!(lsn("x/1"), None);
}

#[test]
fn a_pooler_denies_the_primary_role_unless_it_answers_primary() {
    let r = rule(1, "a-0", &["a-0", "a-1"], POLICY);
    let answers = [
        primary("a-0", &r, "0/3000000"),
        standby("a-1", &r, "streaming", "0/3000000"),
        silent("a-2"),
    ];
    assert_eq!(not_primary(&answers), BTreeSet::from(["a-1".to_owned()]));
}
