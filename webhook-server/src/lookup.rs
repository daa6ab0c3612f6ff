//! Reads of other objects for the rules: templates and clusters of the request's namespace, and
//! whether a Node carries a label (for the warning of [`crate::placement`]).
//!
//! Templates come from a watch-fed cache when [`Lookups::cached`] started one: validating a
//! cluster otherwise costs a GET per template it may use (each kind's `default` included) on
//! every request, and those round trips were most of the webhook's latency and all of its tail.
//! The cache only ever answers "found": a name it lacks is read with a GET, so a template created
//! a moment before a cluster that names it is still found, and a missing one is still reported
//! missing. While a watch is not delivering (before its first list, after an error until it has
//! listed again) its kind is read with GETs too. What the cache can get wrong is bounded by the
//! watch delay (milliseconds; about a second more when the API server ends a watch with 410 Gone
//! and it lists again): a template edited or deleted that recently may be seen as it was.
//!
//! Node labels come from a watch of the Nodes' metadata (their labels kept, annotations and
//! managed fields dropped) when [`Lookups::cached`] started one, for the same reason: every
//! cluster written with a zone, zone ID or region lists the Nodes carrying that label, and that
//! round trip was the webhook's tail (`just bench`, 50 requests a second: p99 68 ms with the
//! list, 3.3 ms from the watch). The answer only chooses whether to warn, so the cache's
//! absence is trusted; while the watch is not delivering, the Nodes are listed as before. It
//! holds about a kilobyte of labels per Node.
//!
//! Clusters are always listed from the API server: a template's edit or deletion is checked
//! against them, a cluster created a moment before must block it, and these requests are rare
//! enough that a cache of every cluster (and list/watch permission on them) would not pay.

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use futures::future::try_join_all;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, Event};
use kube::{Client, Resource, ResourceExt};
use multigres_api::v1alpha1::{CellTemplate, CoreTemplate, MultigresCluster, Shard, ShardTemplate};
use multigres_common::backoff::BackoffPolicy;
use serde::de::DeserializeOwned;
use tokio::task::JoinHandle;

use crate::defaults::DefaultTemplates;
use crate::rules::{TemplateKind, Templates};

/// Why a lookup failed.
#[derive(Debug, thiserror::Error)]
#[error("cannot read {what} in namespace {namespace:?}: {source}")]
pub struct LookupError {
    what: String,
    namespace: String,
    #[source]
    source: kube::Error,
}

/// Lookups through one client, with templates and Node labels served from caches when they
/// were started.
#[derive(Clone)]
pub struct Lookups {
    client: Client,
    cache: Option<Arc<Caches>>,
}

impl Lookups {
    /// Lookups that read every object from the API server, for callers that run no watches.
    pub fn new(client: Client) -> Self {
        Self {
            client,
            cache: None,
        }
    }

    /// Lookups with templates (of every namespace) and Node labels cached from watches,
    /// started here and stopped when the returned [`CacheWatches`] is dropped.
    pub fn cached(client: Client) -> (Self, CacheWatches) {
        let (core, core_task) = Cached::templates(&client);
        let (cell, cell_task) = Cached::templates(&client);
        let (shard, shard_task) = Cached::templates(&client);
        let (nodes, nodes_task) = Cached::node_labels(&client);
        let cache = Caches {
            core,
            cell,
            shard,
            nodes,
        };
        let lookups = Self {
            client,
            cache: Some(Arc::new(cache)),
        };
        (
            lookups,
            CacheWatches(vec![core_task, cell_task, shard_task, nodes_task]),
        )
    }

    /// The template `name` of `namespace`: from the cache when it has it, else from the API
    /// server; with `trust_absence`, a name the delivering cache lacks is absent, no GET.
    async fn template<K>(
        &self,
        cached: Option<&Cached<K>>,
        namespace: &str,
        name: &str,
        trust_absence: bool,
    ) -> Result<Option<K>, LookupError>
    where
        K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
            + Clone
            + DeserializeOwned
            + Debug,
    {
        match cached.map(|c| c.get(namespace, name)) {
            Some(Cache::Found(found)) => Ok(Some(found)),
            Some(Cache::Absent) if trust_absence => Ok(None),
            _ => self.get(namespace, name).await,
        }
    }

    async fn get<K>(&self, namespace: &str, name: &str) -> Result<Option<K>, LookupError>
    where
        K: Resource<Scope = kube::core::NamespaceResourceScope>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug,
        K::DynamicType: Default,
    {
        Api::<K>::namespaced(self.client.clone(), namespace)
            .get_opt(name)
            .await
            .map_err(|source| LookupError {
                what: format!("{} {name:?}", K::kind(&K::DynamicType::default())),
                namespace: namespace.to_owned(),
                source,
            })
    }

    /// The named templates that exist. Those in `implicit` (fallbacks no field names, see
    /// [`crate::rules::cluster::implicit_defaults`]) are taken as absent when the delivering
    /// cache lacks them; any other name the cache lacks is read from the API server.
    pub async fn templates(
        &self,
        namespace: &str,
        names: &BTreeSet<(TemplateKind, String)>,
        implicit: &BTreeSet<(TemplateKind, String)>,
    ) -> Result<Templates, LookupError> {
        let of_kind = |kind: TemplateKind| {
            names
                .iter()
                .filter(move |(k, _)| *k == kind)
                .map(|(_, name)| name.as_str())
        };
        let cache = self.cache.as_deref();
        let (core, cell, shard) = futures::try_join!(
            try_join_all(of_kind(TemplateKind::Core).map(|name| async move {
                let trust = implicit.contains(&(TemplateKind::Core, name.to_owned()));
                let found = self.template(cache.map(|c| &c.core), namespace, name, trust);
                Ok::<_, LookupError>((name, found.await?))
            })),
            try_join_all(of_kind(TemplateKind::Cell).map(|name| async move {
                let trust = implicit.contains(&(TemplateKind::Cell, name.to_owned()));
                let found = self.template(cache.map(|c| &c.cell), namespace, name, trust);
                Ok::<_, LookupError>((name, found.await?))
            })),
            try_join_all(of_kind(TemplateKind::Shard).map(|name| async move {
                let trust = implicit.contains(&(TemplateKind::Shard, name.to_owned()));
                let found = self.template(cache.map(|c| &c.shard), namespace, name, trust);
                Ok::<_, LookupError>((name, found.await?))
            })),
        )?;
        Ok(Templates {
            core: existing(core, |t| t.spec),
            cell: existing(cell, |t| t.spec),
            shard: existing(shard, |t| t.spec),
        })
    }

    /// Which of the `wanted` kinds have a template named `default`.
    pub async fn default_templates(
        &self,
        namespace: &str,
        wanted: DefaultTemplates,
    ) -> Result<DefaultTemplates, LookupError> {
        let names: BTreeSet<(TemplateKind, String)> = [
            (wanted.core, TemplateKind::Core),
            (wanted.cell, TemplateKind::Cell),
            (wanted.shard, TemplateKind::Shard),
        ]
        .into_iter()
        .filter(|(want, _)| *want)
        .map(|(_, kind)| (kind, multigres_api::DEFAULT_TEMPLATE.to_owned()))
        .collect();
        // What is promoted is stored in the spec, so it may not depend on how far the watch has
        // got: a template created just before the cluster (one `kubectl apply` of both) is
        // missing from the cache for a moment. An absence is confirmed with a GET; clusters are
        // written rarely, and validation still trusts the cache (the controller re-resolves).
        let found = self.templates(namespace, &names, &BTreeSet::new()).await?;
        Ok(DefaultTemplates {
            core: !found.core.is_empty(),
            cell: !found.cell.is_empty(),
            shard: !found.shard.is_empty(),
        })
    }

    /// Whether at least one Node carries the label `key=value`: from the cache while its watch
    /// delivers, else a list of at most one Node's metadata, selected by the API server.
    pub async fn node_labelled(&self, key: &str, value: &str) -> Result<bool, kube::Error> {
        if let Some(found) = self
            .cache
            .as_ref()
            .and_then(|c| c.nodes.any_labelled(key, value))
        {
            return Ok(found);
        }
        let params = ListParams::default()
            .labels(&format!("{key}={value}"))
            .limit(1);
        Api::<Node>::all(self.client.clone())
            .list_metadata(&params)
            .await
            .map(|list| !list.items.is_empty())
    }

    /// Every Shard the operator manages, in every namespace: what each cluster's resolved spec
    /// asks for, its backup repository included.
    pub async fn shards(&self) -> Result<Vec<Shard>, kube::Error> {
        let managed = ListParams::default().labels(multigres_api::labels::MANAGED_SELECTOR);
        Api::<Shard>::all(self.client.clone())
            .list(&managed)
            .await
            .map(|list| list.items)
    }

    /// Every MultigresCluster of the namespace.
    pub async fn clusters(&self, namespace: &str) -> Result<Vec<MultigresCluster>, LookupError> {
        Api::<MultigresCluster>::namespaced(self.client.clone(), namespace)
            .list(&ListParams::default())
            .await
            .map(|list| list.items)
            .map_err(|source| LookupError {
                what: "MultigresClusters".to_owned(),
                namespace: namespace.to_owned(),
                source,
            })
    }
}

/// The specs of the templates found, by name.
fn existing<K, S>(
    found: Vec<(&str, Option<K>)>,
    spec: impl Fn(K) -> S,
) -> std::collections::BTreeMap<String, S> {
    found
        .into_iter()
        .filter_map(|(name, t)| t.map(|t| (name.to_owned(), spec(t))))
        .collect()
}

/// The watches filling the caches; dropping this stops them.
pub struct CacheWatches(Vec<JoinHandle<()>>);

impl Drop for CacheWatches {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// One cache per template kind, and the Nodes' labels.
struct Caches {
    core: Cached<CoreTemplate>,
    cell: Cached<CellTemplate>,
    shard: Cached<ShardTemplate>,
    nodes: Cached<PartialObjectMeta<Node>>,
}

/// Delays before a failed watch is started again.
const RESTART: BackoffPolicy = BackoffPolicy {
    base: Duration::from_secs(1),
    max: Duration::from_secs(30),
    jitter: 0.0,
};

/// The objects of one kind as its watch last delivered them, and whether that watch is
/// delivering (listed, and no error since).
struct Cached<K: Resource<DynamicType = ()> + Clone + 'static> {
    store: Store<K>,
    current: Arc<AtomicBool>,
}

impl<K> Cached<K>
where
    K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Debug
        + Send
        + Sync
        + 'static,
{
    /// Starts watching the templates `K` of every namespace, without their managed fields.
    fn templates(client: &Client) -> (Self, JoinHandle<()>) {
        Self::start(Api::all(client.clone()), |template| {
            template.managed_fields_mut().clear();
        })
    }
}

impl Cached<PartialObjectMeta<Node>> {
    /// Starts watching the Nodes' metadata, keeping their labels only.
    fn node_labels(client: &Client) -> (Self, JoinHandle<()>) {
        // `Api<PartialObjectMeta<_>>` lists and watches metadata only.
        Self::start(Api::all(client.clone()), |node| {
            node.managed_fields_mut().clear();
            node.annotations_mut().clear();
        })
    }

    /// Whether a Node carries the label `key=value`; `None` while the watch is not delivering.
    fn any_labelled(&self, key: &str, value: &str) -> Option<bool> {
        self.current.load(Ordering::Acquire).then(|| {
            self.store
                .find(|node| node.labels().get(key).is_some_and(|v| v == value))
                .is_some()
        })
    }
}

impl<K> Cached<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    /// Watches every object of `api` into the cache, each trimmed by `trim`. A watch that fails
    /// is started over, with a fresh list, rather than resumed: the cache is trusted again only
    /// once that list is in.
    fn start(api: Api<K>, trim: fn(&mut K)) -> (Self, JoinHandle<()>) {
        let (store, mut writer) = reflector::store();
        let current = Arc::new(AtomicBool::new(false));
        let flag = current.clone();
        let task = tokio::spawn(async move {
            let kind = K::kind(&());
            let mut failures = 0;
            loop {
                let mut events = std::pin::pin!(multigres_common::watch::watcher(
                    api.clone(),
                    watcher::Config::default()
                ));
                while let Some(event) = events.next().await {
                    match event {
                        Ok(event) => {
                            let event = event.modify(trim);
                            writer.apply_watcher_event(&event);
                            let listing = matches!(event, Event::Init | Event::InitApply(_));
                            flag.store(!listing, Ordering::Release);
                            if matches!(event, Event::InitDone) {
                                failures = 0;
                            }
                        }
                        Err(error) => {
                            flag.store(false, Ordering::Release);
                            failures += 1;
                            tracing::warn!(
                                %error,
                                %kind,
                                "watch failed; reading these objects from the API server until \
                                 it has listed them again"
                            );
                            break;
                        }
                    }
                }
                tokio::time::sleep(RESTART.delay(failures)).await;
            }
        });
        (Self { store, current }, task)
    }
}

/// What a template cache knows of one name.
enum Cache<K> {
    /// The watch is delivering and has it.
    Found(K),
    /// The watch is delivering and does not have it (as of the watch delay).
    Absent,
    /// The watch is not delivering: only the API server can say.
    Unknown,
}

impl<K: Resource<DynamicType = ()> + Clone + 'static> Cached<K> {
    /// What the cache knows of template `name` of `namespace`.
    fn get(&self, namespace: &str, name: &str) -> Cache<K> {
        if !self.current.load(Ordering::Acquire) {
            return Cache::Unknown;
        }
        match self.store.get(&ObjectRef::new(name).within(namespace)) {
            Some(t) => Cache::Found(K::clone(&t)),
            None => Cache::Absent,
        }
    }
}
