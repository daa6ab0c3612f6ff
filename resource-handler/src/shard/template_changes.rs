//! What a pending restart changes: the difference between the pod template the outdated pool
//! pods were created from and the one the StatefulSet now wants, in words, for the
//! `RollingUpdate` condition and the restart events. A restart says what it is for before it
//! happens (under supervised restarts, while it waits for a release) and while it runs, so an
//! operator upgrade or an image change that restarts pods is never a surprise to explain
//! afterwards.
//!
//! Both templates come from the StatefulSet's ControllerRevisions (the pod's
//! `controller-revision-hash` label and the set's `updateRevision`): the old template is no
//! longer anywhere else (the cache keeps neither pod specs nor StatefulSet templates), and both
//! are stored as the API server defaulted them, so defaults never show up as changes. A
//! revision never changes once written, so each is read once ([`RevisionTemplates`]), and only
//! while a restart is pending. The comparison ([`describe`]) is pure.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};
use kube::Api;
use serde::Serialize;

use super::rollout::{PodView, SetView};

/// Revisions remembered at most; the memory is cleared when it is full (a handler serving
/// thousands of shards that all roll at once reads each revision again, once).
const REMEMBERED: usize = 512;

/// A revision's pod template as read (`None`: the revision was not found or held none), by
/// namespace and name.
type Known = HashMap<(String, String), Option<Arc<PodTemplateSpec>>>;

/// The pod templates of ControllerRevisions already read.
#[derive(Clone, Default)]
pub struct RevisionTemplates(Arc<Mutex<Known>>);

impl RevisionTemplates {
    /// The pod template of revision `name` in `ns`, read from the API server the first time.
    async fn get(
        &self,
        api: &Api<ControllerRevision>,
        ns: &str,
        name: &str,
    ) -> Option<Arc<PodTemplateSpec>> {
        let key = (ns.to_owned(), name.to_owned());
        if let Some(known) = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key)
        {
            return known.clone();
        }
        let template = match api.get_opt(name).await {
            Ok(revision) => revision.and_then(|r| template_of(&r)).map(Arc::new),
            // Not remembered: asked again at the next reconcile.
            Err(error) => {
                tracing::debug!(%error, revision = name, "reading a ControllerRevision");
                return None;
            }
        };
        let mut known = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if known.len() >= REMEMBERED {
            known.clear();
        }
        known.insert(key, template.clone());
        template
    }
}

/// The pod template a StatefulSet's ControllerRevision records (its `data` is the set's
/// `spec.template`, as a patch that replaces it whole).
fn template_of(revision: &ControllerRevision) -> Option<PodTemplateSpec> {
    let template = revision.data.as_ref()?.0.get("spec")?.get("template")?;
    serde_json::from_value(template.clone()).ok()
}

/// What the restart of the outdated pods of `sets` changes, one clause per StatefulSet whose
/// pods are outdated (one clause for all when they change alike); `None` when it cannot be told
/// (a revision not readable yet).
pub async fn read(
    api: &Api<ControllerRevision>,
    known: &RevisionTemplates,
    ns: &str,
    sets: &[SetView],
    pods: &[PodView],
) -> Option<String> {
    let mut by_changes: BTreeMap<Vec<String>, Vec<&str>> = BTreeMap::new();
    for set in sets {
        let Some(new) = set.update_revision.as_deref() else {
            continue;
        };
        let old: BTreeSet<&str> = pods
            .iter()
            .filter(|p| p.set == set.name)
            .filter_map(|p| p.revision.as_deref())
            .filter(|r| *r != new)
            .collect();
        let Some(old) = old.first() else { continue };
        let (Some(from), Some(to)) = (known.get(api, ns, old).await, known.get(api, ns, new).await)
        else {
            return None;
        };
        by_changes
            .entry(describe(&from, &to))
            .or_default()
            .push(&set.name);
    }
    let single = by_changes.len() == 1;
    let clauses: Vec<String> = by_changes
        .into_iter()
        .map(|(changes, sets)| {
            let what = if changes.is_empty() {
                "no field this summary covers (pod metadata or defaults)".to_owned()
            } else {
                changes.join(", ")
            };
            if single {
                what
            } else {
                format!("{}: {what}", sets.join(", "))
            }
        })
        .collect();
    (!clauses.is_empty()).then(|| clauses.join("; "))
}

/// The differences between two pod templates, in words: containers added or removed, and per
/// container its image (old and new) or which of its settings changed; volumes; pod-level
/// settings; annotations that roll pods (a certificate or configuration digest).
pub fn describe(old: &PodTemplateSpec, new: &PodTemplateSpec) -> Vec<String> {
    let mut changes = Vec::new();
    let (old_spec, new_spec) = (
        old.spec.clone().unwrap_or_default(),
        new.spec.clone().unwrap_or_default(),
    );
    compare_containers(&containers(&old_spec), &containers(&new_spec), &mut changes);
    let volumes = |spec: &PodSpec| -> BTreeMap<String, String> {
        spec.volumes
            .iter()
            .flatten()
            .map(|v| (v.name.clone(), json(v)))
            .collect()
    };
    compare_named(
        "volume",
        &volumes(&old_spec),
        &volumes(&new_spec),
        &mut changes,
    );
    let pod_settings = |spec: &PodSpec| -> Vec<(&'static str, String)> {
        vec![
            ("affinity", json(&spec.affinity)),
            ("tolerations", json(&spec.tolerations)),
            ("node selector", json(&spec.node_selector)),
            ("security context", json(&spec.security_context)),
            ("service account", json(&spec.service_account_name)),
            (
                "termination grace period",
                json(&spec.termination_grace_period_seconds),
            ),
            ("image pull secrets", json(&spec.image_pull_secrets)),
            ("priority class", json(&spec.priority_class_name)),
            (
                "topology spread constraints",
                json(&spec.topology_spread_constraints),
            ),
        ]
    };
    for ((what, before), (_, after)) in pod_settings(&old_spec)
        .into_iter()
        .zip(pod_settings(&new_spec))
    {
        if before != after {
            changes.push(format!("pod {what}"));
        }
    }
    let annotations = |t: &PodTemplateSpec| -> BTreeMap<String, String> {
        t.metadata
            .as_ref()
            .and_then(|m| m.annotations.clone())
            .unwrap_or_default()
            .into_iter()
            .collect()
    };
    let (before, after) = (annotations(old), annotations(new));
    let keys: BTreeSet<&String> = before.keys().chain(after.keys()).collect();
    for key in keys {
        if before.get(key) != after.get(key) {
            changes.push(format!("pod annotation {key}"));
        }
    }
    changes
}

/// Init (sidecar) and regular containers by name.
fn containers(spec: &PodSpec) -> BTreeMap<String, Container> {
    spec.init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .map(|c| (c.name.clone(), c.clone()))
        .collect()
}

fn compare_containers(
    old: &BTreeMap<String, Container>,
    new: &BTreeMap<String, Container>,
    changes: &mut Vec<String>,
) {
    for (name, container) in new {
        let Some(before) = old.get(name) else {
            changes.push(format!(
                "container {name} added (image {})",
                container.image.as_deref().unwrap_or("unset")
            ));
            continue;
        };
        if before.image != container.image {
            changes.push(format!(
                "{name} image {} -> {}",
                before.image.as_deref().unwrap_or("unset"),
                container.image.as_deref().unwrap_or("unset")
            ));
        }
        let settings = |c: &Container| -> Vec<(&'static str, String)> {
            vec![
                ("command line", json(&(&c.command, &c.args))),
                ("environment", json(&(&c.env, &c.env_from))),
                ("resources", json(&c.resources)),
                ("volume mounts", json(&c.volume_mounts)),
                ("ports", json(&c.ports)),
                (
                    "probes",
                    json(&(&c.startup_probe, &c.liveness_probe, &c.readiness_probe)),
                ),
                ("security context", json(&c.security_context)),
                ("image pull policy", json(&c.image_pull_policy)),
                ("lifecycle", json(&(&c.lifecycle, &c.restart_policy))),
            ]
        };
        let changed: Vec<String> = settings(before)
            .into_iter()
            .zip(settings(container))
            .filter(|((_, a), (_, b))| a != b)
            .map(|((what, _), _)| match what {
                "command line" => match flags_changed(before, container) {
                    Some(flags) => format!("command line ({flags})"),
                    None => what.to_owned(),
                },
                _ => what.to_owned(),
            })
            .collect();
        if !changed.is_empty() {
            changes.push(format!("{name} {}", changed.join(" and ")));
        }
    }
    for name in old.keys().filter(|n| !new.contains_key(*n)) {
        changes.push(format!("container {name} removed"));
    }
}

/// The `--flags` of a container's arguments that were added, removed or given another value,
/// by name only (a value may be long, and the names say what changed); `None` when the
/// command or the other arguments changed instead.
fn flags_changed(old: &Container, new: &Container) -> Option<String> {
    let split = |c: &Container| {
        let mut flags = BTreeMap::new();
        let mut rest = Vec::new();
        for arg in c.args.iter().flatten() {
            match arg.strip_prefix("--") {
                Some(flag) => {
                    let (name, value) = flag.split_once('=').unwrap_or((flag, ""));
                    flags.insert(format!("--{name}"), value.to_owned());
                }
                None => rest.push(arg.clone()),
            }
        }
        (c.command.clone(), rest, flags)
    };
    let (old_command, old_rest, old_flags) = split(old);
    let (new_command, new_rest, new_flags) = split(new);
    if old_command != new_command || old_rest != new_rest {
        return None;
    }
    let mut words = Vec::new();
    let added: Vec<&str> = new_flags
        .keys()
        .filter(|f| !old_flags.contains_key(*f))
        .map(String::as_str)
        .collect();
    let removed: Vec<&str> = old_flags
        .keys()
        .filter(|f| !new_flags.contains_key(*f))
        .map(String::as_str)
        .collect();
    let changed: Vec<&str> = new_flags
        .iter()
        .filter(|(f, v)| old_flags.get(*f).is_some_and(|old| old != *v))
        .map(|(f, _)| f.as_str())
        .collect();
    for (what, flags) in [("added", added), ("removed", removed), ("changed", changed)] {
        if !flags.is_empty() {
            words.push(format!("{what} {}", flags.join(" ")));
        }
    }
    (!words.is_empty()).then(|| words.join(", "))
}

fn compare_named(
    kind: &str,
    old: &BTreeMap<String, String>,
    new: &BTreeMap<String, String>,
    changes: &mut Vec<String>,
) {
    for (name, value) in new {
        match old.get(name) {
            None => changes.push(format!("{kind} {name} added")),
            Some(before) if before != value => changes.push(format!("{kind} {name} changed")),
            Some(_) => {}
        }
    }
    for name in old.keys().filter(|n| !new.contains_key(*n)) {
        changes.push(format!("{kind} {name} removed"));
    }
}

/// A value as compact JSON, for comparing (the typed values have no equality over defaults).
fn json<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(yaml: &str) -> PodTemplateSpec {
        serde_yaml::from_str(yaml).expect("a pod template")
    }

    const BEFORE: &str = "
metadata:
  annotations:
    multigres.com/postgres-config-hash: aaa
spec:
  initContainers:
    - name: postgres
      image: pgctld:1
      args: [server, --pg-port=5432, --log-level=info]
      restartPolicy: Always
  containers:
    - name: multipooler
      image: multigres:1
      args: [multipooler]
      env: [{name: A, value: '1'}]
  volumes:
    - name: data
      persistentVolumeClaim: {claimName: data}
  terminationGracePeriodSeconds: 60
";

    #[test]
    fn an_identical_template_changes_nothing() {
        assert!(describe(&template(BEFORE), &template(BEFORE)).is_empty());
    }

    #[test]
    fn each_kind_of_change_is_named_with_what_it_touches() {
        let after = BEFORE
            .replace("multigres:1", "multigres:2")
            .replace("value: '1'", "value: '2'")
            .replace("--pg-port=5432", "--pg-port=5433")
            .replace("hash: aaa", "hash: bbb")
            .replace("terminationGracePeriodSeconds: 60", "terminationGracePeriodSeconds: 90")
            .replace(
                "  volumes:\n",
                "    - name: postgres-exporter\n      image: exporter:1\n  volumes:\n    - name: queries\n      configMap: {name: q}\n",
            );
        assert_eq!(
            describe(&template(BEFORE), &template(&after)),
            vec![
                "multipooler image multigres:1 -> multigres:2",
                "multipooler environment",
                "postgres command line (changed --pg-port)",
                "container postgres-exporter added (image exporter:1)",
                "volume queries added",
                "pod termination grace period",
                "pod annotation multigres.com/postgres-config-hash",
            ]
        );
    }

    #[test]
    fn flags_added_and_removed_are_named_and_other_arguments_are_not_spelled_out() {
        let after = BEFORE.replace("--log-level=info]", "--grpc-port=15470]");
        assert_eq!(
            describe(&template(BEFORE), &template(&after)),
            vec!["postgres command line (added --grpc-port, removed --log-level)"]
        );
        let positional = BEFORE.replace("[server,", "[serve,");
        assert_eq!(
            describe(&template(BEFORE), &template(&positional)),
            vec!["postgres command line"]
        );
    }

    #[test]
    fn a_removed_container_and_volume_are_named() {
        let after = BEFORE
            .replace(
                "  containers:\n    - name: multipooler\n      image: multigres:1\n      args: [multipooler]\n      env: [{name: A, value: '1'}]\n",
                "  containers: []\n",
            )
            .replace(
                "  volumes:\n    - name: data\n      persistentVolumeClaim: {claimName: data}\n",
                "",
            );
        assert_eq!(
            describe(&template(BEFORE), &template(&after)),
            vec!["container multipooler removed", "volume data removed"]
        );
    }

    #[test]
    fn a_revision_records_the_template_under_spec() {
        let revision: ControllerRevision = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "pool-7c9"},
            "revision": 2,
            "data": {"spec": {"template": {"$patch": "replace", "spec": {"containers": [
                {"name": "multipooler", "image": "multigres:2"}
            ]}}}},
        }))
        .unwrap();
        let template = template_of(&revision).expect("a template");
        assert_eq!(
            template.spec.unwrap().containers[0].image.as_deref(),
            Some("multigres:2")
        );
    }
}
