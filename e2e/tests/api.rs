//! The API surface against a real kube-apiserver: the CRDs install, every sample is accepted,
//! every broken manifest is refused with its expected message, `kubectl explain` shows the field
//! documentation and `kubectl get multigres` lists every kind.
//!
//! All tests share one local control plane (started on first use, stopped at process exit); each
//! works in its own namespace.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use kube::api::DynamicObject;
use multigres_e2e::cluster::LocalCluster;
use multigres_e2e::harness::{fresh_namespace, repo_path};
use multigres_e2e::manifest::{self, Mode};

async fn cluster() -> &'static LocalCluster {
    multigres_e2e::harness::control_plane().await
}

fn describe(doc: &DynamicObject) -> String {
    let kind = doc.types.as_ref().map_or("?", |t| t.kind.as_str());
    format!("{kind}/{}", doc.metadata.name.as_deref().unwrap_or("?"))
}

/// Collapses every run of whitespace to one space, so wrapped text compares equal.
fn normalize(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[tokio::test]
async fn api_server_is_version_stamped() {
    let cluster = cluster().await;
    let version = cluster.client().unwrap().apiserver_version().await.unwrap();
    let memory = cluster.memory();
    let rss: u64 = memory.iter().map(|m| m.rss_bytes).sum();
    let peak: u64 = memory.iter().map(|m| m.peak_rss_bytes).sum();
    println!(
        "kube-apiserver {} (go {}, {}); control plane started in {:.2}s, RSS {} MiB (sum of peaks {} MiB)",
        version.git_version,
        version.go_version,
        version.platform,
        cluster.startup_time().as_secs_f64(),
        rss >> 20,
        peak >> 20,
    );
    for m in &memory {
        println!(
            "  {:<24} RSS {:>4} MiB, peak {:>4} MiB",
            m.component,
            m.rss_bytes >> 20,
            m.peak_rss_bytes >> 20
        );
    }
    assert_eq!(version.major, "1", "{version:?}");
    assert!(
        version.git_version.starts_with("v1."),
        "unstamped build: {version:?}"
    );
}

#[tokio::test]
async fn every_sample_document_passes_a_server_side_dry_run() {
    let cluster = cluster().await;
    let client = cluster.client().unwrap();
    let ns = fresh_namespace(cluster, "samples-dry-run").await;
    let files = manifest::yaml_files(&repo_path("deploy/samples")).unwrap();
    assert!(!files.is_empty(), "no manifests in deploy/samples");
    let mut checked = 0;
    let mut failures = Vec::new();
    for file in &files {
        let docs = manifest::read_documents(file).unwrap();
        assert!(!docs.is_empty(), "{} has no documents", file.display());
        for doc in &docs {
            checked += 1;
            if let Err(e) = manifest::apply(&client, doc, Some(&ns), Mode::DryRun).await {
                failures.push(format!("{} {}: {e}", file.display(), describe(doc)));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {checked} sample documents refused:\n{}",
        failures.len(),
        failures.join("\n")
    );
    println!(
        "{checked} sample documents from {} files accepted",
        files.len()
    );
}

/// What an invalid fixture expects, from its `# expect:` or `# expect-update:` header.
#[derive(Debug)]
enum Expectation {
    /// The single document is refused with a message containing this text.
    Create(String),
    /// Document 1 is accepted; document 2, applied over it, is refused with this text.
    Update(String),
}

fn expectation(path: &Path, text: &str) -> Expectation {
    for line in text.lines().take_while(|l| l.starts_with('#')) {
        if let Some(expected) = line.strip_prefix("# expect-update:") {
            return Expectation::Update(expected.trim().to_string());
        }
        if let Some(expected) = line.strip_prefix("# expect:") {
            return Expectation::Create(expected.trim().to_string());
        }
    }
    panic!(
        "{}: no `# expect:` or `# expect-update:` header",
        path.display()
    );
}

async fn check_invalid_fixture(cluster: &LocalCluster, path: &Path) -> Result<(), String> {
    let client = cluster.client().map_err(|e| e.to_string())?;
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let docs = manifest::parse_documents(&text, path).map_err(|e| e.to_string())?;
    let ns = fresh_namespace(cluster, "invalid").await;
    let (refused, expected) = match expectation(path, &text) {
        Expectation::Create(expected) => {
            let [doc] = docs.as_slice() else {
                return Err(format!("expected 1 document, found {}", docs.len()));
            };
            (doc, expected)
        }
        Expectation::Update(expected) => {
            let [first, second] = docs.as_slice() else {
                return Err(format!("expected 2 documents, found {}", docs.len()));
            };
            manifest::apply(&client, first, Some(&ns), Mode::Apply)
                .await
                .map_err(|e| format!("document 1 should be accepted: {e}"))?;
            (second, expected)
        }
    };
    if expected.is_empty() {
        return Err("empty expected message".into());
    }
    match manifest::apply(&client, refused, Some(&ns), Mode::Apply).await {
        Ok(_) => Err(format!("{} was accepted", describe(refused))),
        Err(e) => match e.rejection_message() {
            Some(message) if message.contains(&expected) => Ok(()),
            Some(message) => Err(format!(
                "refused, but the message lacks {expected:?}: {message}"
            )),
            None => Err(format!("failed without an API refusal: {e}")),
        },
    }
}

#[tokio::test]
async fn every_invalid_fixture_is_refused_with_its_expected_message() {
    let cluster = cluster().await;
    let files = manifest::yaml_files(&repo_path("e2e/fixtures/invalid")).unwrap();
    assert!(!files.is_empty(), "no fixtures in e2e/fixtures/invalid");
    let mut failures = Vec::new();
    for file in &files {
        if let Err(why) = check_invalid_fixture(cluster, file).await {
            failures.push(format!("{}: {why}", file.display()));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} invalid fixtures misbehaved:\n{}",
        failures.len(),
        files.len(),
        failures.join("\n")
    );
    println!("{} invalid fixtures refused as expected", files.len());
}

/// The `openAPIV3Schema` of the storage version of the CRD for `kind` in `deploy/crds`.
fn crd_schema(kind: &str) -> serde_json::Value {
    for file in manifest::yaml_files(&repo_path("deploy/crds")).unwrap() {
        for doc in manifest::read_documents(&file).unwrap() {
            if doc.data["spec"]["names"]["kind"] != kind {
                continue;
            }
            let versions = doc.data["spec"]["versions"].as_array().unwrap();
            let storage = versions
                .iter()
                .find(|v| v["storage"] == true)
                .unwrap_or_else(|| panic!("{}: no storage version", file.display()));
            return storage["schema"]["openAPIV3Schema"].clone();
        }
    }
    panic!("no CRD for kind {kind} in deploy/crds");
}

fn description(schema: &serde_json::Value, what: &str) -> String {
    let text = schema["description"].as_str().unwrap_or_default();
    assert!(
        !text.trim().is_empty(),
        "the CRD has no description for {what}"
    );
    normalize(text)
}

#[tokio::test]
async fn kubectl_explain_shows_the_crd_field_descriptions() {
    let cluster = cluster().await;
    let schema = crd_schema("MultigresCluster");
    let cells = &schema["properties"]["spec"]["properties"]["cells"];
    let cells_text = description(cells, "spec.cells");
    let name_text = description(&cells["items"]["properties"]["name"], "spec.cells[].name");

    // The API server publishes a new CRD's OpenAPI a moment after it is established.
    let deadline = Instant::now() + Duration::from_secs(60);
    let output = loop {
        match cluster
            .kubectl(&["explain", "multigrescluster.spec.cells"])
            .await
        {
            Ok(out) if normalize(&out).contains(&cells_text) => break out,
            other if Instant::now() >= deadline => {
                panic!("kubectl explain never showed the cells description: {other:?}")
            }
            _ => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    };
    let shown = normalize(&output);
    assert!(
        shown.contains(&name_text),
        "kubectl explain lacks the description of cells[].name ({name_text:?}):\n{output}"
    );
    assert!(output.contains("FIELDS:"), "{output}");
}

#[tokio::test]
async fn kubectl_get_multigres_lists_every_kind() {
    let cluster = cluster().await;
    let client = cluster.client().unwrap();

    // The category covers exactly the installed CRDs.
    let mut crds = BTreeSet::new();
    for file in manifest::yaml_files(&repo_path("deploy/crds")).unwrap() {
        for doc in manifest::read_documents(&file).unwrap() {
            crds.extend(doc.metadata.name);
        }
    }
    assert!(!crds.is_empty(), "no CRDs in deploy/crds");
    let listed = cluster
        .kubectl(&["api-resources", "--categories=multigres", "-o", "name"])
        .await
        .unwrap();
    let in_category: BTreeSet<String> = listed.lines().map(str::to_string).collect();
    assert_eq!(in_category, crds, "the `multigres` category");

    // Every sample object shows up under `kubectl get multigres`.
    let ns = fresh_namespace(cluster, "get-multigres").await;
    let mut expected = BTreeSet::new();
    for file in manifest::yaml_files(&repo_path("deploy/samples")).unwrap() {
        for doc in manifest::read_documents(&file).unwrap() {
            let applied = manifest::apply(&client, &doc, Some(&ns), Mode::Apply)
                .await
                .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            let types = applied.types.as_ref().unwrap();
            if let Some(("multigres.com", _)) = types.api_version.split_once('/') {
                expected.insert(format!(
                    "{}.multigres.com/{}",
                    types.kind.to_lowercase(),
                    applied.metadata.name.unwrap()
                ));
            }
        }
    }
    assert!(!expected.is_empty(), "no sample objects to list");
    let out = cluster
        .kubectl(&["get", "multigres", "-n", &ns, "-o", "name"])
        .await
        .unwrap();
    let got: BTreeSet<String> = out.lines().map(str::to_string).collect();
    assert_eq!(got, expected, "kubectl get multigres -n {ns}");
}

#[tokio::test]
async fn service_account_kubeconfig_authenticates_under_rbac() {
    use k8s_openapi::api::authentication::v1::SelfSubjectReview;
    use k8s_openapi::api::core::v1::{ConfigMap, Node};
    use kube::api::{Api, ListParams, PostParams};

    let cluster = cluster().await;
    let ns = fresh_namespace(cluster, "sa-identity").await;
    let path = cluster
        .service_account_kubeconfig(&ns, "handler", Duration::from_secs(3600))
        .await
        .unwrap();
    let as_sa = cluster.client_for_kubeconfig(&path).await.unwrap();

    let review: SelfSubjectReview = serde_json::from_value(serde_json::json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview",
    }))
    .unwrap();
    let me = Api::<SelfSubjectReview>::all(as_sa.clone())
        .create(&PostParams::default(), &review)
        .await
        .unwrap();
    let username = me.status.and_then(|s| s.user_info).and_then(|u| u.username);
    assert_eq!(
        username.as_deref(),
        Some(format!("system:serviceaccount:{ns}:handler").as_str())
    );

    fn forbidden<T>(result: Result<T, kube::Error>) -> bool {
        matches!(result, Err(kube::Error::Api(status)) if status.code == 403)
    }
    let configmaps: Api<ConfigMap> = Api::namespaced(as_sa.clone(), &ns);
    assert!(forbidden(configmaps.list(&ListParams::default()).await));
    assert!(forbidden(
        Api::<Node>::all(as_sa.clone())
            .list(&ListParams::default())
            .await
    ));

    // Granting a Role makes exactly that allowed; Nodes stay forbidden.
    let admin = cluster.client().unwrap();
    for doc in [
        serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "read-configmaps", "namespace": ns},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]}],
        }),
        serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "read-configmaps", "namespace": ns},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "read-configmaps"},
            "subjects": [{"kind": "ServiceAccount", "name": "handler", "namespace": ns}],
        }),
    ] {
        let obj: DynamicObject = serde_json::from_value(doc).unwrap();
        manifest::apply(&admin, &obj, Some(&ns), Mode::Apply)
            .await
            .unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while configmaps.list(&ListParams::default()).await.is_err() {
        assert!(
            Instant::now() < deadline,
            "the RoleBinding never took effect"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(forbidden(
        Api::<Node>::all(as_sa).list(&ListParams::default()).await
    ));
}
