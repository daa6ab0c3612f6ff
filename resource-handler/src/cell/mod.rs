//! Cell controller: runs a cell's multigateway and reports its gateway replicas and
//! `Available` (the data-handler writes the cell's topology conditions next to them).

pub mod build;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures::Future;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::ResourceExt;
use kube::runtime::Controller;
use kube::runtime::controller::{Action, Config};
use kube::runtime::events::EventType;
use kube::runtime::reflector::{ObjectRef, Store};
use multigres_api::labels::{CLUSTER, COMPONENT, Component};
use multigres_api::observability::PROJECT_REF_ANNOTATION;
use multigres_api::owner::{Owner, OwnerError};
use multigres_api::v1alpha1::{Cell, CellStatus, GatewayTlsConfig};
use multigres_common::controller as kit;
use multigres_common::guard::Guarded;
use multigres_common::guard::InvalidObject;
use multigres_common::shutdown::Shutdown;
use multigres_common::status_pacer;

use crate::conditions::{
    AVAILABLE, Computed, FALSE, NODES_NOT_REPORTING, TRUE, merge, paused, phase, with_lost_pods,
};
use multigres_common::shared_watch::{Changes, SharedWatch};

use crate::controller::{Category, Classify, Ctx, owned};
use crate::readiness::{self, Counts};
use crate::sync::{self, SyncError};

/// Controller name in metrics and HandlerInfo.
pub const NAME: &str = "cell";

/// How soon a cell waiting for its gateway certificate looks again, should the Secret's
/// watch event be missed.
const GATEWAY_CERT_RECHECK: Duration = Duration::from_secs(5);

/// How often a cell serving the user's own gateway Secret reads it again: it is not watched
/// (the operator watches only the Secrets it labels), so a renewed certificate reaches the
/// gateways within this long.
const USER_CERT_RECHECK: Duration = Duration::from_secs(300);

/// How soon a cell waiting for the user's own gateway Secret, which no watch announces, reads
/// it again: each look is a GET, so not as often as [`GATEWAY_CERT_RECHECK`].
const USER_CERT_WAIT: Duration = Duration::from_secs(30);

/// Who provides the gateway certificate a cell serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CertificateSource {
    /// The cluster's gateway CA, through the MultigresCluster's controller.
    Operator,
    /// cert-manager, for `spec.issuerName`.
    CertManager,
    /// The user, in `spec.gatewayTLS.secretName`.
    User,
}

impl CertificateSource {
    /// Told by the Secret's name: the operator's and cert-manager's have fixed names.
    pub fn of(secret: &str, cluster: &str) -> Self {
        if secret == multigres_api::names::gateway_tls(cluster) {
            CertificateSource::Operator
        } else if secret == multigres_api::names::gateway_certificate(cluster) {
            CertificateSource::CertManager
        } else {
            CertificateSource::User
        }
    }
}

type Guard = Guarded<Cell>;

/// Why a Cell could not be reconciled.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The stored object does not match the schema this binary knows.
    #[error("the Cell cannot be read: {0}")]
    Malformed(#[source] Box<InvalidObject>),
    /// The Cell does not say which cluster it belongs to.
    #[error(transparent)]
    Owner(#[from] OwnerError),
    /// A write to the API server failed.
    #[error(transparent)]
    Sync(#[from] SyncError),
}

impl Classify for Error {
    fn category(&self) -> Category {
        match self {
            Error::Malformed(_) | Error::Owner(_) => Category::Malformed,
            Error::Sync(_) => Category::KubeApi,
        }
    }
}

/// Cells reconciled at once: twice the shard controller's. A cell's gateways are what makes its
/// cluster Available, and under load most of a cell reconcile is spent waiting for its Service
/// (1-4 s each at 100 clusters on two cores, against 0.1-0.2 s for a Deployment), so more
/// cells in flight bring the gateways up sooner.
const CONCURRENCY: u16 = 8;

/// What makes a Cell reconcile besides its own changes.
pub struct Triggers {
    /// Owned multigateway Deployments.
    pub deployments: Changes<Deployment>,
    /// Owned Services.
    pub services: Changes<Service>,
    /// Owned PodDisruptionBudgets.
    pub pdbs: Changes<PodDisruptionBudget>,
    /// The operator's Secrets; a gateway certificate wakes the cells of its cluster.
    pub secrets: Changes<Secret>,
    /// A change of the cordoned nodes (a drain may have begun).
    pub cordons: futures::channel::mpsc::UnboundedReceiver<()>,
}

/// The Cells of the cluster whose gateway certificate `secret` holds (none for any other
/// Secret).
fn cells_served_by(cells: &Store<Guard>, secret: &Secret) -> Vec<ObjectRef<Guard>> {
    let labels = secret.labels();
    if labels.get(COMPONENT).map(String::as_str) != Some(Component::GatewayTls.as_str()) {
        return Vec::new();
    }
    let cluster = labels.get(CLUSTER);
    cells
        .state()
        .into_iter()
        .filter(|c| c.namespace() == secret.namespace() && c.labels().get(CLUSTER) == cluster)
        .map(|c| ObjectRef::from_obj(&*c))
        .collect()
}

/// The controller, ready to be polled until shutdown.
pub fn run(
    ctx: Arc<Ctx<Guard>>,
    cells: SharedWatch<Guard>,
    triggers: Triggers,
    shutdown: &Shutdown,
) -> impl Future<Output = ()> + Send + 'static {
    let controller = Controller::for_shared_stream(cells.changes(), cells.store());
    let served_by = {
        let cells = cells.store();
        move |secret: Arc<Secret>| cells_served_by(&cells, &secret)
    };
    let controller = controller
        .owns_shared_stream(triggers.deployments)
        .owns_shared_stream(triggers.services)
        .owns_shared_stream(triggers.pdbs)
        .watches_shared_stream(triggers.secrets, served_by)
        .reconcile_all_on(triggers.cordons);
    kit::run(
        controller,
        Config::default().concurrency(CONCURRENCY),
        shutdown,
        reconcile,
        ctx,
    )
}

async fn reconcile(obj: Arc<Guard>, ctx: Arc<Ctx<Guard>>) -> Result<Action, Error> {
    kit::reconcile(&ctx, &obj, reconcile_inner(&obj, &ctx)).await
}

async fn reconcile_inner(guard: &Guard, ctx: &Ctx<Guard>) -> Result<Action, Error> {
    let cell = guard
        .0
        .as_ref()
        .map_err(|e| Error::Malformed(Box::new(e.clone())))?;
    if cell.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let owner = Owner::of(cell)?;
    let ns = owner.namespace.as_str();
    let mut objects = build::build(&owner, &cell.spec);
    crate::env::add_to_cell(
        &mut objects,
        crate::env::Source {
            config: cell.spec.observability.as_ref(),
            inherited: &ctx.telemetry,
            cluster: &owner.cluster,
            project: cell
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(PROJECT_REF_ANNOTATION))
                .map(String::as_str),
        },
    );
    let name = crate::names::multigateway(&owner.name);
    let gateway_selector = objects
        .deployment
        .spec
        .as_ref()
        .and_then(|s| s.selector.match_labels.clone())
        .unwrap_or_default();
    // A hibernating cluster's gateways stop: they serve nothing without pool pods.
    let hibernated = multigres_api::labels::hibernated(cell.annotations());
    if let Some(spec) = objects.deployment.spec.as_mut().filter(|_| hibernated) {
        spec.replicas = Some(0);
    }
    // A paused cluster's gateways are left as they are; their status is still reported.
    let recheck = if multigres_api::labels::paused(&ctx.stores.holds(&owner, cell)) {
        None
    } else {
        match apply(guard, ctx, cell, &owner, objects, &name).await? {
            Applied::Done(recheck) => recheck,
            Applied::Waiting(action) => return Ok(action),
        }
    };
    let observed_deployment = ctx
        .stores
        .deployments
        .get(&ObjectRef::new(&name).within(ns));
    let counts = readiness::deployment(observed_deployment.as_deref());
    let silent = if counts.all_ready() || hibernated {
        BTreeSet::new()
    } else {
        crate::unready::silent_nodes(&ctx.stores.other_pods, ns, &gateway_selector)
    };
    let desired = status(cell, counts, &silent, &name, Timestamp::now());
    let api: Api<Cell> = Api::namespaced(ctx.client.clone(), ns);
    let stored = cell.status.as_ref();
    let deferred = sync::ensure_status(NAME, &api, cell, &desired, stored, &ctx.pacer).await?;
    Ok(status_pacer::action(recheck, deferred))
}

/// What applying a Cell's gateway objects came to.
enum Applied {
    /// Applied; look again after this long though nothing changes (`None`: on a change).
    Done(Option<Duration>),
    /// Waiting for the gateway certificate: the status says so, nothing was applied.
    Waiting(Action),
}

/// Applies the gateway objects of `cell` (Deployment `name`, its Service and budget), moves a
/// single pod off a cordoned node first, and prunes what it no longer wants.
async fn apply(
    guard: &Guard,
    ctx: &Ctx<Guard>,
    cell: &Cell,
    owner: &Owner,
    mut objects: build::CellObjects,
    name: &str,
) -> Result<Applied, Error> {
    let ns = owner.namespace.as_str();
    let mut recheck = None;
    if GatewayTlsConfig::is_enabled(cell.spec.gateway_tls.as_ref()) {
        let secret =
            GatewayTlsConfig::served_secret(cell.spec.gateway_tls.as_ref(), &owner.cluster);
        let source = CertificateSource::of(&secret, &owner.cluster);
        let stored = match ctx.stores.secrets.get(&ObjectRef::new(&secret).within(ns)) {
            Some(cached) => Some(cached),
            // The user's own Secret carries none of the labels the cache selects by.
            None if source == CertificateSource::User => {
                recheck = Some(USER_CERT_RECHECK);
                let api = Api::<Secret>::namespaced(ctx.client.clone(), ns);
                api.get_opt(&secret)
                    .await
                    .map_err(|source| SyncError::Get {
                        kind: "Secret".to_owned(),
                        name: secret.clone(),
                        source,
                    })?
                    .map(Arc::new)
            }
            None => None,
        };
        let Some(digest) = stored.as_deref().and_then(crate::tls::certificate_digest) else {
            // Its arrival in the cache wakes this cell; the user's own Secret is read again
            // after USER_CERT_WAIT.
            tracing::info!(cell = %owner.name, namespace = ns, %secret, "waiting for the gateway certificate");
            let desired = waiting_for_certificate(cell, &secret, source, name, Timestamp::now());
            let api: Api<Cell> = Api::namespaced(ctx.client.clone(), ns);
            let stored = cell.status.as_ref();
            let deferred =
                sync::ensure_status(NAME, &api, cell, &desired, stored, &ctx.pacer).await?;
            let again = match source {
                CertificateSource::User => USER_CERT_WAIT,
                _ => GATEWAY_CERT_RECHECK,
            };
            return Ok(Applied::Waiting(status_pacer::action(
                Some(again),
                deferred,
            )));
        };
        let required = GatewayTlsConfig::is_required(cell.spec.gateway_tls.as_ref());
        crate::tls::mount_gateway(&mut objects.deployment, &secret, required, &digest);
    }
    let observed_deployment = ctx.stores.deployments.get(&ObjectRef::new(name).within(ns));
    let budget_wanted = objects.pdb.is_some();
    let moving = crate::cordon::move_single_pod(
        &ctx.stores.other_pods,
        &ctx.stores.cordoned.snapshot(),
        &mut objects.deployment,
        observed_deployment.as_deref(),
        true,
    );
    let deployments = Api::<Deployment>::namespaced(ctx.client.clone(), ns);
    let services = Api::<Service>::namespaced(ctx.client.clone(), ns);
    let pdbs = Api::<PodDisruptionBudget>::namespaced(ctx.client.clone(), ns);
    let pdb = sync::ensure_wanted(NAME, &pdbs, &ctx.stores.pdbs, objects.pdb);
    futures::try_join!(
        sync::ensure(NAME, &services, &ctx.stores.services, objects.service),
        sync::ensure(
            NAME,
            &deployments,
            &ctx.stores.deployments,
            objects.deployment,
        ),
        pdb,
    )?;
    if let Some(moved) = moving {
        let note = format!(
            "moving the only multigateway pod off its cordoned node ({moved}): a new pod \
             starts on another node before the old one stops, and a drain may then go on"
        );
        ctx.kit
            .event(guard, EventType::Normal, "MovingOffCordonedNode", note)
            .await;
    }

    let keep = BTreeSet::from([name.to_owned()]);
    let uid = owner.uid();
    sync::prune(
        NAME,
        &services,
        &owned(&ctx.stores.services, ns, uid),
        &keep,
    )
    .await?;
    sync::prune(
        NAME,
        &deployments,
        &owned(&ctx.stores.deployments, ns, uid),
        &keep,
    )
    .await?;
    let keep_pdb = if budget_wanted {
        keep.clone()
    } else {
        BTreeSet::new()
    };
    sync::prune(NAME, &pdbs, &owned(&ctx.stores.pdbs, ns, uid), &keep_pdb).await?;

    Ok(Applied::Done(recheck))
}

/// The status fields and conditions this handler owns on a Cell; `silent` are the nodes of
/// its gateway pods that stopped reporting, which makes a Cell that lost them Degraded.
pub fn status(
    cell: &Cell,
    counts: Counts,
    silent: &BTreeSet<String>,
    service: &str,
    now: Timestamp,
) -> CellStatus {
    if multigres_api::labels::hibernated(cell.annotations())
        && !multigres_api::labels::paused(cell.annotations())
    {
        let (hibernated, phase) = crate::conditions::hibernation("cell", counts.running);
        let message = hibernated.message.clone();
        let available = Computed::new(AVAILABLE, FALSE, hibernated.reason, message.clone());
        let observed = cell
            .status
            .as_ref()
            .map(|s| s.conditions.as_slice())
            .unwrap_or_default();
        let generation = cell.metadata.generation;
        return CellStatus {
            observed_generation: generation,
            conditions: merge(observed, &[available, hibernated], generation, now),
            phase: Some(phase),
            message: Some(message),
            gateway_replicas: Some(counts.desired),
            gateway_ready_replicas: Some(counts.ready),
            gateway_service_name: Some(service.to_owned()),
        };
    }
    let message = with_lost_pods(
        "multigateway pods",
        silent,
        format!(
            "{}/{} multigateway pods ready",
            counts.ready, counts.desired
        ),
    );
    let available = if counts.desired == 0 && counts.observed {
        Computed::new(
            AVAILABLE,
            FALSE,
            "ScaledToZero",
            "multigateway has 0 replicas",
        )
    } else if counts.all_ready() {
        Computed::new(AVAILABLE, TRUE, "GatewaysReady", message.clone())
    } else if silent.is_empty() {
        Computed::new(AVAILABLE, FALSE, "GatewaysNotReady", message.clone())
    } else {
        Computed::new(AVAILABLE, FALSE, NODES_NOT_REPORTING, message.clone())
    };
    let counts = (Some(counts.desired), Some(counts.ready));
    composed(cell, (available, message), silent, counts, service, now)
}

/// The status of `cell` with its `Available` condition and message, the lost nodes `silent`,
/// the gateway counts (desired, ready) and its Service.
fn composed(
    cell: &Cell,
    (available, message): (Computed, String),
    silent: &BTreeSet<String>,
    (replicas, ready): (Option<i32>, Option<i32>),
    service: &str,
    now: Timestamp,
) -> CellStatus {
    let observed = cell
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let healthy = available.is_true();
    let paused = multigres_api::labels::paused(cell.annotations()).then(|| paused("cell"));
    let desired: Vec<Computed> = std::iter::once(available).chain(paused).collect();
    CellStatus {
        observed_generation: cell.metadata.generation,
        conditions: merge(observed, &desired, cell.metadata.generation, now),
        phase: Some(phase(healthy, None, silent)),
        message: Some(message),
        gateway_replicas: replicas,
        gateway_ready_replicas: ready,
        gateway_service_name: Some(service.to_owned()),
    }
}

/// The status of `cell` while its gateways wait for the cluster's gateway certificate
/// (Secret `secret`): not Available, saying what it waits for; the gateway counts stay as last
/// published.
pub fn waiting_for_certificate(
    cell: &Cell,
    secret: &str,
    source: CertificateSource,
    service: &str,
    now: Timestamp,
) -> CellStatus {
    let who = match source {
        CertificateSource::Operator => {
            "the MultigresCluster's controller issues it, and its events say why when it cannot"
                .to_owned()
        }
        CertificateSource::CertManager => format!(
            "cert-manager issues it for spec.issuerName; `kubectl describe certificate \
             {secret}` says why when it cannot"
        ),
        CertificateSource::User => "spec.gatewayTLS.secretName names it: create it in this \
             namespace as a kubernetes.io/tls Secret (keys tls.crt and tls.key)"
            .to_owned(),
    };
    let message = format!(
        "waiting for Secret {secret} with keys tls.crt and tls.key, the gateway certificate: \
         {who}; the gateways start once it exists"
    );
    let available = Computed::new(
        AVAILABLE,
        FALSE,
        "WaitingForGatewayCertificate",
        message.clone(),
    );
    let stored = cell.status.as_ref();
    let counts = (
        stored.and_then(|s| s.gateway_replicas),
        stored.and_then(|s| s.gateway_ready_replicas),
    );
    let silent = BTreeSet::new();
    composed(cell, (available, message), &silent, counts, service, now)
}

#[cfg(test)]
mod tests {
    use multigres_api::v1alpha1::Phase;

    use super::*;

    #[test]
    fn a_cell_waiting_for_its_gateway_certificate_says_so() {
        let cell: Cell = serde_yaml::from_str(include_str!("../../fixtures/cell.yaml")).unwrap();
        let now = Timestamp::from_second(5).unwrap();
        let st = waiting_for_certificate(
            &cell,
            "prod-gateway-tls",
            CertificateSource::Operator,
            "svc",
            now,
        );
        let available = &st.conditions[0];
        assert_eq!(
            (available.status.as_str(), available.reason.as_str()),
            (FALSE, "WaitingForGatewayCertificate")
        );
        assert!(
            available
                .message
                .starts_with("waiting for Secret prod-gateway-tls")
        );
        assert_eq!(st.phase, Some(Phase::Progressing));
    }

    #[test]
    fn status_reports_gateway_counts_and_availability() {
        let cell: Cell = serde_yaml::from_str(include_str!("../../fixtures/cell.yaml")).unwrap();
        let now = Timestamp::from_second(5).unwrap();
        let counts = |ready| Counts {
            desired: 2,
            ready,
            observed: true,
            running: 2,
        };
        let s = status(&cell, counts(1), &BTreeSet::new(), "gw", now);
        assert_eq!(s.conditions[0].type_, AVAILABLE);
        assert_eq!(s.conditions[0].status, FALSE);
        assert_eq!(s.phase, Some(Phase::Progressing));
        assert_eq!(
            (s.gateway_replicas, s.gateway_ready_replicas),
            (Some(2), Some(1))
        );
        let s = status(&cell, counts(2), &BTreeSet::new(), "gw", now);
        assert_eq!(s.conditions[0].status, TRUE);
        assert_eq!(s.phase, Some(Phase::Healthy));
        assert_eq!(s.gateway_service_name.as_deref(), Some("gw"));
        assert_eq!(s.message.as_deref(), Some("2/2 multigateway pods ready"));
        let zero = status(
            &cell,
            Counts {
                desired: 0,
                ready: 0,
                observed: true,
                running: 0,
            },
            &BTreeSet::new(),
            "gw",
            now,
        );
        assert_eq!(zero.conditions[0].reason, "ScaledToZero");
        let lost = status(
            &cell,
            counts(1),
            &BTreeSet::from(["node-b".to_owned()]),
            "gw",
            now,
        );
        assert_eq!(lost.phase, Some(Phase::Degraded));
        assert_eq!(lost.conditions[0].reason, NODES_NOT_REPORTING);
        assert_eq!(
            lost.message.as_deref(),
            Some(
                "multigateway pods lost with their nodes, which stopped reporting: node-b; 1/2 \
                 multigateway pods ready"
            )
        );
        let mut asleep = cell.clone();
        asleep
            .annotations_mut()
            .insert(multigres_api::labels::HIBERNATE.into(), "true".into());
        let stopping = Counts {
            desired: 0,
            ready: 0,
            observed: true,
            running: 1,
        };
        let s = status(&asleep, stopping, &BTreeSet::new(), "gw", now);
        assert_eq!(s.phase, Some(Phase::Progressing));
        assert_eq!(s.conditions[0].reason, "Hibernating");
        let stopped = Counts {
            running: 0,
            ..stopping
        };
        let s = status(&asleep, stopped, &BTreeSet::new(), "gw", now);
        assert_eq!(s.phase, Some(Phase::Hibernated));
        let types: Vec<&str> = s.conditions.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, [AVAILABLE, "Hibernated"]);
    }
}
