//! Pass 1: the spec as written. Template references exist, quantities and sizes parse, no limit
//! below its request, supported durability policies, no operator-managed PostgreSQL parameter,
//! valid external IPs, at least one cell; on update, cells stay (by name) and keep their
//! zone/region.

use std::collections::BTreeMap;
use std::net::IpAddr;

use multigres_api::backup_schedule::Schedule;
use multigres_api::resolver::defaults;
use multigres_api::v1alpha1::{
    BackupConfig, CellConfig, EtcdSpec, ExternalServiceConfig, InternalTlsConfig,
    MultigresClusterSpec, ShardConfig, TemplateRef,
};

use crate::rules::{self, TemplateKind, Templates};
use crate::violation::Findings;

/// Every template reference written in the spec names a template of the namespace.
pub(super) fn missing_templates(
    findings: &mut Findings,
    spec: &MultigresClusterSpec,
    templates: &Templates,
    namespace: &str,
) {
    let mut check = |kind: TemplateKind, reference: Option<&TemplateRef>, field: String| {
        let Some(name) = reference else { return };
        let exists = match kind {
            TemplateKind::Core => templates.core.contains_key(name.as_str()),
            TemplateKind::Cell => templates.cell.contains_key(name.as_str()),
            TemplateKind::Shard => templates.shard.contains_key(name.as_str()),
        };
        if !exists {
            findings.violation(
                field,
                format!(
                    "{kind} {:?} does not exist in namespace {namespace:?}; create it first or \
                     change the reference",
                    name.as_str()
                ),
            );
        }
    };
    if let Some(defaults) = &spec.template_defaults {
        let base = "spec.templateDefaults";
        check(
            TemplateKind::Core,
            defaults.core_template.as_ref(),
            format!("{base}.coreTemplate"),
        );
        check(
            TemplateKind::Cell,
            defaults.cell_template.as_ref(),
            format!("{base}.cellTemplate"),
        );
        check(
            TemplateKind::Shard,
            defaults.shard_template.as_ref(),
            format!("{base}.shardTemplate"),
        );
    }
    if let Some(g) = &spec.global_topo_server {
        check(
            TemplateKind::Core,
            g.template_ref.as_ref(),
            "spec.globalTopoServer.templateRef".into(),
        );
    }
    if let Some(m) = &spec.multiadmin {
        check(
            TemplateKind::Core,
            m.template_ref.as_ref(),
            "spec.multiadmin.templateRef".into(),
        );
    }
    if let Some(m) = &spec.multiadmin_web {
        check(
            TemplateKind::Core,
            m.template_ref.as_ref(),
            "spec.multiadminWeb.templateRef".into(),
        );
    }
    for (i, cell) in spec.cells.iter().enumerate() {
        check(
            TemplateKind::Cell,
            cell.cell_template.as_ref(),
            format!("spec.cells[{i}].cellTemplate"),
        );
    }
    for (path, shard) in written_shards(spec) {
        check(
            TemplateKind::Shard,
            shard.shard_template.as_ref(),
            format!("{path}.shardTemplate"),
        );
    }
}

/// Every shard entry written in the spec, with its path.
fn written_shards(spec: &MultigresClusterSpec) -> Vec<(String, &ShardConfig)> {
    let mut shards = Vec::new();
    for (d, db) in spec.databases.iter().enumerate() {
        for (t, tg) in db.tablegroups.iter().enumerate() {
            for (s, shard) in tg.shards.iter().enumerate() {
                shards.push((
                    format!("spec.databases[{d}].tablegroups[{t}].shards[{s}]"),
                    shard,
                ));
            }
        }
    }
    shards
}

/// Pass 1 on the spec as written: every value is checked at the path the user wrote it, in the
/// order of the spec.
pub(super) fn written(findings: &mut Findings, spec: &MultigresClusterSpec) {
    rules::expansion::expansions(findings, "spec", spec);
    rules::pod_metadata::pod_metadata(findings, "spec", spec);
    written_core(findings, spec);
    written_cells(findings, spec);
    written_policies(findings, spec);
    for (path, shard) in written_shards(spec) {
        written_shard(findings, &path, shard);
    }
    external_service(
        findings,
        "spec.externalGateway",
        spec.external_gateway.as_ref(),
    );
    external_service(
        findings,
        "spec.externalAdminWeb",
        spec.external_admin_web.as_ref(),
    );
}

/// The components of the CoreTemplate level: the global topology server and multiadmin.
fn written_core(findings: &mut Findings, spec: &MultigresClusterSpec) {
    if let Some(g) = &spec.global_topo_server {
        if let Some(etcd) = &g.etcd {
            etcd_block(findings, "spec.globalTopoServer.etcd", etcd);
        }
        rules::pvc_policy_warning(
            findings,
            "spec.globalTopoServer.pvcDeletionPolicy",
            g.pvc_deletion_policy.as_ref(),
        );
    }
    if let Some(m) = &spec.multiadmin {
        let resources = m.spec.as_ref().and_then(|s| s.resources.as_ref());
        rules::resources(findings, "spec.multiadmin.spec.resources", resources);
    }
    if let Some(m) = &spec.multiadmin_web {
        let resources = m.spec.as_ref().and_then(|s| s.resources.as_ref());
        rules::resources(findings, "spec.multiadminWeb.spec.resources", resources);
    }
}

/// At least one cell, and each cell's gateway resources and local etcd.
fn written_cells(findings: &mut Findings, spec: &MultigresClusterSpec) {
    if spec.cells.is_empty() {
        findings.violation(
            "spec.cells",
            "at least one cell is required: gateways and the shards' pools run in cells",
        );
    }
    for (i, cell) in spec.cells.iter().enumerate() {
        let path = format!("spec.cells[{i}]");
        if let Some(inline) = &cell.spec {
            let gateway = inline.multigateway.as_ref();
            rules::resources(
                findings,
                &format!("{path}.spec.multigateway.resources"),
                gateway.and_then(|g| g.stateless.resources.as_ref()),
            );
            if let Some(etcd) = inline
                .local_topo_server
                .as_ref()
                .and_then(|l| l.etcd.as_ref())
            {
                etcd_block(findings, &format!("{path}.spec.localTopoServer.etcd"), etcd);
            }
        }
        if let Some(overrides) = &cell.overrides {
            rules::resources(
                findings,
                &format!("{path}.overrides.multigateway.resources"),
                overrides
                    .multigateway
                    .as_ref()
                    .and_then(|g| g.stateless.resources.as_ref()),
            );
        }
    }
}

/// The durability, backup and PVC policies of the cluster, its databases and their table
/// groups (the shards' own come with each shard).
fn written_policies(findings: &mut Findings, spec: &MultigresClusterSpec) {
    durability(
        findings,
        "spec.durabilityPolicy",
        spec.durability_policy.as_deref(),
    );
    backup_block(findings, "spec.backup", spec.backup.as_ref());
    rules::pvc_policy_warning(
        findings,
        "spec.pvcDeletionPolicy",
        spec.pvc_deletion_policy.as_ref(),
    );
    for (d, db) in spec.databases.iter().enumerate() {
        let db_path = format!("spec.databases[{d}]");
        durability(
            findings,
            &format!("{db_path}.durabilityPolicy"),
            db.durability_policy.as_deref(),
        );
        backup_block(findings, &format!("{db_path}.backup"), db.backup.as_ref());
        for (t, tg) in db.tablegroups.iter().enumerate() {
            let tg_path = format!("{db_path}.tablegroups[{t}]");
            backup_block(findings, &format!("{tg_path}.backup"), tg.backup.as_ref());
            rules::pvc_policy_warning(
                findings,
                &format!("{tg_path}.pvcDeletionPolicy"),
                tg.pvc_deletion_policy.as_ref(),
            );
        }
    }
}

/// One written shard entry at `path`: its backup, then its inline spec, then its overrides.
fn written_shard(findings: &mut Findings, path: &str, shard: &ShardConfig) {
    backup_block(findings, &format!("{path}.backup"), shard.backup.as_ref());
    if let Some(inline) = &shard.spec {
        let base = format!("{path}.spec");
        rules::resources(
            findings,
            &format!("{base}.multiorch.resources"),
            inline
                .multiorch
                .as_ref()
                .and_then(|m| m.stateless.resources.as_ref()),
        );
        pools_block(findings, &base, &inline.pools);
        rules::postgres::postgres_config(
            findings,
            &format!("{base}.postgresConfig"),
            &inline.postgres_config,
        );
        rules::pvc_policy_warning(
            findings,
            &format!("{base}.pvcDeletionPolicy"),
            inline.pvc_deletion_policy.as_ref(),
        );
    }
    if let Some(overrides) = &shard.overrides {
        let base = format!("{path}.overrides");
        rules::resources(
            findings,
            &format!("{base}.multiorch.resources"),
            overrides
                .multiorch
                .as_ref()
                .and_then(|m| m.stateless.resources.as_ref()),
        );
        pools_block(findings, &base, &overrides.pools);
        rules::postgres::postgres_config(
            findings,
            &format!("{base}.postgresConfig"),
            &overrides.postgres_config,
        );
    }
}

/// Checks of a written etcd block, shared by the cluster and the templates.
pub(in crate::rules) fn etcd_block(findings: &mut Findings, path: &str, etcd: &EtcdSpec) {
    rules::resources(
        findings,
        &format!("{path}.resources"),
        etcd.resources.as_ref(),
    );
    rules::storage_size(
        findings,
        &format!("{path}.storage.size"),
        etcd.storage.as_ref().and_then(|s| s.size.as_deref()),
    );
    rules::pvc_policy_warning(
        findings,
        &format!("{path}.pvcDeletionPolicy"),
        etcd.pvc_deletion_policy.as_ref(),
    );
}

/// Checks of written pools (inline spec, overrides or a ShardTemplate), under `base`.
pub(in crate::rules) fn pools_block(
    findings: &mut Findings,
    base: &str,
    pools: &multigres_api::v1alpha1::Pools,
) {
    for (name, pool) in pools {
        let path = format!("{base}.pools[{name}]");
        rules::storage_size(
            findings,
            &format!("{path}.storage.size"),
            pool.storage.as_ref().and_then(|s| s.size.as_deref()),
        );
        for (container, config) in [
            ("postgres", &pool.postgres),
            ("multipooler", &pool.multipooler),
        ] {
            rules::resources(
                findings,
                &format!("{path}.{container}.resources"),
                config.as_ref().and_then(|c| c.resources.as_ref()),
            );
        }
        rules::pvc_policy_warning(
            findings,
            &format!("{path}.pvcDeletionPolicy"),
            pool.pvc_deletion_policy.as_ref(),
        );
    }
}

fn backup_block(findings: &mut Findings, path: &str, backup: Option<&BackupConfig>) {
    let size = backup
        .and_then(|b| b.filesystem.as_ref())
        .and_then(|f| f.storage.as_ref())
        .and_then(|s| s.size.as_deref());
    rules::storage_size(findings, &format!("{path}.filesystem.storage.size"), size);
    if let Some(schedule) = backup.and_then(|b| b.schedule.as_ref())
        && let Err(message) = Schedule::parse(&schedule.cron)
    {
        findings.violation(format!("{path}.schedule.cron"), message);
    }
}

fn durability(findings: &mut Findings, path: &str, policy: Option<&str>) {
    if let Some(policy) = policy
        && !defaults::DURABILITY_POLICIES.contains(&policy)
    {
        findings.violation(
            path,
            format!(
                "durability policy {policy:?} is not supported; use one of {}",
                defaults::DURABILITY_POLICIES.join(", ")
            ),
        );
    }
}

fn external_service(findings: &mut Findings, path: &str, service: Option<&ExternalServiceConfig>) {
    let Some(service) = service else { return };
    for (i, ip) in service.external_ips.iter().enumerate() {
        if ip.as_str().parse::<IpAddr>().is_err() {
            findings.violation(
                format!("{path}.externalIPs[{i}]"),
                format!("{:?} is not an IPv4 or IPv6 address", ip.as_str()),
            );
        }
    }
    if service.enabled && service.external_ips.is_empty() {
        findings.warning(
            path,
            "is enabled without externalIPs: the LoadBalancer Service gets an address only if \
             a load-balancer controller runs in the cluster",
        );
    }
}

/// On update, cells stay (by name) and keep their zone and region.
/// `internalTLS.topology` stays as the cluster was created: etcd members keep the peer URLs
/// (`https://` or `http://`) they were bootstrapped with, so a change would split the members.
fn topology_tls_transition(
    findings: &mut Findings,
    old: &MultigresClusterSpec,
    new: &MultigresClusterSpec,
) {
    let was = InternalTlsConfig::topology_enabled(old.internal_tls.as_ref());
    let is = InternalTlsConfig::topology_enabled(new.internal_tls.as_ref());
    if was != is {
        findings.violation(
            "spec.internalTLS.topology",
            format!(
                "cannot change from {was} to {is}: the etcd members keep the peer URLs they \
                 were created with, so topology TLS is chosen when the cluster is created; \
                 set it back to {was}"
            ),
        );
    }
}

pub(super) fn written_transition(
    findings: &mut Findings,
    old: &MultigresClusterSpec,
    new: &MultigresClusterSpec,
) {
    topology_tls_transition(findings, old, new);
    let new_cells: BTreeMap<&str, (usize, &CellConfig)> = new
        .cells
        .iter()
        .enumerate()
        .map(|(i, c)| (c.name.as_str(), (i, c)))
        .collect();
    for old_cell in &old.cells {
        let name = old_cell.name.as_str();
        let Some((i, new_cell)) = new_cells.get(name) else {
            findings.violation(
                "spec.cells",
                format!(
                    "cell {name:?} cannot be removed or renamed: cells are append-only, since \
                     their topology records and data outlive them; keep it in the list"
                ),
            );
            continue;
        };
        let placements = [
            ("zone", old_cell.zone.as_deref(), new_cell.zone.as_deref()),
            (
                "zoneId",
                old_cell.zone_id.as_deref(),
                new_cell.zone_id.as_deref(),
            ),
            (
                "region",
                old_cell.region.as_deref(),
                new_cell.region.as_deref(),
            ),
        ];
        for (field, before, after) in placements {
            if before != after {
                findings.violation(
                    format!("spec.cells[{i}].{field}"),
                    format!(
                        "{field} of cell {name:?} cannot change after creation (was {}, now {}): \
                         its pods and volumes are pinned there; add a new cell instead",
                        shown(before),
                        shown(after)
                    ),
                );
            }
        }
    }
}

fn shown(value: Option<&str>) -> String {
    value.map_or_else(|| "unset".to_owned(), |v| format!("{v:?}"))
}

#[cfg(test)]
mod tests {
    use crate::rules::Templates;
    use crate::rules::cluster::tests::{BASE, cluster, fields, templates, with};
    use crate::rules::cluster::validate;

    #[test]
    fn every_missing_template_reference_is_named() {
        let new = cluster(&with(
            "
templateDefaults: {cellTemplate: nope, shardTemplate: std}
multiadmin: {templateRef: core-x}
databases:
- name: postgres
  default: true
  tablegroups:
  - name: default
    default: true
    shards: [{name: 0-inf, shardTemplate: gone}]
",
        ));
        let findings = validate(&new, None, &templates("shard: {std: {}}"));
        assert_eq!(
            fields(&findings),
            [
                "spec.templateDefaults.cellTemplate",
                "spec.multiadmin.templateRef",
                "spec.databases[0].tablegroups[0].shards[0].shardTemplate"
            ]
        );
        assert_eq!(
            findings.violations[0].message,
            "CellTemplate \"nope\" does not exist in namespace \"db\"; create it first or change \
             the reference"
        );
    }

    #[test]
    fn written_values_are_checked_everywhere_they_appear() {
        let new = cluster(&with(
            "
durabilityPolicy: ALL_OF_THEM
globalTopoServer:
  etcd:
    storage: {size: 10GB}
    resources: {requests: {memory: 1Gi}, limits: {memory: 512Mi}}
externalGateway: {enabled: true, externalIPs: [10.0.0.300]}
databases:
- name: postgres
  default: true
  durabilityPolicy: MOSTLY
  tablegroups:
  - name: default
    default: true
    shards:
    - name: 0-inf
      overrides:
        postgresConfig: {wal_level: replica, work_mem: 4MB}
        pools:
          main:
            storage: {size: 0Gi}
            postgres: {resources: {requests: {cpu: '1'}, limits: {cpu: 500m}}}
",
        ));
        let findings = validate(&new, None, &Templates::default());
        assert_eq!(
            fields(&findings),
            [
                "spec.globalTopoServer.etcd.resources.limits.memory",
                "spec.globalTopoServer.etcd.storage.size",
                "spec.durabilityPolicy",
                "spec.databases[0].durabilityPolicy",
                "spec.databases[0].tablegroups[0].shards[0].overrides.pools[main].storage.size",
                "spec.databases[0].tablegroups[0].shards[0].overrides.pools[main].postgres.resources.limits.cpu",
                "spec.databases[0].tablegroups[0].shards[0].overrides.postgresConfig[wal_level]",
                "spec.externalGateway.externalIPs[0]",
            ]
        );
        assert!(
            findings.message().starts_with("8 problems: "),
            "{}",
            findings.message()
        );
        assert!(
            findings.violations[2]
                .message
                .contains("use one of AT_LEAST_2, MULTI_CELL_AT_LEAST_2")
        );
    }

    #[test]
    fn a_backup_schedule_needs_a_cron_expression() {
        let new = cluster(&with(
            "
backup: {type: s3, s3: {bucket: b, region: r}, schedule: {cron: '0 2 * *'}}
databases:
- name: postgres
  default: true
  tablegroups:
  - name: default
    default: true
    backup: {type: s3, s3: {bucket: b, region: r}, schedule: {cron: '*/30 * * * *'}}
",
        ));
        let findings = validate(&new, None, &Templates::default());
        assert_eq!(fields(&findings), ["spec.backup.schedule.cron"]);
        assert!(
            findings.violations[0]
                .message
                .starts_with("\"0 2 * *\" is not a cron expression"),
            "{}",
            findings.violations[0].message
        );
    }

    #[test]
    fn a_cluster_needs_a_cell() {
        let new = cluster("postgresPasswordSecretRef: {name: pw, key: password}");
        let findings = validate(&new, None, &Templates::default());
        assert_eq!(fields(&findings), ["spec.cells"]);
    }

    #[test]
    fn cells_stay_and_keep_their_placement() {
        let old = cluster(BASE);
        let new = cluster(
            "
postgresPasswordSecretRef: {name: pw, key: password}
cells: [{name: zone-b, region: r-1}, {name: zone-c, zoneId: z-c}]
",
        );
        let findings = validate(&new, Some(&old), &Templates::default());
        assert_eq!(
            fields(&findings),
            ["spec.cells", "spec.cells[0].zoneId", "spec.cells[0].region"]
        );
        assert!(
            findings.violations[0]
                .message
                .starts_with("cell \"zone-a\" cannot be removed")
        );
        assert!(
            findings.violations[1]
                .message
                .contains("(was \"z-b\", now unset)")
        );
    }
}
