//! MultigresCluster → NetworkPolicies: who may reach which port of the cluster's pods.
//!
//! Without them any pod of any namespace can write the unauthenticated topology etcd, call
//! every multipooler's and multiadmin's gRPC API, and reach the admin web UI. With them
//! (`spec.networkPolicy.enabled`, default true), in the cluster's namespace:
//!
//! - `<cluster>-deny-ingress` selects every pod of the cluster and admits nothing, so a port
//!   no policy below names is closed (pgctld's gRPC port 15470 among them: multipooler reaches
//!   it over loopback, which NetworkPolicies never filter);
//! - the internal ports (etcd client and peer, multipooler, pgctld HTTP, PostgreSQL and
//!   pgBackRest of the pool pods, multiorch, multiadmin, the gateways' HTTP and gRPC) admit the
//!   cluster's own pods and the operator's namespace (the data-handler dials etcd and the
//!   multipoolers);
//! - the metrics ports, etcd's (2381: `/metrics`, `/livez`, `/readyz`) and postgres_exporter's
//!   on the pool pods (9187, TLS, read-only statistics), admit `metricsSources`, or every pod
//!   of the Kubernetes cluster, so a Prometheus in any namespace can scrape them; the
//!   Multigres processes push their metrics over OTLP and serve none;
//! - the gateways' PostgreSQL ports (5432, 5433) admit `gatewaySources`, or every source;
//! - multiadmin-web (18100) admits the cluster's pods, the operator's namespace and
//!   `adminWebSources`, or every source while `externalAdminWeb` is enabled and no sources
//!   are listed.
//!
//! Kubelet probes come from the pod's node, which NetworkPolicies always admit. Egress is not
//! restricted (DNS, OTLP, S3 and external etcd stay reachable). Disabled, the policies are
//! deleted; they carry the cluster as controller owner, so they go with it.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Api;
use multigres_api::labels::{self, CLUSTER, COMPONENT, Component, Placement};
use multigres_api::owner::Owner;
use multigres_api::v1alpha1::{MultigresCluster, NetworkPolicyConfig};

use crate::contract::{
    ETCD_CLIENT, ETCD_METRICS, ETCD_PEER, MULTIADMIN_GRPC, MULTIADMIN_HTTP, MULTIGATEWAY_GRPC,
    MULTIGATEWAY_HTTP, MULTIORCH_GRPC, MULTIORCH_HTTP, MULTIPOOLER_GRPC, MULTIPOOLER_HTTP,
    PGBACKREST_PORT, PGCTLD_HTTP, POSTGRES_EXPORTER_PORT, POSTGRES_PORT, POSTGRES_REPLICA_PORT,
};
use crate::controller::{Ctx, owned};
use crate::multiadmin::web::MULTIADMIN_WEB_HTTP;
use crate::sync::{self, SyncError};

/// The label Kubernetes puts on every namespace: its name.
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// Ports of the pool pods the cluster's pods and the operator reach: multipooler's HTTP and
/// gRPC, pgctld's HTTP (probes, status), PostgreSQL (replication between pool pods) and the
/// pgBackRest TLS server. Not pgctld's gRPC port.
pub const POOL_PORTS: [i32; 5] = [
    MULTIPOOLER_HTTP,
    MULTIPOOLER_GRPC,
    PGCTLD_HTTP,
    POSTGRES_PORT,
    PGBACKREST_PORT,
];

/// Where a cluster's policies admit traffic from, besides what its spec lists.
#[derive(Clone, Copy, Debug)]
pub struct Trusted<'a> {
    /// The namespace the handlers run in (the data-handler's calls come from there).
    pub operator_namespace: &'a str,
}

/// The NetworkPolicies of `cluster` (owned by `owner`, the cluster itself); none when the
/// spec disables them.
pub fn build(
    owner: &Owner,
    cluster: &MultigresCluster,
    trusted: Trusted<'_>,
) -> Vec<NetworkPolicy> {
    let config = cluster.spec.network_policy.as_ref();
    if !NetworkPolicyConfig::enabled(config) {
        return Vec::new();
    }
    let name = |part: &str| crate::names::network_policy(&owner.cluster, part);
    let internal = vec![
        own_pods(&owner.cluster),
        namespace(trusted.operator_namespace),
    ];
    let from_internal = |ports: &[i32]| rule(Some(internal.clone()), ports);
    let gateway_sources = config
        .map(|c| c.gateway_sources.clone())
        .unwrap_or_default();
    let web_sources = config
        .map(|c| c.admin_web_sources.clone())
        .unwrap_or_default();
    let metrics_sources = config
        .map(|c| c.metrics_sources.clone())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| vec![anywhere_in_cluster()]);
    let from_scrapers = |ports: &[i32]| rule(Some(metrics_sources.clone()), ports);
    let web_from = if !web_sources.is_empty() {
        Some(internal.iter().cloned().chain(web_sources).collect())
    } else if crate::multiadmin::external::Exposed::AdminWeb
        .enabled(cluster)
        .is_some()
    {
        None
    } else {
        Some(internal.clone())
    };
    let topo = LabelSelector {
        match_labels: Some(BTreeMap::from([(
            CLUSTER.to_owned(),
            owner.cluster.clone(),
        )])),
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: COMPONENT.to_owned(),
            operator: "In".to_owned(),
            values: Some(vec![
                Component::GlobalTopo.as_str().to_owned(),
                Component::LocalTopo.as_str().to_owned(),
            ]),
        }]),
    };
    let of = |component: Component| pods_of(&owner.cluster, component);
    let specs = [
        ("deny", cluster_pods(&owner.cluster), Vec::new()),
        (
            "topo",
            topo,
            vec![
                from_internal(&[ETCD_CLIENT, ETCD_PEER]),
                from_scrapers(&[ETCD_METRICS]),
            ],
        ),
        (
            "pool",
            of(Component::Pool),
            vec![
                from_internal(&POOL_PORTS),
                from_scrapers(&[POSTGRES_EXPORTER_PORT]),
            ],
        ),
        (
            "multiorch",
            of(Component::Multiorch),
            vec![from_internal(&[MULTIORCH_HTTP, MULTIORCH_GRPC])],
        ),
        (
            "multiadmin",
            of(Component::Multiadmin),
            vec![from_internal(&[MULTIADMIN_HTTP, MULTIADMIN_GRPC])],
        ),
        (
            "multiadmin-web",
            of(Component::MultiadminWeb),
            vec![rule(web_from, &[MULTIADMIN_WEB_HTTP])],
        ),
        (
            "multigateway",
            of(Component::Multigateway),
            vec![
                rule(
                    (!gateway_sources.is_empty()).then_some(gateway_sources),
                    &[POSTGRES_PORT, POSTGRES_REPLICA_PORT],
                ),
                from_internal(&[MULTIGATEWAY_HTTP, MULTIGATEWAY_GRPC]),
            ],
        ),
    ];
    specs
        .into_iter()
        .map(|(part, selector, ingress)| policy(owner, name(part), selector, ingress))
        .collect()
}

/// Applies the policies `desired` holds and deletes the other ones the cluster owns (all of
/// them when the spec disabled the policies).
pub async fn sync<K>(
    ctx: &Ctx<K>,
    controller: &'static str,
    owner: &Owner,
    desired: Vec<NetworkPolicy>,
) -> Result<(), SyncError>
where
    K: kube::Resource<DynamicType = ()>,
{
    let api = Api::<NetworkPolicy>::namespaced(ctx.client.clone(), &owner.namespace);
    let store = &ctx.stores.network_policies;
    let keep: BTreeSet<String> = desired
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    let applied = desired
        .into_iter()
        .map(|policy| sync::ensure(controller, &api, store, policy));
    futures::future::try_join_all(applied).await?;
    let owned = owned(store, &owner.namespace, owner.uid());
    sync::prune(controller, &api, &owned, &keep).await?;
    Ok(())
}

fn policy(
    owner: &Owner,
    name: String,
    pods: LabelSelector,
    ingress: Vec<NetworkPolicyIngressRule>,
) -> NetworkPolicy {
    let labels = labels::labels(
        &owner.cluster,
        Component::NetworkPolicy,
        &Placement::default(),
    );
    NetworkPolicy {
        metadata: crate::stateless::metadata(&name, owner, &labels),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(pods),
            policy_types: Some(vec!["Ingress".to_owned()]),
            // No rules at all rather than an empty list, which the API server drops: the
            // stored policy then reads as what was applied.
            ingress: (!ingress.is_empty()).then_some(ingress),
            egress: None,
        }),
    }
}

/// An ingress rule for TCP `ports`; `from: None` admits every source.
fn rule(from: Option<Vec<NetworkPolicyPeer>>, ports: &[i32]) -> NetworkPolicyIngressRule {
    NetworkPolicyIngressRule {
        from,
        ports: Some(
            ports
                .iter()
                .map(|&port| NetworkPolicyPort {
                    port: Some(IntOrString::Int(port)),
                    protocol: Some("TCP".to_owned()),
                    end_port: None,
                })
                .collect(),
        ),
    }
}

/// Every pod of the cluster (each carries the cluster label, which user labels never override).
fn cluster_pods(cluster: &str) -> LabelSelector {
    LabelSelector {
        match_labels: Some(BTreeMap::from([(CLUSTER.to_owned(), cluster.to_owned())])),
        match_expressions: None,
    }
}

fn pods_of(cluster: &str, component: Component) -> LabelSelector {
    LabelSelector {
        match_labels: Some(BTreeMap::from([
            (CLUSTER.to_owned(), cluster.to_owned()),
            (COMPONENT.to_owned(), component.as_str().to_owned()),
        ])),
        match_expressions: None,
    }
}

/// The cluster's own pods, in the policy's (the cluster's) namespace.
fn own_pods(cluster: &str) -> NetworkPolicyPeer {
    NetworkPolicyPeer {
        pod_selector: Some(cluster_pods(cluster)),
        ..Default::default()
    }
}

/// Every pod of namespace `name`.
fn namespace(name: &str) -> NetworkPolicyPeer {
    NetworkPolicyPeer {
        namespace_selector: Some(LabelSelector {
            match_labels: Some(BTreeMap::from([(
                NAMESPACE_NAME_LABEL.to_owned(),
                name.to_owned(),
            )])),
            match_expressions: None,
        }),
        ..Default::default()
    }
}

/// Every pod of every namespace (not addresses outside the Kubernetes cluster).
fn anywhere_in_cluster() -> NetworkPolicyPeer {
    NetworkPolicyPeer {
        namespace_selector: Some(LabelSelector::default()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests;
