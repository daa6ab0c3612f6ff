//! Serialization: manifests written for the upstream Go operator parse unchanged and serialize
//! back identically, and optional fields never serialize as `null`.

mod common;

use multigres_api::v1alpha1::{
    Cell, CellSpec, MultigresCluster, MultigresClusterSpec, PoolName, PoolSpec, Shard, TableGroup,
    TopoServer,
};
use serde::{Serialize, de::DeserializeOwned};

/// A MultigresCluster in the upstream operator's format, using nearly every user-facing field.
const UPSTREAM_CLUSTER: &str = r#"
apiVersion: multigres.com/v1alpha1
kind: MultigresCluster
metadata:
  name: upstream
  namespace: db
spec:
  images:
    imagePullPolicy: Always
    imagePullSecrets:
      - name: registry
    multigateway: ghcr.io/multigres/multigres:sha-66d2310
    multiorch: ghcr.io/multigres/multigres:sha-66d2310
    multipooler: ghcr.io/multigres/multigres:sha-66d2310
    multiadmin: ghcr.io/multigres/multigres:sha-66d2310
    multiadminWeb: ghcr.io/multigres/multiadmin-web:sha-64da1ab
    postgres: ghcr.io/multigres/pgctld:sha-66d2310
  imageUpdatePolicy:
    strategy: lazy
    acknowledgedRevision: 0123456789ab
  logLevels:
    pgctld: debug
    multipooler: info
    multiorch: warn
    multiadmin: error
    multigateway: info
  templateDefaults:
    coreTemplate: core
    cellTemplate: cell
    shardTemplate: shard
  globalTopoServer:
    etcd:
      image: gcr.io/etcd-development/etcd:v3.6.7
      replicas: 3
      storage:
        size: 1Gi
        class: fast
        accessModes: [ReadWriteOnce]
      resources:
        requests:
          cpu: 100m
          memory: 256Mi
        limits:
          memory: 512Mi
      rootPath: /multigres/global
      pvcDeletionPolicy:
        whenDeleted: Delete
    pvcDeletionPolicy:
      whenScaled: Retain
    placement:
      nodeSelector:
        disk: ssd
      tolerations:
        - key: dedicated
          operator: Equal
          value: etcd
          effect: NoSchedule
      topologySpreadConstraints:
        - maxSkew: 1
          topologyKey: topology.kubernetes.io/zone
          whenUnsatisfiable: DoNotSchedule
          labelSelector:
            matchLabels:
              app: etcd
  multiadmin:
    spec:
      replicas: 1
      podAnnotations:
        example.com/a: b
      podLabels:
        team: db
      affinity:
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms:
              - matchExpressions:
                  - key: kubernetes.io/arch
                    operator: In
                    values: [amd64]
    placement:
      tolerations:
        - key: dedicated
          operator: Exists
  multiadminWeb:
    templateRef: core
  cells:
    - name: us-east-1a
      zoneId: use1-az1
      metadata: '{"display":"East A"}'
      cellTemplate: cell
      overrides:
        multigateway:
          replicas: 3
          buffer:
            enabled: true
            window: 10s
            maxFailoverDuration: 20s
            minTimeBetweenFailovers: 1m
            size: 1000
            drainConcurrency: 2
        multigatewayPlacement:
          tolerations:
            - key: gateway
              operator: Exists
    - name: us-east-1b
      region: us-east-1
      spec:
        multigateway:
          replicas: 1
          resources:
            requests:
              cpu: "1"
              memory: 1Gi
        localTopoServer:
          external:
            endpoints:
              - https://etcd-b:2379
            implementation: etcd
            caSecret: etcd-ca
            clientCertSecret: etcd-client
            rootPath: /multigres/us-east-1b
  databases:
    - name: postgres
      default: true
      durabilityPolicy: MULTI_CELL_AT_LEAST_2
      backup:
        type: s3
        s3:
          bucket: backups
          region: us-east-1
          endpoint: https://s3.example.com
          keyPrefix: prod/
          credentialsSecret: s3-creds
      tablegroups:
        - name: default
          default: true
          pvcDeletionPolicy:
            whenDeleted: Retain
            whenScaled: Delete
          backup:
            type: filesystem
            filesystem:
              path: /backups
              storage:
                size: 10Gi
          shards:
            - name: 0-inf
              shardTemplate: shard
              overrides:
                multiorch:
                  replicas: 1
                  cells: [us-east-1a]
                  placement:
                    tolerations:
                      - key: orch
                        operator: Exists
                initdbArgs: --data-checksums
                postgresConfigRef:
                  name: pg-extra
                  key: postgresql.conf
                postgresConfig:
                  max_connections: "300"
                pools:
                  main:
                    type: readWrite
                    cells: [us-east-1a, us-east-1b]
                    replicasPerCell: 2
                    storage:
                      size: 20Gi
                    postgres:
                      runAsUser: 999
                      runAsGroup: 999
                      resources:
                        limits:
                          memory: 2Gi
                    multipooler:
                      runAsUser: 999
                    fsGroup: 999
                    tolerations:
                      - key: db
                        operator: Exists
                    pvcDeletionPolicy:
                      whenScaled: Retain
              backup:
                type: filesystem
                filesystem:
                  path: /shard-backups
                pgbackrestTLS:
                  secretName: pgbackrest-tls
                encryption:
                  secretName: backup-key
  pvcDeletionPolicy:
    whenDeleted: Retain
    whenScaled: Retain
  observability:
    otlpEndpoint: http://otel-collector:4318
    otlpMetricsEndpoint: http://vmagent:4318/v1/metrics
    otlpProtocol: http/protobuf
    tracesExporter: otlp
    metricsExporter: none
    logsExporter: console
    metricExportInterval: "60000"
    metricsTemporality: delta
    histogramAggregation: base2_exponential_bucket_histogram
    tracesSampler: multigres_custom
    samplingConfigRef:
      name: sampling
      key: sampling-config.yaml
  backup:
    type: filesystem
    filesystem:
      path: /backups
  externalGateway:
    enabled: true
    externalIPs: [203.0.113.10, "2001:db8::1"]
    annotations:
      example.com/lb: internal
  externalAdminWeb:
    enabled: false
  topologyPruning:
    enabled: true
  durabilityPolicy: AT_LEAST_2
  postgresSuperuser: postgres
  postgresPasswordSecretRef:
    name: postgres-password
    key: password
  internalTLS:
    enabled: true
  certCommonName: db.example.com
  issuerName: letsencrypt
status:
  observedGeneration: 4
  conditions:
    - type: Available
      status: "True"
      reason: AggregatedStatus
      message: all cells and shards are ready
      lastTransitionTime: "2026-01-02T03:04:05Z"
      observedGeneration: 4
  phase: Healthy
  message: ready
  cells:
    us-east-1a:
      ready: true
      gatewayReplicas: 3
  gateway:
    externalEndpoint: 203.0.113.10
  databases:
    postgres:
      readyShards: 1
      totalShards: 1
  resolvedTemplates:
    cellTemplates: [cell]
    shardTemplates: [shard]
  images:
    updateStrategy: lazy
    effective:
      multigateway: ghcr.io/multigres/multigres:sha-66d2310
    source: mixed
    appliedRevision: 0123456789ab
    availableRevision: ba9876543210
"#;

/// Parses `text` as `T` and checks the typed value serializes back to the same JSON.
fn round_trip<T: Serialize + DeserializeOwned>(text: &str) -> T {
    let docs = common::yaml_docs(text);
    let doc = &docs[0];
    let typed: T = serde_json::from_value(doc.clone()).expect("manifest parses");
    let back = serde_json::to_value(&typed).expect("serializes");
    common::assert_no_nulls(&back, "");
    assert_eq!(
        &back, doc,
        "the manifest changes when parsed and serialized again"
    );
    typed
}

#[test]
fn an_upstream_cluster_manifest_round_trips_unchanged() {
    let cluster: MultigresCluster = round_trip(UPSTREAM_CLUSTER);
    let spec = &cluster.spec;
    assert_eq!(spec.cells.len(), 2);
    assert_eq!(spec.databases[0].tablegroups[0].shards[0].name, "0-inf");
    let overrides = spec.databases[0].tablegroups[0].shards[0]
        .overrides
        .as_ref()
        .unwrap();
    let main = &overrides.pools[&PoolName::from("main")];
    assert_eq!(main.replicas_per_cell, Some(2));
    assert_eq!(
        overrides.multiorch.as_ref().unwrap().stateless.replicas,
        Some(1),
        "the stateless fields are inlined into multiorch, as upstream does"
    );
    assert!(common::cel_errors(&common::yaml_docs(UPSTREAM_CLUSTER)[0], None).is_empty());
}

#[test]
fn child_resources_round_trip_unchanged() {
    round_trip::<Cell>(
        r#"
apiVersion: multigres.com/v1alpha1
kind: Cell
metadata: {name: upstream-us-east-1a}
spec:
  name: us-east-1a
  zoneId: use1-az1
  images: {imagePullPolicy: IfNotPresent, multigateway: ghcr.io/multigres/multigres:sha-66d2310}
  multigateway: {replicas: 1, buffer: {enabled: true}}
  globalTopoServer: {address: "upstream-global-topo:2379", rootPath: /multigres/global, implementation: etcd}
  allCells: [us-east-1a, us-east-1b]
  topologyReconciliation: {registerCell: true, prunePoolers: false}
  logLevels: {multigateway: info}
  internalTLS: {enabled: false}
status: {observedGeneration: 1, phase: Healthy, gatewayReplicas: 1, gatewayReadyReplicas: 1, gatewayServiceName: upstream-us-east-1a-multigateway}
"#,
    );
    round_trip::<TableGroup>(
        r#"
apiVersion: multigres.com/v1alpha1
kind: TableGroup
metadata: {name: upstream-postgres-default}
spec:
  databaseName: postgres
  tableGroupName: default
  default: true
  images: {multiorch: o, multipooler: p, postgres: pg}
  globalTopoServer: {address: "topo:2379", rootPath: /multigres/global, implementation: etcd}
  shards:
    - name: 0-inf
      multiorch: {cells: [a]}
      pools: {main: {type: readWrite, cells: [a], replicasPerCell: 2}}
      postgresConfig: {work_mem: 4MB}
  cellTopologyLabels: {a: {topology.k8s.aws/zone-id: use1-az1}}
  durabilityPolicy: AT_LEAST_2
  postgresSuperuser: postgres
  postgresPasswordSecretRef: {name: pw, key: password}
status: {readyShards: 1, totalShards: 1}
"#,
    );
    let shard: Shard = round_trip(
        r#"
apiVersion: multigres.com/v1alpha1
kind: Shard
metadata: {name: upstream-postgres-default-0-inf}
spec:
  databaseName: postgres
  tableGroupName: default
  shardName: 0-inf
  images: {multiorch: o, multipooler: p, postgres: pg}
  globalTopoServer: {address: "topo:2379", rootPath: /multigres/global, implementation: etcd}
  multiorch: {replicas: 1}
  pools: {main: {cells: [a], replicasPerCell: 2}}
  postgresPasswordSecretRef: {name: pw, key: password}
  replicas: 2
status:
  postgresConfig: {inProgress: false, lastAppliedAt: "2026-01-02T03:04:05Z"}
  cells: [a]
  orchReady: true
  poolsReady: true
  lastBackupTime: "2026-01-02T03:04:05Z"
  lastBackupType: incr
  podRoles: {upstream-0: PRIMARY, upstream-1: REPLICA}
  readyReplicas: 2
"#,
    );
    assert_eq!(shard.spec.replicas, Some(2));
    round_trip::<TopoServer>(
        r#"
apiVersion: multigres.com/v1alpha1
kind: TopoServer
metadata: {name: upstream-global-topo}
spec:
  etcd: {replicas: 3, rootPath: /multigres/global}
  pvcDeletionPolicy: {whenDeleted: Retain, whenScaled: Retain}
status: {clientService: upstream-global-topo, peerService: upstream-global-topo-peer}
"#,
    );
}

#[test]
fn defaults_serialize_without_nulls_or_empty_optionals() {
    let cluster = MultigresCluster::new(
        "empty",
        MultigresClusterSpec {
            postgres_password_secret_ref: multigres_api::v1alpha1::PostgresPasswordSecretRef {
                name: "pw".into(),
                key: "password".into(),
            },
            ..Default::default()
        },
    );
    let value = serde_json::to_value(&cluster).expect("serializes");
    common::assert_no_nulls(&value, "");
    assert_eq!(
        value["spec"],
        serde_json::json!({"postgresPasswordSecretRef": {"name": "pw", "key": "password"}})
    );
    for value in [
        serde_json::to_value(Cell::new("c", CellSpec::default())).unwrap(),
        serde_json::to_value(PoolSpec::default()).unwrap(),
    ] {
        common::assert_no_nulls(&value, "");
    }
    assert_eq!(
        serde_json::to_value(PoolSpec::default()).unwrap(),
        serde_json::json!({})
    );
}

#[test]
fn no_null_check_detects_nulls() {
    let result = std::panic::catch_unwind(|| {
        common::assert_no_nulls(&serde_json::json!({"a": [1, null]}), "");
    });
    assert!(result.is_err());
}
