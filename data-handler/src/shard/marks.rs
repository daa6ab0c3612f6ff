//! The marks step of the Shard controller: the labels (`multigres.com/role`,
//! `multigres.com/cohort`) and reload stamp each pool pod must carry, from the published roles
//! and cohort and the reloads confirmed now.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use multigres_api::labels::{COHORT, ROLE};
use multigres_api::postgres::RELOAD_HASH_ANNOTATION;

use crate::roles;

/// The marks of a pool pod that differ from what it carries.
#[derive(Debug, PartialEq)]
pub struct Mark<'p> {
    /// The pod.
    pub pod: &'p Pod,
    /// Its role label (`primary` / `replica`); none while its role is not published.
    pub role: Option<String>,
    /// Its cohort label (`member` / `outside`); none while the cohort was never read.
    pub cohort: Option<&'static str>,
    /// Its reload stamp: the fingerprint confirmed now, else the one it carries.
    pub stamp: Option<&'p str>,
    /// Whether the stamp is new: its reload was confirmed now.
    pub stamped: bool,
}

impl Mark<'_> {
    /// The labels to apply: every label this handler owns on the pod, since an apply drops
    /// those it leaves out.
    pub fn labels(&self) -> BTreeMap<&'static str, &str> {
        let mut labels = BTreeMap::new();
        if let Some(role) = &self.role {
            labels.insert(ROLE, role.as_str());
        }
        if let Some(cohort) = self.cohort {
            labels.insert(COHORT, cohort);
        }
        labels
    }
}

/// The pods of `pods` whose marks must change, given the `published` roles (pod → role), each
/// pod's cohort label (`cohort`) and the reloads confirmed now (`stamps`: pod → fingerprint).
pub fn marks<'p>(
    pods: &'p [Pod],
    published: &BTreeMap<String, String>,
    cohort: impl Fn(&str) -> Option<&'static str>,
    stamps: &'p BTreeMap<String, String>,
) -> Vec<Mark<'p>> {
    pods.iter()
        .filter_map(|pod| {
            let name = pod.name_any();
            let carried = pod.annotations().get(RELOAD_HASH_ANNOTATION);
            let role = published.get(&name).map(|r| roles::label_value(r));
            let member = cohort(&name);
            let stamp = stamps.get(&name).or(carried);
            let stamped = stamp != carried;
            let labels = pod.labels();
            let relabel = labels.get(ROLE) != role.as_ref()
                || labels.get(COHORT).map(String::as_str) != member;
            (relabel || stamped).then(|| Mark {
                pod,
                role,
                cohort: member,
                stamp: stamp.map(String::as_str),
                stamped,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use multigres_api::labels::{COHORT_MEMBER, COHORT_OUTSIDE};

    use super::*;

    fn pod(name: &str, labels: &[(&str, &str)], stamp: Option<&str>) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some(name.into());
        p.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        );
        p.metadata.annotations =
            stamp.map(|s| BTreeMap::from([(RELOAD_HASH_ANNOTATION.to_owned(), s.to_owned())]));
        p
    }

    #[test]
    fn only_pods_whose_role_or_stamp_changes_are_marked() {
        let pods = [
            pod("p-0", &[(ROLE, "primary")], Some("h1")),
            pod("p-1", &[(ROLE, "primary")], Some("h1")),
            pod("p-2", &[(ROLE, "replica")], None),
            pod("p-3", &[], None),
        ];
        let published = BTreeMap::from([
            ("p-0".to_owned(), roles::PRIMARY.to_owned()),
            ("p-1".to_owned(), roles::REPLICA.to_owned()),
            ("p-2".to_owned(), roles::REPLICA.to_owned()),
        ]);
        let stamps = BTreeMap::from([("p-2".to_owned(), "h2".to_owned())]);
        assert_eq!(
            marks(&pods, &published, |_| None, &stamps),
            [
                Mark {
                    pod: &pods[1],
                    role: Some("replica".to_owned()),
                    cohort: None,
                    stamp: Some("h1"),
                    stamped: false,
                },
                Mark {
                    pod: &pods[2],
                    role: Some("replica".to_owned()),
                    cohort: None,
                    stamp: Some("h2"),
                    stamped: true,
                },
            ],
            "p-0 carries its marks; p-3 has no role to publish"
        );
    }

    #[test]
    fn a_cohort_change_relabels_with_every_owned_label() {
        let pods = [
            pod("p-0", &[(ROLE, "primary"), (COHORT, COHORT_MEMBER)], None),
            pod("p-1", &[(ROLE, "replica")], None),
        ];
        let published = BTreeMap::from([
            ("p-0".to_owned(), roles::PRIMARY.to_owned()),
            ("p-1".to_owned(), roles::REPLICA.to_owned()),
        ]);
        let cohort = |pod: &str| {
            Some(if pod == "p-0" {
                COHORT_MEMBER
            } else {
                COHORT_OUTSIDE
            })
        };
        let stamps = BTreeMap::new();
        let found = marks(&pods, &published, cohort, &stamps);
        assert_eq!(found.len(), 1, "p-0 carries its labels: {found:?}");
        assert_eq!(
            found[0].labels(),
            BTreeMap::from([(ROLE, "replica"), (COHORT, COHORT_OUTSIDE)])
        );
    }
}
