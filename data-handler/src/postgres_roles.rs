//! Keeps a shard's PostgreSQL roles as its cluster declares them
//! ([`multigres_api::managed_roles`]: the web UI's read-only role, the application role and
//! `spec.roles`), and says how each stands in `Shard.status.roles`.
//!
//! The statements run on the shard's primary through its multipooler's query service
//! (`MultipoolerService.ExecuteQuery`), as the superuser the multipooler is configured with:
//! the operator never reads the superuser password, and reaches PostgreSQL only where the
//! cluster's NetworkPolicy already lets the data-handler call multipoolers. A role's password
//! is read from its Secret (a GET, each Secret at most every [`REREAD`]) and sent as a SCRAM
//! verifier ([`scram`]); no password is in a statement, log, event or status.
//!
//! A shard is checked when what the check depends on changes (the declared roles, their
//! passwords, the primary) and otherwise every [`CHECK`], which also puts back what someone
//! changed by hand. A check reads the roles (one query), and runs only the statements that
//! differ ([`plan`]); after it changed something it checks again at once, to confirm.

pub mod plan;
pub mod scram;

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::{Api, ResourceExt};
use multigres_api::managed_roles::{self, DesiredRole, PasswordSource};
use multigres_api::v1alpha1::{MultigresCluster, RoleState, RoleStatus, Shard};
use multigres_common::events::Notice;
use multigres_common::telemetry::ErrorChain;
use multigres_proto::multipooler::multipoolerservice::multipooler_service_client::MultipoolerServiceClient;
use multigres_proto::multipooler::multipoolerservice::{ExecuteQueryRequest, ExecuteQueryResponse};
use multigres_proto::multipooler::query::{ExecuteOptions, Mode, Target};
use multigres_proto::topo::ShardKey as TopoShardKey;
use tonic::transport::Channel;

use crate::backup_health::{Checks, slot};

use crate::dial::Dial;
use crate::reload;
use crate::roles::{self, PoolPod, ShardKey};
use crate::topo::PoolerRecord;

/// Longest time between two checks of a shard's roles.
pub const CHECK: Duration = Duration::from_secs(30);
/// How long a read password Secret is used before it is read again: an edited password
/// reaches PostgreSQL within this and a reconcile period.
pub const REREAD: Duration = Duration::from_secs(15);
/// Time allowed for one statement: each is small, and a primary that does not answer soon is
/// asked again at the next pass rather than holding up the Shard's status.
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(5);
/// Time allowed for a whole check.
const DEADLINE: Duration = Duration::from_secs(10);
/// How soon a shard is checked again after a check changed something or could not be made.
pub const RETRY: Duration = Duration::from_secs(3);
/// Event reasons.
const ROLES_CHANGED: &str = "RolesChanged";
const ROLE_FAILED: &str = "RoleFailed";

/// A Secret's data, by key; `None`: no such Secret.
type SecretData = Option<BTreeMap<String, Vec<u8>>>;

/// Password Secrets read so far, by `namespace/name`, and when.
pub struct Passwords {
    client: kube::Client,
    read: Mutex<HashMap<String, (Instant, SecretData)>>,
}

impl Passwords {
    /// Passwords whose Secrets are read with `client`.
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            read: Mutex::new(HashMap::new()),
        }
    }

    /// The data of Secret `name` in `namespace`, read at most every [`REREAD`].
    async fn data(&self, namespace: &str, name: &str) -> Result<SecretData, kube::Error> {
        let slot = format!("{namespace}/{name}");
        if let Some((at, data)) = self.lock().get(&slot)
            && at.elapsed() < REREAD
        {
            return Ok(data.clone());
        }
        let secret = Api::<Secret>::namespaced(self.client.clone(), namespace)
            .get_opt(name)
            .await?;
        let data = secret.map(|s| {
            s.data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.0))
                .collect()
        });
        let mut read = self.lock();
        read.retain(|_, (at, _)| at.elapsed() < REREAD);
        read.insert(slot, (Instant::now(), data.clone()));
        Ok(data)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Instant, SecretData)>> {
        self.read
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// What the roles step borrows from the Shard controller.
pub struct StepInputs<'a> {
    /// When each shard's roles were last checked, and against what.
    pub checks: &'a Checks,
    /// The password Secrets.
    pub passwords: &'a Passwords,
    /// How to reach the shard's multipoolers.
    pub dial: &'a Dial,
}

/// What a check found.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Each role's state, when the shard was checked now (else the stored one stands).
    pub statuses: Option<Vec<RoleStatus>>,
    /// What changed or failed, for events.
    pub notices: Vec<Notice>,
    /// Whether to check again soon: something changed (to confirm it), or the check could
    /// not be made.
    pub again_soon: bool,
}

/// Checks the roles of `shard` (of `cluster`) on its primary among `pods`, within
/// [`DEADLINE`]: the Shard's other steps and its status wait for this one.
pub async fn run(
    lent: &StepInputs<'_>,
    shard: &Shard,
    cluster: Option<&MultigresCluster>,
    key: ShardKey<'_>,
    pods: &[PoolPod],
    poolers: &BTreeMap<String, Option<Vec<PoolerRecord>>>,
) -> Outcome {
    let check = check(lent, shard, cluster, key, pods, poolers);
    match tokio::time::timeout(DEADLINE, check).await {
        Ok(outcome) => outcome,
        Err(_) => {
            lent.checks.forget(&slot(shard));
            Outcome {
                again_soon: true,
                ..Outcome::default()
            }
        }
    }
}

async fn check(
    lent: &StepInputs<'_>,
    shard: &Shard,
    cluster: Option<&MultigresCluster>,
    key: ShardKey<'_>,
    pods: &[PoolPod],
    poolers: &BTreeMap<String, Option<Vec<PoolerRecord>>>,
) -> Outcome {
    let Some(cluster) = cluster else {
        return Outcome::default();
    };
    let namespace = shard.namespace().unwrap_or_default();
    let stored = shard
        .status
        .as_ref()
        .map(|s| s.roles.clone())
        .unwrap_or_default();
    let desired = match managed_roles::desired(&cluster.spec, &cluster.name_any()) {
        Ok(desired) => desired,
        Err(error) => {
            let statuses = cluster
                .spec
                .roles
                .iter()
                .map(|r| status(&r.name, RoleState::Failed, Some(error.to_string())))
                .collect();
            return finish(&stored, statuses, Vec::new(), false);
        }
    };
    let (passwords, waiting) = passwords_of(lent.passwords, &namespace, &desired).await;
    let Some((pod, record)) = roles::primary(key, pods, poolers) else {
        // Read again with the shard, every roles period: a primary makes no Kubernetes event.
        return pending_all(&stored, &desired, "the shard has no primary yet", false);
    };
    let published = shard
        .status
        .as_ref()
        .and_then(|s| s.pod_roles.get(&pod.name));
    if published.map(String::as_str) != Some(roles::PRIMARY) {
        // A new primary is published first (gateways, restarts and Available wait for it);
        // its roles are checked from the next pass on.
        let why = format!("waiting for primary {} to be published", pod.name);
        return pending_all(&stored, &desired, &why, true);
    }
    let Some(address) = reload::address(record) else {
        return pending_all(
            &stored,
            &desired,
            &format!(
                "the pooler record of primary {} names no gRPC address",
                pod.name
            ),
            false,
        );
    };
    let slot = slot(shard);
    let depends_on = fingerprint(&pod.name, &desired, &passwords, &waiting);
    if !lent
        .checks
        .due_after(&slot, &depends_on, Instant::now(), CHECK)
    {
        return Outcome::default();
    }
    let shard_name = format!("{}/{}/{}", key.database, key.table_group, key.shard);
    let session = Session {
        key,
        superuser: managed_roles::superuser(&cluster.spec).to_owned(),
        address: address.clone(),
    };
    let mut client = match lent.dial.channel(&address, STATEMENT_TIMEOUT).await {
        Ok(channel) => MultipoolerServiceClient::new(channel),
        Err(error) => {
            lent.checks.forget(&slot);
            return pending_all(&stored, &desired, &ErrorChain(&error).to_string(), true);
        }
    };
    let tables: Vec<String> = desired.iter().flat_map(|r| r.reads.clone()).collect();
    let observed = match session
        .query(
            &mut client,
            &plan::observe(desired.iter().map(|r| r.name.as_str()), &tables),
        )
        .await
        .and_then(|answer| {
            plan::parse(&answer).map_err(|e| format!("its answer is not the expected JSON: {e}"))
        }) {
        Ok(observed) => observed,
        Err(why) => {
            lent.checks.forget(&slot);
            let why =
                format!("cannot read the roles from the primary's multipooler at {address}: {why}");
            return pending_all(&stored, &desired, &why, true);
        }
    };
    let wanted = Wanted {
        desired: &desired,
        passwords: &passwords,
        waiting: &waiting,
    };
    let (statuses, done, failures) =
        converge(&session, &mut client, &wanted, &observed, &shard_name).await;
    let changed = !done.is_empty();
    if changed || !failures.is_empty() {
        // Confirm what changed (and grant reads on tables of roles created now) at once; a
        // failure is tried again soon too.
        lent.checks.forget(&slot);
    }
    let mut notices = Vec::new();
    if changed {
        notices.push(Notice::normal(
            ROLES_CHANGED,
            format!("shard {shard_name}: {}", done.join("; ")),
        ));
    }
    finish(&stored, statuses, notices, changed || !failures.is_empty())
}

/// The passwords of the roles of `desired` that are to exist and take one from a Secret in
/// `namespace`, by role name; and, for those whose Secret cannot give one yet, why.
async fn passwords_of(
    passwords: &Passwords,
    namespace: &str,
    desired: &[DesiredRole],
) -> (BTreeMap<String, Vec<u8>>, BTreeMap<String, String>) {
    let mut found = BTreeMap::new();
    let mut waiting = BTreeMap::new();
    for role in desired.iter().filter(|r| r.present) {
        let Some(source) = &role.password else {
            continue;
        };
        match password(passwords, namespace, source).await {
            Ok(password) => {
                found.insert(role.name.clone(), password);
            }
            Err(why) => {
                waiting.insert(role.name.clone(), why);
            }
        }
    }
    (found, waiting)
}

/// The roles a pass wants, with the passwords read and the roles still waiting for theirs.
struct Wanted<'a> {
    desired: &'a [DesiredRole],
    passwords: &'a BTreeMap<String, Vec<u8>>,
    waiting: &'a BTreeMap<String, String>,
}

/// Runs, through `session`, the statements that make each wanted role what it should be over
/// what the primary has (`observed`): each role's status, the changes made, and the failures
/// (a role's first failed statement ends that role's statements).
async fn converge(
    session: &Session<'_>,
    client: &mut MultipoolerServiceClient<Channel>,
    wanted: &Wanted<'_>,
    observed: &[plan::Observed],
    shard_name: &str,
) -> (Vec<RoleStatus>, Vec<String>, Vec<String>) {
    let mut statuses = Vec::new();
    let mut done = Vec::new();
    let mut failures = Vec::new();
    for role in wanted.desired {
        if let Some(why) = wanted.waiting.get(&role.name) {
            statuses.push(status(&role.name, RoleState::Pending, Some(why.clone())));
            continue;
        }
        let found = observed.iter().find(|o| o.name == role.name);
        let password = wanted.passwords.get(&role.name).map(Vec::as_slice);
        let mut failed = None;
        for statement in plan::plan(role, password, found) {
            match session.execute(client, &statement.sql).await {
                Ok(()) => done.push(statement.describe),
                Err(why) => {
                    failed = Some(format!(
                        "shard {shard_name}: could not {}: {why}",
                        undescribe(&statement.describe)
                    ));
                    break;
                }
            }
        }
        statuses.push(match failed {
            Some(why) => {
                failures.push(why.clone());
                status(&role.name, RoleState::Failed, Some(why))
            }
            None if role.present => status(&role.name, RoleState::Reconciled, None),
            None => status(&role.name, RoleState::Dropped, None),
        });
    }
    (statuses, done, failures)
}

/// The password of `source`, or why it is not there.
async fn password(
    passwords: &Passwords,
    namespace: &str,
    source: &PasswordSource,
) -> Result<Vec<u8>, String> {
    let secret = &source.secret;
    match passwords.data(namespace, secret).await {
        Ok(Some(data)) => match data.get(&source.key) {
            Some(bytes) if !bytes.is_empty() => Ok(bytes.clone()),
            _ => Err(format!(
                "Secret {namespace}/{secret} has no key {}; add the password under it",
                source.key
            )),
        },
        Ok(None) if source.generated => Err(format!(
            "Secret {namespace}/{secret} is not made yet (the resource-handler generates it)"
        )),
        Ok(None) => Err(format!(
            "Secret {namespace}/{secret} is not found; create it with the password under key {}",
            source.key
        )),
        Err(error) => Err(format!(
            "Secret {namespace}/{secret} cannot be read: {}",
            ErrorChain(&error)
        )),
    }
}

/// What a check depends on, as one string: the primary, the desired roles and a digest of
/// their passwords (never the passwords themselves).
fn fingerprint(
    primary: &str,
    desired: &[DesiredRole],
    passwords: &BTreeMap<String, Vec<u8>>,
    waiting: &BTreeMap<String, String>,
) -> String {
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    context.update(format!("{desired:?}{waiting:?}").as_bytes());
    for (name, password) in passwords {
        context.update(name.as_bytes());
        context.update(&[0]);
        context.update(password);
        context.update(&[0]);
    }
    let digest = context.finish();
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("{primary}/{hex}")
}

/// "created role x" → "create role x", for "could not ...".
fn undescribe(describe: &str) -> String {
    let (verb, rest) = describe.split_once(' ').unwrap_or((describe, ""));
    let base = match verb {
        "created" => "create",
        "dropped" => "drop",
        "granted" => "grant",
        "revoked" => "revoke",
        "gave" => "give",
        other => other,
    };
    format!("{base} {rest}")
}

fn status(name: &str, state: RoleState, message: Option<String>) -> RoleStatus {
    RoleStatus {
        name: name.to_owned(),
        state,
        message,
    }
}

fn pending_all(
    stored: &[RoleStatus],
    desired: &[DesiredRole],
    why: &str,
    again_soon: bool,
) -> Outcome {
    let statuses = desired
        .iter()
        .map(|r| status(&r.name, RoleState::Pending, Some(why.to_owned())))
        .collect();
    finish(stored, statuses, Vec::new(), again_soon)
}

/// The outcome, with a Warning for each role that failed now and had not failed so before.
fn finish(
    stored: &[RoleStatus],
    statuses: Vec<RoleStatus>,
    mut notices: Vec<Notice>,
    again_soon: bool,
) -> Outcome {
    for s in statuses.iter().filter(|s| s.state == RoleState::Failed) {
        if !stored.contains(s) {
            notices.push(Notice::warning(
                ROLE_FAILED,
                format!(
                    "role {}: {}. Fix the role in the MultigresCluster spec, or what the \
                     message names; retried every {} s.",
                    s.name,
                    s.message.as_deref().unwrap_or("failed"),
                    CHECK.as_secs()
                ),
            ));
        }
    }
    Outcome {
        statuses: Some(statuses),
        notices,
        again_soon,
    }
}

/// Statements on one shard's primary (or, read-only, on any of its pods), as the superuser.
pub(crate) struct Session<'a> {
    /// The shard.
    pub(crate) key: ShardKey<'a>,
    /// The role the statements run as.
    pub(crate) superuser: String,
    /// The multipooler asked (the primary's, but for read-only requests).
    pub(crate) address: String,
}

impl Session<'_> {
    /// The request that runs `sql` on the primary.
    pub(crate) fn request(&self, sql: &str) -> ExecuteQueryRequest {
        self.request_in(sql, Mode::Writable)
    }

    /// The request that runs the read-only `sql` on whichever pod the address names, a replica
    /// too (a writable request there is refused as meant for the primary).
    pub(crate) fn read_request(&self, sql: &str) -> ExecuteQueryRequest {
        self.request_in(sql, Mode::Inconsistent)
    }

    fn request_in(&self, sql: &str, mode: Mode) -> ExecuteQueryRequest {
        ExecuteQueryRequest {
            query: sql.to_owned(),
            target: Some(Target {
                shard_key: Some(TopoShardKey {
                    database: self.key.database.to_owned(),
                    table_group: self.key.table_group.to_owned(),
                    shard: self.key.shard.to_owned(),
                }),
                mode: mode as i32,
            }),
            options: Some(ExecuteOptions {
                user: self.superuser.clone(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    async fn call(
        &self,
        client: &mut MultipoolerServiceClient<Channel>,
        sql: &str,
    ) -> Result<ExecuteQueryResponse, String> {
        client
            .execute_query(self.request(sql))
            .await
            .map(tonic::Response::into_inner)
            .map_err(|status| status.message().to_owned())
    }

    /// Runs `sql`, which answers nothing the caller needs.
    async fn execute(
        &self,
        client: &mut MultipoolerServiceClient<Channel>,
        sql: &str,
    ) -> Result<(), String> {
        self.call(client, sql).await.map(|_| ())
    }

    /// Runs `sql` and gives the first column of its first row, as text.
    async fn query(
        &self,
        client: &mut MultipoolerServiceClient<Channel>,
        sql: &str,
    ) -> Result<String, String> {
        let answer = self.call(client, sql).await?;
        self.first_value(answer)
    }

    /// Runs one statement (`request`, from [`Self::request`] or [`Self::read_request`]) on the
    /// pooler behind this session, on its own connection, and gives the first column of its
    /// first row; all within `timeout`, the connection included.
    pub(crate) async fn ask(
        &self,
        dial: &Dial,
        request: ExecuteQueryRequest,
        timeout: Duration,
    ) -> Result<String, String> {
        let ask = async {
            let channel = dial
                .channel(&self.address, timeout)
                .await
                .map_err(|e| e.to_string())?;
            let answer = MultipoolerServiceClient::new(channel)
                .execute_query(request)
                .await
                .map_err(|status| status.message().to_owned())?
                .into_inner();
            self.first_value(answer)
        };
        tokio::time::timeout(timeout, ask)
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {} s", timeout.as_secs())))
    }

    /// The first column of `answer`'s first row, as text.
    pub(crate) fn first_value(&self, answer: ExecuteQueryResponse) -> Result<String, String> {
        let row = answer
            .result
            .and_then(|r| r.rows.into_iter().next())
            .ok_or_else(|| format!("the multipooler at {} answered no row", self.address))?;
        let length = row.lengths.first().copied().unwrap_or(-1);
        let value = usize::try_from(length)
            .ok()
            .and_then(|n| row.values.get(..n))
            .ok_or_else(|| "the answer's first column is empty".to_owned())?;
        String::from_utf8(value.to_vec()).map_err(|_| "the answer is not UTF-8".to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_announced_once() {
        let failed = status("r", RoleState::Failed, Some("shard x: no".into()));
        let outcome = finish(&[], vec![failed.clone()], Vec::new(), true);
        assert_eq!(outcome.notices.len(), 1);
        assert!(
            outcome.notices[0]
                .message
                .starts_with("role r: shard x: no. Fix the role")
        );
        let again = finish(
            std::slice::from_ref(&failed),
            vec![failed.clone()],
            Vec::new(),
            true,
        );
        assert!(again.notices.is_empty());
    }

    #[test]
    fn the_fingerprint_changes_with_a_password_but_does_not_hold_it() {
        let passwords = |p: &[u8]| BTreeMap::from([("app".to_owned(), p.to_vec())]);
        let a = fingerprint("pod-0", &[], &passwords(b"secret-one"), &BTreeMap::new());
        let b = fingerprint("pod-0", &[], &passwords(b"secret-two"), &BTreeMap::new());
        let c = fingerprint("pod-1", &[], &passwords(b"secret-one"), &BTreeMap::new());
        assert!(a != b && a != c);
        assert!(!a.contains("secret"));
    }

    #[test]
    fn a_failed_statement_is_said_as_what_could_not_be_done() {
        assert_eq!(undescribe("created role app"), "create role app");
        assert_eq!(
            undescribe("set the password of role app from its Secret"),
            "set the password of role app from its Secret"
        );
    }
}
