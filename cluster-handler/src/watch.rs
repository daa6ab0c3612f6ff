//! Reading the caches of the shared watches ([`multigres_common::shared_watch`]): every object
//! behind a [`multigres_common::guard::Guarded`], so a malformed object becomes a per-object error
//! instead of a failed watch.

use kube::Resource;
use kube::runtime::reflector::Store;
pub use multigres_common::shared_watch::Guarded;

/// The valid objects of `store` in `namespace`.
pub fn in_namespace<K>(
    store: &Store<Guarded<K>>,
    namespace: &str,
) -> Vec<std::sync::Arc<Guarded<K>>>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    store
        .state()
        .into_iter()
        .filter(|obj| obj.meta().namespace.as_deref() == Some(namespace))
        .collect()
}
