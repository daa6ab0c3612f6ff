//! Readiness of the workloads, read from their controllers' status: counts only mean something
//! once the controller has observed the current generation.

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};

/// Replica counts of a workload as its controller reports them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Desired replicas.
    pub desired: i32,
    /// Ready replicas.
    pub ready: i32,
    /// Whether the controller has seen the current spec (otherwise counts may be stale).
    pub observed: bool,
    /// Pods the controller still has, ready or not (what a scale to zero waits for).
    pub running: i32,
}

impl Counts {
    /// Every desired replica is ready, as of the current spec.
    pub fn all_ready(&self) -> bool {
        self.observed && self.ready >= self.desired
    }
}

fn observed(generation: Option<i64>, observed_generation: Option<i64>) -> bool {
    match (generation, observed_generation) {
        (Some(g), Some(o)) => o >= g,
        _ => false,
    }
}

/// Counts of a StatefulSet (`None`: not created yet).
pub fn statefulset(sts: Option<&StatefulSet>) -> Counts {
    let Some(sts) = sts else {
        return Counts::default();
    };
    let status = sts.status.clone().unwrap_or_default();
    Counts {
        desired: sts.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1),
        ready: status.ready_replicas.unwrap_or(0),
        observed: observed(sts.metadata.generation, status.observed_generation),
        running: status.replicas,
    }
}

/// Counts of a Deployment (`None`: not created yet).
pub fn deployment(deployment: Option<&Deployment>) -> Counts {
    let Some(deployment) = deployment else {
        return Counts::default();
    };
    let status = deployment.status.clone().unwrap_or_default();
    Counts {
        desired: deployment
            .spec
            .as_ref()
            .and_then(|s| s.replicas)
            .unwrap_or(1),
        ready: status.ready_replicas.unwrap_or(0),
        observed: observed(deployment.metadata.generation, status.observed_generation),
        running: status.replicas.unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn counts_need_the_current_generation() {
        let sts: StatefulSet = serde_json::from_value(json!({
            "metadata": {"name": "s", "generation": 2},
            "spec": {"replicas": 3, "selector": {}, "template": {}, "serviceName": "s"},
            "status": {"replicas": 3, "readyReplicas": 3, "observedGeneration": 1},
        }))
        .unwrap();
        let c = statefulset(Some(&sts));
        assert_eq!((c.desired, c.ready, c.observed), (3, 3, false));
        assert!(!c.all_ready(), "stale status does not count");
        let mut current = sts.clone();
        current.status.as_mut().unwrap().observed_generation = Some(2);
        assert!(statefulset(Some(&current)).all_ready());
        assert_eq!(statefulset(None), Counts::default());
        assert!(!deployment(None).all_ready());
    }
}
