//! Prepare: what a reconcile reads besides its pod (which [`super::observe`] reads), gathered
//! before anything is planned from it — the run it reconciles (made from its template,
//! [`made_run`]), its Kueue Workload ([`queue_view`]), and, just before its pod is created, the
//! facts the pod's final shape and its creation depend on ([`for_creation`]: the store verdict,
//! the namespace's labels, the image pre-flight, the Kueue flavors), and before a lost pod is
//! reported, the live run and what its store has committed ([`live_run`],
//! [`committed_entries`]). Reads only: what they mean
//! is decided by pure code (`crate::template`, `super::kueue_gate`, `super::plan`), and nothing
//! here writes — a run the reads hold is planned and carried out by the pipeline.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use serde_json::Value;
use tracing::warn;

use super::decide::{self, Preflight, Step};
use super::observe::{self, Observation};
use super::plan::CreationFacts;
use crate::api::{ReadBackStatus, SandboxRun, FINALIZER};
use crate::controller::context::Context;
use crate::controller::error::ControllerError;
use crate::identity::RunId;
use crate::kueue::{Priority, QueueState};

/// The run a reconcile works on, made once per reconcile ([`made_run`]): the run merged (made
/// from its template, with the read-back spec its pod started with) and the run as its author
/// wrote it. Each caller names which one it needs.
#[derive(Clone, Debug)]
pub(super) struct MadeRun {
    merged: Arc<SandboxRun>,
    authored: Arc<SandboxRun>,
}

impl MadeRun {
    /// `authored` made into `merged`.
    pub(super) fn new(authored: Arc<SandboxRun>, merged: Arc<SandboxRun>) -> MadeRun {
        MadeRun { merged, authored }
    }

    /// The run every stage decides, plans and acts on: made from its template (if it names
    /// one), its read-back spec the one its pod recorded once the pod exists (docs/contract.md
    /// "A teardown follows what its run started with").
    pub(super) fn merged(&self) -> &Arc<SandboxRun> {
        &self.merged
    }

    /// The run as its author wrote it: what the admission stamp covers (its author's rights),
    /// its own `templateRef` and spec (what a pool pod's launcher may deliver), and the status
    /// the apiserver stores (whether it records its template yet).
    pub(super) fn authored(&self) -> &SandboxRun {
        &self.authored
    }

    /// This run as the apiserver stored it once its finalizer was added (`stored`, the patch's
    /// answer): its finalizers and resourceVersion taken on; None when the patch changed more
    /// than that (a mutating webhook's spec, labels or annotations, a deletion), so the next
    /// reconcile starts from what is really there (docs/contract.md "A new run's finalizer and
    /// first step in one reconcile").
    pub(super) fn finalized(self, stored: &SandboxRun) -> Option<MadeRun> {
        let (was, now) = (&self.authored.metadata, &stored.metadata);
        let has_finalizer = now.finalizers.iter().flatten().any(|f| f == FINALIZER);
        let same = has_finalizer
            && now.deletion_timestamp.is_none()
            && now.uid == was.uid
            && now.generation == was.generation
            && now.labels == was.labels
            && now.annotations == was.annotations
            && stored.spec == self.authored.spec;
        if !same {
            return None;
        }
        let take = |run: Arc<SandboxRun>| {
            let mut run = Arc::unwrap_or_clone(run);
            run.metadata.finalizers = now.finalizers.clone();
            run.metadata.resource_version = now.resource_version.clone();
            Arc::new(run)
        };
        Some(MadeRun {
            merged: take(self.merged),
            authored: take(self.authored),
        })
    }

    /// Once its pod exists, the run's read-back spec is the one its pod recorded
    /// (docs/contract.md "A teardown follows what its run started with").
    fn started(self, pod: Option<&Pod>) -> MadeRun {
        let Some(pod) = pod else { return self };
        let merged = Arc::unwrap_or_clone(self.merged);
        MadeRun {
            merged: Arc::new(crate::started::as_started(merged, Some(pod))),
            authored: self.authored,
        }
    }
}

/// What [`made_run`] made of a run.
pub(super) enum Made {
    /// Reconcile this run; `resolved`: its template was read in this reconcile (the status that
    /// records it is not stored yet).
    Run {
        /// The run, made.
        run: MadeRun,
        /// Its template was read now.
        resolved: bool,
    },
    /// The template cannot make the run (why): it is held, no pod.
    Unusable(String),
}

/// The run made from its template (docs/contract.md "Templates"): from the template its status
/// records, once its pod was created ([`crate::template::record_holds`]); else, before that,
/// from the template read now, which the pod's creation records. A template that cannot make
/// the run holds it: its pod is never created with the run's own spec. A run being deleted with
/// no pod is its own: no pod will ever be created for it.
pub(super) async fn made_run(
    ctx: &Context,
    run: &Arc<SandboxRun>,
    observation: &Observation,
) -> Result<Made, ControllerError> {
    Ok(match merged(ctx, run, observation).await? {
        Made::Run { run, resolved } => Made::Run {
            run: run.started(observation.pod.as_ref()),
            resolved,
        },
        unusable => unusable,
    })
}

/// The run made from its template, before its pod's record is applied ([`made_run`]).
async fn merged(
    ctx: &Context,
    run: &Arc<SandboxRun>,
    observation: &Observation,
) -> Result<Made, ControllerError> {
    let plain = |made: Arc<SandboxRun>| Made::Run {
        run: MadeRun::new(run.clone(), made),
        resolved: false,
    };
    let Some(reference) = run.spec.template_ref.clone() else {
        return Ok(plain(run.clone()));
    };
    let has_pod = observation.view.is_some();
    if crate::template::record_holds(run, has_pod) {
        if let Some(made) = crate::template::recorded(run) {
            return Ok(plain(Arc::new(made)));
        }
    }
    if run.metadata.deletion_timestamp.is_some() && !has_pod {
        return Ok(plain(run.clone()));
    }
    if has_pod {
        if let Some(made) = recorded_live(ctx, run, observation).await? {
            return Ok(plain(Arc::new(made)));
        }
        warn!(run = %observation.id.name, "the run's pod exists and its status records no template; resolving it now");
    }
    let template = observe::template(&ctx.client, &observation.id.namespace, &reference).await?;
    Ok(
        match template.and_then(|t| crate::template::resolve(run, t.as_ref())) {
            Ok(made) => Made::Run {
                run: MadeRun::new(run.clone(), Arc::new(made)),
                resolved: true,
            },
            Err(message) => {
                warn!(run = %observation.id.name, %message, "the run's template cannot make it; its pod is not created");
                Made::Unusable(message.to_string())
            }
        },
    )
}

/// The run made from the template its live status records (the record is written before the
/// pod is created: the watch cache lags behind it); None: it records none.
async fn recorded_live(
    ctx: &Context,
    run: &SandboxRun,
    observation: &Observation,
) -> Result<Option<SandboxRun>, ControllerError> {
    let live =
        observe::live_run(&ctx.client, &observation.id.namespace, &observation.id.name).await?;
    let applied = live.and_then(|l| l.status.and_then(|s| s.template));
    let mut with_record = run.clone();
    with_record
        .status
        .get_or_insert_with(Default::default)
        .template = applied;
    Ok(crate::template::recorded(&with_record))
}

/// What Kueue says of a run in one of its queues, read once per reconcile.
pub(super) struct QueueView {
    /// The run's Workload as the apiserver has it (None: there is none).
    pub workload: Option<Value>,
    /// What it says ([`crate::kueue::state_of`]).
    pub state: QueueState,
    /// The priority class the run names, read when its Workload is to be created.
    pub priority: Option<Priority>,
    /// The ResourceFlavors its Workload was admitted on, read when its pod is to be created.
    pub flavors: Vec<Value>,
}

/// The Kueue view of a run in a Kueue queue (`run --kueue`) whose step is `step`; None for any
/// other run. A flavor that cannot be read is an error (retried): the pod is never created off
/// its flavor.
pub(super) async fn queue_view(
    ctx: &Context,
    run: &SandboxRun,
    step: &Step,
) -> Result<Option<QueueView>, ControllerError> {
    // What the operator recorded decides, not the live label alone (docs/contract.md "Quota
    // cannot be edited away").
    let queueing = crate::kueue::gate::queueing(run);
    if !ctx.lifecycle.kueue || queueing == crate::kueue::gate::Queueing::Not {
        return Ok(None);
    }
    let creating = matches!(step, Step::CreatePod);
    let id = RunId::of(run)?;
    let workload = observe::workload(&ctx.client, &id).await?;
    let state = crate::kueue::state_of(workload.as_ref(), &id.uid);
    let priority = match crate::kueue::priority_class_of(run) {
        Some(name) if creating && state == QueueState::Absent => {
            observe::workload_priority(&ctx.client, name).await?
        }
        _ => None,
    };
    let mut flavors = Vec::new();
    if creating {
        for name in workload.iter().flat_map(crate::kueue::admitted_flavors) {
            flavors.push(observe::resource_flavor(&ctx.client, &name).await?);
        }
    }
    Ok(Some(QueueView {
        workload,
        state,
        priority,
        flavors,
    }))
}

/// What the creation of `pod` (the run's pod as planned) depends on, read now: whether the run's
/// store can be used (first: a store that cannot be used reads nothing more), the namespace's
/// labels when a namespace policy gives a default the run does not override, the pre-flight of
/// its image (`preflight`: `--preflight-images` on the pipeline's path; a warm claim does not
/// pre-flight), the Kueue flavors it was admitted on.
pub(super) async fn for_creation(
    ctx: &Context,
    run: &SandboxRun,
    pod: &Pod,
    queue: Option<&QueueView>,
    preflight: bool,
) -> Result<CreationFacts, ControllerError> {
    let namespace = RunId::of(run)?.namespace;
    if let Some(why) = store_unusable(ctx, (&namespace, run)).await? {
        return Ok(CreationFacts::store_unusable(why));
    }
    let preflight = match ctx.admission.preflight.as_ref().filter(|_| preflight) {
        Some(resolver) => {
            let client = &ctx.client;
            let (image, resolution) =
                observe::resolve_image(client, resolver, &namespace, pod).await;
            decide::preflight(&image, &resolution)
        }
        None => Preflight::Proceed,
    };
    Ok(CreationFacts {
        store_unusable: None,
        preflight,
        namespace_labels: namespace_labels(ctx, (&namespace, run)).await?,
        flavors: queue.map(|q| q.flavors.clone()).unwrap_or_default(),
    })
}

/// Why the run's store cannot be used, before its pod is created (docs/contract.md "A store
/// per namespace"): only with tenant stores on and paths to drain; a read that may pass is an
/// error (retried), never a verdict.
async fn store_unusable(
    ctx: &Context,
    (namespace, run): (&str, &SandboxRun),
) -> Result<Option<String>, ControllerError> {
    if !ctx.stores.tenants.enabled() || run.spec.read_back_paths().is_empty() {
        return Ok(None);
    }
    let Err(error) = ctx.run_store((namespace, run)).await else {
        return Ok(None);
    };
    let why = crate::controller::error::store_verdict(error)?;
    warn!(run = %run.name_any(), error = %why, "the run's store cannot be used; its pod is not created");
    Ok(Some(why.to_string()))
}

/// The labels of the run's namespace, read only when a namespace policy selects namespaces by
/// label (the controller judges the run by the policies that govern it, as the webhook does) or
/// gives a default and the run names no runtime class (docs/contract.md "The platform's
/// namespace policies"). A namespace that cannot be read is an error (the reconcile is
/// retried): the pod is never created unjudged or without the default its policy sets.
async fn namespace_labels(
    ctx: &Context,
    (namespace, run): (&str, &SandboxRun),
) -> Result<Option<std::collections::BTreeMap<String, String>>, ControllerError> {
    let policies = &ctx.pod.namespace_policies;
    let for_default = run.spec.runtime_class_name.is_none()
        && crate::policy::namespace_policy::gives_defaults(policies);
    if !for_default && !policies.iter().any(|p| p.needs_labels()) {
        return Ok(None);
    }
    Ok(Some(
        observe::namespace_labels(&ctx.client, namespace).await?,
    ))
}

/// The run as the apiserver has it now and as it runs (made from the template its status
/// records; a pod this replica created and has not reported yet counted in: [`Context::with_unreported_pod`]);
/// None: it is gone.
pub(super) async fn live_run(
    ctx: &Context,
    observation: &Observation,
) -> Result<Option<Arc<SandboxRun>>, ControllerError> {
    let id = &observation.id;
    let Some(live) = observe::live_run(&ctx.client, &id.namespace, &id.name).await? else {
        return Ok(None);
    };
    let live = crate::template::recorded(&live).unwrap_or(live);
    Ok(Some(ctx.with_unreported_pod(Arc::new(live))))
}

/// The entries of the run's paths whose manifest its own store already has (docs/contract.md
/// "A store per namespace"); a store that cannot be used holds no committed path.
pub(super) async fn committed_entries(
    ctx: &Context,
    (id, live): (&RunId, &SandboxRun),
) -> Vec<ReadBackStatus> {
    match ctx.run_store((&id.namespace, live)).await {
        Ok(store) => observe::committed_entries(&Context::store_view(&store), (id, live)).await,
        Err(error) => {
            warn!(run = %live.name_any(), %error, "the run's store cannot be used; its undrained paths are recorded lost");
            Vec::new()
        }
    }
}
