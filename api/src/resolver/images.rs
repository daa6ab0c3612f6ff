//! Component images as operator configuration: the default set, its revision, and the record
//! of which default set a cluster has adopted. Shared by the cluster-handler (which decides
//! when a cluster adopts a new default set) and the resource-handler (whose multiadmin must
//! run the same images as the rest of the cluster).
//!
//! Component images are never persisted into `spec.images`: unset components are filled in
//! memory from the adopted default set at reconcile time.

use sha2::{Digest, Sha256};

use crate::v1alpha1::{ClusterImages, ComponentImages, ImageRef, MultigresCluster};

use super::defaults;

/// Cluster annotation recording the default image set the cluster adopted (JSON of
/// [`ComponentImages`]), or [`FULLY_PINNED`]. Written before children change, so a restart
/// between the two never rolls a held cluster.
pub const APPLIED_IMAGES_ANNOTATION: &str = "multigres.com/applied-images";

/// Value of [`APPLIED_IMAGES_ANNOTATION`] when every image is set in `spec.images`: no default
/// set is in use, and unpinning adopts the operator's current defaults.
pub const FULLY_PINNED: &str = "fully-pinned";

/// The image set compiled into this operator build.
pub fn compiled_defaults() -> ComponentImages {
    let multigres = || Some(ImageRef::new(defaults::MULTIGRES_IMAGE));
    ComponentImages {
        multigateway: multigres(),
        multiorch: multigres(),
        multipooler: multigres(),
        multiadmin: multigres(),
        multiadmin_web: Some(ImageRef::new(defaults::MULTIADMIN_WEB_IMAGE)),
        postgres: Some(ImageRef::new(defaults::POSTGRES_IMAGE)),
    }
}

/// The set's `component=image` pairs, sorted by component name.
fn lines(set: &ComponentImages) -> [(&'static str, Option<&ImageRef>); 6] {
    [
        ("multiadmin", set.multiadmin.as_ref()),
        ("multiadminweb", set.multiadmin_web.as_ref()),
        ("multigateway", set.multigateway.as_ref()),
        ("multiorch", set.multiorch.as_ref()),
        ("multipooler", set.multipooler.as_ref()),
        ("postgres", set.postgres.as_ref()),
    ]
}

/// Whether every component has a non-empty image: only a complete record can be trusted, since
/// a partial one would silently drop components to compiled-in fallbacks.
pub fn is_complete(set: &ComponentImages) -> bool {
    lines(set)
        .iter()
        .all(|(_, image)| image.is_some_and(|i| !i.as_str().is_empty()))
}

/// Short content hash naming an image set: the first 12 hex digits of the SHA-256 of its
/// sorted `component=image` lines joined by newlines. Users copy it into
/// `spec.imageUpdatePolicy.acknowledgedRevision` to adopt a set under the lazy strategy.
pub fn revision(set: &ComponentImages) -> String {
    let text = lines(set)
        .iter()
        .map(|(name, image)| format!("{name}={}", image.map_or("", |i| i.as_str())))
        .collect::<Vec<_>>()
        .join("\n");
    let digest = Sha256::digest(text.as_bytes());
    digest.iter().take(6).map(|b| format!("{b:02x}")).collect()
}

/// The component images `spec.images` sets, without pull settings.
pub fn pinned(spec: Option<&ClusterImages>) -> ComponentImages {
    let spec = spec.cloned().unwrap_or_default();
    ComponentImages {
        multigateway: spec.multigateway,
        multiorch: spec.multiorch,
        multipooler: spec.multipooler,
        multiadmin: spec.multiadmin,
        multiadmin_web: spec.multiadmin_web,
        postgres: spec.postgres,
    }
}

/// `pins` over `defaults`, component by component.
pub fn overlay(pins: &ComponentImages, defaults: &ComponentImages) -> ComponentImages {
    let pick = |p: &Option<ImageRef>, d: &Option<ImageRef>| p.clone().or_else(|| d.clone());
    ComponentImages {
        multigateway: pick(&pins.multigateway, &defaults.multigateway),
        multiorch: pick(&pins.multiorch, &defaults.multiorch),
        multipooler: pick(&pins.multipooler, &defaults.multipooler),
        multiadmin: pick(&pins.multiadmin, &defaults.multiadmin),
        multiadmin_web: pick(&pins.multiadmin_web, &defaults.multiadmin_web),
        postgres: pick(&pins.postgres, &defaults.postgres),
    }
}

/// A copy of `cluster` whose `spec.images` has every unset component filled from `set`, in
/// memory only, so resolution hands children concrete images.
pub fn complete(cluster: &MultigresCluster, set: &ComponentImages) -> MultigresCluster {
    let mut cluster = cluster.clone();
    let mut images = cluster.spec.images.take().unwrap_or_default();
    let filled = overlay(&pinned(Some(&images)), set);
    images.multigateway = filled.multigateway;
    images.multiorch = filled.multiorch;
    images.multipooler = filled.multipooler;
    images.multiadmin = filled.multiadmin;
    images.multiadmin_web = filled.multiadmin_web;
    images.postgres = filled.postgres;
    cluster.spec.images = Some(images);
    cluster
}

/// What the applied-images record of a cluster says.
#[derive(Clone, Debug, PartialEq)]
pub enum Record {
    /// No record: the cluster adopts the current defaults.
    None,
    /// Every image is pinned; unpinning adopts the current defaults.
    FullyPinned,
    /// The complete default set the cluster runs.
    Set(ComponentImages),
    /// A record that cannot be used, and why.
    Invalid(String),
}

/// The cluster's record: its annotation, else the complete `status.images.applied` (the
/// annotation may be lost, e.g. by `kubectl replace`).
pub fn record(cluster: &MultigresCluster) -> Record {
    let annotation = cluster
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(APPLIED_IMAGES_ANNOTATION));
    let from_status = || {
        cluster
            .status
            .as_ref()
            .and_then(|s| s.images.as_ref())
            .and_then(|i| i.applied.clone())
            .filter(is_complete)
    };
    match annotation.map(String::as_str) {
        Some(FULLY_PINNED) => Record::FullyPinned,
        Some(text) => match serde_json::from_str::<ComponentImages>(text) {
            Ok(set) if is_complete(&set) => Record::Set(set),
            Ok(_) => from_status().map_or_else(
                || Record::Invalid("it does not name an image for every component".to_owned()),
                Record::Set,
            ),
            Err(error) => from_status().map_or_else(
                || Record::Invalid(format!("it is not a JSON image set: {error}")),
                Record::Set,
            ),
        },
        None => from_status().map_or(Record::None, Record::Set),
    }
}

/// The images the cluster's children run, as far as a reader of the cluster can tell: the pins
/// over the recorded default set, or over the compiled defaults when nothing is recorded yet.
pub fn recorded_effective(cluster: &MultigresCluster) -> ComponentImages {
    let base = match record(cluster) {
        Record::Set(set) => set,
        Record::None | Record::FullyPinned | Record::Invalid(_) => compiled_defaults(),
    };
    overlay(&pinned(cluster.spec.images.as_ref()), &base)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::v1alpha1::{ImagesStatus, MultigresClusterStatus};

    fn set(tag: &str) -> ComponentImages {
        let image = |name: &str| Some(ImageRef::new(format!("test/{name}:{tag}")));
        ComponentImages {
            multigateway: image("multigres"),
            multiorch: image("multigres"),
            multipooler: image("multigres"),
            multiadmin: image("multigres"),
            multiadmin_web: image("web"),
            postgres: image("pgctld"),
        }
    }

    fn annotated(value: Option<&str>, status: Option<ComponentImages>) -> MultigresCluster {
        let mut cluster = MultigresCluster::new("c", Default::default());
        cluster.metadata.annotations =
            value.map(|v| BTreeMap::from([(APPLIED_IMAGES_ANNOTATION.to_owned(), v.to_owned())]));
        cluster.status = status.map(|applied| MultigresClusterStatus {
            images: Some(ImagesStatus {
                applied: Some(applied),
                ..Default::default()
            }),
            ..Default::default()
        });
        cluster
    }

    #[test]
    fn revision_is_twelve_hex_digits_of_the_sorted_lines() {
        // sha256 of "multiadmin=test/multigres:v1\nmultiadminweb=test/web:v1\n...\n
        // postgres=test/pgctld:v1", computed independently.
        let s = set("v1");
        assert_eq!(revision(&s), "9cd45c308107");
        let mut other = s.clone();
        other.postgres = Some(ImageRef::new("test/pgctld:v2"));
        assert_ne!(revision(&s), revision(&other));
    }

    #[test]
    fn completeness_needs_every_component() {
        assert!(is_complete(&compiled_defaults()));
        let mut partial = set("v1");
        partial.multipooler = None;
        assert!(!is_complete(&partial));
        partial.multipooler = Some(ImageRef::new(""));
        assert!(!is_complete(&partial));
        assert!(!is_complete(&ComponentImages::default()));
    }

    #[test]
    fn complete_fills_only_unset_components_and_keeps_pull_settings() {
        let mut cluster = MultigresCluster::new("c", Default::default());
        cluster.spec.images = Some(ClusterImages {
            postgres: Some(ImageRef::new("pinned/pgctld:v0")),
            image_pull_secrets: vec![Default::default()],
            ..Default::default()
        });
        let done = complete(&cluster, &set("v2"));
        let images = done.spec.images.unwrap();
        assert_eq!(images.postgres.unwrap().as_str(), "pinned/pgctld:v0");
        assert_eq!(images.multiorch.unwrap().as_str(), "test/multigres:v2");
        assert_eq!(images.image_pull_secrets.len(), 1);
    }

    #[test]
    fn record_reads_the_annotation_then_a_complete_status() {
        let json = serde_json::to_string(&set("v1")).unwrap();
        assert_eq!(
            record(&annotated(Some(&json), None)),
            Record::Set(set("v1"))
        );
        assert_eq!(
            record(&annotated(Some(FULLY_PINNED), Some(set("v0")))),
            Record::FullyPinned
        );
        assert_eq!(
            record(&annotated(None, Some(set("v0")))),
            Record::Set(set("v0"))
        );
        assert_eq!(record(&annotated(None, None)), Record::None);
        let mut partial = set("v0");
        partial.postgres = None;
        assert_eq!(record(&annotated(None, Some(partial))), Record::None);
        assert_eq!(
            record(&annotated(Some("{not json"), Some(set("v0")))),
            Record::Set(set("v0"))
        );
        assert!(matches!(
            record(&annotated(Some("{not json"), None)),
            Record::Invalid(m) if m.contains("not a JSON image set")
        ));
        assert!(matches!(
            record(&annotated(Some(r#"{"postgres":"x"}"#), None)),
            Record::Invalid(m) if m.contains("every component")
        ));
    }

    #[test]
    fn recorded_effective_puts_pins_over_the_record() {
        let json = serde_json::to_string(&set("v1")).unwrap();
        let mut cluster = annotated(Some(&json), None);
        cluster.spec.images = Some(ClusterImages {
            multiadmin: Some(ImageRef::new("pinned/admin")),
            ..Default::default()
        });
        let effective = recorded_effective(&cluster);
        assert_eq!(effective.multiadmin.unwrap().as_str(), "pinned/admin");
        assert_eq!(effective.multiorch.unwrap().as_str(), "test/multigres:v1");
        assert_eq!(
            recorded_effective(&annotated(None, None)),
            compiled_defaults()
        );
    }
}
