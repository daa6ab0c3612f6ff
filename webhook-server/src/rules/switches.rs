//! The operator's switch annotations on a MultigresCluster (`multigres.com/paused`,
//! `multigres.com/restart-policy`, `multigres.com/hibernate`) take only the values they know: any
//! other value would read as the default (not paused, automatic restarts, awake), and the cluster
//! would go on changing or running while its owner thinks it is held or asleep. Checked on every update, metadata-only ones included (`kubectl
//! annotate` is how they are set), and only when set or changed, so a value stored before the
//! rule never blocks another edit.

use std::collections::BTreeMap;

use multigres_api::labels::{HIBERNATE, PAUSED, RESTART_POLICY};

use crate::violation::Findings;

/// Each switch, the values it takes, and what they mean.
const SWITCHES: [(&str, [&str; 2], &str); 3] = [
    (
        PAUSED,
        ["true", "false"],
        "\"true\" pauses the cluster's workloads, \"false\" (or no annotation) lets the operator \
         change them",
    ),
    (
        RESTART_POLICY,
        ["supervised", "automatic"],
        "\"supervised\" makes pool pod restarts wait for `kubectl multigres restart`, \
         \"automatic\" (or no annotation) restarts them as soon as it is safe",
    ),
    (
        HIBERNATE,
        ["true", "false"],
        "\"true\" stops every pod of the cluster's data plane and keeps its volumes, \"false\" \
         (or no annotation) runs them",
    ),
];

/// Refuses a switch annotation set or changed (against `old`) to a value it does not take.
pub fn check(
    findings: &mut Findings,
    new: &BTreeMap<String, String>,
    old: Option<&BTreeMap<String, String>>,
) {
    for (key, allowed, meaning) in SWITCHES {
        let changed = old.is_none_or(|old| old.get(key) != new.get(key));
        if let Some(value) = new.get(key).filter(|_| changed)
            && !allowed.contains(&value.as_str())
        {
            findings.violation(
                format!("metadata.annotations[{key}]"),
                format!("{value:?} is not allowed: {meaning}"),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotations(key: &str, value: &str) -> BTreeMap<String, String> {
        BTreeMap::from([(key.to_owned(), value.to_owned())])
    }

    fn fields(findings: &Findings) -> Vec<String> {
        findings
            .violations
            .iter()
            .map(|v| v.field.clone())
            .collect()
    }

    #[test]
    fn switches_take_only_their_values_when_set_or_changed() {
        for (key, good) in [
            (PAUSED, "true"),
            (PAUSED, "false"),
            (RESTART_POLICY, "supervised"),
            (HIBERNATE, "true"),
        ] {
            let mut findings = Findings::default();
            check(&mut findings, &annotations(key, good), None);
            assert!(findings.violations.is_empty(), "{key}={good}");
        }
        let mut findings = Findings::default();
        check(&mut findings, &annotations(PAUSED, "yes"), None);
        assert_eq!(
            fields(&findings),
            ["metadata.annotations[multigres.com/paused]"]
        );
        assert!(findings.message().contains("\"yes\" is not allowed"));
        let mut findings = Findings::default();
        let manual = annotations(RESTART_POLICY, "manual");
        check(&mut findings, &manual, Some(&BTreeMap::new()));
        assert_eq!(
            fields(&findings),
            ["metadata.annotations[multigres.com/restart-policy]"]
        );
        // Stored before the rule: another edit is not held against it.
        let mut findings = Findings::default();
        check(&mut findings, &manual, Some(&manual));
        assert!(findings.violations.is_empty());
    }
}
