//! Volume growth: a larger requested size is applied to the existing PVCs (StatefulSet claim
//! templates are immutable, so the StatefulSet itself keeps the size it was created with);
//! a smaller one is reported and never acted on, since volumes cannot shrink. A pool with
//! `autoGrow` also grows each claim whose pod's measured usage (`status.volumes`, published by
//! the data-handler) passed its threshold, by its step, never past its ceiling
//! ([`multigres_api::volumes::decide`]).

use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolumeClaim};
use kube::api::Patch;
use kube::{Api, ResourceExt};
use multigres_api::v1alpha1::VolumeUsage;
use multigres_api::volumes::{self, AutoGrow, Growth};
use multigres_common::apply::patch_params;
use serde_json::json;

use kube::runtime::events::EventType;

use crate::conditions::{Computed, FALSE, TRUE};
use crate::controller::Ctx;
use crate::sync::FIELD_MANAGER;

/// Condition type reporting whether the volumes match the requested size.
pub const STORAGE_SYNCED: &str = "StorageSynced";
/// Condition type reporting whether auto-grow keeps the pool volumes ahead of their usage
/// (only on a Shard with a pool that has `autoGrow`).
pub const VOLUME_AUTO_GROW: &str = "VolumeAutoGrow";
/// Prefix of a pool pod's data claim (`data-<pod>`, from the claim template's name).
const DATA_CLAIM_PREFIX: &str = "data-";

pub use multigres_api::volumes::parse_bytes;

/// The storage request of a PVC, as written.
pub fn requested(pvc: &PersistentVolumeClaim) -> Option<&str> {
    pvc.spec
        .as_ref()?
        .resources
        .as_ref()?
        .requests
        .as_ref()?
        .get("storage")
        .map(|q| q.0.as_str())
}

/// A volume asked to become smaller than it is.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Shrink {
    /// The claim.
    pub pvc: String,
    /// What it requests now.
    pub current: String,
    /// What the spec asks for.
    pub desired: String,
}

/// What to do with a set of volumes given the requested size.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResizePlan {
    /// The size the spec asks for.
    pub desired: String,
    /// PVCs whose request is smaller than the desired size: grow them.
    pub grow: Vec<String>,
    /// PVCs whose request is larger than the desired size: left alone.
    pub shrink_refused: Vec<Shrink>,
}

/// Compares every PVC's request with `desired`. PVCs without a parseable request are left
/// alone (nothing sensible can be done with them).
pub fn plan_resize<'a>(
    desired: &str,
    pvcs: impl IntoIterator<Item = &'a PersistentVolumeClaim>,
) -> ResizePlan {
    let mut plan = ResizePlan {
        desired: desired.to_owned(),
        ..Default::default()
    };
    let Some(want) = parse_bytes(desired) else {
        return plan;
    };
    for pvc in pvcs {
        let Some(current) = requested(pvc) else {
            continue;
        };
        let Some(have) = parse_bytes(current) else {
            continue;
        };
        if have < want {
            plan.grow.push(pvc.name_any());
        } else if have > want {
            plan.shrink_refused.push(Shrink {
                pvc: pvc.name_any(),
                current: current.to_owned(),
                desired: desired.to_owned(),
            });
        }
    }
    plan.grow.sort();
    plan.shrink_refused.sort();
    plan
}

/// The storage capacity a bound claim was given, in bytes.
pub fn capacity(pvc: &PersistentVolumeClaim) -> Option<u128> {
    pvc.status
        .as_ref()?
        .capacity
        .as_ref()?
        .get("storage")
        .and_then(|q| parse_bytes(&q.0))
}

/// A claim past its threshold at its ceiling.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AtCeiling {
    /// The claim.
    pub pvc: String,
    /// Its pod's measured usage, in bytes.
    pub used: u128,
    /// What storage gave it, in bytes.
    pub capacity: u128,
    /// The ceiling, as written.
    pub ceiling: String,
}

/// What auto-grow does with one pool's claims.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AutoGrowPlan {
    /// Claims to grow, with the size to request and why.
    pub grow: Vec<(String, String, String)>,
    /// Claims past their threshold that cannot grow.
    pub at_ceiling: Vec<AtCeiling>,
}

/// Decides, for each of `pvcs` not already growing to the spec's size (`skip`), whether its
/// pod's usage in `volumes` grows it under `auto` (`ceiling` as written).
pub fn plan_auto_grow<'a>(
    auto: &AutoGrow,
    ceiling: &str,
    pvcs: impl IntoIterator<Item = &'a PersistentVolumeClaim>,
    volumes: &[VolumeUsage],
    skip: &[String],
) -> AutoGrowPlan {
    let mut plan = AutoGrowPlan::default();
    for pvc in pvcs {
        let name = pvc.name_any();
        let Some(pod) = name.strip_prefix(DATA_CLAIM_PREFIX) else {
            continue;
        };
        let Some(requested) = requested(pvc).and_then(parse_bytes) else {
            continue;
        };
        if skip.contains(&name) || pvc.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let given = capacity(pvc);
        let used = volumes::used_by(volumes, pod);
        match volumes::decide(auto, requested, given, used) {
            Growth::Grow(to) => {
                let size = if to == auto.ceiling {
                    ceiling.to_owned()
                } else {
                    volumes::quantity(to)
                };
                let why = format!(
                    "pod {pod} uses {} of {} (threshold {} %)",
                    volumes::quantity(used.unwrap_or_default()),
                    volumes::quantity(given.unwrap_or_default()),
                    auto.threshold
                );
                plan.grow.push((name, size, why));
            }
            Growth::AtCeiling => plan.at_ceiling.push(AtCeiling {
                pvc: name,
                used: used.unwrap_or_default(),
                capacity: given.unwrap_or_default(),
                ceiling: ceiling.to_owned(),
            }),
            Growth::Room | Growth::Expanding => {}
        }
    }
    plan.grow.sort();
    plan
}

/// The outcome of applying a [`ResizePlan`], for the `StorageSynced` condition.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResizeOutcome {
    /// PVCs whose request was raised.
    pub grown: Vec<String>,
    /// PVCs the API server refused to grow, with its message (e.g. the StorageClass does not
    /// allow expansion).
    pub refused: Vec<(String, String)>,
    /// PVCs larger than requested.
    pub shrink_refused: Vec<Shrink>,
    /// Some pool has `autoGrow` (the `VolumeAutoGrow` condition is reported).
    pub auto_grow: bool,
    /// PVCs auto-grown now: name, size requested, why.
    pub auto_grown: Vec<(String, String, String)>,
    /// PVCs past their threshold at their ceiling.
    pub at_ceiling: Vec<AtCeiling>,
    /// A pool's `autoGrow` that cannot be read: the field and why.
    pub auto_invalid: Option<String>,
}

impl ResizeOutcome {
    /// Adds the outcome of another group of volumes.
    pub fn extend(&mut self, other: ResizeOutcome) {
        self.grown.extend(other.grown);
        self.refused.extend(other.refused);
        self.shrink_refused.extend(other.shrink_refused);
        self.auto_grow |= other.auto_grow;
        self.auto_grown.extend(other.auto_grown);
        self.at_ceiling.extend(other.at_ceiling);
        if self.auto_invalid.is_none() {
            self.auto_invalid = other.auto_invalid;
        }
    }

    /// The `VolumeAutoGrow` condition, when some pool has `autoGrow`: `False` while a claim
    /// past its threshold is at its ceiling, its growth was refused, or the setting cannot be
    /// read.
    pub fn auto_grow_condition(&self) -> Option<Computed> {
        if !self.auto_grow {
            return None;
        }
        if let Some(why) = &self.auto_invalid {
            return Some(Computed::new(
                VOLUME_AUTO_GROW,
                FALSE,
                "InvalidSpec",
                format!("{why}; no volume is grown until it is fixed"),
            ));
        }
        let auto_refused: Vec<&(String, String)> = self
            .refused
            .iter()
            .filter(|(name, _)| self.auto_grown.iter().all(|(grown, ..)| grown != name))
            .collect();
        if let Some((name, message)) = auto_refused.first() {
            return Some(Computed::new(
                VOLUME_AUTO_GROW,
                FALSE,
                "ExpansionRefused",
                format!(
                    "growing volume {name} past its threshold was refused: {message}; use a \
                     StorageClass with allowVolumeExpansion: true"
                ),
            ));
        }
        if let Some(c) = self.at_ceiling.first() {
            return Some(Computed::new(
                VOLUME_AUTO_GROW,
                FALSE,
                "AtCeiling",
                format!(
                    "volume {} is at its ceiling {} and its pod uses {} of {} ({} %){}: raise \
                     autoGrow.ceiling, or free space (docs/runbooks/MultigresVolumeFillingUp.md)",
                    c.pvc,
                    c.ceiling,
                    volumes::quantity(c.used),
                    volumes::quantity(c.capacity),
                    (c.used * 100).checked_div(c.capacity).unwrap_or(100),
                    match self.at_ceiling.len() - 1 {
                        0 => String::new(),
                        n => format!(", and {n} other volume(s) too"),
                    }
                ),
            ));
        }
        Some(Computed::new(
            VOLUME_AUTO_GROW,
            TRUE,
            "BelowCeiling",
            "every volume past its threshold was grown, or none is past it",
        ))
    }

    /// The `StorageSynced` condition: `True` when every volume requests its configured size.
    pub fn condition(&self) -> Computed {
        if let Some(shrink) = self.shrink_refused.first() {
            return Computed::new(
                STORAGE_SYNCED,
                FALSE,
                "ShrinkRefused",
                format!(
                    "requested size {} is smaller than volume {} ({}){}; volumes cannot shrink, \
                     so nothing was changed: restore the size",
                    shrink.desired,
                    shrink.pvc,
                    shrink.current,
                    match self.shrink_refused.len() - 1 {
                        0 => String::new(),
                        n => format!(" and {n} other volume(s)"),
                    }
                ),
            );
        }
        if let Some((name, message)) = self.refused.first() {
            return Computed::new(
                STORAGE_SYNCED,
                FALSE,
                "ExpansionRefused",
                format!(
                    "growing volume {name} was refused: {message}; use a StorageClass with \
                     allowVolumeExpansion: true"
                ),
            );
        }
        Computed::new(
            STORAGE_SYNCED,
            TRUE,
            "UpToDate",
            "every volume requests its configured size",
        )
    }
}

/// Raises the request of `plan.grow` to the desired size with a merge patch of that one field
/// (the PVCs belong to the StatefulSet controller; only their size is ours to change).
pub async fn apply_resize(
    controller: &'static str,
    api: &Api<PersistentVolumeClaim>,
    plan: ResizePlan,
) -> Result<ResizeOutcome, kube::Error> {
    let sizes = plan
        .grow
        .into_iter()
        .map(|name| (name, plan.desired.clone()))
        .collect();
    let (grown, refused) = apply_sizes(controller, api, sizes).await?;
    Ok(ResizeOutcome {
        grown,
        refused,
        shrink_refused: plan.shrink_refused,
        ..Default::default()
    })
}

/// Requests the size auto-grow decided for each claim of `plan`.
pub async fn apply_auto_grow(
    controller: &'static str,
    api: &Api<PersistentVolumeClaim>,
    plan: AutoGrowPlan,
) -> Result<ResizeOutcome, kube::Error> {
    let sizes = plan
        .grow
        .iter()
        .map(|(name, size, _)| (name.clone(), size.clone()))
        .collect();
    let (grown, refused) = apply_sizes(controller, api, sizes).await?;
    Ok(ResizeOutcome {
        auto_grow: true,
        auto_grown: plan
            .grow
            .into_iter()
            .filter(|(name, ..)| grown.contains(name))
            .collect(),
        at_ceiling: plan.at_ceiling,
        refused,
        ..Default::default()
    })
}

/// Patches each claim's request to its size: the names grown, and those the API server refused
/// with its message (e.g. the StorageClass does not allow expansion).
async fn apply_sizes(
    controller: &'static str,
    api: &Api<PersistentVolumeClaim>,
    sizes: Vec<(String, String)>,
) -> Result<(Vec<String>, Vec<(String, String)>), kube::Error> {
    let (mut grown, mut refused) = (Vec::new(), Vec::new());
    for (name, size) in sizes {
        let patch = json!({"spec": {"resources": {"requests": {"storage": size}}}});
        crate::sync::count(controller, "PersistentVolumeClaim", "patch");
        match api
            .patch(&name, &patch_params(FIELD_MANAGER), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => grown.push(name),
            Err(kube::Error::Api(status)) if status.code == 403 || status.code == 422 => {
                refused.push((name, status.message.clone()));
            }
            Err(other) => return Err(other),
        }
    }
    Ok((grown, refused))
}

/// Events for volume changes: a Normal one when volumes grew, a Warning when a shrink or an
/// expansion was refused; with auto-grow, a Normal one per claim grown, and a Warning when the
/// `VolumeAutoGrow` condition turns false or changes its message (`stored`: the object's
/// conditions as read), so a claim held at its ceiling is announced once, not every pass.
pub async fn report<K>(
    ctx: &Ctx<K>,
    obj: &K,
    outcome: &ResizeOutcome,
    stored: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
) where
    K: kube::Resource<DynamicType = ()>,
{
    let by_spec: Vec<&String> = outcome
        .grown
        .iter()
        .filter(|name| outcome.auto_grown.iter().all(|(auto, ..)| auto != *name))
        .collect();
    if !by_spec.is_empty() {
        let names: Vec<&str> = by_spec.iter().map(|n| n.as_str()).collect();
        let note = format!("requested a larger size for {}", names.join(", "));
        ctx.kit
            .event(obj, EventType::Normal, "VolumesExpanded", note)
            .await;
    }
    for (name, size, why) in &outcome.auto_grown {
        let note = format!("{why}: requested {size} for volume {name} (autoGrow)");
        // The claim as the related object: each claim's growths form their own series (a
        // series keeps its first note; the claim's request says where it is now).
        let claim = ObjectReference {
            api_version: Some("v1".to_owned()),
            kind: Some("PersistentVolumeClaim".to_owned()),
            name: Some(name.clone()),
            namespace: obj.meta().namespace.clone(),
            ..Default::default()
        };
        ctx.kit
            .event_about(obj, Some(claim), EventType::Normal, "VolumeAutoGrown", note)
            .await;
    }
    let cond = outcome.condition();
    if !cond.is_true() {
        ctx.kit
            .event(obj, EventType::Warning, cond.reason, cond.message)
            .await;
    }
    if let Some(auto) = outcome.auto_grow_condition().filter(|c| !c.is_true()) {
        let unchanged = stored.iter().any(|c| {
            c.type_ == VOLUME_AUTO_GROW && c.reason == auto.reason && c.message == auto.message
        });
        if !unchanged {
            ctx.kit
                .event(obj, EventType::Warning, auto.reason, auto.message)
                .await;
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::PersistentVolumeClaim;

    use super::*;

    fn pvc(name: &str, size: &str) -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"resources": {"requests": {"storage": size}}},
        }))
        .unwrap()
    }

    #[test]
    fn resize_grows_smaller_volumes_and_refuses_to_shrink() {
        let pvcs = [
            pvc("data-0", "1Gi"),
            pvc("data-1", "2Gi"),
            pvc("data-2", "2048Mi"),
            pvc("data-3", "4Gi"),
        ];
        let plan = plan_resize("2Gi", &pvcs);
        assert_eq!(plan.grow, ["data-0"]);
        assert_eq!(
            plan.shrink_refused,
            [Shrink {
                pvc: "data-3".into(),
                current: "4Gi".into(),
                desired: "2Gi".into()
            }]
        );
        let unparseable = plan_resize("not-a-size", &pvcs);
        assert!(unparseable.grow.is_empty() && unparseable.shrink_refused.is_empty());
    }

    #[test]
    fn condition_reports_shrink_before_anything_else() {
        let ok = ResizeOutcome::default().condition();
        assert_eq!((ok.status, ok.reason), (TRUE, "UpToDate"));
        let mut shrink = ResizeOutcome {
            refused: vec![("data-1".into(), "forbidden".into())],
            ..Default::default()
        };
        shrink.extend(ResizeOutcome {
            shrink_refused: vec![Shrink {
                pvc: "data-0".into(),
                current: "4Gi".into(),
                desired: "2Gi".into(),
            }],
            ..Default::default()
        });
        let shrink = shrink.condition();
        assert_eq!((shrink.status, shrink.reason), (FALSE, "ShrinkRefused"));
        assert!(
            shrink
                .message
                .contains("2Gi is smaller than volume data-0 (4Gi);"),
            "{}",
            shrink.message
        );
        let refused = ResizeOutcome {
            refused: vec![("data-1".into(), "class forbids".into())],
            ..Default::default()
        }
        .condition();
        assert_eq!(refused.reason, "ExpansionRefused");
        assert!(refused.message.contains("class forbids"));
    }
}
