//! Cell → the multigateway Deployment that clients' PostgreSQL connections reach, and its
//! Service.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use multigres_api::labels::{self, Component, Placement};
use multigres_api::owner::Owner;
use multigres_api::resolver::cell_node_label;
use multigres_api::v1alpha1::CellSpec;

use crate::contract::{
    MULTIGATEWAY_GRPC, MULTIGATEWAY_HTTP, POSTGRES_PORT, POSTGRES_REPLICA_PORT, flag,
    flag_expanding, log_level_flag, multigres_bin, topo_flags,
};
use crate::podspec::{Probes, PullSettings, container_port, service_port};
use crate::stateless::{self, Process, Workload};

/// How long multigateway keeps serving after SIGTERM (upstream: 50 ms). Its pod leaves the
/// Service's endpoints as soon as it terminates, so by then new connections go to the other
/// gateways (or to the pod a drain or rollout started first); clients of the old one meet a
/// closed idle connection rather than a refused one.
const LAMEDUCK_PERIOD: &str = "5s";

/// How long multigateway waits, after its lameduck period, for its shutdown hooks (upstream:
/// 10 s). The first of them cancels the gateway's connections to the poolers, then waits for
/// every client connection to end, which a pooled client's never does: a statement sent in
/// that window can no longer be answered and only fails when the process exits
/// (`go/services/multigateway/init.go` `Shutdown`, `go/common/pgprotocol/server/listener.go`
/// `Close`). A short wait fails it at once, so the client reconnects to another gateway.
const ONCLOSE_TIMEOUT: &str = "1s";

/// Startup budget of multigateway: it registers in the topology (10 s timeout) before it
/// listens, and retries from scratch if the cell record is not there yet.
const STARTUP_BUDGET_SECONDS: i32 = 300;

/// Name of multigateway's replica-reads port, which the cluster's replica Service targets.
pub const REPLICA_PORT_NAME: &str = "pg-replica";

/// The objects realising one Cell.
#[derive(Clone, Debug, PartialEq)]
pub struct CellObjects {
    /// The multigateway Deployment.
    pub deployment: Deployment,
    /// The Service clients connect to.
    pub service: Service,
    /// Keeps a drain from taking the cell's gateways (see [`stateless::budget`]).
    pub pdb: Option<PodDisruptionBudget>,
}

/// multigateway's command line: ports, topology, identity, log level, shutdown timing and the
/// failover buffer (only the buffer settings the spec sets, so multigateway's own defaults
/// apply to the rest).
pub fn multigateway_args(spec: &CellSpec) -> Vec<String> {
    let mut args = vec![
        flag("http-port", MULTIGATEWAY_HTTP),
        flag("grpc-port", MULTIGATEWAY_GRPC),
        flag("pg-port", POSTGRES_PORT),
        flag("pg-replica-port", POSTGRES_REPLICA_PORT),
    ];
    args.extend(topo_flags(&spec.global_topo_server));
    args.extend([
        flag("cell", spec.name.as_str()),
        flag_expanding("service-id", "$(POD_NAME)"),
        flag_expanding("hostname", "$(POD_IP)"),
        log_level_flag(spec.log_levels.as_ref().and_then(|l| l.multigateway)),
        flag("lameduck-period", LAMEDUCK_PERIOD),
        flag("onclose-timeout", ONCLOSE_TIMEOUT),
    ]);
    if let Some(b) = &spec.multigateway.buffer {
        if let Some(enabled) = b.enabled {
            args.push(flag("buffer-enabled", enabled));
        }
        if let Some(window) = &b.window {
            args.push(flag("buffer-window", window.as_str()));
        }
        if let Some(d) = &b.max_failover_duration {
            args.push(flag("buffer-max-failover-duration", d.as_str()));
        }
        if let Some(d) = &b.min_time_between_failovers {
            args.push(flag("buffer-min-time-between-failovers", d.as_str()));
        }
        if let Some(size) = b.size {
            args.push(flag("buffer-size", size));
        }
        if let Some(n) = b.drain_concurrency {
            args.push(flag("buffer-drain-concurrency", n));
        }
    }
    args
}

/// Node labels pinning a cell's pods to its zone or region.
pub fn cell_node_selector(spec: &CellSpec) -> BTreeMap<String, String> {
    cell_node_label(
        spec.zone.as_deref(),
        spec.zone_id.as_deref(),
        spec.region.as_deref(),
    )
    .map(|(label, value)| (label.to_owned(), value.to_owned()))
    .into_iter()
    .collect()
}

/// Builds the multigateway objects of a Cell.
pub fn build(owner: &Owner, spec: &CellSpec) -> CellObjects {
    let placement = Placement {
        cell: Some(spec.name.as_str()),
        ..Default::default()
    };
    let labels = labels::labels(&owner.cluster, Component::Multigateway, &placement);
    let selector = labels::selector(&owner.cluster, Component::Multigateway, &placement);
    let name = crate::names::multigateway(&owner.name);
    let pull = PullSettings::new(
        spec.images.image_pull_policy,
        &spec.images.image_pull_secrets,
    );
    let workload = Workload {
        name: name.clone(),
        owner,
        labels: labels.clone(),
        selector: selector.clone(),
        spec: &spec.multigateway.stateless,
        default_replicas: multigres_api::resolver::defaults::MULTIGATEWAY_REPLICAS,
        tolerations: spec
            .multigateway_placement
            .as_ref()
            .map(|p| p.tolerations.clone())
            .unwrap_or_default(),
        node_selector: cell_node_selector(spec),
        pull: &pull,
        process: Process {
            name: "multigateway",
            image: spec.images.multigateway.as_str().to_owned(),
            command: multigres_bin("multigateway"),
            args: multigateway_args(spec),
            ports: vec![
                container_port("http", MULTIGATEWAY_HTTP),
                container_port("grpc", MULTIGATEWAY_GRPC),
                container_port("postgres", POSTGRES_PORT),
                container_port(REPLICA_PORT_NAME, POSTGRES_REPLICA_PORT),
            ],
            probes: Probes::multigres(MULTIGATEWAY_HTTP, STARTUP_BUDGET_SECONDS),
        },
        recreate: false,
    };
    let replicas = spec
        .multigateway
        .stateless
        .replicas
        .unwrap_or(multigres_api::resolver::defaults::MULTIGATEWAY_REPLICAS);
    let pdb = stateless::budget(&workload, replicas);
    let mut deployment = stateless::deployment(workload);
    crate::tls::mount_process_tls_deployment(
        &mut deployment,
        crate::tls::Process::Multigateway,
        owner,
        spec.internal_tls.as_ref(),
        &spec.global_topo_server,
    );
    let service = stateless::service(
        &name,
        owner,
        &labels,
        &selector,
        vec![
            service_port("postgres", POSTGRES_PORT),
            // Reads that may lag: multigateway serves them from its own cell's replicas first
            // (Multigres `poolergateway/load_balancer.go`, `selectReplicaConnection`).
            service_port(REPLICA_PORT_NAME, POSTGRES_REPLICA_PORT),
            service_port("http", MULTIGATEWAY_HTTP),
            service_port("grpc", MULTIGATEWAY_GRPC),
        ],
    );
    CellObjects {
        deployment,
        service,
        pdb,
    }
}

#[cfg(test)]
mod tests;
