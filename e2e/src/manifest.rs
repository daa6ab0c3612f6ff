//! Multi-document YAML manifests and server-side apply of arbitrary kinds, the way
//! `kubectl apply --server-side` does it (kind resolved through discovery, strict field
//! validation, one field manager).

use std::path::{Path, PathBuf};

use kube::Client;
use kube::api::{Api, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::discovery::Scope;
use serde::Deserialize;

/// Field manager used for everything the harness and the tests apply.
pub const FIELD_MANAGER: &str = "multigres-e2e";

/// Errors reading manifests or applying them.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("parsing {path}: {source}")]
    Parse {
        path: PathBuf,
        source: serde_yaml::Error,
    },
    #[error("document {name:?} has no apiVersion/kind")]
    NoType { name: Option<String> },
    #[error("document has no metadata.name (kind {kind})")]
    NoName { kind: String },
    #[error("resolving {gvk} through discovery: {source}")]
    Discovery {
        gvk: String,
        source: Box<kube::Error>,
    },
    /// The API server refused the object; `source` carries its message.
    #[error("applying {kind} {name}: {source}")]
    Apply {
        kind: String,
        name: String,
        source: Box<kube::Error>,
    },
}

impl ManifestError {
    /// The API server's own message when it refused the object (schema, CEL, admission), or
    /// `None` for any other failure (I/O, parsing, discovery, transport).
    pub fn rejection_message(&self) -> Option<&str> {
        match self {
            ManifestError::Apply { source, .. } => match source.as_ref() {
                kube::Error::Api(status) => Some(status.message.as_str()),
                _ => None,
            },
            _ => None,
        }
    }
}

/// Parses every non-empty document of a YAML stream.
pub fn parse_documents(text: &str, path: &Path) -> Result<Vec<DynamicObject>, ManifestError> {
    let mut docs = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(text) {
        let value = serde_yaml::Value::deserialize(doc).map_err(|source| ManifestError::Parse {
            path: path.to_path_buf(),
            source,
        })?;
        if value.is_null() {
            continue;
        }
        let obj = serde_yaml::from_value(value).map_err(|source| ManifestError::Parse {
            path: path.to_path_buf(),
            source,
        })?;
        docs.push(obj);
    }
    Ok(docs)
}

/// Reads and parses every document of a YAML file.
pub fn read_documents(path: &Path) -> Result<Vec<DynamicObject>, ManifestError> {
    let text = std::fs::read_to_string(path).map_err(|source| ManifestError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse_documents(&text, path)
}

/// The `*.yaml`/`*.yml` files directly in `dir`, sorted; empty if the directory does not exist.
pub fn yaml_files(dir: &Path) -> Result<Vec<PathBuf>, ManifestError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(ManifestError::Read {
                path: dir.to_path_buf(),
                source,
            });
        }
    };
    let mut files = Vec::new();
    for entry in entries {
        let path = entry
            .map_err(|source| ManifestError::Read {
                path: dir.to_path_buf(),
                source,
            })?
            .path();
        let is_yaml = path
            .extension()
            .is_some_and(|ext| ext == "yaml" || ext == "yml");
        if is_yaml && path.is_file() {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// Whether an apply is persisted or only evaluated by the server (`dryRun=All`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Persist the object.
    Apply,
    /// Run every validation and admission step, persist nothing.
    DryRun,
}

/// Server-side applies one object (forced, strict field validation). Namespaced kinds go into
/// `namespace` when given (overriding the document's own), else the document's namespace, else
/// `default`.
pub async fn apply(
    client: &Client,
    obj: &DynamicObject,
    namespace: Option<&str>,
    mode: Mode,
) -> Result<DynamicObject, ManifestError> {
    let types = obj.types.as_ref().ok_or_else(|| ManifestError::NoType {
        name: obj.metadata.name.clone(),
    })?;
    let gvk = GroupVersionKind::try_from(types).map_err(|_| ManifestError::NoType {
        name: obj.metadata.name.clone(),
    })?;
    let name = obj
        .metadata
        .name
        .clone()
        .ok_or_else(|| ManifestError::NoName {
            kind: gvk.kind.clone(),
        })?;
    let (resource, caps) = kube::discovery::pinned_kind(client, &gvk)
        .await
        .map_err(|source| ManifestError::Discovery {
            gvk: format!("{}/{} {}", gvk.group, gvk.version, gvk.kind),
            source: Box::new(source),
        })?;
    let mut obj = obj.clone();
    let api: Api<DynamicObject> = match caps.scope {
        Scope::Cluster => {
            obj.metadata.namespace = None;
            Api::all_with(client.clone(), &resource)
        }
        Scope::Namespaced => {
            let ns = namespace
                .map(str::to_string)
                .or_else(|| obj.metadata.namespace.clone())
                .unwrap_or_else(|| "default".to_string());
            obj.metadata.namespace = Some(ns.clone());
            Api::namespaced_with(client.clone(), &ns, &resource)
        }
    };
    let mut params = PatchParams::apply(FIELD_MANAGER)
        .force()
        .validation_strict();
    if mode == Mode::DryRun {
        params = params.dry_run();
    }
    api.patch(&name, &params, &Patch::Apply(&obj))
        .await
        .map_err(|source| ManifestError::Apply {
            kind: gvk.kind,
            name,
            source: Box::new(source),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_non_empty_document() {
        let text = "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\ndata:\n  k: v\n---\n# only a comment\n---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: b\n";
        let docs = parse_documents(text, Path::new("x.yaml")).unwrap();
        let names: Vec<_> = docs
            .iter()
            .map(|d| {
                (
                    d.types.as_ref().unwrap().kind.as_str(),
                    d.metadata.name.as_deref().unwrap(),
                )
            })
            .collect();
        assert_eq!(names, [("ConfigMap", "a"), ("Secret", "b")]);
        assert_eq!(docs[0].data["data"]["k"], "v");
    }

    #[test]
    fn a_malformed_document_names_its_file() {
        let err = parse_documents("a: [", Path::new("broken.yaml")).unwrap_err();
        assert!(err.to_string().contains("broken.yaml"), "{err}");
    }

    #[test]
    fn lists_only_yaml_files_sorted() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["b.yaml", "a.yml", "c.txt"] {
            std::fs::write(dir.path().join(name), "").unwrap();
        }
        let files: Vec<_> = yaml_files(dir.path())
            .unwrap()
            .into_iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(files, ["a.yml", "b.yaml"]);
        assert!(yaml_files(&dir.path().join("missing")).unwrap().is_empty());
    }
}
