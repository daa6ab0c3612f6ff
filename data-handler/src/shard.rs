//! The Shard roles controller: reads the pooler records of the shard's cells and publishes each
//! pool pod's role on `Shard.status.podRoles` (`PRIMARY` / `REPLICA`) and as the pod label
//! `multigres.com/role` (`primary` / `replica`). The resource-handler orders restarts with it:
//! replicas first, the primary last.
//!
//! It also delivers reload-class PostgreSQL configuration changes (see [`crate::reload`]): each
//! pool pod whose PostgreSQL has not confirmed the rendered file's reload-class settings is
//! asked, through its multipooler, to reload; a confirmed reload is stamped on the pod.
//!
//! It also answers the resource-handler's switchover requests (see [`crate::switchover`]): a
//! requested primary's multipooler is asked to resign leadership.
//!
//! It also publishes the shard's backup health (see [`crate::backup_health`]):
//! `status.lastBackupTime`, `status.lastBackupType` and the condition `BackupHealthy`, from the
//! primary's multipooler, at most once a minute.
//!
//! Its status fields (`podRoles` and the backup ones) are written together, by a server-side
//! apply with the data-handler's field manager: an apply drops the manager's fields it leaves
//! out.
//!
//! etcd changes make no Kubernetes event, so each Shard is read again every `roles_period`.
//! Nothing is written when the published roles, labels and stamps already match.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference, Pod};
use kube::runtime::controller::Action;
use kube::runtime::events::Recorder;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};
use multigres_api::labels::{self, Component, ROLE};
use multigres_api::names;
use multigres_api::postgres::RELOAD_HASH_ANNOTATION;
use multigres_api::v1alpha1::{Cell, MultigresCluster, Shard, TopoServer};
use multigres_common::apply::ApplyError;
use multigres_common::backoff::ObjectBackoff;
use multigres_common::controller::{Classify, WithBackoff};
use multigres_common::state::HandlerState;
use multigres_common::telemetry::ErrorChain;
use serde_json::json;

use crate::Settings;
use crate::backup_health::{self, Published};
use crate::conditions::Notice;
use crate::reload::{self, Desired, DesiredError, PodState, Verdict};
use crate::roles::{self, PoolPod, ShardKey};
use crate::switchover;
use crate::target::{CellTopo, ConnectError, Connections, Target, TargetError};
use crate::topo::{CellTls, TopoError};
use crate::watch::{Guarded, full_name, valid, valid_in};
use crate::writes::Writer;

/// Name of this controller in metrics and `HandlerInfo`.
pub const CONTROLLER: &str = "shard-roles";

/// Why a Shard's roles could not be published.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The stored object does not match the API types.
    #[error("Shard {name} cannot be read: {message}")]
    Malformed { name: String, message: String },
    /// The Shard names no MultigresCluster that exists (yet).
    #[error("MultigresCluster {cluster} of this Shard is not found")]
    ClusterNotFound { cluster: String },
    /// The topology server settings cannot be used.
    #[error(transparent)]
    Target(#[from] TargetError),
    /// The connection could not be prepared (TLS Secrets).
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// A cell's pooler records could not be read; the other cells' roles were published.
    #[error("cannot read the pooler records of cell {cell}")]
    Poolers {
        cell: String,
        #[source]
        source: TopoError,
    },
    /// A cell's own topology settings cannot be used; the other cells' roles were published,
    /// and the Shard is read again periodically, since only that cell needs a change.
    #[error("cell {cell}")]
    CellTarget {
        cell: String,
        #[source]
        source: TargetError,
    },
    /// A cell's own topology connection could not be prepared (its TLS Secrets).
    #[error("cell {cell}")]
    CellConnect {
        cell: String,
        #[source]
        source: ConnectError,
    },
    /// Writing `status.podRoles` failed.
    #[error("cannot write the status")]
    Status(#[source] ApplyError),
    /// The rendered postgresql.conf cannot be read back; reloads wait for it to be rewritten.
    #[error(transparent)]
    Config(#[from] DesiredError),
    /// Writing a pod's role label or reload stamp failed.
    #[error("cannot label pod {pod}")]
    Label {
        pod: String,
        #[source]
        source: kube::Error,
    },
}

impl Classify for Error {
    /// Whether only a change can fix this (no periodic retry).
    fn is_invalid_spec(&self) -> bool {
        matches!(
            self,
            Error::Malformed { .. } | Error::Target(_) | Error::Config(_)
        )
    }

    /// Short category, for metrics.
    fn category(&self) -> &'static str {
        match self {
            Error::Malformed { .. } => "malformed",
            Error::ClusterNotFound { .. } => "cluster_not_found",
            Error::Target(_) | Error::CellTarget { .. } => "invalid_spec",
            Error::Config(_) => "config",
            Error::Connect(_) | Error::CellConnect { .. } => "connect",
            Error::Poolers { .. } => "topo",
            Error::Status(_) | Error::Label { .. } => "kube_api",
        }
    }
}

impl From<switchover::LabelError> for Error {
    fn from(switchover::LabelError { pod, source }: switchover::LabelError) -> Self {
        Error::Label { pod, source }
    }
}

/// What every reconcile of this controller shares.
pub struct Context {
    /// MultigresClusters, for each Shard's connection settings.
    pub clusters: Store<Guarded<MultigresCluster>>,
    /// Cells, for the settings of a cell's own topology server.
    pub cells: Store<Guarded<Cell>>,
    /// Pool pods managed by the operator.
    pub pods: Store<Guarded<Pod>>,
    /// The shards' rendered postgresql.conf ConfigMaps.
    pub config_maps: Store<Guarded<ConfigMap>>,
    /// Managed TopoServers: a server still starting is not read yet.
    pub topo_servers: Store<Guarded<TopoServer>>,
    /// Open topology connections.
    pub connections: Arc<Connections>,
    /// The write path.
    pub writer: Writer,
    /// Events on Shards about reloads.
    pub recorder: Recorder,
    /// Why each pod's reload is waiting, as last reported (`namespace/pod` → note), so a
    /// waiting reload is announced once, not on every retry.
    pub reload_waits: Mutex<HashMap<String, String>>,
    /// Pending switchover requests' attempts (backoff, events announced).
    pub switchovers: switchover::Attempts,
    /// When each shard's backups were last checked.
    pub backup_checks: backup_health::Checks,
    /// Reconcile counts for `HandlerInfo` and metrics.
    pub state: HandlerState,
    /// Retry delays of failing Shards.
    pub backoff: ObjectBackoff<ObjectRef<Guarded<Shard>>>,
    /// Periods and timeouts.
    pub settings: Settings,
}

/// Reconciles one Shard and records the outcome.
pub async fn reconcile(obj: Arc<Guarded<Shard>>, ctx: Arc<Context>) -> Result<Action, Error> {
    let key = ObjectRef::from_obj(&*obj);
    ctx.state
        .run_reconcile(
            CONTROLLER,
            &ctx.backoff,
            &key,
            Error::category,
            reconcile_shard(&obj, &ctx),
        )
        .await
}

impl WithBackoff<Guarded<Shard>> for Context {
    fn backoff(&self) -> &ObjectBackoff<ObjectRef<Guarded<Shard>>> {
        &self.backoff
    }
}

/// How to reach the topology of `cell` of cluster `cluster`: its own etcd's settings when its
/// Cell has one, else the global topology's (also while the Cell is not in the cache yet: its
/// record, where the addresses come from, is written from that Cell).
async fn cell_tls(
    ctx: &Context,
    namespace: &str,
    cluster: &str,
    cell: &str,
) -> Result<CellTls, Error> {
    let topo = match valid(&ctx.cells, namespace, &names::cell(cluster, cell)) {
        Some(resource) => CellTopo::of(&resource.spec).map_err(|source| Error::CellTarget {
            cell: cell.to_owned(),
            source,
        })?,
        None => CellTopo::Global,
    };
    ctx.connections
        .cell_tls(namespace, &topo)
        .await
        .map_err(|source| Error::CellConnect {
            cell: cell.to_owned(),
            source,
        })
}

/// The Shard a pool pod belongs to, from its labels, for mapping pod changes.
pub fn shard_of(pod: &Pod) -> Option<ObjectRef<Guarded<Shard>>> {
    let l = pod.labels();
    let name = names::shard(
        l.get(labels::CLUSTER)?,
        l.get(labels::DATABASE)?,
        l.get(labels::TABLE_GROUP)?,
        l.get(labels::SHARD)?,
    );
    Some(ObjectRef::new(&name).within(&pod.namespace()?))
}

/// Whether `pod` is a pool pod of `shard` (of cluster `cluster`).
pub fn is_pool_pod_of(pod: &Pod, shard: &Shard, cluster: &str) -> bool {
    let l = pod.labels();
    let is = |key: &str, value: &str| l.get(key).map(String::as_str) == Some(value);
    is(labels::CLUSTER, cluster)
        && is(labels::COMPONENT, Component::Pool.as_str())
        && is(labels::DATABASE, shard.spec.database_name.as_str())
        && is(labels::TABLE_GROUP, shard.spec.table_group_name.as_str())
        && is(labels::SHARD, shard.spec.shard_name.as_str())
}

async fn reconcile_shard(obj: &Guarded<Shard>, ctx: &Context) -> Result<Action, Error> {
    let shard = obj.0.as_ref().map_err(|invalid| Error::Malformed {
        name: full_name(obj),
        message: invalid.error.clone(),
    })?;
    if shard.meta().deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let namespace = shard.namespace().unwrap_or_default();
    let cluster_name = shard
        .labels()
        .get(labels::CLUSTER)
        .cloned()
        .unwrap_or_default();
    let cluster =
        valid(&ctx.clusters, &namespace, &cluster_name).ok_or_else(|| Error::ClusterNotFound {
            cluster: format!("{namespace}/{cluster_name}"),
        })?;
    let target = Target::new(&cluster, &shard.spec.global_topo_server)?;
    let topo_server = valid(
        &ctx.topo_servers,
        &namespace,
        &names::global_topo_server(&cluster_name),
    );
    if crate::target::waiting_for(&target, topo_server.as_ref()).is_some() {
        // No pooler can have registered before the topology server serves.
        return Ok(Action::requeue(ctx.settings.roles_period));
    }
    let store = ctx.connections.open(&namespace, &target).await?;

    let cells: BTreeSet<&str> = shard
        .spec
        .pools
        .values()
        .flat_map(|p| p.cells.iter().map(|c| c.as_str()))
        .collect();
    let mut poolers = BTreeMap::new();
    let mut failure = None;
    for cell in cells {
        let tls = match cell_tls(ctx, &namespace, &cluster_name, cell).await {
            Ok(tls) => tls,
            Err(error) => {
                failure.get_or_insert(error);
                poolers.insert(cell.to_owned(), None);
                continue;
            }
        };
        let records = match store.list_poolers(cell, &tls).await {
            Ok(records) => Some(records),
            // No Cell record yet: no pooler can have registered in it either.
            Err(TopoError::CellNotRegistered { .. }) => Some(Vec::new()),
            Err(source) => {
                failure.get_or_insert(Error::Poolers {
                    cell: cell.to_owned(),
                    source,
                });
                None
            }
        };
        poolers.insert(cell.to_owned(), records);
    }

    let pods: Vec<Pod> = valid_in(&ctx.pods, &namespace, |p| {
        is_pool_pod_of(p, shard, &cluster_name)
    });
    let pool_pods: Vec<PoolPod> = pods
        .iter()
        .map(|p| PoolPod {
            name: p.name_any(),
            cell: p.labels().get(labels::CELL).cloned(),
        })
        .collect();
    let previous = shard
        .status
        .as_ref()
        .map(|s| s.pod_roles.clone())
        .unwrap_or_default();
    let key = ShardKey {
        database: shard.spec.database_name.as_str(),
        table_group: shard.spec.table_group_name.as_str(),
        shard: shard.spec.shard_name.as_str(),
    };
    let published = roles::roles(key, &pool_pods, &poolers, &previous);
    let backups = Published::of(shard.status.as_ref());
    // Roles and backup health go out in one apply: a new primary also triggers a backup check.
    let checked = backup_health::run(&ctx.backup_checks, shard, key, &pool_pods, &poolers).await;
    let next_backups = checked.as_ref().map_or(&backups, |c| &c.next);
    if published != previous || *next_backups != backups {
        let written = ctx
            .writer
            .apply_status(shard, &status_body(&published, next_backups))
            .await;
        if let Err(source) = written {
            if checked.is_some() {
                // Checked again at the next reconcile rather than in a minute.
                ctx.backup_checks
                    .forget(&format!("{namespace}/{}", shard.name_any()));
            }
            return Err(Error::Status(source));
        }
    }
    let reference = shard.object_ref(&());
    if let Some((pod, notice)) = roles::primary_change(&previous, &published) {
        // The pod as the related object: events about different pods form their own series,
        // so a repeated reason never shows an earlier pod's message.
        let mut event = notice.event("Roles");
        event.secondary = Some(pod_reference(&namespace, pod));
        ctx.writer.publish(&ctx.recorder, &event, &reference).await;
    }
    if let Some(notice) = checked.and_then(|c| c.notice) {
        let event = notice.event("BackupHealth");
        ctx.writer.publish(&ctx.recorder, &event, &reference).await;
    }
    let delivery = deliver_reloads(shard, key, &pods, &poolers, ctx).await;
    let mut stamped = Vec::new();
    for pod in &pods {
        let wanted = published
            .get(&pod.name_any())
            .map(|r| roles::label_value(r));
        let stamp = delivery
            .stamps
            .get(&pod.name_any())
            .or_else(|| pod.annotations().get(RELOAD_HASH_ANNOTATION));
        let new_stamp = stamp != pod.annotations().get(RELOAD_HASH_ANNOTATION);
        if pod.labels().get(ROLE) != wanted.as_ref() || new_stamp {
            ctx.writer
                .apply_pod_marks(pod, wanted.as_deref(), stamp.map(String::as_str))
                .await
                .map_err(|source| Error::Label {
                    pod: pod.name_any(),
                    source,
                })?;
        }
        if new_stamp {
            stamped.push(pod.name_any());
        }
    }
    let lent = switchover::Context {
        switchovers: &ctx.switchovers,
        pods: &ctx.pods,
        writer: &ctx.writer,
        recorder: &ctx.recorder,
    };
    let handover = switchover::run(&lent, shard, key, &pods, &poolers).await;
    let notices = stamped.into_iter().map(|pod| {
        forget_wait(ctx, &namespace, &pod);
        let notice = Notice::normal(
            "ConfigReloaded",
            format!("pod {pod}: PostgreSQL reloaded postgresql.conf without a restart"),
        );
        (pod, notice)
    });
    for (pod, notice) in notices
        .collect::<Vec<_>>()
        .into_iter()
        .chain(delivery.notices)
    {
        // The pod as the related object: each pod's events form their own series.
        let mut event = notice.event("Reload");
        event.secondary = Some(pod_reference(&namespace, pod));
        ctx.writer.publish(&ctx.recorder, &event, &reference).await;
    }
    let mut period = if delivery.retry {
        ctx.settings.roles_period.min(reload::RETRY)
    } else {
        ctx.settings.roles_period
    };
    if handover.pending {
        period = period.min(switchover::POLL);
    }
    if shard.spec.backup.is_some() {
        period = period.min(backup_health::PACE);
    }
    match failure
        .or(delivery.error)
        .or(handover.error.map(Error::from))
    {
        Some(error) => Err(error),
        None => Ok(Action::requeue(period)),
    }
}

/// A reference to pod `name`, the related object of an event about it.
fn pod_reference(namespace: &str, name: String) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".to_owned()),
        kind: Some("Pod".to_owned()),
        name: Some(name),
        namespace: Some(namespace.to_owned()),
        ..Default::default()
    }
}

/// The status fields this handler owns on a Shard, for one server-side apply: `podRoles` and
/// the backup health ones.
fn status_body(pod_roles: &BTreeMap<String, String>, backups: &Published) -> serde_json::Value {
    let mut body = backups.fields();
    body.insert("podRoles".to_owned(), json!(pod_roles));
    serde_json::Value::Object(body)
}

/// What one pass of reload delivery found.
#[derive(Default)]
struct Delivery {
    /// Pods whose PostgreSQL confirmed the current reload-class settings → their fingerprint.
    stamps: BTreeMap<String, String>,
    /// Some pod's reload is still pending: look again after [`reload::RETRY`].
    retry: bool,
    /// Events to publish on the Shard, by pod (each waiting reason once per pod).
    notices: Vec<(String, Notice)>,
    /// The rendered file could not be read back.
    error: Option<Error>,
}

/// Asks the multipooler of every pool pod that has not confirmed the rendered file's
/// reload-class settings to reload, and collects the confirmed ones.
async fn deliver_reloads(
    shard: &Shard,
    key: ShardKey<'_>,
    pods: &[Pod],
    poolers: &BTreeMap<String, Option<Vec<crate::topo::PoolerRecord>>>,
    ctx: &Context,
) -> Delivery {
    let mut out = Delivery::default();
    let namespace = shard.namespace().unwrap_or_default();
    let uid = shard.uid();
    let rendered = valid_in(&ctx.config_maps, &namespace, |cm| {
        cm.owner_references()
            .iter()
            .any(|o| Some(&o.uid) == uid.as_ref())
            && cm
                .data
                .as_ref()
                .is_some_and(|d| d.contains_key(reload::CONFIG_KEY))
    })
    .into_iter()
    .next();
    // No file rendered yet (or a postgresConfigRef still missing): nothing to reload.
    let Some(rendered) = rendered else {
        return out;
    };
    let desired = match Desired::from_config_map(&rendered) {
        Ok(desired) => desired,
        Err(error) => {
            out.error = Some(error.into());
            return out;
        }
    };
    let states: Vec<PodState> = pods.iter().map(PodState::of).collect();
    let tls = reload::internal_tls(shard);
    for pod in reload::to_reload(&desired, &states) {
        let pool_pod = PoolPod {
            name: pod.name.clone(),
            cell: pod.cell.clone(),
        };
        let record = roles::pooler_of(key, &pool_pod, poolers);
        let address = record.and_then(reload::address);
        // A pod never stamped is new: it most likely started with the current file and its
        // multipooler is still starting, so its first confirmation is waited for quietly.
        let new_pod = pod.reload_hash.is_none();
        let wait = |out: &mut Delivery, notice: Notice| {
            out.retry = true;
            let quiet = new_pod && notice.reason == "ConfigReloadPending";
            if !quiet && announce(ctx, &namespace, &pod.name, &desired.reload_hash, &notice) {
                out.notices.push((pod.name.clone(), notice));
            }
        };
        if tls {
            // The multipooler serves mutual TLS with the cluster's internal CA; the
            // data-handler holds no client certificate of it, so it cannot call.
            wait(
                &mut out,
                Notice::warning(
                    "ConfigReloadSkipped",
                    format!(
                        "pod {}: internalTLS is enabled and the data-handler has no client \
                         certificate for the multipooler, so reload-class settings are not \
                         reloaded in place; they apply when the pod restarts",
                        pod.name
                    ),
                ),
            );
            continue;
        }
        let Some(address) = address else {
            let note = match record {
                None => format!(
                    "pod {}: waiting for its multipooler to register in cell {} to reload \
                     postgresql.conf",
                    pod.name,
                    pod.cell.as_deref().unwrap_or("(unlabelled)")
                ),
                Some(r) => format!(
                    "pod {}: its multipooler record {} has no hostname or no {:?} port; \
                     waiting for it to re-register to reload postgresql.conf",
                    pod.name,
                    r.key,
                    reload::GRPC_PORT
                ),
            };
            tracing::debug!(pod = %pod.name, "reload waits for the pooler record");
            wait(&mut out, Notice::normal("ConfigReloadPending", note));
            continue;
        };
        match reload::call(&address, &desired.expected).await {
            Ok(response) => match reload::verdict(&response) {
                Verdict::Reloaded => {
                    tracing::info!(pod = %pod.name, hash = %desired.reload_hash, "PostgreSQL reloaded its configuration");
                    out.stamps
                        .insert(pod.name.clone(), desired.reload_hash.clone());
                }
                Verdict::NeedsRestart(settings) => wait(
                    &mut out,
                    Notice::warning(
                        "ConfigReloadNeedsRestart",
                        format!(
                            "pod {}: PostgreSQL applies {} only at start, though the operator \
                             classified them as reloadable; restart the pod to apply them",
                            pod.name,
                            settings.join(", ")
                        ),
                    ),
                ),
                Verdict::Rejected(settings) => wait(
                    &mut out,
                    Notice::warning(
                        "ConfigReloadRejected",
                        format!(
                            "pod {}: PostgreSQL rejects postgresql.conf's {}, so it was not \
                             reloaded; correct the values in the postgres config",
                            pod.name,
                            settings
                                .iter()
                                .map(|(name, error)| format!("{name} ({error})"))
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    ),
                ),
                Verdict::NotYet(settings) => {
                    tracing::debug!(pod = %pod.name, ?settings, "mounted postgresql.conf not synced yet");
                    out.retry = true;
                }
            },
            Err(error) => {
                tracing::warn!(pod = %pod.name, error = %ErrorChain(&error), "ReloadConfig failed; retrying");
                out.retry = true;
            }
        }
    }
    out
}

/// Records that `pod`'s reload to `hash` waits for the reason `notice` gives; true the first
/// time, so the event is published once. Entries of pods gone from the cache are dropped
/// whenever there are as many entries as cached pods, so the map stays within one entry of
/// the number of pool pods.
fn announce(ctx: &Context, namespace: &str, pod: &str, hash: &str, notice: &Notice) -> bool {
    let note = format!("{hash} {}", notice.reason);
    let mut waits = ctx
        .reload_waits
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if waits.len() >= ctx.pods.len() {
        waits.retain(|key, _| {
            key.split_once('/').is_some_and(|(namespace, name)| {
                ctx.pods
                    .get(&ObjectRef::new(name).within(namespace))
                    .is_some()
            })
        });
    }
    waits.insert(format!("{namespace}/{pod}"), note.clone()) != Some(note)
}

fn forget_wait(ctx: &Context, namespace: &str, pod: &str) {
    ctx.reload_waits
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .remove(&format!("{namespace}/{pod}"));
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use multigres_api::v1alpha1::{DatabaseName, ShardName, ShardSpec, TableGroupName};

    use super::*;

    fn pod(labels: &[(&str, &str)]) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some("prod-postgres-default-0-inf-pool-default-zone-a-0".into());
        p.metadata.namespace = Some("team-a".into());
        p.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect::<BTreeMap<_, _>>(),
        );
        p
    }

    fn pool_labels() -> Vec<(&'static str, &'static str)> {
        vec![
            (labels::CLUSTER, "prod"),
            (labels::COMPONENT, "shard-pool"),
            (labels::DATABASE, "postgres"),
            (labels::TABLE_GROUP, "default"),
            (labels::SHARD, "0-inf"),
            (labels::CELL, "zone-a"),
        ]
    }

    #[test]
    fn pool_pods_map_to_their_shard() {
        let r = shard_of(&pod(&pool_labels())).unwrap();
        assert_eq!(r.name, "prod-postgres-default-0-inf");
        assert_eq!(r.namespace.as_deref(), Some("team-a"));
        assert!(shard_of(&pod(&[(labels::CLUSTER, "prod")])).is_none());
    }

    #[test]
    fn the_status_body_carries_every_field_of_this_handler() {
        let roles = BTreeMap::from([("p-0".to_owned(), roles::PRIMARY.to_owned())]);
        let body = status_body(&roles, &Published::default());
        assert_eq!(body, json!({ "podRoles": { "p-0": "PRIMARY" } }));
        let backups = Published {
            kind: Some(multigres_api::v1alpha1::BackupKind::Full),
            ..Default::default()
        };
        assert_eq!(
            status_body(&BTreeMap::new(), &backups),
            json!({ "podRoles": {}, "lastBackupType": "full" }),
            "the roles go along with a backup change, or the apply would drop them"
        );
    }

    #[test]
    fn only_the_shards_pool_pods_are_considered() {
        let shard = Shard::new(
            "prod-postgres-default-0-inf",
            ShardSpec {
                database_name: DatabaseName::new("postgres"),
                table_group_name: TableGroupName::new("default"),
                shard_name: ShardName::new("0-inf"),
                ..Default::default()
            },
        );
        assert!(is_pool_pod_of(&pod(&pool_labels()), &shard, "prod"));
        assert!(!is_pool_pod_of(&pod(&pool_labels()), &shard, "other"));
        let mut orch = pool_labels();
        orch[1] = (labels::COMPONENT, "multiorch");
        assert!(!is_pool_pod_of(&pod(&orch), &shard, "prod"));
        let mut other_tg = pool_labels();
        other_tg[3] = (labels::TABLE_GROUP, "orders");
        assert!(!is_pool_pod_of(&pod(&other_tg), &shard, "prod"));
    }
}
