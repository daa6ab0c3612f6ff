//! `$(` in the spec fields whose text reaches container args or env (topology roots and
//! endpoints, `initdbArgs`, `postgresSuperuser`, `backup.s3.region`): refused, because the
//! kubelet would replace `$(NAME)` with a variable of the container, a Secret's value among
//! them. The resource-handler writes those fields escaped as well
//! ([`multigres_api::expansion::literal`]), so text admitted before this rule, or past the
//! webhook, is still never expanded.

use multigres_api::expansion::{NO_REFERENCE_MESSAGE, references};
use serde::Serialize;

use crate::violation::Findings;

/// Reports every such field of `spec` (a cluster's or a template's), each at its path under
/// `base`.
pub fn expansions(findings: &mut Findings, base: &str, spec: &impl Serialize) {
    let Ok(value) = serde_json::to_value(spec) else {
        return;
    };
    for path in references(&value, base) {
        findings.violation(path, NO_REFERENCE_MESSAGE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use multigres_api::v1alpha1::ShardTemplateSpec;

    #[test]
    fn a_reference_in_a_template_is_refused_at_its_path() {
        let spec: ShardTemplateSpec =
            serde_json::from_value(serde_json::json!({"initdbArgs": "--locale=$(X)"})).unwrap();
        let mut findings = Findings::default();
        expansions(&mut findings, "spec", &spec);
        assert_eq!(
            findings.message(),
            format!("spec.initdbArgs: {NO_REFERENCE_MESSAGE}")
        );
    }
}
