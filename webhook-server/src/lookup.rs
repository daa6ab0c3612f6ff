//! Reads of other objects for the rules: templates and clusters of the request's namespace.
//!
//! Direct GET/LIST against the API server rather than a watch cache: a template created a moment
//! before a cluster that names it must be found, and a cluster created a moment before a
//! template's deletion must block it. The API server serves these reads from its own watch
//! cache, so they stay cheap, and the webhook needs neither memory for every template and
//! cluster of the whole cluster nor list/watch permissions beyond the kinds it reads.

use std::collections::BTreeSet;

use futures::future::try_join_all;
use kube::api::{Api, ListParams};
use kube::{Client, Resource};
use multigres_api::v1alpha1::{CellTemplate, CoreTemplate, MultigresCluster, ShardTemplate};
use serde::de::DeserializeOwned;

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

/// Lookups through one client.
#[derive(Clone)]
pub struct Lookups {
    client: Client,
}

impl Lookups {
    /// Lookups with `client`.
    pub fn new(client: Client) -> Self {
        Self { client }
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

    /// The named templates that exist.
    pub async fn templates(
        &self,
        namespace: &str,
        names: &BTreeSet<(TemplateKind, String)>,
    ) -> Result<Templates, LookupError> {
        let of_kind = |kind: TemplateKind| {
            names
                .iter()
                .filter(move |(k, _)| *k == kind)
                .map(|(_, name)| name.as_str())
        };
        let (core, cell, shard) = futures::try_join!(
            try_join_all(of_kind(TemplateKind::Core).map(|name| async move {
                Ok::<_, LookupError>((name, self.get::<CoreTemplate>(namespace, name).await?))
            })),
            try_join_all(of_kind(TemplateKind::Cell).map(|name| async move {
                Ok::<_, LookupError>((name, self.get::<CellTemplate>(namespace, name).await?))
            })),
            try_join_all(of_kind(TemplateKind::Shard).map(|name| async move {
                Ok::<_, LookupError>((name, self.get::<ShardTemplate>(namespace, name).await?))
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
        let found = self.templates(namespace, &names).await?;
        Ok(DefaultTemplates {
            core: !found.core.is_empty(),
            cell: !found.cell.is_empty(),
            shard: !found.shard.is_empty(),
        })
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
