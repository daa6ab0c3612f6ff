//! Image rollout policy (`spec.imageUpdatePolicy`): the cluster-handler runs with default image
//! set A; a `lazy` and an `immediate` cluster both adopt A. The handler is replaced by one with
//! default set B: the immediate cluster's children move to B at once, the lazy cluster's keep A
//! and its status says `ImageRolloutPending=True/AwaitingAcknowledgement` with B's revision and
//! the command to acknowledge it. Patching `acknowledgedRevision` to B's revision moves the lazy
//! cluster's children (Cell, Shard, their Deployments and StatefulSets, multiadmin) to B.

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use kube::Api;
use kube::api::{Patch, PatchParams};
use multigres_api::names;
use multigres_api::resolver::images::{APPLIED_IMAGES_ANNOTATION, revision};
use multigres_api::v1alpha1::{Cell, ComponentImages, ImageRef, MultigresCluster, Shard};
use multigres_e2e::harness::{
    FULL_CYCLE, HandlerProcess, WAIT, admin, apply_yaml, control_plane, eventually, fresh_namespace,
};
use serde_json::json;

fn cluster_yaml(name: &str, strategy: &str) -> String {
    format!(
        r#"
apiVersion: multigres.com/v1alpha1
kind: MultigresCluster
metadata:
  name: {name}
spec:
  imageUpdatePolicy: {{strategy: {strategy}}}
  globalTopoServer:
    external:
      endpoints: [http://127.0.0.1:23790]
      rootPath: /{name}/global
  postgresPasswordSecretRef: {{name: pg, key: password}}
  cells:
    - {{name: zone-a, zoneId: zone-a}}
"#
    )
}

fn set(tag: &str) -> ComponentImages {
    let image = |name: &str| Some(ImageRef::new(format!("example.test/{name}:{tag}")));
    ComponentImages {
        multigateway: image("multigateway"),
        multiorch: image("multiorch"),
        multipooler: image("multipooler"),
        multiadmin: image("multiadmin"),
        multiadmin_web: image("multiadmin-web"),
        postgres: image("pgctld"),
    }
}

fn flags(set: &ComponentImages) -> Vec<String> {
    let s = |i: &Option<ImageRef>| i.as_ref().unwrap().as_str().to_owned();
    vec![
        format!("--image-multigateway={}", s(&set.multigateway)),
        format!("--image-multiorch={}", s(&set.multiorch)),
        format!("--image-multipooler={}", s(&set.multipooler)),
        format!("--image-multiadmin={}", s(&set.multiadmin)),
        format!("--image-multiadmin-web={}", s(&set.multiadmin_web)),
        format!("--image-postgres={}", s(&set.postgres)),
    ]
}

fn image_of(pod: Option<&k8s_openapi::api::core::v1::PodSpec>, container: &str) -> String {
    let pod = pod.expect("a pod template");
    pod.containers
        .iter()
        .chain(pod.init_containers.iter().flatten())
        .find(|c| c.name == container)
        .and_then(|c| c.image.clone())
        .unwrap_or_default()
}

/// Every image the children of cluster `name` run, in the order of [`expected`].
async fn running(client: &kube::Client, ns: &str, name: &str) -> Option<Vec<String>> {
    let cells: Api<Cell> = Api::namespaced(client.clone(), ns);
    let shards: Api<Shard> = Api::namespaced(client.clone(), ns);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
    let cell_name = names::cell(name, "zone-a");
    let shard_name = names::shard(name, "postgres", "default", "0-inf");
    let cell = cells.get_opt(&cell_name).await.ok()??;
    let shard = shards.get_opt(&shard_name).await.ok()??;
    let deployment = |n: String| {
        let deployments = deployments.clone();
        async move { deployments.get_opt(&n).await.ok()? }
    };
    let gateway = deployment(format!("{cell_name}-multigateway")).await?;
    let orch = deployment(format!("{shard_name}-multiorch-zone-a")).await?;
    let admin = deployment(format!("{name}-multiadmin")).await?;
    let pool = sets
        .get_opt(&format!("{shard_name}-pool-default-zone-a"))
        .await
        .ok()??;
    let pod = |spec: Option<k8s_openapi::api::core::v1::PodTemplateSpec>| spec?.spec;
    Some(vec![
        cell.spec.images.multigateway.as_str().to_owned(),
        shard.spec.images.multiorch.as_str().to_owned(),
        shard.spec.images.multipooler.as_str().to_owned(),
        shard.spec.images.postgres.as_str().to_owned(),
        image_of(
            pod(gateway.spec.map(|s| s.template)).as_ref(),
            "multigateway",
        ),
        image_of(pod(orch.spec.map(|s| s.template)).as_ref(), "multiorch"),
        image_of(
            pod(pool.spec.clone().map(|s| s.template)).as_ref(),
            "multipooler",
        ),
        image_of(pod(pool.spec.map(|s| s.template)).as_ref(), "postgres"),
        image_of(pod(admin.spec.map(|s| s.template)).as_ref(), "multiadmin"),
    ])
}

fn expected(set: &ComponentImages) -> Vec<String> {
    let s = |i: &Option<ImageRef>| i.as_ref().unwrap().as_str().to_owned();
    vec![
        s(&set.multigateway),
        s(&set.multiorch),
        s(&set.multipooler),
        s(&set.postgres),
        s(&set.multigateway),
        s(&set.multiorch),
        s(&set.multipooler),
        s(&set.postgres),
        s(&set.multiadmin),
    ]
}

async fn wait_images(client: &kube::Client, ns: &str, name: &str, want: &ComponentImages) {
    let want = expected(want);
    eventually(&format!("{name}'s children run {want:?}"), WAIT, || async {
        match running(client, ns, name).await {
            Some(images) if images == want => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

#[tokio::test]
async fn lazy_holds_the_default_image_set_until_acknowledged() {
    let cluster = control_plane().await;
    let ns = fresh_namespace(cluster, "parity-images").await;
    let (a, b) = (set("a"), set("b"));
    let (rev_a, rev_b) = (revision(&a), revision(&b));
    let flags_a = flags(&a);
    let flags_a: Vec<&str> = flags_a.iter().map(String::as_str).collect();
    let handler = HandlerProcess::start_in(cluster, "cluster-handler", &ns, &flags_a).await;
    let _resources = HandlerProcess::start_in(cluster, "resource-handler", &ns, &[]).await;
    apply_yaml(cluster, &ns, &cluster_yaml("lazy", "lazy")).await;
    apply_yaml(cluster, &ns, &cluster_yaml("eager", "immediate")).await;
    let client = admin(cluster);
    let clusters: Api<MultigresCluster> = Api::namespaced(client.clone(), &ns);

    // Both adopt A, recorded in the annotation and the status.
    wait_images(&client, &ns, "lazy", &a).await;
    wait_images(&client, &ns, "eager", &a).await;
    let lazy = clusters.get("lazy").await.unwrap();
    assert_eq!(
        lazy.metadata.annotations.unwrap()[APPLIED_IMAGES_ANNOTATION],
        serde_json::to_string(&a).unwrap()
    );
    // A converging cluster's first status may be paced (written up to 5 s after first sight).
    let images = eventually("lazy reports its images", WAIT, || async {
        let c = clusters.get("lazy").await.map_err(|e| e.to_string())?;
        c.status
            .and_then(|s| s.images)
            .ok_or_else(|| "no status.images yet".to_owned())
    })
    .await;
    assert_eq!(images.applied_revision.as_deref(), Some(rev_a.as_str()));
    assert_eq!(images.available_revision.as_deref(), Some(rev_a.as_str()));
    assert_eq!(images.effective, Some(a.clone()));

    // The operator's defaults become B.
    handler.stop();
    drop(handler);
    let flags_b = flags(&b);
    let flags_b: Vec<&str> = flags_b.iter().map(String::as_str).collect();
    let _handler = HandlerProcess::start_in(cluster, "cluster-handler", &ns, &flags_b).await;
    wait_images(&client, &ns, "eager", &b).await;
    let pending = eventually("lazy awaits acknowledgement of B", WAIT, || async {
        let c = clusters.get("lazy").await.map_err(|e| e.to_string())?;
        let status = c.status.clone().unwrap_or_default();
        let images = status.images.clone().unwrap_or_default();
        let condition = status
            .conditions
            .iter()
            .find(|c| c.type_ == "ImageRolloutPending")
            .cloned();
        match condition {
            Some(cond)
                if cond.reason == "AwaitingAcknowledgement"
                    && images.available_revision.as_deref() == Some(rev_b.as_str()) =>
            {
                Ok((cond, images))
            }
            other => Err(format!("{other:?} {images:?}")),
        }
    })
    .await;
    let (condition, images) = pending;
    assert_eq!(condition.status, "True");
    assert!(
        condition.message.ends_with(&format!(
            "kubectl patch multigrescluster lazy -n {ns} --type=merge -p '{{\"spec\":{{\"imageUpdatePolicy\":{{\"acknowledgedRevision\":\"{rev_b}\"}}}}}}'"
        )),
        "{}",
        condition.message
    );
    assert_eq!(images.applied_revision.as_deref(), Some(rev_a.as_str()));
    assert_eq!(images.available, Some(b.clone()));
    // Held: a full cycle later the lazy cluster's children still run A.
    tokio::time::sleep(FULL_CYCLE).await;
    assert_eq!(
        running(&client, &ns, "lazy").await,
        Some(expected(&a)),
        "lazy children moved without acknowledgement"
    );

    // Acknowledge B.
    clusters
        .patch(
            "lazy",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"imageUpdatePolicy": {"acknowledgedRevision": rev_b}}})),
        )
        .await
        .unwrap();
    wait_images(&client, &ns, "lazy", &b).await;
    eventually("lazy reports B applied", WAIT, || async {
        let c = clusters.get("lazy").await.map_err(|e| e.to_string())?;
        let status = c.status.clone().unwrap_or_default();
        let up_to_date = status
            .conditions
            .iter()
            .any(|c| c.type_ == "ImageRolloutPending" && c.reason == "UpToDate");
        let applied = status.images.and_then(|i| i.applied_revision);
        if up_to_date && applied.as_deref() == Some(rev_b.as_str()) {
            Ok(())
        } else {
            Err(format!("{:?}", c.status))
        }
    })
    .await;
}
