//! Scale-ups that wait for the volumes of scaled-away replicas to go.
//!
//! Under `whenScaled: Delete` the StatefulSet controller makes a scaled-away replica's pod the
//! owner of its claims, and the garbage collector deletes them once the pod is gone. A scale-up
//! that reaches that ordinal while such a claim still exists finds it stale, skips the pod and
//! never looks again: that controller watches no claims, so nothing wakes it when the claim
//! finally goes, and the pool stays short of replicas until something else touches it. This
//! handler does watch claims, so it holds the StatefulSet below the first such ordinal and
//! raises it once the claim is gone.

use std::sync::Arc;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::ResourceExt;

/// A pool StatefulSet applied with fewer replicas than wanted, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldScaleUp {
    /// The pool StatefulSet.
    pub statefulset: String,
    /// Replicas applied for now.
    pub replicas: i32,
    /// Replicas the spec asks for.
    pub wanted: i32,
    /// The claim of a scaled-away replica that is still on its way out.
    pub claim: String,
}

impl HeldScaleUp {
    /// What a user reads on the Shard's Available condition.
    pub fn message(&self) -> String {
        format!(
            "{} stays at {} of {} replicas until PersistentVolumeClaim {} of a scaled-away \
             replica is deleted (whenScaled: Delete)",
            self.statefulset, self.replicas, self.wanted, self.claim
        )
    }
}

/// Whether `claim` is about to be deleted: marked for deletion, or handed to a scaled-away pod
/// (the only claims the StatefulSet controller gives a Pod owner).
pub fn leaving(claim: &PersistentVolumeClaim) -> bool {
    claim.metadata.deletion_timestamp.is_some()
        || claim.owner_references().iter().any(|o| o.kind == "Pod")
}

/// Lowers the replicas of `desired` below the first new ordinal whose claim is still leaving.
///
/// `current` is the StatefulSet as it is now (`None`: not created yet); `lookup` finds a claim
/// of its namespace by name (the names the StatefulSet controller gives them).
pub fn hold(
    desired: &mut StatefulSet,
    current: Option<&StatefulSet>,
    lookup: impl Fn(&str) -> Option<Arc<PersistentVolumeClaim>>,
) -> Option<HeldScaleUp> {
    let replicas = |set: &StatefulSet| set.spec.as_ref().and_then(|s| s.replicas);
    let wanted = replicas(desired)?;
    let from = current.and_then(replicas).unwrap_or(0);
    let statefulset = desired.name_any();
    let templates: Vec<String> = desired
        .spec
        .as_ref()
        .and_then(|s| s.volume_claim_templates.as_ref())
        .into_iter()
        .flatten()
        .map(ResourceExt::name_any)
        .collect();
    let (ordinal, claim) = (from..wanted).find_map(|ordinal| {
        templates.iter().find_map(|template| {
            let claim = format!("{template}-{statefulset}-{ordinal}");
            lookup(&claim)
                .is_some_and(|c| leaving(&c))
                .then_some((ordinal, claim))
        })
    })?;
    desired.spec.as_mut()?.replicas = Some(ordinal);
    Some(HeldScaleUp {
        statefulset,
        replicas: ordinal,
        wanted,
        claim,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(replicas: i32) -> StatefulSet {
        serde_yaml::from_str(&format!(
            "metadata: {{name: pool}}\n\
             spec:\n  replicas: {replicas}\n  serviceName: pool\n  selector: {{}}\n  \
             template: {{}}\n  volumeClaimTemplates: [{{metadata: {{name: data}}}}]\n"
        ))
        .unwrap()
    }

    fn claim(yaml: &str) -> Arc<PersistentVolumeClaim> {
        Arc::new(serde_yaml::from_str(yaml).unwrap())
    }

    /// Looks claims up by name among `claims`.
    fn among(
        claims: &[Arc<PersistentVolumeClaim>],
    ) -> impl Fn(&str) -> Option<Arc<PersistentVolumeClaim>> + '_ {
        |name| claims.iter().find(|c| c.name_any() == name).cloned()
    }

    const OWNED_BY_POD: &str = "metadata:\n  name: data-pool-2\n  ownerReferences:\n  - \
                                {apiVersion: v1, kind: Pod, name: pool-2, uid: u2}\n";
    const TERMINATING: &str =
        "metadata: {name: data-pool-1, deletionTimestamp: '2026-01-01T00:00:00Z'}\n";
    const IN_USE: &str = "metadata: {name: data-pool-1}\n";

    #[test]
    fn a_scale_up_stops_below_the_first_claim_still_leaving() {
        let mut desired = set(3);
        let claims = [claim(IN_USE), claim(OWNED_BY_POD)];
        let held = hold(&mut desired, Some(&set(1)), among(&claims));
        assert_eq!(
            held,
            Some(HeldScaleUp {
                statefulset: "pool".into(),
                replicas: 2,
                wanted: 3,
                claim: "data-pool-2".into(),
            })
        );
        assert_eq!(desired.spec.unwrap().replicas, Some(2));
        assert!(held.unwrap().message().contains("data-pool-2"));

        let mut desired = set(3);
        let held = hold(&mut desired, Some(&set(1)), among(&[claim(TERMINATING)]));
        assert_eq!(held.map(|h| h.replicas), Some(1), "held where it is");
    }

    #[test]
    fn nothing_is_held_without_a_leaving_claim_or_without_a_scale_up() {
        let mut desired = set(3);
        assert_eq!(
            hold(&mut desired, Some(&set(1)), among(&[claim(IN_USE)])),
            None
        );
        assert_eq!(desired.spec.unwrap().replicas, Some(3));

        let mut desired = set(1);
        let claims = [claim(OWNED_BY_POD), claim(TERMINATING)];
        assert_eq!(
            hold(&mut desired, Some(&set(3)), among(&claims)),
            None,
            "scale-down"
        );
        let mut desired = set(2);
        assert_eq!(
            hold(&mut desired, Some(&set(2)), among(&claims)),
            None,
            "claims of ordinals already running belong to their pods"
        );
    }

    #[test]
    fn a_new_statefulset_waits_for_claims_of_an_earlier_one() {
        let mut desired = set(3);
        let held = hold(&mut desired, None, among(&[claim(TERMINATING)]));
        assert_eq!(held.map(|h| h.replicas), Some(1));
    }
}
