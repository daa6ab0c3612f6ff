//! TopoServer: an etcd cluster holding Multigres topology, created by the operator for the
//! cluster's global topology (or a cell's local one); plus the topology specs users write.

use k8s_openapi::{
    api::core::v1::ResourceRequirements, apimachinery::pkg::apis::meta::v1::Condition,
};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::common::{
    EndpointUrl, ImageRef, Phase, PvcDeletionPolicy, StorageSpec, TemplateRef,
    TopoServerPlacementSpec,
};
use crate::schema::{embedded, embedded_list};

/// A managed etcd cluster.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct EtcdSpec {
    /// etcd image. Default `gcr.io/etcd-development/etcd:v3.6.7`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<ImageRef>,

    /// Number of etcd members: odd (1, 3, 5...), default 3. Cannot change after creation, since
    /// etcd is bootstrapped statically.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    #[x_kube(validation = Rule::new("self % 2 == 1").message(
        "etcd replicas must be an odd number (1, 3, 5); even numbers provide no additional fault tolerance over the next lower odd number"))]
    pub replicas: Option<i32>,

    /// Data volume of each member (default 1Gi, ReadWriteOnce).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<StorageSpec>,

    /// Compute resources of each member. Default requests 100m CPU and 256Mi memory, limit
    /// 512Mi.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "embedded::<ResourceRequirements>")]
    pub resources: Option<ResourceRequirements>,

    /// Key prefix of this topology in etcd. Default `/multigres/global` for the global topology,
    /// `/multigres/<cell>` for a cell's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    #[x_kube(validation = Rule::new(crate::expansion::NO_REFERENCE_RULE)
        .message(crate::expansion::NO_REFERENCE_MESSAGE))]
    pub root_path: Option<String>,

    /// PVC lifecycle of the etcd volumes; overrides the levels above per field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvc_deletion_policy: Option<PvcDeletionPolicy>,
}

/// An etcd cluster not managed by the operator.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExternalTopoServerSpec {
    /// Client URLs (`http://` or `https://`), 1 to 20 distinct entries.
    #[schemars(length(min = 1, max = 20))]
    #[x_kube(merge_strategy = ListMerge::Set)]
    #[x_kube(validation = Rule::new("self.all(x, x.matches('^https?://'))")
        .message("endpoints must be valid URLs"))]
    #[x_kube(validation = Rule::new("self.all(x, !x.contains('$('))")
        .message(crate::expansion::NO_REFERENCE_MESSAGE))]
    pub endpoints: Vec<EndpointUrl>,

    /// Topology implementation. Default `etcd`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = "etcd"))]
    pub implementation: Option<String>,

    /// Secret with the CA certificate of the etcd server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub ca_secret: Option<String>,

    /// Secret with the client certificate and key for etcd.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub client_cert_secret: Option<String>,

    /// Key prefix of this topology in etcd. Default `/multigres/global` for the global topology,
    /// `/multigres/<cell>` for a cell's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    #[x_kube(validation = Rule::new(crate::expansion::NO_REFERENCE_RULE)
        .message(crate::expansion::NO_REFERENCE_MESSAGE))]
    pub root_path: Option<String>,
}

/// The cluster-wide topology server: exactly one of an inline etcd, an external server, or a
/// CoreTemplate.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(
    "[has(self.etcd), has(self.external), has(self.templateRef)].filter(x, x).size() == 1")
    .message("must specify exactly one of 'etcd', 'external', or 'templateRef'"))]
pub struct GlobalTopoServerSpec {
    /// A managed etcd cluster, merged field by field over the CoreTemplate's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd: Option<EtcdSpec>,

    /// An existing etcd the operator connects to but does not run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external: Option<ExternalTopoServerSpec>,

    /// CoreTemplate whose `globalTopoServer` to use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_ref: Option<TemplateRef>,

    /// PVC lifecycle of the topology server's volumes; overrides the cluster's per field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvc_deletion_policy: Option<PvcDeletionPolicy>,

    /// Scheduling of the etcd pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<TopoServerPlacementSpec>,
}

/// A cell-local topology server: either a managed etcd or an external one.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.etcd) || has(self.external)")
    .message("must specify either 'etcd' or 'external'"))]
#[x_kube(validation = Rule::new("!(has(self.etcd) && has(self.external))")
    .message("only one of 'etcd' or 'external' can be set"))]
pub struct LocalTopoServerSpec {
    /// A managed etcd cluster for this cell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd: Option<EtcdSpec>,

    /// An existing etcd for this cell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external: Option<ExternalTopoServerSpec>,
}

/// Desired state of a TopoServer: the fully resolved etcd cluster.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[kube(
    group = "multigres.com",
    version = "v1alpha1",
    kind = "TopoServer",
    namespaced,
    status = "TopoServerStatus",
    shortname = "tps",
    category = "multigres",
    doc = "TopoServer is an etcd cluster storing Multigres topology. Created and owned by the operator from a MultigresCluster; do not edit.",
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type=='Available')].status"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.etcd)").message("must specify 'etcd' configuration"))]
pub struct TopoServerSpec {
    /// The etcd cluster to run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd: Option<EtcdSpec>,

    /// PVC lifecycle of the etcd volumes, inherited from the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvc_deletion_policy: Option<PvcDeletionPolicy>,

    /// Scheduling of the etcd pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<TopoServerPlacementSpec>,
}

/// Observed state of a TopoServer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct TopoServerStatus {
    /// The `metadata.generation` this status reflects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Latest observations (e.g. `Available`), one per type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "embedded_list::<Condition>")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,

    /// Lifecycle state: Initializing, Progressing, Healthy, Degraded or Unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,

    /// Details about the phase, e.g. what is wrong.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,

    /// Name of the client Service (port 2379).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_service: Option<String>,

    /// Name of the headless peer Service (port 2380).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_service: Option<String>,
}
