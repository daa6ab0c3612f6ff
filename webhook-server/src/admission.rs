//! The admission endpoints: `admission.k8s.io/v1` AdmissionReview in, AdmissionReview out.
//!
//! Every request gets a 200 with an AdmissionReview: a body that does not parse is answered with
//! `AdmissionResponse::invalid` (a refusal the API server shows), never an HTTP error, which the
//! API server would report as a webhook failure with no explanation.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::routing::post;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kube::core::response::{StatusCause, StatusDetails};
use kube::core::{DynamicObject, Status};
use multigres_api::field_support::Kind;
use multigres_api::v1alpha1::{CellTemplate, CoreTemplate, MultigresCluster, ShardTemplate};
use serde::de::DeserializeOwned;
use tracing::Instrument;

use crate::defaults;
use crate::lookup::{LookupError, Lookups};
use crate::placement;
use crate::rules::children::{self, Operators};
use crate::rules::cluster::repository;
use crate::rules::templates::{self, TemplateSpec};
use crate::rules::{TemplateKind, Templates, backup_request, cluster, switches, unimplemented};
use crate::violation::Findings;

/// Registers HELP text for the webhook's own metrics with the current recorder (the request
/// metrics, `multigres_operator_webhook_request_total` and `_duration_seconds`, are the seed's
/// and described by `multigres_common::metrics`).
pub fn describe_metrics() {
    metrics::describe_gauge!(
        crate::tls::CERTIFICATE_EXPIRY,
        metrics::Unit::Seconds,
        "Expiry of the serving certificate, as a Unix timestamp."
    );
}

/// Largest AdmissionReview accepted: an object and its old version, each up to the API server's
/// 3 MiB request limit, plus the envelope.
const BODY_LIMIT: usize = 8 << 20;

/// The webhooks this server answers, one path each (the upstream operator's paths, so existing
/// webhook configurations keep working).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Webhook {
    /// Defaulting of MultigresCluster.
    MutateCluster,
    /// Validation of MultigresCluster.
    ValidateCluster,
    /// Validation and deletion protection of a template kind.
    ValidateTemplate(TemplateKind),
    /// Write protection of an operator-managed child kind.
    ValidateChild(Child),
}

/// The operator-managed child kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Child {
    /// Cell.
    Cell,
    /// TableGroup.
    TableGroup,
    /// Shard.
    Shard,
    /// TopoServer.
    TopoServer,
}

impl Child {
    fn kind(self) -> &'static str {
        match self {
            Self::Cell => "Cell",
            Self::TableGroup => "TableGroup",
            Self::Shard => "Shard",
            Self::TopoServer => "TopoServer",
        }
    }
}

impl Webhook {
    /// Every webhook served.
    pub const ALL: [Webhook; 9] = [
        Webhook::MutateCluster,
        Webhook::ValidateCluster,
        Webhook::ValidateTemplate(TemplateKind::Core),
        Webhook::ValidateTemplate(TemplateKind::Cell),
        Webhook::ValidateTemplate(TemplateKind::Shard),
        Webhook::ValidateChild(Child::Cell),
        Webhook::ValidateChild(Child::TableGroup),
        Webhook::ValidateChild(Child::Shard),
        Webhook::ValidateChild(Child::TopoServer),
    ];

    /// Lowercase kind this webhook is about.
    fn resource(self) -> &'static str {
        match self {
            Self::MutateCluster | Self::ValidateCluster => "multigrescluster",
            Self::ValidateTemplate(TemplateKind::Core) => "coretemplate",
            Self::ValidateTemplate(TemplateKind::Cell) => "celltemplate",
            Self::ValidateTemplate(TemplateKind::Shard) => "shardtemplate",
            Self::ValidateChild(Child::Cell) => "cell",
            Self::ValidateChild(Child::TableGroup) => "tablegroup",
            Self::ValidateChild(Child::Shard) => "shard",
            Self::ValidateChild(Child::TopoServer) => "toposerver",
        }
    }

    /// URL path of the webhook.
    pub fn path(self) -> String {
        let verb = match self {
            Self::MutateCluster => "mutate",
            _ => "validate",
        };
        format!("/{verb}-multigres-com-v1alpha1-{}", self.resource())
    }

    /// The `operation` label of the request metrics: `DEFAULT` for the mutating webhook,
    /// `VALIDATE` for the validating ones (the upstream operator's values).
    fn check(self) -> &'static str {
        match self {
            Self::MutateCluster => "DEFAULT",
            _ => "VALIDATE",
        }
    }

    /// Short name used in logs.
    fn label(self) -> String {
        match self {
            Self::MutateCluster => "mutate-multigrescluster".to_owned(),
            _ => format!("validate-{}", self.resource()),
        }
    }
}

/// What the handlers share.
#[derive(Clone)]
pub struct AdmissionState {
    lookups: Lookups,
    operators: Arc<Operators>,
}

impl AdmissionState {
    /// Handlers reading other objects through `lookups`, letting `operators` write children.
    pub fn new(lookups: Lookups, operators: Operators) -> Self {
        Self {
            lookups,
            operators: Arc::new(operators),
        }
    }
}

/// The router with every webhook path.
pub fn router(state: AdmissionState) -> Router {
    let mut router = Router::new();
    for webhook in Webhook::ALL {
        router = router.route(
            &webhook.path(),
            post(
                move |State(state): State<AdmissionState>, body: Bytes| async move {
                    axum::Json(handle(webhook, &state, &body).await)
                },
            ),
        );
    }
    router
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(state)
}

/// Answers one AdmissionReview body.
pub async fn handle(
    webhook: Webhook,
    state: &AdmissionState,
    body: &[u8],
) -> AdmissionReview<DynamicObject> {
    let started = Instant::now();
    let response = match parse(body) {
        Ok(request) => {
            let operation = format!("{:?}", request.operation).to_uppercase();
            let span = tracing::debug_span!(
                "admission",
                webhook = %webhook.label(),
                uid = %request.uid,
                operation = %operation,
                namespace = request.namespace.as_deref().unwrap_or_default(),
                name = %request.name,
            );
            review(webhook, state, &request).instrument(span).await
        }
        Err(message) => {
            tracing::warn!(webhook = %webhook.label(), %message, "unreadable admission request");
            invalid(message, String::new())
        }
    };
    let result = if response.allowed {
        "allowed"
    } else {
        match response.result.code {
            400 => "invalid",
            500 => "error",
            _ => "denied",
        }
    };
    multigres_common::metrics::record_webhook_request(
        webhook.check(),
        webhook.resource(),
        result,
        started.elapsed(),
    );
    response.into_review()
}

fn parse(body: &[u8]) -> Result<AdmissionRequest<DynamicObject>, String> {
    let review: AdmissionReview<DynamicObject> = serde_json::from_slice(body)
        .map_err(|e| format!("the body is not an admission.k8s.io/v1 AdmissionReview: {e}"))?;
    review
        .try_into()
        .map_err(|_| "the AdmissionReview carries no request".to_owned())
}

/// Reads the request's object as a typed resource.
fn typed<K: DeserializeOwned>(object: Option<&DynamicObject>, which: &str) -> Result<K, String> {
    let object = object.ok_or_else(|| format!("the request has no {which}"))?;
    serde_json::to_value(object)
        .and_then(serde_json::from_value)
        .map_err(|e| format!("the {which} cannot be read: {e}"))
}

async fn review(
    webhook: Webhook,
    state: &AdmissionState,
    request: &AdmissionRequest<DynamicObject>,
) -> AdmissionResponse {
    let namespace = request.namespace.as_deref().unwrap_or_default();
    let outcome = match webhook {
        Webhook::MutateCluster => return mutate_cluster(state, request, namespace).await,
        Webhook::ValidateCluster => validate_cluster(state, request, namespace).await,
        Webhook::ValidateTemplate(kind) => validate_template(state, request, namespace, kind).await,
        Webhook::ValidateChild(child) => Ok(children::check(
            child.kind(),
            &request.operation,
            request.user_info.username.as_deref().unwrap_or_default(),
            request.old_object.as_ref(),
            request.object.as_ref(),
            &state.operators,
        )),
    };
    match outcome {
        Ok(findings) => respond(request, findings),
        Err(Failure::Unreadable(message)) => invalid(message, request.uid.clone()),
        Err(Failure::Lookup(error)) => {
            tracing::warn!(%error, "lookup failed");
            let mut response = AdmissionResponse::from(request);
            response.allowed = false;
            response.result = Status::failure(
                &format!("{error}; the change was not checked, retry"),
                "InternalError",
            )
            .with_code(500);
            response
        }
    }
}

/// A refusal of a request that cannot be read, with code 400 (kube's `invalid` leaves it 0).
fn invalid(message: String, uid: String) -> AdmissionResponse {
    let mut response = AdmissionResponse::invalid(message);
    response.uid = uid;
    response.result.code = 400;
    response
}

/// Why a request could not be judged.
enum Failure {
    /// The object in the request does not read as its kind.
    Unreadable(String),
    /// Another object could not be read.
    Lookup(LookupError),
}

impl From<LookupError> for Failure {
    fn from(error: LookupError) -> Self {
        Self::Lookup(error)
    }
}

impl From<String> for Failure {
    fn from(message: String) -> Self {
        Self::Unreadable(message)
    }
}

fn respond(request: &AdmissionRequest<DynamicObject>, findings: Findings) -> AdmissionResponse {
    let mut response = AdmissionResponse::from(request);
    if !findings.warnings.is_empty() {
        response.warnings = Some(findings.warnings.clone());
    }
    if findings.allowed() {
        return response;
    }
    let (code, reason) = match request.operation {
        Operation::Delete => (409, "Conflict"),
        _ if matches!(
            request.kind.kind.as_str(),
            "Cell" | "TableGroup" | "Shard" | "TopoServer"
        ) =>
        {
            (403, "Forbidden")
        }
        _ => (422, "Invalid"),
    };
    let details = StatusDetails {
        name: request.name.clone(),
        group: request.kind.group.clone(),
        kind: request.kind.kind.clone(),
        causes: findings
            .violations
            .iter()
            .map(|v| StatusCause {
                reason: "FieldValueInvalid".to_owned(),
                message: v.message.clone(),
                field: v.field.clone(),
            })
            .collect(),
        uid: String::new(),
        retry_after_seconds: 0,
    };
    response.allowed = false;
    response.result = Status::failure(&findings.message(), reason)
        .with_code(code)
        .with_details(details);
    response
}

async fn mutate_cluster(
    state: &AdmissionState,
    request: &AdmissionRequest<DynamicObject>,
    namespace: &str,
) -> AdmissionResponse {
    let allow = AdmissionResponse::from(request);
    if !matches!(request.operation, Operation::Create | Operation::Update) {
        return allow;
    }
    // An object that does not read as a MultigresCluster is left for schema validation, which
    // runs after defaulting and explains the problem better.
    let Ok(cluster) = typed::<MultigresCluster>(request.object.as_ref(), "object") else {
        return allow;
    };
    let present = match state
        .lookups
        .default_templates(namespace, defaults::promotable(&cluster.spec))
        .await
    {
        Ok(present) => present,
        Err(error) => {
            tracing::warn!(%error, "default templates not promoted");
            return allow;
        }
    };
    let old = match request.operation {
        Operation::Update => {
            typed::<MultigresCluster>(request.old_object.as_ref(), "old object").ok()
        }
        _ => None,
    };
    let stored = match (&request.operation, &old) {
        (Operation::Create, _) => defaults::Stored::Nothing,
        (_, Some(old)) => defaults::Stored::Spec(&old.spec),
        (_, None) => defaults::Stored::Unreadable,
    };
    let all_managed = match stored {
        defaults::Stored::Nothing => all_topology_managed(state, &cluster, namespace).await,
        _ => false,
    };
    match defaults::patch(&cluster, stored, present, all_managed) {
        Ok(patch) if patch.0.is_empty() => allow,
        Ok(patch) => match allow.clone().with_patch(patch) {
            Ok(patched) => patched,
            Err(error) => {
                tracing::warn!(%error, "defaults not applied");
                allow
            }
        },
        Err(error) => {
            tracing::warn!(%error, "defaults not applied");
            allow
        }
    }
}

/// Whether every topology server of a new `cluster` is one the operator runs, with its
/// templates; `false` when that cannot be known (a template unreadable or missing, which
/// validation then reports), so topology TLS is never turned on against an external etcd.
async fn all_topology_managed(
    state: &AdmissionState,
    cluster: &MultigresCluster,
    namespace: &str,
) -> bool {
    let clusters = || std::iter::once(cluster);
    let names = cluster::needed_templates(clusters());
    let implicit = cluster::implicit_defaults(clusters());
    match state.lookups.templates(namespace, &names, &implicit).await {
        Ok(templates) => multigres_api::resolver::resolve(cluster, &templates).is_ok_and(|r| {
            multigres_api::resolver::external_topology_server(&r.global_topo, &r.cells).is_none()
        }),
        Err(error) => {
            tracing::warn!(%error, "topology TLS not defaulted");
            false
        }
    }
}

async fn validate_cluster(
    state: &AdmissionState,
    request: &AdmissionRequest<DynamicObject>,
    namespace: &str,
) -> Result<Findings, Failure> {
    if !matches!(request.operation, Operation::Create | Operation::Update) {
        return Ok(Findings::default());
    }
    if being_deleted(request) {
        // Refusing an update of a cluster on its way out could wedge its deletion.
        return Ok(Findings::default());
    }
    // The request and switch annotations are checked on metadata-only updates too: `kubectl
    // annotate` is how a backup is asked for and a cluster paused.
    let mut requests = Findings::default();
    let annotations = |object: Option<&DynamicObject>| {
        object.map(|o| o.metadata.annotations.clone().unwrap_or_default())
    };
    let (new_annotations, old_annotations) = (
        annotations(request.object.as_ref()).unwrap_or_default(),
        annotations(request.old_object.as_ref()),
    );
    backup_request::check(&mut requests, &new_annotations, old_annotations.as_ref());
    switches::check(&mut requests, &new_annotations, old_annotations.as_ref());
    if request.operation == Operation::Update && spec_unchanged(request) {
        // Metadata-only updates (labels, annotations, finalizers written by the operator)
        // never need the spec checked: refusing them could wedge the operator.
        return Ok(requests);
    }
    let new: MultigresCluster = typed(request.object.as_ref(), "object")?;
    let old: Option<MultigresCluster> = match request.operation {
        Operation::Update => Some(typed(request.old_object.as_ref(), "old object")?),
        _ => None,
    };
    let clusters = || std::iter::once(&new).chain(old.as_ref());
    let names = cluster::needed_templates(clusters());
    let implicit = cluster::implicit_defaults(clusters());
    let templates = state
        .lookups
        .templates(namespace, &names, &implicit)
        .await?;
    let mut findings = cluster::validate(&new, old.as_ref(), &templates);
    findings.violations.extend(requests.violations);
    placement::check(&mut findings, &state.lookups, &new.spec).await;
    check_repositories(
        &mut findings,
        &state.lookups,
        &new,
        old.as_ref(),
        &templates,
    )
    .await;
    let object = request.object.as_ref();
    unimplemented::check_object(&mut findings, Kind::MultigresCluster, object);
    Ok(findings)
}

/// Longest wait for the Shard list of [`check_repositories`].
const SHARD_LIST_TIMEOUT: Duration = Duration::from_secs(2);

/// Refuses an S3 backup repository another cluster writes to ([`cluster::repository`]), when
/// the cluster is created or its repositories change. A Shard list that fails or takes longer
/// than [`SHARD_LIST_TIMEOUT`] leaves a warning instead: it is a guard, and must not hold up
/// every write of a cluster while the API server is slow.
async fn check_repositories(
    findings: &mut Findings,
    lookups: &Lookups,
    new: &MultigresCluster,
    old: Option<&MultigresCluster>,
    templates: &Templates,
) {
    let wanted = repository::wanted(new, templates);
    let unchanged =
        old.is_some_and(|old| repository::wanted(old, templates).keys().eq(wanted.keys()));
    if wanted.is_empty() || unchanged {
        return;
    }
    let own = (
        new.metadata.namespace.as_deref().unwrap_or_default(),
        new.metadata.name.as_deref().unwrap_or_default(),
    );
    match tokio::time::timeout(SHARD_LIST_TIMEOUT, lookups.shards()).await {
        Ok(Ok(shards)) => {
            repository::refuse_taken(findings, &wanted, &repository::owners(&shards, own));
            repository::check_targets(findings, new, templates, &shards);
        }
        Ok(Err(error)) => findings.warning(
            "spec.backup",
            format!(
                "not checked that no other cluster writes to this cluster's backup \
                 repositories: listing the Shards failed ({error})"
            ),
        ),
        Err(_) => findings.warning(
            "spec.backup",
            format!(
                "not checked that no other cluster writes to this cluster's backup \
                 repositories: the Shard list took longer than {SHARD_LIST_TIMEOUT:?}"
            ),
        ),
    }
}

fn template_spec(
    kind: TemplateKind,
    object: Option<&DynamicObject>,
    which: &str,
) -> Result<TemplateSpec, String> {
    Ok(match kind {
        TemplateKind::Core => {
            TemplateSpec::Core(Box::new(typed::<CoreTemplate>(object, which)?.spec))
        }
        TemplateKind::Cell => {
            TemplateSpec::Cell(Box::new(typed::<CellTemplate>(object, which)?.spec))
        }
        TemplateKind::Shard => {
            TemplateSpec::Shard(Box::new(typed::<ShardTemplate>(object, which)?.spec))
        }
    })
}

/// Whether an update leaves the spec as it was.
fn spec_unchanged(request: &AdmissionRequest<DynamicObject>) -> bool {
    request.old_object.as_ref().map(|o| o.data.get("spec"))
        == request.object.as_ref().map(|o| o.data.get("spec"))
}

/// Whether the object already has a deletion timestamp.
fn being_deleted(request: &AdmissionRequest<DynamicObject>) -> bool {
    request
        .object
        .as_ref()
        .is_some_and(|o| o.metadata.deletion_timestamp.is_some())
}

/// The namespace controller deletes everything of a namespace being deleted, clusters included.
const NAMESPACE_CONTROLLER: &str = "system:serviceaccount:kube-system:namespace-controller";

async fn validate_template(
    state: &AdmissionState,
    request: &AdmissionRequest<DynamicObject>,
    namespace: &str,
    kind: TemplateKind,
) -> Result<Findings, Failure> {
    match request.operation {
        Operation::Delete
            if request.user_info.username.as_deref() == Some(NAMESPACE_CONTROLLER) =>
        {
            Ok(Findings::default())
        }
        Operation::Delete => {
            let clusters = state.lookups.clusters(namespace).await?;
            Ok(templates::deletion(kind, &request.name, &clusters))
        }
        Operation::Update if spec_unchanged(request) => Ok(Findings::default()),
        Operation::Create | Operation::Update => {
            let new = template_spec(kind, request.object.as_ref(), "object")?;
            let mut findings = new.validate();
            let registered = unimplemented::template(kind);
            unimplemented::check_object(&mut findings, registered, request.object.as_ref());
            let old = match request.operation {
                Operation::Update => {
                    let old = template_spec(kind, request.old_object.as_ref(), "old object")?;
                    let before = old.validate();
                    findings
                        .violations
                        .retain(|v| !before.violations.contains(v));
                    Some(old)
                }
                _ => None,
            };
            findings.extend(template_change(state, request, namespace, old.as_ref(), &new).await?);
            Ok(findings)
        }
        Operation::Connect => Ok(Findings::default()),
    }
}

/// The checks of a template created (`old` is `None`) or updated against every cluster of the
/// namespace that uses it, explicitly or by falling back to the namespace `default`: a template
/// created under a name clusters already fall back to reshapes them at their next reconcile.
async fn template_change(
    state: &AdmissionState,
    request: &AdmissionRequest<DynamicObject>,
    namespace: &str,
    old: Option<&TemplateSpec>,
    new: &TemplateSpec,
) -> Result<Findings, Failure> {
    let clusters = state.lookups.clusters(namespace).await?;
    let users: Vec<MultigresCluster> = templates::users(new.kind(), &request.name, &clusters)
        .into_iter()
        .map(|(c, _)| c.clone())
        .collect();
    if users.is_empty() {
        return Ok(Findings::default());
    }
    let names = cluster::needed_templates(&users);
    let implicit = cluster::implicit_defaults(&users);
    let stored = state
        .lookups
        .templates(namespace, &names, &implicit)
        .await?;
    Ok(templates::change(&request.name, old, new, &users, &stored))
}
