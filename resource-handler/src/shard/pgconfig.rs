//! A shard's postgresql.conf: rendered (from the operator's defaults, the pools' sizes, the
//! `postgresConfigRef` ConfigMap and `postgresConfig`) into the ConfigMap
//! `<shard>-postgres-config`, mounted into pgctld, which hands it to PostgreSQL.
//!
//! A change of a setting PostgreSQL reads only at start changes the fingerprint stamped on the
//! pool pod template, so the ordered restart (replicas first, the primary last) applies it. A
//! change of only reload-class settings changes the file and its reload fingerprint, never the
//! pod template: no pod restarts.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use futures::{FutureExt, Stream, StreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, ConfigMapVolumeSource, Pod, Volume};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::events::EventType;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use multigres_api::labels::{self, Component, Placement};
use multigres_api::owner::Owner;
use multigres_api::postgres::standby::{self, StandbySettings};
use multigres_api::postgres::{RenderError, Rendered, render_shard};
use multigres_api::v1alpha1::{PostgresConfigRef, PostgresConfigStatus, Shard, ShardSpec};

use super::Guard;
use super::build::ShardObjects;
use super::rollout::PodView;
use multigres_common::shared_watch::SharedWatch;

use crate::controller::Ctx;
use crate::podspec::{env, mount};
use crate::sync::{self, SyncError};

/// Key of the file in the ConfigMap.
pub const CONFIG_KEY: &str = "postgresql.conf";
/// Where pgctld finds the ConfigMap's files.
pub const CONFIG_DIR: &str = "/etc/pgctld/postgres-config";
/// Pod template (and ConfigMap) annotation: fingerprint of the restart-class settings. Part of
/// the template, so a change restarts the pods in order.
pub const CONFIG_HASH: &str = multigres_api::postgres::CONFIG_HASH_ANNOTATION;
/// ConfigMap annotation: fingerprint of the reload-class settings, also written into the file
/// as `multigres.config_reload_marker`. Never on the pod template.
pub const RELOAD_HASH: &str = multigres_api::postgres::RELOAD_HASH_ANNOTATION;
/// Key of the pg_hba.conf template in the ConfigMap. pgctld's built-in template admits
/// replication from loopback only, so a replica in another pod could never stream from the
/// primary (`no pg_hba.conf entry for replication connection`) and no primary was ever elected.
pub const HBA_TEMPLATE_KEY: &str = "pg_hba_template.conf";
/// The pg_hba.conf template: SCRAM for every connection, replication from any pod address over
/// TLS.
pub const HBA_TEMPLATE: &str = include_str!("pg_hba_template.conf");

/// The pg_hba.conf template of a shard: [`HBA_TEMPLATE`], whose replication lines need TLS,
/// unless its pool pods hold no server certificate (a Shard written without backups; every
/// resolved one has them), whose replicas could not stream otherwise.
pub fn hba_template(spec: &ShardSpec) -> String {
    match multigres_api::postgres::serves_tls(spec) {
        true => HBA_TEMPLATE.to_owned(),
        false => HBA_TEMPLATE.replace("hostssl replication", "host    replication"),
    }
}
/// pgctld's variable naming the extra configuration file PostgreSQL includes.
const EXTRA_CONF_ENV: &str = "POSTGRES_INITDB_EXTRA_CONF";
const VOLUME: &str = "postgres-config";
/// The pgctld container of a pool pod (a native sidecar, so an init container).
const PGCTLD_CONTAINER: &str = "postgres";
/// The multipooler container of a pool pod.
const POOLER_CONTAINER: &str = "multipooler";

/// Why a shard's postgresql.conf cannot be produced.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The referenced ConfigMap does not exist.
    #[error(
        "postgresConfigRef: ConfigMap {name:?} not found in namespace {namespace:?}; create it \
         with key {key:?} or remove postgresConfigRef"
    )]
    MissingConfigMap {
        name: String,
        key: String,
        namespace: String,
    },
    /// The referenced ConfigMap lacks the key.
    #[error(
        "postgresConfigRef: ConfigMap {name:?} has no key {key:?} (it has: {})",
        if keys.is_empty() { "none".to_owned() } else { keys.join(", ") }
    )]
    MissingKey {
        name: String,
        key: String,
        keys: Vec<String>,
    },
    /// The settings cannot be rendered (refused parameters, malformed referenced content).
    #[error(transparent)]
    Render(#[from] RenderError),
    /// Reading the referenced ConfigMap failed.
    #[error("reading the postgresConfigRef ConfigMap {name:?}")]
    Read {
        name: String,
        #[source]
        source: kube::Error,
    },
}

impl ConfigError {
    /// Whether only a change (of the spec or of the referenced ConfigMap) can fix it.
    pub fn is_invalid_spec(&self) -> bool {
        !matches!(self, ConfigError::Read { .. })
    }
}

/// The configured content of the referenced ConfigMap `found` (as read), or why there is none.
pub fn referenced_content(
    reference: &PostgresConfigRef,
    namespace: &str,
    found: Option<&ConfigMap>,
) -> Result<String, ConfigError> {
    let Some(config_map) = found else {
        return Err(ConfigError::MissingConfigMap {
            name: reference.name.clone(),
            key: reference.key.clone(),
            namespace: namespace.to_owned(),
        });
    };
    let data = config_map.data.clone().unwrap_or_default();
    data.get(&reference.key)
        .cloned()
        .ok_or_else(|| ConfigError::MissingKey {
            name: reference.name.clone(),
            key: reference.key.clone(),
            keys: data.keys().cloned().collect(),
        })
}

/// The ConfigMap holding the rendered file, owned by the Shard.
pub fn config_map(owner: &Owner, shard: &Shard, rendered: &Rendered) -> ConfigMap {
    let spec = &shard.spec;
    let at = Placement {
        cell: None,
        database: Some(spec.database_name.as_str()),
        table_group: Some(spec.table_group_name.as_str()),
        shard: Some(spec.shard_name.as_str()),
        pool: None,
    };
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(crate::names::postgres_config(&owner.name)),
            namespace: Some(owner.namespace.clone()),
            labels: Some(labels::labels(&owner.cluster, Component::Shard, &at)),
            annotations: Some(BTreeMap::from([
                (CONFIG_HASH.to_owned(), rendered.split.restart_hash.clone()),
                (RELOAD_HASH.to_owned(), rendered.split.reload_hash.clone()),
                (
                    labels::HOT_STANDBY_SETTINGS.to_owned(),
                    standby::format_standby(&standby::standby_settings(&rendered.split.restart)),
                ),
            ])),
            owner_references: Some(vec![owner.reference.clone()]),
            ..Default::default()
        },
        data: Some(BTreeMap::from([
            (CONFIG_KEY.to_owned(), rendered.text.clone()),
            (HBA_TEMPLATE_KEY.to_owned(), hba_template(spec)),
        ])),
        ..Default::default()
    }
}

/// Mounts the ConfigMap into pgctld of every pool pod, points pgctld at its files (the extra
/// postgresql.conf and the pg_hba.conf template), and stamps the restart fingerprint on the pod
/// template.
pub fn mount_into(objects: &mut ShardObjects, config_map: &str, rendered: &Rendered) {
    for pool in &mut objects.pools {
        let Some(template) = pool.statefulset.spec.as_mut().map(|s| &mut s.template) else {
            continue;
        };
        template
            .metadata
            .get_or_insert_default()
            .annotations
            .get_or_insert_default()
            .insert(CONFIG_HASH.to_owned(), rendered.split.restart_hash.clone());
        let Some(pod) = template.spec.as_mut() else {
            continue;
        };
        pod.volumes.get_or_insert_default().push(Volume {
            name: VOLUME.to_owned(),
            config_map: Some(ConfigMapVolumeSource {
                name: config_map.to_owned(),
                ..Default::default()
            }),
            ..Default::default()
        });
        let pgctld = pod
            .init_containers
            .iter_mut()
            .flatten()
            .find(|c| c.name == PGCTLD_CONTAINER);
        if let Some(pgctld) = pgctld {
            pgctld
                .volume_mounts
                .get_or_insert_default()
                .push(mount(VOLUME, CONFIG_DIR, true));
            pgctld
                .env
                .get_or_insert_default()
                .push(env(EXTRA_CONF_ENV, format!("{CONFIG_DIR}/{CONFIG_KEY}")));
            pgctld
                .args
                .get_or_insert_default()
                .push(format!("--pg-hba-template={CONFIG_DIR}/{HBA_TEMPLATE_KEY}"));
        }
        // The pools' capacity follows max_connections, a restart-class setting: it changes
        // in the same ordered restart as the server it sizes.
        let pooler = pod
            .containers
            .iter_mut()
            .find(|c| c.name == POOLER_CONTAINER);
        if let Some(pooler) = pooler {
            let args = pooler.args.get_or_insert_default();
            args.extend(rendered.pool.flags());
        }
    }
}

/// The values below which no hot-standby-sensitive setting may be rendered: the highest that a
/// server of the shard may run. A pod runs what its stamp says, and any pod that merely restarts
/// runs what the current file says, stamped or not: `previous`, the ConfigMap as cached, whose
/// annotation `multigres.com/hot-standby-settings` carries the file's values (the cache keeps
/// no file content).
pub fn floor(previous: Option<&ConfigMap>, pods: &[PodView]) -> StandbySettings {
    let file = previous
        .and_then(|cm| cm.annotations().get(labels::HOT_STANDBY_SETTINGS))
        .and_then(|value| standby::parse_standby(value));
    standby::floor(
        file.iter()
            .chain(pods.iter().filter_map(|p| p.standby.as_ref())),
    )
}

/// The pods to stamp with the hot-standby-sensitive settings of `rendered` (annotation
/// `multigres.com/hot-standby-settings`), with the value: those created from the current
/// template (its restart fingerprint) whose stamp differs. A pod keeps the stamp of the
/// template it was created from, so a later template's lower value can be told from a raise.
pub fn standby_stamps(pods: &[PodView], rendered: &Rendered) -> Vec<(String, String, String)> {
    let desired = standby::standby_settings(&rendered.split.restart);
    pods.iter()
        .filter(|p| !p.terminating)
        .filter(|p| p.config_hash.as_deref() == Some(rendered.split.restart_hash.as_str()))
        .filter(|p| p.standby.as_ref() != Some(&desired))
        .map(|p| {
            (
                p.name.clone(),
                p.uid.clone(),
                standby::format_standby(&desired),
            )
        })
        .collect()
}

/// Writes the [`standby_stamps`] of `pods` (by pod UID, so a replaced pod is not written); a
/// failed write is logged and tried again on the next reconcile.
pub async fn stamp_standby(ctx: &Ctx<Guard>, ns: &str, pods: &[PodView], rendered: &Rendered) {
    let api = Api::<Pod>::namespaced(ctx.client.clone(), ns);
    for (pod, uid, value) in standby_stamps(pods, rendered) {
        let patch = serde_json::json!({"metadata": {"uid": uid, "annotations": {
            labels::HOT_STANDBY_SETTINGS: value}}});
        crate::sync::count(super::NAME, "Pod", "patch");
        let params = multigres_common::apply::patch_params(crate::sync::FIELD_MANAGER);
        match api
            .patch(&pod, &params, &kube::api::Patch::Merge(patch))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if [404, 409, 422].contains(&e.code) => {}
            Err(error) => {
                let error = multigres_common::telemetry::ErrorChain(&error);
                tracing::warn!(%pod, %error, "cannot stamp the pod's hot-standby settings");
            }
        }
    }
}

/// Rollout state of the config: in progress until every pool pod `objects` wants runs (live)
/// from a template with the current restart fingerprint and has confirmed the current
/// reload-class settings (the data-handler stamps the reload fingerprint on a pod once its
/// PostgreSQL reloaded them, so a pending reload counts, as upstream); `lastAppliedAt` is
/// stamped when it settles (see [`settled_at`]) and kept until it settles again.
pub fn progress<'a>(
    previous: Option<&PostgresConfigStatus>,
    rendered: &Rendered,
    objects: &ShardObjects,
    pods: impl IntoIterator<Item = &'a Pod>,
    now: Timestamp,
) -> PostgresConfigStatus {
    let desired: i32 = objects
        .pools
        .iter()
        .filter_map(|p| p.statefulset.spec.as_ref().and_then(|s| s.replicas))
        .sum();
    let current = pods
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| p.annotations().get(CONFIG_HASH) == Some(&rendered.split.restart_hash))
        .filter(|p| p.annotations().get(RELOAD_HASH) == Some(&rendered.split.reload_hash))
        .count();
    let in_progress = i32::try_from(current).unwrap_or(i32::MAX) < desired;
    let was_settled = previous.is_some_and(|p| p.in_progress == Some(false) && p.error.is_none());
    let last_applied_at = match previous.and_then(|p| p.last_applied_at.clone()) {
        Some(at) if in_progress || was_settled => Some(at),
        _ if in_progress => None,
        last => Some(settled_at(now, last.as_ref())),
    };
    PostgresConfigStatus {
        in_progress: Some(in_progress),
        last_applied_at,
        error: None,
        held_settings: rendered.held.iter().map(ToString::to_string).collect(),
    }
}

/// The `lastAppliedAt` of a config that settled at `now`, `last` the stamp of the one before:
/// `now` in whole seconds (all a stored `Time` keeps), or the second after `last` when that is
/// not later. A rollout on fast nodes settles within the second of the previous change, and
/// would otherwise be stored with the very same stamp, so nothing would tell that the new
/// config settled; with it every settling reads later than the one before.
fn settled_at(now: Timestamp, last: Option<&Time>) -> Time {
    let after_last = last.map_or(i64::MIN, |at| at.0.as_second().saturating_add(1));
    let second = now.as_second().max(after_last);
    Time(Timestamp::from_second(second).unwrap_or(now))
}

/// What an event says about a rewritten file, by what changed since `previous`; `None` when
/// the file is new or its settings are the same.
pub fn change_note(previous: Option<&ConfigMap>, rendered: &Rendered) -> Option<String> {
    let hash = |key: &str| previous.and_then(|p| p.annotations().get(key).cloned());
    let (restart, reload) = (hash(CONFIG_HASH)?, hash(RELOAD_HASH)?);
    if restart != rendered.split.restart_hash {
        Some(
            "postgresql.conf changed, including settings PostgreSQL reads only at start: pool \
             pods restart one at a time, replicas first and the primary last"
                .to_owned(),
        )
    } else if reload != rendered.split.reload_hash {
        Some(
            "postgresql.conf changed only in settings a reload applies: no pod restarts; the \
             new file reaches the pods through the ConfigMap volume"
                .to_owned(),
        )
    } else {
        None
    }
}

/// Applies the ConfigMap of `desired` (before the pool StatefulSets, so new pods mount the
/// current file), with an event when its settings changed.
pub async fn apply(
    ctx: &Ctx<Guard>,
    guard: &Guard,
    (config_map, rendered): &(ConfigMap, Rendered),
) -> Result<(), SyncError> {
    let namespace = config_map.namespace().unwrap_or_default();
    let api = Api::<ConfigMap>::namespaced(ctx.client.clone(), &namespace);
    let store = &ctx.stores.config_maps;
    let previous = store.get(&ObjectRef::from_obj(config_map));
    if sync::ensure(super::NAME, &api, store, config_map.clone()).await? {
        if let Some(note) = held_note(rendered) {
            ctx.kit
                .event(guard, EventType::Warning, "PostgresConfigHeld", note)
                .await;
        }
        if let Some(note) = change_note(previous.as_deref(), rendered) {
            ctx.kit
                .event(guard, EventType::Normal, "PostgresConfigChanged", note)
                .await;
        }
    }
    Ok(())
}

/// What an event says about settings rendered above what was asked (`None`: none held).
pub fn held_note(rendered: &Rendered) -> Option<String> {
    let held: Vec<String> = rendered.held.iter().map(ToString::to_string).collect();
    (!held.is_empty()).then(|| {
        format!(
            "kept {} at the values the servers may already run: Multigres starts every \
             PostgreSQL as a standby, and a standby stops (\"recovery aborted because of \
             insufficient parameter settings\") below its primary's values, so any pod that \
             restarted with a lower value would not come back; the other settings roll out \
             as usual. Ask for at least these values to clear this (docs/postgresql-configuration.md)",
            held.join(", ")
        )
    })
}

/// The status of a config that cannot be produced: the error, the rest as it was.
pub fn failed(
    previous: Option<&PostgresConfigStatus>,
    error: &ConfigError,
) -> PostgresConfigStatus {
    PostgresConfigStatus {
        error: Some(error.to_string()),
        ..previous.cloned().unwrap_or_default()
    }
}

/// Reads the content of the shard's `postgresConfigRef` ConfigMap through `client` (`None`
/// without a reference), or says why there is none.
pub async fn referenced(
    client: &Client,
    namespace: &str,
    shard: &Shard,
) -> Result<Option<String>, ConfigError> {
    let Some(reference) = &shard.spec.postgres_config_ref else {
        return Ok(None);
    };
    let api = Api::<ConfigMap>::namespaced(client.clone(), namespace);
    let found = api
        .get_opt(&reference.name)
        .await
        .map_err(|source| ConfigError::Read {
            name: reference.name.clone(),
            source,
        })?;
    referenced_content(reference, namespace, found.as_ref()).map(Some)
}

/// Renders the shard's file (with `reference`, the referenced content as read, and the
/// hot-standby-sensitive settings held at `floor`, see [`floor`]) and mounts it into `objects`;
/// returns the ConfigMap to apply and what was rendered.
pub fn desired(
    owner: &Owner,
    shard: &Shard,
    reference: Option<&str>,
    floor: &StandbySettings,
    objects: &mut ShardObjects,
) -> Result<(ConfigMap, Rendered), ConfigError> {
    let rendered = render_shard(&owner.cluster, &shard.spec, reference, floor)?;
    let config_map = config_map(owner, shard, &rendered);
    mount_into(objects, &config_map.name_any(), &rendered);
    Ok((config_map, rendered))
}

/// Changes of the ConfigMaps the shards reference (metadata only: nothing is cached), so an
/// edit of one re-renders its shards. One watch per referenced ConfigMap, selected by
/// `metadata.name` in the shard's namespace: the handler never lists or watches a ConfigMap
/// no spec names (a user's ConfigMaps are not the operator's to label, so a label selector
/// could not find them without writing to them). The set follows the shards: a watch starts
/// with the first shard naming a ConfigMap and stops with the last; its first list notices a
/// ConfigMap created after the shard.
pub fn reference_changes(
    client: &Client,
    shards: &SharedWatch<Guard>,
) -> impl Stream<Item = Result<PartialObjectMeta<ConfigMap>, watcher::Error>> + Send + 'static {
    let (sender, mut receiver) = tokio::sync::mpsc::unbounded_channel();
    let (client, store) = (client.clone(), shards.store());
    let mut changes = shards.changes_and_deletions();
    tokio::spawn(async move {
        let mut watching: BTreeMap<(String, String), AbortOnDrop> = BTreeMap::new();
        loop {
            tokio::select! {
                change = changes.next() => if change.is_none() { return },
                // The controller stopped; the watches stop with `watching`.
                () = sender.closed() => return,
            }
            // A burst (the first list, a template change) is one recount.
            while let Some(Some(_)) = changes.next().now_or_never() {}
            let wanted = referenced_config_maps(&store.state());
            watching.retain(|reference, _| wanted.contains(reference));
            for reference in wanted {
                watching
                    .entry(reference)
                    .or_insert_with_key(|(namespace, name)| {
                        let api = Api::<PartialObjectMeta<ConfigMap>>::namespaced(
                            client.clone(),
                            namespace,
                        );
                        let config =
                            watcher::Config::default().fields(&format!("metadata.name={name}"));
                        let mut events = multigres_common::watch::watcher(api, config)
                            .default_backoff()
                            .touched_objects()
                            .boxed();
                        let sender = sender.clone();
                        AbortOnDrop(tokio::spawn(async move {
                            while let Some(event) = events.next().await {
                                if sender.send(event).is_err() {
                                    return;
                                }
                            }
                        }))
                    });
            }
        }
    });
    futures::stream::poll_fn(move |cx| receiver.poll_recv(cx))
}

/// A task stopped when its handle is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// `(namespace, name)` of every ConfigMap a shard in `shards` references.
pub fn referenced_config_maps(shards: &[Arc<Guard>]) -> BTreeSet<(String, String)> {
    shards
        .iter()
        .filter_map(|s| {
            let shard = s.0.as_ref().ok()?;
            let reference = shard.spec.postgres_config_ref.as_ref()?;
            Some((shard.namespace()?, reference.name.clone()))
        })
        .collect()
}

/// The shards in `shards` that reference the ConfigMap `changed`.
pub fn referencing(
    shards: &Store<Guard>,
    changed: &PartialObjectMeta<ConfigMap>,
) -> Vec<ObjectRef<Guard>> {
    let name = changed.name_any();
    let namespace = changed.namespace();
    shards
        .state()
        .into_iter()
        .filter(|s| {
            s.0.as_ref().is_ok_and(|shard| {
                shard.namespace() == namespace
                    && shard
                        .spec
                        .postgres_config_ref
                        .as_ref()
                        .is_some_and(|r| r.name == name)
            })
        })
        .map(|s| ObjectRef::from_obj(&*s))
        .collect()
}

#[cfg(test)]
mod tests;
