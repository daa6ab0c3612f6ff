//! External exposure of a cluster's two public Services, and what the cluster's status says
//! about it.
//!
//! `<cluster>-multigateway` (PostgreSQL, every cell's gateways) and `<cluster>-multiadmin-web`
//! (the admin UI) are ClusterIP Services. With `externalGateway` / `externalAdminWeb` enabled
//! they become `LoadBalancer` Services carrying the user's `externalIPs`,
//! `loadBalancerSourceRanges` and annotations (applied under this handler's field manager, so
//! annotations removed from the spec disappear from the Service). Unlike the upstream operator, which keeps the type ClusterIP, a load
//! balancer is requested: that is what the annotations (cloud LB settings) are for, and what
//! makes any load-balancer controller provision an address.
//!
//! The endpoint reported in `status.gateway` / `status.adminWeb` is the provisioned
//! load-balancer ingress (IP, else hostname), else the first external IP; the conditions
//! `GatewayExternalReady` and `AdminWebExternalReady` say whether it serves and, when it does
//! not, what is missing. Both are absent when the feature is disabled.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use multigres_api::labels::{self, Component, Placement};
use multigres_api::owner::Owner;
use multigres_api::v1alpha1::{
    ExternalEndpointStatus, ExternalServiceConfig, MultigresCluster, MultigresClusterStatus,
};

use crate::conditions::{
    ADMIN_WEB_EXTERNAL_READY, Computed, FALSE, GATEWAY_EXTERNAL_READY, TRUE, merge,
};
use crate::contract::{POSTGRES_PORT, POSTGRES_REPLICA_PORT};
use crate::podspec::service_port;
use crate::stateless;

/// Annotation prefix reserved for the operator's own bookkeeping.
pub const RESERVED_PREFIX: &str = "multigres.com/";

/// Reason: the feature is on but the Service has no address yet.
pub const AWAITING_ENDPOINT: &str = "AwaitingEndpoint";
/// Reason: the gateway endpoint exists but no multigateway pod is ready.
pub const NO_READY_GATEWAYS: &str = "NoReadyGateways";
/// Reason: the admin web endpoint exists but no multiadmin-web pod is ready.
pub const NO_READY_ADMIN_WEB: &str = "NoReadyAdminWeb";
/// Reason: the endpoint exists and pods behind it are ready.
pub const ENDPOINT_READY: &str = "EndpointReady";

/// An external exposure the cluster's spec asks for that cannot be realised.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct InvalidExposure {
    /// Path of the offending field, e.g. `spec.externalGateway.externalIPs[1]`.
    pub field: String,
    /// What is wrong and what is allowed.
    pub problem: String,
}

/// Which public Service an exposure is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exposed {
    /// `<cluster>-multigateway`, from `spec.externalGateway`.
    Gateway,
    /// `<cluster>-multiadmin-web`, from `spec.externalAdminWeb`.
    AdminWeb,
}

impl Exposed {
    /// The spec field that configures it.
    pub fn field(self) -> &'static str {
        match self {
            Exposed::Gateway => "spec.externalGateway",
            Exposed::AdminWeb => "spec.externalAdminWeb",
        }
    }

    /// Its configuration, when enabled.
    pub fn enabled(self, cluster: &MultigresCluster) -> Option<&ExternalServiceConfig> {
        match self {
            Exposed::Gateway => cluster.spec.external_gateway.as_ref(),
            Exposed::AdminWeb => cluster.spec.external_admin_web.as_ref(),
        }
        .filter(|c| c.enabled)
    }

    fn condition_type(self) -> &'static str {
        match self {
            Exposed::Gateway => GATEWAY_EXTERNAL_READY,
            Exposed::AdminWeb => ADMIN_WEB_EXTERNAL_READY,
        }
    }
}

/// Checks an exposure before anything is applied: every external IP must be an IPv4 or IPv6
/// address and no annotation may use the operator's prefix. Disabled exposures are not
/// checked (nothing of them is applied).
pub fn validate(exposed: Exposed, cluster: &MultigresCluster) -> Result<(), InvalidExposure> {
    let Some(config) = exposed.enabled(cluster) else {
        return Ok(());
    };
    for (i, ip) in config.external_ips.iter().enumerate() {
        if ip.as_str().parse::<IpAddr>().is_err() {
            return Err(InvalidExposure {
                field: format!("{}.externalIPs[{i}]", exposed.field()),
                problem: format!(
                    "{:?} is not an IP address; use IPv4 (203.0.113.10) or IPv6 (2001:db8::10) \
                     addresses routed to the cluster's nodes",
                    ip.as_str()
                ),
            });
        }
    }
    if let Some(key) = config
        .annotations
        .keys()
        .find(|k| k.starts_with(RESERVED_PREFIX))
    {
        return Err(InvalidExposure {
            field: format!("{}.annotations[{key:?}]", exposed.field()),
            problem: format!(
                "keys under {RESERVED_PREFIX} are reserved for the operator; use another prefix"
            ),
        });
    }
    Ok(())
}

/// The cluster-wide multigateway Service: PostgreSQL on 5432, selecting the gateway pods of
/// every cell of the cluster.
pub fn gateway_service(owner: &Owner) -> Service {
    let at = Placement::default();
    let labels = labels::labels(&owner.cluster, Component::Multigateway, &at);
    let selector = labels::selector(&owner.cluster, Component::Multigateway, &at);
    stateless::service(
        &crate::names::cluster_multigateway(&owner.cluster),
        owner,
        &labels,
        &selector,
        vec![service_port("postgres", POSTGRES_PORT)],
    )
}

/// The cluster-wide Service of the gateways' replica-reads port (5433), selecting the gateway
/// pods of every cell. Never exposed outside the cluster (`externalGateway` covers the
/// read-write port only, as upstream).
pub fn gateway_replica_service(owner: &Owner) -> Service {
    let at = Placement::default();
    let labels = labels::labels(&owner.cluster, Component::Multigateway, &at);
    let selector = labels::selector(&owner.cluster, Component::Multigateway, &at);
    stateless::service(
        &crate::names::cluster_multigateway_replica(&owner.cluster),
        owner,
        &labels,
        &selector,
        vec![service_port(
            crate::cell::build::REPLICA_PORT_NAME,
            POSTGRES_REPLICA_PORT,
        )],
    )
}

/// Applies `config` (an enabled exposure, already validated) to `service`: a LoadBalancer with
/// the external IPs, the source ranges its load balancer admits, and annotations. `None`
/// leaves the Service ClusterIP.
pub fn expose(service: &mut Service, config: Option<&ExternalServiceConfig>) {
    let Some(config) = config else {
        return;
    };
    let spec = service.spec.get_or_insert_with(Default::default);
    spec.type_ = Some("LoadBalancer".to_owned());
    if !config.external_ips.is_empty() {
        spec.external_ips = Some(
            config
                .external_ips
                .iter()
                .map(|ip| ip.as_str().to_owned())
                .collect(),
        );
    }
    if !config.load_balancer_source_ranges.is_empty() {
        spec.load_balancer_source_ranges = Some(
            config
                .load_balancer_source_ranges
                .iter()
                .map(|range| range.as_str().to_owned())
                .collect(),
        );
    }
    if !config.annotations.is_empty() {
        service
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .extend(config.annotations.clone());
    }
}

/// The address clients use: the load balancer's ingress (IP, else hostname) once a
/// load-balancer controller provisioned one, else the first configured external IP.
pub fn endpoint(config: &ExternalServiceConfig, observed: Option<&Service>) -> Option<String> {
    let ingress = observed
        .filter(|s| s.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("LoadBalancer"))
        .and_then(|s| s.status.as_ref())
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .into_iter()
        .flatten()
        .find_map(|i| {
            i.ip.clone()
                .filter(|ip| !ip.is_empty())
                .or_else(|| i.hostname.clone().filter(|h| !h.is_empty()))
        });
    ingress.or_else(|| config.external_ips.first().map(|ip| ip.as_str().to_owned()))
}

/// What is observed about one exposed Service.
#[derive(Clone, Copy, Debug)]
pub struct Observed<'a> {
    /// The Service as cached (`None`: not created yet).
    pub service: Option<&'a Service>,
    /// Ready pods behind it (gateways of every cell, or multiadmin-web).
    pub ready_pods: i32,
}

/// The status field and condition of one exposure; `None` when disabled.
pub fn exposure_status(
    exposed: Exposed,
    cluster: &MultigresCluster,
    observed: Observed<'_>,
) -> Option<(ExternalEndpointStatus, Computed)> {
    let config = exposed.enabled(cluster)?;
    let cluster_name = cluster.metadata.name.as_deref().unwrap_or_default();
    let name = match exposed {
        Exposed::Gateway => crate::names::cluster_multigateway(cluster_name),
        Exposed::AdminWeb => crate::names::multiadmin_web(cluster_name),
    };
    let type_ = exposed.condition_type();
    let Some(address) = endpoint(config, observed.service) else {
        let message = format!(
            "Service {name} (type LoadBalancer) has no load-balancer ingress yet and \
             {}.externalIPs is empty. A load-balancer controller (the cloud provider's, MetalLB, \
             ...) must provision an address; if this cluster has none, set {}.externalIPs to \
             addresses routed to its nodes",
            exposed.field(),
            exposed.field()
        );
        return Some((
            ExternalEndpointStatus::default(),
            Computed::new(type_, FALSE, AWAITING_ENDPOINT, message),
        ));
    };
    let cond = match (exposed, observed.ready_pods) {
        (Exposed::Gateway, 0) => Computed::new(
            type_,
            FALSE,
            NO_READY_GATEWAYS,
            format!(
                "{address} is provisioned but no multigateway pod of any cell is ready, so \
                 connections fail; see the cells' Available conditions"
            ),
        ),
        (Exposed::AdminWeb, 0) => Computed::new(
            type_,
            FALSE,
            NO_READY_ADMIN_WEB,
            format!(
                "{address} is provisioned but no pod of Deployment {name} is ready, so the UI \
                 does not answer"
            ),
        ),
        (Exposed::Gateway, n) => Computed::new(
            type_,
            TRUE,
            ENDPOINT_READY,
            format!("{address}:{POSTGRES_PORT} is served by {n} ready multigateway pod(s)"),
        ),
        (Exposed::AdminWeb, n) => Computed::new(
            type_,
            TRUE,
            ENDPOINT_READY,
            format!(
                "http://{address}:{} is served by {n} ready multiadmin-web pod(s)",
                super::web::MULTIADMIN_WEB_HTTP
            ),
        ),
    };
    Some((
        ExternalEndpointStatus {
            external_endpoint: address,
        },
        cond,
    ))
}

/// The status fields this handler owns on a MultigresCluster (`gateway`, `adminWeb` and the two
/// external conditions, with transition times kept from `cluster`'s status), and the
/// conditions that changed reason since what is stored (for events).
pub fn status(
    cluster: &MultigresCluster,
    gateway: Observed<'_>,
    admin_web: Observed<'_>,
    now: Timestamp,
) -> (MultigresClusterStatus, Vec<Computed>) {
    let gw = exposure_status(Exposed::Gateway, cluster, gateway);
    let web = exposure_status(Exposed::AdminWeb, cluster, admin_web);
    let desired: Vec<Computed> = [&gw, &web]
        .into_iter()
        .flatten()
        .map(|(_, c)| c.clone())
        .collect();
    let stored = stored_conditions(cluster);
    let transitions = desired
        .iter()
        .filter(|d| {
            !stored
                .iter()
                .any(|s| s.type_ == d.type_ && s.reason == d.reason)
        })
        .cloned()
        .collect();
    let status = MultigresClusterStatus {
        conditions: merge(stored, &desired, cluster.metadata.generation, now),
        gateway: gw.map(|(s, _)| s),
        admin_web: web.map(|(s, _)| s),
        ..Default::default()
    };
    (status, transitions)
}

fn stored_conditions(cluster: &MultigresCluster) -> &[Condition] {
    cluster
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default()
}

/// Whether what is stored differs from `desired` in a field this handler owns: the two
/// endpoints and the two condition types (present, changed, or to be removed).
pub fn differs(cluster: &MultigresCluster, desired: &MultigresClusterStatus) -> bool {
    let stored = cluster.status.clone().unwrap_or_default();
    let find = |conditions: &[Condition], type_: &str| {
        conditions.iter().find(|c| c.type_ == type_).cloned()
    };
    stored.gateway != desired.gateway
        || stored.admin_web != desired.admin_web
        || [GATEWAY_EXTERNAL_READY, ADMIN_WEB_EXTERNAL_READY]
            .into_iter()
            .any(|t| find(&stored.conditions, t) != find(&desired.conditions, t))
}

#[cfg(test)]
mod tests;
