//! Defaulting of MultigresCluster: the defaults users should see in the stored object.
//!
//! Only values that mean the same whatever templates exist later are written: the cluster-wide
//! settings whose built-in default never depends on a template, and the promotion of an existing
//! namespace template named `default` into an empty `templateDefaults` field (which is what the
//! resolver would pick anyway, and makes the dependency visible and protected from deletion).
//!
//! Internal mutual TLS is on for a cluster created without saying (see [`internal_tls`]), and so
//! is PostgreSQL's exporter (see [`postgres_exporter`]).
//!
//! Component specs are not materialised: an inline value written here would override every
//! template created afterwards, changing what the user's manifest means. `pvcDeletionPolicy` is
//! never written: its absence means Retain/Retain by inheritance from the levels above, and a
//! value written at admission would stop that inheritance.

use multigres_api::DEFAULT_TEMPLATE;
use multigres_api::resolver::defaults::DURABILITY_POLICY;
use multigres_api::v1alpha1::{
    ClusterImages, ComponentLogLevels, ImagePullPolicy, InternalTlsConfig, LogLevel,
    MultigresCluster, MultigresClusterSpec, TemplateDefaults, TemplateRef, TopologyPruningConfig,
};

/// Which namespace templates named `default` exist.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DefaultTemplates {
    /// A CoreTemplate named `default` exists.
    pub core: bool,
    /// A CellTemplate named `default` exists.
    pub cell: bool,
    /// A ShardTemplate named `default` exists.
    pub shard: bool,
}

/// Fills the static defaults and promotes existing `default` templates.
pub fn apply(spec: &mut MultigresClusterSpec, present: DefaultTemplates) {
    let images = spec.images.get_or_insert_with(ClusterImages::default);
    images
        .image_pull_policy
        .get_or_insert(ImagePullPolicy::IfNotPresent);

    let levels = spec
        .log_levels
        .get_or_insert_with(ComponentLogLevels::default);
    for level in [
        &mut levels.pgctld,
        &mut levels.multipooler,
        &mut levels.multiorch,
        &mut levels.multiadmin,
        &mut levels.multigateway,
    ] {
        level.get_or_insert(LogLevel::Info);
    }

    spec.topology_pruning
        .get_or_insert_with(TopologyPruningConfig::default)
        .enabled
        .get_or_insert(true);

    spec.durability_policy
        .get_or_insert_with(|| DURABILITY_POLICY.to_owned());

    if present.core || present.cell || present.shard {
        let defaults = spec
            .template_defaults
            .get_or_insert_with(TemplateDefaults::default);
        for (exists, slot) in [
            (present.core, &mut defaults.core_template),
            (present.cell, &mut defaults.cell_template),
            (present.shard, &mut defaults.shard_template),
        ] {
            if exists && slot.is_none() {
                *slot = Some(TemplateRef::new(DEFAULT_TEMPLATE));
            }
        }
    }
}

/// What the webhook knows of the stored object before this request.
#[derive(Debug, Clone, Copy)]
pub enum Stored<'a> {
    /// The cluster is being created.
    Nothing,
    /// The cluster is being updated; its stored spec.
    Spec(&'a MultigresClusterSpec),
    /// The cluster is being updated, but its stored object could not be read.
    Unreadable,
}

/// Internal mutual TLS (`internalTLS.enabled`), when the request leaves it out: on for a cluster
/// being created; an existing cluster keeps the value it has (an apply that no longer lists the
/// value this webhook wrote at creation removes it otherwise), and one that never had a value
/// keeps none, so stays off. Turning it on rolls every pod, and a Multigres process serves
/// either TLS or plaintext gRPC, never both (`--grpc-enable-optional-tls` is not implemented),
/// so pods on either side of the change cannot talk until the roll ends: that is the owner's
/// decision, never an upgrade's (docs/tls.md).
///
/// Topology TLS (`internalTLS.topology`), when left out, is set the same way, except that a new
/// cluster gets it only when `all_managed` (no topology server is external: Multigres dials
/// every etcd of a cluster with one TLS setting). It cannot change later (validation refuses
/// it), so an update that leaves it out keeps the stored value too.
pub fn internal_tls(spec: &mut MultigresClusterSpec, stored: Stored<'_>, all_managed: bool) {
    let sent = spec.internal_tls.clone().unwrap_or_default();
    let old = match stored {
        Stored::Nothing => Some(InternalTlsConfig {
            enabled: Some(true),
            topology: Some(all_managed),
        }),
        Stored::Spec(old) => Some(old.internal_tls.clone().unwrap_or_default()),
        Stored::Unreadable => None,
    };
    let Some(old) = old else {
        return;
    };
    let wanted = InternalTlsConfig {
        enabled: sent.enabled.or(old.enabled),
        topology: sent.topology.or(old.topology),
    };
    if wanted != sent {
        spec.internal_tls = Some(wanted);
    }
}

/// postgres_exporter (`observability.postgresExporter.enabled`), when the request leaves it out:
/// on for a cluster being created; an existing cluster keeps the value it has, and one that never
/// had a value keeps none, so runs no exporter. Adding the container changes every pool pod
/// template, so it rolls every pool: that is the owner's decision (setting `enabled: true`),
/// never an operator upgrade's.
pub fn postgres_exporter(spec: &mut MultigresClusterSpec, stored: Stored<'_>) {
    let sent = spec
        .observability
        .as_ref()
        .and_then(|o| o.postgres_exporter.as_ref())
        .and_then(|e| e.enabled);
    if sent.is_some() {
        return;
    }
    let wanted = match stored {
        Stored::Nothing => Some(true),
        Stored::Spec(old) => old
            .observability
            .as_ref()
            .and_then(|o| o.postgres_exporter.as_ref())
            .and_then(|e| e.enabled),
        Stored::Unreadable => None,
    };
    if let Some(enabled) = wanted {
        spec.observability
            .get_or_insert_with(Default::default)
            .postgres_exporter
            .get_or_insert_with(Default::default)
            .enabled = Some(enabled);
    }
}

/// The `templateDefaults` fields still empty, whose `default` template must be looked up.
pub fn promotable(spec: &MultigresClusterSpec) -> DefaultTemplates {
    let defaults = spec.template_defaults.as_ref();
    DefaultTemplates {
        core: defaults.is_none_or(|d| d.core_template.is_none()),
        cell: defaults.is_none_or(|d| d.cell_template.is_none()),
        shard: defaults.is_none_or(|d| d.shard_template.is_none()),
    }
}

/// The JSON patch that defaults `cluster`: the difference between the object as sent and as
/// defaulted, so only the fields this webhook sets are touched.
pub fn patch(
    cluster: &MultigresCluster,
    stored: Stored<'_>,
    present: DefaultTemplates,
    all_managed: bool,
) -> Result<json_patch::Patch, serde_json::Error> {
    let before = serde_json::to_value(cluster)?;
    let mut defaulted = cluster.clone();
    apply(&mut defaulted.spec, present);
    internal_tls(&mut defaulted.spec, stored, all_managed);
    postgres_exporter(&mut defaulted.spec, stored);
    let after = serde_json::to_value(&defaulted)?;
    Ok(json_patch::diff(&before, &after))
}

#[cfg(test)]
mod tests {
    use multigres_api::v1alpha1::PostgresExporterConfig;
    use serde_json::json;

    use super::*;

    fn cluster(spec: serde_json::Value) -> (serde_json::Value, MultigresCluster) {
        let raw = json!({
            "apiVersion": "multigres.com/v1alpha1",
            "kind": "MultigresCluster",
            "metadata": {"name": "demo", "namespace": "db"},
            "spec": spec,
        });
        (raw.clone(), serde_json::from_value(raw).unwrap())
    }

    #[test]
    fn static_defaults_are_patched_in_and_nothing_else() {
        let (mut raw, typed) = cluster(json!({
            "postgresPasswordSecretRef": {"name": "pw", "key": "password"},
            "logLevels": {"multiorch": "debug"},
            "cells": [{"name": "zone-a", "zoneId": "z-a"}],
        }));
        let patch = patch(&typed, Stored::Nothing, DefaultTemplates::default(), true).unwrap();
        json_patch::patch(&mut raw, &patch).unwrap();
        assert_eq!(
            raw["spec"],
            json!({
                "postgresPasswordSecretRef": {"name": "pw", "key": "password"},
                "cells": [{"name": "zone-a", "zoneId": "z-a"}],
                "internalTLS": {"enabled": true, "topology": true},
                "images": {"imagePullPolicy": "IfNotPresent"},
                "logLevels": {
                    "pgctld": "info", "multipooler": "info", "multiorch": "debug",
                    "multiadmin": "info", "multigateway": "info"
                },
                "topologyPruning": {"enabled": true},
                "durabilityPolicy": "AT_LEAST_2",
                "observability": {"postgresExporter": {"enabled": true}},
            })
        );
        assert!(raw["spec"].get("pvcDeletionPolicy").is_none());
    }

    #[test]
    fn existing_default_templates_are_promoted_into_empty_fields_only() {
        let (mut raw, typed) = cluster(json!({
            "postgresPasswordSecretRef": {"name": "pw", "key": "password"},
            "templateDefaults": {"shardTemplate": "mine"},
        }));
        assert_eq!(
            promotable(&typed.spec),
            DefaultTemplates {
                core: true,
                cell: true,
                shard: false
            }
        );
        let present = DefaultTemplates {
            core: true,
            cell: false,
            shard: true,
        };
        json_patch::patch(
            &mut raw,
            &patch(&typed, Stored::Nothing, present, true).unwrap(),
        )
        .unwrap();
        assert_eq!(
            raw["spec"]["templateDefaults"],
            json!({"coreTemplate": "default", "shardTemplate": "mine"})
        );
    }

    #[test]
    fn defaulting_is_idempotent() {
        let (_, mut typed) = cluster(json!({
            "postgresPasswordSecretRef": {"name": "pw", "key": "password"},
        }));
        let all = DefaultTemplates {
            core: true,
            cell: true,
            shard: true,
        };
        apply(&mut typed.spec, all);
        internal_tls(&mut typed.spec, Stored::Nothing, true);
        postgres_exporter(&mut typed.spec, Stored::Nothing);
        assert!(
            patch(&typed, Stored::Nothing, all, true)
                .unwrap()
                .0
                .is_empty()
        );
        assert!(
            patch(&typed, Stored::Spec(&typed.spec), all, false)
                .unwrap()
                .0
                .is_empty()
        );
    }

    #[test]
    fn internal_tls_is_on_for_new_clusters_and_kept_as_it_was_for_existing_ones() {
        let enabled = |spec: &MultigresClusterSpec| spec.internal_tls.as_ref()?.enabled;
        let (_, sent) = cluster(json!({
            "postgresPasswordSecretRef": {"name": "pw", "key": "password"},
        }));
        let (_, off) = cluster(json!({
            "postgresPasswordSecretRef": {"name": "pw", "key": "password"},
            "internalTLS": {"enabled": false},
        }));
        let defaulted = |stored: Stored<'_>| {
            let mut spec = sent.spec.clone();
            internal_tls(&mut spec, stored, true);
            enabled(&spec)
        };
        assert_eq!(defaulted(Stored::Nothing), Some(true), "created: on");
        let mut explicit = off.spec.clone();
        internal_tls(&mut explicit, Stored::Nothing, true);
        assert_eq!(enabled(&explicit), Some(false), "a value sent is kept");
        // An update that leaves the field out: the stored value stays, and a cluster created
        // before this default (no value) stays off; so does one whose stored object is unread.
        let mut on = sent.spec.clone();
        internal_tls(&mut on, Stored::Nothing, true);
        assert_eq!(defaulted(Stored::Spec(&on)), Some(true));
        assert_eq!(defaulted(Stored::Spec(&off.spec)), Some(false));
        assert_eq!(defaulted(Stored::Spec(&sent.spec)), None);
        assert_eq!(defaulted(Stored::Unreadable), None);
    }

    #[test]
    fn the_exporter_is_on_for_new_clusters_and_an_upgrade_adds_it_to_no_existing_one() {
        let enabled = |spec: &MultigresClusterSpec| {
            spec.observability
                .as_ref()?
                .postgres_exporter
                .as_ref()?
                .enabled
        };
        let (_, sent) = cluster(json!({
            "postgresPasswordSecretRef": {"name": "pw", "key": "password"},
            "observability": {"tracesSampler": "always_on"},
        }));
        let (_, off) = cluster(json!({
            "postgresPasswordSecretRef": {"name": "pw", "key": "password"},
            "observability": {"postgresExporter": {"enabled": false}},
        }));
        let defaulted = |stored: Stored<'_>| {
            let mut spec = sent.spec.clone();
            postgres_exporter(&mut spec, stored);
            spec
        };
        let created = defaulted(Stored::Nothing);
        assert_eq!(enabled(&created), Some(true), "created: on");
        assert_eq!(
            created
                .observability
                .as_ref()
                .unwrap()
                .traces_sampler
                .as_deref(),
            Some("always_on"),
            "the rest of observability is kept"
        );
        let mut explicit = off.spec.clone();
        postgres_exporter(&mut explicit, Stored::Nothing);
        assert_eq!(enabled(&explicit), Some(false), "a value sent is kept");
        assert_eq!(enabled(&defaulted(Stored::Spec(&created))), Some(true));
        assert_eq!(enabled(&defaulted(Stored::Spec(&off.spec))), Some(false));
        // A cluster created before the exporter existed (no value) keeps running none, so an
        // operator upgrade restarts no pool for it; nor does an update whose stored object was
        // unreadable.
        assert_eq!(enabled(&defaulted(Stored::Spec(&sent.spec))), None);
        assert_eq!(enabled(&defaulted(Stored::Unreadable)), None);
        assert!(!PostgresExporterConfig::enabled(
            sent.spec.observability.as_ref()
        ));
    }

    #[test]
    fn topology_tls_is_on_for_new_clusters_of_managed_etcd_only_and_then_kept() {
        let topology = |spec: &MultigresClusterSpec| spec.internal_tls.as_ref()?.topology;
        let (_, sent) = cluster(json!({
            "postgresPasswordSecretRef": {"name": "pw", "key": "password"},
        }));
        let defaulted = |stored: Stored<'_>, all_managed: bool| {
            let mut spec = sent.spec.clone();
            internal_tls(&mut spec, stored, all_managed);
            spec
        };
        let created = defaulted(Stored::Nothing, true);
        assert_eq!(
            topology(&created),
            Some(true),
            "created, every etcd managed: on"
        );
        let external = defaulted(Stored::Nothing, false);
        assert_eq!(
            topology(&external),
            Some(false),
            "created with an external etcd: off"
        );
        assert_eq!(
            external.internal_tls.as_ref().unwrap().enabled,
            Some(true),
            "gRPC TLS does not depend on the topology servers"
        );
        // Updates keep what creation chose, and a cluster from before this default stays off.
        assert_eq!(
            topology(&defaulted(Stored::Spec(&created), false)),
            Some(true)
        );
        assert_eq!(
            topology(&defaulted(Stored::Spec(&external), true)),
            Some(false)
        );
        assert_eq!(topology(&defaulted(Stored::Spec(&sent.spec), true)), None);
        assert_eq!(topology(&defaulted(Stored::Unreadable, true)), None);
    }
}
