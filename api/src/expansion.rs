//! The kubelet's `$(NAME)` expansion of container `command`, `args` and `env` values.
//!
//! Kubernetes replaces `$(NAME)` in those strings with the value of the container's variable
//! `NAME`, and pool containers hold `AWS_SECRET_ACCESS_KEY` (from `backup.s3.credentialsSecret`)
//! among others. Text a user wrote and the operator puts there verbatim would let someone who
//! may edit a MultigresCluster but not read Secrets copy a Secret's value into a flag (a topology
//! root, an etcd address resolved by DNS) and read it back. So:
//! - every value the operator puts into args or env goes through [`literal`] (the operator's
//!   own `$(POD_NAME)`-style references are the only exception, written apart);
//! - admission refuses `$(` in the spec fields that reach args or env ([`references`]), so the
//!   user learns of it rather than finding the text doubled.

use serde_json::Value;

/// `text` as the kubelet must read it literally: every `$` doubled (`$$` expands to `$`, so
/// `$(NAME)` is never a reference).
pub fn literal(text: &str) -> String {
    text.replace('$', "$$")
}

/// Spec fields whose text reaches container args or env, by their JSON name: topology roots
/// (`--topo-global-root`), external etcd endpoints (`--topo-global-server-addresses`),
/// `initdbArgs` (`POSTGRES_INITDB_ARGS`), `postgresSuperuser` (`POSTGRES_USER`) and
/// `backup.s3.region` (`AWS_REGION`). Names, zones and durations reach args too, but their
/// schema patterns leave no `$`.
const FIELDS: [&str; 4] = ["rootPath", "endpoints", "initdbArgs", "postgresSuperuser"];

/// Fields named by the object holding them (`s3.region`, not a cell's `region`).
const NESTED_FIELDS: [(&str, &str); 1] = [("s3", "region")];

/// The CEL rule on the same fields (their CRD schema), for when the webhook is not installed.
pub const NO_REFERENCE_RULE: &str = "!self.contains('$(')";

/// Why a field may not hold `$(`: the message of [`NO_REFERENCE_RULE`] (the API server prefixes
/// the field's path) and of the webhook's refusal, one text whichever refuses.
pub const NO_REFERENCE_MESSAGE: &str = "must not contain \"$(\": the kubelet would replace \
                                        $(NAME) with the value of the container's variable NAME \
                                        (Secrets among them) when it passes this text to \
                                        Multigres";

/// The paths (under `base`, as written: `spec.cells[0].spec.localTopoServer.external.rootPath`)
/// of the strings in `spec` that reach container args or env and contain `$(`.
pub fn references(spec: &Value, base: &str) -> Vec<String> {
    let mut found = Vec::new();
    walk(spec, base, None, false, &mut found);
    found
}

/// Walks `value`, found under the key `own` (`None` at the top), at `path`; `reaches` says
/// whether its text reaches args or env.
fn walk(value: &Value, path: &str, own: Option<&str>, reaches: bool, found: &mut Vec<String>) {
    match value {
        Value::String(text) if reaches && text.contains("$(") => found.push(path.to_owned()),
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                walk(item, &format!("{path}[{i}]"), own, reaches, found);
            }
        }
        Value::Object(fields) => {
            for (key, child) in fields {
                let reaches = FIELDS.contains(&key.as_str())
                    || NESTED_FIELDS
                        .iter()
                        .any(|(outer, inner)| own == Some(*outer) && key == inner);
                walk(child, &format!("{path}.{key}"), Some(key), reaches, found);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_dollar_is_doubled_so_no_reference_survives() {
        assert_eq!(
            literal("/multigres/$(AWS_SECRET_ACCESS_KEY)"),
            "/multigres/$$(AWS_SECRET_ACCESS_KEY)"
        );
        assert_eq!(literal("a$$(B)$"), "a$$$$(B)$$");
        assert_eq!(literal("/multigres/global"), "/multigres/global");
    }

    #[test]
    fn references_are_found_in_the_fields_that_reach_args_or_env_only() {
        let spec = json!({
            "globalTopoServer": {"external": {
                "endpoints": ["http://ok:2379", "http://$(AWS_ACCESS_KEY_ID).x:2379"],
                "rootPath": "/multigres/$(AWS_SECRET_ACCESS_KEY)",
            }},
            "postgresSuperuser": "$(X)",
            "cells": [{"name": "a", "region": "$(X)", "spec": {"localTopoServer": {
                "etcd": {"rootPath": "/multigres/$(Y)"}}}}],
            "backup": {"type": "s3", "s3": {"bucket": "$(B)", "region": "eu-$(R)"}},
            "databases": [{"tablegroups": [{"shards": [{"spec": {
                "initdbArgs": "--locale=$(X)",
                "postgresConfig": {"log_line_prefix": "$(X)"},
            }}]}]}],
        });
        assert_eq!(
            references(&spec, "spec"),
            [
                "spec.backup.s3.region",
                "spec.cells[0].spec.localTopoServer.etcd.rootPath",
                "spec.databases[0].tablegroups[0].shards[0].spec.initdbArgs",
                "spec.globalTopoServer.external.endpoints[1]",
                "spec.globalTopoServer.external.rootPath",
                "spec.postgresSuperuser",
            ]
        );
        assert!(references(&json!({"rootPath": "/a$b", "initdbArgs": "$$"}), "spec").is_empty());
    }
}
