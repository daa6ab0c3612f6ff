//! A watcher that starts over with a fresh list when the API server refuses to resume a watch.
//!
//! kube's watcher re-lists when a running watch reports 410 Gone, but when the request that
//! resumes a watch is itself refused with 410 it retries the same stale resourceVersion
//! forever. After an API server restart its watch cache refuses every version older than its
//! start exactly that way, so a handler would never see another change. Every handler watches
//! through [`watcher`] instead.

use std::fmt::Debug;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use kube::runtime::watcher::{self, Config, Error, Event};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;

/// Like [`kube::runtime::watcher()`], but a watch resume refused with 410 Gone restarts the
/// watcher (a fresh list, delivered as a new `Init`..`InitDone` round, which reflectors apply
/// as a whole).
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
            let mut events = current.unwrap_or_else(|| watcher::watcher(api, config).boxed());
            let next = events.next().await?;
            let keep = if is_resume_gone(&next) {
                tracing::info!("watch resume refused with 410 Gone; listing again");
                None
            } else {
                Some(events)
            };
            Some((next, keep))
        }
    })
}

/// Whether `event` is a watch resume the API server refused with 410 Gone.
fn is_resume_gone<K>(event: &watcher::Result<Event<K>>) -> bool {
    matches!(
        event,
        Err(Error::WatchStartFailed(kube::Error::Api(status))) if status.code == 410
    )
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
    fn only_a_resume_refused_as_gone_starts_over() {
        assert!(is_resume_gone(&refused(410)));
        assert!(!is_resume_gone(&refused(500)));
        assert!(!is_resume_gone(&refused(403)));
        assert!(!is_resume_gone::<ConfigMap>(&Ok(Event::Init)));
    }
}
