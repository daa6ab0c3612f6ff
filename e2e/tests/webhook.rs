//! The webhook-server binary behind the real API server: it runs as its own ServiceAccount with
//! the shipped RBAC (`deploy/webhook/rbac.yaml`), is registered with the shipped webhook
//! configurations (`deploy/webhook/webhook-configurations.yaml`) rewritten to
//! `url: https://127.0.0.1:<port>/...` and scoped to the test namespace, and sets their caBundle
//! itself. Then the API server refuses a cluster naming a missing template, stores the defaults
//! the webhook adds, refuses deleting a template in use, and refuses manual edits of children
//! while the operator's own ServiceAccount may make them, and warns about a cell no Node matches
//! (it lists Nodes under the shipped RBAC).

use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use multigres_api::v1alpha1::{Cell, CellTemplate, LogLevel, MultigresCluster};
use multigres_e2e::cluster::{ClusterError, LocalCluster};
use multigres_e2e::harness::{
    self, WebhookServer, fresh_namespace, only_namespace, webhook_registrations,
};
use multigres_e2e::manifest::{self, Mode};
use serde_json::{Value, json};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

const WAIT: Duration = Duration::from_secs(60);
const OPERATOR_ACCOUNT: &str = "operator";
const MUTATING: &str = "multigres-operator-mutating-webhook-configuration";
const VALIDATING: &str = "multigres-operator-validating-webhook-configuration";

async fn cluster() -> &'static LocalCluster {
    multigres_e2e::harness::control_plane().await
}

/// Retries `check` until it returns `Ok`, for at most `WAIT`.
async fn eventually<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    harness::eventually(what, WAIT, check).await
}

async fn apply(client: &Client, namespace: Option<&str>, object: Value) {
    let object: DynamicObject = serde_json::from_value(object).unwrap();
    manifest::apply(client, &object, namespace, Mode::Apply)
        .await
        .unwrap_or_else(|e| panic!("applying {:?}: {e}", object.metadata.name));
}

/// The webhook-server's gRPC health status.
async fn health(webhook: &WebhookServer) -> Result<ServingStatus, String> {
    let address = webhook.process.grpc_addr();
    let channel = tonic::transport::Channel::from_shared(format!("http://{address}"))
        .unwrap()
        .connect()
        .await
        .map_err(|e| e.to_string())?;
    HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .map(|r| r.into_inner().status())
        .map_err(|e| e.to_string())
}

fn cluster_manifest(name: &str, spec: Value) -> MultigresCluster {
    serde_json::from_value(json!({
        "apiVersion": "multigres.com/v1alpha1", "kind": "MultigresCluster",
        "metadata": {"name": name}, "spec": spec,
    }))
    .unwrap()
}

fn refusal(result: Result<impl std::fmt::Debug, kube::Error>) -> String {
    match result {
        Err(kube::Error::Api(status)) => status.message,
        other => panic!("expected the API server to refuse, got {other:?}"),
    }
}

#[tokio::test]
async fn the_api_server_enforces_the_webhook() {
    let cluster = cluster().await;
    let system = fresh_namespace(cluster, "webhook-system").await;
    let ns = fresh_namespace(cluster, "webhook-e2e").await;
    let admin = cluster.client().unwrap();

    // The operator's ServiceAccount, allowed by RBAC to write Cells in the test namespace.
    let operator_kubeconfig = cluster
        .service_account_kubeconfig(&ns, OPERATOR_ACCOUNT, Duration::from_secs(3600))
        .await
        .unwrap();
    apply(
        &admin,
        Some(&ns),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "cells"},
            "rules": [{"apiGroups": ["multigres.com"], "resources": ["cells"],
                       "verbs": ["get", "create", "update", "patch", "delete"]}],
        }),
    )
    .await;
    apply(
        &admin,
        Some(&ns),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "operator-cells"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "cells"},
            "subjects": [{"kind": "ServiceAccount", "name": OPERATOR_ACCOUNT, "namespace": ns}],
        }),
    )
    .await;

    let kubeconfig = harness::grant_webhook_rbac(cluster, &system, None).await;
    let operators = format!("{ns}:{OPERATOR_ACCOUNT}");
    let webhook = WebhookServer::spawn(&kubeconfig, &system, &operators, None).await;
    let started = Instant::now();
    for registration in webhook_registrations(webhook.address, only_namespace(&ns), None) {
        manifest::apply(&admin, &registration, None, Mode::Apply)
            .await
            .unwrap();
    }

    // The webhook generated its certificate, reports SERVING, and set the caBundle itself.
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), &system);
    let secret = eventually("the certificate Secret", || async {
        secrets
            .get_opt("multigres-webhook-certs")
            .await
            .map_err(|e| e.to_string())?
            .ok_or("absent".to_owned())
    })
    .await;
    let ca = secret.data.as_ref().unwrap()["ca.crt"].0.clone();
    eventually("SERVING", || async {
        match health(&webhook).await? {
            ServingStatus::Serving => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(admin.clone());
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(admin.clone());
    eventually("every caBundle set", || async {
        let m = mutating.get(MUTATING).await.map_err(|e| e.to_string())?;
        let v = validating
            .get(VALIDATING)
            .await
            .map_err(|e| e.to_string())?;
        let bundles: Vec<Option<Vec<u8>>> = m
            .webhooks
            .iter()
            .flatten()
            .map(|w| w.client_config.ca_bundle.clone().map(|b| b.0))
            .chain(
                v.webhooks
                    .iter()
                    .flatten()
                    .map(|w| w.client_config.ca_bundle.clone().map(|b| b.0)),
            )
            .collect();
        if bundles.len() == 9 && bundles.iter().all(|b| b.as_ref() == Some(&ca)) {
            Ok(())
        } else {
            Err(format!(
                "{} webhooks, caBundles set: {}",
                bundles.len(),
                bundles.iter().filter(|b| b.is_some()).count()
            ))
        }
    })
    .await;
    println!(
        "webhook-server on {}: certificate generated, caBundle patched into 9 webhooks and SERVING {:.2}s after registration",
        webhook.address,
        started.elapsed().as_secs_f64()
    );

    // 1. A cluster naming a template that does not exist is refused with the webhook's message.
    let clusters: Api<MultigresCluster> = Api::namespaced(admin.clone(), &ns);
    let pw = json!({"name": "demo-password", "key": "password"});
    let broken = cluster_manifest(
        "broken",
        json!({
            "postgresPasswordSecretRef": pw,
            "cells": [{"name": "zone-a", "zoneId": "zone-a", "cellTemplate": "missing"}],
        }),
    );
    let message = refusal(clusters.create(&PostParams::default(), &broken).await);
    assert_eq!(
        message,
        format!(
            "admission webhook \"vmultigrescluster.multigres.com\" denied the request: \
             spec.cells[0].cellTemplate: CellTemplate \"missing\" does not exist in namespace \
             \"{ns}\"; create it first or change the reference"
        )
    );

    // 2. The defaults the mutating webhook adds are stored, including the promotion of the
    //    namespace's `default` CellTemplate; pvcDeletionPolicy stays unset.
    let templates: Api<CellTemplate> = Api::namespaced(admin.clone(), &ns);
    let default_template: CellTemplate = serde_json::from_value(json!({
        "apiVersion": "multigres.com/v1alpha1", "kind": "CellTemplate",
        "metadata": {"name": "default"}, "spec": {"multigateway": {"replicas": 2}},
    }))
    .unwrap();
    templates
        .create(&PostParams::default(), &default_template)
        .await
        .unwrap();
    let demo = cluster_manifest(
        "demo",
        json!({
            "postgresPasswordSecretRef": pw,
            "cells": [{"name": "zone-a", "zoneId": "zone-a"}],
        }),
    );
    let stored = clusters
        .create(&PostParams::default(), &demo)
        .await
        .unwrap();
    let spec = &stored.spec;
    assert_eq!(
        spec.images.as_ref().and_then(|i| i.image_pull_policy),
        Some(multigres_api::v1alpha1::ImagePullPolicy::IfNotPresent)
    );
    let levels = spec.log_levels.clone().unwrap();
    for level in [
        levels.pgctld,
        levels.multipooler,
        levels.multiorch,
        levels.multiadmin,
        levels.multigateway,
    ] {
        assert_eq!(level, Some(LogLevel::Info));
    }
    assert_eq!(
        spec.topology_pruning.as_ref().and_then(|p| p.enabled),
        Some(true)
    );
    assert_eq!(spec.durability_policy.as_deref(), Some("AT_LEAST_2"));
    assert_eq!(
        spec.template_defaults
            .as_ref()
            .and_then(|t| t.cell_template.as_ref())
            .map(|t| t.as_str()),
        Some("default")
    );
    assert!(spec.pvc_deletion_policy.is_none(), "{spec:?}");
    let internal_tls = |c: &MultigresCluster| c.spec.internal_tls.as_ref().and_then(|t| t.enabled);
    assert_eq!(
        internal_tls(&stored),
        Some(true),
        "internal mTLS on for a new cluster"
    );
    // An update that drops the field (as an apply that no longer lists it does) keeps the
    // stored value: the webhook never turns internal TLS on or off for a running cluster.
    let dropped = json!({"spec": {"internalTLS": null}});
    let patched = clusters
        .patch("demo", &PatchParams::default(), &Patch::Merge(&dropped))
        .await
        .unwrap();
    assert_eq!(internal_tls(&patched), Some(true), "{:?}", patched.spec);

    // 3. The template the cluster uses cannot be deleted; an unused one can.
    let message = refusal(templates.delete("default", &DeleteParams::default()).await);
    assert_eq!(
        message,
        "admission webhook \"vcelltemplate.multigres.com\" denied the request: \
         MultigresCluster \"demo\": uses CellTemplate \"default\" through \
         spec.templateDefaults.cellTemplate; change those references (or delete the cluster) \
         before deleting the template"
    );
    let unused: CellTemplate = serde_json::from_value(json!({
        "apiVersion": "multigres.com/v1alpha1", "kind": "CellTemplate",
        "metadata": {"name": "unused"}, "spec": {},
    }))
    .unwrap();
    templates
        .create(&PostParams::default(), &unused)
        .await
        .unwrap();
    templates
        .delete("unused", &DeleteParams::default())
        .await
        .unwrap();

    // 4. Children: the operator's ServiceAccount may write them, anyone else is refused.
    let as_operator = cluster
        .client_for_kubeconfig(&operator_kubeconfig)
        .await
        .unwrap();
    let operator_cells: Api<Cell> = Api::namespaced(as_operator, &ns);
    let admin_cells: Api<Cell> = Api::namespaced(admin.clone(), &ns);
    let cell: Cell = serde_json::from_value(json!({
        "apiVersion": "multigres.com/v1alpha1", "kind": "Cell",
        "metadata": {"name": "demo-zone-a"},
        "spec": {
            "name": "zone-a", "zoneId": "zone-a",
            "images": {"multigateway": "ghcr.io/multigres/multigres:sha-66d2310"},
            "multigateway": {"replicas": 1},
            "globalTopoServer": {"address": "demo-global-topo:2379", "rootPath": "/multigres/global", "implementation": "etcd"},
        },
    }))
    .unwrap();
    let message = refusal(admin_cells.create(&PostParams::default(), &cell).await);
    assert!(
        message.starts_with(
            "admission webhook \"vcell.multigres.com\" denied the request: metadata: Cell \
             \"demo-zone-a\" is managed by the operator and cannot be created by"
        ),
        "{message}"
    );
    operator_cells
        .create(&PostParams::default(), &cell)
        .await
        .unwrap();
    let scale = Patch::Merge(json!({"spec": {"multigateway": {"replicas": 3}}}));
    let message = refusal(
        admin_cells
            .patch("demo-zone-a", &PatchParams::default(), &scale)
            .await,
    );
    assert!(message.contains("cannot be changed by"), "{message}");
    let message = refusal(
        admin_cells
            .delete("demo-zone-a", &DeleteParams::default())
            .await,
    );
    assert!(message.contains("cannot be deleted by"), "{message}");
    operator_cells
        .patch("demo-zone-a", &PatchParams::default(), &scale)
        .await
        .unwrap();
    operator_cells
        .delete("demo-zone-a", &DeleteParams::default())
        .await
        .unwrap();

    // 5. A cell no Node matches is admitted with a warning naming its node label: the webhook
    //    lists Nodes under the shipped RBAC. The control plane's Nodes are in zone-a to zone-c.
    let nowhere = json!({
        "apiVersion": "multigres.com/v1alpha1", "kind": "MultigresCluster",
        "metadata": {"name": "nowhere"},
        "spec": {
            "postgresPasswordSecretRef": pw,
            "cells": [{"name": "zone-a", "zone": "zone-a"}, {"name": "zone-b", "zone": "nowhere-1"}],
        },
    });
    let args = ["create", "-n", &ns, "--warnings-as-errors", "-f", "-"];
    let warned = match cluster
        .kubectl_with_stdin(&args, Some(&nowhere.to_string()))
        .await
    {
        Err(ClusterError::Kubectl { stderr, .. }) => stderr,
        other => panic!("expected warnings, got {other:?}"),
    };
    assert!(
        warned.contains(
            "Warning: spec.cells[1].zone: no Node has the label \
             topology.kubernetes.io/zone=nowhere-1, so the pods of cell \"zone-b\" stay Pending \
             until one does"
        ),
        "{warned}"
    );
    assert!(!warned.contains("spec.cells[0].zone"), "{warned}");
    clusters
        .get("nowhere")
        .await
        .expect("admitted despite the warning");

    assert!(
        webhook.process.exit_status().is_none(),
        "{}",
        webhook.process.log()
    );
    mutating
        .delete(MUTATING, &DeleteParams::default())
        .await
        .unwrap();
    validating
        .delete(VALIDATING, &DeleteParams::default())
        .await
        .unwrap();
    webhook.process.stop();
}
