//! MultigresCluster validation on create and update.
//!
//! Three passes:
//! 1. the spec as written: template references exist, quantities and sizes parse, no limit below
//!    its request, supported durability policies, no operator-managed PostgreSQL parameter, valid
//!    external IPs, at least one cell; on update, cells stay (by name) and keep their zone/region;
//! 2. the spec resolved with its templates ([`multigres_api::resolver`]): buffer durations,
//!    pool and multiorch cells that exist, postgres/multipooler UIDs, plus warnings;
//! 3. on update, the old and new specs resolved with the same templates: etcd member counts stay,
//!    volumes never shrink (etcd, pools, backups), pools and pool cells stay, backup encryption
//!    stays. Resolving catches changes CEL cannot see: removing a whole block, or moving a value
//!    between inline spec, overrides and template. Deleting a managed topology server or a
//!    table group needs the cluster's confirmation annotation.
//!
//! Each pass is a module: `written` (pass 1), `resolved` (pass 2, over the `view` of a resolved
//! cluster) and `transition` and `deletion` (pass 3).

mod deletion;
mod network;
pub mod repository;
mod resolved;
mod transition;
mod view;
mod written;

use std::collections::BTreeSet;

use multigres_api::DEFAULT_TEMPLATE;
use multigres_api::resolver;
use multigres_api::v1alpha1::MultigresCluster;

use super::{TemplateKind, Templates};
use crate::violation::Findings;
use resolved::resolved_checks;
use transition::transition;
use view::View;
pub(super) use written::{etcd_block, pools_block};
use written::{missing_templates, written, written_transition};

/// Every template a validation of these clusters may need: explicit references,
/// `templateDefaults`, and each kind's namespace `default`.
pub fn needed_templates<'a>(
    clusters: impl IntoIterator<Item = &'a MultigresCluster>,
) -> BTreeSet<(TemplateKind, String)> {
    let mut names = BTreeSet::new();
    for cluster in clusters {
        let refs = resolver::referenced_templates(cluster);
        for (kind, list) in [
            (TemplateKind::Core, refs.core_templates),
            (TemplateKind::Cell, refs.cell_templates),
            (TemplateKind::Shard, refs.shard_templates),
        ] {
            names.extend(list.into_iter().map(|r| (kind, r.into_inner())));
        }
    }
    names
}

/// The namespace `default` templates of [`needed_templates`] that no cluster names in a field,
/// only falls back to. For these the webhook may take its template cache's word that one is
/// absent: the controller resolves the fallback again from its own watch, so a `default`
/// template created a moment before the cluster still applies; only this admission's checks of
/// the pair are skipped.
pub fn implicit_defaults<'a>(
    clusters: impl IntoIterator<Item = &'a MultigresCluster>,
) -> BTreeSet<(TemplateKind, String)> {
    let mut named = BTreeSet::new();
    for cluster in clusters {
        let refs = resolver::named_templates(cluster);
        for (kind, list) in [
            (TemplateKind::Core, refs.core_templates),
            (TemplateKind::Cell, refs.cell_templates),
            (TemplateKind::Shard, refs.shard_templates),
        ] {
            if list.iter().any(|r| r.as_str() == DEFAULT_TEMPLATE) {
                named.insert(kind);
            }
        }
    }
    [TemplateKind::Core, TemplateKind::Cell, TemplateKind::Shard]
        .into_iter()
        .filter(|kind| !named.contains(kind))
        .map(|kind| (kind, DEFAULT_TEMPLATE.to_owned()))
        .collect()
}

/// Validates a cluster being created (`old` is `None`) or updated.
///
/// On update, problems the stored cluster already had are not held against the edit (ratcheting,
/// as Kubernetes does for CRD schemas): a cluster admitted before a rule existed, or broken by a
/// template change, can still be edited, including to fix it.
pub fn validate(
    new: &MultigresCluster,
    old: Option<&MultigresCluster>,
    templates: &Templates,
) -> Findings {
    let mut findings = state_checks(new, templates);
    let Some(old) = old else {
        return findings;
    };
    let before = state_checks(old, templates);
    findings
        .violations
        .retain(|v| !before.violations.contains(v));
    written_transition(&mut findings, &old.spec, &new.spec);
    if let (Ok(old_resolved), Ok(new_resolved)) = (
        resolver::resolve(old, templates),
        resolver::resolve(new, templates),
    ) {
        let old_view = View::new(&old.spec, templates, &old_resolved);
        let new_view = View::new(&new.spec, templates, &new_resolved);
        transition(&mut findings, &old_view, &new_view);
        deletion::deletions(&mut findings, new, &old_view, &new_view);
    }
    findings
}

/// The checks of one cluster on its own, written and resolved.
fn state_checks(cluster: &MultigresCluster, templates: &Templates) -> Findings {
    let mut findings = Findings::default();
    let namespace = cluster.metadata.namespace.as_deref().unwrap_or_default();
    missing_templates(&mut findings, &cluster.spec, templates, namespace);
    written(&mut findings, &cluster.spec);
    network::network(&mut findings, &cluster.spec);
    // A cluster that does not resolve has a missing template or an unsupported durability
    // policy, both reported above.
    match resolver::resolve(cluster, templates) {
        Ok(resolved) => {
            let view = View::new(&cluster.spec, templates, &resolved);
            resolved_checks(&mut findings, &view);
            deletion::backups(&mut findings, cluster, &view);
        }
        Err(error) => {
            if let Some(field) = error.topology_field() {
                findings.violation(field, error.to_string());
            }
        }
    }
    findings
}

/// Effective-value checks of a template change on one cluster that uses it: the same update
/// rules as for a cluster edit, with the cluster fixed and the template changing.
pub fn template_change(
    cluster: &MultigresCluster,
    old_templates: &Templates,
    new_templates: &Templates,
) -> Findings {
    let mut findings = Findings::default();
    let old = resolver::resolve(cluster, old_templates);
    let new = resolver::resolve(cluster, new_templates);
    if old.is_ok()
        && let Err(error) = &new
        && let Some(field) = error.topology_field()
    {
        findings.violation(field, error.to_string());
    }
    if let (Ok(old_resolved), Ok(new_resolved)) = (old, new) {
        let old_view = View::new(&cluster.spec, old_templates, &old_resolved);
        let new_view = View::new(&cluster.spec, new_templates, &new_resolved);
        transition(&mut findings, &old_view, &new_view);
        deletion::deletions(&mut findings, cluster, &old_view, &new_view);
        // Only problems the change introduces: a cluster that was already invalid with the
        // stored template does not block fixing the template.
        let mut before = Findings::default();
        resolved_checks(&mut before, &old_view);
        let mut after = Findings::default();
        resolved_checks(&mut after, &new_view);
        findings.violations.extend(
            after
                .violations
                .into_iter()
                .filter(|v| !before.violations.contains(v)),
        );
    }
    findings
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeMap;

    use multigres_api::v1alpha1::{CellTemplateSpec, CoreTemplateSpec, ShardTemplateSpec};

    use super::*;

    /// A cluster `demo` in namespace `db` with the given spec (YAML).
    pub(crate) fn cluster(spec: &str) -> MultigresCluster {
        let spec: serde_yaml::Value = serde_yaml::from_str(spec).unwrap();
        serde_json::from_value(serde_json::json!({
            "apiVersion": "multigres.com/v1alpha1",
            "kind": "MultigresCluster",
            "metadata": {"name": "demo", "namespace": "db"},
            "spec": spec,
        }))
        .unwrap()
    }

    /// Templates from YAML: `{core: {name: spec}, cell: {...}, shard: {...}}`.
    pub(crate) fn templates(yaml: &str) -> Templates {
        #[derive(serde::Deserialize, Default)]
        #[serde(default)]
        struct Raw {
            core: BTreeMap<String, CoreTemplateSpec>,
            cell: BTreeMap<String, CellTemplateSpec>,
            shard: BTreeMap<String, ShardTemplateSpec>,
        }
        let raw: Raw = serde_yaml::from_str(yaml).unwrap();
        Templates {
            core: raw.core,
            cell: raw.cell,
            shard: raw.shard,
        }
    }

    pub(super) fn fields(findings: &Findings) -> Vec<&str> {
        findings
            .violations
            .iter()
            .map(|v| v.field.as_str())
            .collect()
    }

    pub(super) const BASE: &str = "
postgresPasswordSecretRef: {name: pw, key: password}
cells: [{name: zone-a, zoneId: z-a}, {name: zone-b, zoneId: z-b}]
";

    pub(super) fn with(extra: &str) -> String {
        format!("{BASE}{extra}")
    }

    pub(super) const SHARD_WITH: &str = "
databases:
- name: postgres
  default: true
  tablegroups:
  - name: default
    default: true
    shards:
    - name: 0-inf
";

    pub(super) fn shard(body: &str) -> String {
        let indented: String = body.lines().map(|l| format!("      {l}\n")).collect();
        with(&format!("{SHARD_WITH}{indented}"))
    }

    pub(super) const SHARD: &str = "spec.databases[0].tablegroups[0].shards[0]";

    #[test]
    fn a_default_template_named_in_a_field_is_not_an_implicit_fallback() {
        let plain = cluster(BASE);
        let default = |kind| (kind, DEFAULT_TEMPLATE.to_owned());
        assert_eq!(
            implicit_defaults([&plain]),
            BTreeSet::from([
                default(TemplateKind::Core),
                default(TemplateKind::Cell),
                default(TemplateKind::Shard)
            ])
        );
        let named = cluster(
            "
postgresPasswordSecretRef: {name: pw, key: password}
cells: [{name: zone-a, zoneId: z-a, cellTemplate: default}]
templateDefaults: {shardTemplate: default}
",
        );
        assert_eq!(
            implicit_defaults([&plain, &named]),
            BTreeSet::from([default(TemplateKind::Core)])
        );
    }

    #[test]
    fn a_minimal_cluster_is_valid() {
        let findings = validate(&cluster(BASE), None, &Templates::default());
        assert!(findings.allowed(), "{findings:?}");
        assert_eq!(
            findings.warnings.len(),
            1,
            "only that the default shard's pool pods share the default backup volume's node \
             (its 3 pods survive the loss of one): {findings:?}"
        );
        assert!(findings.warnings[0].contains("without ReadWriteMany"));
    }

    #[test]
    fn a_shard_without_multiorch_is_refused_where_it_was_written() {
        let inline = shard("spec: {multiorch: {replicas: 0}}");
        let findings = validate(&cluster(&inline), None, &Templates::default());
        assert_eq!(
            fields(&findings),
            [format!("{SHARD}.spec.multiorch.replicas")]
        );
        assert!(
            findings
                .message()
                .contains("without multiorch no primary is ever elected"),
            "{findings:?}"
        );
        let templated = templates("shard: {default: {multiorch: {replicas: 0}}}");
        let findings = validate(&cluster(BASE), None, &templated);
        assert_eq!(
            fields(&findings),
            ["ShardTemplate \"default\" spec.multiorch.replicas"]
        );
        let one = shard("spec: {multiorch: {replicas: 1}}");
        assert!(validate(&cluster(&one), None, &Templates::default()).allowed());
    }

    #[test]
    fn problems_the_stored_cluster_already_had_do_not_block_an_edit() {
        let broken = with("durabilityPolicy: LEGACY\n");
        let old = cluster(&broken);
        let edited = cluster(&format!("{broken}topologyPruning: {{enabled: false}}\n"));
        assert!(validate(&edited, Some(&old), &Templates::default()).allowed());
        // A new problem in the same edit is still refused.
        let worse = cluster(&format!(
            "{broken}externalGateway: {{enabled: true, externalIPs: [x]}}\n"
        ));
        let findings = validate(&worse, Some(&old), &Templates::default());
        assert_eq!(fields(&findings), ["spec.externalGateway.externalIPs[0]"]);
    }

    #[test]
    fn bad_ranges_and_sources_are_refused_by_field() {
        let findings = validate(
            &cluster(&with(
                "externalGateway: {enabled: true, loadBalancerSourceRanges: [10.0.0.0/8, x]}\n\
                 networkPolicy: {gatewaySources: [{ipBlock: {cidr: 10.0.0.0/99}}]}\n",
            )),
            None,
            &Templates::default(),
        );
        assert_eq!(
            fields(&findings),
            [
                "spec.externalGateway.loadBalancerSourceRanges[1]",
                "spec.networkPolicy.gatewaySources[0].ipBlock.cidr",
            ]
        );
    }

    #[test]
    fn template_changes_are_judged_on_the_clusters_using_them() {
        let user = cluster(&shard("shardTemplate: std"));
        let old =
            templates("shard: {std: {pools: {main: {storage: {size: 5Gi}, cells: [zone-a]}}}}");
        let shrunk =
            templates("shard: {std: {pools: {main: {storage: {size: 1Gi}, cells: [zone-a]}}}}");
        let findings = template_change(&user, &old, &shrunk);
        assert_eq!(
            fields(&findings),
            ["ShardTemplate \"std\" spec.pools[main].storage.size"]
        );
        let unknown_cell = templates(
            "shard: {std: {pools: {main: {storage: {size: 5Gi}, cells: [zone-a, zone-z]}}}}",
        );
        let findings = template_change(&user, &old, &unknown_cell);
        assert_eq!(
            fields(&findings),
            ["ShardTemplate \"std\" spec.pools[main].cells"]
        );
        let grown = templates(
            "shard: {std: {pools: {main: {storage: {size: 9Gi}, cells: [zone-a, zone-b]}}}}",
        );
        assert!(template_change(&user, &old, &grown).allowed());
    }
}
