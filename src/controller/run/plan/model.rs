//! The plan's vocabulary: what a plan is ([`Plan`], [`Effect`], [`Requeue`], [`StepPlan`]), what
//! it is made from ([`Inputs`]) and the controller's timing constants. Every planner (the parent
//! module's children) builds from these; nothing here plans.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;

use crate::api::{Retention, SandboxRun, SandboxRunStatus};
use crate::controller::events::PlannedEvent;
use crate::controller::pod_view::PodView;
use crate::controller::run::decide::{Preflight, Trigger};
use crate::identity::RunId;
use crate::inpod::launch::StartMessage;
use crate::pod::PodSettings;
use crate::store::tenant_read::RunStore;

/// How long after a time the run is looked at again, so the decision sees that time passed.
pub(crate) const LOOK_AGAIN_MARGIN: Duration = Duration::from_millis(200);

/// How often a run whose drain is in flight is looked at again (a safety net: the drain's own
/// status writes wake it when it ends).
pub(crate) const IN_FLIGHT_REQUEUE: Duration = Duration::from_secs(30);

/// How long a prompt run's passing states may last unreported by default (`run --quiet-window`,
/// docs/contract.md "A quiet lifecycle"): a fresh run's pod that runs within it is never reported
/// `Pending` (no status write, no `PodCreated` Event), and a teardown whose paths all drain
/// within it is never reported `Draining` (no `TearingDown` Event): such a run is written when it
/// runs and when it ends. A state that outlasts it is reported then, with its Event; a problem
/// is reported at once.
pub(crate) const SETTLE: Duration = Duration::from_secs(2);

/// How often a run whose pod name is taken by a pod it does not own is looked at again.
pub(crate) const NAME_CONFLICT_REQUEUE: Duration = Duration::from_secs(60);

/// When the run is reconciled again without a watch event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Requeue {
    /// Only on a change of the run or its pod.
    AwaitChange,
    /// After this long (or earlier on a change).
    After(Duration),
}

impl Requeue {
    /// The controller's action.
    pub(crate) fn into_action(self) -> kube::runtime::controller::Action {
        match self {
            Requeue::AwaitChange => kube::runtime::controller::Action::await_change(),
            Requeue::After(d) => kube::runtime::controller::Action::requeue(d),
        }
    }
}

/// Something the act stage does besides writing status and publishing Events.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Effect {
    /// Put `FINALIZER` on the run.
    AddFinalizer,
    /// Take `FINALIZER` off the run.
    RemoveFinalizer,
    /// Delete the run's pod; `at_once`: with no grace period (nothing in it is owed any more),
    /// else the holder's grace period (set from the drain timeout) applies.
    DeletePod {
        /// No grace period.
        at_once: bool,
    },
    /// Tell the holder's preStop hook the drain is done, so the pod stops at once.
    MarkDrained,
    /// Delete the run whose TTL passed (preconditioned on its uid), then publish this Event.
    DeleteExpiredRun(PlannedEvent),
    /// Resolve the store the run uses now, for a delete of every stored file of the run
    /// (`retention: Delete`); the store (or why it cannot be used) is the answer, and
    /// [`super::after`] decides what is deleted ([`PurgeTarget`]) or why nothing is. A delete
    /// that must be retried ends the plan there: the effects after it wait for a later reconcile.
    PurgeStoredFiles,
    /// Delete what `PurgeTarget` names (its manifests first, then everything under its run
    /// directory); how many objects, or why not, is the answer.
    DeleteStoredFiles(Box<PurgeTarget>),
    /// Remember that the apiserver refused the run's pod now (the creation back-off).
    RecordCreateAttempt(Timestamp),
    /// Forget the run's refused creation attempts.
    ForgetCreateAttempts,
    /// Remember that this replica created the run's pod and has not reported it yet (the pod
    /// name is not in the status before [`SETTLE`]): should the pod vanish before it is
    /// reported, the run is reported lost, never given a second pod without a word.
    RememberUnreportedPod,
    /// Publish this Event now (after the effects before it, e.g. once a policy is applied).
    Publish(PlannedEvent),
    /// Apply the run's NetworkPolicy (server-side apply) before its pod exists: a policy the
    /// apiserver refuses is an error, and the pod is not created without it.
    ApplyNetworkPolicy(Box<NetworkPolicy>),
    /// Create the run's pod; what the apiserver answers (`Answer`) is planned by `after`.
    CreatePod(Box<Pod>),
    /// Create the run's Kueue Workload (docs/user-guide.md "Queueing with Kueue"); one that
    /// exists already is left as it is.
    CreateWorkload(Box<serde_json::Value>),
    /// Merge-patch the status of the run's Kueue Workload (the patch carries the
    /// resourceVersion it was computed from).
    PatchWorkloadStatus(Box<serde_json::Value>),
    /// Restore the current attempt's read-back paths from these files (the run's own attempt,
    /// or a fork's source, read and bound first) (docs/contract.md "Pause, resume and fork"),
    /// into the parked pod's holder; what was restored, or why not, is the answer
    /// ([`super::restore::restored`]).
    RestoreWorkspace(Box<super::fork::Source>),
    /// Hand the parked pod's launcher the run's start, or — the record says the restore failed —
    /// a refusal; the answer is planned by [`super::restore::delivered`].
    DeliverStart(Box<crate::api::RestoreStatus>),
    /// Merge-patch the run's Kueue Workload itself (its `spec.active`: a suspended run's
    /// Workload is deactivated so Kueue frees its quota, and activated again when it resumes).
    PatchWorkload(Box<serde_json::Value>),
    /// Make the pool pod the run's with the claim's merge patch (guarded by the pod's
    /// resourceVersion: two runs racing for one pod, one wins); that it was claimed, or that
    /// another run took it first, is the answer (the warm claim, [`super::claim`](mod@super::claim)).
    /// A claim that is not made gives back the replica's reservation of the pod.
    ClaimPoolPod {
        /// The pool pod and what its launcher starts.
        claim: Box<Claim>,
        /// The merge patch (the cold pod's labels and owner, the claim labels).
        patch: Box<serde_json::Value>,
    },
    /// Hand the run's start to the launcher parked in its claimed pool pod (`pods/attach`; a
    /// resumed claim asks the launcher first and writes only to one still waiting); whether it
    /// took it is the answer.
    HandPoolStart(Box<Delivery>),
    /// Delete the claimed pool pod of this name whose launcher did not take the start (best
    /// effort: the run starts cold, a pod left behind goes with the run).
    DeletePoolPod(String),
    /// Count a run that starts cold in its pool's `status.misses` (one read, then one merge
    /// patch guarded by the pool's resourceVersion); what came of it is the answer.
    CountPoolMiss(Box<Miss>),
    /// Count a pool start in `sandboxrun_pool_starts_total`.
    CountPoolStart(PoolStart),
}

/// What one reconcile writes, publishes and does, in that order.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Plan {
    /// The Events to publish, first, in order.
    pub events: Vec<PlannedEvent>,
    /// The status to write next (server-side apply); None: nothing to write.
    pub status: Option<SandboxRunStatus>,
    /// Then these, in order.
    pub effects: Vec<Effect>,
    /// When to look again.
    pub requeue: Requeue,
}

impl Plan {
    /// A plan that only waits.
    pub(crate) fn wait(requeue: Requeue) -> Plan {
        Plan {
            events: Vec::new(),
            status: None,
            effects: Vec::new(),
            requeue,
        }
    }
}

/// The plan of a step, or the I/O it needs first.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum StepPlan {
    /// Carry this out.
    Carry(Box<Plan>),
    /// Pre-flight this pod's image, then plan its creation with `create`.
    CreatePod(Box<Pod>),
    /// Start the teardown in the drain pool (unless one is in flight); look again after
    /// [`IN_FLIGHT_REQUEUE`].
    Teardown(Trigger),
    /// Read the live run and the committed manifests; then plan with `record_pod_lost`.
    RecordPodLost,
    /// Start the checkpoint in the drain pool (unless a drain of the run is in flight); look
    /// again after [`IN_FLIGHT_REQUEUE`].
    Checkpoint,
}

/// What the plan of a step is made from, besides the step.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Inputs<'a> {
    /// The run (as the watch cache has it).
    pub run: &'a SandboxRun,
    /// The name of its pod.
    pub pod_name: &'a str,
    /// The facts of its pod; None when it has none.
    pub pod: Option<&'a PodView>,
    /// Now.
    pub now: Timestamp,
    /// The pod builder's settings.
    pub pod_settings: &'a PodSettings,
    /// The admission rules the operator judges a run by again before it builds its pod
    /// (docs/contract.md "The operator never builds a pod its own rules refuse").
    pub rules: &'a crate::policy::RuleSettings,
    /// Why the run may not have a pod until an admission verifies its author's rights
    /// (`policy::stamp::unverified_rights`, judged on the run's own spec); None: it may.
    pub rights_unverified: Option<&'a str>,
    /// When this process last tried to create the run's pod and was refused.
    pub last_create_attempt: Option<Timestamp>,
    /// What deleting a run does to its stored files when its spec does not say.
    pub default_retention: Retention,
    /// How long a passing state may last unreported ([`SETTLE`] by default).
    pub settle: Duration,
    /// The egress proxy's pod addresses as this replica's watch has them
    /// ([`crate::egress::proxy_pods`]): denied to a run while its egress gate waits.
    pub proxy_pods: &'a [std::net::IpAddr],
}

/// What the creation of a run's pod depends on besides the run, as the prepare stage read it
/// just before (`super::super::prepare::for_creation`): the pod's final shape and the plan of
/// its creation are made from these by [`super::creation`].
#[derive(Clone, Debug, Default)]
pub(crate) struct CreationFacts {
    /// Why the run's store cannot be used (tenant stores): the pod is not created.
    pub store_unusable: Option<String>,
    /// What the pre-flight of its image says.
    pub preflight: Preflight,
    /// Its namespace's labels, when a namespace policy selects by label or gives a default it
    /// does not override (docs/contract.md "The platform's namespace policies").
    pub namespace_labels: Option<BTreeMap<String, String>>,
    /// The Kueue ResourceFlavors it was admitted on.
    pub flavors: Vec<serde_json::Value>,
}

impl CreationFacts {
    /// The facts of a run whose store cannot be used (why): nothing else was read.
    pub(crate) fn store_unusable(why: String) -> CreationFacts {
        CreationFacts {
            store_unusable: Some(why),
            ..CreationFacts::default()
        }
    }
}

/// What a delete of a run's stored files works on, as planned from the store the run uses now:
/// the store, the run, the keys of its declared paths' manifests (deleted first) and where, for
/// the Event.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct PurgeTarget {
    /// The store the run uses now.
    pub store: RunStore,
    /// The run whose directory is deleted.
    pub run: RunId,
    /// Its declared paths' manifest keys: the commit points go first.
    pub manifests: Vec<object_store::path::Path>,
    /// `<store url>/<run dir>/`, for the Event.
    pub location: String,
}

/// Why a run's stored files were not (all) deleted (`retention: Delete`).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub(crate) enum NotPurged {
    /// The run's store cannot be used now (its words).
    #[error("{0}")]
    StoreUnusable(String),
    /// The run stored `object` in another store than the one it uses now: nothing is deleted
    /// where it points.
    #[error("the run stored {object}, which is not in {store} any more; nothing deleted there")]
    StoredElsewhere {
        /// The object it stored.
        object: String,
        /// The store it uses now.
        store: String,
    },
    /// The store refused a listing or a delete, or the time given ran out (its words).
    #[error("{store}: {error}")]
    Store {
        /// The store.
        store: String,
        /// What it said.
        error: String,
    },
    /// The run has no identity: it names no directory, and nothing is deleted anywhere.
    #[error(transparent)]
    Unidentified(#[from] crate::identity::MissingIdentity),
}

// The warm claim's vocabulary (its plans: [`super::claim`](mod@super::claim)).

/// How soon a run that took a pod (or was told to start cold) is looked at again.
pub(crate) const CLAIM_REQUEUE: Duration = Duration::from_millis(100);

/// How many times a miss is counted on a pool that keeps changing under the count.
pub(crate) const MISS_TRIES: u8 = 3;

/// A pool pod a run takes for its attempt.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Claim {
    /// The pool (`status.warmStart.pool`, the miss count's).
    pub pool: String,
    /// The pool pod's name.
    pub pod: String,
    /// What its launcher starts: the run's command and env (values read at claim time), or a
    /// refusal that names why a resumed claim's env cannot be delivered.
    pub message: StartMessage,
    /// Whether the claim hands the launcher its start: not when the attempt restores its paths,
    /// whose start waits for the restore's answer (`super::restore`, docs/contract.md "Pause,
    /// resume and fork").
    pub hand_over: bool,
}

/// The start handed to a claimed pod's launcher.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Delivery {
    /// The claim (the pool, the pod and the start).
    pub claim: Claim,
    /// The claim was made in an earlier reconcile: only a launcher still waiting is written to.
    pub resumed: bool,
}

/// A run that starts cold, counted on its pool.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Miss {
    /// The pool.
    pub pool: String,
    /// Why it starts cold (`status.warmStart.coldReason`).
    pub why: String,
    /// How many times the count was tried, this one included.
    pub tries: u8,
}

/// Which start a run got from its pool (`sandboxrun_pool_starts_total{start}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PoolStart {
    /// From a ready pool pod.
    Warm,
    /// A pod of its own.
    Cold,
}

impl PoolStart {
    /// The metric's `start` label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            PoolStart::Warm => "warm",
            PoolStart::Cold => "cold",
        }
    }
}

/// Why the start did not reach a claimed pod's launcher (its words).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct NotDelivered(pub String);

/// What came of counting a miss on a pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MissCount {
    /// Counted.
    Counted,
    /// The pool changed between its read and the count (409): not counted.
    Changed,
    /// Not counted (the pool could not be read or written; act says why in the log).
    Failed,
}

/// Why a run made from a pooled template starts cold (`status.warmStart.coldReason`).
#[derive(Debug, thiserror::Error)]
pub(crate) enum Cold {
    #[error("{0}")]
    Incompatible(#[from] crate::pool::compat::Incompatible),
    #[error("the pool's pods are not the pod this run gets (its namespace's defaults, or the pool is rolling out)")]
    OtherShape,
    #[error("the pool had no ready pod")]
    NoReadyPod,
    #[error("the run has no command: a pool pod's launcher starts only a command the run names")]
    NoCommand,
    #[error("{0}")]
    Env(crate::pool::env::Unresolved),
    #[error("the pool pod's launcher did not start the run: {0}")]
    NotStarted(#[from] NotDelivered),
}
