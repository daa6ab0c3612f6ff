//! The resolution matrix: each level alone, their combinations, overrides per field kind, and
//! the errors users see.

use super::*;
use crate::v1alpha1::PvcRetentionPolicyType::{Delete, Retain};
use crate::v1alpha1::{CellTemplate, CoreTemplate, ShardTemplate};

fn cluster(yaml: &str) -> MultigresCluster {
    let mut c: MultigresCluster = serde_yaml::from_str(yaml).expect("fixture parses");
    c.metadata.namespace = Some("ns".into());
    c
}

const BASE: &str = r#"
apiVersion: multigres.com/v1alpha1
kind: MultigresCluster
metadata: {name: prod}
spec:
  postgresPasswordSecretRef: {name: pg, key: password}
  cells:
    - {name: zone-a, zoneId: use1-az1}
"#;

fn with_spec(extra: &str) -> MultigresCluster {
    cluster(&format!("{BASE}{extra}"))
}

fn templates(yaml: &str) -> Templates {
    let mut t = Templates::default();
    for doc in serde_yaml::Deserializer::from_str(yaml) {
        let v = serde_yaml::Value::deserialize(doc).unwrap();
        match v["kind"].as_str().unwrap() {
            "CoreTemplate" => {
                let o: CoreTemplate = serde_yaml::from_value(v).unwrap();
                t.core.insert(o.metadata.name.unwrap(), o.spec);
            }
            "CellTemplate" => {
                let o: CellTemplate = serde_yaml::from_value(v).unwrap();
                t.cell.insert(o.metadata.name.unwrap(), o.spec);
            }
            "ShardTemplate" => {
                let o: ShardTemplate = serde_yaml::from_value(v).unwrap();
                t.shard.insert(o.metadata.name.unwrap(), o.spec);
            }
            k => panic!("unexpected kind {k}"),
        }
    }
    t
}
use serde::Deserialize;

fn gateway_replicas(r: &ResolvedCluster) -> Option<i32> {
    r.cells[0].spec.multigateway.stateless.replicas
}

fn only_shard(r: &ResolvedCluster) -> &ShardResolvedSpec {
    assert_eq!(r.table_groups.len(), 1);
    assert_eq!(r.table_groups[0].shards.len(), 1);
    &r.table_groups[0].shards[0]
}

fn cell_template(name: &str, replicas: i32) -> String {
    format!(
        "---\napiVersion: multigres.com/v1alpha1\nkind: CellTemplate\nmetadata: {{name: {name}}}\nspec:\n  multigateway: {{replicas: {replicas}, podLabels: {{from: {name}}}}}\n"
    )
}

#[test]
fn built_in_defaults_alone() {
    let r = resolve(&with_spec(""), &Templates::default()).unwrap();
    let GlobalTopo::Managed(topo) = &r.global_topo else {
        panic!("managed etcd expected")
    };
    let etcd = topo.etcd.as_ref().unwrap();
    assert_eq!(etcd.replicas, Some(3));
    assert_eq!(etcd.root_path.as_deref(), Some("/multigres/global"));
    assert_eq!(etcd.image.as_ref().unwrap().as_str(), defaults::ETCD_IMAGE);
    assert_eq!(r.topo_ref.address, "prod-global-topo.ns.svc:2379");
    assert_eq!(r.topo_ref.root_path, "/multigres/global");
    assert_eq!(gateway_replicas(&r), Some(1));
    assert_eq!(
        r.cells[0]
            .spec
            .multigateway
            .buffer
            .as_ref()
            .unwrap()
            .enabled,
        Some(true)
    );
    assert_eq!(r.multiadmin.replicas, Some(1));
    assert_eq!(r.images.pull_policy, ImagePullPolicy::IfNotPresent);
    let tg = &r.table_groups[0];
    assert_eq!(tg.database_name.as_str(), "postgres");
    assert_eq!(tg.table_group_name.as_str(), "default");
    assert_eq!(tg.durability_policy.as_deref(), Some("AT_LEAST_2"));
    let shard = only_shard(&r);
    assert_eq!(shard.name, "0-inf");
    let pool = &shard.pools[&PoolName::new("default")];
    assert_eq!(pool.cells, vec![CellName::new("zone-a")]);
    assert_eq!(
        pool.replicas_per_cell,
        Some(3),
        "one cell: three pods, so the shard survives losing any one under AT_LEAST_2"
    );
    assert_eq!(pool.storage.as_ref().unwrap().size.as_deref(), Some("1Gi"));
    assert_eq!(
        pool.pvc_deletion_policy,
        Some(PvcDeletionPolicy {
            when_deleted: Some(Retain),
            when_scaled: Some(Retain)
        })
    );
    assert_eq!(shard.multiorch.cells, vec![CellName::new("zone-a")]);
    let grace = |d: &Option<GoDuration>| d.as_ref().map(|d| d.as_str().to_owned());
    assert_eq!(
        (
            grace(&shard.multiorch.leader_failover_grace_period_base),
            grace(&shard.multiorch.leader_failover_grace_period_max_jitter)
        ),
        (Some("1s".to_owned()), Some("2s".to_owned())),
        "the operator's failover grace, shorter than multiorch's 4s + 8s"
    );
    assert_eq!(
        grace(
            &r.cells[0]
                .spec
                .multigateway
                .buffer
                .as_ref()
                .unwrap()
                .min_time_between_failovers
        ),
        Some("0s".to_owned()),
        "every primary change is buffered"
    );
    assert_eq!(
        shard
            .backup
            .as_ref()
            .unwrap()
            .filesystem
            .as_ref()
            .unwrap()
            .path
            .as_deref(),
        Some("/backups")
    );
    assert_eq!(
        tg.cell_topology_labels[&CellName::new("zone-a")][ZONE_ID_NODE_LABEL],
        "use1-az1"
    );
}

#[test]
fn pools_default_to_a_shape_that_survives_one_lost_pod_in_any_number_of_cells() {
    for (cells, per_cell) in [(2, 2), (3, 1)] {
        let list: String = ["zone-a", "zone-b", "zone-c"][..cells]
            .iter()
            .map(|c| format!("    - {{name: {c}, zoneId: {c}}}\n"))
            .collect();
        let c = cluster(&format!(
            "apiVersion: multigres.com/v1alpha1\nkind: MultigresCluster\nmetadata: {{name: prod}}\n\
             spec:\n  postgresPasswordSecretRef: {{name: pg, key: password}}\n  cells:\n{list}"
        ));
        let r = resolve(&c, &Templates::default()).unwrap();
        let pool = &only_shard(&r).pools[&PoolName::new("default")];
        assert_eq!(pool.cells.len(), cells);
        assert_eq!(pool.replicas_per_cell, Some(per_cell), "{cells} cells");
    }
}

#[test]
fn each_placement_field_pins_its_own_node_label() {
    let c = cluster(
        r#"
apiVersion: multigres.com/v1alpha1
kind: MultigresCluster
metadata: {name: prod}
spec:
  postgresPasswordSecretRef: {name: pg, key: password}
  cells:
    - {name: zone-a, zone: us-east-1a}
    - {name: zone-b, zoneId: use1-az2}
    - {name: zone-c, region: us-east-1}
"#,
    );
    let r = resolve(&c, &Templates::default()).unwrap();
    let labels = &r.table_groups[0].cell_topology_labels;
    let label = |cell: &str| {
        labels[&CellName::new(cell)]
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect::<Vec<_>>()
    };
    assert_eq!(label("zone-a"), [(ZONE_NODE_LABEL, "us-east-1a")]);
    assert_eq!(label("zone-b"), [(ZONE_ID_NODE_LABEL, "use1-az2")]);
    assert_eq!(label("zone-c"), [(REGION_NODE_LABEL, "us-east-1")]);
    assert_eq!(ZONE_NODE_LABEL, "topology.kubernetes.io/zone");
    assert_eq!(
        r.cells[0].spec.zone.as_deref(),
        Some("us-east-1a"),
        "the Cell child carries the zone its pods are pinned to"
    );
}

#[test]
fn namespace_default_template_applies_when_nothing_is_named() {
    let r = resolve(&with_spec(""), &templates(&cell_template("default", 4))).unwrap();
    assert_eq!(gateway_replicas(&r), Some(4));
}

#[test]
fn template_defaults_win_over_the_namespace_default() {
    let t = templates(&(cell_template("default", 4) + &cell_template("ha", 6)));
    let r = resolve(&with_spec("  templateDefaults: {cellTemplate: ha}\n"), &t).unwrap();
    assert_eq!(gateway_replicas(&r), Some(6));
    let labels = &r.cells[0].spec.multigateway.stateless.pod_labels;
    assert_eq!(
        labels["from"], "ha",
        "only one template applies, not a merge of both"
    );
}

#[test]
fn explicit_reference_wins_over_template_defaults() {
    let t = templates(&(cell_template("ha", 6) + &cell_template("big", 8)));
    let c = cluster(
        r#"
apiVersion: multigres.com/v1alpha1
kind: MultigresCluster
metadata: {name: prod}
spec:
  postgresPasswordSecretRef: {name: pg, key: password}
  templateDefaults: {cellTemplate: ha}
  cells:
    - {name: zone-a, zoneId: a, cellTemplate: big}
    - {name: zone-b, zoneId: b}
"#,
    );
    let r = resolve(&c, &t).unwrap();
    assert_eq!(r.cells[0].spec.multigateway.stateless.replicas, Some(8));
    assert_eq!(r.cells[1].spec.multigateway.stateless.replicas, Some(6));
    assert_eq!(
        r.cells[0].spec.all_cells,
        vec![CellName::new("zone-a"), CellName::new("zone-b")]
    );
}

#[test]
fn overrides_merge_over_the_template_per_field_kind() {
    let t = templates(
        r#"
apiVersion: multigres.com/v1alpha1
kind: CellTemplate
metadata: {name: ha}
spec:
  multigateway:
    replicas: 3
    resources: {requests: {cpu: "1"}, limits: {memory: 1Gi}}
    podLabels: {team: db, tier: gold}
    buffer: {window: 5s, size: 100}
"#,
    );
    let c = cluster(
        r#"
apiVersion: multigres.com/v1alpha1
kind: MultigresCluster
metadata: {name: prod}
spec:
  postgresPasswordSecretRef: {name: pg, key: password}
  cells:
    - name: zone-a
      zoneId: a
      cellTemplate: ha
      overrides:
        multigateway:
          replicas: 5
          resources: {requests: {cpu: "2"}}
          podLabels: {tier: platinum}
          buffer: {size: 200}
"#,
    );
    let g = &resolve(&c, &t).unwrap().cells[0].spec.multigateway;
    assert_eq!(g.stateless.replicas, Some(5), "scalar replaced");
    let res = g.stateless.resources.as_ref().unwrap();
    assert!(res.limits.is_none(), "resource block replaced whole");
    assert_eq!(res.requests.as_ref().unwrap()["cpu"].0, "2");
    assert_eq!(g.stateless.pod_labels["team"], "db", "map merged per key");
    assert_eq!(g.stateless.pod_labels["tier"], "platinum");
    let b = g.buffer.as_ref().unwrap();
    assert_eq!(b.size, Some(200), "nested struct merged per field");
    assert_eq!(b.window.as_ref().map(|w| w.as_str()), Some("5s"));
    assert_eq!(b.enabled, Some(true), "built-in default fills the rest");
    assert_eq!(
        b.min_time_between_failovers.as_ref().map(|d| d.as_str()),
        Some("0s")
    );
}

#[test]
fn shard_template_overrides_and_inline_pools() {
    let t = templates(
        r#"
apiVersion: multigres.com/v1alpha1
kind: ShardTemplate
metadata: {name: std}
spec:
  multiorch: {replicas: 2, leaderFailoverGracePeriodBase: 3s, leaderFailoverGracePeriodMaxJitter: 5s}
  postgresConfig: {max_connections: "100", shared_buffers: 128MB}
  pools:
    main: {replicasPerCell: 3, storage: {size: 10Gi, class: fast}}
"#,
    );
    let c = with_spec(
        r#"  databases:
    - name: postgres
      default: true
      tablegroups:
        - name: default
          default: true
          shards:
            - name: 0-inf
              shardTemplate: std
              overrides:
                multiorch: {leaderFailoverGracePeriodMaxJitter: 0s}
                postgresConfig: {max_connections: "200"}
                pools:
                  main: {storage: {size: 20Gi}}
                  analytics: {replicasPerCell: 1}
"#,
    );
    let r = resolve(&c, &t).unwrap();
    let s = only_shard(&r);
    assert_eq!(s.multiorch.stateless.replicas, Some(2));
    let grace = |d: &Option<GoDuration>| d.as_ref().map(|d| d.as_str().to_owned());
    assert_eq!(
        grace(&s.multiorch.leader_failover_grace_period_base).as_deref(),
        Some("3s"),
        "the template's grace"
    );
    assert_eq!(
        grace(&s.multiorch.leader_failover_grace_period_max_jitter).as_deref(),
        Some("0s"),
        "the override's jitter"
    );
    assert_eq!(s.postgres_config["max_connections"], "200");
    assert_eq!(s.postgres_config["shared_buffers"], "128MB");
    let main = &s.pools[&PoolName::new("main")];
    assert_eq!(main.replicas_per_cell, Some(3));
    let st = main.storage.as_ref().unwrap();
    assert_eq!(st.size.as_deref(), Some("20Gi"));
    assert_eq!(st.class.as_deref(), Some("fast"));
    assert!(
        s.pools.contains_key(&PoolName::new("analytics")),
        "new pool added"
    );
    assert!(
        !s.pools.contains_key(&PoolName::new("default")),
        "no default pool when pools exist"
    );
}

#[test]
fn core_template_and_inline_etcd() {
    let t = templates(
        r#"
apiVersion: multigres.com/v1alpha1
kind: CoreTemplate
metadata: {name: default}
spec:
  globalTopoServer:
    etcd: {replicas: 5, storage: {size: 8Gi}}
  multiadmin: {replicas: 2}
"#,
    );
    let r = resolve(
        &with_spec("  globalTopoServer: {etcd: {storage: {class: ssd}}}\n"),
        &t,
    )
    .unwrap();
    let GlobalTopo::Managed(topo) = &r.global_topo else {
        panic!()
    };
    let etcd = topo.etcd.as_ref().unwrap();
    assert_eq!(etcd.replicas, Some(5));
    let st = etcd.storage.as_ref().unwrap();
    assert_eq!(
        (st.size.as_deref(), st.class.as_deref()),
        (Some("8Gi"), Some("ssd"))
    );
    assert_eq!(r.multiadmin.replicas, Some(2));
}

#[test]
fn external_topology_server() {
    let r = resolve(
        &with_spec(
            "  globalTopoServer:\n    external:\n      endpoints: [\"http://10.0.0.1:2379\", \"https://etcd.example:2379/\"]\n      rootPath: /mg\n",
        ),
        &Templates::default(),
    )
    .unwrap();
    assert!(matches!(r.global_topo, GlobalTopo::External(_)));
    assert_eq!(r.topo_ref.address, "10.0.0.1:2379,etcd.example:2379");
    assert_eq!(r.topo_ref.root_path, "/mg");
    assert_eq!(r.topo_ref.implementation, "etcd");
    assert_eq!(r.table_groups[0].global_topo_server, r.topo_ref);
}

#[test]
fn topology_tls_needs_every_topology_server_managed() {
    let managed = with_spec("  internalTLS: {topology: true}\n");
    assert!(resolve(&managed, &Templates::default()).is_ok());
    let external_global = with_spec(
        "  internalTLS: {topology: true}\n  globalTopoServer:\n    external:\n      endpoints: [\"http://10.0.0.1:2379\"]\n",
    );
    let err = resolve(&external_global, &Templates::default()).unwrap_err();
    assert!(
        err.to_string()
            .contains("spec.globalTopoServer.external is external"),
        "{err}"
    );
    // A cell's external etcd may come from its CellTemplate: named by the cell.
    let external_cell = cluster(
        r#"
apiVersion: multigres.com/v1alpha1
kind: MultigresCluster
metadata: {name: prod}
spec:
  postgresPasswordSecretRef: {name: pg, key: password}
  internalTLS: {topology: true}
  cells:
    - {name: zone-a, zoneId: use1-az1, cellTemplate: remote}
"#,
    );
    let remote = templates(
        r#"
apiVersion: multigres.com/v1alpha1
kind: CellTemplate
metadata: {name: remote}
spec:
  localTopoServer:
    external: {endpoints: ["http://etcd.zone-a:2379"]}
"#,
    );
    let err = resolve(&external_cell, &remote).unwrap_err();
    assert!(err.to_string().contains("cell zone-a"), "{err}");
    let plain = with_spec(
        "  globalTopoServer:\n    external:\n      endpoints: [\"http://10.0.0.1:2379\"]\n",
    );
    let r = resolve(&plain, &Templates::default()).unwrap();
    assert_eq!(
        super::external_topology_server(&r.global_topo, &r.cells).as_deref(),
        Some("spec.globalTopoServer.external")
    );
}

#[test]
fn an_external_topology_passes_its_tls_secrets_to_every_process_and_every_cell_agrees() {
    let global = "  globalTopoServer:\n    external:\n      endpoints: [\"https://etcd.infra:2379\"]\n      caSecret: etcd-ca\n      clientCertSecret: etcd-client\n";
    let r = resolve(&with_spec(global), &Templates::default()).unwrap();
    assert_eq!(r.topo_ref.ca_secret.as_deref(), Some("etcd-ca"));
    assert_eq!(
        r.topo_ref.client_cert_secret.as_deref(),
        Some("etcd-client")
    );
    assert_eq!(r.cells[0].spec.global_topo_server, r.topo_ref);
    assert_eq!(r.table_groups[0].global_topo_server, r.topo_ref);

    let ca_only = "  globalTopoServer:\n    external:\n      endpoints: [\"https://etcd.infra:2379\"]\n      caSecret: etcd-ca\n";
    let err = resolve(&with_spec(ca_only), &Templates::default()).unwrap_err();
    assert!(
        err.to_string()
            .contains("clientCertSecret is required with caSecret"),
        "{err}"
    );

    let cell = |local: &str| {
        cluster(&format!(
            "apiVersion: multigres.com/v1alpha1\nkind: MultigresCluster\nmetadata: {{name: prod}}\nspec:\n  postgresPasswordSecretRef: {{name: pg, key: password}}\n{global}  cells:\n    - {{name: zone-a, zoneId: a, spec: {{localTopoServer: {local}}}}}\n"
        ))
    };
    let same = cell(
        "{external: {endpoints: [\"https://etcd.a:2379\"], caSecret: etcd-ca, clientCertSecret: etcd-client}}",
    );
    assert!(resolve(&same, &Templates::default()).is_ok());
    let other = cell(
        "{external: {endpoints: [\"https://etcd.a:2379\"], caSecret: a-ca, clientCertSecret: a-client}}",
    );
    let err = resolve(&other, &Templates::default()).unwrap_err();
    assert!(
        err.to_string()
            .contains("the localTopoServer.external of cell zone-a")
            && err.to_string().contains("name the same Secrets there"),
        "{err}"
    );
    let managed = cell("{etcd: {}}");
    let err = resolve(&managed, &Templates::default()).unwrap_err();
    assert!(
        err.to_string()
            .contains("the managed localTopoServer.etcd of cell zone-a"),
        "{err}"
    );
}

#[test]
fn missing_named_templates_are_errors_listing_every_reference() {
    let c = cluster(
        r#"
apiVersion: multigres.com/v1alpha1
kind: MultigresCluster
metadata: {name: prod}
spec:
  postgresPasswordSecretRef: {name: pg, key: password}
  templateDefaults: {shardTemplate: nope}
  cells:
    - {name: zone-a, zoneId: a, cellTemplate: ghost}
"#,
    );
    let err = resolve(&c, &Templates::default()).unwrap_err();
    let ResolveError::MissingTemplates(missing) = &err else {
        panic!("{err}")
    };
    assert_eq!(missing.len(), 2);
    let msg = err.to_string();
    assert!(
        msg.contains("spec.cells[0].cellTemplate: CellTemplate \"ghost\" does not exist"),
        "{msg}"
    );
    assert!(
        msg.contains("spec.templateDefaults.shardTemplate: ShardTemplate \"nope\""),
        "{msg}"
    );
}

#[test]
fn pvc_policy_is_hierarchical_per_half() {
    let c = with_spec(
        r#"  pvcDeletionPolicy: {whenDeleted: Delete}
  databases:
    - name: postgres
      default: true
      tablegroups:
        - name: default
          default: true
          shards:
            - name: 0-inf
              spec:
                pools:
                  main: {pvcDeletionPolicy: {whenScaled: Delete}}
"#,
    );
    let r = resolve(&c, &Templates::default()).unwrap();
    assert_eq!(
        r.pvc_deletion_policy,
        PvcDeletionPolicy {
            when_deleted: Some(Delete),
            when_scaled: Some(Retain)
        }
    );
    let pool = &only_shard(&r).pools[&PoolName::new("main")];
    assert_eq!(
        pool.pvc_deletion_policy,
        Some(PvcDeletionPolicy {
            when_deleted: Some(Delete),
            when_scaled: Some(Delete)
        })
    );
    let GlobalTopo::Managed(topo) = &r.global_topo else {
        panic!()
    };
    assert_eq!(
        topo.pvc_deletion_policy.as_ref().unwrap().when_deleted,
        Some(Delete)
    );
}

#[test]
fn unsupported_durability_policy_names_the_field_and_the_allowed_values() {
    let err = resolve(
        &with_spec("  durabilityPolicy: ANY_2\n"),
        &Templates::default(),
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "spec.durabilityPolicy: durability policy \"ANY_2\" is not supported; allowed: AT_LEAST_2, MULTI_CELL_AT_LEAST_2"
    );
}

#[test]
fn local_topology_server_of_a_cell() {
    let c = with_spec("");
    let mut c2 = c.clone();
    c2.spec.cells[0].spec =
        Some(serde_yaml::from_str("localTopoServer: {etcd: {replicas: 1}}").unwrap());
    let r = resolve(&c2, &Templates::default()).unwrap();
    let local = r.cells[0].local_topo.as_ref().expect("managed local etcd");
    let etcd = local.etcd.as_ref().unwrap();
    assert_eq!(etcd.replicas, Some(1));
    assert_eq!(etcd.root_path.as_deref(), Some("/multigres/zone-a"));
    assert!(
        resolve(&c, &Templates::default()).unwrap().cells[0]
            .local_topo
            .is_none()
    );
}

#[test]
fn referenced_templates_include_defaults_and_every_reference() {
    let c = cluster(
        r#"
apiVersion: multigres.com/v1alpha1
kind: MultigresCluster
metadata: {name: prod}
spec:
  postgresPasswordSecretRef: {name: pg, key: password}
  templateDefaults: {coreTemplate: core-a}
  cells:
    - {name: zone-a, zoneId: a, cellTemplate: z}
    - {name: zone-b, zoneId: b, cellTemplate: a}
"#,
    );
    let t = referenced_templates(&c);
    let names = |v: &[TemplateRef]| v.iter().map(|r| r.as_str().to_string()).collect::<Vec<_>>();
    assert_eq!(names(&t.core_templates), ["core-a", "default"]);
    assert_eq!(names(&t.cell_templates), ["a", "default", "z"]);
    assert_eq!(names(&t.shard_templates), ["default"]);
}

#[test]
fn shard_spec_sums_replicas_and_inherits_from_the_table_group() {
    let c = cluster(
        r#"
apiVersion: multigres.com/v1alpha1
kind: MultigresCluster
metadata: {name: prod}
spec:
  postgresPasswordSecretRef: {name: pg, key: password}
  cells:
    - {name: zone-a, zoneId: a}
    - {name: zone-b, zoneId: b}
    - {name: zone-c, zoneId: c}
"#,
    );
    let r = resolve(&c, &Templates::default()).unwrap();
    let tg = &r.table_groups[0];
    let s = shard_spec(tg, &tg.shards[0]);
    assert_eq!(s.replicas, Some(3), "three cells, one replica each");
    assert_eq!(s.shard_name.as_str(), "0-inf");
    assert_eq!(s.global_topo_server, r.topo_ref);
    assert_eq!(s.images.postgres.as_str(), defaults::POSTGRES_IMAGE);
}

#[test]
fn observability_reaches_every_child_with_the_sampling_key_defaulted() {
    let r = resolve(
        &with_spec(
            "  observability:\n    tracesSampler: multigres_custom\n    samplingConfigRef: {name: sampling}\n",
        ),
        &Templates::default(),
    )
    .unwrap();
    let expected = ObservabilityConfig {
        traces_sampler: Some("multigres_custom".into()),
        sampling_config_ref: Some(crate::v1alpha1::SamplingConfigRef {
            name: "sampling".into(),
            key: Some("sampling-config.yaml".into()),
        }),
        ..Default::default()
    };
    assert_eq!(r.cells[0].spec.observability.as_ref(), Some(&expected));
    assert_eq!(r.table_groups[0].observability.as_ref(), Some(&expected));

    let own_key =
        with_spec("  observability:\n    samplingConfigRef: {name: sampling, key: custom.yaml}\n");
    let r = resolve(&own_key, &Templates::default()).unwrap();
    let key = r.cells[0]
        .spec
        .observability
        .as_ref()
        .and_then(|o| o.sampling_config_ref.as_ref())
        .and_then(|s| s.key.as_deref());
    assert_eq!(key, Some("custom.yaml"));
    assert_eq!(
        resolve(&with_spec(""), &Templates::default())
            .unwrap()
            .cells[0]
            .spec
            .observability,
        None
    );
}

#[test]
fn postgres_settings_merge_per_parameter_and_initdb_args_and_ref_are_replaced() {
    let t = templates(
        r#"
apiVersion: multigres.com/v1alpha1
kind: ShardTemplate
metadata: {name: std}
spec:
  initdbArgs: --data-checksums
  postgresConfigRef: {name: tuning, key: base.conf}
  postgresConfig: {work_mem: 4MB, shared_buffers: 128MB}
"#,
    );
    let c = with_spec(
        r#"  templateDefaults: {shardTemplate: std}
  databases:
    - name: postgres
      default: true
      tablegroups:
        - name: default
          default: true
          shards:
            - name: 0-inf
              spec:
                initdbArgs: --locale=C
                postgresConfig: {work_mem: 8MB, statement_timeout: 30s}
"#,
    );
    let r = resolve(&c, &t).unwrap();
    let s = only_shard(&r);
    assert_eq!(
        s.postgres_config,
        BTreeMap::from([
            ("shared_buffers".to_owned(), "128MB".to_owned()),
            ("statement_timeout".to_owned(), "30s".to_owned()),
            ("work_mem".to_owned(), "8MB".to_owned()),
        ]),
        "merged per parameter, the inline value winning"
    );
    assert_eq!(
        s.initdb_args.as_ref().map(|a| a.as_str()),
        Some("--locale=C")
    );
    let r#ref = s.postgres_config_ref.as_ref().unwrap();
    assert_eq!(
        (r#ref.name.as_str(), r#ref.key.as_str()),
        ("tuning", "base.conf")
    );
}
