//! Defense in depth for changes that delete data, when the webhook that refuses or asks to
//! confirm them was bypassed (`failurePolicy: Ignore`, webhook disabled, namespace excluded) or
//! the change came from somewhere it cannot see (a template picked up later): before the
//! controller applies anything of a new resolution, it compares what it would delete with the
//! children it has.
//!
//! - A pool that a Shard has and the new resolution lacks is never removed (pools are
//!   append-only; the resource-handler would prune its StatefulSets and, under
//!   `whenDeleted: Delete`, its volumes).
//! - A TopoServer or TableGroup the spec no longer has is deleted only when the cluster's
//!   confirmation annotation names it ([`multigres_api::confirm`]).
//!
//! Either way nothing of the new resolution is applied: the cluster stays as it is, with a
//! Degraded condition (and its Warning event) saying what waits and how to go ahead.

use std::collections::BTreeMap;

use kube::ResourceExt;
use multigres_api::DEFAULT_TEMPLATE;
use multigres_api::confirm;
use multigres_api::resolver::Templates;
use multigres_api::v1alpha1::MultigresCluster;

use super::build::Children;
use super::status::Observed;
use crate::children::is_orphan;

/// Where the docs explain every confirmation.
const DOCS: &str = "docs/operations.md, \"Changes that delete data\"";

/// Why a new resolution is not applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Held {
    /// Children the spec no longer has, whose deletion is not confirmed.
    #[error(
        "the spec no longer has {}, which would be deleted with their data; nothing is changed \
         until the deletion is confirmed with the annotation {} on the MultigresCluster, or the \
         change is undone ({DOCS})",
        .objects.join(", "),
        .annotations.join(" and ")
    )]
    Unconfirmed {
        /// `Kind "name"` of each child waiting.
        objects: Vec<String>,
        /// The annotation(s) that would confirm, as written.
        annotations: Vec<String>,
    },
    /// Pools the new resolution drops from a Shard.
    #[error(
        "the resolved spec would remove pools {pools:?} of shard {shard} (TableGroup \
         {table_group:?}; its pools now come from {origin}): pools are append-only, since their \
         StatefulSets and volumes would be deleted; nothing is changed until the pools are back \
         (in the template, overrides or inline spec)"
    )]
    PoolsRemoved {
        /// `database/tablegroup/shard`.
        shard: String,
        /// The TableGroup holding it.
        table_group: String,
        /// The pools that would go.
        pools: Vec<String>,
        /// Where the shard's pools now come from (a ShardTemplate, or the cluster's spec).
        origin: String,
    },
}

impl Held {
    /// Condition reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Held::Unconfirmed { .. } => "DeletionNotConfirmed",
            Held::PoolsRemoved { .. } => "PoolRemovalRefused",
        }
    }
}

/// Whether `desired` may replace the `existing` children of `cluster` (those it controls, as
/// cached).
pub fn check(
    cluster: &MultigresCluster,
    templates: &Templates,
    desired: &Children,
    existing: &Observed,
) -> Result<(), Held> {
    let name = cluster.name_any();
    let annotations = cluster.annotations();
    for tg in &desired.table_groups {
        let Some(old) = existing.table_groups.get(&tg.name_any()) else {
            continue;
        };
        for shard in &tg.spec.shards {
            let Some(old_shard) = old.spec.shards.iter().find(|s| s.name == shard.name) else {
                continue;
            };
            let pools: Vec<String> = old_shard
                .pools
                .keys()
                .filter(|p| !shard.pools.contains_key(*p))
                .map(|p| p.to_string())
                .collect();
            if !pools.is_empty() {
                let (database, table_group) = (
                    tg.spec.database_name.as_str(),
                    tg.spec.table_group_name.as_str(),
                );
                return Err(Held::PoolsRemoved {
                    shard: format!("{database}/{table_group}/{}", shard.name),
                    table_group: tg.name_any(),
                    pools,
                    origin: pool_source(cluster, templates, database, table_group, &shard.name),
                });
            }
        }
    }
    let mut objects = Vec::new();
    let mut annotations_needed = Vec::new();
    for (kind, key, leaving) in [
        (
            "TopoServer",
            confirm::DELETE_TOPOLOGY,
            leaving(&name, &existing.topo_servers, &desired.topo_servers),
        ),
        (
            "TableGroup",
            confirm::DELETE_TABLEGROUPS,
            leaving(&name, &existing.table_groups, &desired.table_groups),
        ),
    ] {
        let waiting: Vec<String> = leaving
            .into_iter()
            .filter(|n| !confirm::confirmed(annotations, key, n))
            .collect();
        if !waiting.is_empty() {
            objects.extend(waiting.iter().map(|n| format!("{kind} {n:?}")));
            annotations_needed.push(confirm::annotation(key, &waiting));
        }
    }
    if objects.is_empty() {
        Ok(())
    } else {
        Err(Held::Unconfirmed {
            objects,
            annotations: annotations_needed,
        })
    }
}

/// The children of `existing` that `desired` lacks and the controller would delete: those
/// labelled with the cluster and not already terminating.
fn leaving<K: kube::Resource>(
    cluster: &str,
    existing: &BTreeMap<String, K>,
    desired: &[K],
) -> Vec<String> {
    let wanted = |name: &str| {
        desired
            .iter()
            .any(|d| d.meta().name.as_deref() == Some(name))
    };
    existing
        .iter()
        .filter(|(_, child)| is_orphan(*child, cluster, wanted))
        .map(|(name, _)| name.clone())
        .collect()
}

/// Where a shard's pools come from, as the resolver picks its ShardTemplate: the one the entry
/// names, else `templateDefaults`, else the namespace `default` when it exists.
fn pool_source(
    cluster: &MultigresCluster,
    templates: &Templates,
    database: &str,
    table_group: &str,
    shard: &str,
) -> String {
    let explicit = cluster
        .spec
        .databases
        .iter()
        .filter(|d| d.name.as_str() == database)
        .flat_map(|d| &d.tablegroups)
        .filter(|t| t.name.as_str() == table_group)
        .flat_map(|t| &t.shards)
        .find(|s| s.name.as_str() == shard)
        .and_then(|s| s.shard_template.as_ref());
    let picked = explicit
        .or_else(|| {
            cluster
                .spec
                .template_defaults
                .as_ref()
                .and_then(|d| d.shard_template.as_ref())
        })
        .map_or(DEFAULT_TEMPLATE, |r| r.as_str());
    if templates.shard.contains_key(picked) {
        format!("ShardTemplate {picked:?}")
    } else {
        "the cluster's spec".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use kube::ResourceExt;
    use multigres_api::resolver::{self, Templates};
    use multigres_api::v1alpha1::{MultigresCluster, ShardTemplateSpec};

    use super::*;
    use crate::cluster::build;
    use crate::fixtures;

    fn children(cluster: &MultigresCluster, templates: &Templates) -> Children {
        let resolved = resolver::resolve(cluster, templates).unwrap();
        build::children(&build::owner(cluster).unwrap(), &resolved)
    }

    fn observed(children: Children) -> Observed {
        Observed {
            topo_servers: children
                .topo_servers
                .into_iter()
                .map(|c| (c.name_any(), c))
                .collect(),
            cells: children
                .cells
                .into_iter()
                .map(|c| (c.name_any(), c))
                .collect(),
            table_groups: children
                .table_groups
                .into_iter()
                .map(|c| (c.name_any(), c))
                .collect(),
        }
    }

    fn confirm(cluster: &mut MultigresCluster, key: &str, value: &str) {
        cluster
            .annotations_mut()
            .insert(key.to_owned(), value.to_owned());
    }

    #[test]
    fn a_default_template_that_drops_pools_is_not_adopted() {
        let cluster = fixtures::sample("minimal").cluster;
        let before = observed(children(&cluster, &Templates::default()));
        let mut later = Templates::default();
        let main: ShardTemplateSpec = fixtures::from_yaml("pools: {main: {cells: [zone-a]}}");
        later.shard.insert(DEFAULT_TEMPLATE.to_owned(), main);
        let held = check(&cluster, &later, &children(&cluster, &later), &before).unwrap_err();
        assert_eq!(held.reason(), "PoolRemovalRefused");
        assert_eq!(
            held.to_string(),
            "the resolved spec would remove pools [\"default\"] of shard postgres/default/0-inf \
             (TableGroup \"minimal-postgres-default\"; its pools now come from ShardTemplate \
             \"default\"): pools are append-only, since their StatefulSets and volumes would be \
             deleted; nothing is changed until the pools are back (in the template, overrides or \
             inline spec)"
        );
        // A template that keeps the pool and adds one is adopted.
        let both: ShardTemplateSpec =
            fixtures::from_yaml("pools: {default: {cells: [zone-a]}, main: {cells: [zone-a]}}");
        later.shard.insert(DEFAULT_TEMPLATE.to_owned(), both);
        assert_eq!(
            check(&cluster, &later, &children(&cluster, &later), &before),
            Ok(())
        );
    }

    #[test]
    fn a_managed_topology_server_goes_only_when_the_annotation_names_it() {
        let templates = Templates::default();
        let mut cluster = fixtures::sample("minimal").cluster;
        let before = observed(children(&cluster, &templates));
        cluster.spec.global_topo_server = Some(fixtures::from_yaml(
            "external: {endpoints: ['http://etcd:2379']}",
        ));
        let desired = children(&cluster, &templates);
        let held = check(&cluster, &templates, &desired, &before).unwrap_err();
        assert_eq!(held.reason(), "DeletionNotConfirmed");
        assert_eq!(
            held.to_string(),
            "the spec no longer has TopoServer \"minimal-global-topo\", which would be deleted \
             with their data; nothing is changed until the deletion is confirmed with the \
             annotation multigres.com/confirm-delete-topology: \"minimal-global-topo\" on the \
             MultigresCluster, or the change is undone (docs/operations.md, \"Changes that \
             delete data\")"
        );
        confirm(&mut cluster, confirm::DELETE_TOPOLOGY, "other-global-topo");
        assert!(check(&cluster, &templates, &desired, &before).is_err());
        confirm(
            &mut cluster,
            confirm::DELETE_TOPOLOGY,
            "minimal-global-topo",
        );
        assert_eq!(check(&cluster, &templates, &desired, &before), Ok(()));
    }

    #[test]
    fn a_table_group_goes_only_when_the_annotation_names_it() {
        let templates = Templates::default();
        let mut cluster = fixtures::sample("minimal").cluster;
        let groups = |extra: &str| {
            fixtures::from_yaml(&format!(
                "[{{name: postgres, default: true, tablegroups: [{{name: default, default: true}}{extra}]}}]"
            ))
        };
        cluster.spec.databases = groups(", {name: orders}");
        let before = observed(children(&cluster, &templates));
        cluster.spec.databases = groups("");
        let desired = children(&cluster, &templates);
        let held = check(&cluster, &templates, &desired, &before).unwrap_err();
        assert!(
            held.to_string().starts_with(
                "the spec no longer has TableGroup \"minimal-postgres-orders\", which would be \
                 deleted with their data; nothing is changed until the deletion is confirmed \
                 with the annotation multigres.com/confirm-delete-tablegroups: \
                 \"minimal-postgres-orders\""
            ),
            "{held}"
        );
        confirm(
            &mut cluster,
            confirm::DELETE_TABLEGROUPS,
            "minimal-postgres-orders",
        );
        assert_eq!(check(&cluster, &templates, &desired, &before), Ok(()));

        // A child already on its way out, or another cluster's, is not this change's doing.
        let mut leaving = before.table_groups["minimal-postgres-orders"].clone();
        leaving.labels_mut().insert(
            multigres_api::labels::CLUSTER.to_owned(),
            "other".to_owned(),
        );
        let foreign = Observed {
            table_groups: BTreeMap::from([(leaving.name_any(), leaving)]),
            ..observed(desired.clone())
        };
        cluster.annotations_mut().clear();
        assert_eq!(check(&cluster, &templates, &desired, &foreign), Ok(()));
    }
}
