//! The finalizer that keeps a MultigresCluster or Cell until its topology records are dealt with.
//!
//! Finalizers are changed with JSON patches whose `test` operation pins the list as read, so a
//! concurrent change by someone else (another finalizer added or removed) makes the patch fail
//! instead of being overwritten; the next reconcile then works from the fresh list.

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation, RemoveOperation, TestOperation};
use serde_json::Value;

/// Finalizer of the data-handler on MultigresClusters and Cells.
pub const FINALIZER: &str = "multigres.com/topology";

/// Whether `finalizers` holds ours.
pub fn has(finalizers: Option<&[String]>) -> bool {
    finalizers.is_some_and(|f| f.iter().any(|x| x == FINALIZER))
}

/// The patch adding our finalizer to `current`, or `None` when it is already there.
pub fn add(current: Option<&[String]>) -> Option<Patch> {
    if has(current) {
        return None;
    }
    let path = PointerBuf::from_tokens(["metadata", "finalizers"]);
    let ops = match current {
        None | Some([]) => vec![
            PatchOperation::Test(TestOperation {
                path: path.clone(),
                value: current.map_or(Value::Null, |_| Value::Array(Vec::new())),
            }),
            PatchOperation::Add(AddOperation {
                path,
                value: Value::Array(vec![Value::String(FINALIZER.to_owned())]),
            }),
        ],
        Some(list) => vec![
            PatchOperation::Test(TestOperation {
                path: path.clone(),
                value: Value::from(list.to_vec()),
            }),
            PatchOperation::Add(AddOperation {
                path: PointerBuf::from_tokens(["metadata", "finalizers", "-"]),
                value: Value::String(FINALIZER.to_owned()),
            }),
        ],
    };
    Some(Patch(ops))
}

/// The patch removing our finalizer from `current`, or `None` when it is not there.
pub fn remove(current: Option<&[String]>) -> Option<Patch> {
    let index = current?.iter().position(|f| f == FINALIZER)?;
    let index = index.to_string();
    let path = PointerBuf::from_tokens(["metadata", "finalizers", index.as_str()]);
    Some(Patch(vec![
        PatchOperation::Test(TestOperation {
            path: path.clone(),
            value: Value::String(FINALIZER.to_owned()),
        }),
        PatchOperation::Remove(RemoveOperation { path }),
    ]))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn apply(doc: Value, patch: &Patch) -> Result<Value, json_patch::PatchError> {
        let mut doc = doc;
        json_patch::patch(&mut doc, patch)?;
        Ok(doc)
    }

    #[test]
    fn adding_to_an_object_without_finalizers() {
        // The API server's JSON patch treats `test` with null as "absent" (as kube-runtime's
        // finalizer helper relies on); the local patch library does not, so check the form.
        let patch = add(None).unwrap();
        assert_eq!(
            serde_json::to_value(&patch).unwrap(),
            json!([
                {"op": "test", "path": "/metadata/finalizers", "value": null},
                {"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]},
            ])
        );
        let empty: Vec<String> = Vec::new();
        let patch = add(Some(&empty)).unwrap();
        let doc = apply(json!({"metadata": {"finalizers": []}}), &patch).unwrap();
        assert_eq!(doc["metadata"]["finalizers"], json!([FINALIZER]));
        // Someone added a finalizer meanwhile: the test operation fails, nothing is lost.
        let raced = json!({"metadata": {"finalizers": ["other"]}});
        assert!(apply(raced, &patch).is_err());
    }

    #[test]
    fn adding_after_other_finalizers_keeps_them() {
        let current = vec!["foregroundDeletion".to_owned()];
        let patch = add(Some(&current)).unwrap();
        let doc = apply(json!({"metadata": {"finalizers": current}}), &patch).unwrap();
        assert_eq!(
            doc["metadata"]["finalizers"],
            json!(["foregroundDeletion", FINALIZER])
        );
        assert!(
            add(Some(&[FINALIZER.to_owned()])).is_none(),
            "already there"
        );
    }

    #[test]
    fn removing_only_ours() {
        let current = vec!["a".to_owned(), FINALIZER.to_owned(), "b".to_owned()];
        let patch = remove(Some(&current)).unwrap();
        let doc = apply(json!({"metadata": {"finalizers": current}}), &patch).unwrap();
        assert_eq!(doc["metadata"]["finalizers"], json!(["a", "b"]));
        // The list moved meanwhile: the test at the old index fails instead of removing "b".
        let moved = json!({"metadata": {"finalizers": ["a", "b"]}});
        assert!(apply(moved, &patch).is_err());
        assert!(remove(Some(&["a".to_owned()])).is_none());
        assert!(remove(None).is_none());
        assert!(has(Some(&current)) && !has(Some(&["a".to_owned()])) && !has(None));
    }
}
