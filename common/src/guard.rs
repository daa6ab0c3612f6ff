//! A watched object that may fail to deserialize, without failing the watch it came in: kube's
//! `DeserializeGuard`, under the name every handler reads it by.

pub use kube::core::DeserializeGuard as Guarded;
pub use kube::core::error_boundary::InvalidObject;

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ConfigMap, Pod};
    use kube::api::ObjectList;
    use kube::core::WatchEvent;

    use kube::Resource;

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
            invalid.error.contains("not-a-list") && invalid.error.contains("sequence"),
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
