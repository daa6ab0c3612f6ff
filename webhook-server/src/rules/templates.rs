//! CoreTemplate, CellTemplate and ShardTemplate: valid on their own; not deleted while a cluster
//! uses them; not created or changed in a way that would break a cluster using them, or delete
//! its data (shrinking a volume, changing an etcd member count, dropping a pool or pool cell,
//! replacing a managed etcd by an external one without the cluster's confirmation).

use multigres_api::DEFAULT_TEMPLATE;
use multigres_api::v1alpha1::{
    CellTemplateSpec, CoreTemplateSpec, MultigresCluster, MultigresClusterSpec, ShardTemplateSpec,
    TemplateRef,
};

use super::cluster::{etcd_block, pools_block};
use super::{BufferSettings, TemplateKind, Templates};
use crate::violation::Findings;

/// A template as admitted: its kind and typed spec.
#[derive(Debug, Clone)]
pub enum TemplateSpec {
    /// A CoreTemplate.
    Core(Box<CoreTemplateSpec>),
    /// A CellTemplate.
    Cell(Box<CellTemplateSpec>),
    /// A ShardTemplate.
    Shard(Box<ShardTemplateSpec>),
}

impl TemplateSpec {
    /// The kind of the template.
    pub fn kind(&self) -> TemplateKind {
        match self {
            Self::Core(_) => TemplateKind::Core,
            Self::Cell(_) => TemplateKind::Cell,
            Self::Shard(_) => TemplateKind::Shard,
        }
    }

    /// Checks the template on its own, without any cluster.
    pub fn validate(&self) -> Findings {
        let mut findings = Findings::default();
        match self {
            Self::Core(spec) => {
                super::expansion::expansions(&mut findings, "spec", spec);
                super::pod_metadata::pod_metadata(&mut findings, "spec", spec);
                core(&mut findings, spec);
            }
            Self::Cell(spec) => {
                super::expansion::expansions(&mut findings, "spec", spec);
                super::pod_metadata::pod_metadata(&mut findings, "spec", spec);
                cell(&mut findings, spec);
            }
            Self::Shard(spec) => {
                super::expansion::expansions(&mut findings, "spec", spec);
                super::pod_metadata::pod_metadata(&mut findings, "spec", spec);
                shard(&mut findings, spec);
            }
        }
        findings
    }

    /// `templates` with this template stored under `name`.
    pub fn install(&self, templates: &mut Templates, name: &str) {
        let name = name.to_owned();
        match self {
            Self::Core(spec) => {
                templates.core.insert(name, (**spec).clone());
            }
            Self::Cell(spec) => {
                templates.cell.insert(name, (**spec).clone());
            }
            Self::Shard(spec) => {
                templates.shard.insert(name, (**spec).clone());
            }
        }
    }
}

/// `templates` without the template `name` of `kind`: what the clusters resolved with before
/// it was created.
fn uninstall(templates: &mut Templates, kind: TemplateKind, name: &str) {
    match kind {
        TemplateKind::Core => {
            templates.core.remove(name);
        }
        TemplateKind::Cell => {
            templates.cell.remove(name);
        }
        TemplateKind::Shard => {
            templates.shard.remove(name);
        }
    }
}

fn core(findings: &mut Findings, spec: &CoreTemplateSpec) {
    if let Some(topo) = &spec.global_topo_server {
        if let Some(etcd) = &topo.etcd {
            etcd_block(findings, "spec.globalTopoServer.etcd", etcd);
        }
        super::pvc_policy_warning(
            findings,
            "spec.globalTopoServer.pvcDeletionPolicy",
            topo.pvc_deletion_policy.as_ref(),
        );
    }
    for (field, stateless) in [
        ("multiadmin", &spec.multiadmin),
        ("multiadminWeb", &spec.multiadmin_web),
    ] {
        super::resources(
            findings,
            &format!("spec.{field}.resources"),
            stateless.as_ref().and_then(|s| s.resources.as_ref()),
        );
    }
}

fn cell(findings: &mut Findings, spec: &CellTemplateSpec) {
    if let Some(gateway) = &spec.multigateway {
        super::resources(
            findings,
            "spec.multigateway.resources",
            gateway.stateless.resources.as_ref(),
        );
        super::buffer(
            findings,
            &BufferSettings::written("spec.multigateway.buffer", gateway.buffer.as_ref()),
            false,
        );
    }
    if let Some(etcd) = spec
        .local_topo_server
        .as_ref()
        .and_then(|l| l.etcd.as_ref())
    {
        etcd_block(findings, "spec.localTopoServer.etcd", etcd);
    }
}

fn shard(findings: &mut Findings, spec: &ShardTemplateSpec) {
    if let Some(multiorch) = &spec.multiorch {
        super::go_duration(
            findings,
            || "spec.multiorch.leaderFailoverGracePeriodBase".to_owned(),
            multiorch.leader_failover_grace_period_base.as_ref(),
        );
        super::go_duration(
            findings,
            || "spec.multiorch.leaderFailoverGracePeriodMaxJitter".to_owned(),
            multiorch.leader_failover_grace_period_max_jitter.as_ref(),
        );
    }
    super::resources(
        findings,
        "spec.multiorch.resources",
        spec.multiorch
            .as_ref()
            .and_then(|m| m.stateless.resources.as_ref()),
    );
    pools_block(findings, "spec", &spec.pools);
    for (name, pool) in &spec.pools {
        let uid = |container: &str, config: &Option<multigres_api::v1alpha1::ContainerConfig>| {
            config
                .as_ref()
                .and_then(|c| c.run_as_user)
                .map(|uid| (format!("spec.pools[{name}].{container}.runAsUser"), uid))
        };
        super::run_as_user(
            findings,
            uid("postgres", &pool.postgres),
            uid("multipooler", &pool.multipooler),
        );
    }
    super::postgres::postgres_config(findings, "spec.postgresConfig", &spec.postgres_config);
    super::pvc_policy_warning(
        findings,
        "spec.pvcDeletionPolicy",
        spec.pvc_deletion_policy.as_ref(),
    );
}

/// Every field through which `cluster` uses template `name` of `kind`; empty when it does not.
///
/// A component uses the template it names, else the one in `templateDefaults`, else the
/// namespace template named `default` (as the resolver picks), so `default` is in use by every
/// component that names none while `templateDefaults` names none either.
pub fn uses(kind: TemplateKind, name: &str, cluster: &MultigresClusterSpec) -> Vec<String> {
    let mut fields = Vec::new();
    let named = |r: Option<&TemplateRef>| r.is_some_and(|r| r.as_str() == name);
    let defaults = cluster.template_defaults.as_ref();
    let cluster_default = defaults.and_then(|d| match kind {
        TemplateKind::Core => d.core_template.as_ref(),
        TemplateKind::Cell => d.cell_template.as_ref(),
        TemplateKind::Shard => d.shard_template.as_ref(),
    });
    let field = match kind {
        TemplateKind::Core => "coreTemplate",
        TemplateKind::Cell => "cellTemplate",
        TemplateKind::Shard => "shardTemplate",
    };
    if named(cluster_default) {
        fields.push(format!("spec.templateDefaults.{field}"));
    }
    let implicit = cluster_default.is_none() && name == DEFAULT_TEMPLATE;
    let mut component = |explicit: Option<&TemplateRef>, path: String, explicit_path: String| {
        if named(explicit) {
            fields.push(explicit_path);
        } else if explicit.is_none() && implicit {
            fields.push(format!(
                "{path} (names no {field}, so it uses the namespace default)"
            ));
        }
    };
    match kind {
        TemplateKind::Core => {
            let topo = cluster.global_topo_server.as_ref();
            if topo.is_none_or(|t| t.external.is_none()) {
                component(
                    topo.and_then(|t| t.template_ref.as_ref()),
                    "spec.globalTopoServer".into(),
                    "spec.globalTopoServer.templateRef".into(),
                );
            }
            component(
                cluster
                    .multiadmin
                    .as_ref()
                    .and_then(|m| m.template_ref.as_ref()),
                "spec.multiadmin".into(),
                "spec.multiadmin.templateRef".into(),
            );
            component(
                cluster
                    .multiadmin_web
                    .as_ref()
                    .and_then(|m| m.template_ref.as_ref()),
                "spec.multiadminWeb".into(),
                "spec.multiadminWeb.templateRef".into(),
            );
        }
        TemplateKind::Cell => {
            for (i, c) in cluster.cells.iter().enumerate() {
                component(
                    c.cell_template.as_ref(),
                    format!("spec.cells[{i}]"),
                    format!("spec.cells[{i}].cellTemplate"),
                );
            }
        }
        TemplateKind::Shard => {
            if cluster.databases.is_empty() {
                component(
                    None,
                    "spec.databases (unset: the default shard)".into(),
                    String::new(),
                );
            }
            for (d, db) in cluster.databases.iter().enumerate() {
                if db.tablegroups.is_empty() {
                    component(
                        None,
                        format!("spec.databases[{d}] (no tablegroups: the default shard)"),
                        String::new(),
                    );
                }
                for (t, tg) in db.tablegroups.iter().enumerate() {
                    let tg_path = format!("spec.databases[{d}].tablegroups[{t}]");
                    if tg.shards.is_empty() {
                        component(
                            None,
                            format!("{tg_path} (no shards: the default shard)"),
                            String::new(),
                        );
                    }
                    for (s, shard) in tg.shards.iter().enumerate() {
                        component(
                            shard.shard_template.as_ref(),
                            format!("{tg_path}.shards[{s}]"),
                            format!("{tg_path}.shards[{s}].shardTemplate"),
                        );
                    }
                }
            }
        }
    }
    fields
}

/// Clusters still using the template, each with the fields through which it does. Clusters
/// already being deleted do not count.
pub fn users<'a>(
    kind: TemplateKind,
    name: &str,
    clusters: &'a [MultigresCluster],
) -> Vec<(&'a MultigresCluster, Vec<String>)> {
    clusters
        .iter()
        .filter(|c| c.metadata.deletion_timestamp.is_none())
        .map(|c| (c, uses(kind, name, &c.spec)))
        .filter(|(_, fields)| !fields.is_empty())
        .collect()
}

/// Refuses deleting a template some cluster uses, naming each cluster and field.
pub fn deletion(kind: TemplateKind, name: &str, clusters: &[MultigresCluster]) -> Findings {
    let mut findings = Findings::default();
    for (cluster, fields) in users(kind, name, clusters) {
        findings.violation(
            format!(
                "MultigresCluster {:?}",
                cluster.metadata.name.as_deref().unwrap_or_default()
            ),
            format!(
                "uses {kind} {name:?} through {}; change those references (or delete the \
                 cluster) before deleting the template",
                fields.join(", ")
            ),
        );
    }
    findings
}

/// What creating (`old` is `None`) or updating template `name` would break, or delete, in the
/// clusters using it. `templates` holds the templates those clusters use.
///
/// A template created under a name clusters already fall back to (the namespace `default`)
/// changes those clusters at their next reconcile just as an update would, so it gets the same
/// checks: a pool it lacks would be removed, with its StatefulSets and (under
/// `whenDeleted: Delete`) its volumes.
pub fn change(
    name: &str,
    old: Option<&TemplateSpec>,
    new: &TemplateSpec,
    clusters: &[MultigresCluster],
    templates: &Templates,
) -> Findings {
    let mut findings = Findings::default();
    let mut old_templates = templates.clone();
    match old {
        Some(old) => old.install(&mut old_templates, name),
        None => uninstall(&mut old_templates, new.kind(), name),
    }
    let mut new_templates = templates.clone();
    new.install(&mut new_templates, name);
    let verb = if old.is_some() { "uses" } else { "would use" };
    for (cluster, fields) in users(new.kind(), name, clusters) {
        let cluster_name = cluster.metadata.name.as_deref().unwrap_or_default();
        let context = format!(
            "in MultigresCluster {cluster_name:?}, which {verb} this {} through {}",
            new.kind(),
            fields.join(", ")
        );
        let effects = super::cluster::template_change(cluster, &old_templates, &new_templates);
        for violation in effects.violations {
            findings.violation(
                violation.field,
                format!("{} ({context})", violation.message),
            );
        }
        for warning in effects.warnings {
            findings.warnings.push(format!("{warning} ({context})"));
        }
    }
    findings
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::cluster::tests::{cluster, templates};

    fn fields(findings: &Findings) -> Vec<&str> {
        findings
            .violations
            .iter()
            .map(|v| v.field.as_str())
            .collect()
    }

    #[test]
    fn templates_are_checked_on_their_own() {
        let shard: ShardTemplateSpec = serde_yaml::from_str(
            "
multiorch: {resources: {requests: {memory: 1Gi}, limits: {memory: 1Mi}}}
postgresConfig: {listen_addresses: '*'}
pvcDeletionPolicy: {whenDeleted: Delete}
pools:
  main:
    storage: {size: lots}
    multipooler: {runAsUser: 70}
",
        )
        .unwrap();
        let findings = TemplateSpec::Shard(Box::new(shard)).validate();
        assert_eq!(
            fields(&findings),
            [
                "spec.multiorch.resources.limits.memory",
                "spec.pools[main].storage.size",
                "spec.pools[main].multipooler.runAsUser",
                "spec.postgresConfig[listen_addresses]",
            ]
        );
        assert_eq!(findings.warnings.len(), 1);

        let cell: CellTemplateSpec =
            serde_yaml::from_str("multigateway: {buffer: {window: 30s, maxFailoverDuration: 20s}}")
                .unwrap();
        let findings = TemplateSpec::Cell(Box::new(cell)).validate();
        assert_eq!(fields(&findings), ["spec.multigateway.buffer.window"]);

        let lone_window: CellTemplateSpec =
            serde_yaml::from_str("multigateway: {buffer: {window: 30s}}").unwrap();
        assert!(
            TemplateSpec::Cell(Box::new(lone_window))
                .validate()
                .allowed(),
            "the cluster may set maxFailoverDuration"
        );

        let core: CoreTemplateSpec = serde_yaml::from_str(
            "globalTopoServer: {etcd: {storage: {size: 1Gi}}}\nmultiadminWeb: {resources: {limits: {cpu: x}}}",
        )
        .unwrap();
        assert_eq!(
            fields(&TemplateSpec::Core(Box::new(core)).validate()),
            ["spec.multiadminWeb.resources.limits.cpu"]
        );
    }

    const BASE: &str = "
postgresPasswordSecretRef: {name: pw, key: password}
cells: [{name: zone-a, zoneId: z-a}, {name: zone-b, zoneId: z-b, cellTemplate: fast}]
";

    #[test]
    fn explicit_and_implicit_uses() {
        let spec = cluster(BASE).spec;
        assert_eq!(
            uses(TemplateKind::Cell, "fast", &spec),
            ["spec.cells[1].cellTemplate"]
        );
        assert_eq!(
            uses(TemplateKind::Cell, "default", &spec),
            ["spec.cells[0] (names no cellTemplate, so it uses the namespace default)"]
        );
        assert_eq!(
            uses(TemplateKind::Core, "default", &spec).len(),
            3,
            "global topology, multiadmin and its web UI"
        );
        assert_eq!(
            uses(TemplateKind::Shard, "default", &spec),
            [
                "spec.databases (unset: the default shard) (names no shardTemplate, so it uses the namespace default)"
            ]
        );
        assert!(uses(TemplateKind::Shard, "other", &spec).is_empty());

        let with_defaults = cluster(&format!(
            "{BASE}templateDefaults: {{cellTemplate: fast}}\nglobalTopoServer: {{external: {{endpoints: ['http://e:2379']}}}}\nmultiadmin: {{templateRef: core}}\nmultiadminWeb: {{templateRef: core}}\n"
        ))
        .spec;
        assert_eq!(
            uses(TemplateKind::Cell, "fast", &with_defaults),
            [
                "spec.templateDefaults.cellTemplate",
                "spec.cells[1].cellTemplate"
            ]
        );
        assert!(
            uses(TemplateKind::Cell, "default", &with_defaults).is_empty(),
            "templateDefaults replaces the namespace default"
        );
        assert!(
            uses(TemplateKind::Core, "default", &with_defaults).is_empty(),
            "an external topology server and explicit refs use no default"
        );
    }

    #[test]
    fn deletion_names_every_user() {
        let mut first = cluster(BASE);
        first.metadata.name = Some("first".into());
        let mut second = cluster(&BASE.replace("cellTemplate: fast", "cellTemplate: slow"));
        second.metadata.name = Some("second".into());
        let mut leaving = cluster(BASE);
        leaving.metadata.name = Some("leaving".into());
        leaving.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        let clusters = [first, second, leaving];

        let findings = deletion(TemplateKind::Cell, "fast", &clusters);
        assert_eq!(
            findings.message(),
            "MultigresCluster \"first\": uses CellTemplate \"fast\" through \
             spec.cells[1].cellTemplate; change those references (or delete the cluster) before \
             deleting the template"
        );
        let findings = deletion(TemplateKind::Cell, "default", &clusters);
        assert_eq!(
            fields(&findings),
            ["MultigresCluster \"first\"", "MultigresCluster \"second\""]
        );
        assert!(deletion(TemplateKind::Cell, "unused", &clusters).allowed());
    }

    #[test]
    fn updates_that_break_users_are_refused() {
        let user = cluster(&format!(
            "{}templateDefaults: {{coreTemplate: core}}\n",
            BASE.replace(", cellTemplate: fast", "")
        ));
        let stored = templates("core: {core: {globalTopoServer: {etcd: {replicas: 3}}}}");
        let old = TemplateSpec::Core(Box::new(stored.core["core"].clone()));
        let new = TemplateSpec::Core(Box::new(
            serde_yaml::from_str("globalTopoServer: {etcd: {replicas: 5}}").unwrap(),
        ));
        let findings = change(
            "core",
            Some(&old),
            &new,
            std::slice::from_ref(&user),
            &stored,
        );
        assert_eq!(
            fields(&findings),
            ["CoreTemplate \"core\" spec.globalTopoServer.etcd.replicas"]
        );
        assert!(findings.violations[0].message.ends_with(
            "(in MultigresCluster \"demo\", which uses this CoreTemplate through \
                     spec.templateDefaults.coreTemplate)"
        ));
        let unrelated = TemplateSpec::Core(Box::new(
            serde_yaml::from_str(
                "globalTopoServer: {etcd: {replicas: 3}}\nmultiadmin: {replicas: 2}",
            )
            .unwrap(),
        ));
        assert!(change("core", Some(&old), &unrelated, &[user], &stored).allowed());
    }

    #[test]
    fn a_default_template_created_after_its_users_is_checked_against_them() {
        let mut implicit = cluster(BASE);
        implicit.metadata.name = Some("older".into());
        let mut pinned = cluster(&format!("{BASE}templateDefaults: {{shardTemplate: own}}\n"));
        pinned.metadata.name = Some("pinned".into());
        let stored = templates("shard: {own: {}}\ncell: {fast: {}}");
        let new = TemplateSpec::Shard(Box::new(serde_yaml::from_str("pools: {main: {}}").unwrap()));
        let findings = change("default", None, &new, &[implicit, pinned], &stored);
        assert_eq!(
            fields(&findings),
            ["shard postgres/default/0-inf (implicit) pools"]
        );
        assert_eq!(
            findings.violations[0].message,
            "pool \"default\" of shard postgres/default/0-inf cannot be removed or renamed: pools \
             are append-only, since their volumes and topology entries outlive them; keep it \
             (inline, in overrides or in the template) (in MultigresCluster \"older\", which \
             would use this ShardTemplate through spec.databases (unset: the default shard) \
             (names no shardTemplate, so it uses the namespace default))"
        );
        let keeps_default = TemplateSpec::Shard(Box::new(
            serde_yaml::from_str("pools: {default: {}, main: {}}").unwrap(),
        ));
        let older = cluster(BASE);
        assert!(change("default", None, &keeps_default, &[older], &stored).allowed());
    }
}
