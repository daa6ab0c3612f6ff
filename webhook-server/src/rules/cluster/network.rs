//! The network fields of a cluster: load-balancer source ranges and NetworkPolicy sources
//! Kubernetes would accept ([`multigres_api::network`], which the resource-handler checks
//! again before applying).

use multigres_api::v1alpha1::MultigresClusterSpec;

use crate::violation::Findings;

/// One violation per range or source that cannot be realised.
pub(super) fn network(findings: &mut Findings, spec: &MultigresClusterSpec) {
    for invalid in multigres_api::network::invalid_fields(spec) {
        findings.violation(invalid.field, invalid.problem);
    }
}
