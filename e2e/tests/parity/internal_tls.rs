//! Internal TLS and pgBackRest TLS (`spec.internalTLS`, `backup.pgbackrestTLS`): with internal
//! TLS on, the resource-handler issues a CA and one certificate per Multigres process, in
//! Secrets named `<process>.<cluster>.<namespace>.multigres.internal` whose certificates name
//! that identity and the process's Services and verify against the CA; multiadmin,
//! multigateway, multiorch and multipooler pods mount them at `/etc/multigres/tls` with their
//! gRPC TLS flags. A shard with backups and no named Secret gets its own pgBackRest CA and
//! certificate, mounted for pgctld and multipooler. Once settled, reconciles write no Secret; a
//! deleted Secret is issued again; turning internal TLS off removes the Secrets and flags.
//! Client TLS of the gateways is on by default, independent of internal TLS: a gateway CA
//! (published alone in a ConfigMap) and a certificate for every gateway Service name and
//! `certCommonName`, mounted with multigateway's `--pg-tls-*` flags.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, PodSpec, Secret};
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use multigres_api::v1alpha1::MultigresCluster;
use multigres_common::pki::workload::{self, LeafSpec};
use multigres_common::pki::{self, Pair};
use multigres_e2e::harness::{
    Stack, WAIT, admin, apply_yaml, control_plane, eventually, fresh_namespace,
};
use serde_json::json;
use time::OffsetDateTime;

const CLUSTER: &str = r#"
apiVersion: multigres.com/v1alpha1
kind: MultigresCluster
metadata:
  name: tls
spec:
  globalTopoServer:
    external:
      endpoints: [http://127.0.0.1:23790]
      rootPath: /tls/global
  postgresPasswordSecretRef: {name: pg, key: password}
  internalTLS: {enabled: true}
  certCommonName: db.example.com
  cells:
    - {name: zone-a, zoneId: zone-a}
"#;

const SHARD: &str = "tls-postgres-default-0-inf";

fn identity(process: &str, ns: &str) -> String {
    format!("{process}.tls.{ns}.multigres.internal")
}

fn text(secret: &Secret, key: &str) -> String {
    let data = secret.data.as_ref().expect("Secret data");
    String::from_utf8(data[key].0.clone()).expect("PEM is text")
}

/// The leaf of `secret` verifies against `ca`, matches its key and is far from its end; its
/// names are returned.
fn verified(secret: &Secret, ca: &Secret) -> (String, Vec<String>) {
    let leaf = Pair {
        cert: text(secret, "tls.crt"),
        key: text(secret, "tls.key"),
    };
    let ca_pair = Pair {
        cert: text(ca, "ca.crt"),
        key: text(ca, "ca.key"),
    };
    assert_eq!(text(secret, "ca.crt"), ca_pair.cert, "the CA travels along");
    let info = pki::inspect(&leaf.cert).unwrap();
    let spec = LeafSpec::new(info.common_name.clone(), info.dns_names.clone());
    let now = OffsetDateTime::now_utc();
    assert_eq!(workload::ca_problem(&ca_pair, now), None);
    assert_eq!(workload::leaf_problem(&leaf, &ca_pair, &spec, now), None);
    (info.common_name, info.dns_names)
}

fn pod_of(d: &Deployment) -> PodSpec {
    d.spec.clone().unwrap().template.spec.unwrap()
}

/// The Secret behind the internal TLS volume, and the TLS flags of `container`.
fn tls_of(pod: &PodSpec, container: &str) -> (Option<String>, Vec<String>) {
    let secret = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "internal-tls")
        .and_then(|v| v.secret.as_ref()?.secret_name.clone());
    let c = pod.containers.iter().find(|c| c.name == container).unwrap();
    let mounted = c
        .volume_mounts
        .iter()
        .flatten()
        .any(|m| m.name == "internal-tls" && m.mount_path == "/etc/multigres/tls");
    assert_eq!(
        mounted,
        secret.is_some(),
        "{container}: volume and mount go together"
    );
    let flags = c
        .args
        .iter()
        .flatten()
        .filter(|a| {
            a.starts_with("--grpc-c")
                || a.starts_with("--grpc-k")
                || a.starts_with("--grpc-s")
                || a.starts_with("--multipooler-grpc")
        })
        .cloned()
        .collect();
    (secret, flags)
}

fn server_flags() -> Vec<String> {
    vec![
        "--grpc-cert=/etc/multigres/tls/tls.crt".to_owned(),
        "--grpc-key=/etc/multigres/tls/tls.key".to_owned(),
        "--grpc-ca=/etc/multigres/tls/ca.crt".to_owned(),
        "--grpc-server-ca=/etc/multigres/tls/ca.crt".to_owned(),
    ]
}

fn client_flags(ns: &str) -> Vec<String> {
    let mut flags = server_flags();
    flags.extend([
        "--multipooler-grpc-cert=/etc/multigres/tls/tls.crt".to_owned(),
        "--multipooler-grpc-key=/etc/multigres/tls/tls.key".to_owned(),
        "--multipooler-grpc-ca=/etc/multigres/tls/ca.crt".to_owned(),
        format!(
            "--multipooler-grpc-server-name={}",
            identity("multipooler", ns)
        ),
        "--multipooler-grpc-require-tls=true".to_owned(),
    ]);
    flags
}

async fn versions(secrets: &Api<Secret>) -> BTreeMap<String, String> {
    secrets
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|s| Some((s.metadata.name?, s.metadata.resource_version?)))
        .collect()
}

#[tokio::test]
async fn internal_and_pgbackrest_tls_are_issued_mounted_and_kept() {
    let cluster = control_plane().await;
    let ns = fresh_namespace(cluster, "parity-tls").await;
    let stack = Stack::start(cluster, &ns, None).await;
    apply_yaml(cluster, &ns, CLUSTER).await;
    let client = admin(cluster);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    let clusters: Api<MultigresCluster> = Api::namespaced(client.clone(), &ns);

    // The data-handler's is a client certificate for its calls to the multipoolers.
    let processes = [
        "multiadmin",
        "multigateway",
        "multiorch",
        "multipooler",
        "data-handler",
    ];
    let mut wanted: Vec<String> = processes.iter().map(|p| identity(p, &ns)).collect();
    wanted.extend([
        "tls-internal-tls-ca".to_owned(),
        "tls-gateway-ca".to_owned(),
        "tls-gateway-tls".to_owned(),
        format!("{SHARD}-pgbackrest-ca"),
        format!("{SHARD}-pgbackrest-tls"),
    ]);
    eventually("the TLS Secrets", WAIT, || async {
        let have = versions(&secrets).await;
        let missing: Vec<_> = wanted.iter().filter(|w| !have.contains_key(*w)).collect();
        missing
            .is_empty()
            .then_some(())
            .ok_or(format!("missing {missing:?}"))
    })
    .await;

    // Certificates: named like their Secret, carrying their Services, signed by the CA.
    let ca = secrets.get("tls-internal-tls-ca").await.unwrap();
    let owner = &ca.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("MultigresCluster", "tls")
    );
    let labels = ca.metadata.labels.clone().unwrap();
    assert_eq!(labels["app.kubernetes.io/managed-by"], "multigres-operator");
    assert_eq!(labels["app.kubernetes.io/component"], "internal-tls");
    let mut names = BTreeMap::new();
    for process in processes {
        let secret = secrets.get(&identity(process, &ns)).await.unwrap();
        assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));
        let (cn, dns) = verified(&secret, &ca);
        assert_eq!(cn, identity(process, &ns));
        assert!(dns.contains(&cn), "{process}: {dns:?}");
        names.insert(process, dns);
    }
    let has = |process: &str, name: String| {
        assert!(
            names[process].contains(&name),
            "{process} lacks {name}: {:?}",
            names[process]
        );
    };
    has("multiadmin", format!("tls-multiadmin.{ns}.svc"));
    has("multigateway", format!("tls-zone-a-multigateway.{ns}.svc"));
    has("multigateway", identity("multipooler", &ns));
    has("multiorch", format!("{SHARD}-multiorch-zone-a.{ns}.svc"));
    let pool_set = format!("{SHARD}-pool-default-zone-a");
    has("multipooler", format!("*.{pool_set}.{ns}.svc"));

    let pgbackrest_ca = secrets
        .get(&format!("{SHARD}-pgbackrest-ca"))
        .await
        .unwrap();
    let pgbackrest = secrets
        .get(&format!("{SHARD}-pgbackrest-tls"))
        .await
        .unwrap();
    assert_eq!(
        pgbackrest.metadata.owner_references.as_ref().unwrap()[0].kind,
        "Shard"
    );
    let (cn, dns) = verified(&pgbackrest, &pgbackrest_ca);
    assert_eq!(cn, "pgbackrest");
    assert!(dns.contains(&format!("pgbackrest.{ns}.svc")), "{dns:?}");
    assert!(
        dns.contains(&format!("*.{pool_set}.{ns}.svc.cluster.local")),
        "{dns:?}"
    );

    // Workloads: each process mounts its own certificate with its exact flags.
    let deployment = |name: String| {
        let deployments = deployments.clone();
        async move {
            eventually(&format!("Deployment {name}"), WAIT, || async {
                deployments
                    .get_opt(&name)
                    .await
                    .map_err(|e| e.to_string())?
                    .ok_or("absent".to_owned())
            })
            .await
        }
    };
    let admin_pod = pod_of(&deployment("tls-multiadmin".to_owned()).await);
    assert_eq!(
        tls_of(&admin_pod, "multiadmin"),
        (Some(identity("multiadmin", &ns)), client_flags(&ns))
    );
    let gateway_pod = pod_of(&deployment("tls-zone-a-multigateway".to_owned()).await);
    assert_eq!(
        tls_of(&gateway_pod, "multigateway"),
        (Some(identity("multigateway", &ns)), client_flags(&ns))
    );
    // Client TLS: the gateway certificate names every gateway Service and certCommonName,
    // verifies against the gateway CA, whose certificate alone is published in a ConfigMap.
    let gateway_ca = secrets.get("tls-gateway-ca").await.unwrap();
    let gateway_cert = secrets.get("tls-gateway-tls").await.unwrap();
    let (cn, dns) = verified(&gateway_cert, &gateway_ca);
    assert_eq!(cn, "db.example.com");
    for name in [
        format!("tls-multigateway.{ns}.svc"),
        format!("tls-multigateway-replica.{ns}.svc.cluster.local"),
        format!("tls-zone-a-multigateway.{ns}.svc"),
        "db.example.com".to_owned(),
    ] {
        assert!(
            dns.contains(&name),
            "the gateway certificate lacks {name}: {dns:?}"
        );
    }
    let published = Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .get("tls-gateway-ca")
        .await
        .unwrap()
        .data
        .unwrap_or_default();
    assert_eq!(
        published.keys().collect::<Vec<_>>(),
        ["ca.crt"],
        "only the certificate is published"
    );
    assert_eq!(published["ca.crt"], text(&gateway_ca, "ca.crt"));
    let gateway = gateway_pod
        .containers
        .iter()
        .find(|c| c.name == "multigateway");
    let pg_tls: Vec<&String> = gateway
        .and_then(|c| c.args.as_ref())
        .into_iter()
        .flatten()
        .filter(|a| a.starts_with("--pg-tls") || a.starts_with("--pg-require"))
        .collect();
    assert_eq!(
        pg_tls,
        [
            "--pg-tls-cert-file=/etc/multigres/gateway-tls/tls.crt",
            "--pg-tls-key-file=/etc/multigres/gateway-tls/tls.key",
        ]
    );
    let orch_pod = pod_of(&deployment(format!("{SHARD}-multiorch-zone-a")).await);
    assert_eq!(
        tls_of(&orch_pod, "multiorch"),
        (Some(identity("multiorch", &ns)), client_flags(&ns))
    );
    let set = eventually("the pool StatefulSet", WAIT, || async {
        sets.get_opt(&pool_set)
            .await
            .map_err(|e| e.to_string())?
            .ok_or("absent".to_owned())
    })
    .await;
    let pool_pod = set.spec.unwrap().template.spec.unwrap();
    assert_eq!(
        tls_of(&pool_pod, "multipooler"),
        (Some(identity("multipooler", &ns)), server_flags())
    );
    let certs_volume = pool_pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "pgbackrest-certs")
        .unwrap();
    let sources: Vec<_> = certs_volume
        .projected
        .iter()
        .flat_map(|p| p.sources.iter().flatten())
        .map(|s| s.secret.as_ref().unwrap().name.clone())
        .collect();
    assert_eq!(
        sources,
        [
            format!("{SHARD}-pgbackrest-ca"),
            format!("{SHARD}-pgbackrest-tls")
        ]
    );
    let pgctld = &pool_pod.init_containers.as_ref().unwrap()[0];
    assert!(
        pgctld
            .args
            .iter()
            .flatten()
            .any(|a| a == "--pgbackrest-cert-dir=/certs/pgbackrest")
    );
    assert!(
        tls_of(
            &PodSpec {
                containers: vec![pgctld.clone()],
                ..Default::default()
            },
            "postgres"
        )
        .0
        .is_none()
    );

    // Settled: a reconcile of every object writes no Secret.
    let rh = &stack.resource_handler;
    let before = rh.settled(Duration::from_secs(3)).await;
    let stored = versions(&secrets).await;
    let touch = json!({"metadata": {"annotations": {"example.com/touched": "1"}}});
    clusters
        .patch("tls", &PatchParams::default(), &Patch::Merge(&touch))
        .await
        .unwrap();
    let after = rh.settled(Duration::from_secs(3)).await;
    let secret_writes = |w: &BTreeMap<String, u64>| {
        w.iter()
            .filter(|(k, _)| k.contains("/Secret/"))
            .map(|(_, v)| v)
            .sum::<u64>()
    };
    assert_eq!(secret_writes(&after), secret_writes(&before), "{after:?}");
    assert_eq!(versions(&secrets).await, stored, "no Secret changed");

    // A deleted certificate is issued again, under the same CA.
    let gateway_secret = identity("multigateway", &ns);
    secrets
        .delete(&gateway_secret, &DeleteParams::default())
        .await
        .unwrap();
    let reissued = eventually("the gateway certificate is issued again", WAIT, || async {
        secrets
            .get_opt(&gateway_secret)
            .await
            .map_err(|e| e.to_string())?
            .ok_or("absent".to_owned())
    })
    .await;
    let ca_now = secrets.get("tls-internal-tls-ca").await.unwrap();
    assert_eq!(
        text(&ca_now, "ca.crt"),
        text(&ca, "ca.crt"),
        "the CA is kept"
    );
    verified(&reissued, &ca_now);

    // Off: the internal Secrets go, and so do the volumes and flags.
    let off = json!({"spec": {"internalTLS": {"enabled": false}}});
    clusters
        .patch("tls", &PatchParams::default(), &Patch::Merge(&off))
        .await
        .unwrap();
    eventually("internal TLS is removed", WAIT, || async {
        let have = versions(&secrets).await;
        let left: Vec<_> = have
            .keys()
            .filter(|k| k.ends_with(".multigres.internal") || k.as_str() == "tls-internal-tls-ca")
            .collect();
        if !left.is_empty() {
            return Err(format!("still there: {left:?}"));
        }
        let gateway = deployments
            .get("tls-zone-a-multigateway")
            .await
            .map_err(|e| e.to_string())?;
        let (secret, flags) = tls_of(&pod_of(&gateway), "multigateway");
        (secret.is_none() && flags.is_empty())
            .then_some(())
            .ok_or(format!("gateway still has {secret:?} {flags:?}"))
    })
    .await;
    assert!(
        versions(&secrets)
            .await
            .contains_key(&format!("{SHARD}-pgbackrest-tls")),
        "pgBackRest TLS does not depend on internal TLS"
    );
}
