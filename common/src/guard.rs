//! A watched object that may fail to deserialize, without failing the watch it came in.
//!
//! kube's `DeserializeGuard` does the same by buffering every object in a `serde_value::Value`
//! and deserializing the kind from that buffer. That instantiates every watched kind's whole
//! deserializer a second time, for `serde_value`, beside the one the client's own requests use
//! (about 0.8-1.3 MiB of code in each handler, and a handler's resident memory at start is
//! mostly its code), and it copies each object once more. Here the object is kept as the JSON
//! text the API server sent and read from that text as the client reads every response
//! (`serde_json::from_str`), so no second copy of any kind's deserializer exists.

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

/// An object as a watch delivered it: the object, or why it could not be read and the metadata
/// that still names it (so the owner can be told which object is malformed).
#[derive(Debug, Clone)]
pub struct Guarded<K>(pub Result<K, InvalidObject>);

/// An object that did not deserialize as its kind.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{error}")]
pub struct InvalidObject {
    /// Why it could not be read, as `serde_json` says it (with the position in the object).
    pub error: String,
    /// The object's metadata, which was readable.
    pub metadata: ObjectMeta,
}

/// Only the metadata of an object, for naming one whose body is malformed.
#[derive(Deserialize)]
struct MetadataOnly {
    #[serde(default)]
    metadata: ObjectMeta,
}

impl<'de, K: DeserializeOwned> Deserialize<'de> for Guarded<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // The raw text can only be taken from `serde_json`'s own deserializer, which is what the
        // client reads every list and watch event with.
        let raw = <Box<RawValue>>::deserialize(deserializer)?;
        match serde_json::from_str::<K>(raw.get()) {
            Ok(object) => Ok(Self(Ok(object))),
            Err(error) => {
                let MetadataOnly { metadata } =
                    serde_json::from_str(raw.get()).map_err(D::Error::custom)?;
                Ok(Self(Err(InvalidObject {
                    error: error.to_string(),
                    metadata,
                })))
            }
        }
    }
}

impl<K: Resource> Resource for Guarded<K> {
    type DynamicType = K::DynamicType;
    type Scope = K::Scope;

    fn kind(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::kind(dt)
    }

    fn group(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::group(dt)
    }

    fn version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::version(dt)
    }

    fn plural(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        self.0
            .as_ref()
            .map_or_else(|invalid| &invalid.metadata, K::meta)
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        self.0
            .as_mut()
            .map_or_else(|invalid| &mut invalid.metadata, K::meta_mut)
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ConfigMap, Pod};
    use kube::api::ObjectList;
    use kube::core::WatchEvent;

    use super::*;

    #[test]
    fn a_valid_object_is_read_as_its_kind() {
        let map: Guarded<ConfigMap> = serde_json::from_str(
            r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","namespace":"n"},"data":{"k":"v"}}"#,
        )
        .unwrap();
        assert_eq!(map.meta().name.as_deref(), Some("a"));
        let data = map.0.unwrap().data.unwrap();
        assert_eq!(data["k"], "v");
    }

    #[test]
    fn a_malformed_object_keeps_its_name_and_says_what_is_wrong() {
        let pod: Guarded<Pod> = serde_json::from_str(
            r#"{"metadata":{"name":"p","namespace":"n"},"spec":{"containers":"not-a-list"}}"#,
        )
        .unwrap();
        assert_eq!(pod.meta().name.as_deref(), Some("p"));
        assert_eq!(pod.meta().namespace.as_deref(), Some("n"));
        let invalid = pod.0.unwrap_err();
        assert!(
            invalid
                .error
                .starts_with("invalid type: string \"not-a-list\", expected a sequence"),
            "{}",
            invalid.error
        );
    }

    #[test]
    fn an_object_whose_metadata_is_malformed_is_an_error() {
        let read = serde_json::from_str::<Guarded<Pod>>(r#"{"metadata":{"name":7}}"#);
        assert!(read.is_err());
    }

    #[test]
    fn lists_and_watch_events_carry_malformed_objects_beside_good_ones() {
        let list: ObjectList<Guarded<Pod>> = serde_json::from_str(
            r#"{"apiVersion":"v1","kind":"PodList","metadata":{"resourceVersion":"5"},"items":[
                {"metadata":{"name":"good"},"spec":{"containers":[]}},
                {"metadata":{"name":"bad"},"spec":{"containers":7}}]}"#,
        )
        .unwrap();
        let read: Vec<_> = list
            .items
            .iter()
            .map(|p| (p.meta().name.clone(), p.0.is_ok()))
            .collect();
        assert_eq!(
            read,
            [(Some("good".into()), true), (Some("bad".into()), false)]
        );
        let event: WatchEvent<Guarded<Pod>> = serde_json::from_str(
            r#"{"type":"MODIFIED","object":{"metadata":{"name":"bad"},"spec":{"containers":7}}}"#,
        )
        .unwrap();
        let WatchEvent::Modified(pod) = event else {
            panic!("expected a modification, got {event:?}");
        };
        assert_eq!(pod.meta().name.as_deref(), Some("bad"));
        assert!(pod.0.is_err());
    }
}
