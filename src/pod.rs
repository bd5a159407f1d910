//! The pure pod builder: `SandboxRun` → the `Pod` the controller creates (ADR-143 §2, §3).
//!
//! No client, no clock: everything the pod depends on is in [`PodSettings`] and the run itself, so
//! the shape of the pod (volumes, mounts, security, the promise variables) is unit tested here and
//! checked again on the pod the controller really creates.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapVolumeSource, Container, EmptyDirVolumeSource, EnvVar, EnvVarSource,
    ExecAction, Lifecycle, LifecycleHandler, LocalObjectReference,
    PersistentVolumeClaimVolumeSource, Pod, PodSecurityContext, PodSpec, ResourceRequirements,
    SeccompProfile, SecretVolumeSource, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Resource, ResourceExt};
use thiserror::Error;

use crate::api::{parse_user, Mount, MountType, SandboxRun, SandboxRunSpec};
use crate::inpod::holder::HolderCommand;

mod slot;

pub use crate::names::{attempt_pod_name, pod_name, HOLDER_CONTAINER, RUN_UID_LABEL};
pub(crate) use crate::names::{
    managed_by_selector, MANAGED_BY, MANAGED_BY_LABEL, WORKLOAD_CONTAINER,
};
pub use slot::READBACK_VOLUME_PREFIX;
pub(crate) use slot::{slot_index, ReadBackSlot, SlotMismatch};
/// The variable that names the run-files directory to the workload (ADR-143 Consequences).
pub const ARTIFACT_FILES_ENV: &str = "ITERION_ARTIFACT_FILES_DIR";
/// The variable that tells the workload which attempt it is (1, 2, …; docs/user-guide.md
/// "Retries").
pub const ATTEMPT_ENV: &str = "SANDBOXRUN_ATTEMPT";
/// The variable that lists every declared read-back path (`:`-separated, declaration order).
pub const READBACK_PATHS_ENV: &str = "SANDBOXRUN_READBACK_PATHS";
/// Label carrying the owning run's name when it fits in a label value.
pub(crate) const RUN_NAME_LABEL: &str = "sandbox.iterion.io/run";
pub use crate::inpod::holder::{HOLDER_BINARY, HOLDER_STATE_DIR};
/// Default of `run --holder-image`: the operator's own image.
pub(crate) const DEFAULT_HOLDER_IMAGE: &str = "ghcr.io/iterion/sandboxrun-operator:latest";
pub(crate) use crate::names::{reserved_key, RESERVED_PREFIX};

/// Seconds the pod's grace period adds to the drain timeout, so the holder outlives the drain.
const GRACE_MARGIN_SECONDS: i64 = 30;

/// Operator-wide inputs to the pod builder.
#[derive(Clone, Debug, PartialEq)]
pub struct PodSettings {
    /// Image of the holder container: the operator's own image.
    pub holder_image: String,
    /// Absolute path of the operator's binary in the holder image (`run --holder-binary`): the
    /// holder's program and the packer, never looked up through PATH.
    pub holder_binary: String,
    /// How long teardown may drain when the run does not say.
    pub default_drain_timeout_seconds: i64,
    /// The longest drain timeout any run gets (`run --max-drain-timeout`), whatever it says.
    pub max_drain_timeout_seconds: i64,
    /// Requests and limits of the holder container (`run --holder-*`).
    pub holder_resources: HolderResources,
    /// Egress enforcement: the proxy variables a filtered run's workload gets.
    pub egress: crate::egress::EgressSettings,
    /// Secrets added to every pod's imagePullSecrets after the run's own
    /// (`run --pod-image-pull-secret`): a holder image from a private registry. Never on the pod
    /// of a workload image in the holder image's registry (docs/contract.md "The platform's pull
    /// Secrets pull the holder, not the workload").
    pub image_pull_secrets: Vec<String>,
    /// `run --pod-image-pull-secret-serves-workloads`: those Secrets may pull workload images too.
    pub image_pull_secrets_serve_workloads: bool,
    /// With `run --sharding`: the number of shards; the pod is labelled with its run's shard
    /// (`sandbox.iterion.io/shard`), which the sharded replica's pod watch selects on.
    pub shards: Option<u32>,
    /// The runtime class of a run that names none (`run --default-runtime-class`).
    pub default_runtime_class: Option<String>,
    /// The platform's namespace policies, for their `defaultRuntimeClass` (the controller reads
    /// the run's namespace's labels before it builds the pod: [`with_namespace_default`]).
    pub namespace_policies: Vec<crate::policy::namespace_policy::Compiled>,
}

impl Default for PodSettings {
    fn default() -> Self {
        PodSettings {
            holder_image: DEFAULT_HOLDER_IMAGE.to_string(),
            holder_binary: HOLDER_BINARY.to_string(),
            default_drain_timeout_seconds: 300,
            max_drain_timeout_seconds: 3600,
            holder_resources: HolderResources::default(),
            egress: crate::egress::EgressSettings::default(),
            image_pull_secrets: Vec::new(),
            image_pull_secrets_serve_workloads: false,
            shards: None,
            default_runtime_class: None,
            namespace_policies: Vec::new(),
        }
    }
}

/// `pod` with the runtime class the namespace policies governing a namespace with `labels` give a
/// run that names none (docs/contract.md "The platform's namespace policies"): a namespace
/// policy's `defaultRuntimeClass` wins over `run --default-runtime-class`; a run's own
/// `runtimeClassName` over both.
pub(crate) fn with_namespace_default(
    mut pod: Pod,
    run: &SandboxRun,
    labels: &BTreeMap<String, String>,
    policies: &[crate::policy::namespace_policy::Compiled],
) -> Pod {
    if run.spec.runtime_class_name.is_some() {
        return pod;
    }
    let chosen = crate::policy::namespace_policy::default_runtime_class(labels, policies);
    if let (Some(class), Some(spec)) = (chosen, pod.spec.as_mut()) {
        spec.runtime_class_name = Some(class.to_string());
    }
    pod
}

/// Default of `run --holder-cpu-request`.
pub(crate) const DEFAULT_HOLDER_CPU_REQUEST: &str = "10m";
/// Default of `run --holder-memory-request`.
pub(crate) const DEFAULT_HOLDER_MEMORY_REQUEST: &str = "16Mi";
/// Default of `run --holder-memory-limit` (the holder has no CPU limit unless one is set).
pub(crate) const DEFAULT_HOLDER_MEMORY_LIMIT: &str = "128Mi";

/// Requests and limits of the holder container. `None` leaves that entry out of the pod, so a
/// namespace's LimitRange defaults (or nothing) apply to it. Build it with
/// [`HolderResources::parse`], which checks every value is a Kubernetes quantity.
#[derive(Clone, Debug, PartialEq)]
pub struct HolderResources {
    /// `requests.cpu`.
    pub cpu_request: Option<Quantity>,
    /// `requests.memory`.
    pub memory_request: Option<Quantity>,
    /// `limits.cpu`.
    pub cpu_limit: Option<Quantity>,
    /// `limits.memory`.
    pub memory_limit: Option<Quantity>,
}

impl Default for HolderResources {
    fn default() -> Self {
        let q = |s: &str| Some(Quantity(s.to_string()));
        HolderResources {
            cpu_request: q(DEFAULT_HOLDER_CPU_REQUEST),
            memory_request: q(DEFAULT_HOLDER_MEMORY_REQUEST),
            cpu_limit: None,
            memory_limit: q(DEFAULT_HOLDER_MEMORY_LIMIT),
        }
    }
}

/// A holder resource setting the pod could not carry.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum HolderResourcesError {
    /// Not a non-negative Kubernetes quantity.
    #[error("{flag} {value:?} is not a Kubernetes quantity (e.g. 100m, 0.5, 64Mi, 1Gi)")]
    NotAQuantity {
        /// The flag that carried it.
        flag: &'static str,
        /// What it said.
        value: String,
    },
    /// A request above its limit: the apiserver would refuse every pod.
    #[error("holder {resource} request {request} is above its limit {limit}")]
    RequestAboveLimit {
        /// `cpu` or `memory`.
        resource: &'static str,
        /// The request.
        request: String,
        /// The limit.
        limit: String,
    },
}

impl HolderResources {
    /// Checks the `run --holder-*` values. An empty (or blank) value leaves that entry out of the
    /// pod; anything else must be a non-negative Kubernetes quantity, and a request may not be
    /// above its limit (the apiserver would refuse every pod).
    pub fn parse(
        cpu_request: &str,
        memory_request: &str,
        cpu_limit: Option<&str>,
        memory_limit: &str,
    ) -> Result<HolderResources, HolderResourcesError> {
        let one = |flag: &'static str, text: &str| -> Result<Option<(Quantity, f64)>, _> {
            let text = text.trim();
            if text.is_empty() {
                return Ok(None);
            }
            crate::units::quantity_value(text)
                .map(|v| Some((Quantity(text.to_string()), v)))
                .map_err(|_| HolderResourcesError::NotAQuantity {
                    flag,
                    value: text.to_string(),
                })
        };
        let cpu_request = one("--holder-cpu-request", cpu_request)?;
        let memory_request = one("--holder-memory-request", memory_request)?;
        let cpu_limit = one("--holder-cpu-limit", cpu_limit.unwrap_or_default())?;
        let memory_limit = one("--holder-memory-limit", memory_limit)?;
        for (resource, request, limit) in [
            ("cpu", &cpu_request, &cpu_limit),
            ("memory", &memory_request, &memory_limit),
        ] {
            if let (Some((rq, rv)), Some((lq, lv))) = (request, limit) {
                if rv > lv {
                    return Err(HolderResourcesError::RequestAboveLimit {
                        resource,
                        request: rq.0.clone(),
                        limit: lq.0.clone(),
                    });
                }
            }
        }
        let q = |v: Option<(Quantity, f64)>| v.map(|(q, _)| q);
        Ok(HolderResources {
            cpu_request: q(cpu_request),
            memory_request: q(memory_request),
            cpu_limit: q(cpu_limit),
            memory_limit: q(memory_limit),
        })
    }

    /// The container's `resources`: only the entries that are set; no map when none is.
    pub(crate) fn requirements(&self) -> ResourceRequirements {
        let map = |cpu: &Option<Quantity>, memory: &Option<Quantity>| {
            let m: BTreeMap<String, Quantity> = [("cpu", cpu), ("memory", memory)]
                .into_iter()
                .filter_map(|(k, v)| v.clone().map(|v| (k.to_string(), v)))
                .collect();
            (!m.is_empty()).then_some(m)
        };
        ResourceRequirements {
            requests: map(&self.cpu_request, &self.memory_request),
            limits: map(&self.cpu_limit, &self.memory_limit),
            ..ResourceRequirements::default()
        }
    }
}

/// A run the builder cannot turn into a pod. Admission refuses all of these first; the builder
/// refuses again so that a run admitted without the webhook never gets a half-served pod.
#[derive(Debug, Error, PartialEq)]
pub(crate) enum BuildError {
    /// The run has no uid/name yet (not read from the apiserver).
    #[error("the run has no {0} yet; it must be read from the apiserver first")]
    MissingMetadata(&'static str),
    /// No image.
    #[error("spec.image is required")]
    MissingImage,
    /// No or bad user.
    #[error("spec.user must be a numeric non-root \"uid\" or \"uid:gid\", got {0:?}")]
    BadUser(Option<String>),
    /// A mount type the pod cannot serve.
    #[error("spec.mounts[{index}] ({name}): type {kind:?} cannot be served on a pod")]
    UnservableMount {
        /// Position in spec.mounts.
        index: usize,
        /// Mount name.
        name: String,
        /// Its type.
        kind: MountType,
    },
    /// A mount type that needs a source has none.
    #[error("spec.mounts[{index}] ({name}): source is required for type {kind:?}")]
    MissingSource {
        /// Position in spec.mounts.
        index: usize,
        /// Mount name.
        name: String,
        /// Its type.
        kind: MountType,
    },
    /// The drain timeout does not parse.
    #[error("spec.readBack.drainTimeout {0:?} is not a duration like 90s or 5m")]
    BadDrainTimeout(String),
    /// A mount path that is not a clean absolute path (docs/contract.md "The operator never
    /// builds a pod its own rules refuse"): mounted as written, `..` would climb out of the
    /// holder's read-back root, e.g. over its own binary.
    #[error("{field} {path:?} {why}: no volume is mounted there")]
    UncleanPath {
        /// The field, e.g. `spec.readBack.paths[0].path`.
        field: String,
        /// The path as written.
        path: String,
        /// Why it is refused.
        why: &'static str,
    },
}

/// `path` when it is a clean absolute path ([`crate::names::unclean_path`]), else the refusal
/// naming `field`.
fn clean_path(field: impl FnOnce() -> String, path: &str) -> Result<(), BuildError> {
    match crate::names::unclean_path(path) {
        None => Ok(()),
        Some(why) => Err(BuildError::UncleanPath {
            field: field(),
            path: path.to_string(),
            why,
        }),
    }
}

/// The drain timeout of a run, in seconds.
pub(crate) fn drain_timeout_seconds(
    run: &SandboxRun,
    settings: &PodSettings,
) -> Result<i64, BuildError> {
    match run
        .spec
        .read_back
        .as_ref()
        .and_then(|r| r.drain_timeout.as_deref())
    {
        None => Ok(settings.default_drain_timeout_seconds),
        Some(text) => crate::units::parse_duration(text)
            .map(|d| i64::try_from(d.as_secs().max(1)).unwrap_or(i64::MAX))
            .map_err(|_| BuildError::BadDrainTimeout(text.to_string())),
    }
    // Admission refuses a longer one; a run admitted before the maximum was lowered (or with the
    // webhook off) is held to it too.
    .map(|secs| secs.min(settings.max_drain_timeout_seconds.max(1)))
}

/// Builds the pod of a run.
pub(crate) fn build_pod(run: &SandboxRun, settings: &PodSettings) -> Result<Pod, BuildError> {
    let name = run
        .metadata
        .name
        .clone()
        .ok_or(BuildError::MissingMetadata("name"))?;
    let uid = run
        .metadata
        .uid
        .clone()
        .ok_or(BuildError::MissingMetadata("uid"))?;
    let spec = &run.spec;
    let image = spec
        .image
        .clone()
        .filter(|i| !i.trim().is_empty())
        .ok_or(BuildError::MissingImage)?;
    let (user, group) = run_as(spec)?;
    let drain_timeout = drain_timeout_seconds(run, settings)?;

    // Made once: the pod mounts exactly these, and every reader reads them back (docs/contract.md
    // "A read-back slot is made once").
    let slots = ReadBackSlot::of(spec.read_back_paths().iter().map(|p| p.path.as_str()));
    let mounts = pod_volumes(spec, &slots)?;
    let env = workload_env_vars(run, settings, &slots);
    let restricted = restricted_security_context();
    let workload = workload_container(spec, image, env, mounts.workload, restricted.clone());
    let gate = egress_gate_container(run, settings, restricted.clone());
    let mut holder = holder_container(settings, mounts.holder, drain_timeout, restricted);
    // What the teardown follows, recorded where nobody can change it once the pod exists
    // (docs/contract.md "A teardown follows what its run started with").
    let records: Vec<EnvVar> = crate::started::record(spec.read_back.as_ref())
        .into_iter()
        .chain(crate::started::record_network(spec.network.as_ref()))
        .collect();
    holder.env = (!records.is_empty()).then_some(records);

    Ok(Pod {
        metadata: pod_metadata(run, &name, uid, settings.shards),
        spec: Some(PodSpec {
            init_containers: gate.map(|g| vec![g]),
            containers: vec![workload, holder],
            volumes: Some(mounts.volumes),
            restart_policy: Some("Never".to_string()),
            // activeDeadlineSeconds is deliberately NOT set: the kubelet would kill the holder too
            // and the read-back paths would go undrained. The operator enforces the deadline.
            termination_grace_period_seconds: Some(drain_timeout + GRACE_MARGIN_SECONDS),
            security_context: Some(pod_security_context(user, group)),
            image_pull_secrets: image_pull_secrets(spec, settings),
            ..passthrough_pod_spec(spec, settings.default_runtime_class.as_deref())
        }),
        status: None,
    })
}

/// The numeric uid and gid the pod runs as: `spec.user`, non-root, the gid defaulting to the uid.
fn run_as(spec: &SandboxRunSpec) -> Result<(i64, i64), BuildError> {
    let (user, group) = spec
        .user
        .as_deref()
        .and_then(parse_user)
        .filter(|(u, _)| *u != 0)
        .ok_or_else(|| BuildError::BadUser(spec.user.clone()))?;
    // The holder reads what the workload wrote, so both run as the same uid/gid, and fsGroup makes
    // the emptyDirs group-owned by it (DESIGN: "the holder must be able to read what the workload
    // wrote").
    Ok((user, group.unwrap_or(user)))
}

/// Every volume of the pod and where each container mounts it.
struct PodVolumes {
    /// The pod's volumes: the run's mounts, the holder's state, then one per read-back path.
    volumes: Vec<Volume>,
    /// The workload's mounts: the run's mounts, then the read-back paths.
    workload: Vec<VolumeMount>,
    /// The holder's mounts: its state, then the read-back paths (read-only).
    holder: Vec<VolumeMount>,
}

/// The volumes and mounts of the pod: the run's own mounts, the holder's state directory and the
/// read-back emptyDirs.
fn pod_volumes(spec: &SandboxRunSpec, slots: &[ReadBackSlot]) -> Result<PodVolumes, BuildError> {
    let mut volumes = Vec::new();
    let mut workload = Vec::new();
    for (index, m) in spec.mounts.iter().enumerate() {
        let (volume, mount) = run_mount(index, m)?;
        volumes.push(volume);
        workload.push(mount);
    }

    // One emptyDir per declared read-back path (its slot), mounted at that path in the workload
    // AND below its own root in the holder.
    let mut holder = vec![VolumeMount {
        name: "holder-state".to_string(),
        mount_path: HOLDER_STATE_DIR.to_string(),
        ..VolumeMount::default()
    }];
    volumes.push(Volume {
        name: "holder-state".to_string(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Volume::default()
    });
    for slot in slots {
        let index = slot.index;
        clean_path(|| format!("spec.readBack.paths[{index}].path"), &slot.path)?;
        volumes.push(slot.pod_volume());
        holder.push(slot.holder_volume_mount());
        workload.push(slot.workload_mount());
    }
    Ok(PodVolumes {
        volumes,
        workload,
        holder,
    })
}

/// The volume serving `spec.mounts[index]` and the workload's mount of it.
fn run_mount(index: usize, m: &Mount) -> Result<(Volume, VolumeMount), BuildError> {
    clean_path(|| format!("spec.mounts[{index}].target"), &m.target)?;
    let volume_name = format!("mount-{index}");
    let source = || {
        m.source
            .clone()
            .filter(|s| !s.is_empty())
            .ok_or_else(|| BuildError::MissingSource {
                index,
                name: m.name.clone(),
                kind: m.kind,
            })
    };
    let mut volume = Volume {
        name: volume_name.clone(),
        ..Volume::default()
    };
    match m.kind {
        MountType::EmptyDir => volume.empty_dir = Some(EmptyDirVolumeSource::default()),
        MountType::ConfigMap => {
            volume.config_map = Some(ConfigMapVolumeSource {
                name: source()?,
                ..Default::default()
            })
        }
        MountType::Secret => {
            volume.secret = Some(SecretVolumeSource {
                secret_name: Some(source()?),
                ..Default::default()
            })
        }
        MountType::PersistentVolumeClaim => {
            volume.persistent_volume_claim = Some(PersistentVolumeClaimVolumeSource {
                claim_name: source()?,
                read_only: Some(m.read_only),
            })
        }
        MountType::Bind => {
            return Err(BuildError::UnservableMount {
                index,
                name: m.name.clone(),
                kind: m.kind,
            })
        }
    }
    let mount = VolumeMount {
        name: volume_name,
        mount_path: m.target.clone(),
        read_only: m.read_only.then_some(true),
        ..VolumeMount::default()
    };
    Ok((volume, mount))
}

/// The workload's environment: the run's variables, then the promise variables, then a filtered
/// run's proxy variables.
fn workload_env_vars(
    run: &SandboxRun,
    settings: &PodSettings,
    slots: &[ReadBackSlot],
) -> Vec<EnvVar> {
    // A filtered run's proxy variables (docs/contract.md "ADR-006 network rules: validated and
    // enforced") replace any the user set.
    let proxy_env = crate::egress::env::proxy_env(run, &settings.egress);
    let mut env: Vec<EnvVar> = run
        .spec
        .env
        .iter()
        .filter(|e| {
            e.name != ARTIFACT_FILES_ENV && e.name != READBACK_PATHS_ENV && e.name != ATTEMPT_ENV
        })
        .filter(|e| {
            proxy_env.is_empty() || !crate::egress::env::PROXY_ENV.contains(&e.name.as_str())
        })
        .map(run_env_var)
        .collect();
    env.extend(promise_env(slots));
    env.extend(proxy_env);
    env.push(EnvVar {
        name: ATTEMPT_ENV.to_string(),
        value: Some(crate::identity::current_attempt(run).to_string()),
        value_from: None,
    });
    env
}

/// One of the run's variables as the pod carries it: a value, or a secret/configMap key.
fn run_env_var(e: &crate::api::EnvVar) -> EnvVar {
    match &e.value_from {
        // Only the two sources a run may name (admission rule env-value-from).
        Some(from) => EnvVar {
            name: e.name.clone(),
            value: None,
            value_from: Some(EnvVarSource {
                secret_key_ref: from.secret_key_ref.clone(),
                config_map_key_ref: from.config_map_key_ref.clone(),
                ..EnvVarSource::default()
            }),
        },
        None => EnvVar {
            name: e.name.clone(),
            value: Some(e.value.clone()),
            value_from: None,
        },
    }
}

/// The promise variables: none without a read-back path.
fn promise_env(slots: &[ReadBackSlot]) -> Vec<EnvVar> {
    // The promise (ADR-143 §3, §6): a path is named to the workload because it will be read back.
    // Named exactly when a kept mount serves it and the drain covers it — both hold for every
    // declared path here, and never for anything else (user env cannot forge the variables).
    let Some(first) = slots.first() else {
        return Vec::new();
    };
    let all: Vec<&str> = slots.iter().map(|s| s.path.as_str()).collect();
    vec![
        EnvVar {
            name: ARTIFACT_FILES_ENV.to_string(),
            value: Some(first.path.clone()),
            value_from: None,
        },
        EnvVar {
            name: READBACK_PATHS_ENV.to_string(),
            value: Some(all.join(":")),
            value_from: None,
        },
    ]
}

/// The security context both containers share: no privilege escalation, no capabilities, non-root.
fn restricted_security_context() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".to_string()]),
            add: None,
        }),
        run_as_non_root: Some(true),
        ..SecurityContext::default()
    }
}

/// The user's container.
fn workload_container(
    spec: &SandboxRunSpec,
    image: String,
    env: Vec<EnvVar>,
    mounts: Vec<VolumeMount>,
    security: SecurityContext,
) -> Container {
    // Without a command the run is a long-lived sandbox: the workload idles, driven by exec.
    let (command, args) = if spec.is_long_lived() && spec.args.as_ref().is_none_or(|a| a.is_empty())
    {
        (
            Some(vec!["sleep".to_string(), "infinity".to_string()]),
            None,
        )
    } else {
        (
            spec.command.clone().filter(|c| !c.is_empty()),
            spec.args.clone(),
        )
    };
    Container {
        name: WORKLOAD_CONTAINER.to_string(),
        image: Some(image),
        command,
        args,
        working_dir: spec.working_dir.clone(),
        env: (!env.is_empty()).then_some(env),
        resources: spec.resources.clone(),
        volume_mounts: Some(mounts),
        security_context: Some(security),
        // Evidence that outlives the pod: without a termination message the kubelet puts the
        // last log lines in the terminated state's message, which teardown copies into
        // status.workload before the pod is deleted.
        termination_message_policy: Some("FallbackToLogsOnError".to_string()),
        ..Container::default()
    }
}

/// The operator-owned container the drain execs into; its preStop hook holds the pod until drained.
fn holder_container(
    settings: &PodSettings,
    mounts: Vec<VolumeMount>,
    drain_timeout: i64,
    restricted: SecurityContext,
) -> Container {
    Container {
        name: HOLDER_CONTAINER.to_string(),
        image: Some(settings.holder_image.clone()),
        command: Some(HolderCommand::program(&settings.holder_binary)),
        args: Some(HolderCommand::Idle.args()),
        resources: Some(settings.holder_resources.requirements()),
        volume_mounts: Some(mounts),
        // A pod deleted or evicted gracefully keeps its emptyDirs until the holder stops: the hook
        // holds it until the operator has drained (or the grace period, set from drainTimeout, ends).
        lifecycle: Some(Lifecycle {
            pre_stop: Some(LifecycleHandler {
                exec: Some(ExecAction {
                    command: Some(
                        HolderCommand::WaitDrained {
                            seconds: drain_timeout + GRACE_MARGIN_SECONDS / 2,
                        }
                        .argv(&settings.holder_binary),
                    ),
                }),
                ..LifecycleHandler::default()
            }),
            ..Lifecycle::default()
        }),
        security_context: Some(SecurityContext {
            read_only_root_filesystem: Some(true),
            ..restricted
        }),
        ..Container::default()
    }
}

/// The egress gate (docs/contract.md "A filtered run never has an unfiltered instant"): the init
/// container that holds the workload of a run whose egress is restricted until the run's
/// NetworkPolicy is in force for this pod. None when the egress is open, when the cluster does not
/// enforce NetworkPolicy (`run --network-policy unenforced-*`: nothing to wait for), or when the
/// gate is off (`run --egress-gate-probe off`).
fn egress_gate_container(
    run: &SandboxRun,
    settings: &PodSettings,
    restricted: SecurityContext,
) -> Option<Container> {
    use crate::egress::mode::egress_of;
    use crate::egress::PolicyEnforcement;
    let gate = settings.egress.gate?;
    if settings.egress.enforcement != PolicyEnforcement::Enforced {
        return None;
    }
    // Every restricted run is gated: its policy denies the probe (a fixed probe from the start,
    // the node's address once the pod is scheduled: egress::policy::policy_while_gated).
    let egress = egress_of(run).ok()?;
    if !egress.is_restricted() {
        return None;
    }
    let anchor = gate
        .anchor
        .then(|| gate_anchor(&egress, &settings.egress))
        .flatten();
    let canary = anchor
        .as_ref()
        .and_then(|_| gate_canary(&egress, &settings.egress));
    Some(Container {
        name: crate::inpod::gate::GATE_CONTAINER.to_string(),
        image: Some(settings.holder_image.clone()),
        command: Some(vec![settings.holder_binary.clone()]),
        args: Some(gate.args(anchor.as_deref(), canary.as_ref())),
        env: Some(vec![EnvVar {
            name: crate::inpod::gate::HOST_IP_ENV.to_string(),
            value: None,
            value_from: Some(k8s_openapi::api::core::v1::EnvVarSource {
                field_ref: Some(k8s_openapi::api::core::v1::ObjectFieldSelector {
                    field_path: "status.hostIP".to_string(),
                    api_version: None,
                }),
                ..Default::default()
            }),
        }]),
        resources: Some(settings.holder_resources.requirements()),
        // Its refusal (stderr) becomes the run's message.
        termination_message_policy: Some("FallbackToLogsOnError".to_string()),
        security_context: Some(SecurityContext {
            read_only_root_filesystem: Some(true),
            ..restricted
        }),
        ..Container::default()
    })
}

/// The gate's anchor (docs/contract.md "A filtered run never has an unfiltered instant"): the
/// egress proxy's `host:port`, which a filtered run's policy allows, so a denied probe is believed
/// only while the proxy answers; for a run that may reach nothing, the proxy at its address (no
/// DNS for such a run: `EgressSettings::deny_all_anchor`). None for an open run, or without a
/// proxy.
fn gate_anchor(
    egress: &crate::egress::mode::Egress,
    settings: &crate::egress::EgressSettings,
) -> Option<String> {
    match egress {
        crate::egress::mode::Egress::Filtered { .. } => {
            let url = url::Url::parse(&settings.proxy.as_ref()?.url).ok()?;
            let port = url.port_or_known_default()?;
            Some(format!("{}:{port}", url.host_str()?))
        }
        crate::egress::mode::Egress::DenyAll => {
            settings.deny_all_anchor().map(|addr| addr.to_string())
        }
        crate::egress::mode::Egress::Open => None,
    }
}

/// The proxy's canary for an anchored gate: probed whatever address ranges the run allows. While
/// the gate waits, the run's policy denies the proxy's pods in every range
/// (`egress::policy::policy_while_gated`), so a refused canary beside an answering anchor is that
/// policy in force, and an answering one keeps the gate shut (it fails closed). The gate's
/// `--canary-unless-in` (send it to the node's probe when the anchor is in a range) stays for the
/// pods an earlier version built; this builder no longer writes it.
fn gate_canary(
    egress: &crate::egress::mode::Egress,
    settings: &crate::egress::EgressSettings,
) -> Option<crate::inpod::gate::Canary> {
    if matches!(egress, crate::egress::mode::Egress::Open) {
        return None;
    }
    let port = settings.proxy.as_ref()?.canary_port?;
    Some(crate::inpod::gate::Canary::port(port))
}

/// The pod's security context: the run's uid/gid, fsGroup for the emptyDirs, RuntimeDefault seccomp.
fn pod_security_context(user: i64, group: i64) -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(user),
        run_as_group: Some(group),
        fs_group: Some(group),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".to_string(),
            localhost_profile: None,
        }),
        ..PodSecurityContext::default()
    }
}

/// The run's imagePullSecrets, then the operator's, each name once; none when empty.
fn image_pull_secrets(
    spec: &SandboxRunSpec,
    settings: &PodSettings,
) -> Option<Vec<LocalObjectReference>> {
    let platform = crate::policy::platform_pull::PlatformPull::new(
        &settings.image_pull_secrets,
        &settings.holder_image,
        settings.image_pull_secrets_serve_workloads,
    );
    let image = spec.image.as_deref().unwrap_or_default();
    let mut seen = std::collections::HashSet::new();
    let pull_secrets: Vec<LocalObjectReference> = spec
        .image_pull_secrets
        .iter()
        .chain(platform.secrets_for(image).iter())
        .filter(|n| seen.insert(n.as_str()))
        .map(|n| LocalObjectReference { name: n.clone() })
        .collect();
    (!pull_secrets.is_empty()).then_some(pull_secrets)
}

/// The pod spec fields copied from the run (scheduling, runtime class — else the operator's
/// default —, service account) and the fixed ones that do not depend on it.
fn passthrough_pod_spec(spec: &SandboxRunSpec, default_runtime_class: Option<&str>) -> PodSpec {
    PodSpec {
        // No API token unless the run names the account it is meant to act as.
        service_account_name: spec.service_account_name.clone(),
        automount_service_account_token: Some(spec.service_account_name.is_some()),
        runtime_class_name: spec
            .runtime_class_name
            .clone()
            .or_else(|| default_runtime_class.map(str::to_string)),
        affinity: spec.affinity.clone(),
        enable_service_links: Some(false),
        node_selector: spec.node_selector.clone(),
        tolerations: spec.tolerations.clone(),
        priority_class_name: spec.priority_class_name.clone(),
        ..PodSpec::default()
    }
}

/// The pod's name, namespace, labels, annotations and owner reference.
fn pod_metadata(run: &SandboxRun, name: &str, uid: String, shards: Option<u32>) -> ObjectMeta {
    let annotations: BTreeMap<String, String> = run
        .spec
        .pod_annotations
        .iter()
        .flatten()
        .filter(|(k, _)| !k.starts_with(RESERVED_PREFIX))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    ObjectMeta {
        name: Some(crate::identity::current_pod_name(run)),
        namespace: run.namespace(),
        labels: Some(pod_labels(run, name, uid, shards)),
        annotations: (!annotations.is_empty()).then_some(annotations),
        owner_references: run.controller_owner_ref(&()).map(|o| vec![o]),
        ..ObjectMeta::default()
    }
}

/// The operator's labels, then the run's own pod labels under them.
fn pod_labels(
    run: &SandboxRun,
    name: &str,
    uid: String,
    shards: Option<u32>,
) -> BTreeMap<String, String> {
    let spec = &run.spec;
    let mut labels = BTreeMap::new();
    if let Some(shards) = shards {
        let run_labels = run.metadata.labels.clone().unwrap_or_default();
        let shard = crate::shard::shard_of_run(&run_labels, &uid, shards);
        labels.insert(crate::shard::SHARD_LABEL.to_string(), shard.to_string());
    }
    labels.extend([
        (MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string()),
        (
            "app.kubernetes.io/name".to_string(),
            "sandboxrun".to_string(),
        ),
        (RUN_UID_LABEL.to_string(), uid),
    ]);
    if name.len() <= 63 {
        labels.insert(RUN_NAME_LABEL.to_string(), name.to_string());
    }
    // The run's own pod labels, under the operator's: the keys the operator sets (and every
    // sandbox.iterion.io/ key) stay the operator's, whatever the spec says.
    for (k, v) in spec.pod_labels.iter().flatten() {
        if !reserved_key(k) {
            labels.entry(k.clone()).or_insert_with(|| v.clone());
        }
    }
    labels
}

/// Whether `pod` keeps the promise for `path`: it serves a read-back slot there
/// ([`ReadBackSlot::serving`]: an emptyDir mounted at `path` in the workload AND, the same
/// volume, in the holder, which the drain reads). Used by the canary.
pub(crate) fn kept_mount_serves(pod: &Pod, path: &str) -> bool {
    ReadBackSlot::serving(pod, path).is_some()
}

/// The value of an env variable of the workload container, if set.
pub fn workload_env<'a>(pod: &'a Pod, name: &str) -> Option<&'a str> {
    pod.spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == WORKLOAD_CONTAINER)?
        .env
        .iter()
        .flatten()
        .find(|e| e.name == name)?
        .value
        .as_deref()
}

/// Canary (ADR-143 §6), both directions: the promise variables name exactly the paths a kept mount
/// serves. Returns the violations in words; empty means the promise holds.
pub fn promise_violations(pod: &Pod, declared: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let listed: Vec<String> = workload_env(pod, READBACK_PATHS_ENV)
        .map(|v| {
            v.split(':')
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    for path in &listed {
        if !kept_mount_serves(pod, path) {
            out.push(format!(
                "{READBACK_PATHS_ENV} names {path}, which no kept mount serves"
            ));
        }
    }
    for (index, path) in declared.iter().enumerate() {
        // Declared path N is served by slot N (docs/contract.md "A read-back slot is made once").
        let served = ReadBackSlot::read(pod, index, path).is_ok();
        if served && !listed.contains(path) {
            out.push(format!(
                "{path} is served and drained but not named in {READBACK_PATHS_ENV}"
            ));
        }
        if !served {
            out.push(format!(
                "declared path {path} is not served by a kept mount"
            ));
        }
    }
    match workload_env(pod, ARTIFACT_FILES_ENV) {
        Some(dir) if !kept_mount_serves(pod, dir) => out.push(format!(
            "{ARTIFACT_FILES_ENV}={dir} but no kept mount serves it"
        )),
        Some(dir) if declared.first().map(String::as_str) != Some(dir) => out.push(format!(
            "{ARTIFACT_FILES_ENV}={dir} is not the first declared path"
        )),
        None if !declared.is_empty() => out.push(format!(
            "{ARTIFACT_FILES_ENV} is unset although paths are served and drained"
        )),
        _ => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{EnvVar as SpecEnv, Mount, ReadBack, ReadBackPath, SandboxRunSpec};

    fn run(spec: SandboxRunSpec) -> SandboxRun {
        crate::testkit::sandbox_run("demo")
            .namespace("ns1")
            .uid("1111-2222")
            .spec(spec)
            .build()
    }

    fn spec_with_paths(paths: &[&str]) -> SandboxRunSpec {
        SandboxRunSpec {
            image: Some("busybox@sha256:abc".into()),
            command: Some(vec!["sh".into(), "-c".into(), "echo hi".into()]),
            user: Some("1000:3000".into()),
            read_back: Some(ReadBack {
                paths: paths
                    .iter()
                    .map(|p| ReadBackPath {
                        path: p.to_string(),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn container<'a>(pod: &'a Pod, name: &str) -> &'a Container {
        let spec = pod.spec.as_ref().unwrap();
        spec.containers.iter().find(|c| c.name == name).unwrap()
    }

    #[test]
    fn every_declared_path_is_an_emptydir_without_size_limit_in_workload_and_holder() {
        let pod = build_pod(
            &run(spec_with_paths(&["/out", "/logs/x"])),
            &PodSettings::default(),
        )
        .unwrap();
        for path in ["/out", "/logs/x"] {
            assert!(kept_mount_serves(&pod, path), "{path} not served");
        }
        for v in pod.spec.as_ref().unwrap().volumes.iter().flatten() {
            if let Some(ed) = &v.empty_dir {
                assert!(
                    ed.size_limit.is_none(),
                    "sizeLimit on {} evicts the run",
                    v.name
                );
            }
        }
        let holder = container(&pod, HOLDER_CONTAINER);
        assert!(holder
            .volume_mounts
            .iter()
            .flatten()
            .filter(|m| m.name.starts_with(READBACK_VOLUME_PREFIX))
            .all(|m| m.read_only == Some(true)));
    }

    #[test]
    fn the_holder_runs_its_binary_by_absolute_path_and_no_read_back_path_lands_on_its_path() {
        // A run declaring the holder's own PATH directories (admission refuses these too; the pod
        // must be safe without it): docs/contract.md "The holder runs only the operator's code".
        let declared = ["/usr/local/sbin", "/usr/local/bin", "/bin"];
        let pod = build_pod(&run(spec_with_paths(&declared)), &PodSettings::default()).unwrap();
        let holder = container(&pod, HOLDER_CONTAINER);
        let command = holder.command.clone().unwrap();
        assert_eq!(command[0], HOLDER_BINARY);
        assert!(command[0].starts_with('/'));
        let hook = holder
            .lifecycle
            .as_ref()
            .unwrap()
            .pre_stop
            .as_ref()
            .unwrap();
        let hook = hook.exec.as_ref().unwrap().command.clone().unwrap();
        assert_eq!(hook[0], HOLDER_BINARY);
        let binary_dir = std::path::Path::new(HOLDER_BINARY).parent().unwrap();
        for m in holder.volume_mounts.iter().flatten() {
            let at = std::path::Path::new(&m.mount_path);
            assert!(
                !binary_dir.starts_with(at) && !at.starts_with(binary_dir),
                "{at:?}"
            );
            for dir in ["/usr", "/bin", "/sbin", "/lib"] {
                assert!(!at.starts_with(dir), "holder mounts {at:?} over {dir}");
            }
        }
        for path in declared {
            assert!(kept_mount_serves(&pod, path), "{path} not served");
            let workload = container(&pod, WORKLOAD_CONTAINER);
            assert!(workload
                .volume_mounts
                .iter()
                .flatten()
                .any(|m| m.mount_path == path));
        }
    }

    #[test]
    fn a_restricted_run_waits_behind_the_egress_gate_an_open_one_does_not() {
        use crate::api::{NetworkMode, NetworkPolicy};
        use crate::egress::PolicyEnforcement;
        let with_network = |mode: NetworkMode, rules: &[&str]| {
            let mut spec = spec_with_paths(&["/out"]);
            spec.network = Some(NetworkPolicy {
                mode,
                rules: rules.iter().map(|r| r.to_string()).collect(),
            });
            run(spec)
        };
        let gates = |r: &SandboxRun, settings: &PodSettings| -> Option<Container> {
            let pod = build_pod(r, settings).unwrap();
            let init = pod.spec.unwrap().init_containers.unwrap_or_default();
            assert!(init.len() <= 1, "{init:?}");
            init.into_iter().next()
        };
        let settings = PodSettings::default();
        let mut fixed = PodSettings::default();
        if let Some(gate) = fixed.egress.gate.as_mut() {
            gate.probe = crate::inpod::gate::GateProbe::Addr("10.9.9.9:9".parse().unwrap());
        }
        for (r, settings) in [
            (
                with_network(NetworkMode::Allowlist, &["example.com"]),
                &settings,
            ),
            (with_network(NetworkMode::Allowlist, &[]), &settings),
            (with_network(NetworkMode::Denylist, &["10.0.0.0/8"]), &fixed),
            (
                with_network(NetworkMode::Denylist, &["10.0.0.0/8"]),
                &settings,
            ),
        ] {
            let gate = gates(&r, settings).expect("a restricted run is gated");
            assert_eq!(gate.name, crate::inpod::gate::GATE_CONTAINER);
            assert_eq!(gate.command.clone().unwrap(), [HOLDER_BINARY]);
            let args = gate.args.clone().unwrap();
            assert_eq!(args[0], "egress-gate");
            let env = gate.env.clone().unwrap();
            let host_ip = env[0]
                .value_from
                .as_ref()
                .unwrap()
                .field_ref
                .as_ref()
                .unwrap();
            assert_eq!(host_ip.field_path, "status.hostIP");
            let sc = gate.security_context.clone().unwrap();
            assert_eq!(sc.read_only_root_filesystem, Some(true));
            assert_eq!(sc.allow_privilege_escalation, Some(false));
        }
        let node_probe = gates(&with_network(NetworkMode::Allowlist, &[]), &settings).unwrap();
        assert!(node_probe
            .args
            .unwrap()
            .contains(&"$(SANDBOXRUN_HOST_IP)".to_string()));
        // Open egress, no spec.network, an unenforcing cluster or the gate off: no gate.
        assert!(gates(&with_network(NetworkMode::Open, &[]), &settings).is_none());
        assert!(gates(&run(spec_with_paths(&["/out"])), &settings).is_none());
        let mut unenforced = PodSettings::default();
        unenforced.egress.enforcement = PolicyEnforcement::UnenforcedWarn;
        let filtered = with_network(NetworkMode::Allowlist, &["example.com"]);
        assert!(gates(&filtered, &unenforced).is_none());
        let mut off = PodSettings::default();
        off.egress.gate = None;
        assert!(gates(&filtered, &off).is_none());
        // The egress proxy is the anchor of a filtered run's gate, not of one that may reach
        // nothing (its policy allows no proxy), and not without a proxy.
        let anchor_of = |r: &SandboxRun, settings: &PodSettings| {
            let args = gates(r, settings).unwrap().args.unwrap();
            let at = args.iter().position(|a| a == "--anchor")?;
            args.get(at + 1).cloned()
        };
        assert_eq!(anchor_of(&filtered, &settings), None, "no proxy configured");
        let mut proxied = PodSettings::default();
        proxied.egress.proxy = Some(crate::egress::ProxyPeer {
            url: "http://egress.sys.svc:3128".into(),
            selector: crate::egress::PeerSelector {
                namespace: "sys".into(),
                pod_labels: [("app".to_string(), "proxy".to_string())].into(),
            },
            port: 3128,
            canary_port: None,
            address: None,
        });
        assert_eq!(
            anchor_of(&filtered, &proxied).as_deref(),
            Some("egress.sys.svc:3128")
        );
        let deny_all = with_network(NetworkMode::Allowlist, &[]);
        assert_eq!(anchor_of(&deny_all, &proxied), None);
        // With the proxy's canary: every anchored run probes the canary, never the node —
        // also one allowing a range that may hold the proxy's pods (issue #38: a closed node
        // port read as refused opened its gate; its policy now denies the proxy's pods while
        // the gate waits, egress::policy::policy_while_gated).
        let probes_canary = |r: &SandboxRun, settings: &PodSettings| {
            let args = gates(r, settings).unwrap().args.unwrap();
            assert!(
                !args.contains(&"--canary-unless-in".to_string()),
                "{args:?}"
            );
            (
                args.contains(&"--canary-port".to_string()),
                args.contains(&"--probe-host".to_string()),
            )
        };
        assert_eq!(
            probes_canary(&filtered, &proxied),
            (false, true),
            "no canary"
        );
        if let Some(proxy) = proxied.egress.proxy.as_mut() {
            proxy.canary_port = Some(3129);
        }
        assert_eq!(probes_canary(&filtered, &proxied), (true, false));
        let ranged = with_network(NetworkMode::Allowlist, &["example.com", "10.0.0.0/8"]);
        assert_eq!(probes_canary(&ranged, &proxied), (true, false));
        let denylist = with_network(NetworkMode::Denylist, &["203.0.113.0/24"]);
        assert_eq!(probes_canary(&denylist, &proxied), (true, false));
        let mut wide = proxied.clone();
        wide.egress.denylist_wide = true;
        assert_eq!(
            probes_canary(&denylist, &wide),
            (true, false),
            "0.0.0.0/0 minus"
        );
        assert_eq!(
            probes_canary(&deny_all, &proxied),
            (false, true),
            "no anchor"
        );
        // A run that may reach nothing is anchored on the proxy by its address (it has no DNS)
        // once the operator resolved it, and probes the canary there.
        if let Some(proxy) = proxied.egress.proxy.as_mut() {
            proxy.address = "10.96.0.10".parse().ok();
        }
        assert_eq!(
            anchor_of(&deny_all, &proxied).as_deref(),
            Some("10.96.0.10:3128")
        );
        assert_eq!(probes_canary(&deny_all, &proxied), (true, false));
        assert_eq!(
            anchor_of(&filtered, &proxied).as_deref(),
            Some("egress.sys.svc:3128"),
            "a filtered run keeps the name"
        );
        if let Some(gate) = proxied.egress.gate.as_mut() {
            gate.anchor = false;
        }
        assert_eq!(
            anchor_of(&filtered, &proxied),
            None,
            "--egress-gate-anchor=false"
        );
    }

    #[test]
    fn a_run_without_a_runtime_class_gets_its_namespaces_default_else_the_operators() {
        let class = |pod: &Pod| pod.spec.as_ref().and_then(|s| s.runtime_class_name.clone());
        let plain = run(spec_with_paths(&["/out"]));
        let mut own = spec_with_paths(&["/out"]);
        own.runtime_class_name = Some("kata".into());
        let own = run(own);
        let mut settings = PodSettings::default();
        assert_eq!(class(&build_pod(&plain, &settings).unwrap()), None);
        settings.default_runtime_class = Some("gvisor".into());
        assert_eq!(
            class(&build_pod(&plain, &settings).unwrap()).as_deref(),
            Some("gvisor")
        );
        assert_eq!(
            class(&build_pod(&own, &settings).unwrap()).as_deref(),
            Some("kata")
        );
        let policies = crate::policy::namespace_policy::load(
            "- name: free-tier\n  namespaceSelector: {matchLabels: {tier: free}}\n  defaultRuntimeClass: sandboxed\n",
        )
        .unwrap();
        let free = BTreeMap::from([("tier".to_string(), "free".to_string())]);
        let pod = |r: &SandboxRun| build_pod(r, &settings).unwrap();
        // The namespace policy's default wins over the operator's; the run's own over both; a
        // namespace the policy does not select keeps the operator's.
        let given = with_namespace_default(pod(&plain), &plain, &free, &policies);
        assert_eq!(class(&given).as_deref(), Some("sandboxed"));
        let kept = with_namespace_default(pod(&own), &own, &free, &policies);
        assert_eq!(class(&kept).as_deref(), Some("kata"));
        let elsewhere = with_namespace_default(pod(&plain), &plain, &BTreeMap::new(), &policies);
        assert_eq!(class(&elsewhere).as_deref(), Some("gvisor"));
    }

    #[test]
    fn variable_named_exactly_when_a_kept_mount_serves_it() {
        let declared = vec!["/out".to_string(), "/logs".to_string()];
        let pod = build_pod(
            &run(spec_with_paths(&["/out", "/logs"])),
            &PodSettings::default(),
        )
        .unwrap();
        assert_eq!(promise_violations(&pod, &declared), Vec::<String>::new());
        assert_eq!(workload_env(&pod, ARTIFACT_FILES_ENV), Some("/out"));
        assert_eq!(workload_env(&pod, READBACK_PATHS_ENV), Some("/out:/logs"));

        // No declared path: no variable, whatever the user's env says.
        let mut spec = spec_with_paths(&[]);
        spec.env.push(SpecEnv {
            name: ARTIFACT_FILES_ENV.into(),
            value: "/tmp/forged".into(),
            ..Default::default()
        });
        let pod = build_pod(&run(spec), &PodSettings::default()).unwrap();
        assert_eq!(workload_env(&pod, ARTIFACT_FILES_ENV), None);
        assert_eq!(workload_env(&pod, READBACK_PATHS_ENV), None);
        assert!(promise_violations(&pod, &[]).is_empty());

        // The converse direction fails loudly when a served path is dropped from the pod.
        let mut pod = build_pod(&run(spec_with_paths(&["/out"])), &PodSettings::default()).unwrap();
        let spec = pod.spec.as_mut().unwrap();
        spec.volumes
            .as_mut()
            .unwrap()
            .retain(|v| !v.name.starts_with(READBACK_VOLUME_PREFIX));
        assert!(!promise_violations(&pod, &["/out".to_string()]).is_empty());
    }

    #[test]
    fn the_pod_passthrough_reaches_the_pod_and_the_operators_labels_win() {
        use k8s_openapi::api::core::v1::{Affinity, NodeAffinity, SecretKeySelector};
        let mut spec = spec_with_paths(&["/out"]);
        spec.runtime_class_name = Some("gvisor".into());
        spec.service_account_name = Some("reporter".into());
        spec.pod_labels = Some(BTreeMap::from([
            ("team".to_string(), "a".to_string()),
            ("app.kubernetes.io/name".to_string(), "forged".to_string()),
            (RUN_UID_LABEL.to_string(), "forged".to_string()),
        ]));
        spec.pod_annotations = Some(BTreeMap::from([
            ("mesh.example.com/inject".to_string(), "false".to_string()),
            (
                "sandbox.iterion.io/skip-drain".to_string(),
                "true".to_string(),
            ),
        ]));
        spec.affinity = Some(Affinity {
            node_affinity: Some(NodeAffinity::default()),
            ..Affinity::default()
        });
        spec.env.push(SpecEnv {
            name: "TOKEN".into(),
            value_from: Some(crate::api::EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: "creds".into(),
                    key: "token".into(),
                    optional: None,
                }),
                config_map_key_ref: None,
            }),
            ..Default::default()
        });
        let pod = build_pod(&run(spec), &PodSettings::default()).unwrap();
        let labels = pod.metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels.get("team").map(String::as_str), Some("a"));
        assert_eq!(
            labels.get("app.kubernetes.io/name").map(String::as_str),
            Some("sandboxrun")
        );
        assert_eq!(
            labels.get(RUN_UID_LABEL).map(String::as_str),
            Some("1111-2222")
        );
        let annotations = pod.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(annotations.len(), 1, "{annotations:?}");
        let ps = pod.spec.unwrap();
        assert_eq!(ps.runtime_class_name.as_deref(), Some("gvisor"));
        assert_eq!(ps.service_account_name.as_deref(), Some("reporter"));
        assert_eq!(ps.automount_service_account_token, Some(true));
        assert!(ps.affinity.and_then(|a| a.node_affinity).is_some());
        let env = ps.containers[0].env.clone().unwrap_or_default();
        let token = env.iter().find(|e| e.name == "TOKEN").unwrap();
        assert_eq!(token.value, None);
        let from = token.value_from.as_ref().unwrap();
        assert_eq!(from.secret_key_ref.as_ref().unwrap().key, "token");
        // Without a service account: the namespace's default, no token.
        let plain = build_pod(&run(spec_with_paths(&["/out"])), &PodSettings::default()).unwrap();
        let ps = plain.spec.unwrap();
        assert_eq!(ps.service_account_name, None);
        assert_eq!(ps.automount_service_account_token, Some(false));
        assert_eq!(plain.metadata.annotations, None);
    }

    #[test]
    fn a_sharded_operators_pod_carries_its_runs_shard_and_the_run_cannot_set_it() {
        let mut spec = spec_with_paths(&["/out"]);
        spec.pod_labels = Some(BTreeMap::from([(
            crate::shard::SHARD_LABEL.to_string(),
            "999".to_string(),
        )]));
        let r = run(spec);
        let uid = r.metadata.uid.clone().unwrap();
        let plain = build_pod(&r, &PodSettings::default()).unwrap();
        let labels = plain.metadata.labels.unwrap_or_default();
        assert!(
            !labels.contains_key(crate::shard::SHARD_LABEL),
            "{labels:?}"
        );
        let settings = PodSettings {
            shards: Some(32),
            ..PodSettings::default()
        };
        let labels = build_pod(&r, &settings)
            .unwrap()
            .metadata
            .labels
            .unwrap_or_default();
        assert_eq!(
            labels.get(crate::shard::SHARD_LABEL),
            Some(&crate::shard::shard_of(&uid, 32).to_string())
        );
    }

    #[test]
    fn the_operators_pull_secrets_follow_the_runs_own_without_duplicates() {
        let mut spec = spec_with_paths(&["/out"]);
        spec.image_pull_secrets = vec!["team".into(), "mirror".into()];
        let settings = PodSettings {
            image_pull_secrets: vec!["mirror".into(), "holder-registry".into()],
            ..PodSettings::default()
        };
        let pod = build_pod(&run(spec), &settings).unwrap();
        let names: Vec<String> = pod
            .spec
            .unwrap()
            .image_pull_secrets
            .unwrap_or_default()
            .into_iter()
            .map(|r| r.name)
            .collect();
        assert_eq!(names, ["team", "mirror", "holder-registry"]);
        let bare = build_pod(&run(spec_with_paths(&["/out"])), &PodSettings::default()).unwrap();
        assert_eq!(bare.spec.unwrap().image_pull_secrets, None);
    }

    #[test]
    fn the_operators_pull_secrets_never_pull_a_workload_from_the_holders_registry() {
        let names = |image: &str, serve_workloads: bool| -> Vec<String> {
            let mut spec = spec_with_paths(&["/out"]);
            spec.image = Some(image.into());
            spec.image_pull_secrets = vec!["team".into()];
            let settings = PodSettings {
                image_pull_secrets: vec!["holder-registry".into()],
                image_pull_secrets_serve_workloads: serve_workloads,
                ..PodSettings::default()
            };
            let pod = build_pod(&run(spec), &settings).unwrap();
            let secrets = pod.spec.unwrap().image_pull_secrets.unwrap_or_default();
            secrets.into_iter().map(|r| r.name).collect()
        };
        // The default holder image is on ghcr.io.
        assert_eq!(names("ghcr.io/iterion/internal:1", false), ["team"]);
        assert_eq!(
            names("ghcr.io/iterion/internal:1", true),
            ["team", "holder-registry"]
        );
        assert_eq!(names("busybox:1.37", false), ["team", "holder-registry"]);
    }

    #[test]
    fn pod_is_restricted_owned_and_has_no_active_deadline() {
        let mut spec = spec_with_paths(&["/out"]);
        spec.active_deadline_seconds = Some(10);
        let r = run(spec);
        let pod = build_pod(&r, &PodSettings::default()).unwrap();
        let ps = pod.spec.as_ref().unwrap();
        assert_eq!(ps.restart_policy.as_deref(), Some("Never"));
        assert_eq!(ps.automount_service_account_token, Some(false));
        assert_eq!(ps.active_deadline_seconds, None);
        let sc = ps.security_context.as_ref().unwrap();
        assert_eq!(sc.run_as_user, Some(1000));
        assert_eq!(sc.run_as_group, Some(3000));
        assert_eq!(sc.fs_group, Some(3000));
        assert_eq!(sc.run_as_non_root, Some(true));
        assert_eq!(sc.seccomp_profile.as_ref().unwrap().type_, "RuntimeDefault");
        for c in &ps.containers {
            let csc = c.security_context.as_ref().unwrap();
            assert_eq!(csc.allow_privilege_escalation, Some(false));
            assert_eq!(
                csc.capabilities.as_ref().unwrap().drop,
                Some(vec!["ALL".to_string()])
            );
        }
        assert!(crate::identity::owned_by(&pod, &r));
        assert_eq!(pod.metadata.name.as_deref(), Some("demo-sbr"));
        assert_eq!(
            ps.termination_grace_period_seconds,
            Some(300 + GRACE_MARGIN_SECONDS)
        );
    }

    #[test]
    fn no_command_is_a_long_lived_sandbox_that_idles() {
        let mut spec = spec_with_paths(&["/out"]);
        spec.command = None;
        let pod = build_pod(&run(spec), &PodSettings::default()).unwrap();
        let w = container(&pod, WORKLOAD_CONTAINER);
        assert_eq!(
            w.command,
            Some(vec!["sleep".to_string(), "infinity".to_string()])
        );
    }

    #[test]
    fn drain_timeout_sets_the_grace_period() {
        let mut spec = spec_with_paths(&["/out"]);
        spec.read_back.as_mut().unwrap().drain_timeout = Some("2m".into());
        let pod = build_pod(&run(spec), &PodSettings::default()).unwrap();
        assert_eq!(
            pod.spec.as_ref().unwrap().termination_grace_period_seconds,
            Some(120 + GRACE_MARGIN_SECONDS)
        );
    }

    #[test]
    fn unservable_specs_are_refused_not_half_served() {
        let mut spec = spec_with_paths(&["/out"]);
        spec.mounts.push(Mount {
            name: "host".into(),
            kind: MountType::Bind,
            source: Some("/etc".into()),
            target: "/host".into(),
            read_only: true,
        });
        assert!(matches!(
            build_pod(&run(spec), &PodSettings::default()),
            Err(BuildError::UnservableMount { .. })
        ));
        let mut spec = spec_with_paths(&["/out"]);
        spec.user = Some("0".into());
        assert!(matches!(
            build_pod(&run(spec), &PodSettings::default()),
            Err(BuildError::BadUser(_))
        ));
        let mut spec = spec_with_paths(&["/out"]);
        spec.image = Some(" ".into());
        assert_eq!(
            build_pod(&run(spec), &PodSettings::default()),
            Err(BuildError::MissingImage)
        );
    }

    /// Issue #38: `/../usr/local/bin` (admitted by the CRD's old pattern, refused only by the
    /// webhook) became the holder's mount `/sandboxrun-readback/../usr/local/bin`, over its own
    /// binary. The builder refuses every unclean path itself, read-back paths and mount targets.
    #[test]
    fn a_path_that_is_not_clean_and_absolute_is_never_mounted() {
        for bad in [
            "/../usr/local/bin",
            "/out/../..",
            "/./out",
            "/a//b",
            "/out/",
            "out",
            "/",
        ] {
            let spec = spec_with_paths(&[bad]);
            let built = build_pod(&run(spec), &PodSettings::default());
            assert!(
                matches!(&built, Err(BuildError::UncleanPath { field, .. }) if field == "spec.readBack.paths[0].path"),
                "read-back path {bad:?}: {built:?}"
            );
            let mut spec = spec_with_paths(&["/out"]);
            spec.mounts.push(Mount {
                name: "scratch".into(),
                kind: MountType::EmptyDir,
                source: None,
                target: bad.into(),
                read_only: false,
            });
            let built = build_pod(&run(spec), &PodSettings::default());
            assert!(
                matches!(&built, Err(BuildError::UncleanPath { field, .. }) if field == "spec.mounts[0].target"),
                "mount target {bad:?}: {built:?}"
            );
        }
        let holder_mounts = |pod: &Pod| -> Vec<String> {
            let spec = pod
                .spec
                .as_ref()
                .map(|s| s.containers.clone())
                .unwrap_or_default();
            spec.iter()
                .flat_map(|c| c.volume_mounts.clone().unwrap_or_default())
                .map(|m| m.mount_path)
                .collect()
        };
        let pod = build_pod(
            &run(spec_with_paths(&["/work/out"])),
            &PodSettings::default(),
        )
        .expect("a clean path builds");
        assert!(holder_mounts(&pod).iter().all(|p| !p.contains("/..")));
    }

    #[test]
    fn user_mounts_are_served_by_their_volume_types() {
        let mut spec = spec_with_paths(&["/out"]);
        spec.mounts = vec![
            Mount {
                name: "cfg".into(),
                kind: MountType::ConfigMap,
                source: Some("my-cm".into()),
                target: "/etc/cfg".into(),
                read_only: true,
            },
            Mount {
                name: "data".into(),
                kind: MountType::PersistentVolumeClaim,
                source: Some("claim".into()),
                target: "/data".into(),
                read_only: false,
            },
        ];
        let pod = build_pod(&run(spec), &PodSettings::default()).unwrap();
        let vols = pod.spec.as_ref().unwrap().volumes.as_ref().unwrap();
        assert_eq!(vols[0].config_map.as_ref().unwrap().name, "my-cm");
        assert_eq!(
            vols[1].persistent_volume_claim.as_ref().unwrap().claim_name,
            "claim"
        );
        let w = container(&pod, WORKLOAD_CONTAINER);
        let targets: Vec<_> = w
            .volume_mounts
            .iter()
            .flatten()
            .map(|m| m.mount_path.as_str())
            .collect();
        assert_eq!(targets, ["/etc/cfg", "/data", "/out"]);
    }

    fn holder_resources_of(settings: &PodSettings) -> ResourceRequirements {
        let pod = build_pod(&run(spec_with_paths(&["/out"])), settings).unwrap();
        container(&pod, HOLDER_CONTAINER).resources.clone().unwrap()
    }

    fn quantities(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, Quantity>> {
        Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                .collect(),
        )
    }

    #[test]
    fn the_holder_gets_exactly_the_configured_resources() {
        // Defaults: today's values, and no CPU limit.
        let r = holder_resources_of(&PodSettings::default());
        assert_eq!(
            r.requests,
            quantities(&[("cpu", "10m"), ("memory", "16Mi")])
        );
        assert_eq!(r.limits, quantities(&[("memory", "128Mi")]));

        // Configured: exactly those values, a CPU limit included, nothing else.
        let settings = PodSettings {
            holder_resources: HolderResources::parse("50m", "32Mi", Some("200m"), "64Mi").unwrap(),
            ..PodSettings::default()
        };
        let r = holder_resources_of(&settings);
        assert_eq!(
            r.requests,
            quantities(&[("cpu", "50m"), ("memory", "32Mi")])
        );
        assert_eq!(r.limits, quantities(&[("cpu", "200m"), ("memory", "64Mi")]));
        assert_eq!(r.claims, None);
        // The workload's resources stay the run's own.
        let pod = build_pod(&run(spec_with_paths(&["/out"])), &settings).unwrap();
        assert_eq!(container(&pod, WORKLOAD_CONTAINER).resources, None);
    }

    #[test]
    fn the_drain_timeout_never_exceeds_the_operator_maximum() {
        let settings = PodSettings {
            default_drain_timeout_seconds: 300,
            max_drain_timeout_seconds: 600,
            ..PodSettings::default()
        };
        let with = |t: Option<&str>| {
            let mut spec = spec_with_paths(&["/out"]);
            if let Some(rb) = spec.read_back.as_mut() {
                rb.drain_timeout = t.map(str::to_string);
            }
            drain_timeout_seconds(&run(spec), &settings).expect("timeout")
        };
        assert_eq!(with(None), 300);
        assert_eq!(with(Some("2m")), 120);
        assert_eq!(with(Some("10m")), 600);
        assert_eq!(with(Some("3h")), 600, "held to --max-drain-timeout");
    }

    #[test]
    fn a_holder_cpu_limit_appears_only_when_set() {
        for unset in [None, Some(""), Some("  ")] {
            let settings = PodSettings {
                holder_resources: HolderResources::parse("10m", "16Mi", unset, "128Mi").unwrap(),
                ..PodSettings::default()
            };
            let limits = holder_resources_of(&settings).limits.unwrap();
            assert!(!limits.contains_key("cpu"), "{unset:?} set a CPU limit");
            assert_eq!(limits.get("memory"), Some(&Quantity("128Mi".into())));
        }
        // Every entry left empty: no maps at all, rather than empty ones.
        let settings = PodSettings {
            holder_resources: HolderResources::parse("", "", None, "").unwrap(),
            ..PodSettings::default()
        };
        let r = holder_resources_of(&settings);
        assert_eq!((r.requests, r.limits), (None, None));
    }

    #[test]
    fn short_hash_is_stable_and_short() {
        // Stable across calls and across releases (a long run's pod name is built with it, and
        // a new operator must find the pods an old one created): the first 4 bytes of sha256.
        assert_eq!(crate::names::short_hash("a"), "ca978112");
        assert_eq!(crate::names::short_hash(""), "e3b0c442");
        let inputs = ["a", "b", "", "run-1", "run-2", "ünïcode", &"x".repeat(300)];
        let hashes: Vec<String> = inputs.iter().map(|t| crate::names::short_hash(t)).collect();
        for (text, hash) in inputs.iter().zip(&hashes) {
            assert_eq!(&crate::names::short_hash(text), hash, "{text}");
            assert_eq!(hash.len(), 8, "{text}");
            assert!(
                hash.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
                "{hash} is not lower-case hex"
            );
        }
        let mut distinct = hashes.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), hashes.len(), "{hashes:?}");
    }

    #[test]
    fn holder_resources_must_be_quantities_with_requests_within_limits() {
        // The quantity grammar itself is tested in `crate::units`.
        assert_eq!(
            HolderResources::parse("10m", "16MB", None, "128Mi"),
            Err(HolderResourcesError::NotAQuantity {
                flag: "--holder-memory-request",
                value: "16MB".into()
            })
        );
        assert!(matches!(
            HolderResources::parse("10m", "16Mi", Some("one"), "128Mi"),
            Err(HolderResourcesError::NotAQuantity {
                flag: "--holder-cpu-limit",
                ..
            })
        ));
        assert_eq!(
            HolderResources::parse("1", "16Mi", Some("500m"), "128Mi"),
            Err(HolderResourcesError::RequestAboveLimit {
                resource: "cpu",
                request: "1".into(),
                limit: "500m".into()
            })
        );
        assert!(matches!(
            HolderResources::parse("10m", "1Gi", None, "128Mi"),
            Err(HolderResourcesError::RequestAboveLimit {
                resource: "memory",
                ..
            })
        ));
        // Equal is fine, in any notation.
        assert!(HolderResources::parse("1", "128Mi", Some("1000m"), "134217728").is_ok());
        assert_eq!(
            HolderResources::parse(
                DEFAULT_HOLDER_CPU_REQUEST,
                DEFAULT_HOLDER_MEMORY_REQUEST,
                None,
                DEFAULT_HOLDER_MEMORY_LIMIT
            ),
            Ok(HolderResources::default())
        );
    }

    #[test]
    fn the_workload_falls_back_to_its_logs_for_a_termination_message() {
        let pod = build_pod(&run(spec_with_paths(&["/out"])), &PodSettings::default()).unwrap();
        assert_eq!(
            container(&pod, WORKLOAD_CONTAINER)
                .termination_message_policy
                .as_deref(),
            Some("FallbackToLogsOnError")
        );
        // The holder is ours: its own default policy.
        assert_eq!(
            container(&pod, HOLDER_CONTAINER).termination_message_policy,
            None
        );
    }

    #[test]
    fn long_names_still_give_a_valid_pod_name() {
        let long = "a".repeat(253);
        let name = pod_name(&long);
        assert!(name.len() <= 253, "{}", name.len());
        assert_ne!(pod_name(&long), pod_name(&format!("{}b", "a".repeat(252))));
    }
}
