//! No accepted field is silently ignored (`api/src/field_support.rs`): the CRDs the API server
//! serves are classified field by field, and through the real API server and the real
//! webhook-server (as its own ServiceAccount, with the shipped RBAC and registrations scoped to
//! the test namespace) creating a MultigresCluster or ShardTemplate that sets not-yet-implemented
//! fields returns exactly one `kubectl` warning per such field, derived from the registry, while
//! one using only implemented fields gets none.

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::DeleteParams;
use multigres_api::field_support::{self, Kind};
use multigres_e2e::cluster::{ClusterError, LocalCluster};
use multigres_e2e::harness::{
    WAIT, WebhookServer, admin, control_plane, eventually, fresh_namespace, grant_webhook_rbac,
    only_namespace, webhook_registrations,
};
use multigres_e2e::manifest::{self, Mode};
use serde_json::{Value, json};

/// What every warning of the rule says after the field path.
const MARKER: &str = ": accepted but not implemented yet by this operator version: ";

/// `kubectl create` of `object`, treating warnings as errors so they can be read; returns the
/// warnings (none when kubectl succeeded) after checking the object was stored either way.
async fn create_with_warnings(
    cluster: &LocalCluster,
    namespace: &str,
    object: &Value,
) -> Vec<String> {
    let manifest = serde_json::to_string(object).unwrap();
    let args = ["create", "-n", namespace, "--warnings-as-errors", "-f", "-"];
    let warnings = match cluster.kubectl_with_stdin(&args, Some(&manifest)).await {
        Ok(_) => Vec::new(),
        Err(ClusterError::Kubectl { stderr, .. }) => {
            assert!(
                stderr.contains("warning") && stderr.contains("received"),
                "kubectl create failed for a reason other than warnings:\n{stderr}"
            );
            stderr
                .lines()
                .filter_map(|l| l.strip_prefix("Warning: "))
                .map(str::to_owned)
                .collect()
        }
        Err(other) => panic!("kubectl create: {other}"),
    };
    let kind = object["kind"].as_str().unwrap().to_lowercase();
    let name = object["metadata"]["name"].as_str().unwrap();
    cluster
        .kubectl(&["get", "-n", namespace, &kind, name, "-o", "name"])
        .await
        .unwrap_or_else(|e| panic!("{kind} {name} was not stored: {e}"));
    warnings
}

/// The field paths named by the rule's warnings, sorted.
fn unimplemented_warnings(warnings: &[String]) -> Vec<String> {
    let mut paths: Vec<String> = warnings
        .iter()
        .filter_map(|w| w.split_once(MARKER).map(|(path, _)| path.to_owned()))
        .collect();
    paths.sort_unstable();
    paths
}

/// The not-yet-implemented registry paths `spec` sets, sorted.
fn expected(kind: Kind, spec: &Value) -> Vec<String> {
    let mut paths: Vec<String> = field_support::set_unimplemented(kind, spec)
        .iter()
        .map(|f| f.path.to_owned())
        .collect();
    paths.sort_unstable();
    paths
}

/// A cluster spec setting, besides the required fields, every field that had no behaviour when
/// this test was written; the registry decides which of them still get a warning.
fn cluster_spec_with_unimplemented_fields() -> Value {
    json!({
        "postgresPasswordSecretRef": {"name": "pg", "key": "password"},
        "images": {"multiadminWeb": "registry.example.com/multiadmin-web:v1"},
        "imageUpdatePolicy": {"strategy": "lazy"},
        "observability": {"otlpEndpoint": "http://otel-collector:4318"},
        "internalTLS": {"enabled": true},
        "certCommonName": "db.example.com",
        "issuerName": "example-issuer",
        "externalGateway": {"enabled": true, "externalIPs": ["203.0.113.10"]},
        "multiadminWeb": {"spec": {"replicas": 1}},
        "cells": [{"name": "zone-a", "zoneId": "zone-a", "metadata": "rack 1"}],
        "backup": {"type": "filesystem", "filesystem": {}, "pgbackrestTLS": {}},
        "databases": [{"name": "postgres", "default": true, "tablegroups": [{
            "name": "default", "default": true,
            "shards": [{"name": "0-inf", "spec": {
                "postgresConfig": {"work_mem": "4MB"},
                "pools": {"main": {"cells": ["zone-a"]}},
            }}],
        }]}],
    })
}

fn object(kind: &str, name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "multigres.com/v1alpha1", "kind": kind,
        "metadata": {"name": name}, "spec": spec,
    })
}

#[tokio::test]
async fn unimplemented_fields_are_named_in_admission_warnings() {
    let cluster = control_plane().await;
    let client = admin(cluster);

    // The CRDs the API server serves are the ones the registry classifies, field by field.
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for kind in Kind::ALL {
        let plural = format!("{}s.multigres.com", kind.name().to_lowercase());
        let crd = crds.get(&plural).await.unwrap();
        let schema = serde_json::to_value(
            crd.spec.versions[0]
                .schema
                .as_ref()
                .and_then(|s| s.open_api_v3_schema.as_ref())
                .unwrap(),
        )
        .unwrap();
        let problems = field_support::coverage_problems(kind, &schema);
        assert!(problems.is_empty(), "{problems:#?}");
    }

    let system = fresh_namespace(cluster, "warnings-system").await;
    let ns = fresh_namespace(cluster, "warnings").await;
    // Registrations under this test's own names, so other tests' registrations are left alone.
    let kubeconfig = grant_webhook_rbac(cluster, &system, Some(&ns)).await;
    let operators = format!("{ns}:operator");
    let webhook = WebhookServer::spawn(&kubeconfig, &system, &operators, Some(&ns)).await;
    for registration in webhook_registrations(webhook.address, only_namespace(&ns), Some(&ns)) {
        manifest::apply(&client, &registration, None, Mode::Apply)
            .await
            .unwrap();
    }
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let name = format!("{ns}-validating");
    eventually("the webhook trusted by the API server", WAIT, || async {
        let config = validating.get(&name).await.map_err(|e| e.to_string())?;
        let webhooks = config.webhooks.unwrap_or_default();
        match webhooks.iter().all(|w| w.client_config.ca_bundle.is_some()) {
            true if !webhooks.is_empty() => Ok(()),
            _ => Err("caBundle not set yet".to_owned()),
        }
    })
    .await;

    // A cluster using only implemented fields: no warning at all.
    let plain = object(
        "MultigresCluster",
        "plain",
        json!({
            "postgresPasswordSecretRef": {"name": "pg", "key": "password"},
            "cells": [{"name": "zone-a", "zoneId": "zone-a"}],
            "logLevels": {"multigateway": "debug"},
            "internalTLS": {"enabled": false},
        }),
    );
    let warnings = create_with_warnings(cluster, &ns, &plain).await;
    assert_eq!(
        unimplemented_warnings(&warnings),
        Vec::<String>::new(),
        "{warnings:#?}"
    );

    // A cluster setting every field that lacked behaviour: one warning per field the registry
    // still lists as not implemented, and nothing else from this rule.
    let spec = cluster_spec_with_unimplemented_fields();
    let want = expected(Kind::MultigresCluster, &spec);
    let warnings =
        create_with_warnings(cluster, &ns, &object("MultigresCluster", "wide", spec)).await;
    assert_eq!(unimplemented_warnings(&warnings), want, "{warnings:#?}");
    println!(
        "registry: {} entries, {} not yet implemented; the cluster got {} warnings: {want:?}",
        field_support::FIELDS.len(),
        field_support::FIELDS
            .iter()
            .filter(|f| f.is_unimplemented())
            .count(),
        want.len()
    );
    for warning in warnings.iter().filter(|w| w.contains(MARKER)) {
        assert!(
            warning.len() <= 256,
            "longer than the API server keeps: {warning}"
        );
    }

    // Templates are checked against their own fields.
    let spec = json!({
        "initdbArgs": "--data-checksums",
        "postgresConfig": {"work_mem": "4MB"},
        "postgresConfigRef": {"name": "extra-config", "key": "postgresql.conf"},
    });
    let want = expected(Kind::ShardTemplate, &spec);
    let warnings =
        create_with_warnings(cluster, &ns, &object("ShardTemplate", "tuned", spec)).await;
    assert_eq!(unimplemented_warnings(&warnings), want, "{warnings:#?}");

    assert!(
        webhook.process.exit_status().is_none(),
        "the webhook-server exited"
    );
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    mutating
        .delete(&format!("{ns}-mutating"), &DeleteParams::default())
        .await
        .unwrap();
    validating
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    webhook.process.stop();
}
