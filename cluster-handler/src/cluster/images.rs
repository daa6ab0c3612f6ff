//! The image rollout policy: which images a cluster's children run when the operator's default
//! image set changes. Pure, no client.
//!
//! Images set in `spec.images` always win. The other components take the default set the
//! cluster has adopted, recorded in the annotation `multigres.com/applied-images` (falling back
//! to `status.images.applied`). Under `immediate` a cluster adopts a changed default set on its
//! next reconcile; under `lazy` it keeps the recorded set until
//! `spec.imageUpdatePolicy.acknowledgedRevision` names the new set's revision. A cluster with
//! no record (new, or unpinned after being fully pinned) adopts the current set at once.

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use multigres_api::resolver::images::{
    self, APPLIED_IMAGES_ANNOTATION, FULLY_PINNED, Record, is_complete, overlay, pinned, revision,
};
use multigres_api::v1alpha1::{
    ComponentImages, ImageRef, ImageSource, ImageUpdateStrategy, ImagesStatus, MultigresCluster,
    MultigresClusterStatus,
};
use multigres_common::conditions::{self, DesiredCondition, FALSE, TRUE};
use multigres_common::events::Notice;

/// Condition: a newer default image set waits to be adopted.
pub const IMAGE_ROLLOUT_PENDING: &str = "ImageRolloutPending";
/// The cluster runs the current default set.
pub const UP_TO_DATE: &str = "UpToDate";
/// Every image is set in `spec.images`; defaults play no part.
pub const FULLY_PINNED_REASON: &str = "FullyPinned";
/// Lazy: a newer set waits for `acknowledgedRevision`.
pub const AWAITING_ACKNOWLEDGEMENT: &str = "AwaitingAcknowledgement";
/// Lazy: `acknowledgedRevision` names neither the available nor the applied set.
pub const REVISION_MISMATCH: &str = "RevisionMismatch";

/// The operator's image configuration, fixed at start.
#[derive(Clone, Debug, PartialEq)]
pub struct ImageDefaults {
    /// The current default set: compiled-in images with the operator's overrides applied.
    pub images: ComponentImages,
    /// Strategy of clusters that set none.
    pub strategy: ImageUpdateStrategy,
}

impl Default for ImageDefaults {
    fn default() -> Self {
        Self {
            images: images::compiled_defaults(),
            strategy: ImageUpdateStrategy::Immediate,
        }
    }
}

/// Parses `--image-update-strategy`.
pub fn parse_strategy(value: &str) -> Result<ImageUpdateStrategy, String> {
    match value {
        "immediate" => Ok(ImageUpdateStrategy::Immediate),
        "lazy" => Ok(ImageUpdateStrategy::Lazy),
        other => Err(format!(
            "{other:?} is not a strategy; allowed: immediate, lazy"
        )),
    }
}

/// Parses a default image flag: a non-empty reference of at most 512 characters.
pub fn parse_image(value: &str) -> Result<ImageRef, String> {
    let value = value.trim();
    if value.is_empty() || value.len() > 512 {
        return Err("an image reference has 1 to 512 characters".to_owned());
    }
    Ok(ImageRef::new(value))
}

/// The annotation cannot be used, and there is no complete set in the status to fall back to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "metadata.annotations[\"{APPLIED_IMAGES_ANNOTATION}\"] cannot be used: {detail}; under the lazy strategy the operator will not guess which images the cluster runs: set it to the JSON image set the cluster runs, or remove it to adopt the current defaults"
)]
pub struct RecordInvalid {
    /// What is wrong with it.
    pub detail: String,
}

/// The `ImageRolloutPending` condition to set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    /// `True` while a set waits.
    pub status: &'static str,
    /// One of the reasons above.
    pub reason: &'static str,
    /// What is going on and, when waiting, how to acknowledge.
    pub message: String,
}

/// What the policy decided for one reconcile.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// The complete image set the children get.
    pub effective: ComponentImages,
    /// The value the applied-images annotation must have before children change.
    pub annotation: String,
    /// `status.images`.
    pub status: ImagesStatus,
    /// `ImageRolloutPending`.
    pub pending: Pending,
    /// Events worth telling a person about.
    pub notices: Vec<Notice>,
}

impl Decision {
    /// Whether the stored annotation differs from what the decision needs.
    pub fn annotation_changed(&self, cluster: &MultigresCluster) -> bool {
        cluster.annotations().get(APPLIED_IMAGES_ANNOTATION) != Some(&self.annotation)
    }
}

/// Decides the images of `cluster` given the operator's `defaults`.
pub fn decide(
    cluster: &MultigresCluster,
    defaults: &ImageDefaults,
) -> Result<Decision, RecordInvalid> {
    let pins = pinned(cluster.spec.images.as_ref());
    if is_complete(&pins) {
        return Ok(fully_pinned(pins));
    }
    let policy = Policy::of(cluster, defaults);
    let mut notices = Vec::new();
    let recorded = recorded(cluster, &policy, &mut notices)?;
    let (applied, reason) = adopt(recorded, &policy, &mut notices);
    let applied_rev = revision(&applied);
    let pending = pending(cluster, reason, &policy, &applied_rev);
    notices.extend(pending_notice(cluster, &pending, policy.spec_changed));
    let source = if pinned_count(&pins) == 0 {
        ImageSource::Defaults
    } else {
        ImageSource::Mixed
    };
    Ok(Decision {
        effective: overlay(&pins, &applied),
        annotation: serde_json::to_string(&applied).unwrap_or_default(),
        status: ImagesStatus {
            update_strategy: Some(policy.strategy),
            effective: Some(overlay(&pins, &applied)),
            source: Some(source),
            applied: Some(applied),
            applied_revision: Some(applied_rev),
            available: Some(policy.available),
            available_revision: Some(policy.available_rev),
        },
        pending,
        notices,
    })
}

/// The decision when every image is set in `spec.images` (`pins`): defaults play no part.
fn fully_pinned(pins: ComponentImages) -> Decision {
    Decision {
        effective: pins.clone(),
        annotation: FULLY_PINNED.to_owned(),
        status: ImagesStatus {
            effective: Some(pins),
            source: Some(ImageSource::Explicit),
            ..ImagesStatus::default()
        },
        pending: Pending {
            status: FALSE,
            reason: FULLY_PINNED_REASON,
            message: "Every image is set in spec.images; operator defaults are not used".to_owned(),
        },
        notices: Vec::new(),
    }
}

/// What the decision for a cluster that takes some defaults starts from.
struct Policy {
    /// The cluster's strategy, else the operator's.
    strategy: ImageUpdateStrategy,
    /// `spec.imageUpdatePolicy.acknowledgedRevision`, empty when unset.
    ack: String,
    /// The operator's current default set.
    available: ComponentImages,
    /// Its revision.
    available_rev: String,
    /// Whether the spec changed since the status was written: some warnings repeat then.
    spec_changed: bool,
}

impl Policy {
    /// The policy of `cluster` under the operator's `defaults`.
    fn of(cluster: &MultigresCluster, defaults: &ImageDefaults) -> Self {
        let policy = cluster.spec.image_update_policy.clone().unwrap_or_default();
        let current = cluster.status.as_ref();
        Self {
            strategy: policy.strategy.unwrap_or(defaults.strategy),
            ack: policy.acknowledged_revision.unwrap_or_default(),
            available: defaults.images.clone(),
            available_rev: revision(&defaults.images),
            spec_changed: current.and_then(|s| s.observed_generation)
                != cluster.metadata.generation,
        }
    }
}

/// The default set `cluster` has adopted, by its record; `None` when it has none (or an
/// unusable one, replaced under the immediate strategy with a warning in `notices`).
fn recorded(
    cluster: &MultigresCluster,
    policy: &Policy,
    notices: &mut Vec<Notice>,
) -> Result<Option<ComponentImages>, RecordInvalid> {
    Ok(match images::record(cluster) {
        Record::Set(set) => Some(set),
        Record::None | Record::FullyPinned => None,
        Record::Invalid(detail) => match policy.strategy {
            ImageUpdateStrategy::Lazy => return Err(RecordInvalid { detail }),
            ImageUpdateStrategy::Immediate => {
                let available_rev = &policy.available_rev;
                notices.push(Notice::warning(
                    "ImagesRecordInvalid",
                    format!(
                        "metadata.annotations[\"{APPLIED_IMAGES_ANNOTATION}\"] cannot be used ({detail}); adopting the current default image set {available_rev} and recording it"
                    ),
                ));
                None
            }
        },
    })
}

/// The set the children get (before pins) and the `ImageRolloutPending` reason, given the
/// `recorded` set; an adoption and an ignored acknowledgement are told in `notices`.
fn adopt(
    recorded: Option<ComponentImages>,
    policy: &Policy,
    notices: &mut Vec<Notice>,
) -> (ComponentImages, &'static str) {
    let available = &policy.available;
    let (ack, available_rev) = (&policy.ack, &policy.available_rev);
    let recorded = match recorded {
        None => return (available.clone(), UP_TO_DATE),
        Some(recorded) if recorded == *available => return (recorded, UP_TO_DATE),
        Some(recorded) => recorded,
    };
    let recorded_rev = revision(&recorded);
    let adopt = match policy.strategy {
        ImageUpdateStrategy::Immediate => {
            if !ack.is_empty()
                && ack != available_rev
                && *ack != recorded_rev
                && policy.spec_changed
            {
                notices.push(Notice::warning(
                    "ImagesAcknowledgementIgnored",
                    format!(
                        "spec.imageUpdatePolicy.acknowledgedRevision {ack:?} names neither the available default set {available_rev} nor the applied {recorded_rev}; it is ignored under the immediate strategy"
                    ),
                ));
            }
            true
        }
        ImageUpdateStrategy::Lazy => ack == available_rev,
    };
    if adopt {
        notices.push(Notice::normal(
            "ImagesUpdated",
            format!(
                "Adopted the default image set {available_rev} (was {recorded_rev}): {}",
                diff(&recorded, available)
            ),
        ));
        (available.clone(), UP_TO_DATE)
    } else if ack.is_empty() || *ack == recorded_rev {
        (recorded, AWAITING_ACKNOWLEDGEMENT)
    } else {
        (recorded, REVISION_MISMATCH)
    }
}

/// `ImageRolloutPending` for `reason`, with the command that acknowledges the available set
/// while one waits; `applied_rev` is the revision the cluster keeps.
fn pending(
    cluster: &MultigresCluster,
    reason: &'static str,
    policy: &Policy,
    applied_rev: &str,
) -> Pending {
    let (ack, available_rev) = (&policy.ack, &policy.available_rev);
    let name = cluster.name_any();
    let namespace = cluster.namespace().unwrap_or_default();
    let patch = format!(
        "kubectl patch multigrescluster {name} -n {namespace} --type=merge -p '{{\"spec\":{{\"imageUpdatePolicy\":{{\"acknowledgedRevision\":\"{available_rev}\"}}}}}}'"
    );
    match reason {
        AWAITING_ACKNOWLEDGEMENT => Pending {
            status: TRUE,
            reason,
            message: format!(
                "The operator's default image set changed to {available_rev}; under the lazy strategy the cluster keeps {applied_rev} until acknowledged: {patch}"
            ),
        },
        REVISION_MISMATCH => Pending {
            status: TRUE,
            reason,
            message: format!(
                "spec.imageUpdatePolicy.acknowledgedRevision {ack:?} names neither the available default set {available_rev} nor the applied {applied_rev}; the cluster keeps {applied_rev}. To adopt the available set: {patch}"
            ),
        },
        _ => Pending {
            status: FALSE,
            reason: UP_TO_DATE,
            message: format!("The cluster runs the operator's default image set {applied_rev}"),
        },
    }
}

/// The event for a set that waits: when the reason of `cluster`'s stored
/// `ImageRolloutPending` changes to `pending`'s, and for a mismatch also on a spec change.
fn pending_notice(
    cluster: &MultigresCluster,
    pending: &Pending,
    spec_changed: bool,
) -> Option<Notice> {
    let stored = cluster.status.as_ref().map(|s| s.conditions.as_slice());
    let previous = conditions::find_condition(stored.unwrap_or_default(), IMAGE_ROLLOUT_PENDING);
    let reason_changed = previous.is_none_or(|c| c.reason != pending.reason);
    match pending.reason {
        REVISION_MISMATCH if reason_changed || spec_changed => {
            Some(Notice::warning(REVISION_MISMATCH, pending.message.clone()))
        }
        AWAITING_ACKNOWLEDGEMENT if reason_changed => Some(Notice::normal(
            AWAITING_ACKNOWLEDGEMENT,
            pending.message.clone(),
        )),
        _ => None,
    }
}

fn pinned_count(pins: &ComponentImages) -> usize {
    [
        &pins.multigateway,
        &pins.multiorch,
        &pins.multipooler,
        &pins.multiadmin,
        &pins.multiadmin_web,
        &pins.postgres,
    ]
    .iter()
    .filter(|p| p.is_some())
    .count()
}

/// `component old → new` for every component that differs.
fn diff(from: &ComponentImages, to: &ComponentImages) -> String {
    let pairs = [
        ("multigateway", &from.multigateway, &to.multigateway),
        ("multiorch", &from.multiorch, &to.multiorch),
        ("multipooler", &from.multipooler, &to.multipooler),
        ("multiadmin", &from.multiadmin, &to.multiadmin),
        ("multiadminWeb", &from.multiadmin_web, &to.multiadmin_web),
        ("postgres", &from.postgres, &to.postgres),
    ];
    let show = |i: &Option<ImageRef>| i.as_ref().map_or("", |i| i.as_str()).to_owned();
    pairs
        .iter()
        .filter(|(_, a, b)| a != b)
        .map(|(name, a, b)| format!("{name} {} → {}", show(a), show(b)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Sets `status.images` and `ImageRolloutPending` on `status` (computed from `current`, which
/// keeps what was stored when there is no decision) and returns the fields that changed.
pub fn set_status(
    status: &mut MultigresClusterStatus,
    current: &MultigresClusterStatus,
    decision: Option<&Decision>,
    generation: Option<i64>,
    now: Timestamp,
) -> Vec<&'static str> {
    let stored = conditions::find_condition(&current.conditions, IMAGE_ROLLOUT_PENDING);
    status
        .conditions
        .retain(|c| c.type_ != IMAGE_ROLLOUT_PENDING);
    let Some(decision) = decision else {
        status.images = current.images.clone();
        status.conditions.extend(stored.cloned());
        return Vec::new();
    };
    status.images = Some(decision.status.clone());
    status.conditions.extend(stored.cloned());
    let condition_changed = conditions::set_condition(
        &mut status.conditions,
        &DesiredCondition {
            type_: IMAGE_ROLLOUT_PENDING,
            status: decision.pending.status,
            reason: decision.pending.reason,
            message: &decision.pending.message,
            observed_generation: generation,
        },
        now,
    );
    let mut changed = Vec::new();
    if condition_changed {
        changed.push("conditions");
    }
    if current.images != status.images {
        changed.push("images");
    }
    changed
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use multigres_api::v1alpha1::{ClusterImages, ImageUpdatePolicy};

    use super::*;

    fn set(tag: &str) -> ComponentImages {
        let image = |name: &str| Some(ImageRef::new(format!("test/{name}:{tag}")));
        ComponentImages {
            multigateway: image("multigres"),
            multiorch: image("multigres"),
            multipooler: image("multigres"),
            multiadmin: image("multigres"),
            multiadmin_web: image("web"),
            postgres: image("pgctld"),
        }
    }

    fn defaults(tag: &str, strategy: ImageUpdateStrategy) -> ImageDefaults {
        ImageDefaults {
            images: set(tag),
            strategy,
        }
    }

    /// A stored cluster (generation 2, observed 2) whose record is `recorded`.
    fn cluster(recorded: Option<&ComponentImages>) -> MultigresCluster {
        let mut c = MultigresCluster::new("db", Default::default());
        c.metadata.namespace = Some("team".into());
        c.metadata.generation = Some(2);
        c.status = Some(MultigresClusterStatus {
            observed_generation: Some(2),
            ..Default::default()
        });
        c.metadata.annotations = recorded.map(|r| {
            BTreeMap::from([(
                APPLIED_IMAGES_ANNOTATION.to_owned(),
                serde_json::to_string(r).unwrap(),
            )])
        });
        c
    }

    fn with_policy(
        mut c: MultigresCluster,
        strategy: Option<ImageUpdateStrategy>,
        ack: Option<&str>,
    ) -> MultigresCluster {
        c.spec.image_update_policy = Some(ImageUpdatePolicy {
            strategy,
            acknowledged_revision: ack.map(str::to_owned),
        });
        c
    }

    fn reasons(d: &Decision) -> Vec<&str> {
        d.notices.iter().map(|n| n.reason.as_str()).collect()
    }

    #[test]
    fn a_new_cluster_adopts_the_current_defaults_under_either_strategy() {
        for strategy in [ImageUpdateStrategy::Lazy, ImageUpdateStrategy::Immediate] {
            let d = decide(&cluster(None), &defaults("v2", strategy)).unwrap();
            assert_eq!(d.effective, set("v2"));
            assert_eq!(d.annotation, serde_json::to_string(&set("v2")).unwrap());
            assert_eq!(d.pending.reason, UP_TO_DATE);
            assert_eq!(d.pending.status, FALSE);
            assert!(d.notices.is_empty(), "{:?}", d.notices);
            assert_eq!(
                d.status,
                ImagesStatus {
                    update_strategy: Some(strategy),
                    effective: Some(set("v2")),
                    source: Some(ImageSource::Defaults),
                    applied: Some(set("v2")),
                    applied_revision: Some(revision(&set("v2"))),
                    available: Some(set("v2")),
                    available_revision: Some(revision(&set("v2"))),
                }
            );
        }
    }

    #[test]
    fn immediate_adopts_a_changed_default_set_and_reports_the_diff() {
        let d = decide(
            &cluster(Some(&set("v1"))),
            &defaults("v2", ImageUpdateStrategy::Immediate),
        )
        .unwrap();
        assert_eq!(d.effective, set("v2"));
        assert_eq!(d.pending.reason, UP_TO_DATE);
        assert_eq!(reasons(&d), ["ImagesUpdated"]);
        assert!(
            d.notices[0]
                .message
                .contains("postgres test/pgctld:v1 → test/pgctld:v2"),
            "{}",
            d.notices[0].message
        );
    }

    #[test]
    fn lazy_holds_the_recorded_set_and_says_how_to_acknowledge() {
        let d = decide(
            &cluster(Some(&set("v1"))),
            &defaults("v2", ImageUpdateStrategy::Lazy),
        )
        .unwrap();
        assert_eq!(d.effective, set("v1"));
        assert_eq!(d.annotation, serde_json::to_string(&set("v1")).unwrap());
        assert_eq!(d.pending.status, TRUE);
        assert_eq!(d.pending.reason, AWAITING_ACKNOWLEDGEMENT);
        let rev = revision(&set("v2"));
        assert!(d.pending.message.ends_with(&format!(
            "kubectl patch multigrescluster db -n team --type=merge -p '{{\"spec\":{{\"imageUpdatePolicy\":{{\"acknowledgedRevision\":\"{rev}\"}}}}}}'"
        )), "{}", d.pending.message);
        assert_eq!(d.status.applied, Some(set("v1")));
        assert_eq!(d.status.available_revision, Some(rev));
        assert_eq!(reasons(&d), [AWAITING_ACKNOWLEDGEMENT]);
    }

    #[test]
    fn the_cluster_strategy_overrides_the_operators() {
        let c = with_policy(
            cluster(Some(&set("v1"))),
            Some(ImageUpdateStrategy::Lazy),
            None,
        );
        let d = decide(&c, &defaults("v2", ImageUpdateStrategy::Immediate)).unwrap();
        assert_eq!(d.effective, set("v1"));
        assert_eq!(d.status.update_strategy, Some(ImageUpdateStrategy::Lazy));
        let c = with_policy(
            cluster(Some(&set("v1"))),
            Some(ImageUpdateStrategy::Immediate),
            None,
        );
        let d = decide(&c, &defaults("v2", ImageUpdateStrategy::Lazy)).unwrap();
        assert_eq!(d.effective, set("v2"));
    }

    #[test]
    fn lazy_adopts_when_the_available_revision_is_acknowledged() {
        let rev = revision(&set("v2"));
        let c = with_policy(cluster(Some(&set("v1"))), None, Some(&rev));
        let d = decide(&c, &defaults("v2", ImageUpdateStrategy::Lazy)).unwrap();
        assert_eq!(d.effective, set("v2"));
        assert_eq!(d.annotation, serde_json::to_string(&set("v2")).unwrap());
        assert_eq!(d.pending.reason, UP_TO_DATE);
        assert_eq!(reasons(&d), ["ImagesUpdated"]);
    }

    #[test]
    fn a_consumed_acknowledgement_awaits_rather_than_mismatches() {
        let c = with_policy(cluster(Some(&set("v1"))), None, Some(&revision(&set("v1"))));
        let d = decide(&c, &defaults("v2", ImageUpdateStrategy::Lazy)).unwrap();
        assert_eq!(d.effective, set("v1"));
        assert_eq!(d.pending.reason, AWAITING_ACKNOWLEDGEMENT);
    }

    #[test]
    fn an_unknown_acknowledgement_holds_and_warns() {
        let c = with_policy(cluster(Some(&set("v1"))), None, Some("abcdef012345"));
        let d = decide(&c, &defaults("v2", ImageUpdateStrategy::Lazy)).unwrap();
        assert_eq!(d.effective, set("v1"));
        assert_eq!(d.pending.reason, REVISION_MISMATCH);
        assert_eq!(d.pending.status, TRUE);
        assert!(d.pending.message.contains("\"abcdef012345\""));
        assert_eq!(reasons(&d), [REVISION_MISMATCH]);
        assert_eq!(
            d.notices[0].type_,
            kube::runtime::events::EventType::Warning
        );
    }

    #[test]
    fn warnings_repeat_only_on_a_spec_change_or_a_new_reason() {
        let mut c = with_policy(cluster(Some(&set("v1"))), None, Some("abcdef012345"));
        let first = decide(&c, &defaults("v2", ImageUpdateStrategy::Lazy)).unwrap();
        let mut status = c.status.clone().unwrap();
        set_status(
            &mut status,
            &c.status.clone().unwrap(),
            Some(&first),
            Some(2),
            Timestamp::UNIX_EPOCH,
        );
        c.status = Some(status);
        let again = decide(&c, &defaults("v2", ImageUpdateStrategy::Lazy)).unwrap();
        assert!(again.notices.is_empty(), "{:?}", again.notices);
        c.metadata.generation = Some(3);
        let edited = decide(&c, &defaults("v2", ImageUpdateStrategy::Lazy)).unwrap();
        assert_eq!(reasons(&edited), [REVISION_MISMATCH]);
    }

    #[test]
    fn immediate_warns_about_an_acknowledgement_it_ignores_when_the_spec_changes() {
        let mut c = with_policy(cluster(Some(&set("v1"))), None, Some("abcdef012345"));
        c.metadata.generation = Some(3);
        let d = decide(&c, &defaults("v2", ImageUpdateStrategy::Immediate)).unwrap();
        assert_eq!(d.effective, set("v2"));
        assert_eq!(
            reasons(&d),
            ["ImagesAcknowledgementIgnored", "ImagesUpdated"]
        );
    }

    #[test]
    fn fully_pinned_writes_the_tombstone_and_reports_no_defaults() {
        let mut c = cluster(Some(&set("v1")));
        let p = set("pin");
        c.spec.images = Some(ClusterImages {
            multigateway: p.multigateway.clone(),
            multiorch: p.multiorch.clone(),
            multipooler: p.multipooler.clone(),
            multiadmin: p.multiadmin.clone(),
            multiadmin_web: p.multiadmin_web.clone(),
            postgres: p.postgres.clone(),
            ..Default::default()
        });
        let d = decide(&c, &defaults("v2", ImageUpdateStrategy::Lazy)).unwrap();
        assert_eq!(d.effective, p);
        assert_eq!(d.annotation, FULLY_PINNED);
        assert_eq!(d.pending.reason, FULLY_PINNED_REASON);
        assert_eq!(
            d.status,
            ImagesStatus {
                effective: Some(p),
                source: Some(ImageSource::Explicit),
                ..Default::default()
            }
        );
    }

    #[test]
    fn unpinning_after_the_tombstone_adopts_the_current_defaults_not_a_stale_status() {
        let mut c = cluster(None);
        c.metadata.annotations = Some(BTreeMap::from([(
            APPLIED_IMAGES_ANNOTATION.to_owned(),
            FULLY_PINNED.to_owned(),
        )]));
        c.status.as_mut().unwrap().images = Some(ImagesStatus {
            applied: Some(set("v0")),
            ..Default::default()
        });
        c.spec.images = Some(ClusterImages {
            postgres: Some(ImageRef::new("pinned/pgctld")),
            ..Default::default()
        });
        let d = decide(&c, &defaults("v2", ImageUpdateStrategy::Lazy)).unwrap();
        let mut expected = set("v2");
        expected.postgres = Some(ImageRef::new("pinned/pgctld"));
        assert_eq!(d.effective, expected);
        assert_eq!(d.status.source, Some(ImageSource::Mixed));
        assert_eq!(d.status.applied, Some(set("v2")));
    }

    #[test]
    fn a_lost_annotation_falls_back_to_the_status_and_is_rewritten() {
        let mut c = cluster(None);
        c.status.as_mut().unwrap().images = Some(ImagesStatus {
            applied: Some(set("v1")),
            ..Default::default()
        });
        let d = decide(&c, &defaults("v2", ImageUpdateStrategy::Lazy)).unwrap();
        assert_eq!(d.effective, set("v1"));
        assert!(d.annotation_changed(&c));
        assert!(!d.annotation_changed(&cluster(Some(&set("v1")))));
    }

    #[test]
    fn an_unusable_record_fails_under_lazy_and_is_replaced_under_immediate() {
        let mut c = cluster(None);
        c.metadata.annotations = Some(BTreeMap::from([(
            APPLIED_IMAGES_ANNOTATION.to_owned(),
            "{\"postgres\":\"x\"}".to_owned(),
        )]));
        let err = decide(&c, &defaults("v2", ImageUpdateStrategy::Lazy)).unwrap_err();
        assert!(err.to_string().contains("every component"), "{err}");
        assert!(err.to_string().contains("remove it"), "{err}");
        let d = decide(&c, &defaults("v2", ImageUpdateStrategy::Immediate)).unwrap();
        assert_eq!(d.effective, set("v2"));
        assert_eq!(reasons(&d), ["ImagesRecordInvalid"]);
    }

    #[test]
    fn status_is_idempotent_and_kept_without_a_decision() {
        let c = cluster(Some(&set("v1")));
        let d = decide(&c, &defaults("v2", ImageUpdateStrategy::Lazy)).unwrap();
        let current = c.status.clone().unwrap();
        let mut first = MultigresClusterStatus::default();
        let changed = set_status(
            &mut first,
            &current,
            Some(&d),
            Some(2),
            Timestamp::UNIX_EPOCH,
        );
        assert_eq!(changed, ["conditions", "images"]);
        let mut second = MultigresClusterStatus::default();
        let later = Timestamp::from_second(60).unwrap();
        assert!(set_status(&mut second, &first, Some(&d), Some(2), later).is_empty());
        assert_eq!(second.conditions, first.conditions);
        let mut kept = MultigresClusterStatus::default();
        assert!(set_status(&mut kept, &first, None, Some(3), later).is_empty());
        assert_eq!(kept.images, first.images);
        assert_eq!(kept.conditions, first.conditions);
    }

    #[test]
    fn flags_parse_strictly() {
        assert_eq!(parse_strategy("lazy"), Ok(ImageUpdateStrategy::Lazy));
        assert!(
            parse_strategy("Lazy")
                .unwrap_err()
                .contains("immediate, lazy")
        );
        assert_eq!(parse_image(" a/b:c ").unwrap().as_str(), "a/b:c");
        assert!(parse_image("  ").is_err());
    }
}
