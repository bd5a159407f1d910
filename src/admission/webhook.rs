//! Front door 2 of the ADR-006 rules: the validating admission webhook. Same engine as the doctor
//! ([`crate::policy::rules`]), same findings; fail findings deny (the message lists every one of them
//! with its field and hint, so one round trip shows the user everything to fix), warn findings go
//! to `warnings`, which kubectl prints. What a review is judged by — everything on CREATE, only
//! what changed on UPDATE — is decided by [`crate::policy::ratchet::judge`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use kube::api::{Api, DynamicObject};
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kube::Client;
use prometheus::{histogram_opts, opts, Histogram, IntCounterVec, Registry};
use tracing::{debug, info, warn};

use crate::policy::pull_secrets::pull_credentials;
use crate::policy::ratchet::{judge, Review, Stored};
use crate::policy::rules::{sort_findings, Finding, RuleSettings};
use crate::registry::ImageResolver;

/// Admission metrics, registered into the operator's registry.
#[derive(Clone)]
pub struct WebhookMetrics {
    /// Reviews by operation and verdict (`allowed`, `warned`, `denied`, `invalid`).
    pub reviews: IntCounterVec,
    /// Time spent on one review (rules and, when enabled, the image check).
    pub latency: Histogram,
    /// The exported names of the two (`sandboxrun_admission_…`).
    pub names: Vec<String>,
}

impl WebhookMetrics {
    /// Creates the collectors and registers them.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let reviews = IntCounterVec::new(
            opts!(
                "admission_reviews_total",
                "SandboxRun admission reviews by operation and verdict"
            ),
            &["operation", "verdict"],
        )?;
        let latency = Histogram::with_opts(histogram_opts!(
            "admission_review_duration_seconds",
            "Duration of one SandboxRun admission review",
            prometheus::exponential_buckets(0.0005, 2.0, 16)?
        ))?;
        let names = crate::metrics::register_all(
            registry,
            [Box::new(reviews.clone()), Box::new(latency.clone())],
        )?;
        Ok(WebhookMetrics {
            reviews,
            latency,
            names,
        })
    }
}

/// What the webhook needs.
#[derive(Clone, Default)]
pub struct WebhookState {
    /// Operator settings the rules read.
    pub settings: RuleSettings,
    /// Metrics; None in tests that do not look at them.
    pub metrics: Option<WebhookMetrics>,
    /// Opt-in image resolvability check (adds a registry round trip, bounded by its timeout).
    pub images: Option<Arc<ImageResolver>>,
    /// Client to read the run's `imagePullSecrets` for the image check, and to ask the apiserver
    /// whether the requesting user holds the rights a run exercises.
    pub client: Option<Client>,
    /// Whether a run may only use what its author may (`crate::policy::access`): on in the operator's
    /// webhook; without a client every such run is refused (fail closed).
    pub access_checks: bool,
    /// The namespaces the operator's controller watches; empty: every namespace. A run created
    /// anywhere else is refused (nothing would ever run it).
    pub watched_namespaces: Vec<String>,
    /// Whether tenant stores are on (`run --tenant-store-endpoints`): off, a run naming a store
    /// (`spec.readBack.storeRef`) is refused (docs/contract.md "A store per namespace").
    pub tenant_stores: crate::store::tenant::TenantStorePolicy,
    /// The operator's `--shards` when it runs sharded: the shard label a request may write
    /// ([`crate::shard::label_change_refusal`]).
    pub shards: Option<u32>,
    /// The key the mutating half stamps the runs whose author's rights it verified with
    /// ([`crate::policy::stamp`]); None: it stamps nothing (the controller then holds such runs).
    pub stamp_key: Option<crate::policy::stamp::StampKey>,
    /// The platform's pull Secrets: a workload image in the registry they serve is refused
    /// (docs/contract.md "The platform's pull Secrets pull the holder, not the workload").
    pub platform_pull: crate::policy::platform_pull::PlatformPull,
}

/// The webhook's routes: `POST /validate-sandboxrun`, `POST /mutate-sandboxrun` (the same
/// judgement, and the stamp of what it verified: [`super::mutate`]), `GET /healthz`.
pub fn router(state: WebhookState) -> Router {
    Router::new()
        .route("/validate-sandboxrun", post(validate))
        .route("/mutate-sandboxrun", post(mutate))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(Arc::new(state))
}

/// Serves `router` over TLS until the process ends. The certificate can be swapped at runtime
/// through `tls` (`RustlsConfig::reload_from_pem`) when it is rotated.
pub async fn serve_tls(
    addr: SocketAddr,
    tls: axum_server::tls_rustls::RustlsConfig,
    router: Router,
) -> std::io::Result<()> {
    info!(%addr, "admission webhook serving TLS");
    axum_server::bind_rustls(addr, tls)
        .serve(router.into_make_service())
        .await
}

/// The reply to a review that cannot be read.
type Unreadable = (StatusCode, Json<AdmissionReview<DynamicObject>>);

/// The request of an AdmissionReview body. Parsed by hand: a review we cannot read still gets a
/// review back (the apiserver then shows our message), rather than a bare 4xx from an extractor.
fn read_review(body: &[u8]) -> Result<AdmissionRequest<DynamicObject>, Box<Unreadable>> {
    let review: AdmissionReview<DynamicObject> = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => {
            warn!(error = %e, "unreadable AdmissionReview");
            return Err(Box::new((
                StatusCode::BAD_REQUEST,
                Json(
                    AdmissionResponse::invalid(format!("unreadable AdmissionReview: {e}"))
                        .into_review(),
                ),
            )));
        }
    };
    review.try_into().map_err(|_| {
        Box::new((
            StatusCode::BAD_REQUEST,
            Json(AdmissionResponse::invalid("AdmissionReview without a request").into_review()),
        ))
    })
}

async fn validate(State(state): State<Arc<WebhookState>>, body: Bytes) -> impl IntoResponse {
    let started = Instant::now();
    let request = match read_review(&body) {
        Ok(request) => request,
        Err(unreadable) => return *unreadable,
    };
    let (response, verdict) = review_request(&state, &request).await;
    if let Some(m) = &state.metrics {
        m.reviews
            .with_label_values(&[operation_label(&request.operation), verdict])
            .inc();
        m.latency.observe(started.elapsed().as_secs_f64());
    }
    debug!(uid = %request.uid, name = %request.name, verdict, "admission review");
    (StatusCode::OK, Json(response.into_review()))
}

/// `/mutate-sandboxrun`: judges the review as [`validate`] does; an admitted run whose rights were
/// all verified is stamped ([`super::mutate::stamp_patch`]).
async fn mutate(State(state): State<Arc<WebhookState>>, body: Bytes) -> impl IntoResponse {
    let request = match read_review(&body) {
        Ok(request) => request,
        Err(unreadable) => return *unreadable,
    };
    let (response, verdict) = review_request(&state, &request).await;
    let stamping = super::mutate::Stamping {
        key: state.stamp_key.as_ref(),
        access_checks: state.access_checks,
    };
    let issued = jiff::Timestamp::now().as_second();
    let old = request.old_object.as_ref();
    let typed = request
        .object
        .as_ref()
        .and_then(|o| typed_specs(spec_value(o), old.map(spec_value)));
    let stored = if response.allowed {
        stored_run(&state, &request).await
    } else {
        super::mutate::StoredRun::Unknown
    };
    let patch = typed.and_then(|(new, old_spec)| {
        let specs = super::mutate::Specs {
            new: &new,
            old: old_spec.as_ref(),
            pod_exists: old.is_some_and(pod_exists),
        };
        super::mutate::mutation(stamping, &request, specs, &stored, issued)
    });
    let response = match (response.allowed, patch) {
        (true, Some(patch)) => match response.clone().with_patch(patch) {
            Ok(stamped) => stamped,
            Err(e) => {
                warn!(error = %e, name = %request.name, "the admission stamp could not be written; the run will be held");
                response
            }
        },
        _ => response,
    };
    debug!(uid = %request.uid, name = %request.name, verdict, "admission review (mutating)");
    (StatusCode::OK, Json(response.into_review()))
}

/// The run a review names, as the apiserver stores it: what tells the apiserver's real request
/// from a review made up by whoever reached the webhook ([`super::mutate::StoredRun`]).
async fn stored_run(
    state: &WebhookState,
    req: &AdmissionRequest<DynamicObject>,
) -> super::mutate::StoredRun {
    use super::mutate::StoredRun;
    let (Some(client), Some(namespace)) = (state.client.as_ref(), req.namespace.as_deref()) else {
        return StoredRun::Unknown;
    };
    if req.name.is_empty() {
        return StoredRun::Unknown;
    }
    let runs: Api<crate::api::SandboxRun> = Api::namespaced(client.clone(), namespace);
    match runs.get_metadata_opt(&req.name).await {
        Ok(None) => StoredRun::Absent,
        Ok(Some(meta)) => StoredRun::Present {
            uid: meta.metadata.uid,
            resource_version: meta.metadata.resource_version,
            generation: meta.metadata.generation,
        },
        Err(e) => {
            warn!(error = %e, name = %req.name, "cannot read the stored run; the run is not stamped");
            StoredRun::Unknown
        }
    }
}

fn operation_label(op: &Operation) -> &'static str {
    match op {
        Operation::Create => "create",
        Operation::Update => "update",
        Operation::Delete => "delete",
        Operation::Connect => "connect",
    }
}

/// The response and the verdict label.
async fn review_request(
    state: &WebhookState,
    req: &AdmissionRequest<DynamicObject>,
) -> (AdmissionResponse, &'static str) {
    let resp = AdmissionResponse::from(req);
    // Only the main resource is validated: status writes come from the operator itself.
    if req.sub_resource.as_deref().is_some_and(|s| !s.is_empty())
        || !matches!(req.operation, Operation::Create | Operation::Update)
    {
        return (resp, "allowed");
    }
    let who = format!(
        "SandboxRun {}/{}",
        req.namespace.as_deref().unwrap_or("-"),
        req.name
    );
    let Some(object) = req.object.as_ref() else {
        return (
            resp.deny(format!("{who}: the review carries no object")),
            "invalid",
        );
    };
    if req.operation == Operation::Create {
        if let Some(refusal) = crate::policy::rules::unwatched_namespace(
            req.namespace.as_deref(),
            &state.watched_namespaces,
        ) {
            return respond(resp, &who, &[refusal]);
        }
    }
    match findings_of(state, req, object).await {
        Ok(mut findings) => {
            findings.extend(shard_label_finding(state, req, object));
            findings.extend(queue_label_finding(req, object));
            sort_findings(&mut findings);
            respond(resp, &who, &findings)
        }
        Err(invalid) => (resp.deny(format!("{who}: {invalid}")), "invalid"),
    }
}

/// The specs a review is judged by: the run's own, or, for a run made from a template, its
/// merged ones (docs/contract.md "Templates").
struct Judged<'a> {
    new: std::borrow::Cow<'a, serde_json::Value>,
    old: Option<std::borrow::Cow<'a, serde_json::Value>>,
    /// The template's name, when merged.
    template: Option<String>,
}

/// The spec [`findings_of`] judges: the run's own, or merged with its template when a create or
/// a spec change names one (its notes added to `findings`). Err: the template refuses the run
/// (those refusals are the findings).
async fn judged_spec<'a>(
    state: &WebhookState,
    req: &AdmissionRequest<DynamicObject>,
    new_spec: &'a serde_json::Value,
    old_spec: Option<&'a serde_json::Value>,
    deleting: bool,
    findings: &mut Vec<Finding>,
) -> Result<Judged<'a>, Vec<Finding>> {
    use std::borrow::Cow;
    let judged = if req.operation == Operation::Create || (!deleting && old_spec != Some(new_spec))
    {
        use crate::policy::templates::{resolve, Templated};
        match resolve(
            state.client.as_ref(),
            req.namespace.as_deref(),
            new_spec,
            old_spec,
        )
        .await
        {
            Templated::Refused(refusals) => return Err(refusals),
            Templated::Plain(notes) => {
                findings.extend(notes);
                None
            }
            Templated::Merged { name, new, old } => Some(Judged {
                new: Cow::Owned(new),
                old: old.map(Cow::Owned),
                template: Some(name),
            }),
        }
    } else {
        None
    };
    Ok(judged.unwrap_or(Judged {
        new: Cow::Borrowed(new_spec),
        old: old_spec.map(Cow::Borrowed),
        template: None,
    }))
}

/// Every finding on the review's object; Err: the object is not a SandboxRun.
async fn findings_of(
    state: &WebhookState,
    req: &AdmissionRequest<DynamicObject>,
    object: &DynamicObject,
) -> Result<Vec<Finding>, crate::policy::ratchet::InvalidSpec> {
    let new_spec = spec_value(object);
    let old = req
        .old_object
        .as_ref()
        .map(|o| (spec_value(o), pod_exists(o)));
    let old_spec = old.as_ref().map(|(spec, _)| *spec);
    // The finalizer release and every other update of a run on its way out.
    let deleting = object.metadata.deletion_timestamp.is_some()
        || req
            .old_object
            .as_ref()
            .is_some_and(|o| o.metadata.deletion_timestamp.is_some());
    let mut findings = Vec::new();
    let judged = match judged_spec(state, req, new_spec, old_spec, deleting, &mut findings).await {
        Ok(judged) => judged,
        Err(refusals) => return Ok(refusals),
    };
    let review = if req.operation == Operation::Create {
        Review::Create { spec: &judged.new }
    } else {
        Review::Update {
            old: judged
                .old
                .as_deref()
                .zip(old.as_ref())
                .map(|(spec, (_, pod_exists))| Stored {
                    spec,
                    pod_exists: *pod_exists,
                }),
            spec: &judged.new,
            deleting,
        }
    };
    findings.extend(judged_findings(state, req, review).await?);
    if let Some(name) = &judged.template {
        findings = findings
            .into_iter()
            .map(|f| crate::policy::templates::blame_template(f, name, new_spec))
            .collect();
    }
    if state.access_checks {
        let pod_exists = old.as_ref().is_some_and(|(_, exists)| *exists);
        findings.extend(access_findings(state, req, new_spec, old_spec, pod_exists).await);
    }
    if !state.settings.namespace_policies.is_empty() {
        let old = judged.old.as_deref();
        findings.extend(namespace_policy_findings(state, req, &judged.new, old).await);
    }
    // The platform's pull Secrets pull the holder, not the workload (issue #38 item 3).
    let old = judged.old.as_deref();
    findings.extend(state.platform_pull.review_refusal(&judged.new, old));
    Ok(findings)
}

/// The refusal of a request that writes the shard label as only the operator may (docs/contract.md
/// "Shards"): the watches of the replicas select on it.
fn shard_label_finding(
    state: &WebhookState,
    req: &AdmissionRequest<DynamicObject>,
    object: &DynamicObject,
) -> Option<Finding> {
    use crate::shard::SHARD_LABEL;
    let label = |o: &DynamicObject| o.metadata.labels.as_ref()?.get(SHARD_LABEL).cloned();
    let old = req.old_object.as_ref().and_then(label);
    let uid = object
        .metadata
        .uid
        .as_deref()
        .or_else(|| req.old_object.as_ref()?.metadata.uid.as_deref());
    let create = req.operation == Operation::Create;
    let why = crate::shard::label_change_refusal(
        old.as_deref(),
        label(object).as_deref(),
        uid,
        state.shards,
        create,
    )?;
    Some(Finding::fail(
        "shard-label",
        format!("metadata.labels[{SHARD_LABEL}]"),
        why,
        "leave the label as it is (remove it from your manifest); the operator writes it",
    ))
}

/// The refusal of an edit of the `kueue.x-k8s.io/queue-name` label of a run that was queued
/// (its status records the queue; docs/contract.md "Quota cannot be edited away"). A deletion
/// or a stop is never refused; the operator holds such a run on its own.
fn queue_label_finding(
    req: &AdmissionRequest<DynamicObject>,
    object: &DynamicObject,
) -> Option<Finding> {
    use crate::kueue::QUEUE_LABEL;
    let old = req.old_object.as_ref()?;
    let recorded = old
        .data
        .pointer("/status/queue")
        .and_then(serde_json::Value::as_str);
    let label = object
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(QUEUE_LABEL))
        .map(String::as_str);
    let letting_go = object.metadata.deletion_timestamp.is_some()
        || old.metadata.deletion_timestamp.is_some()
        || object.data.pointer("/spec/stop") == Some(&serde_json::Value::Bool(true));
    let Some(why) = crate::kueue::label_change_refusal(recorded, label, letting_go) else {
        return priority_label_finding((old, object), recorded, letting_go);
    };
    Some(Finding::fail(
        "queue-label",
        format!("metadata.labels[{QUEUE_LABEL}]"),
        why,
        "put the label back as it was; to leave the queue, stop the run (spec.stop: true) or delete it",
    ))
}

/// The refusal of an edit of the `kueue.x-k8s.io/priority-class` label of a run that was queued
/// in `recorded` (rule `queue-label`; docs/contract.md "A queued run keeps the queue and
/// priority it was queued with").
fn priority_label_finding(
    (old, object): (&DynamicObject, &DynamicObject),
    recorded: Option<&str>,
    letting_go: bool,
) -> Option<Finding> {
    use crate::kueue::PRIORITY_LABEL;
    let label = |o: &DynamicObject| {
        o.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(PRIORITY_LABEL))
            .filter(|v| !v.is_empty())
            .cloned()
    };
    let disagrees = old
        .data
        .pointer("/status/conditions")
        .and_then(serde_json::Value::as_array)
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == crate::kueue::LABEL_EDIT_IGNORED && c["status"] == "True")
        });
    let (was, now) = (label(old), label(object));
    let why = crate::kueue::priority_change_refusal(
        recorded,
        (was.as_deref(), now.as_deref()),
        letting_go,
        disagrees,
    )?;
    Some(Finding::fail(
        "queue-label",
        format!("metadata.labels[{PRIORITY_LABEL}]"),
        why,
        "put the label back as it was; a run's priority is the one it was queued with (to requeue at another, stop the run and create it anew)",
    ))
}

/// The rules' findings on `review` ([`judge`]) and, when on, the image check's.
async fn judged_findings(
    state: &WebhookState,
    req: &AdmissionRequest<DynamicObject>,
    review: Review<'_>,
) -> Result<Vec<Finding>, crate::policy::ratchet::InvalidSpec> {
    let who = format!(
        "SandboxRun {}/{}",
        req.namespace.as_deref().unwrap_or("-"),
        req.name
    );
    let judgement = judge(review, &state.settings)?;
    if let Some(e) = &judgement.stored_unreadable {
        // The stored object should always parse; if it does not, the spec rules still protect the
        // new object, and the update rules cannot run.
        warn!(%who, error = %e, "stored object does not parse; update rules skipped");
    }
    debug!(%who, scope = ?judgement.scope, "admission scope");
    let mut findings = judgement.findings;
    // The registry round trip: on CREATE, and on UPDATE only when spec.image changed (an image
    // admitted earlier is not re-resolved: its tag may be gone, the run must still be let go of).
    if let (Some(images), Some(wanted)) = (&state.images, &judgement.resolve_image) {
        let creds = match (&state.client, req.namespace.as_deref()) {
            (Some(client), Some(ns)) => pull_credentials(client, ns, &wanted.pull_secrets).await,
            _ => None,
        };
        let resolution = images.resolve(&wanted.image, creds.as_ref()).await;
        findings.extend(crate::policy::resolvable::finding(
            &resolution,
            &wanted.image,
        ));
    }
    Ok(findings)
}

/// The review's new and stored specs, typed (None when the new one does not parse; a stored one
/// that does not parse counts as absent).
fn typed_specs(
    new: &serde_json::Value,
    old: Option<&serde_json::Value>,
) -> Option<(
    crate::api::SandboxRunSpec,
    Option<crate::api::SandboxRunSpec>,
)> {
    use serde::Deserialize;
    let new = crate::api::SandboxRunSpec::deserialize(new).ok()?;
    Some((
        new,
        old.and_then(|o| crate::api::SandboxRunSpec::deserialize(o).ok()),
    ))
}

/// The rights the run exercises ([`crate::policy::access::to_verify`]: all of them on CREATE and on an
/// UPDATE before its pod exists, what it adds after) that the requesting user does not hold
/// (docs/contract.md "A run uses only its author's rights").
async fn access_findings(
    state: &WebhookState,
    req: &AdmissionRequest<DynamicObject>,
    new: &serde_json::Value,
    old: Option<&serde_json::Value>,
    pod_exists: bool,
) -> Vec<Finding> {
    // A spec that does not parse was refused by the rules already.
    let Some((new, old)) = typed_specs(new, old) else {
        return Vec::new();
    };
    let mut wanted = crate::policy::access::to_verify(old.as_ref(), &new, pod_exists);
    if wanted.is_empty() {
        return Vec::new();
    }
    match (&state.client, req.namespace.as_deref()) {
        (Some(client), Some(ns)) => {
            let store = store_ref_findings(state, client, ns, &new, &mut wanted).await;
            // Bounded per review and in all: the endpoint is no RBAC oracle (issue #38 item 6).
            let mut findings = match super::review_limit::admit(wanted.len()) {
                Some(refused) => vec![refused],
                None => crate::policy::access::check(client, &req.user_info, ns, &wanted).await,
            };
            findings.extend(store);
            // Only for a user who may read the source: the refusal says what it stores.
            if !findings
                .iter()
                .any(|f| f.field.contains(crate::policy::access::FORK_FIELD))
            {
                findings.extend(fork_store_findings(client, ns, &new, &wanted).await);
            }
            findings
        }
        _ => vec![Finding::fail(
            crate::policy::access::ACCESS_RULE,
            "spec",
            "the webhook cannot check the requesting user's rights (no client or namespace)",
            "report this to the operator's admin",
        )],
    }
}

/// A fork (`spec.workspace.from`, when the review adds it) whose source run does not exist or
/// stores its files in another store than the fork's (docs/contract.md "Pause, resume and
/// fork"). Judged on the specs as written when neither run is made from a template (a
/// template's store is the operator's to judge: it refuses the restore on its own).
async fn fork_store_findings(
    client: &Client,
    namespace: &str,
    new: &crate::api::SandboxRunSpec,
    wanted: &std::collections::BTreeMap<crate::policy::access::Right, Vec<String>>,
) -> Vec<Finding> {
    use crate::policy::access::{Right, FORK_FIELD, RUNS};
    let Some(from) = new.workspace.as_ref().and_then(|w| w.from.as_ref()) else {
        return Vec::new();
    };
    if !wanted.contains_key(&Right::get(RUNS, &from.run)) {
        return Vec::new();
    }
    let runs: Api<crate::api::SandboxRun> = Api::namespaced(client.clone(), namespace);
    let refuse = |message: String| {
        vec![Finding::fail(
            crate::policy::access::ACCESS_RULE,
            FORK_FIELD,
            message,
            "fork a run of this namespace that stores its files in this run's store",
        )]
    };
    match runs.get_opt(&from.run).await {
        Ok(Some(source)) => {
            let templated = new.template_ref.is_some() || source.spec.template_ref.is_some();
            if templated || source.spec.store_ref() == new.store_ref() {
                return Vec::new();
            }
            let store = |s: Option<&str>| {
                s.map_or("the default store".to_string(), |s| format!("store {s}"))
            };
            refuse(format!(
                "the source run {} stores its files in {}, this run in {}: a fork restores only from its own store",
                from.run,
                store(source.spec.store_ref()),
                store(new.store_ref())
            ))
        }
        Ok(None) => refuse(format!(
            "the source run {} does not exist in namespace {namespace}",
            from.run
        )),
        Err(e) => refuse(format!("the source run {} cannot be read: {e}", from.run)),
    }
}

/// The store a run names (`spec.readBack.storeRef`, when the update adds it): refused when
/// tenant stores are off or its ConfigMap is missing; else the right to read the Secret its
/// ConfigMap names joins `wanted` (docs/contract.md "A store per namespace").
async fn store_ref_findings(
    state: &WebhookState,
    client: &Client,
    namespace: &str,
    new: &crate::api::SandboxRunSpec,
    wanted: &mut std::collections::BTreeMap<crate::policy::access::Right, Vec<String>>,
) -> Vec<Finding> {
    use crate::policy::access::{Right, STORE_REF_FIELD};
    let Some(name) = new.store_ref() else {
        return Vec::new();
    };
    if !wanted.contains_key(&Right::get("configmaps", name)) {
        return Vec::new();
    }
    let refuse = |message: String, hint: &str| {
        vec![Finding::fail(
            crate::policy::access::ACCESS_RULE,
            STORE_REF_FIELD,
            message,
            hint,
        )]
    };
    if !state.tenant_stores.enabled() {
        return refuse(
            crate::store::tenant::TenantStoreError::Off {
                namespace: namespace.into(),
                name: name.into(),
            }
            .to_string(),
            "drop spec.readBack.storeRef (the operator's store is used), or ask the platform to turn tenant stores on",
        );
    }
    let configmaps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client.clone(), namespace);
    match configmaps.get_opt(name).await {
        Ok(Some(cm)) => {
            let Some((right, field)) = crate::policy::access::store_secret(&cm.data.unwrap_or_default())
            else {
                return Vec::new();
            };
            let secret = right.name.clone().unwrap_or_default();
            let store = format!("{namespace}/{name}");
            if let Some(refused) = state.tenant_stores.secret_refused(&store, &secret) {
                return refuse(
                    refused.to_string(),
                    "name a store whose ConfigMap names one of those Secrets, or drop spec.readBack.storeRef",
                );
            }
            wanted.entry(right).or_default().push(field);
            Vec::new()
        }
        Ok(None) => refuse(
            format!("the store ConfigMap {namespace}/{name} does not exist"),
            "create it (keys url, options, secretName; docs/user-guide.md \"Your namespace's store\"), or drop spec.readBack.storeRef",
        ),
        Err(e) => refuse(
            format!("the store ConfigMap {namespace}/{name} could not be read by the webhook: {e}"),
            "the operator needs get on configmaps in this namespace (chart value tenantStores.enabled)",
        ),
    }
}

/// What the run breaks of the namespace policies that govern its namespace (docs/contract.md
/// "The platform's namespace policies"), on UPDATE only what the update adds. The namespace's
/// labels are read when a policy selects by them; a namespace that cannot be read refuses.
async fn namespace_policy_findings(
    state: &WebhookState,
    req: &AdmissionRequest<DynamicObject>,
    new: &serde_json::Value,
    old: Option<&serde_json::Value>,
) -> Vec<Finding> {
    use crate::policy::rules::ids::RUN_POLICY;
    // A spec that does not parse was refused by the rules already.
    let Some((new, old)) = typed_specs(new, old) else {
        return Vec::new();
    };
    let policies = &state.settings.namespace_policies;
    let mut labels = std::collections::BTreeMap::new();
    if policies.iter().any(|p| p.needs_labels()) {
        let read = match (&state.client, req.namespace.as_deref()) {
            (Some(client), Some(ns)) => {
                Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
                    .get(ns)
                    .await
                    .map_err(|e| e.to_string())
            }
            _ => Err("no client or namespace".to_string()),
        };
        match read {
            Ok(ns) => labels = ns.metadata.labels.unwrap_or_default(),
            Err(e) => {
                return vec![Finding::fail(
                    RUN_POLICY,
                    "metadata.namespace",
                    format!("the namespace's labels cannot be read to judge the namespace policies: {e}"),
                    "the operator needs get on namespaces (chart runPolicy.namespacePolicies grants it)",
                )]
            }
        }
    }
    crate::policy::namespace_policy::added_violations(&new, old.as_ref(), &labels, policies)
        .into_iter()
        .map(|v| Finding::fail(RUN_POLICY, v.field, v.message, v.hint))
        .collect()
}

/// Builds the response from the findings: deny with every failure, warn with every warning.
fn respond(
    mut resp: AdmissionResponse,
    who: &str,
    findings: &[Finding],
) -> (AdmissionResponse, &'static str) {
    let warnings: Vec<String> = findings
        .iter()
        .filter(|f| !f.is_fail())
        .map(|f| format!("[{}] {}: {} (hint: {})", f.rule, f.field, f.message, f.hint))
        .collect();
    let failures: Vec<&Finding> = findings.iter().filter(|f| f.is_fail()).collect();
    if !warnings.is_empty() {
        resp.warnings = Some(warnings);
    }
    if failures.is_empty() {
        let verdict = if resp.warnings.is_some() {
            "warned"
        } else {
            "allowed"
        };
        return (resp, verdict);
    }
    let mut message = format!(
        "{who} refused by ADR-006 admission ({} failing check(s)):",
        failures.len()
    );
    for f in failures {
        message.push_str(&format!(
            "\n- [{}] {}: {} (hint: {})",
            f.rule, f.field, f.message, f.hint
        ));
    }
    let mut resp = resp.deny(message);
    resp.result.reason = "Invalid".to_string();
    resp.result.code = 422;
    (resp, "denied")
}

/// The object's `.spec`, raw and borrowed (no copy on the hot path); an empty object when it has
/// none.
fn spec_value(obj: &DynamicObject) -> &serde_json::Value {
    static EMPTY: std::sync::LazyLock<serde_json::Value> =
        std::sync::LazyLock::new(|| serde_json::Value::Object(Default::default()));
    obj.data.get("spec").unwrap_or(&EMPTY)
}

/// Whether the object's status names its pod (read in place: the status is neither copied nor
/// parsed whole for one field).
fn pod_exists(obj: &DynamicObject) -> bool {
    obj.data
        .pointer("/status/podName")
        .and_then(serde_json::Value::as_str)
        .is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn update(old: serde_json::Value, new: serde_json::Value) -> AdmissionRequest<DynamicObject> {
        let body = serde_json::json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "1",
                "kind": {"group": "sandbox.iterion.io", "version": "v1alpha1", "kind": "SandboxRun"},
                "resource": {"group": "sandbox.iterion.io", "version": "v1alpha1", "resource": "sandboxruns"},
                "name": "job",
                "namespace": "team-a",
                "operation": "UPDATE",
                "userInfo": {"username": "alice"},
                "object": new,
                "oldObject": old,
                "dryRun": false,
            }
        });
        let review: AdmissionReview<DynamicObject> = serde_json::from_value(body).unwrap();
        review.try_into().unwrap()
    }

    fn run(label: Option<&str>, queue: Option<&str>, stop: bool) -> serde_json::Value {
        let mut run = serde_json::json!({
            "apiVersion": "sandbox.iterion.io/v1alpha1",
            "kind": "SandboxRun",
            "metadata": {"name": "job", "namespace": "team-a", "labels": {}},
            "spec": {"image": "img@sha256:abc", "stop": stop},
        });
        if let Some(label) = label {
            run["metadata"]["labels"][crate::kueue::QUEUE_LABEL] = label.into();
        }
        if let Some(queue) = queue {
            run["status"] = serde_json::json!({"queue": queue});
        }
        run
    }

    fn refused(old: serde_json::Value, new: serde_json::Value) -> bool {
        let req = update(old, new);
        let object = req.object.as_ref().unwrap();
        queue_label_finding(&req, object).is_some_and(|f| f.is_fail())
    }

    fn prioritised(mut run: serde_json::Value, class: Option<&str>) -> serde_json::Value {
        if let Some(class) = class {
            run["metadata"]["labels"][crate::kueue::PRIORITY_LABEL] = class.into();
        }
        run
    }

    #[test]
    fn the_priority_label_of_a_queued_run_cannot_be_changed_but_can_be_put_back_or_let_go() {
        let at = |class: Option<&str>, queue: Option<&str>, stop: bool| {
            prioritised(run(Some("lq"), queue, stop), class)
        };
        let queued = || at(Some("low"), Some("lq"), false);
        assert!(refused(queued(), at(Some("high"), Some("lq"), false)));
        assert!(refused(queued(), at(None, Some("lq"), false)));
        assert!(
            refused(
                at(None, Some("lq"), false),
                at(Some("high"), Some("lq"), false)
            ),
            "nor added"
        );
        assert!(!refused(queued(), at(Some("low"), Some("lq"), false)));
        assert!(
            !refused(queued(), at(Some("high"), Some("lq"), true)),
            "stop is never refused"
        );
        assert!(
            !refused(at(Some("low"), None, false), at(Some("high"), None, false)),
            "not queued yet: the label is the author's"
        );
        // Edited past a bypassed webhook (the operator said so): it can be put back.
        let mut disagrees = at(Some("high"), Some("lq"), false);
        disagrees["status"]["conditions"] = serde_json::json!([{"type": "LabelEditIgnored",
            "status": "True", "reason": "PriorityLabelChanged"}]);
        assert!(!refused(disagrees, queued()));
    }

    #[test]
    fn the_queue_label_of_a_queued_run_cannot_be_removed_but_the_run_can_be_stopped() {
        let queued = || run(Some("lq"), Some("lq"), false);
        assert!(refused(queued(), run(None, Some("lq"), false)));
        assert!(refused(queued(), run(Some("free"), Some("lq"), false)));
        assert!(!refused(queued(), run(Some("lq"), Some("lq"), false)));
        assert!(
            !refused(queued(), run(None, Some("lq"), true)),
            "stop is never refused"
        );
        assert!(
            !refused(run(Some("lq"), None, false), run(None, None, false)),
            "not queued yet: the label is the author's"
        );
    }
}
