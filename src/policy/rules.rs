//! The ADR-006 rule engine: spec + settings → findings. Pure: no client, no clock, no network.
//!
//! Both front doors — the validating webhook and `doctor --strict` — call [`check`] and print the
//! same [`Finding`]s (one rule engine, two front doors); the webhook also runs
//! [`check_update`], and on UPDATE only as far as [`super::ratchet`] decides (a spec admitted once
//! is not re-judged).
//! Every finding carries a remediation hint (ADR-006 Context: "a per-failure remediation hint").
//!
//! Rule ids are stable: scripts and the test corpus (`tests/admission-corpus/`) match on them.

use crate::names::{is_dns1123_label, is_dns1123_subdomain, is_label_value, is_qualified_name};
use std::cmp::Ordering;
use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde::Serialize;

use crate::api::{
    parse_user, HostState, Mount, MountType, NetworkMode, ReadBackPath, RetryRule, SandboxRunSpec,
    MAX_READBACK_PATHS, MAX_RETRY_BACKOFF_SECONDS, MAX_RETRY_LIMIT, MAX_RETRY_RULES,
    MAX_RETRY_RULE_VALUES, MAX_TTL_SECONDS_AFTER_FINISHED,
};
use crate::caps::CapSettings;
use crate::egress::network::{Rule, RuleError};
use crate::units::{parse_duration, quantity_to_bytes};

/// How bad a finding is. Only `Fail` denies admission or makes `doctor --strict` exit 1;
/// warnings never change the verdict (ADR-006 §4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// The run cannot be served as written.
    Fail,
    /// The run can be served, but probably not as intended.
    Warn,
}

/// One result of a rule: what is wrong, where, and what to do about it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// Stable rule id, e.g. `image-required`.
    pub rule: &'static str,
    /// Fail or warn.
    pub severity: Severity,
    /// JSON-path-like location in the object, e.g. `spec.readBack.paths[1].path`.
    pub field: String,
    /// What is wrong, quoting the offending value.
    pub message: String,
    /// Remediation.
    pub hint: String,
}

impl Finding {
    /// A failing finding.
    pub fn fail(
        rule: &'static str,
        field: impl Into<String>,
        message: impl Into<String>,
        hint: impl Into<String>,
    ) -> Self {
        Finding {
            rule,
            severity: Severity::Fail,
            field: field.into(),
            message: message.into(),
            hint: hint.into(),
        }
    }

    /// A warning.
    pub fn warn(
        rule: &'static str,
        field: impl Into<String>,
        message: impl Into<String>,
        hint: impl Into<String>,
    ) -> Self {
        Finding {
            rule,
            severity: Severity::Warn,
            field: field.into(),
            message: message.into(),
            hint: hint.into(),
        }
    }

    /// Whether this finding fails the object.
    pub fn is_fail(&self) -> bool {
        self.severity == Severity::Fail
    }
}

/// Operator settings the rules depend on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleSettings {
    /// Read-back caps: a `sizeLimit` above `caps.max_bytes` is refused.
    pub caps: CapSettings,
    /// The longest `drainTimeout` a run may ask for (`run --max-drain-timeout`); None: no maximum.
    pub max_drain_timeout: Option<Duration>,
    /// Whether this cluster enforces NetworkPolicy (`run --network-policy`): when it does not, a
    /// run that restricts egress is warned (the controller refuses or warns again at start).
    pub network_policy: crate::egress::PolicyEnforcement,
    /// The cluster's run policy: the runtime classes, priority classes and toleration keys runs
    /// may ask for (`super::run_policy`).
    pub policy: super::run_policy::RunPolicy,
    /// The platform's namespace policies (`run --namespace-policies`): judged with the labels of
    /// the run's namespace, so by the webhook and `doctor` beside [`check`], not inside it.
    pub namespace_policies: Vec<super::namespace_policy::Compiled>,
}

/// The operator's default `--max-drain-timeout` (1h): `doctor` judges with it, so the offline
/// verdict matches a webhook running with default flags.
pub(crate) const DEFAULT_MAX_DRAIN_TIMEOUT: Duration = Duration::from_secs(3600);

impl Default for RuleSettings {
    /// The settings of an operator started with default flags.
    fn default() -> Self {
        RuleSettings {
            caps: CapSettings::default(),
            max_drain_timeout: Some(DEFAULT_MAX_DRAIN_TIMEOUT),
            network_policy: crate::egress::PolicyEnforcement::Enforced,
            policy: super::run_policy::RunPolicy::default(),
            namespace_policies: Vec::new(),
        }
    }
}

/// Stable rule ids.
pub mod ids {
    /// `spec.image` missing or empty.
    pub(crate) const IMAGE_REQUIRED: &str = "image-required";
    /// `spec.build` present.
    pub(crate) const BUILD_LOCAL_ONLY: &str = "build-local-only";
    /// Image not pinned by digest (warn).
    pub(crate) const IMAGE_DIGEST: &str = "image-digest";
    /// Image manifest lookup (opt-in `--check-images`).
    pub(crate) const IMAGE_RESOLVABLE: &str = "image-resolvable";
    /// `hostState: auto`.
    pub(crate) const HOST_STATE_AUTO: &str = "host-state-auto";
    /// `spec.user` missing.
    pub(crate) const USER_REQUIRED: &str = "user-required";
    /// `spec.user` not `uid` / `uid:gid`.
    pub(crate) const USER_NUMERIC: &str = "user-numeric";
    /// uid 0.
    pub(crate) const USER_NON_ROOT: &str = "user-non-root";
    /// A network rule does not parse.
    pub(crate) const NETWORK_RULE: &str = "network-rule";
    /// A CIDR with host bits set (warn).
    pub(crate) const NETWORK_CIDR_HOST_BITS: &str = "network-cidr-host-bits";
    /// `open` mode (warn).
    pub(crate) const NETWORK_OPEN: &str = "network-open";
    /// `open` mode with rules (warn).
    pub(crate) const NETWORK_RULES_IGNORED: &str = "network-rules-ignored";
    /// `allowlist` without rules: every host denied (warn).
    pub(crate) const NETWORK_ALLOWLIST_EMPTY: &str = "network-allowlist-empty";
    /// Egress restricted while the operator declares NetworkPolicy unenforced (warn).
    pub(crate) const NETWORK_UNENFORCED: &str = "network-unenforced";
    /// `type: bind`.
    pub(crate) const MOUNT_BIND: &str = "mount-bind";
    /// Mount target not absolute / normalized / allowed.
    pub(crate) const MOUNT_TARGET: &str = "mount-target";
    /// Two mounts at one target.
    pub(crate) const MOUNT_TARGET_DUPLICATE: &str = "mount-target-duplicate";
    /// Mount name not a DNS-1123 label.
    pub(crate) const MOUNT_NAME: &str = "mount-name";
    /// Two mounts with one name.
    pub(crate) const MOUNT_NAME_DUPLICATE: &str = "mount-name-duplicate";
    /// configMap / secret / persistentVolumeClaim without `source`.
    pub(crate) const MOUNT_SOURCE: &str = "mount-source";
    /// A mount at, above or below a read-back path.
    pub(crate) const MOUNT_SHADOWS_READ_BACK: &str = "mount-shadows-read-back";
    /// Read-back path not absolute / normalized / allowed.
    pub(crate) const READ_BACK_PATH: &str = "read-back-path";
    /// A read-back path declared twice.
    pub(crate) const READ_BACK_DUPLICATE: &str = "read-back-duplicate";
    /// A read-back path inside another.
    pub(crate) const READ_BACK_NESTED: &str = "read-back-nested";
    /// More than 16 read-back paths.
    pub(crate) const READ_BACK_COUNT: &str = "read-back-count";
    /// `sizeLimit` not a quantity, zero, or above the operator maximum.
    pub(crate) const READ_BACK_SIZE_LIMIT: &str = "read-back-size-limit";
    /// `drainTimeout` does not parse or is not positive.
    pub(crate) const READ_BACK_DRAIN_TIMEOUT: &str = "read-back-drain-timeout";
    /// `spec.ttlSecondsAfterFinished` negative or above a year.
    pub(crate) const TTL_AFTER_FINISHED: &str = "ttl-after-finished";
    /// `spec.retryPolicy` out of its bounds: a limit above 100, a backoff above a day, a rule
    /// naming no matcher or both, an exit code outside 0..=255, too many rules or values.
    pub(crate) const RETRY_POLICY: &str = "retry-policy";
    /// On UPDATE with a pod: a field other than `stop` changed.
    pub(crate) const UPDATE_IMMUTABLE: &str = "update-immutable";
    /// `spec.workspace.from` names both an attempt and a checkpoint.
    pub(crate) const WORKSPACE_FROM: &str = "workspace-from";
    /// `stop` went from true back to false.
    pub(crate) const UPDATE_STOP_FINAL: &str = "update-stop-final";
    /// `runtimeClassName` not a DNS-1123 subdomain.
    pub(crate) const RUNTIME_CLASS_NAME: &str = "runtime-class-name";
    /// `runtimeClassName`, `priorityClassName` or a toleration key outside the cluster's run
    /// policy (`--allowed-runtime-classes`, …; `super::super::run_policy`).
    pub(crate) const RUN_POLICY: &str = "run-policy";
    /// A run in a namespace the operator does not watch (`run --namespaces`): refused by the
    /// webhook, reported by `doctor --context`; nothing would ever run it.
    pub(crate) const NAMESPACE_NOT_WATCHED: &str = "namespace-not-watched";
    /// `serviceAccountName` not a DNS-1123 subdomain.
    pub(crate) const SERVICE_ACCOUNT_NAME: &str = "service-account-name";
    /// A pod label or annotation with a malformed or reserved key, or a malformed label value.
    pub(crate) const POD_METADATA: &str = "pod-metadata";
    /// An env entry with both `value` and `valueFrom`, or a `valueFrom` without exactly one
    /// complete reference.
    pub(crate) const ENV_VALUE_FROM: &str = "env-value-from";
    /// `doctor` only: a field the CRD's structural schema does not know (the apiserver rejects or
    /// prunes it before the webhook; see [`crate::doctor::schema`]).
    pub(crate) const UNKNOWN_FIELD: &str = "unknown-field";
    /// A field whose value is outside its type or its enum in the CRD schema (doctor only: the
    /// apiserver refuses it before admission).
    pub(crate) const INVALID_VALUE: &str = "invalid-value";
    /// `doctor` only: a SandboxRun-like document whose apiVersion or kind the cluster does not
    /// serve as a SandboxRun.
    pub(crate) const API_VERSION_KIND: &str = "api-version-kind";
    /// `doctor --context`: the SandboxRun CRD is missing, does not serve our version, or is not
    /// Established (a probe: warn, fail under `--require-context`).
    pub(crate) const CLUSTER_CRD: &str = "cluster-crd";
    /// `doctor --context`: a webhook that would judge the run has no caBundle or no endpoint
    /// serving, or none would judge it (a probe).
    pub(crate) const CLUSTER_WEBHOOK: &str = "cluster-webhook";
    /// `doctor --context`: the operator is not running or not Ready (a probe).
    pub(crate) const CLUSTER_OPERATOR: &str = "cluster-operator";
    /// `doctor --context`: the operator's published settings cannot be read (a probe).
    pub(crate) const CLUSTER_SETTINGS: &str = "cluster-settings";
    /// `doctor --context`: a probe could not be made (timeout, forbidden, unreachable).
    pub(crate) const CLUSTER_PROBE: &str = "cluster-probe";
    /// `doctor --context`: the cluster refused the manifest in a server-side dry run.
    pub(crate) const DRY_RUN: &str = "dry-run";
    /// A run made from a SandboxRunTemplate sets a field the template locks (docs/contract.md
    /// "Templates").
    pub(crate) const TEMPLATE_LOCKED: &str = "template-locked";
    /// The SandboxRunTemplate a run names does not exist, cannot be read or is invalid.
    pub(crate) const TEMPLATE_UNUSABLE: &str = "template-unusable";
    /// `doctor --context`: an object the run's pod needs (Secret, ConfigMap, PVC, ServiceAccount,
    /// PriorityClass, RuntimeClass, the namespace) is neither in the cluster nor in the manifests.
    pub(crate) const REFERENCE_MISSING: &str = "reference-missing";
    /// `doctor --context`: the store the run would drain into cannot be used as the operator
    /// judges it (its store ConfigMap or Secret missing, an endpoint or a Secret name the
    /// platform refuses, a description a tenant store may not have): the run would be held
    /// with no pod (`StoreUnusable`) or refused.
    pub(crate) const STORE_UNUSABLE: &str = "store-unusable";
}

/// How many failing rules [`refusals`] spells out.
const REFUSALS_SHOWN: usize = 3;

/// The rules' refusal of `spec` in words, for an operator that judges on its own (a held run, a
/// pool's template): each failing rule with its field, message and hint, the first
/// [`REFUSALS_SHOWN`] of them, then how many more; None when no rule fails.
pub fn refusals(spec: &SandboxRunSpec, settings: &RuleSettings) -> Option<String> {
    let fails: Vec<_> = check(spec, settings)
        .into_iter()
        .filter(|f| f.is_fail())
        .collect();
    if fails.is_empty() {
        return None;
    }
    let shown: Vec<String> = fails
        .iter()
        .take(REFUSALS_SHOWN)
        .map(|f| {
            format!(
                "rule {} at {}: {} (hint: {})",
                f.rule, f.field, f.message, f.hint
            )
        })
        .collect();
    let more = match fails.len().saturating_sub(REFUSALS_SHOWN) {
        0 => String::new(),
        n => format!("; and {n} more (`sandboxrun-operator doctor --strict` lists them)"),
    };
    Some(format!("{}{more}", shown.join("; ")))
}

/// Checks a spec against every ADR-006 rule. Findings are sorted (see [`sort_findings`]).
pub fn check(spec: &SandboxRunSpec, settings: &RuleSettings) -> Vec<Finding> {
    let mut out = Vec::new();
    check_image(spec, &mut out);
    check_host_state(spec, &mut out);
    check_user(spec, &mut out);
    check_network(spec, &mut out);
    check_network_enforcement(spec, settings, &mut out);
    check_read_back(spec, settings, &mut out);
    check_mounts(spec, &mut out);
    check_ttl(spec, &mut out);
    check_retry_policy(spec, &mut out);
    check_pod_passthrough(spec, &mut out);
    for v in super::run_policy::violations(spec, &settings.policy) {
        out.push(Finding::fail(ids::RUN_POLICY, v.field, v.message, v.hint));
    }
    check_env(spec, &mut out);
    check_workspace_from(spec, &mut out);
    sort_findings(&mut out);
    out
}

/// docs/contract.md "Pause, resume and fork": a fork starts from one generation of its source,
/// an attempt or a checkpoint, never both (the operator refuses it on its own too).
fn check_workspace_from(spec: &SandboxRunSpec, out: &mut Vec<Finding>) {
    let from = spec.workspace.as_ref().and_then(|w| w.from.as_ref());
    if from.is_some_and(|f| f.attempt.is_some() && f.checkpoint.is_some()) {
        out.push(Finding::fail(
            ids::WORKSPACE_FROM,
            "spec.workspace.from",
            "spec.workspace.from names both an attempt and a checkpoint; a fork starts from one",
            "keep one of attempt and checkpoint",
        ));
    }
}

/// The refusal of a run bound for `namespace` when the operator watches only `watched` (empty:
/// every namespace) and not it: the run would sit with no status for ever.
pub fn unwatched_namespace(namespace: Option<&str>, watched: &[String]) -> Option<Finding> {
    let ns = namespace?;
    if watched.is_empty() || watched.iter().any(|w| w == ns) {
        return None;
    }
    Some(Finding::fail(
        ids::NAMESPACE_NOT_WATCHED,
        "metadata.namespace",
        format!(
            "namespace {ns} is not watched by the operator (it watches {}): nothing would ever \
             run this SandboxRun",
            watched.join(", ")
        ),
        format!(
            "create it in one of {}, or add {ns} to the chart's watchNamespaces (the operator's \
             --namespaces)",
            watched.join(", ")
        ),
    ))
}

/// Rules that compare the stored object with the update (ADR-006 applies to the spec a run
/// *would use*; once the pod exists, that spec is fixed). `pod_exists`: the status names a pod.
pub fn check_update(old: &SandboxRunSpec, new: &SandboxRunSpec, pod_exists: bool) -> Vec<Finding> {
    let mut out = Vec::new();
    if old.stop && !new.stop {
        out.push(Finding::fail(
            ids::UPDATE_STOP_FINAL,
            "spec.stop",
            "stop went from true back to false; teardown cannot be undone",
            "leave stop: true; to run again, create a new SandboxRun",
        ));
    }
    // docs/contract.md "Pause, resume and fork": a fork's source is fixed at creation.
    let from = |s: &SandboxRunSpec| s.workspace.as_ref().and_then(|w| w.from.clone());
    if from(old) != from(new) {
        out.push(Finding::fail(
            ids::UPDATE_IMMUTABLE,
            "spec.workspace.from",
            "spec.workspace.from changed after the run was created; a fork's source is fixed at creation",
            "create a new SandboxRun with the workspace.from you want",
        ));
    }
    if pod_exists {
        // The pod is built once from the spec; changing it afterwards would make the object lie
        // about what runs. Compare everything but `stop`, `suspend` and `checkpoint` (which act on
        // the pod, they do not reshape it) field by field to name what changed.
        // What happens after the end (`ttlSecondsAfterFinished`, `readBack.retention`) does not
        // shape the pod and may change, as a Job's TTL may.
        let as_map = |s: &SandboxRunSpec| -> BTreeMap<String, serde_json::Value> {
            let mut s = s.clone();
            s.stop = false;
            s.suspend = false;
            s.checkpoint = None;
            // docs/contract.md "Pause, resume and fork": it acts on the next attempt's start.
            s.workspace = None;
            s.ttl_seconds_after_finished = None;
            if let Some(rb) = s.read_back.as_mut() {
                rb.retention = None;
            }
            match serde_json::to_value(&s) {
                Ok(serde_json::Value::Object(m)) => m.into_iter().collect(),
                _ => BTreeMap::new(),
            }
        };
        let (before, after) = (as_map(old), as_map(new));
        let keys: std::collections::BTreeSet<&String> = before.keys().chain(after.keys()).collect();
        for key in keys {
            if before.get(key) != after.get(key) {
                out.push(Finding::fail(
                    ids::UPDATE_IMMUTABLE,
                    format!("spec.{key}"),
                    format!("spec.{key} changed after the run's pod was created; only spec.stop, spec.ttlSecondsAfterFinished and spec.readBack.retention may change now"),
                    "delete and re-create the run (set stop: true to tear this one down first)",
                ));
            }
        }
    }
    sort_findings(&mut out);
    out
}

/// Sorts findings deterministically: by field (numbers inside `[..]` compared as numbers), then
/// fails before warnings, then rule id and message.
pub(crate) fn sort_findings(findings: &mut [Finding]) {
    findings.sort_by(|a, b| {
        natural_cmp(&a.field, &b.field)
            .then(a.severity.cmp(&b.severity))
            .then(a.rule.cmp(b.rule))
            .then(a.message.cmp(&b.message))
    });
}

fn natural_cmp(a: &str, b: &str) -> Ordering {
    fn chunks(s: &str) -> Vec<(bool, &str)> {
        let mut out = Vec::new();
        let mut start = 0;
        let bytes = s.as_bytes();
        for i in 1..=bytes.len() {
            if i == bytes.len() || bytes[i].is_ascii_digit() != bytes[start].is_ascii_digit() {
                out.push((bytes[start].is_ascii_digit(), &s[start..i]));
                start = i;
            }
        }
        out
    }
    let (ca, cb) = (chunks(a), chunks(b));
    for (x, y) in ca.iter().zip(cb.iter()) {
        let ord = match (x, y) {
            ((true, n), (true, m)) => n.len().cmp(&m.len()).then(n.cmp(m)),
            ((_, s), (_, t)) => s.cmp(t),
        };
        if ord != Ordering::Equal {
            return ord;
        }
    }
    ca.len().cmp(&cb.len())
}

// ---- 1. image / build ------------------------------------------------------------------------

fn check_image(spec: &SandboxRunSpec, out: &mut Vec<Finding>) {
    if spec.build.is_some() {
        out.push(Finding::fail(
            ids::BUILD_LOCAL_ONLY,
            "spec.build",
            "build is local-only; a pod cannot build its image",
            "reference a pre-built image in spec.image, pin it by digest (repo@sha256:...), and remove spec.build",
        ));
    }
    match spec.image.as_deref().map(str::trim) {
        None | Some("") => out.push(Finding::fail(
            ids::IMAGE_REQUIRED,
            "spec.image",
            "spec.image is required: a pod needs a container image",
            "set spec.image to a pre-built image, pinned by digest (repo@sha256:<64 hex>)",
        )),
        Some(image) if !is_digest_pinned(image) => out.push(Finding::warn(
            ids::IMAGE_DIGEST,
            "spec.image",
            format!("image `{image}` is not pinned by digest; the tag may move between runs"),
            "pin it: repo@sha256:<64 hex> (e.g. from `crane digest` or `docker buildx imagetools inspect`)",
        )),
        Some(_) => {}
    }
}

/// Whether the reference ends in `@sha256:` followed by 64 lowercase hex digits.
pub(crate) fn is_digest_pinned(image: &str) -> bool {
    image.rsplit_once("@sha256:").is_some_and(|(repo, hex)| {
        !repo.is_empty()
            && hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

// ---- 2. host state ---------------------------------------------------------------------------

fn check_host_state(spec: &SandboxRunSpec, out: &mut Vec<Finding>) {
    if spec.host_state == Some(HostState::Auto) {
        out.push(Finding::fail(
            ids::HOST_STATE_AUTO,
            "spec.hostState",
            "hostState: auto cannot be served: a pod has no host filesystem to share",
            "set hostState: none, or leave it unset",
        ));
    }
}

// ---- 3. user ---------------------------------------------------------------------------------

fn check_user(spec: &SandboxRunSpec, out: &mut Vec<Finding>) {
    // ADR-006 §3: a numeric user is a cloud constraint — runAsNonRoot is enforced on the pod and
    // the image's USER is not introspected, so the uid must be known from the spec alone.
    let Some(user) = spec.user.as_deref() else {
        out.push(Finding::fail(
            ids::USER_REQUIRED,
            "spec.user",
            "spec.user is required: the pod runs as non-root and the image's USER is not introspected",
            "set spec.user to a numeric uid or uid:gid, e.g. \"1000\" or \"1000:1000\"",
        ));
        return;
    };
    match parse_user(user) {
        None => out.push(Finding::fail(
            ids::USER_NUMERIC,
            "spec.user",
            format!("user `{user}` is not a numeric uid or uid:gid"),
            "use the numeric id, e.g. \"1000\" or \"1000:1000\" (names are not resolved on a pod)",
        )),
        Some((0, _)) => out.push(Finding::fail(
            ids::USER_NON_ROOT,
            "spec.user",
            format!("user `{user}` is root (uid 0); the pod enforces runAsNonRoot"),
            "run as an unprivileged uid, e.g. \"1000\"",
        )),
        Some(_) => {}
    }
}

// ---- 4. network ------------------------------------------------------------------------------

fn check_network(spec: &SandboxRunSpec, out: &mut Vec<Finding>) {
    let Some(net) = &spec.network else { return };
    match net.mode {
        NetworkMode::Open => {
            out.push(Finding::warn(
                ids::NETWORK_OPEN,
                "spec.network.mode",
                "network mode `open`: egress is not filtered",
                "use mode: allowlist with the hosts the workload needs, unless unfiltered egress is intended",
            ));
            if !net.rules.is_empty() {
                out.push(Finding::warn(
                    ids::NETWORK_RULES_IGNORED,
                    "spec.network.rules",
                    format!("{} rule(s) are ignored in mode `open`", net.rules.len()),
                    "remove the rules, or switch to mode: allowlist or denylist for them to apply",
                ));
            }
        }
        NetworkMode::Allowlist if net.rules.is_empty() => out.push(Finding::warn(
            ids::NETWORK_ALLOWLIST_EMPTY,
            "spec.network.rules",
            "mode `allowlist` without rules denies every host",
            "add the hosts the workload needs (e.g. `**.example.com`), or drop spec.network if no egress is wanted",
        )),
        _ => {}
    }
    // Rules are validated in every mode: an `open` policy may be switched to allowlist later.
    for (i, text) in net.rules.iter().enumerate() {
        let field = format!("spec.network.rules[{i}]");
        match Rule::parse(text) {
            Err(e) => out.push(Finding::fail(
                ids::NETWORK_RULE,
                field,
                format!("rule #{i} `{text}` does not parse: {e}"),
                network_hint(&e),
            )),
            Ok(rule) if rule.cidr_host_bits_set() => out.push(Finding::warn(
                ids::NETWORK_CIDR_HOST_BITS,
                field,
                format!("rule #{i} `{text}` has host bits set; it is read as `{rule}`"),
                format!("write the network `{rule}`, or the single address without a prefix"),
            )),
            Ok(_) => {}
        }
    }
}

/// docs/contract.md "ADR-006 network rules: validated and enforced": the restriction is only as
/// good as the cluster's NetworkPolicy enforcement, which the operator is told about.
fn check_network_enforcement(
    spec: &SandboxRunSpec,
    settings: &RuleSettings,
    out: &mut Vec<Finding>,
) {
    use crate::egress::PolicyEnforcement;
    let Some(net) = &spec.network else { return };
    if net.mode == NetworkMode::Open {
        return;
    }
    let consequence = match settings.network_policy {
        PolicyEnforcement::Enforced => return,
        PolicyEnforcement::UnenforcedRefuse => "the run will not start",
        PolicyEnforcement::UnenforcedWarn => "the run starts, but its egress may not be filtered",
    };
    out.push(Finding::warn(
        ids::NETWORK_UNENFORCED,
        "spec.network.mode",
        format!(
            "this cluster declares NetworkPolicy unenforced (--network-policy={}): {consequence}",
            settings.network_policy
        ),
        "ask the cluster admin for a network plugin that enforces NetworkPolicy, or drop spec.network",
    ));
}

fn network_hint(e: &RuleError) -> &'static str {
    match e {
        RuleError::Empty | RuleError::Whitespace => "remove the empty or padded rule; write a host, glob, IP or CIDR",
        RuleError::BareNegation | RuleError::DoubleNegation => "write `!` once, directly before a pattern, e.g. `!ads.example.com`",
        RuleError::BadGlob => "use `*.example.com` (one label), `**.example.com` (one or more labels) or `**` (any host)",
        RuleError::BadHost(..) => "write a bare DNS name (no scheme or path; a port as host:443), an IP literal or a CIDR",
        RuleError::BadCidr(_) => "write addr/prefix with prefix ≤ 32 (IPv4) or ≤ 128 (IPv6), e.g. 10.0.0.0/8",
        RuleError::BadPort(_) => "write host:port with a port from 1 to 65535 on a host-name rule, e.g. api.example.com:443; an IP or CIDR rule covers every port",
    }
}

// ---- 5. mounts -------------------------------------------------------------------------------

fn check_mounts(spec: &SandboxRunSpec, out: &mut Vec<Finding>) {
    let mut names = HashSet::new();
    let mut targets = HashSet::new();
    for (i, m) in spec.mounts.iter().enumerate() {
        let at = |f: &str| format!("spec.mounts[{i}].{f}");
        check_mount_name(m, &at("name"), &mut names, out);
        if m.kind == MountType::Bind {
            out.push(Finding::fail(
                ids::MOUNT_BIND,
                at("type"),
                format!(
                    "mount `{}` is a bind mount; a pod has no host filesystem to offer",
                    m.name
                ),
                "use emptyDir, configMap, secret or persistentVolumeClaim instead",
            ));
        }
        let needs_source = matches!(
            m.kind,
            MountType::ConfigMap | MountType::Secret | MountType::PersistentVolumeClaim
        );
        if needs_source && m.source.as_deref().is_none_or(|s| s.trim().is_empty()) {
            out.push(Finding::fail(
                ids::MOUNT_SOURCE,
                at("source"),
                format!("mount `{}` of type {:?} has no source", m.name, m.kind),
                "set source to the name of the ConfigMap, Secret or PersistentVolumeClaim to mount",
            ));
        }
        if let Err(why) = check_container_path(&m.target) {
            out.push(Finding::fail(
                ids::MOUNT_TARGET,
                at("target"),
                format!("mount target `{}` {why}", m.target),
                "use an absolute, normalized path outside /proc, /sys and /dev, e.g. /data",
            ));
            continue;
        }
        if !targets.insert(m.target.as_str()) {
            out.push(Finding::fail(
                ids::MOUNT_TARGET_DUPLICATE,
                at("target"),
                format!("mount target `{}` is used by an earlier mount", m.target),
                "give every mount its own target",
            ));
        }
        // Each read-back path is served by an emptyDir the operator mounts there (ADR-143 §1); a
        // user mount at, above or below it would shadow that emptyDir or be shadowed by it, and
        // the drain would read the wrong volume.
        for (j, rb) in spec.read_back_paths().iter().enumerate() {
            if check_container_path(&rb.path).is_ok()
                && (is_within(&m.target, &rb.path) || is_within(&rb.path, &m.target))
            {
                out.push(Finding::fail(
                    ids::MOUNT_SHADOWS_READ_BACK,
                    at("target"),
                    format!(
                        "mount target `{}` overlaps read-back path `{}` (spec.readBack.paths[{j}]); it would shadow the emptyDir the drain reads",
                        m.target, rb.path
                    ),
                    "mount elsewhere, or drop the mount: a read-back path already gets its own emptyDir",
                ));
            }
        }
    }
}

fn check_mount_name<'a>(
    m: &'a Mount,
    field: &str,
    names: &mut HashSet<&'a str>,
    out: &mut Vec<Finding>,
) {
    if !is_dns1123_label(&m.name) {
        out.push(Finding::fail(
            ids::MOUNT_NAME,
            field,
            format!("mount name `{}` is not a DNS-1123 label", m.name),
            "use 1-63 lowercase letters, digits and `-`, starting and ending with a letter or digit",
        ));
    } else if !names.insert(m.name.as_str()) {
        out.push(Finding::fail(
            ids::MOUNT_NAME_DUPLICATE,
            field,
            format!("mount name `{}` is used by an earlier mount", m.name),
            "give every mount a unique name",
        ));
    }
}

// ---- 5c. pod passthrough: runtime class, service account, pod labels/annotations, env -------

fn check_pod_passthrough(spec: &SandboxRunSpec, out: &mut Vec<Finding>) {
    if let Some(rc) = &spec.runtime_class_name {
        if !is_dns1123_subdomain(rc) {
            out.push(Finding::fail(
                ids::RUNTIME_CLASS_NAME,
                "spec.runtimeClassName",
                format!("runtimeClassName `{rc}` is not a valid object name"),
                "name an existing RuntimeClass (kubectl get runtimeclass), e.g. gvisor or kata",
            ));
        }
    }
    if let Some(sa) = &spec.service_account_name {
        if !is_dns1123_subdomain(sa) {
            out.push(Finding::fail(
                ids::SERVICE_ACCOUNT_NAME,
                "spec.serviceAccountName",
                format!("serviceAccountName `{sa}` is not a valid object name"),
                "name a ServiceAccount of the run's namespace, or leave it unset for no API token",
            ));
        }
    }
    for (k, v) in spec.pod_labels.iter().flatten() {
        let at = format!("spec.podLabels[{k}]");
        if crate::names::reserved_key(k) {
            out.push(Finding::fail(
                ids::POD_METADATA,
                at,
                format!("pod label `{k}` is reserved for the operator"),
                "use a key of your own, e.g. team.example.com/owner",
            ));
        } else if !is_qualified_name(k) {
            out.push(Finding::fail(
                ids::POD_METADATA,
                at,
                format!("pod label key `{k}` is not a qualified name"),
                "use [prefix/]name: a DNS subdomain prefix, a name of at most 63 of [A-Za-z0-9-_.]",
            ));
        } else if !is_label_value(v) {
            out.push(Finding::fail(
                ids::POD_METADATA,
                at,
                format!("pod label `{k}` has value `{v}`, which is not a label value"),
                "use at most 63 of [A-Za-z0-9-_.], starting and ending alphanumeric, or empty",
            ));
        }
    }
    for k in spec.pod_annotations.iter().flatten().map(|(k, _)| k) {
        let at = format!("spec.podAnnotations[{k}]");
        if k.starts_with(crate::names::RESERVED_PREFIX) {
            out.push(Finding::fail(
                ids::POD_METADATA,
                at,
                format!("pod annotation `{k}` is reserved for the operator"),
                "use a key of your own; to skip a drain, annotate the SandboxRun, not its pod",
            ));
        } else if !is_qualified_name(k) {
            out.push(Finding::fail(
                ids::POD_METADATA,
                at,
                format!("pod annotation key `{k}` is not a qualified name"),
                "use [prefix/]name: a DNS subdomain prefix, a name of at most 63 of [A-Za-z0-9-_.]",
            ));
        }
    }
}

fn check_env(spec: &SandboxRunSpec, out: &mut Vec<Finding>) {
    for (i, e) in spec.env.iter().enumerate() {
        let Some(from) = &e.value_from else { continue };
        let at = format!("spec.env[{i}].valueFrom");
        if !e.value.is_empty() {
            out.push(Finding::fail(
                ids::ENV_VALUE_FROM,
                at.clone(),
                format!("env `{}` sets both value and valueFrom", e.name),
                "keep one: value for a literal, valueFrom for a Secret or ConfigMap key",
            ));
        }
        let refs = [
            from.secret_key_ref
                .as_ref()
                .map(|r| ("secretKeyRef", r.name.as_str(), r.key.as_str())),
            from.config_map_key_ref
                .as_ref()
                .map(|r| ("configMapKeyRef", r.name.as_str(), r.key.as_str())),
        ];
        let set: Vec<_> = refs.iter().flatten().collect();
        match set.as_slice() {
            [(which, name, key)] => {
                if !is_dns1123_subdomain(name) || key.is_empty() {
                    out.push(Finding::fail(
                        ids::ENV_VALUE_FROM,
                        format!("{at}.{which}"),
                        format!(
                            "env `{}` refers to name `{name}`, key `{key}`: both must be set",
                            e.name
                        ),
                        "name the Secret or ConfigMap of the run's namespace and one of its keys",
                    ));
                }
            }
            _ => out.push(Finding::fail(
                ids::ENV_VALUE_FROM,
                at,
                format!(
                    "env `{}` valueFrom sets {} references; exactly one is needed",
                    e.name,
                    set.len()
                ),
                "set secretKeyRef {name, key} or configMapKeyRef {name, key}",
            )),
        }
    }
}

/// Validates a container path: absolute, normalized (no `..`, `.`, `//`, trailing `/`), not `/`,
/// not under /proc, /sys or /dev (the kernel's and the runtime's, never the workload's).
/// Returns a phrase completing "path `x` …".
pub(crate) fn check_container_path(path: &str) -> Result<(), &'static str> {
    if let Some(why) = crate::names::unclean_path(path) {
        return Err(why);
    }
    if ["/proc", "/sys", "/dev"]
        .iter()
        .any(|sys| is_within(path, sys))
    {
        return Err("is under /proc, /sys or /dev (owned by the kernel and the container runtime)");
    }
    Ok(())
}

/// Whether normalized path `inner` equals `outer` or lies below it.
fn is_within(inner: &str, outer: &str) -> bool {
    inner
        .strip_prefix(outer)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// The directories a workload image needs for its own programs and libraries: a read-back path
/// (an empty emptyDir) at or below one of them would hide them. The holder never sees a read-back
/// path there (docs/contract.md "The holder runs only the operator's code"); this refusal spares
/// the workload a broken image, and says so up front.
pub(crate) const SYSTEM_DIRS: [&str; 9] = [
    "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/usr", "/etc", "/boot",
];

/// The system directory `path` is at or below, if any.
pub(crate) fn system_dir_of(path: &str) -> Option<&'static str> {
    SYSTEM_DIRS.into_iter().find(|dir| is_within(path, dir))
}

// ---- 5b. lifetime ----------------------------------------------------------------------------

fn check_ttl(spec: &SandboxRunSpec, out: &mut Vec<Finding>) {
    let Some(ttl) = spec.ttl_seconds_after_finished else {
        return;
    };
    if !(0..=MAX_TTL_SECONDS_AFTER_FINISHED).contains(&ttl) {
        out.push(Finding::fail(
            ids::TTL_AFTER_FINISHED,
            "spec.ttlSecondsAfterFinished",
            format!(
                "ttlSecondsAfterFinished is {ttl}; it must be between 0 and {MAX_TTL_SECONDS_AFTER_FINISHED} (one year)"
            ),
            "give the seconds to keep a finished run, e.g. 3600, or leave it unset to keep the run until it is deleted",
        ));
    }
}

/// `spec.retryPolicy` (docs/user-guide.md "Retries"): bounded, so no author makes a run retry
/// for ever or keep its rules unbounded, and every rule says what it matches.
fn check_retry_policy(spec: &SandboxRunSpec, out: &mut Vec<Finding>) {
    let Some(policy) = &spec.retry_policy else {
        return;
    };
    let mut fail = |field: String, message: String, hint: &str| {
        out.push(Finding::fail(ids::RETRY_POLICY, field, message, hint));
    };
    if policy.limit > MAX_RETRY_LIMIT {
        fail(
            "spec.retryPolicy.limit".into(),
            format!(
                "limit is {}; at most {MAX_RETRY_LIMIT} retries are allowed",
                policy.limit
            ),
            "give the retries a failed attempt may have, e.g. 3",
        );
    }
    if let Some(b) = &policy.backoff {
        for (name, value) in [
            ("baseSeconds", b.base_seconds),
            ("capSeconds", b.cap_seconds),
        ] {
            if value.is_some_and(|v| v > MAX_RETRY_BACKOFF_SECONDS) {
                fail(
                    format!("spec.retryPolicy.backoff.{name}"),
                    format!("{name} is over {MAX_RETRY_BACKOFF_SECONDS} (a day)"),
                    "give a wait in seconds of at most a day, e.g. 10 and a cap of 300",
                );
            }
        }
        if b.factor.is_some_and(|f| !(1..=10).contains(&f)) {
            fail(
                "spec.retryPolicy.backoff.factor".into(),
                "factor must be between 1 and 10".into(),
                "give the factor each wait grows by, e.g. 2",
            );
        }
    }
    if policy.rules.len() > MAX_RETRY_RULES {
        fail(
            "spec.retryPolicy.rules".into(),
            format!(
                "{} rules; at most {MAX_RETRY_RULES} are allowed",
                policy.rules.len()
            ),
            "merge rules: one rule may list many exit codes",
        );
    }
    for (i, rule) in policy.rules.iter().enumerate() {
        check_retry_rule(i, rule, &mut fail);
    }
}

/// One rule of `spec.retryPolicy.rules`: exactly one matcher, exit codes 0..=255.
fn check_retry_rule(i: usize, rule: &RetryRule, fail: &mut impl FnMut(String, String, &str)) {
    let field = format!("spec.retryPolicy.rules[{i}]");
    match (&rule.on_exit_codes, rule.on_pod_conditions.is_empty()) {
        (None, true) => fail(
            field.clone(),
            "the rule matches nothing: it names neither onExitCodes nor onPodConditions".into(),
            "give onExitCodes {operator: In, values: [42]} or onPodConditions [{type: DisruptionTarget}]",
        ),
        (Some(_), false) => fail(
            field.clone(),
            "the rule names both onExitCodes and onPodConditions".into(),
            "split it into two rules, one matcher each (as a Job's podFailurePolicy does)",
        ),
        _ => {}
    }
    if let Some(codes) = &rule.on_exit_codes {
        if codes.values.is_empty() || codes.values.len() > MAX_RETRY_RULE_VALUES {
            fail(
                format!("{field}.onExitCodes.values"),
                format!(
                    "{} exit codes; give 1 to {MAX_RETRY_RULE_VALUES}",
                    codes.values.len()
                ),
                "list the exit codes the rule is about, e.g. [42]",
            );
        }
        if let Some(bad) = codes.values.iter().find(|v| !(0..=255).contains(*v)) {
            fail(
                format!("{field}.onExitCodes.values"),
                format!("{bad} is not an exit code (0..=255)"),
                "exit codes are 0 to 255; a signal's is 128 + its number",
            );
        }
    }
}

// ---- 6. read-back ----------------------------------------------------------------------------

fn check_read_back(spec: &SandboxRunSpec, settings: &RuleSettings, out: &mut Vec<Finding>) {
    let Some(rb) = &spec.read_back else { return };
    if rb.paths.len() > MAX_READBACK_PATHS {
        out.push(Finding::fail(
            ids::READ_BACK_COUNT,
            "spec.readBack.paths",
            format!(
                "{} read-back paths declared; at most {MAX_READBACK_PATHS} are allowed",
                rb.paths.len()
            ),
            "declare a common parent directory instead of many siblings",
        ));
    }
    check_read_back_paths(&rb.paths, settings, out);
    if let Some(t) = &rb.drain_timeout {
        check_drain_timeout(t, settings, out);
    }
}

/// Each declared path: a safe directory of the run's own, declared once, nested in no other;
/// and its `sizeLimit`.
fn check_read_back_paths(paths: &[ReadBackPath], settings: &RuleSettings, out: &mut Vec<Finding>) {
    let mut valid: Vec<(usize, &str)> = Vec::new();
    for (i, p) in paths.iter().enumerate() {
        let at = |f: &str| format!("spec.readBack.paths[{i}].{f}");
        match check_container_path(&p.path) {
            Err(why) => out.push(Finding::fail(
                ids::READ_BACK_PATH,
                at("path"),
                format!("read-back path `{}` {why}", p.path),
                "use an absolute, normalized directory outside /proc, /sys and /dev, e.g. /work/out",
            )),
            Ok(()) if system_dir_of(&p.path).is_some() => out.push(Finding::fail(
                ids::READ_BACK_PATH,
                at("path"),
                format!(
                    "read-back path `{}` is in {}, a system directory the workload's image needs (an empty volume there would hide its programs)",
                    p.path,
                    system_dir_of(&p.path).unwrap_or_default()
                ),
                "declare a directory of the run's own, e.g. /work/out or /var/tmp/out, and write the results there",
            )),
            Ok(()) => {
                if let Some((j, _)) = valid.iter().find(|(_, q)| *q == p.path) {
                    out.push(Finding::fail(
                        ids::READ_BACK_DUPLICATE,
                        at("path"),
                        format!("read-back path `{}` is already declared at spec.readBack.paths[{j}]", p.path),
                        "declare each path once",
                    ));
                } else if let Some((j, q)) = valid.iter().find(|(_, q)| is_within(&p.path, q) || is_within(q, &p.path)) {
                    // Each path gets its own emptyDir: a nested one would shadow part of its parent.
                    out.push(Finding::fail(
                        ids::READ_BACK_NESTED,
                        at("path"),
                        format!("read-back path `{}` is nested with `{q}` (spec.readBack.paths[{j}])", p.path),
                        "declare only the outer directory; its content includes the inner one",
                    ));
                } else {
                    valid.push((i, p.path.as_str()));
                }
            }
        }
        if let Some(q) = &p.size_limit {
            check_size_limit(q, &at("sizeLimit"), &settings.caps, out);
        }
    }
}

/// `drainTimeout`: a positive duration within the operator's maximum.
fn check_drain_timeout(t: &str, settings: &RuleSettings, out: &mut Vec<Finding>) {
    match parse_duration(t) {
        Err(e) => out.push(Finding::fail(
            ids::READ_BACK_DRAIN_TIMEOUT,
            "spec.readBack.drainTimeout",
            format!("drainTimeout `{t}`: {e}"),
            "write a positive duration such as 90s, 5m or 1h30m, or leave it unset for the operator default",
        )),
        // A drain holds a slot of the operator's drain pool for up to its timeout.
        Ok(d) => match settings.max_drain_timeout {
            Some(max) if d > max => out.push(Finding::fail(
                ids::READ_BACK_DRAIN_TIMEOUT,
                "spec.readBack.drainTimeout",
                format!(
                    "drainTimeout `{t}` exceeds the operator maximum of {}s",
                    max.as_secs()
                ),
                format!(
                    "lower drainTimeout to at most {}s (ask the operator admin to raise --max-drain-timeout)",
                    max.as_secs()
                ),
            )),
            _ => {}
        },
    }
}

fn check_size_limit(q: &Quantity, field: &str, caps: &CapSettings, out: &mut Vec<Finding>) {
    match quantity_to_bytes(q) {
        Err(e) => out.push(Finding::fail(
            ids::READ_BACK_SIZE_LIMIT,
            field,
            format!("sizeLimit `{}`: {e}", q.0),
            "write a byte quantity such as 512Mi, 2Gi or 1.5G",
        )),
        // A zero cap drops every member: the path would always end Capped and empty. Refused
        // rather than warned, because it is never what the author meant.
        Ok(0) => out.push(Finding::fail(
            ids::READ_BACK_SIZE_LIMIT,
            field,
            format!("sizeLimit `{}` is zero; every member would be dropped", q.0),
            "set a positive cap, or remove sizeLimit for the operator default",
        )),
        Ok(n) if n > caps.max_bytes => out.push(Finding::fail(
            ids::READ_BACK_SIZE_LIMIT,
            field,
            format!(
                "sizeLimit `{}` ({n} bytes) exceeds the operator maximum of {} bytes",
                q.0, caps.max_bytes
            ),
            format!(
                "lower sizeLimit to at most {} bytes (ask the operator admin to raise the maximum)",
                caps.max_bytes
            ),
        )),
        Ok(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{NetworkPolicy, ReadBack, ReadBackPath};

    /// A spec every rule accepts: the base the tests below break one field at a time.
    fn good() -> SandboxRunSpec {
        SandboxRunSpec {
            image: Some(format!("ghcr.io/acme/tool@sha256:{}", "a".repeat(64))),
            user: Some("1000:1000".into()),
            ..Default::default()
        }
    }

    fn rules_of(spec: &SandboxRunSpec) -> Vec<(&'static str, Severity)> {
        check(spec, &RuleSettings::default())
            .into_iter()
            .map(|f| (f.rule, f.severity))
            .collect()
    }

    fn accepts(spec: &SandboxRunSpec) {
        let f = check(spec, &RuleSettings::default());
        assert!(f.is_empty(), "expected no findings, got {f:#?}");
    }

    fn rejects(spec: &SandboxRunSpec, rule: &str) -> Finding {
        let f = check(spec, &RuleSettings::default());
        let hit = f.iter().find(|f| f.rule == rule && f.is_fail()).cloned();
        hit.unwrap_or_else(|| panic!("expected a {rule} failure, got {f:#?}"))
    }

    fn warns(spec: &SandboxRunSpec, rule: &str) {
        let f = check(spec, &RuleSettings::default());
        assert!(
            f.iter()
                .any(|f| f.rule == rule && f.severity == Severity::Warn),
            "expected a {rule} warning, got {f:#?}"
        );
        assert!(
            !f.iter().any(Finding::is_fail),
            "warnings only expected, got {f:#?}"
        );
    }

    fn mount(name: &str, kind: MountType, target: &str) -> Mount {
        let source = matches!(
            kind,
            MountType::ConfigMap | MountType::Secret | MountType::PersistentVolumeClaim
        )
        .then(|| "src".to_string());
        Mount {
            name: name.into(),
            kind,
            source,
            target: target.into(),
            read_only: false,
        }
    }

    fn read_back(paths: &[&str]) -> Option<ReadBack> {
        Some(ReadBack {
            paths: paths
                .iter()
                .map(|p| ReadBackPath {
                    path: p.to_string(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        })
    }

    #[test]
    fn a_digest_pinned_numeric_non_root_spec_passes() {
        accepts(&good());
    }

    #[test]
    fn every_finding_has_a_hint_and_a_field() {
        let spec = SandboxRunSpec {
            build: Some(serde_json::json!({"context": "."})),
            host_state: Some(HostState::Auto),
            mounts: vec![mount("Bad", MountType::Bind, "proc")],
            network: Some(NetworkPolicy {
                mode: NetworkMode::Open,
                rules: vec!["".into()],
            }),
            read_back: read_back(&["/a/", "/dev/x"]),
            ..Default::default()
        };
        let f = check(&spec, &RuleSettings::default());
        assert!(f.len() >= 8, "{f:#?}");
        for finding in &f {
            assert!(!finding.hint.is_empty(), "{finding:?}");
            assert!(finding.field.starts_with("spec."), "{finding:?}");
        }
    }

    #[test]
    fn ttl_after_finished_is_zero_to_a_year_and_a_bad_one_says_what_to_write() {
        let mut s = good();
        for ok in [0, 2, 3600, MAX_TTL_SECONDS_AFTER_FINISHED] {
            s.ttl_seconds_after_finished = Some(ok);
            accepts(&s);
        }
        for bad in [-1, i64::MIN, MAX_TTL_SECONDS_AFTER_FINISHED + 1, i64::MAX] {
            s.ttl_seconds_after_finished = Some(bad);
            let f = rejects(&s, ids::TTL_AFTER_FINISHED);
            assert_eq!(f.field, "spec.ttlSecondsAfterFinished");
            assert!(f.message.contains(&bad.to_string()), "{f:?}");
            assert!(f.hint.contains("leave it unset"), "{f:?}");
        }
    }

    #[test]
    fn image_is_required_and_build_is_local_only() {
        let mut s = good();
        s.image = None;
        rejects(&s, ids::IMAGE_REQUIRED);
        s.image = Some("  ".into());
        rejects(&s, ids::IMAGE_REQUIRED);
        let mut s = good();
        s.build = Some(serde_json::json!({"dockerfile": "Dockerfile"}));
        let f = rejects(&s, ids::BUILD_LOCAL_ONLY);
        assert!(
            f.hint.contains("pre-built image") && f.hint.contains("digest"),
            "{f:?}"
        );
    }

    #[test]
    fn a_tag_is_a_warning_not_a_failure() {
        let mut s = good();
        s.image = Some("alpine:3.20".into());
        warns(&s, ids::IMAGE_DIGEST);
        assert!(is_digest_pinned(&format!("r@sha256:{}", "0".repeat(64))));
        assert!(!is_digest_pinned(&format!("r@sha256:{}", "0".repeat(63))));
        assert!(!is_digest_pinned(&format!("r@sha256:{}", "A".repeat(64))));
        assert!(!is_digest_pinned(&format!("@sha256:{}", "0".repeat(64))));
    }

    #[test]
    fn host_state_auto_is_refused_and_none_accepted() {
        let mut s = good();
        s.host_state = Some(HostState::None);
        accepts(&s);
        s.host_state = Some(HostState::Auto);
        let f = rejects(&s, ids::HOST_STATE_AUTO);
        assert!(f.hint.contains("none"));
    }

    #[test]
    fn user_must_be_numeric_and_not_root() {
        let mut s = good();
        for ok in ["1000", "1000:1000", "65534:0"] {
            s.user = Some(ok.into());
            accepts(&s);
        }
        s.user = None;
        rejects(&s, ids::USER_REQUIRED);
        for bad in ["root", "1000:", "nobody:1", "", "-1"] {
            s.user = Some(bad.into());
            rejects(&s, ids::USER_NUMERIC);
        }
        for root in ["0", "0:1000", "000"] {
            s.user = Some(root.into());
            rejects(&s, ids::USER_NON_ROOT);
        }
    }

    #[test]
    fn network_rules_fail_quoting_rule_and_index() {
        let mut s = good();
        s.network = Some(NetworkPolicy {
            mode: NetworkMode::Allowlist,
            rules: vec![
                "**.github.com".into(),
                "a*b.com".into(),
                "!".into(),
                "10.0.0.0/40".into(),
            ],
        });
        let f = check(&s, &RuleSettings::default());
        let bad: Vec<_> = f.iter().filter(|f| f.rule == ids::NETWORK_RULE).collect();
        assert_eq!(bad.len(), 3, "{f:#?}");
        assert_eq!(bad[0].field, "spec.network.rules[1]");
        assert!(
            bad[0].message.contains("#1") && bad[0].message.contains("`a*b.com`"),
            "{:?}",
            bad[0]
        );
        assert_eq!(bad[2].field, "spec.network.rules[3]");
    }

    #[test]
    fn valid_network_rules_pass() {
        let mut s = good();
        s.network = Some(NetworkPolicy {
            mode: NetworkMode::Allowlist,
            rules: [
                "**.github.com",
                "*.pypi.org",
                "!evil.github.com",
                "10.0.0.0/8",
                "::1",
                "2001:db8::/32",
            ]
            .map(String::from)
            .to_vec(),
        });
        accepts(&s);
    }

    #[test]
    fn open_mode_warns_and_says_rules_are_ignored() {
        let mut s = good();
        s.network = Some(NetworkPolicy {
            mode: NetworkMode::Open,
            rules: vec![],
        });
        warns(&s, ids::NETWORK_OPEN);
        s.network = Some(NetworkPolicy {
            mode: NetworkMode::Open,
            rules: vec!["x.com".into()],
        });
        warns(&s, ids::NETWORK_RULES_IGNORED);
        s.network = Some(NetworkPolicy {
            mode: NetworkMode::Allowlist,
            rules: vec![],
        });
        warns(&s, ids::NETWORK_ALLOWLIST_EMPTY);
        s.network = Some(NetworkPolicy {
            mode: NetworkMode::Denylist,
            rules: vec!["10.1.2.3/8".into()],
        });
        warns(&s, ids::NETWORK_CIDR_HOST_BITS);
    }

    #[test]
    fn restricted_egress_warns_when_the_cluster_does_not_enforce_network_policy() {
        use crate::egress::PolicyEnforcement;
        let mut s = good();
        s.network = Some(NetworkPolicy {
            mode: NetworkMode::Allowlist,
            rules: vec!["x.com".into()],
        });
        for (enforcement, warned) in [
            (PolicyEnforcement::Enforced, false),
            (PolicyEnforcement::UnenforcedWarn, true),
            (PolicyEnforcement::UnenforcedRefuse, true),
        ] {
            let settings = RuleSettings {
                network_policy: enforcement,
                ..RuleSettings::default()
            };
            let f = check(&s, &settings);
            assert_eq!(
                f.iter()
                    .any(|f| f.rule == ids::NETWORK_UNENFORCED && !f.is_fail()),
                warned,
                "{enforcement}: {f:#?}"
            );
        }
        s.network = Some(NetworkPolicy {
            mode: NetworkMode::Open,
            rules: vec![],
        });
        let settings = RuleSettings {
            network_policy: PolicyEnforcement::UnenforcedRefuse,
            ..RuleSettings::default()
        };
        assert!(!check(&s, &settings)
            .iter()
            .any(|f| f.rule == ids::NETWORK_UNENFORCED));
    }

    #[test]
    fn bind_mounts_are_refused() {
        let mut s = good();
        s.mounts = vec![mount("host", MountType::Bind, "/data")];
        rejects(&s, ids::MOUNT_BIND);
    }

    #[test]
    fn mount_targets_must_be_absolute_normalized_and_not_system() {
        let mut s = good();
        for ok in ["/data", "/home/u/.cache", "/devices", "/process"] {
            s.mounts = vec![mount("m", MountType::EmptyDir, ok)];
            accepts(&s);
        }
        for bad in [
            "data", "/", "/data/", "/a//b", "/a/./b", "/a/../b", "/proc", "/proc/1", "/sys/fs",
            "/dev/shm",
        ] {
            s.mounts = vec![mount("m", MountType::EmptyDir, bad)];
            rejects(&s, ids::MOUNT_TARGET);
        }
    }

    #[test]
    fn mount_names_and_targets_are_unique_and_names_are_labels() {
        let mut s = good();
        s.mounts = vec![
            mount("a", MountType::EmptyDir, "/x"),
            mount("a", MountType::EmptyDir, "/y"),
        ];
        rejects(&s, ids::MOUNT_NAME_DUPLICATE);
        s.mounts = vec![
            mount("a", MountType::EmptyDir, "/x"),
            mount("b", MountType::EmptyDir, "/x"),
        ];
        let f = rejects(&s, ids::MOUNT_TARGET_DUPLICATE);
        assert_eq!(f.field, "spec.mounts[1].target");
        for bad in ["Cache", "a_b", "-a", "a-", "", &"a".repeat(64)] {
            s.mounts = vec![mount(bad, MountType::EmptyDir, "/x")];
            rejects(&s, ids::MOUNT_NAME);
        }
    }

    #[test]
    fn config_secret_and_pvc_mounts_need_a_source() {
        let mut s = good();
        for kind in [
            MountType::ConfigMap,
            MountType::Secret,
            MountType::PersistentVolumeClaim,
        ] {
            let mut m = mount("m", kind, "/cfg");
            accepts(&SandboxRunSpec {
                mounts: vec![m.clone()],
                ..good()
            });
            m.source = None;
            s.mounts = vec![m];
            rejects(&s, ids::MOUNT_SOURCE);
        }
        s.mounts = vec![mount("m", MountType::EmptyDir, "/scratch")];
        accepts(&s);
    }

    #[test]
    fn a_mount_at_above_or_below_a_read_back_path_shadows_it() {
        let mut s = good();
        s.read_back = read_back(&["/work/out"]);
        for bad in ["/work/out", "/work", "/work/out/sub"] {
            s.mounts = vec![mount("m", MountType::EmptyDir, bad)];
            rejects(&s, ids::MOUNT_SHADOWS_READ_BACK);
        }
        for ok in ["/work/output", "/work/in", "/out"] {
            s.mounts = vec![mount("m", MountType::EmptyDir, ok)];
            accepts(&s);
        }
    }

    #[test]
    fn read_back_paths_are_absolute_normalized_unique_and_not_nested() {
        let mut s = good();
        s.read_back = read_back(&["/work/out", "/tmp/logs"]);
        accepts(&s);
        for bad in [
            "rel", "/", "/a/", "/a/../b", "/a/./b", "//a", "/proc/x", "/sys", "/dev/shm",
        ] {
            s.read_back = read_back(&[bad]);
            rejects(&s, ids::READ_BACK_PATH);
        }
        s.read_back = read_back(&["/a", "/b", "/a"]);
        assert_eq!(
            rejects(&s, ids::READ_BACK_DUPLICATE).field,
            "spec.readBack.paths[2].path"
        );
        s.read_back = read_back(&["/a/b", "/a"]);
        rejects(&s, ids::READ_BACK_NESTED);
        s.read_back = read_back(&["/a", "/ab"]);
        accepts(&s);
    }

    #[test]
    fn read_back_paths_over_the_images_system_directories_are_refused_with_a_hint() {
        // The holder's PATH directories among them: docs/contract.md "The holder runs only the
        // operator's code".
        for bad in [
            "/usr/local/sbin",
            "/usr/local/bin",
            "/bin",
            "/sbin",
            "/usr",
            "/etc/ssl",
            "/lib64",
        ] {
            let spec = SandboxRunSpec {
                read_back: read_back(&[bad]),
                ..good()
            };
            let f = rejects(&spec, ids::READ_BACK_PATH);
            assert!(
                f.message.contains("system directory"),
                "{bad}: {}",
                f.message
            );
            assert!(f.hint.contains("/work/out"), "{bad}: {}", f.hint);
        }
        for ok in [
            "/work/out",
            "/var/tmp/out",
            "/opt/results",
            "/usrdata",
            "/home/u/out",
            "/binaries",
        ] {
            accepts(&SandboxRunSpec {
                read_back: read_back(&[ok]),
                ..good()
            });
        }
    }

    #[test]
    fn at_most_sixteen_read_back_paths() {
        let mut s = good();
        let sixteen: Vec<String> = (0..16).map(|i| format!("/p{i}")).collect();
        s.read_back = read_back(&sixteen.iter().map(String::as_str).collect::<Vec<_>>());
        accepts(&s);
        let seventeen: Vec<String> = (0..17).map(|i| format!("/p{i}")).collect();
        s.read_back = read_back(&seventeen.iter().map(String::as_str).collect::<Vec<_>>());
        rejects(&s, ids::READ_BACK_COUNT);
    }

    #[test]
    fn size_limit_is_a_quantity_within_the_operator_maximum() {
        let mut s = good();
        let with_limit = |q: &str| {
            Some(ReadBack {
                paths: vec![ReadBackPath {
                    path: "/out".into(),
                    size_limit: Some(Quantity(q.into())),
                    required: false,
                }],
                ..Default::default()
            })
        };
        s.read_back = with_limit("512Mi");
        accepts(&s);
        s.read_back = with_limit("16Gi");
        accepts(&s);
        for bad in ["17Gi", "lots", "-1Mi", "0", "100m"] {
            s.read_back = with_limit(bad);
            rejects(&s, ids::READ_BACK_SIZE_LIMIT);
        }
        let small = RuleSettings {
            caps: CapSettings {
                default_bytes: 1024,
                max_bytes: 2048,
            },
            ..RuleSettings::default()
        };
        let f = check(
            &SandboxRunSpec {
                read_back: with_limit("4Ki"),
                ..good()
            },
            &small,
        );
        assert_eq!(
            f.iter().map(|f| f.rule).collect::<Vec<_>>(),
            [ids::READ_BACK_SIZE_LIMIT]
        );
    }

    #[test]
    fn drain_timeout_parses_friendly_durations_and_refuses_the_rest() {
        // The grammar itself is tested in `crate::units`.
        let mut s = good();
        s.read_back = Some(ReadBack {
            paths: vec![],
            drain_timeout: Some("soon".into()),
            ..Default::default()
        });
        rejects(&s, ids::READ_BACK_DRAIN_TIMEOUT);
        s.read_back = Some(ReadBack {
            paths: vec![],
            drain_timeout: Some("2m".into()),
            ..Default::default()
        });
        accepts(&s);
        // Within the operator maximum or above it.
        let bounded = RuleSettings {
            max_drain_timeout: Some(Duration::from_secs(600)),
            ..RuleSettings::default()
        };
        for (t, ok) in [
            ("10m", true),
            ("9m59s", true),
            ("10m1s", false),
            ("2h", false),
        ] {
            let mut s = good();
            s.read_back = Some(ReadBack {
                paths: vec![],
                drain_timeout: Some(t.into()),
                ..Default::default()
            });
            let f = check(&s, &bounded);
            if ok {
                assert!(f.iter().all(|f| !f.is_fail()), "{t}: {f:?}");
            } else {
                let fail = f
                    .iter()
                    .find(|f| f.rule == ids::READ_BACK_DRAIN_TIMEOUT)
                    .unwrap_or_else(|| panic!("{t} must be refused: {f:?}"));
                assert!(fail
                    .message
                    .contains("exceeds the operator maximum of 600s"));
                assert!(fail.hint.contains("--max-drain-timeout"), "{:?}", fail.hint);
            }
        }
    }

    #[test]
    fn findings_are_sorted_by_field_naturally() {
        let mut s = good();
        s.mounts = (0..12)
            .map(|i| mount("X", MountType::EmptyDir, &format!("/m{i}")))
            .collect();
        s.user = Some("root".into());
        let fields: Vec<String> = check(&s, &RuleSettings::default())
            .into_iter()
            .map(|f| f.field)
            .collect();
        assert_eq!(fields[0], "spec.mounts[0].name");
        assert_eq!(fields[2], "spec.mounts[2].name");
        assert_eq!(fields[11], "spec.mounts[11].name");
        assert_eq!(fields[12], "spec.user");
        assert_eq!(rules_of(&s).len(), 13);
    }

    #[test]
    fn once_the_pod_exists_only_stop_may_change() {
        let old = good();
        let mut stopped = old.clone();
        stopped.stop = true;
        assert!(check_update(&old, &stopped, true).is_empty());
        let mut changed = old.clone();
        changed.image = Some("alpine:3".into());
        changed.args = Some(vec!["x".into()]);
        let f = check_update(&old, &changed, true);
        assert_eq!(
            f.iter().map(|f| f.field.as_str()).collect::<Vec<_>>(),
            ["spec.args", "spec.image"]
        );
        assert!(f
            .iter()
            .all(|f| f.rule == ids::UPDATE_IMMUTABLE && f.hint.contains("delete and re-create")));
        assert!(
            check_update(&old, &changed, false).is_empty(),
            "before the pod exists the spec may change"
        );
    }

    /// docs/contract.md "Pause, resume and fork": a fork names an attempt or a checkpoint of its
    /// source, never both.
    #[test]
    fn a_fork_naming_both_an_attempt_and_a_checkpoint_is_refused() {
        let mut s = good();
        let from = |attempt, checkpoint| crate::api::Workspace {
            from: Some(crate::api::WorkspaceFrom {
                run: "a".into(),
                attempt,
                checkpoint,
            }),
            ..crate::api::Workspace::default()
        };
        s.workspace = Some(from(Some(1), Some(2)));
        rejects(&s, ids::WORKSPACE_FROM);
        for (attempt, checkpoint) in [(Some(1), None), (None, Some(2)), (None, None)] {
            s.workspace = Some(from(attempt, checkpoint));
            accepts(&s);
        }
    }

    /// docs/contract.md "Pause, resume and fork": `workspace.from` is fixed at creation, pod or
    /// no pod; `workspace.restore` may change at any time.
    #[test]
    fn a_forks_source_may_not_change_after_creation() {
        let mut old = good();
        old.workspace = Some(crate::api::Workspace {
            from: Some(crate::api::WorkspaceFrom {
                run: "a".into(),
                attempt: None,
                checkpoint: None,
            }),
            ..crate::api::Workspace::default()
        });
        let mut latest = old.clone();
        latest.workspace.as_mut().unwrap().restore = crate::api::WorkspaceRestore::Latest;
        assert!(check_update(&old, &latest, false).is_empty());
        assert!(check_update(&old, &latest, true).is_empty());
        let mut other = old.clone();
        other.workspace.as_mut().unwrap().from.as_mut().unwrap().run = "c".into();
        let mut dropped = old.clone();
        dropped.workspace = None;
        for (new, pod_exists) in [(&other, false), (&other, true), (&dropped, false)] {
            let f = check_update(&old, new, pod_exists);
            assert_eq!(
                f.iter()
                    .map(|f| (f.rule, f.field.as_str()))
                    .collect::<Vec<_>>(),
                [(ids::UPDATE_IMMUTABLE, "spec.workspace.from")]
            );
        }
        assert_eq!(check_update(&dropped, &old, false).len(), 1, "added later");
    }

    #[test]
    fn ttl_and_retention_may_change_once_the_pod_exists() {
        let mut old = good();
        old.read_back = read_back(&["/work/out"]);
        let mut later = old.clone();
        later.ttl_seconds_after_finished = Some(60);
        if let Some(rb) = later.read_back.as_mut() {
            rb.retention = Some(crate::api::Retention::Delete);
        }
        assert_eq!(check_update(&old, &later, true), Vec::<Finding>::new());
        // Anything else in readBack is still fixed.
        let mut paths_too = later.clone();
        paths_too.read_back = read_back(&["/work/other"]);
        let f = check_update(&later, &paths_too, true);
        assert_eq!(
            f.iter().map(|f| f.field.as_str()).collect::<Vec<_>>(),
            ["spec.readBack"]
        );
        assert!(
            f[0].message.contains("spec.ttlSecondsAfterFinished"),
            "{f:?}"
        );
    }

    #[test]
    fn stop_is_final() {
        let mut old = good();
        old.stop = true;
        let new = good();
        let f = check_update(&old, &new, false);
        assert_eq!(
            f.iter().map(|f| f.rule).collect::<Vec<_>>(),
            [ids::UPDATE_STOP_FINAL]
        );
        assert!(check_update(&old, &old, true).is_empty());
    }

    /// The docs that say what may change once the pod exists name what `check_update` lets
    /// change (issue #27: some said "only `stop`"), and `check_update` lets exactly those change.
    #[test]
    fn the_docs_name_the_fields_that_may_change_once_the_pod_exists() {
        let mut old = good();
        old.read_back = read_back(&["/work/out"]);
        let mut network = old.clone();
        network.network = Some(crate::api::NetworkPolicy {
            mode: crate::api::NetworkMode::Allowlist,
            rules: vec!["example.com".into()],
        });
        assert_eq!(
            check_update(&old, &network, true)
                .iter()
                .map(|f| f.field.as_str())
                .collect::<Vec<_>>(),
            ["spec.network"],
            "network rules are fixed once the pod exists"
        );
        let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let claim = "only `stop`, `suspend`, `checkpoint`, `ttlSecondsAfterFinished` and `readBack.retention` may change";
        for doc in [
            "docs/user-guide.md",
            "docs/operations.md",
            "docs/gitops.md",
            "charts/sandboxrun-operator/values.yaml",
        ] {
            let text = std::fs::read_to_string(repo.join(doc)).expect("read the doc");
            let words = text
                .replace('#', " ")
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ");
            assert!(words.contains(claim), "{doc} does not say: {claim}");
            assert!(
                !words.contains("only `stop` may change") && !words.contains("next request"),
                "{doc} still says a spec edit other than these takes effect"
            );
        }
    }

    #[test]
    fn a_run_outside_the_watched_namespaces_is_refused_with_them_named() {
        let watched = vec!["team-a".to_string(), "team-b".to_string()];
        assert!(unwatched_namespace(Some("team-a"), &watched).is_none());
        assert!(
            unwatched_namespace(Some("other"), &[]).is_none(),
            "every namespace watched"
        );
        assert!(unwatched_namespace(None, &watched).is_none());
        let f = unwatched_namespace(Some("other"), &watched).unwrap();
        assert_eq!(f.rule, ids::NAMESPACE_NOT_WATCHED);
        assert!(f.is_fail());
        assert!(
            f.message.contains("team-a, team-b") && f.hint.contains("watchNamespaces"),
            "{f:?}"
        );
    }
}
