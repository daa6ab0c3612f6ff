//! Volume growth: a larger requested size is applied to the existing PVCs (StatefulSet claim
//! templates are immutable, so the StatefulSet itself keeps the size it was created with);
//! a smaller one is reported and never acted on, since volumes cannot shrink.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::Patch;
use kube::{Api, ResourceExt};
use multigres_common::apply::patch_params;
use serde_json::json;

use kube::runtime::events::EventType;

use crate::conditions::{Computed, FALSE, TRUE};
use crate::controller::Ctx;
use crate::sync::FIELD_MANAGER;

/// Condition type reporting whether the volumes match the requested size.
pub const STORAGE_SYNCED: &str = "StorageSynced";

/// Bytes in a Kubernetes quantity such as `10Gi`, `1.5G` or `1e9`, rounded up; `None` if the
/// text is not a quantity.
pub fn parse_bytes(text: &str) -> Option<u128> {
    let end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(end);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() {
        return None;
    }
    let mantissa: u128 = format!("{whole}{fraction}").parse().ok()?;
    let mut denominator = 10u128.checked_pow(u32::try_from(fraction.len()).ok()?)?;
    let multiplier: u128 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        "Ei" => 1 << 60,
        "k" => 10u128.pow(3),
        "M" => 10u128.pow(6),
        "G" => 10u128.pow(9),
        "T" => 10u128.pow(12),
        "P" => 10u128.pow(15),
        "E" => 10u128.pow(18),
        "m" => {
            denominator = denominator.checked_mul(1000)?;
            1
        }
        exponent => {
            let power: u32 = exponent.strip_prefix(['e', 'E'])?.parse().ok()?;
            10u128.checked_pow(power)?
        }
    };
    Some(mantissa.checked_mul(multiplier)?.div_ceil(denominator))
}

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
}

impl ResizeOutcome {
    /// Adds the outcome of another group of volumes.
    pub fn extend(&mut self, other: ResizeOutcome) {
        self.grown.extend(other.grown);
        self.refused.extend(other.refused);
        self.shrink_refused.extend(other.shrink_refused);
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
    let desired = plan.desired;
    let mut outcome = ResizeOutcome {
        shrink_refused: plan.shrink_refused,
        ..Default::default()
    };
    let patch = json!({"spec": {"resources": {"requests": {"storage": desired}}}});
    for name in plan.grow {
        crate::sync::count(controller, "PersistentVolumeClaim", "patch");
        match api
            .patch(&name, &patch_params(FIELD_MANAGER), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => outcome.grown.push(name),
            Err(kube::Error::Api(status)) if status.code == 403 || status.code == 422 => {
                outcome.refused.push((name, status.message.clone()));
            }
            Err(other) => return Err(other),
        }
    }
    Ok(outcome)
}

/// Events for volume changes: a Normal one when volumes grew, a Warning when a shrink or an
/// expansion was refused.
pub async fn report<K>(ctx: &Ctx<K>, obj: &K, outcome: &ResizeOutcome)
where
    K: kube::Resource<DynamicType = ()>,
{
    if !outcome.grown.is_empty() {
        let note = format!("requested a larger size for {}", outcome.grown.join(", "));
        ctx.event(obj, EventType::Normal, "VolumesExpanded", note)
            .await;
    }
    let cond = outcome.condition();
    if !cond.is_true() {
        ctx.event(obj, EventType::Warning, cond.reason, cond.message)
            .await;
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
    fn quantities_parse_to_bytes() {
        assert_eq!(parse_bytes("1Gi"), Some(1 << 30));
        assert_eq!(parse_bytes("1024Mi"), parse_bytes("1Gi"));
        assert_eq!(parse_bytes("1.5Gi"), Some(3 << 29));
        assert_eq!(parse_bytes("10G"), Some(10_000_000_000));
        assert_eq!(parse_bytes("1e3"), Some(1000));
        assert_eq!(parse_bytes("1500m"), Some(2));
        assert_eq!(parse_bytes("12345"), Some(12345));
        assert_eq!(parse_bytes("Gi"), None);
        assert_eq!(parse_bytes("1Qi"), None);
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
