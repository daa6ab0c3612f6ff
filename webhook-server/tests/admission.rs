//! The admission endpoints driven with AdmissionReview fixtures (`tests/fixtures/*.json`), one per
//! rule, through the real axum router. Rules that read templates or clusters read them from a
//! real local API server (`LocalCluster`), where each test works in its own namespace; rules that
//! read nothing run against a client whose server does not exist.

mod support;

use kube::api::{Api, PostParams};
use multigres_api::v1alpha1::{CellTemplate, MultigresCluster, Shard, ShardTemplate};
use serde_json::{Value, json};
use support::{control_plane, fixture, namespace, patch_of, post, router, unused_client};

const VALIDATE_CLUSTER: &str = "/validate-multigres-com-v1alpha1-multigrescluster";
const MUTATE_CLUSTER: &str = "/mutate-multigres-com-v1alpha1-multigrescluster";
const VALIDATE_CELL: &str = "/validate-multigres-com-v1alpha1-cell";

/// Posts a fixture to `path` in a fresh namespace of the shared control plane.
async fn review(path: &str, name: &str) -> Value {
    let (response, _) = review_in(path, name, |_| async {}).await;
    response
}

/// Like [`review`], running `setup` in the namespace first.
async fn review_in<F, Fut>(path: &str, name: &str, setup: F) -> (Value, String)
where
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = ()>,
{
    let cluster = control_plane().await;
    let ns = namespace(cluster, "admission").await;
    setup(ns.clone()).await;
    let response = post(&router(cluster.client().unwrap()), path, fixture(name, &ns)).await;
    (response, ns)
}

fn message(response: &Value) -> &str {
    response["status"]["message"].as_str().unwrap_or_default()
}

fn causes(response: &Value) -> Vec<String> {
    response["status"]["details"]["causes"]
        .as_array()
        .map(|causes| {
            causes
                .iter()
                .map(|c| c["field"].as_str().unwrap().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn warnings(response: &Value) -> Vec<String> {
    serde_json::from_value(response["warnings"].clone()).unwrap_or_default()
}

fn assert_denied(response: &Value, code: u16) {
    assert_eq!(response["allowed"], false, "{response:#}");
    assert_eq!(response["status"]["code"], code, "{response:#}");
}

fn assert_uid(response: &Value, name: &str) {
    let sent: Value = serde_json::from_str(&fixture(name, "x")).unwrap();
    assert_eq!(
        response["uid"], sent["request"]["uid"],
        "uid copied from the request"
    );
}

const SHARD: &str = "spec.databases[0].tablegroups[0].shards[0]";

#[tokio::test]
async fn valid_cluster_is_allowed() {
    let response = review(VALIDATE_CLUSTER, "cluster-create-valid").await;
    assert_eq!(response["allowed"], true, "{response:#}");
    assert_uid(&response, "cluster-create-valid");
    assert!(response.get("warnings").is_none(), "{response:#}");
}

/// The local control plane's Nodes carry `topology.kubernetes.io/zone=zone-a` (and `zone-b`,
/// `zone-c`): a cell pinned there gets no warning, one pinned to a zone no Node is in does.
#[tokio::test]
async fn a_cell_no_node_matches_is_allowed_with_a_warning() {
    let cluster = control_plane().await;
    let ns = namespace(cluster, "admission").await;
    let mut review: Value = serde_json::from_str(&fixture("cluster-create-valid", &ns)).unwrap();
    let nowhere = format!("nowhere-{ns}");
    review["request"]["object"]["spec"]["cells"] = json!([
        {"name": "zone-a", "zone": "zone-a"},
        {"name": "zone-b", "zone": nowhere},
    ]);
    let response = post(
        &router(cluster.client().unwrap()),
        VALIDATE_CLUSTER,
        review.to_string(),
    )
    .await;
    assert_eq!(response["allowed"], true, "{response:#}");
    assert_eq!(
        warnings(&response),
        [format!(
            "spec.cells[1].zone: no Node has the label topology.kubernetes.io/zone={nowhere}, so \
             the pods of cell \"zone-b\" stay Pending until one does"
        )]
    );
}

#[tokio::test]
async fn missing_templates_are_refused_by_field() {
    let response = review(VALIDATE_CLUSTER, "cluster-create-missing-templates").await;
    assert_denied(&response, 422);
    assert_eq!(
        causes(&response),
        [
            "spec.templateDefaults.coreTemplate",
            "spec.cells[0].cellTemplate",
            &format!("{SHARD}.shardTemplate"),
        ]
    );
    assert!(
        message(&response).starts_with(
            "3 problems: spec.templateDefaults.coreTemplate: CoreTemplate \"no-such-core\" does \
             not exist in namespace \"admission-"
        ),
        "{}",
        message(&response)
    );
}

#[tokio::test]
async fn existing_templates_are_found() {
    let (response, _) = review_in(
        VALIDATE_CLUSTER,
        "cluster-create-missing-templates",
        |ns| async move {
            let client = control_plane().await.client().unwrap();
            for (kind, name) in [
                ("CoreTemplate", "no-such-core"),
                ("CellTemplate", "no-such-cell"),
                ("ShardTemplate", "no-such-shard"),
            ] {
                let manifest = format!(
                    "apiVersion: multigres.com/v1alpha1\nkind: {kind}\nmetadata: {{name: {name}, namespace: {ns}}}\nspec: {{}}\n"
                );
                let object: kube::api::DynamicObject = serde_yaml::from_str(&manifest).unwrap();
                let resource = kube::discovery::ApiResource::from_gvk(
                    &kube::core::GroupVersionKind::gvk("multigres.com", "v1alpha1", kind),
                );
                Api::<kube::api::DynamicObject>::namespaced_with(client.clone(), &ns, &resource)
                    .create(&PostParams::default(), &object)
                    .await
                    .unwrap();
            }
        },
    )
    .await;
    assert_eq!(response["allowed"], true, "{response:#}");
}

#[tokio::test]
async fn limits_below_requests_are_refused() {
    let response = review(VALIDATE_CLUSTER, "cluster-create-limits-below-requests").await;
    assert_denied(&response, 422);
    assert_eq!(
        causes(&response),
        [
            "spec.multiadmin.spec.resources.limits.memory",
            "spec.cells[0].spec.multigateway.resources.limits.cpu",
        ]
    );
    assert!(
        message(&response).contains("limit 999m is below the request 1"),
        "{}",
        message(&response)
    );
}

#[tokio::test]
async fn malformed_storage_size_is_refused() {
    let response = review(VALIDATE_CLUSTER, "cluster-create-storage-size-invalid").await;
    assert_denied(&response, 422);
    assert_eq!(
        message(&response),
        format!(
            "{SHARD}.spec.pools[main].storage.size: \"10GB\" is not a quantity (expected a number \
             with an optional suffix such as 500m, 10Gi or 1e3); use a size such as 10Gi"
        )
    );
}

#[tokio::test]
async fn sub_byte_storage_size_is_refused() {
    let response = review(VALIDATE_CLUSTER, "cluster-create-storage-size-sub-byte").await;
    assert_denied(&response, 422);
    assert_eq!(
        message(&response),
        format!(
            "{SHARD}.spec.pools[main].storage.size: \"1m\" is not a whole number of bytes (the \
             suffix m is a thousandth); use a size such as 10Gi"
        )
    );
}

#[tokio::test]
async fn pod_labels_and_annotations_must_be_valid_metadata() {
    let response = review(VALIDATE_CLUSTER, "cluster-create-pod-metadata-invalid").await;
    assert_denied(&response, 422);
    assert_eq!(
        causes(&response),
        [
            "spec.cells[0].spec.multigateway.podAnnotations[\"My Key\"]",
            "spec.multiadmin.spec.podLabels[\"team\"]",
        ]
    );
    assert!(
        message(&response).contains(
            "value \"data platform\" is not a valid label value: at most 63 letters, digits"
        ),
        "{}",
        message(&response)
    );
}

#[tokio::test]
async fn durations_go_cannot_hold_are_refused() {
    let response = review(VALIDATE_CLUSTER, "cluster-create-duration-too-long").await;
    assert_denied(&response, 422);
    assert_eq!(
        causes(&response),
        [
            "spec.cells[0].spec.multigateway.buffer.window",
            "spec.cells[0].spec.multigateway.buffer.maxFailoverDuration",
            &format!("{SHARD}.spec.multiorch.leaderFailoverGracePeriodBase"),
        ]
    );
    assert!(
        message(&response).contains(
            "\"3000000h\" is longer than Go's longest duration (2562047h47m16.854775807s"
        ),
        "{}",
        message(&response)
    );
}

/// A cluster whose S3 repository another cluster's Shard (in another namespace) writes to is
/// refused, naming that cluster; the same cluster applied again over its own repository is not.
#[tokio::test]
async fn another_clusters_backup_repository_is_refused() {
    let cluster = control_plane().await;
    let other = namespace(cluster, "repository-owner").await;
    let mut shard: Shard =
        serde_yaml::from_str(include_str!("../../resource-handler/fixtures/shard.yaml")).unwrap();
    shard.metadata.namespace = Some(other.clone());
    shard.metadata.uid = None;
    shard.spec.backup = Some(
        serde_json::from_value(json!({"type": "s3", "s3": {"bucket": "backups",
            "region": "eu-west-1", "keyPrefix": "/repository-taken"}}))
        .unwrap(),
    );
    Api::<Shard>::namespaced(cluster.client().unwrap(), &other)
        .create(&PostParams::default(), &shard)
        .await
        .unwrap();
    let response = review(VALIDATE_CLUSTER, "cluster-create-repository-taken").await;
    assert_denied(&response, 422);
    assert_eq!(causes(&response), ["spec.backup.s3.keyPrefix"]);
    assert!(
        message(&response).contains(&format!(
            "the backup repository s3://backups/repository-taken at s3.eu-west-1.amazonaws.com \
             is MultigresCluster {other}/prod's"
        )),
        "{}",
        message(&response)
    );
    // The owner itself, applied again in the Shard's namespace, is let through.
    let own = fixture("cluster-create-repository-taken", &other).replace("\"demo\"", "\"prod\"");
    let response = post(&router(cluster.client().unwrap()), VALIDATE_CLUSTER, own).await;
    assert_eq!(response["allowed"], true, "{response:#}");
}

#[tokio::test]
async fn shared_buffers_above_the_memory_limit_are_refused() {
    let response = review(VALIDATE_CLUSTER, "cluster-create-shared-buffers-over-limit").await;
    assert_denied(&response, 422);
    assert_eq!(
        causes(&response),
        [format!("{SHARD}.spec.postgresConfig[shared_buffers]")]
    );
    assert!(
        message(&response).contains(
            "shared_buffers = 8GB needs 8192 MiB of shared memory, more than the memory limit \
             512Mi of the postgres container"
        ),
        "{}",
        message(&response)
    );
}

#[tokio::test]
async fn unsupported_durability_policy_is_refused() {
    let response = review(VALIDATE_CLUSTER, "cluster-create-durability-unsupported").await;
    assert_denied(&response, 422);
    assert_eq!(
        message(&response),
        "spec.durabilityPolicy: durability policy \"AT_LEAST_3\" is not supported; use one of \
         AT_LEAST_2, MULTI_CELL_AT_LEAST_2"
    );
}

#[tokio::test]
async fn operator_managed_postgres_parameters_are_refused() {
    let response = review(
        VALIDATE_CLUSTER,
        "cluster-create-managed-postgres-parameter",
    )
    .await;
    assert_denied(&response, 422);
    assert_eq!(
        message(&response),
        format!(
            "{SHARD}.spec.postgresConfig[port]: cannot be set: pgctld sets it on the postgres \
             command line or in its template"
        )
    );
}

#[tokio::test]
async fn kubelet_references_in_fields_reaching_container_args_are_refused() {
    let response = review(VALIDATE_CLUSTER, "cluster-create-kubelet-expansion").await;
    assert_denied(&response, 422);
    assert_eq!(
        causes(&response),
        [
            "spec.cells[0].spec.localTopoServer.external.endpoints[0]".to_owned(),
            format!("{SHARD}.spec.initdbArgs"),
            "spec.globalTopoServer.external.endpoints[1]".to_owned(),
            "spec.globalTopoServer.external.rootPath".to_owned(),
        ]
    );
    assert!(
        message(&response).contains(
            "spec.globalTopoServer.external.rootPath: must not contain \"$(\": the kubelet \
             would replace $(NAME) with the value of the container's variable NAME"
        ),
        "{}",
        message(&response)
    );
}

#[tokio::test]
async fn postgres_parameters_that_run_commands_or_load_code_are_refused() {
    let response = review(VALIDATE_CLUSTER, "cluster-create-postgres-code-execution").await;
    assert_denied(&response, 422);
    assert_eq!(
        causes(&response),
        [
            "archive_command",
            "include_dir",
            "shared_preload_libraries",
            "ssl_passphrase_command"
        ]
        .map(|p| format!("{SHARD}.spec.postgresConfig[{p}]"))
    );
    let text = message(&response);
    assert!(
        text.contains(&format!(
            "{SHARD}.spec.postgresConfig[archive_command]: cannot be set: runs a shell command \
             as the postgres user"
        )),
        "{text}"
    );
    assert!(
        text.contains("\"$libdir/evil\" is not a library the pgctld image ships"),
        "{text}"
    );
}

#[tokio::test]
async fn unknown_postgres_parameters_and_mistyped_values_are_refused() {
    let response = review(
        VALIDATE_CLUSTER,
        "cluster-create-unknown-postgres-parameter",
    )
    .await;
    assert_denied(&response, 422);
    assert_eq!(
        message(&response),
        format!(
            "2 problems: {SHARD}.spec.postgresConfig[shared_bufers]: unknown PostgreSQL 17 \
             parameter; did you mean `shared_buffers`?; {SHARD}.spec.postgresConfig[work_mem]: \
             expects an integer, optionally with a unit such as 64MB or 10s, got \"lots\""
        )
    );
}

#[tokio::test]
async fn invalid_external_ip_is_refused() {
    let response = review(VALIDATE_CLUSTER, "cluster-create-external-ip-invalid").await;
    assert_denied(&response, 422);
    assert_eq!(
        message(&response),
        "spec.externalGateway.externalIPs[0]: \"192.0.2.300\" is not an IPv4 or IPv6 address"
    );
}

#[tokio::test]
async fn buffer_window_longer_than_failover_is_refused() {
    let response = review(VALIDATE_CLUSTER, "cluster-create-buffer-window-too-long").await;
    assert_denied(&response, 422);
    assert_eq!(
        causes(&response),
        ["spec.cells[0].spec.multigateway.buffer.window"]
    );
    assert!(
        message(&response).contains("buffer window (1m) must not exceed maxFailoverDuration (30s)")
    );
}

#[tokio::test]
async fn pool_in_an_unknown_cell_is_refused() {
    let response = review(VALIDATE_CLUSTER, "cluster-create-unknown-pool-cell").await;
    assert_denied(&response, 422);
    assert_eq!(
        causes(&response),
        [format!("{SHARD}.spec.pools[main].cells")]
    );
    assert!(message(&response).contains("cells [\"zone-z\"] that are not in spec.cells"));
}

#[tokio::test]
async fn mismatched_pgdata_owners_are_refused() {
    let response = review(VALIDATE_CLUSTER, "cluster-create-run-as-user-mismatch").await;
    assert_denied(&response, 422);
    assert_eq!(
        causes(&response),
        [format!("{SHARD}.spec.pools[main].postgres.runAsUser")]
    );
}

#[tokio::test]
async fn cluster_without_cells_is_refused() {
    let response = review(VALIDATE_CLUSTER, "cluster-create-no-cells").await;
    assert_denied(&response, 422);
    assert_eq!(causes(&response), ["spec.cells"]);
}

#[tokio::test]
async fn risky_settings_are_allowed_with_warnings() {
    let response = review(VALIDATE_CLUSTER, "cluster-create-risky-settings").await;
    assert_eq!(response["allowed"], true, "{response:#}");
    let warnings = warnings(&response);
    assert_eq!(warnings.len(), 3, "{warnings:#?}");
    assert!(warnings[0].starts_with("spec.pvcDeletionPolicy.whenDeleted: is Delete"));
    assert!(
        warnings[1]
            .starts_with("spec.globalTopoServer.etcd.replicas: the global etcd has 1 member")
    );
    assert!(
        warnings[2].contains("durability policy AT_LEAST_2 needs 2: no primary can be elected")
    );
}

#[tokio::test]
async fn removed_cell_is_refused() {
    let response = review(VALIDATE_CLUSTER, "cluster-update-cell-removed").await;
    assert_denied(&response, 422);
    assert!(
        message(&response).starts_with(
            "spec.cells: cell \"zone-a\" cannot be removed or renamed: cells are append-only"
        ),
        "{}",
        message(&response)
    );
}

#[tokio::test]
async fn changed_zone_is_refused() {
    let response = review(VALIDATE_CLUSTER, "cluster-update-zone-changed").await;
    assert_denied(&response, 422);
    assert_eq!(
        message(&response),
        "spec.cells[1].zoneId: zoneId of cell \"zone-b\" cannot change after creation (was \
         \"zone-b\", now \"zone-c\"): its pods and volumes are pinned there; add a new cell instead"
    );
}

#[tokio::test]
async fn changed_etcd_member_count_is_refused() {
    let response = review(VALIDATE_CLUSTER, "cluster-update-etcd-replicas-changed").await;
    assert_denied(&response, 422);
    assert_eq!(
        message(&response),
        "spec.globalTopoServer.etcd.replicas: the global etcd cannot change its member count \
         after creation (3 → 5): etcd is bootstrapped with a static member list; keep 3"
    );
}

#[tokio::test]
async fn shrunk_and_removed_pools_are_refused_together() {
    let response = review(VALIDATE_CLUSTER, "cluster-update-pools-shrunk-and-removed").await;
    assert_denied(&response, 422);
    assert_eq!(
        causes(&response),
        [
            format!("{SHARD}.spec.pools[main].storage.size"),
            format!("{SHARD} pools"),
        ]
    );
    assert!(message(&response).contains("cannot shrink from 20Gi to 10Gi"));
    assert!(
        message(&response)
            .contains("pool \"reporting\" of shard postgres/default/0-inf cannot be removed")
    );
}

#[tokio::test]
async fn removed_backup_block_is_refused() {
    let response = review(VALIDATE_CLUSTER, "cluster-update-backup-removed").await;
    assert_denied(&response, 422);
    assert_eq!(
        causes(&response),
        [
            "spec.backup.filesystem.storage.size (default)",
            "spec.backup.encryption (default)"
        ]
    );
    assert!(message(&response).contains("(was Secret \"backup-keys\", now none)"));
}

#[tokio::test]
async fn growing_a_cluster_is_allowed() {
    let response = review(VALIDATE_CLUSTER, "cluster-update-grown").await;
    assert_eq!(response["allowed"], true, "{response:#}");
}

#[tokio::test]
async fn defaults_are_patched_and_default_templates_promoted() {
    let (response, _) = review_in(MUTATE_CLUSTER, "cluster-mutate-defaults", |ns| async move {
        let client = control_plane().await.client().unwrap();
        let template: CellTemplate = serde_json::from_value(json!({
            "apiVersion": "multigres.com/v1alpha1", "kind": "CellTemplate",
            "metadata": {"name": "default"}, "spec": {}
        }))
        .unwrap();
        Api::<CellTemplate>::namespaced(client, &ns)
            .create(&PostParams::default(), &template)
            .await
            .unwrap();
    })
    .await;
    assert_eq!(response["allowed"], true, "{response:#}");
    assert_eq!(response["patchType"], "JSONPatch");
    let patch = patch_of(&response).expect("a patch");
    let mut object: Value =
        serde_json::from_str(&fixture("cluster-mutate-defaults", "ns")).unwrap();
    let mut object = object["request"]["object"].take();
    let before = object.clone();
    let patch: json_patch::Patch = serde_json::from_value(patch).unwrap();
    json_patch::patch(&mut object, &patch).unwrap();
    let mut expected = before;
    let spec = expected["spec"].as_object_mut().unwrap();
    spec.insert("images".into(), json!({"imagePullPolicy": "IfNotPresent"}));
    spec.insert(
        "logLevels".into(),
        json!({"pgctld": "info", "multipooler": "info", "multiorch": "debug", "multiadmin": "info", "multigateway": "info"}),
    );
    spec.insert("topologyPruning".into(), json!({"enabled": true}));
    spec.insert("durabilityPolicy".into(), json!("AT_LEAST_2"));
    spec.insert(
        "internalTLS".into(),
        json!({"enabled": true, "topology": true}),
    );
    spec.insert(
        "templateDefaults".into(),
        json!({"cellTemplate": "default"}),
    );
    spec.insert(
        "observability".into(),
        json!({"postgresExporter": {"enabled": true}}),
    );
    assert_eq!(object, expected);
}

#[tokio::test]
async fn complete_cluster_gets_no_patch() {
    let response = review(MUTATE_CLUSTER, "cluster-mutate-complete").await;
    assert_eq!(response["allowed"], true, "{response:#}");
    assert!(response.get("patch").is_none(), "{response:#}");
}

#[tokio::test]
async fn invalid_template_is_refused() {
    let response = review(
        "/validate-multigres-com-v1alpha1-shardtemplate",
        "shardtemplate-create-invalid",
    )
    .await;
    assert_denied(&response, 422);
    assert_eq!(
        causes(&response),
        [
            "spec.pools[main].storage.size",
            "spec.pools[main].postgres.resources.limits.memory",
            "spec.postgresConfig[wal_level]",
        ]
    );
}

#[tokio::test]
async fn templates_without_a_spec_are_allowed_as_empty_templates() {
    // A template being created is checked against the clusters of its namespace (none here).
    let router = router(control_plane().await.client().unwrap());
    for (kind, resource) in [
        ("CoreTemplate", "coretemplate"),
        ("CellTemplate", "celltemplate"),
        ("ShardTemplate", "shardtemplate"),
    ] {
        let mut review: Value =
            serde_json::from_str(&fixture("shardtemplate-create-invalid", "ns")).unwrap();
        let request = &mut review["request"];
        for field in ["kind", "requestKind"] {
            request[field]["kind"] = json!(kind);
        }
        for field in ["resource", "requestResource"] {
            request[field]["resource"] = json!(format!("{resource}s"));
        }
        request["object"]["kind"] = json!(kind);
        request["object"].as_object_mut().unwrap().remove("spec");
        let path = format!("/validate-multigres-com-v1alpha1-{resource}");
        let response = post(&router, &path, review.to_string()).await;
        assert_eq!(response["allowed"], true, "{kind}: {response:#}");
    }
}

/// Creates a MultigresCluster from a spec (schema and CEL checked by the API server).
async fn create_cluster(ns: &str, name: &str, spec: Value) {
    let client = control_plane().await.client().unwrap();
    let cluster: MultigresCluster = serde_json::from_value(json!({
        "apiVersion": "multigres.com/v1alpha1", "kind": "MultigresCluster",
        "metadata": {"name": name}, "spec": spec,
    }))
    .unwrap();
    Api::<MultigresCluster>::namespaced(client, ns)
        .create(&PostParams::default(), &cluster)
        .await
        .unwrap_or_else(|e| panic!("creating cluster {name}: {e}"));
}

#[tokio::test]
async fn template_in_use_cannot_be_deleted() {
    let path = "/validate-multigres-com-v1alpha1-celltemplate";
    let (response, _) =
        review_in(path, "celltemplate-delete", |ns| async move {
            let pw = json!({"name": "pw", "key": "password"});
            create_cluster(&ns, "explicit", json!({
            "postgresPasswordSecretRef": pw,
            "cells": [{"name": "zone-a", "zoneId": "zone-a", "cellTemplate": "shared-cell"}],
        }))
        .await;
            create_cluster(
                &ns,
                "by-default",
                json!({
                    "postgresPasswordSecretRef": pw,
                    "templateDefaults": {"cellTemplate": "shared-cell"},
                    "cells": [{"name": "zone-a", "zoneId": "zone-a"}],
                }),
            )
            .await;
            create_cluster(
                &ns,
                "unrelated",
                json!({
                    "postgresPasswordSecretRef": pw,
                    "cells": [{"name": "zone-a", "zoneId": "zone-a", "cellTemplate": "other"}],
                }),
            )
            .await;
        })
        .await;
    assert_denied(&response, 409);
    assert_eq!(
        message(&response),
        "2 problems: MultigresCluster \"by-default\": uses CellTemplate \"shared-cell\" through \
         spec.templateDefaults.cellTemplate; change those references (or delete the cluster) \
         before deleting the template; MultigresCluster \"explicit\": uses CellTemplate \
         \"shared-cell\" through spec.cells[0].cellTemplate; change those references (or delete \
         the cluster) before deleting the template"
    );
}

#[tokio::test]
async fn unused_template_can_be_deleted() {
    let response = review(
        "/validate-multigres-com-v1alpha1-celltemplate",
        "celltemplate-delete",
    )
    .await;
    assert_eq!(response["allowed"], true, "{response:#}");
}

#[tokio::test]
async fn template_edit_that_shrinks_a_users_volume_is_refused() {
    let path = "/validate-multigres-com-v1alpha1-shardtemplate";
    let (response, _) = review_in(path, "shardtemplate-update-shrinks-pool", |ns| async move {
        let client = control_plane().await.client().unwrap();
        let template: ShardTemplate = serde_json::from_value(json!({
            "apiVersion": "multigres.com/v1alpha1", "kind": "ShardTemplate",
            "metadata": {"name": "shared-shard"},
            "spec": {"pools": {"main": {"storage": {"size": "8Gi"}}}}
        }))
        .unwrap();
        Api::<ShardTemplate>::namespaced(client, &ns)
            .create(&PostParams::default(), &template)
            .await
            .unwrap();
        create_cluster(
            &ns,
            "user",
            json!({
                "postgresPasswordSecretRef": {"name": "pw", "key": "password"},
                "templateDefaults": {"shardTemplate": "shared-shard"},
                "cells": [{"name": "zone-a", "zoneId": "zone-a"}],
            }),
        )
        .await;
    })
    .await;
    assert_denied(&response, 422);
    assert_eq!(
        message(&response),
        "ShardTemplate \"shared-shard\" spec.pools[main].storage.size: the data volume of pool \
         \"main\" cannot shrink from 8Gi to 1Gi: PersistentVolumeClaims can grow but never \
         shrink; keep at least 8Gi (in MultigresCluster \"user\", which uses this ShardTemplate \
         through spec.templateDefaults.shardTemplate)"
    );
}

#[tokio::test]
async fn children_refuse_manual_edits() {
    let router = router(unused_client());
    let ns = "child-ns";
    let response = post(&router, VALIDATE_CELL, fixture("cell-update-by-user", ns)).await;
    assert_denied(&response, 403);
    assert_eq!(
        message(&response),
        "metadata: Cell \"demo-zone-a\" is managed by the operator and cannot be changed by \
         \"jane@example.com\"; edit MultigresCluster \"demo\" instead"
    );
    let response = post(
        &router,
        VALIDATE_CELL,
        fixture("cell-update-by-operator", ns),
    )
    .await;
    assert_eq!(response["allowed"], true, "{response:#}");
    let response = post(
        &router,
        VALIDATE_CELL,
        fixture("cell-delete-by-garbage-collector", ns),
    )
    .await;
    assert_eq!(response["allowed"], true, "{response:#}");
    let response = post(
        &router,
        VALIDATE_CELL,
        fixture("cell-create-by-garbage-collector", ns),
    )
    .await;
    assert_denied(&response, 403);
}

#[tokio::test]
async fn unreadable_requests_are_answered_invalid_not_with_http_errors() {
    let router = router(unused_client());
    let response = post(&router, VALIDATE_CELL, "{not json".to_owned()).await;
    assert_eq!(response["allowed"], false);
    assert_eq!(response["status"]["code"], 400);
    assert!(
        message(&response).starts_with("the body is not an admission.k8s.io/v1 AdmissionReview"),
        "{response:#}"
    );
    let response = post(
        &router,
        VALIDATE_CELL,
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).to_string(),
    )
    .await;
    assert_eq!(message(&response), "the AdmissionReview carries no request");

    // A request whose object is not a MultigresCluster at all.
    let mut review: Value = serde_json::from_str(&fixture("cluster-create-valid", "ns")).unwrap();
    review["request"]["object"]["spec"] = json!({"cells": "zone-a"});
    let response = post(&router, VALIDATE_CLUSTER, review.to_string()).await;
    assert_eq!(response["allowed"], false);
    assert_eq!(response["uid"], review["request"]["uid"]);
    assert!(
        message(&response).starts_with("the object cannot be read"),
        "{response:#}"
    );
}

#[tokio::test]
async fn unreachable_api_server_fails_closed() {
    let router = router(unused_client());
    let response = post(
        &router,
        VALIDATE_CLUSTER,
        fixture("cluster-create-valid", "ns"),
    )
    .await;
    assert_eq!(response["allowed"], false);
    assert_eq!(response["status"]["code"], 500);
    assert!(
        message(&response).starts_with("cannot read CoreTemplate \"default\" in namespace \"ns\""),
        "{response:#}"
    );
}

#[tokio::test]
async fn metadata_only_updates_and_deletions_are_not_rechecked() {
    // Both clusters name templates that do not exist; neither update touches the spec in a way
    // that needs checking, so nothing is read (the client points nowhere).
    let router = router(unused_client());
    for name in [
        "cluster-update-metadata-only",
        "cluster-update-being-deleted",
    ] {
        let response = post(&router, VALIDATE_CLUSTER, fixture(name, "ns")).await;
        assert_eq!(response["allowed"], true, "{name}: {response:#}");
    }
    let response = post(
        &router,
        "/validate-multigres-com-v1alpha1-celltemplate",
        fixture("celltemplate-delete-by-namespace-controller", "ns"),
    )
    .await;
    assert_eq!(response["allowed"], true, "{response:#}");
}

#[tokio::test]
async fn a_backup_request_annotation_is_checked_on_a_metadata_only_update() {
    // `kubectl annotate` changes nothing but the annotation; the id is checked all the same,
    // and nothing else is read (the client points nowhere).
    let router = router(unused_client());
    let mut review: Value =
        serde_json::from_str(&fixture("cluster-update-metadata-only", "ns")).unwrap();
    annotate(
        &mut review["request"],
        "multigres.com/backup-request",
        "20261204T221500Z",
    );
    let response = post(&router, VALIDATE_CLUSTER, review.to_string()).await;
    assert_eq!(response["allowed"], true, "{response:#}");
    annotate(
        &mut review["request"],
        "multigres.com/backup-request",
        "before the migration",
    );
    let response = post(&router, VALIDATE_CLUSTER, review.to_string()).await;
    assert_denied(&response, 422);
    assert_eq!(
        causes(&response),
        ["metadata.annotations[multigres.com/backup-request]"]
    );
    assert!(
        message(&response).contains("is not a backup request id: use 1 to 63 letters"),
        "{response:#}"
    );
}

#[tokio::test]
async fn the_switch_annotations_are_checked_on_a_metadata_only_update() {
    let router = router(unused_client());
    let mut review: Value =
        serde_json::from_str(&fixture("cluster-update-metadata-only", "ns")).unwrap();
    annotate(&mut review["request"], "multigres.com/paused", "true");
    let response = post(&router, VALIDATE_CLUSTER, review.to_string()).await;
    assert_eq!(response["allowed"], true, "{response:#}");
    annotate(&mut review["request"], "multigres.com/paused", "yes");
    let response = post(&router, VALIDATE_CLUSTER, review.to_string()).await;
    assert_denied(&response, 422);
    assert_eq!(
        causes(&response),
        ["metadata.annotations[multigres.com/paused]"]
    );
    annotate(&mut review["request"], "multigres.com/paused", "true");
    annotate(
        &mut review["request"],
        "multigres.com/restart-policy",
        "manual",
    );
    let response = post(&router, VALIDATE_CLUSTER, review.to_string()).await;
    assert_denied(&response, 422);
    assert!(
        message(&response).contains("\"manual\" is not allowed: \"supervised\""),
        "{response:#}"
    );
}

#[tokio::test]
async fn changed_topology_tls_is_refused() {
    let response = review(VALIDATE_CLUSTER, "cluster-update-topology-tls-changed").await;
    assert_denied(&response, 422);
    assert_eq!(causes(&response), ["spec.internalTLS.topology"]);
    assert!(
        message(&response).contains("cannot change from true to false")
            && message(&response).contains("set it back to true"),
        "{response:#}"
    );
}

#[tokio::test]
async fn topology_tls_with_an_external_etcd_is_refused() {
    let response = review(VALIDATE_CLUSTER, "cluster-create-topology-tls-external").await;
    assert_denied(&response, 422);
    assert_eq!(causes(&response), ["spec.internalTLS.topology"]);
    assert!(
        message(&response).contains("spec.globalTopoServer.external is external"),
        "{response:#}"
    );
}

/// Posts fixture `name`, changed by `change`, to `path` in a fresh namespace.
async fn review_changed(path: &str, name: &str, change: impl FnOnce(&mut Value)) -> Value {
    let cluster = control_plane().await;
    let ns = namespace(cluster, "admission").await;
    let mut review: Value = serde_json::from_str(&fixture(name, &ns)).unwrap();
    change(&mut review["request"]);
    post(&router(cluster.client().unwrap()), path, review.to_string()).await
}

fn annotate(request: &mut Value, key: &str, value: &str) {
    request["object"]["metadata"]["annotations"] = json!({ key: value });
}

#[tokio::test]
async fn switching_a_managed_topology_to_external_needs_confirmation() {
    let response = review(VALIDATE_CLUSTER, "cluster-update-topology-external").await;
    assert_denied(&response, 422);
    assert_eq!(causes(&response), ["spec.globalTopoServer"]);
    assert_eq!(
        message(&response),
        "spec.globalTopoServer: switching the global topology from the managed etcd to an \
         external one deletes TopoServer \"demo-global-topo\" with the topology it holds (every \
         pooler record and the topology history) and its etcd volumes, as its \
         pvcDeletionPolicy.whenDeleted is Delete; to go ahead, confirm on the MultigresCluster \
         with the annotation multigres.com/confirm-delete-topology: \"demo-global-topo\" \
         (docs/operations.md, \"Changes that delete data\")"
    );
    let confirmed = review_changed(
        VALIDATE_CLUSTER,
        "cluster-update-topology-external",
        |request| {
            annotate(
                request,
                "multigres.com/confirm-delete-topology",
                "demo-global-topo",
            )
        },
    )
    .await;
    assert_eq!(confirmed["allowed"], true, "{confirmed:#}");
    assert!(
        warnings(&confirmed).iter().any(|w| w.starts_with(
            "spec.globalTopoServer: switching the global topology from the managed etcd to an \
             external one deletes TopoServer \"demo-global-topo\""
        ) && w
            .ends_with("(confirmed by annotation multigres.com/confirm-delete-topology)")),
        "{confirmed:#}"
    );
}

#[tokio::test]
async fn removing_a_table_group_needs_confirmation() {
    let response = review(VALIDATE_CLUSTER, "cluster-update-tablegroup-removed").await;
    assert_denied(&response, 422);
    assert_eq!(causes(&response), ["spec.databases[0].tablegroups"]);
    assert!(
        message(&response).starts_with(
            "spec.databases[0].tablegroups: removing or renaming table group \"orders\" of \
             database \"postgres\" deletes TableGroup \"demo-postgres-orders\", its Shards and \
             their pool StatefulSets (every pod of them), and their data volumes, as whenDeleted \
             is Delete (a filesystem backup volume is kept); to go ahead, confirm on the \
             MultigresCluster with the annotation multigres.com/confirm-delete-tablegroups: \
             \"demo-postgres-orders\""
        ),
        "{}",
        message(&response)
    );
    // Naming another table group confirms nothing.
    let wrong = review_changed(
        VALIDATE_CLUSTER,
        "cluster-update-tablegroup-removed",
        |request| {
            annotate(
                request,
                "multigres.com/confirm-delete-tablegroups",
                "demo-postgres-other",
            )
        },
    )
    .await;
    assert_denied(&wrong, 422);
    let confirmed = review_changed(
        VALIDATE_CLUSTER,
        "cluster-update-tablegroup-removed",
        |request| {
            annotate(
                request,
                "multigres.com/confirm-delete-tablegroups",
                "demo-postgres-orders",
            )
        },
    )
    .await;
    assert_eq!(confirmed["allowed"], true, "{confirmed:#}");
    assert!(
        warnings(&confirmed)
            .iter()
            .any(|w| w.contains("deletes TableGroup \"demo-postgres-orders\"")),
        "{confirmed:#}"
    );
}

#[tokio::test]
async fn confirming_backup_deletion_warns_which_volumes_go_with_the_cluster() {
    let response = review_changed(VALIDATE_CLUSTER, "cluster-create-valid", |request| {
        let name = request["object"]["metadata"]["name"]
            .as_str()
            .unwrap()
            .to_owned();
        annotate(request, "multigres.com/confirm-delete-backups", &name);
        request["object"]["spec"]["pvcDeletionPolicy"] = json!({"whenDeleted": "Delete"});
    })
    .await;
    assert_eq!(response["allowed"], true, "{response:#}");
    let warnings = warnings(&response);
    assert!(
        warnings.iter().any(|w| w.starts_with(
            "spec.pvcDeletionPolicy.whenDeleted: is Delete: deleting the cluster (or removing \
             this component) deletes its pool and etcd PersistentVolumeClaims"
        )),
        "{warnings:?}"
    );
    assert!(
        warnings.iter().any(|w| w.starts_with(
            "metadata.annotations[multigres.com/confirm-delete-backups]: deleting this cluster \
             deletes the filesystem backup volumes of shards postgres/default/0-inf with it"
        )),
        "{warnings:?}"
    );
}

#[tokio::test]
async fn a_default_template_created_after_a_cluster_cannot_remove_its_pools() {
    let path = "/validate-multigres-com-v1alpha1-shardtemplate";
    let older = |ns: String| async move {
        create_cluster(
            &ns,
            "older",
            json!({
                "postgresPasswordSecretRef": {"name": "pw", "key": "password"},
                "cells": [{"name": "zone-a", "zoneId": "zone-a"}],
            }),
        )
        .await;
    };
    let (response, _) = review_in(path, "shardtemplate-create-default-drops-pools", older).await;
    assert_denied(&response, 422);
    assert_eq!(
        causes(&response),
        ["shard postgres/default/0-inf (implicit) pools"]
    );
    assert!(
        message(&response).starts_with(
            "shard postgres/default/0-inf (implicit) pools: pool \"default\" of shard \
             postgres/default/0-inf cannot be removed or renamed"
        ) && message(&response).ends_with(
            "(in MultigresCluster \"older\", which would use this ShardTemplate through \
             spec.databases (unset: the default shard) (names no shardTemplate, so it uses the \
             namespace default))"
        ),
        "{}",
        message(&response)
    );

    // The same template keeping the cluster's pool is created.
    let cluster = control_plane().await;
    let ns = namespace(cluster, "admission").await;
    older(ns.clone()).await;
    let mut review: Value =
        serde_json::from_str(&fixture("shardtemplate-create-default-drops-pools", &ns)).unwrap();
    review["request"]["object"]["spec"]["pools"]["default"] = json!({"cells": ["zone-a"]});
    let response = post(&router(cluster.client().unwrap()), path, review.to_string()).await;
    assert_eq!(response["allowed"], true, "{response:#}");
}
