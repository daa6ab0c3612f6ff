//! The templates of a namespace, as the resolver takes them, read from a handler's caches.

use std::collections::BTreeMap;

use kube::Resource;
use kube::runtime::reflector::Store;
use multigres_api::resolver::Templates;
use multigres_api::v1alpha1::{CellTemplate, CoreTemplate, ShardTemplate};

use crate::guard::Guarded;

/// The cached templates of each kind.
#[derive(Clone)]
pub struct TemplateStores {
    /// CoreTemplates.
    pub core: Store<Guarded<CoreTemplate>>,
    /// CellTemplates.
    pub cell: Store<Guarded<CellTemplate>>,
    /// ShardTemplates.
    pub shard: Store<Guarded<ShardTemplate>>,
}

impl TemplateStores {
    /// The valid templates of `namespace`, by kind and name. One that cannot be read counts
    /// as missing, which the resolver reports when a cluster uses it. (The cluster-handler,
    /// which owns the resolution, reads them its own way: an unreadable template a cluster
    /// references is its error.)
    pub fn of_namespace(&self, namespace: &str) -> Templates {
        Templates {
            core: specs(&self.core, namespace, |t: &CoreTemplate| t.spec.clone()),
            cell: specs(&self.cell, namespace, |t: &CellTemplate| t.spec.clone()),
            shard: specs(&self.shard, namespace, |t: &ShardTemplate| t.spec.clone()),
        }
    }
}

fn specs<T, S>(store: &Store<Guarded<T>>, namespace: &str, spec: fn(&T) -> S) -> BTreeMap<String, S>
where
    T: Resource<DynamicType = ()> + Clone + 'static,
{
    store
        .state()
        .iter()
        .filter_map(|t| t.0.as_ref().ok())
        .filter(|t| t.meta().namespace.as_deref() == Some(namespace))
        .filter_map(|t| Some((t.meta().name.clone()?, spec(t))))
        .collect()
}
