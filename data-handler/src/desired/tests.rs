use multigres_api::resolver::{Templates, resolve};
use multigres_api::v1alpha1::MultigresCluster;

use super::*;

/// A cluster from YAML (metadata plus spec), in namespace `team-a`.
fn cluster(yaml: &str) -> MultigresCluster {
    let mut c: MultigresCluster = serde_yaml::from_str(yaml).expect("fixture parses");
    c.metadata.namespace = Some("team-a".into());
    c
}

fn topology_of(c: &MultigresCluster) -> Result<Topology, TopoError> {
    let resolved = resolve(c, &Templates::default()).expect("fixture resolves");
    topology(c, &resolved)
}

const HEADER: &str = "
apiVersion: multigres.com/v1alpha1
kind: MultigresCluster
metadata: {name: prod}
";

fn yaml(spec: &str) -> String {
    format!("{HEADER}spec:\n  postgresPasswordSecretRef: {{name: pw, key: password}}\n{spec}")
}

#[test]
fn minimal_cluster_registers_its_cell_on_the_managed_server_and_the_default_database() {
    let c = cluster(&yaml("  cells:\n    - {name: zone-a, zoneId: zone-a}\n"));
    let t = topology_of(&c).unwrap();
    assert_eq!(
        t.cells,
        [CellSpec {
            name: "zone-a".into(),
            server_addresses: vec!["prod-global-topo.team-a.svc:2379".into()],
            root: "/multigres/zone-a".into(),
        }]
    );
    assert_eq!(
        t.databases,
        [DatabaseSpec {
            name: "postgres".into(),
            cells: vec!["zone-a".into()],
            backup: BackupSpec::Filesystem {
                path: "/backups".into()
            },
            require_initial_repo_encryption: false,
            durability: DurabilityPolicyName::AtLeast2,
        }]
    );
    assert!(t.pruning, "pruning is on by default");
}

#[test]
fn cells_use_their_local_server_when_they_have_one() {
    let c = cluster(&yaml(
        "
  globalTopoServer:
    external:
      endpoints: [http://etcd-0.example:2379/, http://etcd-1.example:2379]
      rootPath: /shared/global
  cells:
    - name: zone-b
      zoneId: zone-b
    - name: zone-a
      zoneId: zone-a
      spec:
        localTopoServer:
          etcd: {rootPath: /zone-a-data}
    - name: zone-c
      zoneId: zone-c
      spec:
        localTopoServer:
          external: {endpoints: ['http://c-etcd:2379', 'http://c-etcd-2:2379']}
",
    ));
    let t = topology_of(&c).unwrap();
    let by_name = |n: &str| t.cells.iter().find(|c| c.name == n).unwrap().clone();
    assert_eq!(
        by_name("zone-b"),
        CellSpec {
            name: "zone-b".into(),
            server_addresses: vec!["etcd-0.example:2379".into(), "etcd-1.example:2379".into()],
            root: "/multigres/zone-b".into(),
        },
        "a cell without a local server uses the global addresses (host:port) and its own root"
    );
    assert_eq!(
        by_name("zone-a"),
        CellSpec {
            name: "zone-a".into(),
            server_addresses: vec!["prod-zone-a-local-topo.team-a.svc:2379".into()],
            root: "/zone-a-data".into(),
        }
    );
    assert_eq!(
        by_name("zone-c"),
        CellSpec {
            name: "zone-c".into(),
            server_addresses: vec!["c-etcd:2379".into(), "c-etcd-2:2379".into()],
            root: "/multigres/zone-c".into(),
        }
    );
    assert_eq!(
        t.databases[0].cells,
        ["zone-b", "zone-a", "zone-c"],
        "cells in spec order"
    );
}

#[test]
fn database_record_follows_the_default_table_group() {
    let c = cluster(&yaml(
        "
  durabilityPolicy: AT_LEAST_2
  backup:
    type: filesystem
    filesystem: {path: /cluster-backups}
  cells:
    - {name: zone-a, zoneId: zone-a}
    - {name: zone-b, zoneId: zone-b}
  databases:
    - name: postgres
      default: true
      durabilityPolicy: MULTI_CELL_AT_LEAST_2
      backup:
        type: s3
        s3: {bucket: b, region: eu-west-1, keyPrefix: pg/, useEnvCredentials: true}
        encryption: {secretName: keys}
      tablegroups:
        - name: default
          default: true
",
    ));
    let t = topology_of(&c).unwrap();
    assert_eq!(
        t.databases,
        [DatabaseSpec {
            name: "postgres".into(),
            cells: vec!["zone-a".into(), "zone-b".into()],
            backup: BackupSpec::S3 {
                bucket: "b".into(),
                region: "eu-west-1".into(),
                endpoint: String::new(),
                key_prefix: "pg/".into(),
                use_env_credentials: true,
            },
            require_initial_repo_encryption: true,
            durability: DurabilityPolicyName::MultiCellAtLeast2,
        }]
    );
}

#[test]
fn s3_record_carries_every_field_and_env_credentials_follow_the_secret() {
    let record = |s3: &str| {
        let c = cluster(&yaml(&format!(
            "  backup:\n    type: s3\n    s3: {s3}\n  cells:\n    - {{name: zone-a, zoneId: zone-a}}\n"
        )));
        topology_of(&c).unwrap().databases.remove(0).backup
    };
    let s3 = |use_env_credentials| BackupSpec::S3 {
        bucket: "bkt".into(),
        region: "us-east-1".into(),
        endpoint: "http://minio:9000".into(),
        key_prefix: "team/".into(),
        use_env_credentials,
    };
    let base = "bucket: bkt, region: us-east-1, endpoint: 'http://minio:9000', keyPrefix: team/";
    assert_eq!(
        record(&format!("{{{base}, credentialsSecret: aws}}")),
        s3(true)
    );
    assert_eq!(
        record(&format!("{{{base}, useEnvCredentials: true}}")),
        s3(true)
    );
    assert_eq!(
        record(&format!("{{{base}, serviceAccountName: irsa}}")),
        s3(false)
    );
    assert_eq!(record(&format!("{{{base}}}")), s3(false));
}

#[test]
fn pruning_can_be_switched_off() {
    let c = cluster(&yaml(
        "  topologyPruning: {enabled: false}\n  cells:\n    - {name: zone-a, zoneId: zone-a}\n",
    ));
    assert!(!topology_of(&c).unwrap().pruning);
}

#[test]
fn records_multigres_could_not_use_are_refused() {
    let c = cluster(&yaml(
        "
  backup:
    type: filesystem
    filesystem: {path: relative/backups}
  cells:
    - {name: zone-a, zoneId: zone-a}
",
    ));
    let err = topology_of(&c).unwrap_err();
    assert!(!err.is_transient());
    assert!(err.to_string().contains("relative/backups"), "{err}");
}

#[test]
fn owner_identity_is_namespace_and_name() {
    assert_eq!(owner_id("team-a", "prod"), "team-a/prod");
}
