//! Changes that delete data (docs/operations.md, "Changes that delete data"): a managed
//! topology server that stops being managed and a table group that leaves the spec are deleted
//! by the operator with everything under them. Each needs the cluster's confirmation annotation
//! ([`multigres_api::confirm`]) naming what goes; without it the change is refused, with it the
//! change is admitted with a warning listing what will be deleted.

use std::collections::BTreeMap;

use multigres_api::confirm;
use multigres_api::names;
use multigres_api::resolver::GlobalTopo;
use multigres_api::v1alpha1::{
    BackupType, MultigresCluster, PvcDeletionPolicy, PvcRetentionPolicyType as Retention,
    TableGroupSpec, TopoServerSpec,
};

use super::view::View;
use crate::violation::Findings;

/// Where the docs explain every confirmation.
const DOCS: &str = "docs/operations.md, \"Changes that delete data\"";

/// One deletion a change would make.
struct Deletion {
    /// Field path of the change.
    field: String,
    /// The change, in words.
    change: String,
    /// Name of the child object deleted (what the annotation lists).
    object: String,
    /// What goes with it.
    what: String,
}

/// Refuses (or, when confirmed, warns about) the deletions between the `old` and `new`
/// resolutions of `cluster`.
pub(super) fn deletions(
    findings: &mut Findings,
    cluster: &MultigresCluster,
    old: &View<'_>,
    new: &View<'_>,
) {
    let name = cluster.metadata.name.as_deref().unwrap_or_default();
    let annotations = cluster.metadata.annotations.clone().unwrap_or_default();
    let backups_go = confirm::confirmed(&annotations, confirm::DELETE_BACKUPS, name);
    for (key, list) in [
        (confirm::DELETE_TOPOLOGY, topology(name, old, new)),
        (
            confirm::DELETE_TABLEGROUPS,
            table_groups(name, old, new, backups_go),
        ),
    ] {
        let unconfirmed: Vec<String> = list
            .iter()
            .filter(|d| !confirm::confirmed(&annotations, key, &d.object))
            .map(|d| d.object.clone())
            .collect();
        for deletion in &list {
            if unconfirmed.contains(&deletion.object) {
                findings.violation(
                    &deletion.field,
                    format!(
                        "{} deletes {}; to go ahead, confirm on the MultigresCluster with the \
                         annotation {} ({DOCS})",
                        deletion.change,
                        deletion.what,
                        confirm::annotation(key, &unconfirmed)
                    ),
                );
            } else {
                findings.warning(
                    &deletion.field,
                    format!(
                        "{} deletes {} (confirmed by annotation {key})",
                        deletion.change, deletion.what
                    ),
                );
            }
        }
    }
}

fn deletes_volumes(policy: Option<&PvcDeletionPolicy>) -> bool {
    policy.and_then(|p| p.when_deleted) == Some(Retention::Delete)
}

/// What deleting a TopoServer takes with it.
fn topo_server(object: &str, spec: &TopoServerSpec) -> String {
    let volumes = if deletes_volumes(spec.pvc_deletion_policy.as_ref()) {
        "and its etcd volumes, as its pvcDeletionPolicy.whenDeleted is Delete"
    } else {
        "(its etcd volumes are kept, as whenDeleted is Retain, but the new member set cannot reuse them)"
    };
    format!(
        "TopoServer {object:?} with the topology it holds (every pooler record and the \
         topology history) {volumes}"
    )
}

fn topology(cluster: &str, old: &View<'_>, new: &View<'_>) -> Vec<Deletion> {
    let mut list = Vec::new();
    if let (GlobalTopo::Managed(spec), GlobalTopo::External(_)) =
        (&old.resolved.global_topo, &new.resolved.global_topo)
    {
        let object = names::global_topo_server(cluster);
        list.push(Deletion {
            field: "spec.globalTopoServer".to_owned(),
            change: "switching the global topology from the managed etcd to an external one"
                .to_owned(),
            what: topo_server(&object, spec),
            object,
        });
    }
    for (i, cell) in new.resolved.cells.iter().enumerate() {
        let cell_name = cell.spec.name.as_str();
        let old_local = old
            .resolved
            .cells
            .iter()
            .find(|c| c.spec.name.as_str() == cell_name)
            .and_then(|c| c.local_topo.as_ref());
        if let (Some(spec), None) = (old_local, &cell.local_topo) {
            let object = names::local_topo_server(cluster, cell_name);
            list.push(Deletion {
                field: format!("spec.cells[{i}]"),
                change: format!("removing the managed local topology server of cell {cell_name:?}"),
                what: topo_server(&object, spec),
                object,
            });
        }
    }
    list
}

/// What deleting a TableGroup takes with it.
fn table_group(object: &str, spec: &TableGroupSpec, backups_go: bool) -> String {
    let delete = spec
        .shards
        .iter()
        .any(|s| deletes_volumes(s.pvc_deletion_policy.as_ref()));
    let filesystem = spec.shards.iter().any(|s| {
        s.backup
            .as_ref()
            .is_some_and(|b| b.type_ == BackupType::Filesystem)
    });
    let volumes = match (delete, filesystem && backups_go) {
        (false, _) => "; the data volumes are kept, as whenDeleted is Retain",
        (true, false) => {
            ", and their data volumes, as whenDeleted is Delete (a filesystem backup volume is \
             kept)"
        }
        (true, true) => {
            ", and their data volumes and filesystem backup volumes, as whenDeleted is Delete \
             and multigres.com/confirm-delete-backups is set"
        }
    };
    format!(
        "TableGroup {object:?}, its Shards and their pool StatefulSets (every pod of them){volumes}"
    )
}

fn table_groups(cluster: &str, old: &View<'_>, new: &View<'_>, backups_go: bool) -> Vec<Deletion> {
    let key = |tg: &TableGroupSpec| (tg.database_name.clone(), tg.table_group_name.clone());
    let kept: BTreeMap<_, _> = new
        .resolved
        .table_groups
        .iter()
        .map(|tg| (key(tg), tg))
        .collect();
    old.resolved
        .table_groups
        .iter()
        .filter(|tg| !kept.contains_key(&key(tg)))
        .map(|tg| {
            let (database, name) = (tg.database_name.as_str(), tg.table_group_name.as_str());
            let object = names::table_group(cluster, database, name);
            let field = new
                .spec
                .databases
                .iter()
                .position(|d| d.name.as_str() == database)
                .map_or_else(
                    || "spec.databases".to_owned(),
                    |d| format!("spec.databases[{d}].tablegroups"),
                );
            Deletion {
                field,
                change: format!(
                    "removing or renaming table group {name:?} of database {database:?}"
                ),
                what: table_group(&object, tg, backups_go),
                object,
            }
        })
        .collect()
}

/// Warns that deleting `cluster` deletes its filesystem backup volumes too, when its
/// annotation says so and some shard keeps backups on a volume deleted with it.
pub(super) fn backups(findings: &mut Findings, cluster: &MultigresCluster, view: &View<'_>) {
    let name = cluster.metadata.name.as_deref().unwrap_or_default();
    let annotations = cluster.metadata.annotations.clone().unwrap_or_default();
    if !confirm::confirmed(&annotations, confirm::DELETE_BACKUPS, name) {
        return;
    }
    let shards: Vec<&str> = view
        .shards
        .iter()
        .filter(|s| {
            deletes_volumes(s.resolved.pvc_deletion_policy.as_ref())
                && s.resolved
                    .backup
                    .as_ref()
                    .is_some_and(|b| b.type_ == BackupType::Filesystem)
        })
        .map(|s| s.key.as_str())
        .collect();
    if !shards.is_empty() {
        findings.warning(
            format!("metadata.annotations[{}]", confirm::DELETE_BACKUPS),
            format!(
                "deleting this cluster deletes the filesystem backup volumes of shards {} with \
                 it (whenDeleted is Delete); remove the annotation to keep them",
                shards.join(", ")
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use crate::rules::Templates;
    use crate::rules::cluster::tests::{BASE, cluster, fields, templates, with};
    use crate::rules::cluster::{template_change, validate};
    use multigres_api::confirm;
    use multigres_api::v1alpha1::MultigresCluster;

    const EXTERNAL: &str = "globalTopoServer: {external: {endpoints: ['http://etcd:2379']}}";

    fn annotated(mut cluster: MultigresCluster, key: &str, value: &str) -> MultigresCluster {
        cluster.metadata.annotations = Some(BTreeMap::from([(key.to_owned(), value.to_owned())]));
        cluster
    }

    #[test]
    fn managed_global_topology_becomes_external_only_when_confirmed() {
        let old = cluster(&with(
            "globalTopoServer: {pvcDeletionPolicy: {whenDeleted: Delete}}",
        ));
        let new = cluster(&with(EXTERNAL));
        let findings = validate(&new, Some(&old), &Templates::default());
        assert_eq!(fields(&findings), ["spec.globalTopoServer"]);
        assert_eq!(
            findings.violations[0].message,
            "switching the global topology from the managed etcd to an external one deletes \
             TopoServer \"demo-global-topo\" with the topology it holds (every pooler record and \
             the topology history) and its etcd volumes, as its pvcDeletionPolicy.whenDeleted is \
             Delete; to go ahead, confirm on the MultigresCluster with the annotation \
             multigres.com/confirm-delete-topology: \"demo-global-topo\" (docs/operations.md, \
             \"Changes that delete data\")"
        );
        let wrong = annotated(new.clone(), confirm::DELETE_TOPOLOGY, "other-global-topo");
        assert!(!validate(&wrong, Some(&old), &Templates::default()).allowed());

        let confirmed = annotated(new, confirm::DELETE_TOPOLOGY, "demo-global-topo");
        let findings = validate(&confirmed, Some(&old), &Templates::default());
        assert!(findings.allowed(), "{findings:?}");
        assert!(
            findings.warnings.iter().any(|w| w.starts_with(
                "spec.globalTopoServer: switching the global topology from the managed etcd to \
                 an external one deletes TopoServer \"demo-global-topo\""
            ) && w
                .ends_with("(confirmed by annotation multigres.com/confirm-delete-topology)")),
            "{:?}",
            findings.warnings
        );
    }

    #[test]
    fn a_cells_local_topology_is_removed_only_when_confirmed() {
        let old = cluster(
            "
postgresPasswordSecretRef: {name: pw, key: password}
cells: [{name: zone-a, zoneId: z-a, spec: {localTopoServer: {etcd: {}}}}]
",
        );
        let new = cluster(&BASE.replace(", {name: zone-b, zoneId: z-b}", ""));
        let findings = validate(&new, Some(&old), &Templates::default());
        assert_eq!(fields(&findings), ["spec.cells[0]"]);
        let message = &findings.violations[0].message;
        assert!(
            message.starts_with(
                "removing the managed local topology server of cell \"zone-a\" deletes \
                 TopoServer \"demo-zone-a-local-topo\""
            ) && message.contains("its etcd volumes are kept")
                && message
                    .contains("multigres.com/confirm-delete-topology: \"demo-zone-a-local-topo\""),
            "{message}"
        );
        let confirmed = annotated(new, confirm::DELETE_TOPOLOGY, "demo-zone-a-local-topo");
        assert!(validate(&confirmed, Some(&old), &Templates::default()).allowed());
    }

    const TWO_GROUPS: &str = "
databases:
- name: postgres
  default: true
  tablegroups:
  - {name: default, default: true}
  - name: orders
    pvcDeletionPolicy: {whenDeleted: Delete}
    backup: {type: filesystem}
";

    #[test]
    fn a_table_group_is_removed_or_renamed_only_when_confirmed() {
        let old = cluster(&with(TWO_GROUPS));
        let renamed = cluster(&with(&TWO_GROUPS.replace("name: orders", "name: order")));
        let findings = validate(&renamed, Some(&old), &Templates::default());
        assert_eq!(fields(&findings), ["spec.databases[0].tablegroups"]);
        assert_eq!(
            findings.violations[0].message,
            "removing or renaming table group \"orders\" of database \"postgres\" deletes \
             TableGroup \"demo-postgres-orders\", its Shards and their pool StatefulSets (every \
             pod of them), and their data volumes, as whenDeleted is Delete (a filesystem backup \
             volume is kept); to go ahead, confirm on the MultigresCluster with the annotation \
             multigres.com/confirm-delete-tablegroups: \"demo-postgres-orders\" \
             (docs/operations.md, \"Changes that delete data\")"
        );
        let confirmed = annotated(renamed, confirm::DELETE_TABLEGROUPS, "demo-postgres-orders");
        let findings = validate(&confirmed, Some(&old), &Templates::default());
        assert!(findings.allowed(), "{findings:?}");
        assert_eq!(
            findings
                .warnings
                .iter()
                .filter(|w| w.contains("confirmed by annotation"))
                .count(),
            1,
            "{:?}",
            findings.warnings
        );

        // With the backups confirmed too, the warning says the backup volume goes as well.
        let mut both = confirmed.clone();
        both.metadata
            .annotations
            .get_or_insert_default()
            .insert(confirm::DELETE_BACKUPS.to_owned(), "demo".to_owned());
        let findings = validate(&both, Some(&old), &Templates::default());
        assert!(
            findings
                .warnings
                .iter()
                .any(|w| w.contains("their data volumes and filesystem backup volumes")),
            "{:?}",
            findings.warnings
        );
    }

    #[test]
    fn confirming_backups_warns_which_volumes_a_deletion_removes() {
        let spec = with(TWO_GROUPS);
        assert!(cluster(&spec).metadata.annotations.is_none());
        let plain = validate(&cluster(&spec), None, &Templates::default());
        assert!(
            !plain.warnings.iter().any(|w| w.starts_with(&format!(
                "metadata.annotations[{}]",
                confirm::DELETE_BACKUPS
            ))),
            "{:?}",
            plain.warnings
        );
        let confirmed = annotated(cluster(&spec), confirm::DELETE_BACKUPS, "demo");
        let findings = validate(&confirmed, None, &Templates::default());
        assert!(findings.allowed());
        assert!(
            findings.warnings.contains(
                &"metadata.annotations[multigres.com/confirm-delete-backups]: deleting this \
                  cluster deletes the filesystem backup volumes of shards postgres/orders/0-inf \
                  with it (whenDeleted is Delete); remove the annotation to keep them"
                    .to_owned()
            ),
            "{:?}",
            findings.warnings
        );
        // Naming another cluster confirms nothing.
        let other = annotated(cluster(&spec), confirm::DELETE_BACKUPS, "other");
        assert_eq!(
            validate(&other, None, &Templates::default()).warnings,
            plain.warnings
        );
    }

    #[test]
    fn a_cell_template_dropping_its_local_topology_needs_the_same_confirmation() {
        let user = cluster(&with("templateDefaults: {cellTemplate: local}"));
        let old = templates("cell: {local: {localTopoServer: {etcd: {}}}}");
        let new = templates("cell: {local: {}}");
        assert_eq!(
            fields(&template_change(&user, &old, &new)),
            ["spec.cells[0]", "spec.cells[1]"]
        );
        let confirmed = annotated(
            user,
            confirm::DELETE_TOPOLOGY,
            "demo-zone-a-local-topo,demo-zone-b-local-topo",
        );
        let findings = template_change(&confirmed, &old, &new);
        assert!(findings.allowed());
        assert_eq!(findings.warnings.len(), 2);
    }
}
