//! TopoServer controller: runs the etcd cluster that holds Multigres topology and reports
//! whether it serves (`Available`, which the upstream operator never set).

pub mod build;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures::Future;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::Controller;
use kube::runtime::controller::{Action, Config};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use multigres_api::labels::CELL;
use multigres_api::names::topo_peer_service;
use multigres_api::owner::{Owner, OwnerError};
use multigres_api::v1alpha1::{InternalTlsConfig, MultigresCluster, TopoServer, TopoServerStatus};
use multigres_common::controller as kit;
use multigres_common::guard::Guarded;
use multigres_common::guard::InvalidObject;
use multigres_common::shutdown::Shutdown;
use multigres_common::status_pacer;

use crate::conditions::{AVAILABLE, Computed, FALSE, TRUE, merge, paused, phase, with_lost_pods};
use multigres_common::shared_watch::{Changes, SharedWatch};

use crate::controller::{Category, Classify, Ctx, owned};
use crate::podspec::PullSettings;
use crate::readiness::{self, Counts};
use crate::storage::{self, ResizeOutcome, STORAGE_SYNCED};
use crate::sync::{self, SyncError};
use build::{Level, TopoInput, TopoObjects};

/// Controller name in metrics and HandlerInfo.
pub const NAME: &str = "toposerver";

type Guard = Guarded<TopoServer>;

/// Why a TopoServer could not be reconciled.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The stored object does not match the schema this binary knows.
    #[error("the TopoServer cannot be read: {0}")]
    Malformed(#[source] Box<InvalidObject>),
    /// The TopoServer does not say which cluster it belongs to.
    #[error(transparent)]
    Owner(#[from] OwnerError),
    /// The spec cannot be realised as it is, or given the running etcd.
    #[error(transparent)]
    InvalidSpec(#[from] SpecError),
    /// A write to the API server failed.
    #[error(transparent)]
    Sync(#[from] SyncError),
    /// Growing a volume failed.
    #[error("growing the etcd volumes")]
    Resize(#[source] kube::Error),
}

impl Classify for Error {
    fn category(&self) -> Category {
        match self {
            Error::Malformed(_) | Error::Owner(_) => Category::Malformed,
            Error::InvalidSpec(_) => Category::InvalidSpec,
            Error::Sync(_) | Error::Resize(_) => Category::KubeApi,
        }
    }
}

/// Why a TopoServer's spec cannot be realised: as written ([`build::BuildError`]), or given
/// the etcd already running, whose statically bootstrapped members cannot follow some changes.
/// Each message names the field and what it allows: it is what the status and events say.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// The spec cannot be built.
    #[error(transparent)]
    Build(#[from] build::BuildError),
    /// A change of the member count.
    #[error(
        "spec.etcd.replicas cannot change from {have} to {want}: etcd members are \
         bootstrapped statically; set it back to {have}"
    )]
    ReplicasChanged {
        /// The running StatefulSet's replicas.
        have: i32,
        /// The spec's.
        want: i32,
    },
    /// A change between plaintext and TLS peers.
    #[error(
        "spec.internalTLS.topology cannot change on a running etcd: its members were created \
         with {have}:// peer URLs and keep them; set it back to {}",
        .have == build::scheme(true)
    )]
    PeerSchemeChanged {
        /// The running members' peer URL scheme.
        have: String,
    },
}

/// The change streams the TopoServer controller is triggered by.
pub struct Triggers {
    /// Owned etcd StatefulSets.
    pub statefulsets: Changes<StatefulSet>,
    /// Owned client and peer Services.
    pub services: Changes<Service>,
    /// Owned PodDisruptionBudgets.
    pub pdbs: Changes<PodDisruptionBudget>,
    /// Clusters, whose pull settings their TopoServers use.
    pub clusters: Changes<Guarded<MultigresCluster>>,
}

/// The controller, ready to be polled until shutdown.
pub fn run(
    ctx: Arc<Ctx<Guard>>,
    topo_servers: SharedWatch<Guard>,
    triggers: Triggers,
    shutdown: &Shutdown,
) -> impl Future<Output = ()> + Send + 'static {
    let store = topo_servers.store();
    let controller = Controller::for_shared_stream(topo_servers.changes(), store.clone());
    // Pull settings come from the cluster: a change there must reach its TopoServers.
    let by_cluster = move |cluster: Arc<Guarded<MultigresCluster>>| {
        let namespace = cluster.namespace();
        let name = cluster.name_any();
        store
            .state()
            .into_iter()
            .filter(|t| {
                t.namespace() == namespace
                    && t.labels().get(multigres_api::labels::CLUSTER) == Some(&name)
            })
            .map(|t| ObjectRef::from_obj(&*t))
            .collect::<Vec<_>>()
    };
    let controller = controller
        .owns_shared_stream(triggers.statefulsets)
        .owns_shared_stream(triggers.services)
        .owns_shared_stream(triggers.pdbs)
        .watches_shared_stream(triggers.clusters, by_cluster);
    kit::run(
        controller,
        Config::default().concurrency(4),
        shutdown,
        reconcile,
        ctx,
    )
}

async fn reconcile(obj: Arc<Guard>, ctx: Arc<Ctx<Guard>>) -> Result<Action, Error> {
    kit::reconcile(&ctx, &obj, reconcile_inner(&obj, &ctx)).await
}

/// Local to the cell named by the `multigres.com/cell` label, else global.
fn level_of(topo: &TopoServer) -> Level {
    match topo.labels().get(CELL) {
        Some(cell) if !cell.is_empty() => Level::Cell(cell.clone()),
        _ => Level::Global,
    }
}

/// Pull settings and topology TLS (`internalTLS.topology`) of the cluster the TopoServer
/// belongs to (TopoServer specs carry neither).
fn cluster_settings(ctx: &Ctx<Guard>, owner: &Owner) -> (PullSettings, bool) {
    let cluster = ctx
        .stores
        .clusters
        .get(&ObjectRef::new(&owner.cluster).within(&owner.namespace));
    let spec = cluster
        .as_ref()
        .and_then(|c| c.0.as_ref().ok())
        .map(|c| &c.spec);
    let images = spec.and_then(|s| s.images.clone()).unwrap_or_default();
    let tls = InternalTlsConfig::topology_enabled(spec.and_then(|s| s.internal_tls.as_ref()));
    (
        PullSettings::new(images.image_pull_policy, &images.image_pull_secrets),
        tls,
    )
}

/// The etcd StatefulSet of the TopoServer as cached.
fn observed_statefulset(ctx: &Ctx<Guard>, owner: &Owner) -> Option<Arc<StatefulSet>> {
    let name = crate::names::topo_statefulset(&owner.name);
    ctx.stores
        .statefulsets
        .get(&ObjectRef::new(&name).within(&owner.namespace))
}

/// Reads the cluster's pull settings and the running StatefulSet, builds, applies and reports.
async fn reconcile_inner(guard: &Guard, ctx: &Ctx<Guard>) -> Result<Action, Error> {
    let topo = guard
        .0
        .as_ref()
        .map_err(|e| Error::Malformed(Box::new(e.clone())))?;
    if topo.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let owner = Owner::of(topo)?;
    let (pull, tls) = cluster_settings(ctx, &owner);
    let observed_sts = observed_statefulset(ctx, &owner);
    let input = TopoInput {
        owner: &owner,
        level: level_of(topo),
        spec: &topo.spec,
        pull: &pull,
        tls,
    };
    let statuses: Api<TopoServer> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    let objects = match desire(&input, observed_sts.as_deref()) {
        Ok(objects) => objects,
        Err(problem) => {
            let observed = observed_sts.as_deref();
            let message = problem.to_string();
            write_status(ctx, &statuses, topo, observed, None, Some(&message)).await?;
            return Err(Error::InvalidSpec(problem));
        }
    };
    // A paused cluster's etcd is left as it is; its status is still reported.
    let storage = match multigres_api::labels::paused(&ctx.stores.holds(&owner, topo)) {
        true => None,
        false => Some(apply(ctx, guard, &input, objects).await?),
    };
    let observed_sts = observed_statefulset(ctx, &owner);
    let observed = observed_sts.as_deref();
    let deferred = write_status(ctx, &statuses, topo, observed, storage, None).await?;
    Ok(status_pacer::action(None, deferred))
}

/// Builds the etcd objects, or says why the spec cannot be realised (as it is, or given the
/// `observed` StatefulSet).
fn desire(input: &TopoInput<'_>, observed: Option<&StatefulSet>) -> Result<TopoObjects, SpecError> {
    let objects = build::build(input)?;
    if let Some(observed) = observed
        && let Some(problem) = replicas_changed(observed, &objects.statefulset)
            .or_else(|| peer_scheme_changed(observed, &objects.statefulset))
    {
        return Err(problem);
    }
    Ok(objects)
}

/// Applies the etcd objects, grows the members' volumes and prunes what the TopoServer no
/// longer wants; returns the `StorageSynced` verdict.
async fn apply(
    ctx: &Ctx<Guard>,
    guard: &Guard,
    input: &TopoInput<'_>,
    objects: TopoObjects,
) -> Result<Computed, Error> {
    let TopoObjects {
        statefulset,
        peer_service,
        client_service,
        pdb,
        storage_size,
    } = objects;
    let ns = input.owner.namespace.as_str();
    let services_api = Api::<Service>::namespaced(ctx.client.clone(), ns);
    let services = &ctx.stores.services;
    sync::ensure(NAME, &services_api, services, peer_service).await?;
    sync::ensure(NAME, &services_api, services, client_service).await?;
    let pdb_api = Api::<PodDisruptionBudget>::namespaced(ctx.client.clone(), ns);
    sync::ensure(NAME, &pdb_api, &ctx.stores.pdbs, pdb).await?;
    let sts_api = Api::<StatefulSet>::namespaced(ctx.client.clone(), ns);
    sync::ensure_with(
        NAME,
        &sts_api,
        &ctx.stores.statefulsets,
        statefulset,
        keep_claim_templates,
    )
    .await?;
    let outcome = resize(ctx, guard, input, &storage_size).await?;
    prune(ctx, input.owner).await?;
    Ok(outcome.condition())
}

/// Grows the members' volumes to `size`.
async fn resize(
    ctx: &Ctx<Guard>,
    guard: &Guard,
    input: &TopoInput<'_>,
    size: &str,
) -> Result<ResizeOutcome, Error> {
    let ns = input.owner.namespace.as_str();
    let (_, selector) = build::labels(input);
    let pvcs = ctx.stores.pvcs.state_filter(|pvc| {
        pvc.namespace().as_deref() == Some(ns)
            && selector.iter().all(|(k, v)| pvc.labels().get(k) == Some(v))
    });
    let plan = storage::plan_resize(size, pvcs.iter().map(|p| p.as_ref()));
    let pvc_api = Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), ns);
    let outcome = storage::apply_resize(NAME, &pvc_api, plan)
        .await
        .map_err(Error::Resize)?;
    storage::report(ctx, guard, &outcome, &[]).await;
    Ok(outcome)
}

/// Deletes the Services, PodDisruptionBudgets and StatefulSets of the TopoServer it no longer
/// wants.
async fn prune(ctx: &Ctx<Guard>, owner: &Owner) -> Result<(), Error> {
    let ns = owner.namespace.as_str();
    let uid = owner.uid();
    let keep_services = BTreeSet::from([
        topo_peer_service(&owner.name),
        crate::names::topo_client_service(&owner.name),
    ]);
    let keep_named = BTreeSet::from([crate::names::topo_statefulset(&owner.name)]);
    sync::prune(
        NAME,
        &Api::<Service>::namespaced(ctx.client.clone(), ns),
        &owned(&ctx.stores.services, ns, uid),
        &keep_services,
    )
    .await?;
    sync::prune(
        NAME,
        &Api::<PodDisruptionBudget>::namespaced(ctx.client.clone(), ns),
        &owned(&ctx.stores.pdbs, ns, uid),
        &keep_named,
    )
    .await?;
    sync::prune(
        NAME,
        &Api::<StatefulSet>::namespaced(ctx.client.clone(), ns),
        &owned(&ctx.stores.statefulsets, ns, uid),
        &keep_named,
    )
    .await?;
    Ok(())
}

/// A change of the member count, which static bootstrap cannot follow.
fn replicas_changed(observed: &StatefulSet, desired: &StatefulSet) -> Option<SpecError> {
    let replicas = |s: &StatefulSet| s.spec.as_ref().and_then(|s| s.replicas);
    let (have, want) = (replicas(observed)?, replicas(desired)?);
    (have != want).then_some(SpecError::ReplicasChanged { have, want })
}

/// A change between plaintext and TLS peers, which running members cannot follow: each keeps
/// the peer URLs it was bootstrapped with in the membership, and would dial the others with the
/// old scheme. The webhook refuses the change; this holds where no webhook runs.
fn peer_scheme_changed(observed: &StatefulSet, desired: &StatefulSet) -> Option<SpecError> {
    let peer_scheme = |s: &StatefulSet| {
        let container = s
            .spec
            .as_ref()?
            .template
            .spec
            .as_ref()?
            .containers
            .first()?;
        let arg = container
            .args
            .as_ref()?
            .iter()
            .find_map(|a| a.strip_prefix("--listen-peer-urls="))?;
        Some(arg.split("://").next()?.to_owned())
    };
    let (have, want) = (peer_scheme(observed)?, peer_scheme(desired)?);
    (have != want).then_some(SpecError::PeerSchemeChanged { have })
}

/// Claim templates cannot change once a StatefulSet exists; volume growth is applied to the
/// PVCs instead.
pub fn keep_claim_templates(desired: &mut StatefulSet, observed: &StatefulSet) {
    if let (Some(d), Some(o)) = (desired.spec.as_mut(), observed.spec.as_ref()) {
        d.volume_claim_templates = o.volume_claim_templates.clone();
    }
}

/// Writes the status unless only progress changed since a recent write; returns how long the
/// write was deferred, if it was (never when `problem` is set: a Degraded phase is news).
async fn write_status(
    ctx: &Ctx<Guard>,
    api: &Api<TopoServer>,
    topo: &TopoServer,
    sts: Option<&StatefulSet>,
    storage: Option<Computed>,
    problem: Option<&str>,
) -> Result<Option<Duration>, Error> {
    let counts = readiness::statefulset(sts);
    let selector = sts
        .and_then(|s| s.spec.as_ref())
        .and_then(|s| s.selector.match_labels.clone());
    let silent = match selector {
        Some(selector) if !counts.all_ready() => {
            let namespace = topo.metadata.namespace.as_deref().unwrap_or_default();
            crate::unready::silent_nodes(&ctx.stores.other_pods, namespace, &selector)
        }
        _ => BTreeSet::new(),
    };
    let desired = status(topo, counts, &silent, storage, problem, Timestamp::now());
    let status = topo.status.as_ref();
    Ok(sync::ensure_status(NAME, api, topo, &desired, status, &ctx.pacer).await?)
}

/// The status fields and conditions this handler owns on a TopoServer; `silent` are the nodes
/// of its members that stopped reporting, which makes a TopoServer that lost them Degraded
/// (and still Available while a quorum serves).
pub fn status(
    topo: &TopoServer,
    counts: Counts,
    silent: &BTreeSet<String>,
    storage: Option<Computed>,
    problem: Option<&str>,
    now: Timestamp,
) -> TopoServerStatus {
    let quorum = counts.desired / 2 + 1;
    let serving = counts.observed && counts.desired > 0 && counts.ready >= quorum;
    let message = with_lost_pods(
        "etcd members",
        silent,
        format!("{}/{} etcd members ready", counts.ready, counts.desired),
    );
    let available = match (serving, counts.all_ready()) {
        (true, true) => Computed::new(AVAILABLE, TRUE, "AllMembersReady", message.clone()),
        (true, false) => Computed::new(AVAILABLE, TRUE, "QuorumReady", message.clone()),
        (false, _) if counts.desired == 0 => Computed::new(
            AVAILABLE,
            FALSE,
            "Creating",
            "the etcd StatefulSet is being created",
        ),
        (false, _) => Computed::new(AVAILABLE, FALSE, "NoQuorum", message.clone()),
    };
    let healthy = counts.all_ready();
    let mut desired = vec![available];
    desired.extend(storage);
    desired.extend(multigres_api::labels::paused(topo.annotations()).then(|| paused("TopoServer")));
    let observed = topo
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let generation = topo.metadata.generation;
    let mut conditions = merge(observed, &desired, generation, now);
    if desired.iter().all(|c| c.type_ != STORAGE_SYNCED) {
        // Keep the last storage verdict while the spec cannot be applied (or is paused).
        conditions.extend(
            observed
                .iter()
                .filter(|c| c.type_ == STORAGE_SYNCED)
                .cloned(),
        );
    }
    TopoServerStatus {
        observed_generation: generation,
        conditions,
        phase: Some(phase(healthy, problem, silent)),
        message: Some(problem.map_or(message, str::to_owned)),
        client_service: topo
            .metadata
            .name
            .as_deref()
            .map(crate::names::topo_client_service),
        peer_service: topo.metadata.name.as_deref().map(topo_peer_service),
    }
}

#[cfg(test)]
mod tests {
    use multigres_api::v1alpha1::Phase;

    use super::*;

    fn topo() -> TopoServer {
        serde_yaml::from_str(include_str!("../../fixtures/toposerver.yaml")).unwrap()
    }

    fn counts(desired: i32, ready: i32) -> Counts {
        Counts {
            desired,
            ready,
            observed: true,
            running: ready,
        }
    }

    #[test]
    fn status_climbs_from_no_quorum_to_all_ready() {
        let now = Timestamp::from_second(100).unwrap();
        let mut t = topo();
        t.metadata.generation = Some(4);
        let creating = status(&t, Counts::default(), &BTreeSet::new(), None, None, now);
        assert_eq!(creating.conditions[0].reason, "Creating");
        let s = status(&t, counts(3, 1), &BTreeSet::new(), None, None, now);
        assert_eq!(s.conditions[0].status, FALSE);
        assert_eq!(s.conditions[0].reason, "NoQuorum");
        assert_eq!(s.phase, Some(Phase::Progressing));
        let s = status(&t, counts(3, 2), &BTreeSet::new(), None, None, now);
        assert_eq!(
            (
                s.conditions[0].status.as_str(),
                s.conditions[0].reason.as_str()
            ),
            (TRUE, "QuorumReady")
        );
        let lost = status(
            &t,
            counts(3, 2),
            &BTreeSet::from(["node-b".to_owned()]),
            None,
            None,
            now,
        );
        assert_eq!(lost.phase, Some(Phase::Degraded));
        assert_eq!(lost.conditions[0].reason, "QuorumReady");
        assert_eq!(
            lost.message.as_deref(),
            Some(
                "etcd members lost with their nodes, which stopped reporting: node-b; 2/3 etcd \
                 members ready"
            )
        );
        let s = status(&t, counts(3, 3), &BTreeSet::new(), None, None, now);
        assert_eq!(s.conditions[0].reason, "AllMembersReady");
        assert_eq!(s.phase, Some(Phase::Healthy));
        assert_eq!(s.message.as_deref(), Some("3/3 etcd members ready"));
        assert_eq!(s.observed_generation, Some(4));
        assert_eq!(s.client_service.as_deref(), Some("prod-global-topo"));
        assert_eq!(s.peer_service.as_deref(), Some("prod-global-topo-peer"));
    }

    #[test]
    fn a_problem_degrades_but_keeps_availability_and_storage_verdict() {
        let now = Timestamp::from_second(100).unwrap();
        let mut t = topo();
        let shrink = Computed::new(STORAGE_SYNCED, FALSE, "ShrinkRefused", "no");
        t.status = Some(status(
            &t,
            counts(3, 3),
            &BTreeSet::new(),
            Some(shrink),
            None,
            now,
        ));
        let s = status(
            &t,
            counts(3, 3),
            &BTreeSet::new(),
            None,
            Some("replicas cannot change"),
            now,
        );
        assert_eq!(s.phase, Some(Phase::Degraded));
        assert_eq!(s.message.as_deref(), Some("replicas cannot change"));
        assert!(
            s.conditions
                .iter()
                .any(|c| c.type_ == AVAILABLE && c.status == TRUE)
        );
        assert!(
            s.conditions
                .iter()
                .any(|c| c.type_ == STORAGE_SYNCED && c.reason == "ShrinkRefused")
        );
    }

    #[test]
    fn the_build_is_refused_when_it_would_change_the_member_count() {
        let owner = Owner::of(&topo()).unwrap();
        let t = topo();
        let pull = PullSettings::new(None, &[]);
        let input = TopoInput {
            owner: &owner,
            level: Level::Global,
            spec: &t.spec,
            pull: &pull,
            tls: false,
        };
        let three = build::build(&input).unwrap().statefulset;
        assert!(desire(&input, None).is_ok());
        assert!(desire(&input, Some(&three)).is_ok());
        let mut five_spec = t.spec.clone();
        five_spec.etcd.as_mut().unwrap().replicas = Some(5);
        let five = TopoInput {
            spec: &five_spec,
            ..input.clone()
        };
        assert!(desire(&five, None).is_ok());
        let resized = desire(&five, Some(&three)).unwrap_err();
        assert_eq!(resized, SpecError::ReplicasChanged { have: 3, want: 5 });
        assert!(resized.to_string().contains("from 3 to 5"), "{resized}");
        let tls = TopoInput {
            tls: true,
            ..input.clone()
        };
        assert!(desire(&tls, None).is_ok(), "a new etcd may start with TLS");
        let problem = desire(&tls, Some(&three)).unwrap_err();
        assert_eq!(
            problem,
            SpecError::PeerSchemeChanged {
                have: "http".to_owned()
            }
        );
        let message = problem.to_string();
        assert!(
            message.contains("created with http:// peer URLs") && message.contains("back to false"),
            "{message}"
        );
        let secure = build::build(&tls).unwrap().statefulset;
        assert!(desire(&tls, Some(&secure)).is_ok());
        let problem = desire(&input, Some(&secure)).unwrap_err();
        assert_eq!(
            problem,
            SpecError::PeerSchemeChanged {
                have: "https".to_owned()
            }
        );
        assert!(problem.to_string().contains("back to true"), "{problem}");
    }

    #[test]
    fn spec_errors_name_the_field_and_what_it_allows() {
        assert_eq!(
            SpecError::ReplicasChanged { have: 3, want: 5 }.to_string(),
            "spec.etcd.replicas cannot change from 3 to 5: etcd members are bootstrapped \
             statically; set it back to 3"
        );
        let scheme = |have: &str| {
            SpecError::PeerSchemeChanged {
                have: have.to_owned(),
            }
            .to_string()
        };
        assert_eq!(
            scheme("http"),
            "spec.internalTLS.topology cannot change on a running etcd: its members were created \
             with http:// peer URLs and keep them; set it back to false"
        );
        assert!(scheme("https").ends_with("https:// peer URLs and keep them; set it back to true"));
        assert_eq!(
            SpecError::from(build::BuildError::NoEtcd).to_string(),
            build::BuildError::NoEtcd.to_string()
        );
        assert_eq!(
            Error::from(SpecError::ReplicasChanged { have: 3, want: 5 }).category(),
            Category::InvalidSpec
        );
    }

    #[test]
    fn level_follows_the_component_and_cell_labels() {
        let mut t = topo();
        assert_eq!(level_of(&t), Level::Global);
        t.labels_mut().insert(CELL.into(), "zone-a".into());
        assert_eq!(level_of(&t), Level::Cell("zone-a".into()));
    }
}
