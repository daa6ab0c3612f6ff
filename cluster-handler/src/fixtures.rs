//! Test fixtures: the shipped samples (`deploy/samples/*.yaml`) and small YAML documents, as
//! the API server would hand them to a reconciler (namespace, uid and generation set).

use std::path::Path;

use multigres_api::resolver::Templates;
use multigres_api::v1alpha1::{CellTemplate, CoreTemplate, MultigresCluster, ShardTemplate};
use serde::Deserialize;
use serde::de::DeserializeOwned;

/// Namespace every fixture lives in.
pub const NAMESPACE: &str = "ns";

/// A cluster with the templates of its sample file.
pub struct Sample {
    pub cluster: MultigresCluster,
    pub templates: Templates,
}

/// Sets what the API server sets on a stored object.
pub fn stored<K: kube::Resource>(mut obj: K, uid: &str, generation: i64) -> K {
    let meta = obj.meta_mut();
    meta.namespace = Some(NAMESPACE.to_owned());
    meta.uid = Some(uid.to_owned());
    meta.generation = Some(generation);
    obj
}

/// Parses one YAML document into `K`.
pub fn from_yaml<K: DeserializeOwned>(text: &str) -> K {
    serde_yaml::from_str(text).unwrap_or_else(|e| panic!("fixture does not parse: {e}\n{text}"))
}

/// Every document of `deploy/samples/<name>.yaml`, the cluster stored with uid `uid-<name>`
/// and generation 1.
pub fn sample(name: &str) -> Sample {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/samples")
        .join(format!("{name}.yaml"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let mut cluster = None;
    let mut templates = Templates::default();
    for document in serde_yaml::Deserializer::from_str(&text) {
        let value = serde_yaml::Value::deserialize(document).expect("sample YAML");
        let kind = value["kind"].as_str().unwrap_or_default().to_owned();
        let name = value["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        match kind.as_str() {
            "MultigresCluster" => {
                let parsed: MultigresCluster = serde_yaml::from_value(value).expect("cluster");
                cluster = Some(stored(parsed, &format!("uid-{name}"), 1));
            }
            "CoreTemplate" => {
                let t: CoreTemplate = serde_yaml::from_value(value).expect("CoreTemplate");
                templates.core.insert(name, t.spec);
            }
            "CellTemplate" => {
                let t: CellTemplate = serde_yaml::from_value(value).expect("CellTemplate");
                templates.cell.insert(name, t.spec);
            }
            "ShardTemplate" => {
                let t: ShardTemplate = serde_yaml::from_value(value).expect("ShardTemplate");
                templates.shard.insert(name, t.spec);
            }
            _ => {}
        }
    }
    Sample {
        cluster: cluster.unwrap_or_else(|| panic!("{} has no MultigresCluster", path.display())),
        templates,
    }
}
