//! A watcher that starts over with a fresh list when the API server refuses to resume a watch.
//!
//! kube's watcher re-lists when a running watch reports 410 Gone, but when the request that
//! resumes a watch is itself refused with 410 it retries the same stale resourceVersion
//! forever; and it reports every 410 as an error, so the error backoff grows to 30 s while an
//! API server that just restarted keeps answering lists with versions its new watch cache
//! does not serve yet. Every handler watches through [`watcher()`] instead, over its [`Scope`].

use std::fmt::Debug;
use std::time::Duration;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use kube::runtime::watcher::{self, Config, Error, Event};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;

/// Which namespaces a handler serves: every namespace, or one (`--watch-namespace`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Every namespace (the ClusterRole bound with a ClusterRoleBinding).
    All,
    /// One namespace (the ClusterRole bound with a RoleBinding there).
    Namespace(String),
}

impl Scope {
    /// One namespace when `namespace` names one (an empty name is none), else every namespace.
    pub fn of(namespace: Option<String>) -> Self {
        match namespace.filter(|namespace| !namespace.is_empty()) {
            Some(namespace) => Scope::Namespace(namespace),
            None => Scope::All,
        }
    }

    /// The API of kind `K` over this scope.
    pub fn api<K>(&self, client: &Client) -> Api<K>
    where
        K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
    {
        match self {
            Scope::All => Api::all(client.clone()),
            Scope::Namespace(namespace) => Api::namespaced(client.clone(), namespace),
        }
    }
}

/// Pause before listing again after a 410 Gone, instead of the growing error backoff: right
/// after an API server restart a list can still answer with a version the new watch cache no
/// longer serves, and a watcher backed off to 30 s would miss changes for that long.
const RELIST_DELAY: Duration = Duration::from_secs(1);

/// Like [`kube::runtime::watcher()`], but 410 Gone is not an error: a watch resume refused with
/// it restarts the watcher, and a running watch ended by it re-lists, both after
/// `RELIST_DELAY` (a fresh list arrives as a new `Init`..`InitDone` round, which reflectors
/// apply as a whole).
pub fn watcher<K>(
    api: Api<K>,
    config: Config,
) -> impl Stream<Item = watcher::Result<Event<K>>> + Send + 'static
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    type Events<K> = BoxStream<'static, watcher::Result<Event<K>>>;
    futures::stream::unfold(None::<Events<K>>, move |current| {
        let (api, config) = (api.clone(), config.clone());
        async move {
            let start = || watcher::watcher(api.clone(), config.clone()).boxed();
            let mut events = current.unwrap_or_else(start);
            loop {
                let next = events.next().await?;
                match gone(&next) {
                    None => return Some((next, Some(events))),
                    Some(Gone::Resume) => {
                        tracing::info!("watch resume refused with 410 Gone; listing again");
                        tokio::time::sleep(RELIST_DELAY).await;
                        events = start();
                    }
                    Some(Gone::Watch) => {
                        tracing::info!("watch ended with 410 Gone; listing again");
                        tokio::time::sleep(RELIST_DELAY).await;
                    }
                }
            }
        }
    })
}

/// How the API server said a resource version is gone.
#[derive(Debug, PartialEq, Eq)]
enum Gone {
    /// It refused to resume a watch (kube would retry the same version forever).
    Resume,
    /// It ended a running watch (kube lists again by itself).
    Watch,
}

fn gone<K>(event: &watcher::Result<Event<K>>) -> Option<Gone> {
    match event {
        Err(Error::WatchStartFailed(kube::Error::Api(status))) if status.code == 410 => {
            Some(Gone::Resume)
        }
        Err(Error::WatchError(status)) if status.code == 410 => Some(Gone::Watch),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::core::Status;

    use super::*;

    fn refused(code: u16) -> watcher::Result<Event<ConfigMap>> {
        let mut status = Status::failure("too old resource version: 308 (593)", "Expired");
        status.code = code;
        Err(Error::WatchStartFailed(kube::Error::Api(Box::new(status))))
    }

    #[test]
    fn only_410_gone_is_taken_as_a_reason_to_list_again() {
        assert_eq!(gone(&refused(410)), Some(Gone::Resume));
        assert_eq!(gone(&refused(500)), None);
        assert_eq!(gone(&refused(403)), None);
        let mut status = Status::failure("too old resource version: 586 (595)", "Expired");
        status.code = 410;
        let ended: watcher::Result<Event<ConfigMap>> = Err(Error::WatchError(Box::new(status)));
        assert_eq!(gone(&ended), Some(Gone::Watch));
        assert_eq!(gone::<ConfigMap>(&Ok(Event::Init)), None);
    }
}
