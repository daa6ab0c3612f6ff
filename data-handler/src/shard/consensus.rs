//! The consensus step of the Shard controller: the Multigres consensus cohort, read from each
//! pool pod's multipooler (`MultipoolerManager.Status`), because the topology does not say it:
//! which pods a commit waits for (the current rule's cohort and durability policy), which of
//! them are the primary or stream from it, and how far each is behind.
//!
//! Readiness does not tell this. A pod restarted in a rollout is Ready and has its role before
//! multiorch re-adds it to the cohort; a scale-down or the next restart in that window removes
//! the one standby a commit waits for, and every write blocks. The resource-handler gates
//! restarts and scale-downs on what this step publishes: `status.cohort` and the pod label
//! `multigres.com/cohort`.
//!
//! The current rule is the highest decided rule any multipooler reports. Its participants are
//! its members and its leader, which the rule may name without listing it as a member. Two
//! conditions come from it: `CohortHealthy` (every pool pod is a participant, every participant
//! has a pod and is the primary or streams from it) and `FailureTolerant` (writes go on if any
//! one healthy participant is lost: what is left still meets the policy, and without the leader
//! a majority of the members is left to elect a new one). A pass where no multipooler answers changes nothing published and says so in
//! `CohortHealthy` (`Unknown`). Reading is [`read`]; everything else is pure.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::reflector::Store;
use multigres_api::labels::{COHORT_MEMBER, COHORT_OUTSIDE};
use multigres_api::v1alpha1::{CohortPod, CohortStatus, Replication, Shard, ShardStatus};
use multigres_common::conditions::Computed;
use multigres_common::status_metrics::{self as gauges, StatusGauges};
use multigres_proto::multipooler::multipoolermanagerdata::{
    PostgresStatus, StatusRequest, StatusResponse,
};
use multigres_proto::topo::{PoolerType, QuorumType, ShardRule};
use serde_json::{Map, Value, json};

use crate::dial::Dial;
use crate::reload::{self, RpcError};
use crate::roles::{self, PoolPod, ShardKey};
use crate::topo::PoolerRecord;
use crate::watch::Guarded;

/// Condition: every pool pod is a healthy member and every member has a pod.
pub const COHORT_HEALTHY: &str = "CohortHealthy";
pub use multigres_api::v1alpha1::FAILURE_TOLERANT;
/// `CohortHealthy` reason when no multipooler reported the rule: the published cohort is the
/// last one read.
const UNREADABLE: &str = "CohortUnreadable";
/// The condition types this step owns.
pub const OWNED: [&str; 2] = [COHORT_HEALTHY, FAILURE_TOLERANT];
/// How often the cohort is read while it is not healthy: restarts and scale-downs wait for it.
pub const POLL: Duration = Duration::from_secs(2);
/// Time allowed for one multipooler's `Status`, connection included: it answers from memory.
const STATUS_TIMEOUT: Duration = Duration::from_secs(3);
/// WAL a standby may be behind before its lag is published (and published in whole MiB), so
/// an idle shard's heartbeat writes do not rewrite the status.
const MIB: u64 = 1 << 20;

/// One pool pod's answer: `None` when its multipooler has no address or did not answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// The pod.
    pub pod: PoolPod,
    /// Its multipooler's `Status`.
    pub status: Option<StatusResponse>,
}

/// Asks every pool pod's multipooler for its `Status`, all at once. `None` when none can be
/// asked: no pod has a pooler record with an address yet.
pub async fn read(
    dial: &Dial,
    key: ShardKey<'_>,
    pods: &[PoolPod],
    poolers: &BTreeMap<String, Option<Vec<PoolerRecord>>>,
) -> Option<Vec<Answer>> {
    let addresses: Vec<Option<String>> = pods
        .iter()
        .map(|pod| roles::pooler_of(key, pod, poolers).and_then(reload::address))
        .collect();
    if addresses.iter().all(Option::is_none) {
        return None;
    }
    let calls = addresses.iter().map(|address| async move {
        let address = address.as_deref()?;
        match tokio::time::timeout(STATUS_TIMEOUT, status(dial, address)).await {
            Ok(Ok(status)) => Some(status),
            Ok(Err(error)) => {
                tracing::debug!(%address, error = %multigres_common::telemetry::ErrorChain(&error), "multipooler Status failed");
                None
            }
            Err(_) => {
                tracing::debug!(%address, "multipooler Status timed out");
                None
            }
        }
    });
    let statuses = futures::future::join_all(calls).await;
    Some(
        pods.iter()
            .cloned()
            .zip(statuses)
            .map(|(pod, status)| Answer { pod, status })
            .collect(),
    )
}

/// The pods whose multipooler answered that it is not the writable primary: its `Status`
/// reports the role it derives now from PostgreSQL and the consensus, the role it streams to
/// the gateways, which its topology record may not show yet.
pub fn not_primary(answers: &[Answer]) -> BTreeSet<String> {
    answers
        .iter()
        .filter(|a| {
            a.status
                .as_ref()
                .and_then(|s| s.status.as_ref())
                .is_some_and(|s| s.pooler_type() != PoolerType::Primary)
        })
        .map(|a| a.pod.name.clone())
        .collect()
}

/// Calls `MultipoolerManager.Status` at `address`.
async fn status(dial: &Dial, address: &str) -> Result<StatusResponse, RpcError> {
    dial.connect(address, STATUS_TIMEOUT)
        .await?
        .status(StatusRequest {})
        .await
        .map(tonic::Response::into_inner)
        .map_err(|source| RpcError::Call {
            rpc: "Status",
            address: address.to_owned(),
            source,
        })
}

/// A member of the current rule: its pooler name (the pod name, `--service-id`) and cell.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Member {
    name: String,
    cell: String,
}

/// The durability policy of the current rule.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Policy {
    name: String,
    required: usize,
    by_cells: bool,
}

impl Policy {
    fn of(rule: &ShardRule) -> Option<Self> {
        let policy = rule.durability_policy.as_ref()?;
        let required = usize::try_from(policy.required_count)
            .ok()
            .filter(|n| *n > 0)?;
        Some(Self {
            name: policy.policy_name.clone(),
            required,
            by_cells: policy.quorum_type() == QuorumType::MultiCellAtLeastN,
        })
    }

    /// Whether `members` can acknowledge a commit.
    fn met_by(&self, members: &[&Member]) -> bool {
        if self.by_cells {
            let cells: BTreeSet<&str> = members.iter().map(|m| m.cell.as_str()).collect();
            cells.len() >= self.required
        } else {
            members.len() >= self.required
        }
    }

    fn unit(&self) -> &'static str {
        if self.by_cells { "cells" } else { "members" }
    }
}

/// The highest decided rule among the answers.
fn current_rule(answers: &[Answer]) -> Option<&ShardRule> {
    answers
        .iter()
        .filter_map(|a| {
            a.status
                .as_ref()?
                .consensus_status
                .as_ref()?
                .current_position
                .as_ref()?
                .position
                .as_ref()?
                .decision
                .as_ref()
        })
        .max_by_key(|rule| {
            rule.rule_number
                .as_ref()
                .map(|n| (n.coordinator_term, n.leader_subterm))
        })
}

/// A PostgreSQL LSN (`X/XXXXXXXX`) as a byte position.
fn lsn(text: &str) -> Option<u64> {
    let (high, low) = text.split_once('/')?;
    Some((u64::from_str_radix(high, 16).ok()? << 32) | u64::from_str_radix(low, 16).ok()?)
}

/// How `answer`'s pod replicates, given the current rule's leader.
fn replication(answer: &Answer, leader: Option<&str>) -> Replication {
    let Some(response) = &answer.status else {
        return Replication::Unreachable;
    };
    let status = response.status.as_ref();
    let primary =
        status.is_some_and(|s| s.postgres_status() == PostgresStatus::Primary && s.postgres_ready);
    let streaming = status
        .and_then(|s| s.replication_status.as_ref())
        .is_some_and(|r| r.wal_receiver_status == "streaming");
    if primary && leader == Some(answer.pod.name.as_str()) {
        Replication::Primary
    } else if streaming {
        Replication::Streaming
    } else {
        Replication::NotStreaming
    }
}

/// What the cohort step publishes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Published {
    /// `status.cohort`.
    pub cohort: Option<CohortStatus>,
    /// `CohortHealthy` and `FailureTolerant`, when computed.
    pub conditions: Vec<Condition>,
}

impl Published {
    /// What `status` holds.
    pub fn of(status: Option<&ShardStatus>) -> Self {
        let Some(status) = status else {
            return Self::default();
        };
        Self {
            cohort: status.cohort.clone(),
            conditions: status
                .conditions
                .iter()
                .filter(|c| OWNED.contains(&c.type_.as_str()))
                .cloned()
                .collect(),
        }
    }

    /// The status fields, for a server-side apply that owns them (`conditions` is returned
    /// apart, to be sent with the handler's other condition types).
    pub fn fields(&self) -> Map<String, Value> {
        let mut out = Map::new();
        if let Some(cohort) = &self.cohort {
            out.insert("cohort".into(), json!(cohort));
        }
        out
    }

    /// Whether nothing waits on the cohort: it was never read, cannot be read now, or
    /// `CohortHealthy` is not `False`.
    pub fn healthy(&self) -> bool {
        self.conditions
            .iter()
            .all(|c| c.type_ != COHORT_HEALTHY || c.status != multigres_common::conditions::FALSE)
    }

    /// The label value of pod `pod`: `member` or `outside`; `None` while the cohort was never
    /// read.
    pub fn label(&self, pod: &str) -> Option<&'static str> {
        let cohort = self.cohort.as_ref()?;
        Some(if cohort.is_healthy(pod) {
            COHORT_MEMBER
        } else {
            COHORT_OUTSIDE
        })
    }
}

/// The cohort as the answers show it, with its conditions.
struct Assessed {
    cohort: CohortStatus,
    conditions: [Computed; 2],
}

/// Who takes part in commits under the current rule: its members, and its leader, which the
/// rule may name without listing it as a member (multiorch never adds the leader).
struct Participants<'a> {
    /// The rule's cohort members.
    members: &'a [Member],
    /// The leader, when it is not a member.
    leader: Option<&'a Member>,
    /// Those whose pod is the primary or streams from it.
    healthy: Vec<&'a Member>,
}

/// Reads the answers: the current rule's cohort, each pod's replication, and the conditions.
/// `None` when no multipooler reported a rule with a durability policy.
fn assess(answers: &[Answer]) -> Option<Assessed> {
    let rule = current_rule(answers)?;
    let policy = Policy::of(rule)?;
    let leader = rule.leader_id.as_ref().map(|id| id.name.as_str());
    let member = |id: &multigres_proto::topo::Id| Member {
        name: id.name.clone(),
        cell: id.cell.clone(),
    };
    let members: Vec<Member> = rule.cohort_members.iter().map(member).collect();
    let outside_leader = rule
        .leader_id
        .as_ref()
        .filter(|id| !members.iter().any(|m| m.name == id.name))
        .map(member);
    let primary_lsn = answers
        .iter()
        .find(|a| Some(a.pod.name.as_str()) == leader)
        .and_then(|a| a.status.as_ref()?.status.as_ref())
        .and_then(|s| lsn(&s.wal_position));
    let pods: BTreeMap<String, CohortPod> = answers
        .iter()
        .map(|answer| {
            let replication = replication(answer, leader);
            let replayed = answer
                .status
                .as_ref()
                .and_then(|r| r.status.as_ref()?.replication_status.as_ref())
                .and_then(|r| lsn(&r.last_replay_lsn));
            let lag = match (replication, primary_lsn, replayed) {
                (Replication::Streaming | Replication::NotStreaming, Some(head), Some(at)) => {
                    Some(head.saturating_sub(at) / MIB).filter(|mib| *mib > 0)
                }
                _ => None,
            };
            let pod = CohortPod {
                member: members.iter().any(|m| m.name == answer.pod.name),
                replication,
                lag_mebibytes: lag.and_then(|l| i64::try_from(l).ok()),
            };
            (answer.pod.name.clone(), pod)
        })
        .collect();
    let all = || members.iter().chain(&outside_leader);
    let missing: Vec<String> = all()
        .filter(|m| !pods.contains_key(&m.name))
        .map(|m| m.name.clone())
        .collect();
    let mut cohort = CohortStatus {
        summary: String::new(),
        policy: Some(policy.name.clone()),
        required: i32::try_from(policy.required).ok(),
        leader: leader.map(str::to_owned),
        missing,
        pods,
    };
    let healthy: Vec<&Member> = all().filter(|m| cohort.is_healthy(&m.name)).collect();
    cohort.summary = format!("{}/{} {}", healthy.len(), all().count(), policy.name);
    let participants = Participants {
        members: &members,
        leader: outside_leader.as_ref(),
        healthy,
    };
    let conditions = [
        health(&cohort, &participants),
        tolerance(&policy, &participants, leader),
    ];
    Some(Assessed { cohort, conditions })
}

/// `CohortHealthy`: the first thing wrong, or every pod a healthy participant.
fn health(cohort: &CohortStatus, participants: &Participants<'_>) -> Computed {
    let policy = cohort.policy.as_deref().unwrap_or_default();
    if !cohort.missing.is_empty() {
        return Computed::no(
            COHORT_HEALTHY,
            "MembersWithoutPods",
            format!(
                "cohort members {} have no pool pod (scaled away or deleted) and still count \
                 toward every quorum: multiorch may not elect a new primary if the current one \
                 is lost. Bring the pods back (scale the pool up again), or remove them from \
                 the cohort as docs/runbooks/MultigresShardCohortDegraded.md says",
                cohort.missing.join(", ")
            ),
        );
    }
    let outside: Vec<&str> = cohort
        .pods
        .keys()
        .filter(|name| !cohort.takes_part(name))
        .map(String::as_str)
        .collect();
    if !outside.is_empty() {
        return Computed::no(
            COHORT_HEALTHY,
            "PodsOutsideCohort",
            format!(
                "pods {} are not in the cohort yet: multiorch adds a pod once it streams from \
                 the primary. Restarts and scale-downs of this shard wait for them",
                outside.join(", ")
            ),
        );
    }
    let lagging: Vec<String> = participants
        .members
        .iter()
        .chain(participants.leader)
        .filter(|m| !participants.healthy.contains(m))
        .map(|m| {
            let how = match cohort.pods.get(&m.name).map(|p| p.replication) {
                Some(Replication::Unreachable) => "its multipooler does not answer",
                _ if cohort.leader.as_ref() == Some(&m.name) => "it leads but is not the primary",
                _ => "it does not stream from the primary",
            };
            format!("{} ({how})", m.name)
        })
        .collect();
    if !lagging.is_empty() {
        return Computed::no(
            COHORT_HEALTHY,
            "MembersNotStreaming",
            format!(
                "cohort members {} cannot acknowledge commits now; restarts and scale-downs of \
                 this shard wait for them",
                lagging.join(", ")
            ),
        );
    }
    Computed::yes(
        COHORT_HEALTHY,
        "CohortComplete",
        format!(
            "all {} pool pods take part in commits ({policy}): the primary {} streams to every \
             cohort member",
            cohort.pods.len(),
            cohort.leader.as_deref().unwrap_or("?"),
        ),
    )
}

/// Whether writes go on without `lost`: when it leads, a majority of the cohort must remain to
/// elect a new primary among the members, which then needs the policy met by the members left;
/// otherwise the leader and the members left must meet the policy.
fn survives(
    policy: &Policy,
    participants: &Participants<'_>,
    leader: Option<&str>,
    lost: &Member,
) -> bool {
    let left = |m: &&&Member| m.name != lost.name;
    let members_left: Vec<&Member> = participants
        .healthy
        .iter()
        .filter(left)
        .filter(|m| participants.members.contains(*m))
        .copied()
        .collect();
    if leader == Some(lost.name.as_str()) || leader.is_none() {
        let majority = participants.members.len() / 2 + 1;
        members_left.len() >= majority && policy.met_by(&members_left)
    } else {
        let writers: Vec<&Member> = participants.healthy.iter().filter(left).copied().collect();
        writers.iter().any(|m| Some(m.name.as_str()) == leader) && policy.met_by(&writers)
    }
}

/// `FailureTolerant`: whether losing any one healthy participant (the primary included) leaves
/// a shard that still accepts writes (see [`survives`]).
fn tolerance(policy: &Policy, participants: &Participants<'_>, leader: Option<&str>) -> Computed {
    let healthy = &participants.healthy;
    let tolerant = !healthy.is_empty()
        && healthy
            .iter()
            .all(|m| survives(policy, participants, leader, m));
    let unit = policy.unit();
    let size = participants.members.len();
    if tolerant {
        return Computed::yes(
            FAILURE_TOLERANT,
            "SurvivesOnePodLoss",
            format!(
                "writes go on if any one pool pod is lost: {} pods take part in commits, {} \
                 needs {} {unit}",
                healthy.len(),
                policy.name,
                policy.required
            ),
        );
    }
    let advice = if policy.by_cells {
        format!(
            "run pool pods in at least {} cells, or at least 2 per cell in {} cells, with every \
             pod a healthy cohort member",
            policy.required + 1,
            policy.required
        )
    } else {
        format!(
            "run at least {} pool pods (replicasPerCell times cells), with every pod a healthy \
             cohort member",
            policy.required + 1
        )
    };
    Computed::no(
        FAILURE_TOLERANT,
        "OnePodLossStopsWrites",
        format!(
            "losing one pool pod stops writes until it returns: {} pods take part in commits \
             ({size} cohort members), and {} needs {} {unit} plus a majority of the cohort to \
             elect a primary; {advice}",
            healthy.len(),
            policy.name,
            policy.required
        ),
    )
}

/// Sets the cohort and primaries gauges of every Shard in `shards` whose status has a cohort:
/// one that had a primary elected, so a shard still bootstrapping reports no missing primary.
/// A hibernating shard has no pod to count, and its cohort as it went to sleep is no news.
pub fn collect(gauges: &mut StatusGauges, shards: &Store<Guarded<Shard>>) {
    for shard in shards.state() {
        let Ok(shard) = &shard.0 else { continue };
        if multigres_api::labels::hibernated(shard.annotations()) {
            continue;
        }
        let Some(status) = &shard.status else {
            continue;
        };
        let Some(cohort) = &status.cohort else {
            continue;
        };
        let (counts, lag) = counts(cohort);
        let namespace = shard.namespace().unwrap_or_default();
        let name = shard.name_any();
        gauges.set_shard_cohort(&namespace, &name, counts, lag);
        gauges.set_shard_primaries(&namespace, &name, primaries(status));
    }
}

/// Pool pods that serve as the shard's primary, for the primaries gauge: named `PRIMARY` in
/// `podRoles` (a current pool pod whose pooler record routes as primary) and answering as the
/// primary in the cohort. The topology alone still names a primary lost with its node (its
/// record claims the role until it returns), and the cohort alone still names the last one
/// seen when no multipooler answers (`CohortUnreadable`) or every pool pod is gone; so 0
/// whenever either says there is none.
fn primaries(status: &ShardStatus) -> i64 {
    let unreadable = status
        .conditions
        .iter()
        .any(|c| c.type_ == COHORT_HEALTHY && c.reason == UNREADABLE);
    let Some(cohort) = status.cohort.as_ref().filter(|_| !unreadable) else {
        return 0;
    };
    status
        .pod_roles
        .iter()
        .filter(|(pod, role)| {
            *role == roles::PRIMARY
                && cohort
                    .pods
                    .get(*pod)
                    .is_some_and(|p| p.replication == Replication::Primary)
        })
        .count() as i64
}

/// The gauge values of a published cohort: its counts, and each standby's lag in bytes.
fn counts(cohort: &CohortStatus) -> (gauges::Cohort, Vec<(String, i64)>) {
    let takes_part = cohort.pods.keys().filter(|p| cohort.takes_part(p)).count();
    let counts = gauges::Cohort {
        members: (takes_part + cohort.missing.len()) as i64,
        healthy: cohort.pods.keys().filter(|p| cohort.is_healthy(p)).count() as i64,
        required: cohort.required.map_or(0, i64::from),
        pods: cohort.pods.len() as i64,
    };
    let lag = cohort
        .pods
        .iter()
        .filter(|(_, p)| p.replication != Replication::Primary)
        .map(|(pod, p)| (pod.clone(), p.lag_mebibytes.unwrap_or(0) << 20))
        .collect();
    (counts, lag)
}

/// What to publish after this pass over `stored`: the cohort and both conditions as `answers`
/// show them; when no multipooler reported a rule, the stored cohort and `CohortHealthy`
/// `Unknown` (the stored `FailureTolerant` stays). `lastTransitionTime` moves only when a
/// condition's status does.
pub fn next(
    stored: &Published,
    answers: &[Answer],
    now: Timestamp,
    generation: Option<i64>,
) -> Published {
    let mut conditions = stored.conditions.clone();
    match assess(answers) {
        Some(assessed) => {
            for condition in &assessed.conditions {
                condition.set_on(&mut conditions, generation, now);
            }
            Published {
                cohort: Some(assessed.cohort),
                conditions,
            }
        }
        None => {
            let silent: Vec<&str> = answers.iter().map(|a| a.pod.name.as_str()).collect();
            let unknown = Computed::unknown(
                COHORT_HEALTHY,
                UNREADABLE,
                format!(
                    "no multipooler of pods {} reported the shard's consensus rule: the cohort \
                     cannot be read now (see the multipooler logs); restarts and scale-downs \
                     wait for recreated pods until it can",
                    silent.join(", ")
                ),
            );
            unknown.set_on(&mut conditions, generation, now);
            Published {
                cohort: stored.cohort.clone(),
                conditions,
            }
        }
    }
}

#[cfg(test)]
mod tests;
