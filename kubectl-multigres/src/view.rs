//! Reading what the status screen and the other commands show: one MultigresCluster and the
//! objects the operator made for it, found by the `multigres.com/cluster` label.

use anyhow::{Context, Result, anyhow};
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, Client, Resource, ResourceExt};
use multigres_api::labels::{self, Component};
use multigres_api::v1alpha1::{Cell, MultigresCluster, Shard, TableGroup, TopoServer};

/// A cluster and its children as read at one moment: everything `status` renders, so that
/// rendering needs no API server.
#[derive(Clone, Debug)]
pub struct ClusterView {
    /// The cluster: its phase and conditions head the screen.
    pub cluster: MultigresCluster,
    /// Its Cells, by name: gateway counts per cell.
    pub cells: Vec<Cell>,
    /// Its TopoServers (the global one, and cells' local ones).
    pub topo_servers: Vec<TopoServer>,
    /// Its TableGroups: the headings the shards sit under.
    pub table_groups: Vec<TableGroup>,
    /// Its Shards: roles, cohort, backups and conditions.
    pub shards: Vec<Shard>,
    /// The shards' pool pods, for readiness (roles and the cohort come from the Shard status).
    pub pool_pods: Vec<Pod>,
}

/// Reads MultigresCluster `name` in `namespace`, or explains what is there instead.
pub async fn cluster(client: &Client, namespace: &str, name: &str) -> Result<MultigresCluster> {
    let api: Api<MultigresCluster> = Api::namespaced(client.clone(), namespace);
    match api
        .get_opt(name)
        .await
        .with_context(|| format!("reading MultigresCluster {namespace}/{name}"))?
    {
        Some(cluster) => Ok(cluster),
        None => {
            let here = names(&api).await?;
            Err(anyhow!(
                "MultigresCluster {namespace}/{name} not found in namespace {namespace}; {}",
                listing("clusters", &here)
            ))
        }
    }
}

/// Reads the cluster and every child labelled with its name.
pub async fn load(client: &Client, namespace: &str, name: &str) -> Result<ClusterView> {
    let cluster = cluster(client, namespace, name).await?;
    let children = ListParams::default().labels(&format!("{}={name}", labels::CLUSTER));
    let pods = ListParams::default().labels(&format!(
        "{}={name},{}={}",
        labels::CLUSTER,
        labels::COMPONENT,
        Component::Pool.as_str()
    ));
    Ok(ClusterView {
        cluster,
        cells: list(client, namespace, &children).await?,
        topo_servers: list(client, namespace, &children).await?,
        table_groups: list(client, namespace, &children).await?,
        shards: list(client, namespace, &children).await?,
        pool_pods: list(client, namespace, &pods).await?,
    })
}

/// The Shard named `name`, or the only Shard of MultigresCluster `name`: what `switchover`
/// acts on.
pub async fn shard(client: &Client, namespace: &str, name: &str) -> Result<Shard> {
    let shards: Api<Shard> = Api::namespaced(client.clone(), namespace);
    if let Some(shard) = shards
        .get_opt(name)
        .await
        .with_context(|| format!("reading Shard {namespace}/{name}"))?
    {
        return Ok(shard);
    }
    let clusters: Api<MultigresCluster> = Api::namespaced(client.clone(), namespace);
    if clusters.get_opt(name).await?.is_none() {
        return Err(anyhow!(
            "no Shard or MultigresCluster {name} in namespace {namespace}; {}; {}",
            listing("shards", &names(&shards).await?),
            listing("clusters", &names(&clusters).await?)
        ));
    }
    let of_cluster = ListParams::default().labels(&format!("{}={name}", labels::CLUSTER));
    let mut found: Vec<Shard> = list(client, namespace, &of_cluster).await?;
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => Err(anyhow!(
            "MultigresCluster {namespace}/{name} has no Shard yet"
        )),
        _ => Err(anyhow!(
            "MultigresCluster {namespace}/{name} has {} shards; name one: {}",
            found.len(),
            found
                .iter()
                .map(|s| s.name_any())
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// The superuser password of `cluster`, from its `spec.postgresPasswordSecretRef`.
pub async fn password(
    client: &Client,
    namespace: &str,
    cluster: &MultigresCluster,
) -> Result<String> {
    let reference = &cluster.spec.postgres_password_secret_ref;
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(client.clone(), namespace);
    let secret = secrets
        .get(&reference.name)
        .await
        .with_context(|| format!("reading Secret {namespace}/{}", reference.name))?;
    let value = secret
        .data
        .as_ref()
        .and_then(|d| d.get(&reference.key))
        .ok_or_else(|| anyhow!("Secret {} has no key {}", reference.name, reference.key))?;
    String::from_utf8(value.0.clone()).map_err(|_| {
        anyhow!(
            "Secret {}: key {} is not UTF-8",
            reference.name,
            reference.key
        )
    })
}

/// The objects of kind `K` in `namespace` that `params` selects, by name.
pub async fn list<K>(client: &Client, namespace: &str, params: &ListParams) -> Result<Vec<K>>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    let mut items = api
        .list(params)
        .await
        .with_context(|| format!("listing {} in namespace {namespace}", K::plural(&())))?
        .items;
    items.sort_by_key(|o| o.name_any());
    Ok(items)
}

async fn names<K>(api: &Api<K>) -> Result<Vec<String>>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let list = api.list_metadata(&ListParams::default()).await?;
    let mut names: Vec<String> = list.items.iter().map(|o| o.name_any()).collect();
    names.sort();
    Ok(names)
}

fn listing(what: &str, names: &[String]) -> String {
    match names {
        [] => format!("no {what} here"),
        _ => format!("{what} here: {}", names.join(", ")),
    }
}
