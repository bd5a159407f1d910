//! The `SandboxRun` API (group `sandbox.iterion.io`, version `v1alpha1`).
//!
//! These types are the contract: the CRD in `crds/` is generated from them (`sandboxrun-operator crd`),
//! the admission rules read them, the controller reconciles them. Every field carries a doc comment,
//! which becomes its `description` in the CRD so that `kubectl explain sandboxrun.spec` is useful.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, ConfigMapKeySelector, ResourceRequirements, SecretKeySelector, Toleration,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// API group of every resource this operator owns.
pub(crate) const GROUP: &str = "sandbox.iterion.io";
/// The finalizer that holds a SandboxRun until its read-back paths are drained (ADR-143 §3).
pub const FINALIZER: &str = "sandbox.iterion.io/drain";
/// Annotation that releases the finalizer at once, without draining (recorded with an Event).
pub const SKIP_DRAIN_ANNOTATION: &str = "sandbox.iterion.io/skip-drain";
/// Most read-back paths one run may declare (also enforced by the CRD schema).
pub(crate) const MAX_READBACK_PATHS: usize = 16;
/// Largest `spec.ttlSecondsAfterFinished` (one year; also enforced by the CRD schema): beyond it a
/// run is meant to stay, which is what leaving the field unset says.
pub(crate) const MAX_TTL_SECONDS_AFTER_FINISHED: i64 = 31_536_000;

/// A sandboxed workload whose declared read-back paths are drained into object storage at teardown.
#[derive(CustomResource, KubeSchema, Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "sandbox.iterion.io",
    version = "v1alpha1",
    kind = "SandboxRun",
    plural = "sandboxruns",
    singular = "sandboxrun",
    shortname = "sbr",
    category = "sandbox",
    namespaced,
    status = "SandboxRunStatus",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Drained","type":"string","jsonPath":".status.conditions[?(@.type==\"Drained\")].status"}"#,
    printcolumn = r#"{"name":"Pod","type":"string","jsonPath":".status.podName"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Attempt","type":"integer","priority":1,"description":"The attempt the run is at (spec.retryPolicy; absent: its first)","jsonPath":".status.attempt"}"#,
    printcolumn = r#"{"name":"Queued","type":"string","priority":1,"description":"Kueue's reason while the run waits in its queue, Admitted once admitted (docs/user-guide.md \"Queueing with Kueue\")","jsonPath":".status.conditions[?(@.type==\"Queued\")].reason"}"#,
    printcolumn = r#"{"name":"Exit","type":"integer","priority":1,"description":"Exit code of the workload container","jsonPath":".status.exitCode"}"#,
    printcolumn = r#"{"name":"Duration","type":"string","priority":1,"description":"How long the run took, set when it ends","jsonPath":".status.duration"}"#,
    printcolumn = r#"{"name":"Message","type":"string","priority":1,"description":"Summary of the current phase","jsonPath":".status.message"}"#,
    printcolumn = r#"{"name":"Template","type":"string","priority":1,"description":"The template the run is made from (its kind is the TemplateKind column)","jsonPath":".spec.templateRef.name"}"#,
    printcolumn = r#"{"name":"TemplateKind","type":"string","priority":1,"description":"The kind of the template the run is made from: SandboxRunTemplate (the run's namespace) or ClusterSandboxRunTemplate","jsonPath":".spec.templateRef.kind"}"#,
    doc = "A SandboxRun runs one sandboxed workload in a pod and, at teardown (the workload exited, spec.stop, the deadline, or deletion), drains the container paths declared in spec.readBack into object storage, so the files the run was told to leave behind outlive its pod. status says how the workload ended and where each path was stored; a failed drain is a Warning Event and a Failed path, never an empty set."
)]
#[serde(rename_all = "camelCase")]
pub struct SandboxRunSpec {
    /// Container image of the workload. Required; pin it by digest (`repo@sha256:...`) for
    /// reproducible runs. Resolvability can be checked without pulling (`doctor --check-images`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub image: Option<String>,

    /// Entrypoint of the workload. Without a command the workload idles and the run is a long-lived
    /// sandbox driven by `kubectl exec` until `stop` is set, its deadline passes or it is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub command: Option<Vec<String>>,

    /// Arguments to the command (or to the image's entrypoint).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub args: Option<Vec<String>>,

    /// Working directory of the workload container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096))]
    pub working_dir: Option<String>,

    /// Environment of the workload: name/value pairs, or a value taken from a Secret or ConfigMap
    /// key of the run's namespace (`valueFrom.secretKeyRef` / `valueFrom.configMapKeyRef`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    pub env: Vec<EnvVar>,

    /// Numeric user the workload runs as: `"uid"` or `"uid:gid"`, uid not 0. The pod enforces
    /// runAsNonRoot; the image's USER is not introspected, hence a number is required here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]{1,10}(:[0-9]{1,10})?$"))]
    pub user: Option<String>,

    /// Compute resources of the workload container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,

    /// Wall-clock limit of the run in seconds. Enforced by the operator (it starts teardown and
    /// drains), deliberately NOT copied onto the pod: the kubelet would kill the holder too and the
    /// read-back paths would go undrained.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub active_deadline_seconds: Option<i64>,

    /// Host state sharing. Only `none` can be served on a pod; `auto` exists so that admission can
    /// refuse it with a remediation hint (ADR-006). The controller never acts on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_state: Option<HostState>,

    /// Local image build settings. Never served on a cluster: present only so admission can refuse
    /// it with a hint to reference a pre-built image instead (ADR-006).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "free_form_object")]
    pub build: Option<serde_json::Value>,

    /// Volumes mounted into the workload.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub mounts: Vec<Mount>,

    /// Egress policy of the workload, validated by admission.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkPolicy>,

    /// Declared read-back paths: container paths whose content must survive the run (ADR-143 §1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_back: Option<ReadBack>,

    /// Set to true to tear a run down: drain every read-back path, then release the pod.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stop: bool,

    /// Set to true to hold the run without a pod (docs/user-guide.md "Suspend"): before its pod
    /// exists none is created; on a running run the pod is stopped with its files drained (an
    /// attempt that does not count), and clearing it starts the next attempt. The deadline starts
    /// again when the run resumes, as a Job's does.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub suspend: bool,

    /// A checkpoint request (docs/user-guide.md "Checkpoints"): set it to a new value (any token,
    /// e.g. a counter or a time) and the running sandbox's read-back paths are drained now,
    /// without stopping it, into a generation of their own (`status.checkpoints`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub checkpoint: Option<String>,

    /// What a new attempt's read-back paths start with (docs/user-guide.md "Pause, resume and
    /// fork"): `restore: Latest` restores them, before the workload starts, from the run's newest
    /// saved generation (the previous attempt's drain). With `suspend` this is pause and resume.
    /// The run's own, like `suspend`: a template cannot lock it and it may change at any time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<Workspace>,

    /// Retries (docs/user-guide.md "Retries"): a failed attempt's pod is drained into that
    /// attempt's own files and a new pod is created after a backoff, as the rules on the
    /// workload's exit code and the pod's conditions say. Without it a run has one attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_policy: Option<RetryPolicy>,

    /// Names of Secrets (type dockerconfigjson) used to pull the image; also used by the
    /// no-pull resolvability check.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub image_pull_secrets: Vec<String>,

    /// Node selector passed through to the pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,

    /// Tolerations passed through to the pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerations: Option<Vec<Toleration>>,

    /// Priority class passed through to the pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,

    /// RuntimeClass of the pod, e.g. `gvisor` or `kata`: the isolation a sandbox is for. The
    /// RuntimeClass must exist; its handler runs both the workload and the holder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub runtime_class_name: Option<String>,

    /// ServiceAccount the pod runs as. Unset: the namespace's `default`, with no API token
    /// mounted. Set: that account, with its token mounted (the workload is meant to use it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub service_account_name: Option<String>,

    /// Labels added to the pod (e.g. for NetworkPolicies or cost allocation). Keys under
    /// `sandbox.iterion.io/` and the operator's own `app.kubernetes.io/name` and
    /// `app.kubernetes.io/managed-by` are reserved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_labels: Option<BTreeMap<String, String>>,

    /// Annotations added to the pod (e.g. for a service mesh or a node-level agent). Keys under
    /// `sandbox.iterion.io/` are reserved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_annotations: Option<BTreeMap<String, String>>,

    /// Affinity passed through to the pod (node affinity, pod (anti-)affinity).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,

    /// Seconds after the run finished (condition Complete or Failed True, its drain settled) at
    /// which the operator deletes it, as on batch/v1 Jobs. Deletion goes through the finalizer;
    /// stored files follow `readBack.retention`. Unset: the run stays until deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0 && self <= 31536000").message("ttlSecondsAfterFinished must be between 0 and 31536000 (one year): give the seconds to keep a finished run, e.g. 3600, or leave it unset to keep the run until it is deleted"))]
    pub ttl_seconds_after_finished: Option<i64>,

    /// The template the run is made from: a SandboxRunTemplate of the run's namespace, or with
    /// `kind: ClusterSandboxRunTemplate` a cluster-scoped one. The template's spec is the run's,
    /// and the run may set only the fields the template's `openFields` leave open, and its own
    /// `stop`, `suspend` and `checkpoint`. Admission judges the merged spec; the operator
    /// resolves the template once, before the pod exists, and records what it used in
    /// `status.template`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_ref: Option<TemplateRef>,
}

/// What a run's new attempts start their read-back paths with (`spec.workspace`).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Workspace {
    /// `Never` (the default): each attempt starts with empty read-back paths. `Latest`: each
    /// attempt after the first starts with them restored from the run's newest saved generation.
    #[serde(default)]
    pub restore: WorkspaceRestore,
    /// Fork (docs/user-guide.md "Pause, resume and fork"): the run's first attempt starts with its
    /// read-back paths restored from another run's saved files, in the same namespace and store.
    /// The author must hold `get` on that run. Fixed at creation; a template cannot set it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<WorkspaceFrom>,
}

/// The run whose saved files a fork starts with (`spec.workspace.from`).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceFrom {
    /// The SandboxRun, in this run's namespace.
    #[schemars(length(min = 1, max = 253))]
    pub run: String,
    /// Its attempt whose drained files are restored. Unset: its newest ended attempt whose
    /// workload ran, as the operator reads the run when it restores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub attempt: Option<u32>,
    /// Its checkpoint (`status.checkpoints[].index`, docs/user-guide.md "Checkpoints") whose
    /// files are restored instead: one it records with every path saved. At most one of
    /// `attempt` and `checkpoint`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub checkpoint: Option<u32>,
}

/// Which saved generation a new attempt's read-back paths are restored from.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum WorkspaceRestore {
    /// Nothing: the paths start empty.
    #[default]
    Never,
    /// The run's newest saved generation: the drain of its latest attempt whose workload ran.
    Latest,
}

/// What one attempt's read-back paths were restored from (`status.restores[]`).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RestoreStatus {
    /// The attempt whose paths were restored.
    pub attempt: u32,
    /// The attempt whose drained files they were restored from.
    pub from_attempt: u32,
    /// A fork's source run (`spec.workspace.from.run`); absent: the run's own files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_run: Option<String>,
    /// The uid of the source run as it was read once, when it was first restored from: every
    /// later restore from it requires this uid (a run re-created under its name is never read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_uid: Option<String>,
    /// A fork's source checkpoint (`spec.workspace.from.checkpoint`) whose files were restored;
    /// absent: an attempt's drained files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_checkpoint: Option<u32>,
    /// Restored: every file is in place and the workload was started; Failed: the workload was
    /// never started (`message` says why).
    pub outcome: RestoreOutcome,
    /// Files restored.
    #[serde(default)]
    #[schemars(extend("format" = "int64"))]
    pub files: u64,
    /// Bytes of file content restored.
    #[serde(default)]
    #[schemars(extend("format" = "int64"))]
    pub bytes: u64,
    /// Whether the workload's start was handed to the pod (after a restore) or its refusal
    /// (after a failed one).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub delivered: bool,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// How an attempt's restore ended.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum RestoreOutcome {
    /// Every file of the generation is in place, verified against its manifest.
    #[default]
    Restored,
    /// The restore failed: the workload was never started.
    Failed,
}

/// A reference to the template a run is made from (docs/contract.md "Templates").
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TemplateRef {
    /// The template's kind: `SandboxRunTemplate` (the default: in the run's namespace) or
    /// `ClusterSandboxRunTemplate` (cluster-scoped, the platform's for every namespace).
    #[serde(default)]
    pub kind: TemplateKind,
    /// Name of the template.
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    )]
    pub name: String,
}

impl TemplateRef {
    /// A reference to the SandboxRunTemplate `name` of the run's namespace.
    pub fn namespaced(name: impl Into<String>) -> TemplateRef {
        TemplateRef {
            kind: TemplateKind::SandboxRunTemplate,
            name: name.into(),
        }
    }

    /// A reference to the ClusterSandboxRunTemplate `name`.
    pub fn cluster(name: impl Into<String>) -> TemplateRef {
        TemplateRef {
            kind: TemplateKind::ClusterSandboxRunTemplate,
            name: name.into(),
        }
    }

    /// The template as messages name it: `SandboxRunTemplate ci`, `ClusterSandboxRunTemplate ci`.
    pub(crate) fn label(&self) -> String {
        format!("{} {}", self.kind.as_str(), self.name)
    }

    /// The template with its namespace, for a run of `namespace`: `SandboxRunTemplate team/ci`,
    /// `ClusterSandboxRunTemplate ci` (cluster-scoped: no namespace).
    pub(crate) fn describe(&self, namespace: &str) -> String {
        match self.kind {
            TemplateKind::SandboxRunTemplate => {
                format!("SandboxRunTemplate {namespace}/{}", self.name)
            }
            TemplateKind::ClusterSandboxRunTemplate => self.label(),
        }
    }
}

/// The kind of a template (`spec.templateRef.kind`); any other is refused by the CRD's schema.
#[derive(
    Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, JsonSchema,
)]
pub enum TemplateKind {
    /// A `SandboxRunTemplate` of the run's namespace.
    #[default]
    SandboxRunTemplate,
    /// A cluster-scoped `ClusterSandboxRunTemplate`.
    ClusterSandboxRunTemplate,
}

impl TemplateKind {
    /// The kind's name.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            TemplateKind::SandboxRunTemplate => "SandboxRunTemplate",
            TemplateKind::ClusterSandboxRunTemplate => "ClusterSandboxRunTemplate",
        }
    }

    /// The kind's resource (plural), as RBAC names it.
    pub(crate) fn resource(self) -> &'static str {
        match self {
            TemplateKind::SandboxRunTemplate => "sandboxruntemplates",
            TemplateKind::ClusterSandboxRunTemplate => "clustersandboxruntemplates",
        }
    }

    /// Whether templates of this kind live in a namespace (the run's).
    pub(crate) fn namespaced(self) -> bool {
        self == TemplateKind::SandboxRunTemplate
    }
}

/// A run spec a platform team locks: runs that name it (`spec.templateRef`) get its spec and may
/// set only the fields it leaves open (docs/contract.md "Templates").
#[derive(CustomResource, KubeSchema, Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "sandbox.iterion.io",
    version = "v1alpha1",
    kind = "SandboxRunTemplate",
    plural = "sandboxruntemplates",
    singular = "sandboxruntemplate",
    shortname = "sbrt",
    category = "sandbox",
    namespaced,
    printcolumn = r#"{"name":"Image","type":"string","jsonPath":".spec.template.image"}"#,
    printcolumn = r#"{"name":"Open","type":"string","description":"The fields a run may set","jsonPath":".spec.openFields"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    doc = "A SandboxRunTemplate holds a SandboxRun spec that a platform team locks. A SandboxRun that names it in spec.templateRef (same namespace) is made from spec.template and may set only the fields spec.openFields lists, and its own spec.stop, spec.suspend and spec.checkpoint; admission refuses any other field it sets, naming it, and judges the merged spec by every rule. The operator resolves the template once, before the run's pod exists, and records the generation it used in the run's status.template: editing or deleting the template never changes a run whose pod exists."
)]
#[serde(rename_all = "camelCase")]
pub struct SandboxRunTemplateSpec {
    /// The run spec every run made from this template gets: the fields of a SandboxRun's spec,
    /// without `templateRef` (templates do not nest) and without `stop` (the run's own).
    #[x_kube(validation = Rule::new("!has(self.templateRef) && (!has(self.stop) || !self.stop)").message("a template's spec may set neither templateRef (templates do not nest) nor stop (the run's own)"))]
    pub template: SandboxRunSpec,
    /// The top-level spec fields a run may set, e.g. `[command, args, env]`. An open field the
    /// run sets replaces the template's value, except `env`: the run's variables are added to the
    /// template's, and a variable the template sets stays locked. Every other field is locked,
    /// but `stop`, `suspend` and `checkpoint`, always the run's own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub open_fields: Vec<OpenField>,
}

/// A run spec a platform team locks for every namespace: the spec of a SandboxRunTemplate; a
/// run names it with `spec.templateRef.kind: ClusterSandboxRunTemplate` (docs/contract.md
/// "Templates").
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "sandbox.iterion.io",
    version = "v1alpha1",
    kind = "ClusterSandboxRunTemplate",
    plural = "clustersandboxruntemplates",
    singular = "clustersandboxruntemplate",
    shortname = "csbrt",
    category = "sandbox",
    printcolumn = r#"{"name":"Image","type":"string","jsonPath":".spec.template.image"}"#,
    printcolumn = r#"{"name":"Open","type":"string","description":"The fields a run may set","jsonPath":".spec.openFields"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    doc = "A ClusterSandboxRunTemplate holds a SandboxRun spec that a platform team locks for every namespace: the cluster-scoped twin of a SandboxRunTemplate, with the same spec. A SandboxRun of any namespace names it in spec.templateRef with kind: ClusterSandboxRunTemplate, and its author needs get on it (a ClusterRole bound with a ClusterRoleBinding). The run is made from spec.template and may set only the fields spec.openFields lists, and its own spec.stop, spec.suspend and spec.checkpoint; admission refuses any other field it sets, naming it, and judges the merged spec by every rule. The operator resolves the template once, before the run's pod exists, and records its kind, name and generation in the run's status.template: editing or deleting the template never changes a run whose pod exists."
)]
#[serde(transparent)]
pub struct ClusterSandboxRunTemplateSpec(pub SandboxRunTemplateSpec);

/// A top-level SandboxRun spec field a template may leave open to its runs.
#[derive(
    Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub enum OpenField {
    /// `image`.
    Image,
    /// `command`.
    Command,
    /// `args`.
    Args,
    /// `workingDir`.
    WorkingDir,
    /// `env` (added to the template's variables).
    Env,
    /// `user`.
    User,
    /// `resources`.
    Resources,
    /// `activeDeadlineSeconds`.
    ActiveDeadlineSeconds,
    /// `mounts`.
    Mounts,
    /// `network`.
    Network,
    /// `readBack`.
    ReadBack,
    /// `imagePullSecrets`.
    ImagePullSecrets,
    /// `nodeSelector`.
    NodeSelector,
    /// `tolerations`.
    Tolerations,
    /// `priorityClassName`.
    PriorityClassName,
    /// `runtimeClassName`.
    RuntimeClassName,
    /// `serviceAccountName`.
    ServiceAccountName,
    /// `podLabels`.
    PodLabels,
    /// `podAnnotations`.
    PodAnnotations,
    /// `affinity`.
    Affinity,
    /// `ttlSecondsAfterFinished`.
    TtlSecondsAfterFinished,
    /// `retryPolicy`.
    RetryPolicy,
}

/// The template a run was made from, as the operator resolved it before creating the run's pod:
/// the run keeps this spec for its whole life, whatever happens to the template since.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AppliedTemplate {
    /// The template's kind (absent in records written before cluster templates: a
    /// SandboxRunTemplate).
    #[serde(default)]
    pub kind: TemplateKind,
    /// The template's name.
    pub name: String,
    /// The template's `metadata.generation` when it was resolved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// The template's spec as resolved (its `template` and `openFields`; kept as written, its
    /// schema is the SandboxRunTemplate CRD's).
    #[schemars(schema_with = "free_form_object")]
    pub spec: SandboxRunTemplateSpec,
}

fn free_form_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "nullable": true,
        "x-kubernetes-preserve-unknown-fields": true
    })
}

/// One environment variable of the workload: a `value`, or a `valueFrom` reference.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EnvVar {
    /// Variable name.
    #[schemars(length(min = 1, max = 256))]
    pub name: String,
    /// Variable value (empty when valueFrom is set).
    #[serde(default)]
    pub value: String,
    /// Where the value comes from instead: exactly one of secretKeyRef and configMapKeyRef.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_from: Option<EnvVarSource>,
}

/// The source of an environment variable's value: a key of a Secret or of a ConfigMap in the
/// run's namespace (the only sources a run may use: no fieldRef or resourceFieldRef).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EnvVarSource {
    /// A key of a Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_key_ref: Option<SecretKeySelector>,
    /// A key of a ConfigMap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_key_ref: Option<ConfigMapKeySelector>,
}

/// Host state sharing mode.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum HostState {
    /// No host state is shared (the only mode a pod can serve).
    None,
    /// Share host state when available: refused by admission on a cluster.
    Auto,
}

/// A volume mounted into the workload container.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    /// Volume name (a DNS label; unique within the run).
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// Kind of volume.
    #[serde(rename = "type")]
    pub kind: MountType,
    /// What backs the volume: the ConfigMap, Secret or PersistentVolumeClaim name. Required for
    /// those types; unused for emptyDir.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Absolute, normalized container path the volume is mounted at (no `..`, `.`, `//` or
    /// trailing `/`; the CRD's pattern, as for read-back paths).
    #[schemars(
        length(min = 2, max = 4096),
        regex(pattern = r"^(/([^/\x00.][^/\x00]*|\.[^/\x00.][^/\x00]*|\.\.[^/\x00]+))+$")
    )]
    pub target: String,
    /// Mount read-only.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only: bool,
}

/// Kinds of volume a mount can name.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum MountType {
    /// A scratch directory for the life of the pod.
    EmptyDir,
    /// A ConfigMap's keys as files.
    ConfigMap,
    /// A Secret's keys as files.
    Secret,
    /// A PersistentVolumeClaim.
    PersistentVolumeClaim,
    /// A host directory: refused by admission (a pod has no host filesystem to offer).
    Bind,
}

/// Egress policy: how host rules are matched.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkPolicy {
    /// `allowlist` (deny unless a rule allows), `denylist` (allow unless a rule denies) or `open`.
    pub mode: NetworkMode,
    /// Host rules, last match wins: a literal host, `*.example.com` (one label), `**.example.com`
    /// (one or more labels), `**` (any host), an IPv4/IPv6 literal or CIDR; `!` before a pattern
    /// negates it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 512))]
    pub rules: Vec<String>,
}

/// Egress modes.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum NetworkMode {
    /// Deny unless a rule allows.
    Allowlist,
    /// Allow unless a rule denies.
    Denylist,
    /// No egress filtering.
    Open,
}

/// Declared read-back paths and how they are drained.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReadBack {
    /// Container paths whose content is drained at teardown. Each is served by an emptyDir the
    /// operator owns, mounted at that path.
    #[schemars(length(max = 16))]
    #[x_kube(validation = Rule::new("self.all(p, self.exists_one(q, q.path == p.path))").message("readBack paths must be unique"))]
    pub paths: Vec<ReadBackPath>,
    /// Compression of the stored archives.
    #[serde(default)]
    pub compression: Compression,
    /// How long teardown may spend draining (e.g. `5m`, `90s`) before the failure is recorded and
    /// the finalizer released. Default: the operator's `--drain-timeout`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"))]
    pub drain_timeout: Option<String>,
    /// What deleting the run does to its stored archives and manifests: `Retain` keeps them,
    /// `Delete` removes them (after the drain settled) before the finalizer is released.
    /// Default: the operator's `--default-retention` (itself `Retain` unless set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<Retention>,
    /// The store ConfigMap, in the run's namespace, whose store the drain uses (its `url`,
    /// `options` and the Secret its `secretName` names). Default: the namespace's
    /// `sandboxrun-store` ConfigMap when it has one, else the operator's store. Honoured only
    /// where the platform turned tenant stores on (`--tenant-store-endpoints`); the author must
    /// be able to read the ConfigMap and its Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    )]
    pub store_ref: Option<String>,
}

/// What deleting the run does to its stored archives and manifests: `Retain` keeps them,
/// `Delete` removes them from the store (after the drain settled) before the finalizer is
/// released. Default: the operator's `--default-retention` (itself `Retain` unless set).
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum Retention {
    /// Keep the archives and manifests in the store.
    #[default]
    Retain,
    /// Delete the run's archives and manifests from the store when the run is deleted.
    Delete,
}

impl std::str::FromStr for Retention {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "Retain" | "retain" => Ok(Retention::Retain),
            "Delete" | "delete" => Ok(Retention::Delete),
            other => Err(format!("retention {other:?} is neither Retain nor Delete")),
        }
    }
}

/// One declared read-back path.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReadBackPath {
    /// Absolute, normalized container path (no `..`, `.`, `//` or trailing `/`): the CRD's
    /// pattern refuses what the pod builder refuses (docs/contract.md "The operator never builds
    /// a pod its own rules refuse"), so `kubectl apply` does with no webhook.
    #[schemars(
        length(min = 2, max = 1024),
        regex(pattern = r"^(/([^/\x00.][^/\x00]*|\.[^/\x00.][^/\x00]*|\.\.[^/\x00]+))+$")
    )]
    pub path: String,
    /// Cap of the drained content of this path (e.g. `512Mi`). Metered by the drain on the
    /// operator side, never on the pod (ADR-143: a kubelet sizeLimit evicts the whole run).
    /// Default: the operator's default cap; never above the operator maximum.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_limit: Option<Quantity>,
    /// A failed drain of a required path fails the run.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub required: bool,
}

/// Compression of stored archives.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Compression {
    /// Plain tar.
    #[default]
    None,
    /// gzip (`.tar.gz`).
    Gzip,
    /// zstd (`.tar.zst`).
    Zstd,
}

impl Compression {
    /// The name as the spec writes it (`none`, `gzip`, `zstd`): also the `compression` label of
    /// the drained-bytes metric, so renaming a variant cannot silently change it.
    pub fn as_str(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Gzip => "gzip",
            Compression::Zstd => "zstd",
        }
    }

    /// File extension of an archive with this compression.
    pub fn extension(self) -> &'static str {
        match self {
            Compression::None => "tar",
            Compression::Gzip => "tar.gz",
            Compression::Zstd => "tar.zst",
        }
    }
}

/// Largest `spec.retryPolicy.limit`.
pub const MAX_RETRY_LIMIT: u32 = 100;
/// Largest `spec.retryPolicy.backoff.capSeconds` (and `baseSeconds`).
pub const MAX_RETRY_BACKOFF_SECONDS: u32 = 86_400;
/// Most `spec.retryPolicy.rules`, and most values in one rule.
pub const MAX_RETRY_RULES: usize = 16;
/// Most exit codes one rule lists.
pub const MAX_RETRY_RULE_VALUES: usize = 255;

/// `spec.retryPolicy`, shaped after a Job's `backoffLimit` + `podFailurePolicy` and Argo's
/// `retryStrategy`.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RetryPolicy {
    /// Failed attempts retried at most this many times (the run has at most `limit + 1` counted
    /// attempts; attempts ended by a disruption or an `Ignore` rule are not counted).
    #[schemars(range(max = 100))]
    pub limit: u32,
    /// The wait before the next attempt: `baseSeconds × factor^(n−1)`, at most `capSeconds`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<RetryBackoff>,
    /// Rules on how an attempt ended, first match wins. An attempt whose workload failed and that
    /// no rule matches is retried (counted); a disruption (the pod evicted, preempted or deleted
    /// by someone else: `DisruptionTarget`) is retried without counting unless a rule says
    /// otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub rules: Vec<RetryRule>,
}

/// The wait between attempts.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RetryBackoff {
    /// The first wait, in seconds (default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 86400))]
    pub base_seconds: Option<u32>,
    /// Each next wait is the last one times this (default 2, at least 1, at most 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10))]
    pub factor: Option<u32>,
    /// The longest wait, in seconds (default 300).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 86400))]
    pub cap_seconds: Option<u32>,
}

/// One rule of `spec.retryPolicy.rules`: what an attempt that ended this way means.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RetryRule {
    /// `Retry` (counted against the limit), `Ignore` (retried without counting) or `FailRun`
    /// (the run fails now).
    pub action: RetryAction,
    /// Matches the workload container's exit code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_exit_codes: Option<ExitCodeRule>,
    /// Matches when the pod has one of these conditions set True (e.g. `DisruptionTarget`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub on_pod_conditions: Vec<PodConditionRule>,
}

/// What a rule does.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum RetryAction {
    /// Retry, counted against the limit.
    Retry,
    /// Retry without counting against the limit.
    Ignore,
    /// Fail the run now.
    FailRun,
}

/// Exit codes a rule matches.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExitCodeRule {
    /// `In` (the code is one of `values`) or `NotIn`.
    pub operator: ExitCodeOperator,
    /// Exit codes, 0..=255.
    #[schemars(length(min = 1, max = 255))]
    pub values: Vec<i32>,
}

/// How `values` are matched.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ExitCodeOperator {
    /// The exit code is one of the values.
    In,
    /// The exit code is none of the values.
    NotIn,
}

/// A pod condition a rule matches.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct PodConditionRule {
    /// The condition's type, e.g. `DisruptionTarget`.
    #[serde(rename = "type")]
    pub type_: String,
}

/// Most checkpoints a run may have unless the operator says otherwise (`run --max-checkpoints`).
pub const DEFAULT_MAX_CHECKPOINTS: u32 = 16;
/// The highest `run --max-checkpoints` the operator accepts: every stored checkpoint keeps an
/// entry in the run's status, which must stay far below etcd's object limit (docs/contract.md
/// "A run's object stays bounded").
pub const MAX_CHECKPOINTS_LIMIT: u32 = 64;
/// Refused checkpoints kept in `status.checkpoints` (the latest ones; every refusal is counted in
/// `status.checkpointsRefused`): a run patched with new tokens for ever keeps a bounded status
/// (docs/contract.md "A run's object stays bounded").
pub const REFUSED_CHECKPOINTS_KEPT: usize = 4;

/// One checkpoint of a running sandbox (`status.checkpoints[]`).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointStatus {
    /// Its number, from 1 (`files ls/get --checkpoint N`).
    pub index: u32,
    /// The `spec.checkpoint` token it answered.
    pub token: String,
    /// The attempt the run was at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    /// When it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<Time>,
    /// Why it holds no files, when it was refused (the run's checkpoint limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Each read-back path's drain into this checkpoint's own files.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub read_back: Vec<ReadBackStatus>,
}

impl CheckpointStatus {
    /// Whether it was refused (past `--max-checkpoints`): it says why and holds no files.
    pub fn is_refused(&self) -> bool {
        self.message.is_some() && self.read_back.is_empty()
    }
}

/// One ended attempt of a run with a retry policy (`status.attempts[]`).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AttemptStatus {
    /// The attempt's number, from 1.
    pub index: u32,
    /// Its pod.
    pub pod_name: String,
    /// The workload's exit code, when it exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Why it ended (`WorkloadFailed`, `Disrupted`, …) and what the policy made of it.
    pub reason: String,
    /// In words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Whether it counts against `retryPolicy.limit`.
    pub counted: bool,
    /// When its pod started running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When it ended (its teardown recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_time: Option<Time>,
    /// Each read-back path's drain, into this attempt's own files.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub read_back: Vec<ReadBackStatus>,
}

/// Observed state of a SandboxRun.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxRunStatus {
    /// Lifecycle phase: Pending → Running → Draining → Succeeded | Failed | Stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Name of the run's pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_name: Option<String>,
    /// When the pod started running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When the run reached a final phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    /// How long the run took, from startTime (else its creation, when the pod never started) to
    /// completionTime, e.g. `1h2m3s`. Set when the run reaches a final phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<String>,
    /// Exit code of the workload container (batch runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Human-readable summary of the current phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// How the workload container terminated, copied from the pod before teardown deletes it, so
    /// the evidence outlives the pod. Absent while it runs and when it never terminated (a
    /// long-lived sandbox stopped, a run whose pod was lost).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload: Option<WorkloadTermination>,
    /// Standard conditions: Ready, WorkloadFinished, Drained, and at the end exactly one of Complete
    /// (a successful end) or Failed (a failed end, its reason says why).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// One entry per declared read-back path, filled by the drain.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub read_back: Vec<ReadBackStatus>,
    /// The template the run is made from (`spec.templateRef`), as resolved before its pod was
    /// created: its name, generation and spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<AppliedTemplate>,
    /// The attempts that ended before the current one (runs with `spec.retryPolicy`): each with
    /// its exit code, why, and its own read-back drains. The current attempt is
    /// `attempts.len() + 1`; `readBack` describes it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attempts: Vec<AttemptStatus>,
    /// The attempt the run is at, from 1 (set once a retry made a second one: absent means the
    /// first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    /// The checkpoints taken while the run ran (`spec.checkpoint`), oldest first: at most the
    /// operator's `--max-checkpoints` that hold files, and the latest refused ones (at most 4).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub checkpoints: Vec<CheckpointStatus>,
    /// How many checkpoints were refused in all (past `--max-checkpoints`), including those no
    /// longer listed in `checkpoints`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoints_refused: Option<u32>,
    /// The Kueue LocalQueue the run was queued in (`kueue.x-k8s.io/queue-name`), recorded before
    /// its Workload is made: from then on this, not the live label, says the run waits for Kueue
    /// (docs/contract.md "Quota cannot be edited away").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// When the next attempt's pod is created (set while a retry waits out its backoff).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_attempt_time: Option<Time>,
    /// How the run's first pod was had: taken warm from a SandboxRunPool, or made cold and why
    /// (docs/user-guide.md "Sandboxes for agents: warm pools"). Absent: a run not made from a
    /// pooled template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm_start: Option<WarmStart>,
    /// What each attempt's read-back paths were restored from (`spec.workspace.restore`),
    /// oldest first (docs/user-guide.md "Pause, resume and fork").
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub restores: Vec<RestoreStatus>,
}

/// How a run made from a pooled template got its first pod.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WarmStart {
    /// The pool it was served from, or asked.
    pub pool: String,
    /// The pool's pod the run took (its pod for the attempt [`WarmStart::attempt`]); absent: a
    /// cold start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// Why it started cold (no ready pod, a field that changes the pod, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cold_reason: Option<String>,
    /// The attempt this start is of (`spec.retryPolicy`: each attempt asks the pool again;
    /// absent: the first). Earlier attempts' pods are in `status.attempts[]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
}

impl WarmStart {
    /// The attempt this start is of (absent: the first).
    pub fn attempt(&self) -> u32 {
        self.attempt.unwrap_or(1)
    }
}

/// Pods made ready ahead of demand from a template: a run made from that template (setting only
/// what the launcher delivers) takes one instead of waiting for a new pod (docs/user-guide.md
/// "Sandboxes for agents: warm pools").
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "sandbox.iterion.io",
    version = "v1alpha1",
    kind = "SandboxRunPool",
    plural = "sandboxrunpools",
    singular = "sandboxrunpool",
    shortname = "sbrp",
    category = "sandbox",
    namespaced,
    status = "SandboxRunPoolStatus",
    scale = r#"{"specReplicasPath":".spec.replicas","statusReplicasPath":".status.replicas","labelSelectorPath":".status.selector"}"#,
    printcolumn = r#"{"name":"Template","type":"string","jsonPath":".spec.templateRef.name"}"#,
    printcolumn = r#"{"name":"Desired","type":"integer","jsonPath":".spec.replicas"}"#,
    printcolumn = r#"{"name":"Ready","type":"integer","jsonPath":".status.readyReplicas"}"#,
    printcolumn = r#"{"name":"Up-to-date","type":"integer","description":"Unclaimed pods of the template's current version (status.updatedReplicas): a rollout is done when it equals Desired and Ready does too","jsonPath":".status.updatedReplicas"}"#,
    printcolumn = r#"{"name":"Pending","type":"integer","jsonPath":".status.pendingReplicas"}"#,
    printcolumn = r#"{"name":"Claimed","type":"integer","jsonPath":".status.claimed"}"#,
    printcolumn = r#"{"name":"Misses","type":"integer","jsonPath":".status.misses"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    doc = "A SandboxRunPool keeps spec.replicas pods made ready ahead of demand from a template (a SandboxRunTemplate of its namespace or a ClusterSandboxRunTemplate): image pulled, holder running, the workload container started and parked in the operator's launcher. A SandboxRun made from that template that sets only command, args, env values, stop or activeDeadlineSeconds takes a ready pod: the pod becomes the run's, the launcher starts the run's command with its env, and the pool makes a new one. A pool pod serves one run. With no ready pod the run starts cold and says so in status.warmStart."
)]
#[serde(rename_all = "camelCase")]
pub struct SandboxRunPoolSpec {
    /// The template the pool's pods are made from.
    pub template_ref: TemplateRef,
    /// How many unclaimed pods to keep (the scale subresource: HPA, KEDA, `kubectl scale`).
    #[schemars(range(min = 0, max = 1000))]
    pub replicas: i32,
}

/// Observed state of a SandboxRunPool.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxRunPoolStatus {
    /// The pool's unclaimed pods, of any template version, not being deleted (the scale
    /// subresource's current replicas): during a rollout the outdated ones are counted until
    /// their deletion is seen.
    #[serde(default)]
    pub replicas: i32,
    /// Of those, the pods of the template's current version (ready or not): a rollout is done
    /// when `updatedReplicas`, `readyReplicas` and `replicas` equal `spec.replicas`, with
    /// `observedGeneration` the pool's generation and `templateGeneration` the template's.
    #[serde(default)]
    pub updated_replicas: i32,
    /// Unclaimed pods of the current version ready to be claimed.
    #[serde(default)]
    pub ready_replicas: i32,
    /// Unclaimed pods of the current version not ready yet.
    #[serde(default)]
    pub pending_replicas: i32,
    /// The pool's pods that runs have claimed and that still exist.
    #[serde(default)]
    pub claimed: i32,
    /// The label selector of the pool's unclaimed pods (the scale subresource's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// The hash of the template version the pool's pods are made from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_hash: Option<String>,
    /// The `metadata.generation` of the template the status describes: after an edit of the
    /// template, the status speaks of its new version once this equals the template's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_generation: Option<i64>,
    /// Why the pool makes no pods, when it makes none (its template is missing or cannot be
    /// pooled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The generation the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Runs made from the pool's template that started cold (no ready pod, a field that changes
    /// the pod, …): each such run's `status.warmStart.coldReason` says why. Counted by the claims,
    /// never written by the pool's own status updates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub misses: Option<i64>,
}

/// How the workload container terminated: the kubelet's terminated state of the container
/// (`ContainerStateTerminated`), kept in the run's status once the pod is gone.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadTermination {
    /// Exit code of the container's process.
    pub exit_code: i32,
    /// Signal that ended the process, when the runtime reports one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// The kubelet's one-word reason, e.g. `Completed`, `Error`, `OOMKilled`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The workload's termination message (`/dev/termination-log`) or, when it wrote none and
    /// failed, the last lines of its log (terminationMessagePolicy FallbackToLogsOnError). At most
    /// 4 KiB; a longer one is cut and ends in `…`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096))]
    pub message: Option<String>,
    /// When the container started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// When the container terminated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
}

/// Lifecycle phase of a run.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum Phase {
    /// Accepted; the pod is being created or scheduled.
    Pending,
    /// The pod runs.
    Running,
    /// Teardown: read-back paths are being drained.
    Draining,
    /// The workload exited 0 and every required path drained.
    Succeeded,
    /// The workload failed, or a required path could not be drained.
    Failed,
    /// Torn down by `stop`, the deadline or deletion.
    Stopped,
}

impl Phase {
    /// Every phase, in the order of a run's life.
    pub(crate) const ALL: [Phase; 6] = [
        Phase::Pending,
        Phase::Running,
        Phase::Draining,
        Phase::Succeeded,
        Phase::Failed,
        Phase::Stopped,
    ];

    /// The phase as `status.phase` spells it, and as the `phase` label of `sandboxrun_runs`
    /// (docs/operations.md "Metrics"). Written out, never the `Debug` text, so renaming a
    /// variant cannot rename a label.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Running => "Running",
            Phase::Draining => "Draining",
            Phase::Succeeded => "Succeeded",
            Phase::Failed => "Failed",
            Phase::Stopped => "Stopped",
        }
    }

    /// Whether the run is over.
    pub fn is_final(self) -> bool {
        matches!(self, Phase::Succeeded | Phase::Failed | Phase::Stopped)
    }
}

/// Outcome of draining one read-back path.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReadBackStatus {
    /// The declared container path.
    pub path: String,
    /// Drained | Empty | Capped | Failed (Pending before teardown).
    pub phase: ReadBackPhase,
    /// Bytes of member content stored.
    #[serde(default)]
    #[schemars(extend("format" = "int64"))]
    pub bytes: u64,
    /// Members stored (files, directories, links).
    #[serde(default)]
    #[schemars(extend("format" = "int64"))]
    pub members: u64,
    /// Members dropped because they would cross the cap.
    #[serde(default)]
    #[schemars(extend("format" = "int64"))]
    pub dropped_members: u64,
    /// Members rejected by the sanitizer (unsafe paths, links, devices…).
    #[serde(default)]
    #[schemars(extend("format" = "int64"))]
    pub rejected_members: u64,
    /// Stored files whose content changed while the packer read them: zero-padded or cut at
    /// their size when listed, listed in the manifest's `changed` (a Warning Event says so).
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(extend("format" = "int64"))]
    pub changed_members: u64,
    /// URL of the stored archive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object: Option<String>,
    /// URL of the manifest (the commit point: present means the archive is complete).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest: Option<String>,
    /// Drain attempts made.
    #[serde(default)]
    #[schemars(extend("format" = "int32"))]
    pub attempts: u32,
    /// What happened, in words (always set when Failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Outcome of a path's drain. A failure is never reported as an empty set (ADR-143 §4).
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ReadBackPhase {
    /// Not drained yet.
    #[default]
    Pending,
    /// Everything the workload wrote is stored.
    Drained,
    /// The drain succeeded and the workload wrote nothing.
    Empty,
    /// Stored, with members over the cap dropped and listed in the manifest.
    Capped,
    /// The drain failed; see message and the `sandbox_runfiles_drain_failed` Event.
    Failed,
}

impl ReadBackPhase {
    #[cfg(test)]
    /// Every phase of a path.
    pub(crate) const ALL: [ReadBackPhase; 5] = [
        ReadBackPhase::Pending,
        ReadBackPhase::Drained,
        ReadBackPhase::Empty,
        ReadBackPhase::Capped,
        ReadBackPhase::Failed,
    ];

    /// The phase as `status.readBack[].phase` spells it, in Event notes, and as the `phase` label
    /// of the drain metrics (docs/operations.md "Metrics"). Written out, never the `Debug` text.
    pub fn as_str(self) -> &'static str {
        match self {
            ReadBackPhase::Pending => "Pending",
            ReadBackPhase::Drained => "Drained",
            ReadBackPhase::Empty => "Empty",
            ReadBackPhase::Capped => "Capped",
            ReadBackPhase::Failed => "Failed",
        }
    }
}

impl SandboxRun {
    /// The `spec.checkpoint` token the run asks a checkpoint for (docs/user-guide.md
    /// "Checkpoints"): set, and not the token its last checkpoint answered.
    pub fn checkpoint_due(&self) -> Option<String> {
        let token = self.spec.checkpoint.as_deref()?;
        let last = self
            .status
            .as_ref()
            .and_then(|s| s.checkpoints.last())
            .map(|c| c.token.as_str());
        (last != Some(token)).then(|| token.to_string())
    }
}

impl SandboxRunSpec {
    /// The declared read-back paths, in declaration order.
    pub(crate) fn read_back_paths(&self) -> &[ReadBackPath] {
        self.read_back
            .as_ref()
            .map(|r| r.paths.as_slice())
            .unwrap_or(&[])
    }

    /// The store ConfigMap the run names (`readBack.storeRef`; docs/contract.md "A store per
    /// namespace").
    pub fn store_ref(&self) -> Option<&str> {
        self.read_back.as_ref().and_then(|r| r.store_ref.as_deref())
    }

    /// The compression of the run's stored archives (`readBack.compression`, `none` by default).
    pub(crate) fn compression(&self) -> Compression {
        self.read_back
            .as_ref()
            .map(|r| r.compression)
            .unwrap_or_default()
    }

    /// Whether the run is a long-lived sandbox (no command: idles until stopped).
    pub(crate) fn is_long_lived(&self) -> bool {
        self.command.as_ref().is_none_or(|c| c.is_empty())
    }
}

/// Parses `uid` or `uid:gid`. Returns None when the text is not of that form.
pub(crate) fn parse_user(user: &str) -> Option<(i64, Option<i64>)> {
    let (uid, gid) = match user.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (user, None),
    };
    let num = |s: &str| -> Option<i64> {
        if s.is_empty() || s.len() > 10 || !s.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        s.parse::<i64>().ok().filter(|n| *n <= i64::from(u32::MAX))
    };
    let uid = num(uid)?;
    let gid = match gid {
        Some(g) => Some(num(g)?),
        None => None,
    };
    Some((uid, gid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phase_names_are_the_serialized_ones() {
        for p in Phase::ALL {
            assert_eq!(serde_json::to_value(p).unwrap(), p.as_str(), "{p:?}");
        }
        for p in ReadBackPhase::ALL {
            assert_eq!(serde_json::to_value(p).unwrap(), p.as_str(), "{p:?}");
        }
        for c in [Compression::None, Compression::Gzip, Compression::Zstd] {
            assert_eq!(serde_json::to_value(c).unwrap(), c.as_str());
        }
    }
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::CustomResourceExt;

    /// Issue #38: the CRD's pattern admitted `/../usr/local/bin`. Now a read-back path and a
    /// mount target pass the schema exactly when the pod builder would mount them
    /// ([`crate::names::unclean_path`]), so `kubectl apply` refuses them with no webhook.
    #[test]
    fn the_crds_path_pattern_refuses_what_the_pod_builder_refuses() {
        let crd = serde_json::to_value(SandboxRun::crd()).unwrap();
        let spec = "/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties";
        let pattern_at = |field: &str| -> regex::Regex {
            let at = format!("{spec}{field}/pattern");
            let pattern = crd.pointer(&at).and_then(|v| v.as_str());
            regex::Regex::new(pattern.unwrap_or_else(|| panic!("no pattern at {at}"))).unwrap()
        };
        let paths = pattern_at("/readBack/properties/paths/items/properties/path");
        let targets = pattern_at("/mounts/items/properties/target");
        let corpus = [
            "/out",
            "/work/out",
            "/.cache",
            "/..a",
            "/...",
            "/a.b/c..d",
            "/a/.b",
            "/x/y/z",
            "/../usr/local/bin",
            "/out/..",
            "/out/../x",
            "/./out",
            "/out/.",
            "/a//b",
            "/out/",
            "//out",
            "/",
            "out",
            "",
            "/a\0b",
            "/.",
            "/..",
        ];
        for path in corpus {
            let clean = crate::names::unclean_path(path).is_none();
            assert_eq!(paths.is_match(path), clean, "read-back path {path:?}");
            assert_eq!(targets.is_match(path), clean, "mount target {path:?}");
        }
    }

    #[test]
    fn user_parses_uid_and_uid_gid_only() {
        assert_eq!(parse_user("1000"), Some((1000, None)));
        assert_eq!(parse_user("1000:2000"), Some((1000, Some(2000))));
        assert_eq!(parse_user("root"), None);
        assert_eq!(parse_user("1000:"), None);
        assert_eq!(parse_user(":1"), None);
        assert_eq!(parse_user("-1"), None);
        assert_eq!(parse_user("99999999999"), None);
    }

    #[test]
    fn crd_names_match_the_contract() {
        let crd = SandboxRun::crd();
        assert_eq!(crd.spec.group, "sandbox.iterion.io");
        assert_eq!(crd.spec.names.kind, "SandboxRun");
        assert_eq!(crd.spec.names.short_names, Some(vec!["sbr".to_string()]));
        assert_eq!(crd.spec.names.categories, Some(vec!["sandbox".to_string()]));
        assert_eq!(crd.spec.scope, "Namespaced");
        let v = &crd.spec.versions[0];
        assert_eq!(v.name, "v1alpha1");
        assert!(v
            .subresources
            .as_ref()
            .and_then(|s| s.status.as_ref())
            .is_some());
        let cols: Vec<_> = v
            .additional_printer_columns
            .iter()
            .flatten()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(
            cols,
            [
                "Phase",
                "Drained",
                "Pod",
                "Age",
                "Attempt",
                "Queued",
                "Exit",
                "Duration",
                "Message",
                "Template",
                "TemplateKind"
            ]
        );
        // The last seven are for `kubectl get sbr -o wide` only.
        let wide: Vec<_> = v
            .additional_printer_columns
            .iter()
            .flatten()
            .filter(|c| c.priority == Some(1))
            .map(|c| (c.name.as_str(), c.json_path.as_str()))
            .collect();
        assert_eq!(
            wide,
            [
                ("Attempt", ".status.attempt"),
                ("Queued", ".status.conditions[?(@.type==\"Queued\")].reason"),
                ("Exit", ".status.exitCode"),
                ("Duration", ".status.duration"),
                ("Message", ".status.message"),
                ("Template", ".spec.templateRef.name"),
                ("TemplateKind", ".spec.templateRef.kind")
            ]
        );
    }

    #[test]
    fn the_cluster_template_crd_is_cluster_scoped_with_the_namespaced_ones_spec() {
        let crd = ClusterSandboxRunTemplate::crd();
        assert_eq!(crd.spec.group, "sandbox.iterion.io");
        assert_eq!(crd.spec.names.kind, "ClusterSandboxRunTemplate");
        assert_eq!(crd.spec.names.plural, "clustersandboxruntemplates");
        assert_eq!(crd.spec.names.short_names, Some(vec!["csbrt".to_string()]));
        assert_eq!(crd.spec.scope, "Cluster");
        let spec = |crd: CustomResourceDefinition| {
            let v = serde_json::to_value(crd).unwrap();
            v["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"].clone()
        };
        let (cluster, namespaced) = (spec(crd), spec(SandboxRunTemplate::crd()));
        assert_eq!(cluster["properties"], namespaced["properties"]);
        assert_eq!(cluster["required"], namespaced["required"]);
        assert!(
            cluster["properties"]["template"]["x-kubernetes-validations"].is_array(),
            "the template's own rule (no templateRef, no stop) holds for both: {cluster}"
        );
    }

    #[test]
    fn a_template_ref_kind_defaults_to_the_namespaced_template_and_no_other_kind_is_taken() {
        let crd = serde_json::to_value(SandboxRun::crd()).unwrap();
        let kind = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
            ["properties"]["templateRef"]["properties"]["kind"];
        assert_eq!(kind["default"], "SandboxRunTemplate", "{kind}");
        assert_eq!(
            kind["enum"],
            serde_json::json!(["SandboxRunTemplate", "ClusterSandboxRunTemplate"])
        );
        // A run written before the kind existed names the namespaced template.
        let old: TemplateRef = serde_json::from_value(serde_json::json!({"name": "ci"})).unwrap();
        assert_eq!(old, TemplateRef::namespaced("ci"));
        let cluster: TemplateRef = serde_json::from_value(
            serde_json::json!({"kind": "ClusterSandboxRunTemplate", "name": "ci"}),
        )
        .unwrap();
        assert_eq!(cluster, TemplateRef::cluster("ci"));
        assert!(serde_json::from_value::<TemplateRef>(
            serde_json::json!({"kind": "ConfigMap", "name": "ci"})
        )
        .is_err());
        assert_eq!(cluster.describe("team"), "ClusterSandboxRunTemplate ci");
        assert_eq!(old.describe("team"), "SandboxRunTemplate team/ci");
    }

    #[test]
    fn the_template_crd_is_namespaced_in_the_same_group() {
        let crd = SandboxRunTemplate::crd();
        assert_eq!(crd.spec.group, "sandbox.iterion.io");
        assert_eq!(crd.spec.names.kind, "SandboxRunTemplate");
        assert_eq!(crd.spec.names.plural, "sandboxruntemplates");
        assert_eq!(crd.spec.names.short_names, Some(vec!["sbrt".to_string()]));
        assert_eq!(crd.spec.scope, "Namespaced");
        assert_eq!(crd.spec.versions[0].name, "v1alpha1");
    }

    #[test]
    fn every_spec_field_has_a_description() {
        let crd = serde_json::to_value(SandboxRun::crd()).unwrap_or_default();
        let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
        let props = spec["properties"].as_object().cloned().unwrap_or_default();
        assert!(
            props.len() >= 15,
            "spec has too few properties: {}",
            props.len()
        );
        for (name, schema) in props {
            assert!(
                schema
                    .get("description")
                    .and_then(|d| d.as_str())
                    .is_some_and(|d| !d.is_empty()),
                "spec.{name} has no description"
            );
        }
    }
}
