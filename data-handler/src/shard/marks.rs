//! The marks step of the Shard controller: the role label (`multigres.com/role`) and reload
//! stamp each pool pod must carry, from the published roles and the reloads confirmed now.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use multigres_api::labels::ROLE;
use multigres_api::postgres::RELOAD_HASH_ANNOTATION;

use crate::roles;

/// The marks of a pool pod that differ from what it carries.
#[derive(Debug, PartialEq)]
pub struct Mark<'p> {
    /// The pod.
    pub pod: &'p Pod,
    /// Its role label (`primary` / `replica`); none while its role is not published.
    pub role: Option<String>,
    /// Its reload stamp: the fingerprint confirmed now, else the one it carries.
    pub stamp: Option<&'p str>,
    /// Whether the stamp is new: its reload was confirmed now.
    pub stamped: bool,
}

/// The pods of `pods` whose marks must change, given the `published` roles (pod → role) and
/// the reloads confirmed now (`stamps`: pod → fingerprint).
pub fn marks<'p>(
    pods: &'p [Pod],
    published: &BTreeMap<String, String>,
    stamps: &'p BTreeMap<String, String>,
) -> Vec<Mark<'p>> {
    pods.iter()
        .filter_map(|pod| {
            let carried = pod.annotations().get(RELOAD_HASH_ANNOTATION);
            let role = published
                .get(&pod.name_any())
                .map(|r| roles::label_value(r));
            let stamp = stamps.get(&pod.name_any()).or(carried);
            let stamped = stamp != carried;
            (pod.labels().get(ROLE) != role.as_ref() || stamped).then(|| Mark {
                pod,
                role,
                stamp: stamp.map(String::as_str),
                stamped,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, role: Option<&str>, stamp: Option<&str>) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some(name.into());
        p.metadata.labels = role.map(|r| BTreeMap::from([(ROLE.to_owned(), r.to_owned())]));
        p.metadata.annotations =
            stamp.map(|s| BTreeMap::from([(RELOAD_HASH_ANNOTATION.to_owned(), s.to_owned())]));
        p
    }

    #[test]
    fn only_pods_whose_role_or_stamp_changes_are_marked() {
        let pods = [
            pod("p-0", Some("primary"), Some("h1")),
            pod("p-1", Some("primary"), Some("h1")),
            pod("p-2", Some("replica"), None),
            pod("p-3", None, None),
        ];
        let published = BTreeMap::from([
            ("p-0".to_owned(), roles::PRIMARY.to_owned()),
            ("p-1".to_owned(), roles::REPLICA.to_owned()),
            ("p-2".to_owned(), roles::REPLICA.to_owned()),
        ]);
        let stamps = BTreeMap::from([("p-2".to_owned(), "h2".to_owned())]);
        assert_eq!(
            marks(&pods, &published, &stamps),
            [
                Mark {
                    pod: &pods[1],
                    role: Some("replica".to_owned()),
                    stamp: Some("h1"),
                    stamped: false,
                },
                Mark {
                    pod: &pods[2],
                    role: Some("replica".to_owned()),
                    stamp: Some("h2"),
                    stamped: true,
                },
            ],
            "p-0 carries its marks; p-3 has no role to publish"
        );
    }
}
