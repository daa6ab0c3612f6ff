//! The warning that a cell's pods would stay Pending: no Node carries the label and value its
//! `zone`, `zoneId` or `region` pins them with. `zoneId` pins `topology.k8s.aws/zone-id`, which
//! only EKS sets, so a cluster written for EKS (or copied from an upstream sample) gets no pod
//! scheduled on GKE, AKS, kind or k3d; the upstream operator warns the same way.
//!
//! Only ever a warning: Nodes come and go (an autoscaler may add one that matches), and a Node
//! list that fails or takes longer than [`LIST_TIMEOUT`] leaves the request unwarned, never
//! refused or held up.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::future::join_all;
use multigres_api::resolver::{ZONE_ID_NODE_LABEL, ZONE_NODE_LABEL, cell_node_label};
use multigres_api::v1alpha1::MultigresClusterSpec;

use crate::lookup::Lookups;
use crate::violation::Findings;

/// Longest wait for the Node list of one label before the warning is skipped.
const LIST_TIMEOUT: Duration = Duration::from_secs(2);

/// One cell's pin: where it is written, the cell, and the node label and value.
#[derive(Debug, PartialEq, Eq)]
pub struct Pin<'a> {
    pub field: String,
    pub cell: &'a str,
    pub label: &'static str,
    pub value: &'a str,
}

/// The pin of every cell that names one (the schema requires exactly one).
pub fn pins(spec: &MultigresClusterSpec) -> Vec<Pin<'_>> {
    spec.cells
        .iter()
        .enumerate()
        .filter_map(|(i, cell)| {
            let (label, value) = cell_node_label(
                cell.zone.as_deref(),
                cell.zone_id.as_deref(),
                cell.region.as_deref(),
            )?;
            let field = if cell.zone.is_some() {
                "zone"
            } else if cell.zone_id.is_some() {
                "zoneId"
            } else {
                "region"
            };
            Some(Pin {
                field: format!("spec.cells[{i}].{field}"),
                cell: cell.name.as_str(),
                label,
                value,
            })
        })
        .collect()
}

/// Adds the warning for a pin no Node matches.
pub fn unmatched(findings: &mut Findings, pin: &Pin<'_>) {
    let hint = if pin.label == ZONE_ID_NODE_LABEL {
        format!("; only EKS sets this label: elsewhere use zone ({ZONE_NODE_LABEL})")
    } else {
        String::new()
    };
    findings.warning(
        &pin.field,
        format!(
            "no Node has the label {}={}, so the pods of cell {:?} stay Pending until one \
             does{hint}",
            pin.label, pin.value, pin.cell
        ),
    );
}

/// Warns for every cell of `spec` whose label and value no Node carries; one Node list per
/// distinct label and value, all at once.
pub async fn check(findings: &mut Findings, lookups: &Lookups, spec: &MultigresClusterSpec) {
    let pins = pins(spec);
    let mut labels: BTreeMap<(&str, &str), Option<bool>> =
        pins.iter().map(|p| ((p.label, p.value), None)).collect();
    let keys: Vec<(&str, &str)> = labels.keys().copied().collect();
    let found = join_all(keys.iter().map(|&(label, value)| async move {
        match tokio::time::timeout(LIST_TIMEOUT, lookups.node_labelled(label, value)).await {
            Ok(Ok(found)) => Some(found),
            Ok(Err(error)) => {
                tracing::debug!(%error, label, value, "Nodes not listed; no placement warning");
                None
            }
            Err(_) => {
                tracing::debug!(label, value, "Node list timed out; no placement warning");
                None
            }
        }
    }))
    .await;
    for (key, found) in keys.into_iter().zip(found) {
        labels.insert(key, found);
    }
    for pin in &pins {
        if labels.get(&(pin.label, pin.value)) == Some(&Some(false)) {
            unmatched(findings, pin);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(cells: &str) -> MultigresClusterSpec {
        serde_yaml::from_str(&format!(
            "postgresPasswordSecretRef: {{name: pw, key: password}}\ncells: {cells}\n"
        ))
        .unwrap()
    }

    #[test]
    fn each_cell_is_pinned_by_the_label_of_the_field_it_writes() {
        let spec = spec(
            "[{name: a, zone: us-east-1a}, {name: b, zoneId: use1-az2}, {name: c, region: us-east-1}]",
        );
        let pins: Vec<(String, &str, &str)> = pins(&spec)
            .into_iter()
            .map(|p| (p.field, p.label, p.value))
            .collect();
        assert_eq!(
            pins,
            [
                (
                    "spec.cells[0].zone".to_owned(),
                    "topology.kubernetes.io/zone",
                    "us-east-1a"
                ),
                (
                    "spec.cells[1].zoneId".to_owned(),
                    "topology.k8s.aws/zone-id",
                    "use1-az2"
                ),
                (
                    "spec.cells[2].region".to_owned(),
                    "topology.kubernetes.io/region",
                    "us-east-1"
                ),
            ]
        );
    }

    #[test]
    fn the_warning_names_the_label_and_for_zone_id_the_portable_field() {
        let spec = spec("[{name: a, zoneId: zone-a}, {name: b, zone: europe-west1-b}]");
        let mut findings = Findings::default();
        for pin in pins(&spec) {
            unmatched(&mut findings, &pin);
        }
        assert!(findings.allowed());
        assert_eq!(
            findings.warnings,
            [
                "spec.cells[0].zoneId: no Node has the label topology.k8s.aws/zone-id=zone-a, \
                 so the pods of cell \"a\" stay Pending until one does; only EKS sets this \
                 label: elsewhere use zone (topology.kubernetes.io/zone)",
                "spec.cells[1].zone: no Node has the label \
                 topology.kubernetes.io/zone=europe-west1-b, so the pods of cell \"b\" stay \
                 Pending until one does",
            ]
        );
        assert!(findings.warnings.iter().all(|w| w.len() <= 256));
    }
}
