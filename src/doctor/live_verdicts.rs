//! `doctor --context`: what the live probes' answers mean (docs/contract.md ADR-006 §3). Pure:
//! the objects read from the cluster in, findings out; [`crate::doctor::live`] does the reading.
//!
//! Two kinds of findings come from a cluster. **Probe** findings say the cluster is not ready to
//! take the manifests (no CRD, no webhook endpoint, the operator not running) or could not be
//! asked (timeout, forbidden): advisory — warnings, failures under `--require-context`
//! ([`Probe`]). **Verdicts** say the cluster refuses a manifest (a server-side dry run denied, a
//! referenced object missing): failures, as the rules' own.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingWebhook, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::Resource;

use crate::api::{MountType, SandboxRun, SandboxRunSpec, SandboxRunTemplateSpec, TemplateRef};
use crate::policy::rules::{ids, Finding};
use crate::policy::templates::{judge_with, Templated};
use crate::store::tenant::TenantStoreError;

/// A probe call without a usable answer (a probe finding says it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum CallError {
    /// The apiserver or the client refused it (their words).
    #[error("{0}")]
    Refused(String),
    /// No answer in time.
    #[error("no answer within {0:?}")]
    Timeout(std::time::Duration),
}

/// The CRD's name.
pub(crate) const CRD_NAME: &str = "sandboxruns.sandbox.iterion.io";

/// How probe findings are reported: warnings, or failures under `--require-context`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Probe {
    /// `--require-context`.
    pub(crate) required: bool,
}

impl Probe {
    /// A probe finding.
    pub(crate) fn finding(
        self,
        rule: &'static str,
        field: impl Into<String>,
        message: impl Into<String>,
        hint: impl Into<String>,
    ) -> Finding {
        if self.required {
            Finding::fail(rule, field, message, hint)
        } else {
            Finding::warn(rule, field, message, hint)
        }
    }

    /// A probe that could not be made (timeout, forbidden, unreachable).
    pub(crate) fn unanswered(self, what: &str, why: &dyn std::fmt::Display) -> Finding {
        self.finding(
            ids::CLUSTER_PROBE,
            what,
            format!("cannot check {what}: {why}"),
            "check the context, its credentials and RBAC (get/list on what doctor reads), \
             or raise --timeout",
        )
    }
}

/// The version this doctor judges manifests for.
fn our_version() -> String {
    SandboxRun::version(&()).to_string()
}

/// Judges the CRD as read (None: not found): installed, serving our version, established.
pub(crate) fn judge_crd(probe: Probe, crd: Option<&CustomResourceDefinition>) -> Option<Finding> {
    let version = our_version();
    let hint = "kubectl apply --server-side -f crds/sandboxruns.sandbox.iterion.io.yaml \
                (Helm installs CRDs only on first install)";
    let Some(crd) = crd else {
        return Some(probe.finding(
            ids::CLUSTER_CRD,
            CRD_NAME,
            "the SandboxRun CRD is not installed: the cluster answers \"no matches for kind\"",
            hint,
        ));
    };
    let served = crd
        .spec
        .versions
        .iter()
        .any(|v| v.name == version && v.served);
    if !served {
        let versions: Vec<String> = crd
            .spec
            .versions
            .iter()
            .map(|v| format!("{}{}", v.name, if v.served { "" } else { " (not served)" }))
            .collect();
        return Some(probe.finding(
            ids::CLUSTER_CRD,
            CRD_NAME,
            format!(
                "the installed CRD does not serve {version} (it has: {})",
                versions.join(", ")
            ),
            hint,
        ));
    }
    let established = crd
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| {
            c.iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        });
    (!established).then(|| {
        probe.finding(
            ids::CLUSTER_CRD,
            CRD_NAME,
            "the CRD is not Established yet",
            "wait for it (kubectl wait --for condition=Established crd/sandboxruns.sandbox.iterion.io)",
        )
    })
}

/// Whether `selector` selects `labels` (`matchLabels` and `matchExpressions`; none selects all).
pub(crate) fn selector_matches(
    selector: Option<&LabelSelector>,
    labels: &BTreeMap<String, String>,
) -> bool {
    let Some(sel) = selector else {
        return true;
    };
    let by_labels = sel
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let by_expressions = sel.match_expressions.iter().flatten().all(|e| {
        let values = e.values.as_deref().unwrap_or_default();
        let value = labels.get(&e.key);
        match e.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            // An operator the apiserver would refuse: select nothing rather than guess.
            _ => false,
        }
    });
    by_labels && by_expressions
}

fn matches_any(list: Option<&Vec<String>>, want: &[&str]) -> bool {
    list.is_some_and(|l| l.iter().any(|x| want.contains(&x.as_str())))
}

/// The webhooks of `configs` that judge a CREATE of a SandboxRun labelled `object_labels` in a
/// namespace labelled `namespace_labels`, with the name of their configuration.
pub(crate) fn webhooks_for_runs<'a>(
    configs: &'a [ValidatingWebhookConfiguration],
    namespace_labels: &BTreeMap<String, String>,
    object_labels: &BTreeMap<String, String>,
) -> Vec<(&'a str, &'a ValidatingWebhook)> {
    let version = our_version();
    let mut out = Vec::new();
    for config in configs {
        let name = config.metadata.name.as_deref().unwrap_or_default();
        for w in config.webhooks.iter().flatten() {
            let covers = w.rules.iter().flatten().any(|r| {
                matches_any(r.api_groups.as_ref(), &[crate::api::GROUP, "*"])
                    && matches_any(r.api_versions.as_ref(), &[version.as_str(), "*"])
                    && matches_any(r.operations.as_ref(), &["CREATE", "*"])
                    && matches_any(r.resources.as_ref(), &["sandboxruns", "*", "*/*"])
            });
            if covers
                && selector_matches(w.namespace_selector.as_ref(), namespace_labels)
                && selector_matches(w.object_selector.as_ref(), object_labels)
            {
                out.push((name, w));
            }
        }
    }
    out
}

/// Where the apiserver sends a webhook's reviews.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Endpoint {
    /// A Service (`namespace/name`, port): it needs ready endpoints.
    Service {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// Its port (443 when unset).
        port: i32,
    },
    /// A URL (`https://host:port/path`): something must accept connections there.
    Url(String),
    /// Neither: the configuration is broken.
    Missing,
}

/// The endpoint of `webhook`.
pub(crate) fn endpoint(webhook: &ValidatingWebhook) -> Endpoint {
    let c = &webhook.client_config;
    if let Some(s) = &c.service {
        return Endpoint::Service {
            namespace: s.namespace.clone(),
            name: s.name.clone(),
            port: s.port.unwrap_or(443),
        };
    }
    match &c.url {
        Some(url) => Endpoint::Url(url.clone()),
        None => Endpoint::Missing,
    }
}

/// The caBundle finding of `webhook` (in configuration `config`), if its bundle is empty.
pub(crate) fn judge_ca_bundle(
    probe: Probe,
    config: &str,
    webhook: &ValidatingWebhook,
) -> Option<Finding> {
    let empty = webhook
        .client_config
        .ca_bundle
        .as_ref()
        .is_none_or(|b| b.0.is_empty());
    empty.then(|| {
        probe.finding(
            ids::CLUSTER_WEBHOOK,
            format!("validatingwebhookconfiguration/{config} {}", webhook.name),
            "the webhook has no caBundle: the apiserver cannot verify it, and with failurePolicy \
             Fail every SandboxRun write fails",
            "the operator fills it within 30 s of starting (self-managed certificates), or \
             cert-manager's cainjector does; a GitOps tool that blanks it needs ignoreDifferences \
             (docs/gitops.md)",
        )
    })
}

/// Whether any endpoint of `slices` is ready (an endpoint whose `ready` is unset counts as
/// ready, as the EndpointSlice API says).
pub(crate) fn any_ready(slices: &[EndpointSlice]) -> bool {
    slices.iter().any(|s| {
        s.endpoints
            .iter()
            .flatten()
            .any(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))
    })
}

/// The finding of a webhook whose endpoint is not there.
pub(crate) fn endpoint_down(probe: Probe, config: &str, webhook: &str, what: &str) -> Finding {
    probe.finding(
        ids::CLUSTER_WEBHOOK,
        format!("validatingwebhookconfiguration/{config} {webhook}"),
        format!("the webhook's endpoint is not serving: {what}; with failurePolicy Fail every SandboxRun write fails"),
        "check the operator's pods (kubectl -n <operator namespace> get pods) and the webhook \
         Service's endpoints",
    )
}

/// An object a run's pod needs besides its image.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Reference {
    /// Its kind.
    pub(crate) kind: RefKind,
    /// Its name.
    pub(crate) name: String,
    /// The field of the run that names it.
    pub(crate) field: String,
}

/// Kinds of referenced objects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum RefKind {
    /// A Secret (mount, env `secretKeyRef`, `imagePullSecrets`).
    Secret,
    /// A ConfigMap (mount, env `configMapKeyRef`).
    ConfigMap,
    /// A PersistentVolumeClaim (mount).
    PersistentVolumeClaim,
    /// A ServiceAccount (`serviceAccountName`).
    ServiceAccount,
    /// A PriorityClass (`priorityClassName`, cluster-scoped).
    PriorityClass,
    /// A RuntimeClass (`runtimeClassName`, cluster-scoped).
    RuntimeClass,
}

impl RefKind {
    /// The kind as Kubernetes spells it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            RefKind::Secret => "Secret",
            RefKind::ConfigMap => "ConfigMap",
            RefKind::PersistentVolumeClaim => "PersistentVolumeClaim",
            RefKind::ServiceAccount => "ServiceAccount",
            RefKind::PriorityClass => "PriorityClass",
            RefKind::RuntimeClass => "RuntimeClass",
        }
    }

    /// Whether objects of this kind live in a namespace.
    pub(crate) fn namespaced(self) -> bool {
        !matches!(self, RefKind::PriorityClass | RefKind::RuntimeClass)
    }

    /// The kind of a manifest's `kind`, if it is one a run can reference.
    pub(crate) fn of_kind(kind: &str) -> Option<RefKind> {
        [
            RefKind::Secret,
            RefKind::ConfigMap,
            RefKind::PersistentVolumeClaim,
            RefKind::ServiceAccount,
            RefKind::PriorityClass,
            RefKind::RuntimeClass,
        ]
        .into_iter()
        .find(|k| k.as_str() == kind)
    }
}

/// Every object `run`'s pod needs that the cluster must already have, each once (the first
/// field that names it), in a stable order. `default` is not a reference: every namespace has
/// that ServiceAccount.
pub(crate) fn references(run: &SandboxRun) -> Vec<Reference> {
    let spec = &run.spec;
    let mut out: Vec<Reference> = Vec::new();
    let mut push = |kind: RefKind, name: &str, field: String| {
        let name = name.trim();
        if !name.is_empty() && !out.iter().any(|r| r.kind == kind && r.name == name) {
            out.push(Reference {
                kind,
                name: name.to_string(),
                field,
            });
        }
    };
    for (i, m) in spec.mounts.iter().enumerate() {
        let kind = match m.kind {
            MountType::ConfigMap => RefKind::ConfigMap,
            MountType::Secret => RefKind::Secret,
            MountType::PersistentVolumeClaim => RefKind::PersistentVolumeClaim,
            MountType::EmptyDir | MountType::Bind => continue,
        };
        if let Some(source) = &m.source {
            push(kind, source, format!("spec.mounts[{i}].source"));
        }
    }
    for (i, e) in spec.env.iter().enumerate() {
        let Some(from) = &e.value_from else { continue };
        if let Some(s) = &from.secret_key_ref {
            if s.optional != Some(true) {
                push(
                    RefKind::Secret,
                    &s.name,
                    format!("spec.env[{i}].valueFrom.secretKeyRef"),
                );
            }
        }
        if let Some(c) = &from.config_map_key_ref {
            if c.optional != Some(true) {
                push(
                    RefKind::ConfigMap,
                    &c.name,
                    format!("spec.env[{i}].valueFrom.configMapKeyRef"),
                );
            }
        }
    }
    for (i, s) in spec.image_pull_secrets.iter().enumerate() {
        push(RefKind::Secret, s, format!("spec.imagePullSecrets[{i}]"));
    }
    if let Some(sa) = spec
        .service_account_name
        .as_deref()
        .filter(|s| *s != "default")
    {
        push(
            RefKind::ServiceAccount,
            sa,
            "spec.serviceAccountName".into(),
        );
    }
    if let Some(p) = &spec.priority_class_name {
        push(RefKind::PriorityClass, p, "spec.priorityClassName".into());
    }
    if let Some(r) = &spec.runtime_class_name {
        push(RefKind::RuntimeClass, r, "spec.runtimeClassName".into());
    }
    out
}

/// (kind, namespace — empty for cluster-scoped —, name) of an object in the manifests themselves.
pub(crate) type StreamObject = (RefKind, String, String);

/// The finding of a reference the cluster does not have and the manifests do not bring.
pub(crate) fn missing_reference(r: &Reference, namespace: &str) -> Finding {
    let place = if r.kind.namespaced() {
        format!(" in namespace {namespace}")
    } else {
        String::new()
    };
    let what = match r.kind {
        RefKind::Secret | RefKind::ConfigMap | RefKind::PersistentVolumeClaim => {
            "the pod cannot start (FailedMount / CreateContainerConfigError) until it exists"
        }
        RefKind::ServiceAccount | RefKind::PriorityClass | RefKind::RuntimeClass => {
            "the apiserver refuses the pod until it exists"
        }
    };
    Finding::fail(
        ids::REFERENCE_MISSING,
        r.field.clone(),
        format!(
            "{} {:?}{place} does not exist: {what}",
            r.kind.as_str(),
            r.name
        ),
        format!(
            "create the {} first, or add it to the manifests you check (doctor looks there too)",
            r.kind.as_str()
        ),
    )
}

/// Whether the manifests being checked bring `r` themselves.
pub(crate) fn in_stream(r: &Reference, namespace: &str, stream: &BTreeSet<StreamObject>) -> bool {
    let ns = if r.kind.namespaced() { namespace } else { "" };
    stream.contains(&(r.kind, ns.to_string(), r.name.clone()))
}

/// The finding about the store a run would drain into (docs/contract.md "A store per
/// namespace"), from the operator's own resolution of it with doctor's client: None when it can
/// be used, or when what is missing is in the manifests checked; a read doctor's identity could
/// not make is a probe, not a verdict.
pub(crate) fn store_finding(
    resolved: Result<(), TenantStoreError>,
    namespace: &str,
    stream: &BTreeSet<StreamObject>,
    probe: Probe,
) -> Option<Finding> {
    let error = match resolved {
        Ok(()) => return None,
        Err(e) => e,
    };
    let cause = match &error {
        TenantStoreError::Credentials { source, .. } => source.as_ref(),
        other => other,
    };
    match cause {
        TenantStoreError::Missing { kind, name, .. } => {
            let kind = RefKind::of_kind(kind)?;
            let brought = stream.contains(&(kind, namespace.to_string(), name.clone()));
            if brought {
                return None;
            }
        }
        TenantStoreError::Unreadable { .. } | TenantStoreError::Transient { .. } => {
            return Some(probe.unanswered("the run's store", &error.to_string()));
        }
        _ => {}
    }
    Some(Finding::fail(
        ids::STORE_UNUSABLE,
        STORE_FIELD,
        error.to_string(),
        "the operator holds this run with no pod (Ready=False, StoreUnusable) until its store can \
         be used: fix the store ConfigMap or its Secret (docs/user-guide.md \"Your namespace's \
         store\"), or name another store with spec.readBack.storeRef",
    ))
}

/// The field a store finding points at.
const STORE_FIELD: &str = "spec.readBack";

/// What a refused server-side dry run means.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum DryRun {
    /// The cluster judged the manifest and refused it (schema, webhook denial, immutability).
    Refused(String),
    /// The manifest's namespace does not exist.
    NoNamespace(String),
    /// The cluster could not judge it: the webhook could not be called, RBAC forbids the dry
    /// run, or the apiserver failed.
    Unanswered(String),
}

/// Classifies the apiserver's refusal of a dry run: its HTTP `code`, `reason` and `message`.
pub(crate) fn classify_dry_run(code: u16, reason: &str, message: &str) -> DryRun {
    let text = message.to_string();
    if message.contains("failed calling webhook") {
        return DryRun::Unanswered(text);
    }
    match code {
        404 if message.contains("namespaces") => DryRun::NoNamespace(text),
        400 | 409 | 422 => DryRun::Refused(text),
        403 if message.contains("denied the request") => DryRun::Refused(text),
        _ if reason == "Invalid" => DryRun::Refused(text),
        _ => DryRun::Unanswered(text),
    }
}

/// The finding of a dry run the cluster refused.
pub(crate) fn dry_run_refused(message: &str) -> Finding {
    Finding::fail(
        ids::DRY_RUN,
        "metadata",
        format!("the cluster refuses this manifest (server-side dry run): {message}"),
        "fix what the message names; the webhook's own findings carry their hints above",
    )
}

/// A run's template as `doctor --context` read it from the cluster (docs/contract.md
/// "Templates"): judged merged with it as the webhook would (a missing one is
/// `template-unusable`, a locked field `template-locked`); a read that could not be made is a
/// probe finding, and the run's own spec is judged.
pub(crate) fn template_from_cluster(
    probe: Probe,
    reference: &TemplateRef,
    namespace: &str,
    read: Result<Option<SandboxRunTemplateSpec>, CallError>,
    run: &SandboxRunSpec,
) -> Templated {
    match read {
        Ok(template) => judge_with(template.as_ref(), namespace, reference, run, None),
        Err(why) => {
            let what = format!(
                "the {} (spec.templateRef; the run's own spec is judged)",
                reference.describe(namespace)
            );
            Templated::Plain(vec![probe.unanswered(&what, &why)])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{EnvVar, EnvVarSource, Mount, SandboxRunSpec};
    use k8s_openapi::api::admissionregistration::v1::{RuleWithOperations, WebhookClientConfig};
    use k8s_openapi::api::core::v1::{ConfigMapKeySelector, SecretKeySelector};
    use k8s_openapi::api::discovery::v1::{Endpoint as SliceEndpoint, EndpointConditions};
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
        CustomResourceDefinitionCondition, CustomResourceDefinitionStatus,
        CustomResourceDefinitionVersion,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
    use k8s_openapi::ByteString;

    const WARN: Probe = Probe { required: false };
    const REQUIRE: Probe = Probe { required: true };

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn crd(versions: &[(&str, bool)], established: bool) -> CustomResourceDefinition {
        let mut c = CustomResourceDefinition::default();
        c.spec.versions = versions
            .iter()
            .map(|(n, served)| CustomResourceDefinitionVersion {
                name: n.to_string(),
                served: *served,
                ..Default::default()
            })
            .collect();
        c.status = Some(CustomResourceDefinitionStatus {
            conditions: Some(vec![CustomResourceDefinitionCondition {
                type_: "Established".into(),
                status: if established { "True" } else { "False" }.into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        c
    }

    #[test]
    fn the_crd_must_be_installed_serve_our_version_and_be_established() {
        assert_eq!(
            judge_crd(WARN, Some(&crd(&[("v1alpha1", true)], true))),
            None
        );
        let missing = judge_crd(WARN, None);
        assert!(missing
            .as_ref()
            .is_some_and(|f| !f.is_fail() && f.rule == "cluster-crd"));
        assert!(judge_crd(REQUIRE, None).is_some_and(|f| f.is_fail()));
        let other = judge_crd(
            WARN,
            Some(&crd(&[("v1beta1", true), ("v1alpha1", false)], true)),
        );
        assert!(
            other
                .as_ref()
                .is_some_and(|f| f.message.contains("v1alpha1 (not served)")),
            "{other:?}"
        );
        assert!(judge_crd(WARN, Some(&crd(&[("v1alpha1", true)], false)))
            .is_some_and(|f| f.message.contains("Established")));
    }

    #[test]
    fn selectors_follow_label_selector_semantics() {
        let l = labels(&[("team", "a"), ("tier", "gold")]);
        assert!(selector_matches(None, &l));
        assert!(selector_matches(Some(&LabelSelector::default()), &l));
        let by = |k: &str, op: &str, vals: &[&str]| LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: k.into(),
                operator: op.into(),
                values: Some(vals.iter().map(|v| v.to_string()).collect()),
            }]),
            ..Default::default()
        };
        assert!(selector_matches(Some(&by("team", "In", &["a", "b"])), &l));
        assert!(!selector_matches(Some(&by("team", "NotIn", &["a"])), &l));
        assert!(selector_matches(Some(&by("zone", "NotIn", &["x"])), &l));
        assert!(selector_matches(Some(&by("tier", "Exists", &[])), &l));
        assert!(!selector_matches(
            Some(&by("tier", "DoesNotExist", &[])),
            &l
        ));
        assert!(!selector_matches(Some(&by("tier", "Gt", &["1"])), &l));
        let ml = LabelSelector {
            match_labels: Some([("team".to_string(), "b".to_string())].into()),
            ..Default::default()
        };
        assert!(!selector_matches(Some(&ml), &l));
    }

    fn webhook(
        name: &str,
        resources: &[&str],
        ns: Option<LabelSelector>,
        ca: &[u8],
    ) -> ValidatingWebhook {
        ValidatingWebhook {
            name: name.into(),
            rules: Some(vec![RuleWithOperations {
                api_groups: Some(vec!["sandbox.iterion.io".into()]),
                api_versions: Some(vec!["v1alpha1".into()]),
                operations: Some(vec!["CREATE".into(), "UPDATE".into()]),
                resources: Some(resources.iter().map(|r| r.to_string()).collect()),
                scope: None,
            }]),
            namespace_selector: ns,
            client_config: WebhookClientConfig {
                url: Some("https://127.0.0.1:9443/validate".into()),
                ca_bundle: Some(ByteString(ca.to_vec())),
                service: None,
            },
            ..Default::default()
        }
    }

    #[test]
    fn only_the_webhooks_that_would_judge_the_run_are_probed() {
        let only_team_a = LabelSelector {
            match_labels: Some([("team".to_string(), "a".to_string())].into()),
            ..Default::default()
        };
        let configs = vec![ValidatingWebhookConfiguration {
            metadata: kube::api::ObjectMeta {
                name: Some("sbr".into()),
                ..Default::default()
            },
            webhooks: Some(vec![
                webhook("runs.a", &["sandboxruns"], Some(only_team_a), b"ca"),
                webhook("other", &["pods"], None, b"ca"),
                webhook("all", &["*"], None, b""),
            ]),
        }];
        let names = |ns: &[(&str, &str)]| -> Vec<String> {
            webhooks_for_runs(&configs, &labels(ns), &BTreeMap::new())
                .iter()
                .map(|(c, w)| format!("{c}/{}", w.name))
                .collect()
        };
        assert_eq!(names(&[("team", "a")]), ["sbr/runs.a", "sbr/all"]);
        assert_eq!(names(&[("team", "b")]), ["sbr/all"]);
        let hooks = configs[0].webhooks.clone().unwrap_or_default();
        assert_eq!(judge_ca_bundle(WARN, "sbr", &hooks[0]), None);
        assert!(judge_ca_bundle(WARN, "sbr", &hooks[2])
            .is_some_and(|f| f.message.contains("no caBundle")));
        assert_eq!(
            endpoint(&hooks[0]),
            Endpoint::Url("https://127.0.0.1:9443/validate".into())
        );
    }

    #[test]
    fn an_endpoint_slice_counts_when_one_endpoint_is_ready() {
        let slice = |ready: &[Option<bool>]| EndpointSlice {
            endpoints: Some(
                ready
                    .iter()
                    .map(|r| SliceEndpoint {
                        conditions: Some(EndpointConditions {
                            ready: *r,
                            ..Default::default()
                        }),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        };
        assert!(!any_ready(&[]));
        assert!(!any_ready(&[slice(&[Some(false)])]));
        assert!(any_ready(&[slice(&[Some(false)]), slice(&[Some(true)])]));
        assert!(any_ready(&[slice(&[None])]), "unset means ready");
    }

    #[test]
    fn references_are_every_object_the_pod_needs_each_once() {
        let mount = |name: &str, kind: MountType, source: &str| Mount {
            name: name.into(),
            kind,
            source: Some(source.into()),
            target: format!("/m/{name}"),
            read_only: false,
        };
        let env = |secret: Option<(&str, Option<bool>)>, cm: Option<&str>| EnvVar {
            name: "X".into(),
            value: String::new(),
            value_from: Some(EnvVarSource {
                secret_key_ref: secret.map(|(n, optional)| SecretKeySelector {
                    name: n.into(),
                    key: "k".into(),
                    optional,
                }),
                config_map_key_ref: cm.map(|n| ConfigMapKeySelector {
                    name: n.into(),
                    key: "k".into(),
                    optional: None,
                }),
            }),
        };
        let run = SandboxRun::new(
            "r",
            SandboxRunSpec {
                mounts: vec![
                    mount("a", MountType::Secret, "creds"),
                    mount("b", MountType::ConfigMap, "cfg"),
                    mount("c", MountType::PersistentVolumeClaim, "data"),
                    mount("d", MountType::EmptyDir, "ignored"),
                ],
                env: vec![
                    env(Some(("creds", None)), None),
                    env(Some(("maybe", Some(true))), Some("cfg2")),
                ],
                image_pull_secrets: vec!["pull".into()],
                service_account_name: Some("default".into()),
                priority_class_name: Some("high".into()),
                runtime_class_name: Some("gvisor".into()),
                ..Default::default()
            },
        );
        let got: Vec<String> = references(&run)
            .iter()
            .map(|r| format!("{} {} {}", r.kind.as_str(), r.name, r.field))
            .collect();
        assert_eq!(
            got,
            [
                "Secret creds spec.mounts[0].source",
                "ConfigMap cfg spec.mounts[1].source",
                "PersistentVolumeClaim data spec.mounts[2].source",
                "ConfigMap cfg2 spec.env[1].valueFrom.configMapKeyRef",
                "Secret pull spec.imagePullSecrets[0]",
                "PriorityClass high spec.priorityClassName",
                "RuntimeClass gvisor spec.runtimeClassName",
            ]
        );
        let r = &references(&run)[0];
        let f = missing_reference(r, "team-a");
        assert!(f.is_fail() && f.message.contains("Secret \"creds\" in namespace team-a"));
        let stream: BTreeSet<StreamObject> =
            [(RefKind::Secret, "team-a".to_string(), "creds".to_string())].into();
        assert!(in_stream(r, "team-a", &stream));
        assert!(!in_stream(r, "team-b", &stream));
        let prio = &references(&run)[5];
        let cluster: BTreeSet<StreamObject> =
            [(RefKind::PriorityClass, String::new(), "high".to_string())].into();
        assert!(in_stream(prio, "anywhere", &cluster), "cluster-scoped");
    }

    #[test]
    fn a_template_read_from_the_cluster_judges_the_run_missing_fails_and_unreadable_is_a_probe() {
        use crate::api::{OpenField, SandboxRunTemplateSpec, TemplateRef};
        let reference = TemplateRef::cluster("ci");
        let run = SandboxRunSpec {
            template_ref: Some(reference.clone()),
            command: Some(vec!["make".into()]),
            ..SandboxRunSpec::default()
        };
        let template = SandboxRunTemplateSpec {
            template: SandboxRunSpec {
                image: Some("registry.example/ci:1".into()),
                ..SandboxRunSpec::default()
            },
            open_fields: vec![OpenField::Command],
        };
        let merged =
            template_from_cluster(WARN, &reference, "dev", Ok(Some(template.clone())), &run);
        assert!(
            matches!(&merged, Templated::Merged { new, .. } if new["image"] == "registry.example/ci:1"),
            "{merged:?}"
        );
        let mut locked = run.clone();
        locked.user = Some("0".into());
        let refused = template_from_cluster(WARN, &reference, "dev", Ok(Some(template)), &locked);
        assert!(
            matches!(&refused, Templated::Refused(f)
                if f[0].rule == ids::TEMPLATE_LOCKED && f[0].field == "spec.user"),
            "{refused:?}"
        );
        let missing = template_from_cluster(WARN, &reference, "dev", Ok(None), &run);
        assert!(
            matches!(&missing, Templated::Refused(f)
                if f[0].rule == ids::TEMPLATE_UNUSABLE && f[0].is_fail()
                    && f[0].message.contains("ClusterSandboxRunTemplate ci does not exist")),
            "{missing:?}"
        );
        let forbidden = "403 Forbidden: cannot get clustersandboxruntemplates";
        for (probe, fails) in [(WARN, false), (REQUIRE, true)] {
            let unread = template_from_cluster(
                probe,
                &reference,
                "dev",
                Err(CallError::Refused(forbidden.to_string())),
                &run,
            );
            assert!(
                matches!(&unread, Templated::Plain(f)
                    if f.len() == 1 && f[0].rule == ids::CLUSTER_PROBE && f[0].is_fail() == fails
                        && f[0].message.contains(forbidden)),
                "{unread:?}"
            );
        }
    }

    #[test]
    fn a_dry_run_refusal_is_a_verdict_and_an_unreachable_webhook_is_not() {
        assert!(matches!(
            classify_dry_run(
                400,
                "BadRequest",
                "admission webhook \"runs.sandbox.iterion.io\" denied the request: user-non-root"
            ),
            DryRun::Refused(_)
        ));
        assert!(matches!(
            classify_dry_run(
                422,
                "Invalid",
                "SandboxRun.sandbox.iterion.io \"x\" is invalid"
            ),
            DryRun::Refused(_)
        ));
        assert!(matches!(
            classify_dry_run(500, "InternalError", "Internal error occurred: failed calling webhook \"runs\": connect: connection refused"),
            DryRun::Unanswered(_)
        ));
        assert!(matches!(
            classify_dry_run(
                403,
                "Forbidden",
                "sandboxruns is forbidden: User \"ci\" cannot patch"
            ),
            DryRun::Unanswered(_)
        ));
        assert!(matches!(
            classify_dry_run(404, "NotFound", "namespaces \"nope\" not found"),
            DryRun::NoNamespace(_)
        ));
        assert!(matches!(
            classify_dry_run(504, "Timeout", "timeout"),
            DryRun::Unanswered(_)
        ));
    }

    #[test]
    fn a_store_that_cannot_be_used_fails_unless_the_manifests_bring_what_is_missing() {
        let probe = Probe { required: false };
        let none = BTreeSet::new();
        assert!(store_finding(Ok(()), "t", &none, probe).is_none());
        let secret_missing = || TenantStoreError::Credentials {
            store: "t/sandboxrun-store".into(),
            source: Box::new(TenantStoreError::Missing {
                kind: "Secret",
                namespace: "t".into(),
                name: "creds".into(),
            }),
        };
        let f = store_finding(Err(secret_missing()), "t", &none, probe).expect("finding");
        assert_eq!(f.rule, ids::STORE_UNUSABLE);
        assert!(
            f.message.contains("t/sandboxrun-store") && f.message.contains("t/creds"),
            "{}",
            f.message
        );
        let brought: BTreeSet<StreamObject> =
            [(RefKind::Secret, "t".to_string(), "creds".to_string())].into();
        assert!(store_finding(Err(secret_missing()), "t", &brought, probe).is_none());
        // A Secret of the same name in another namespace does not count.
        let elsewhere: BTreeSet<StreamObject> =
            [(RefKind::Secret, "u".to_string(), "creds".to_string())].into();
        assert!(store_finding(Err(secret_missing()), "t", &elsewhere, probe).is_some());
        let refused = TenantStoreError::SecretRefused {
            store: "t/s".into(),
            secret: "default-token".into(),
            allowed: "store-creds".into(),
        };
        let f = store_finding(Err(refused), "t", &brought, probe).expect("finding");
        assert_eq!(f.rule, ids::STORE_UNUSABLE);
        // What doctor's identity could not read is a probe (a warning), not a verdict.
        let forbidden = TenantStoreError::Credentials {
            store: "t/s".into(),
            source: Box::new(TenantStoreError::Unreadable {
                kind: "Secret",
                namespace: "t".into(),
                name: "creds".into(),
                reason: "403 Forbidden".into(),
            }),
        };
        let f = store_finding(Err(forbidden), "t", &none, probe).expect("finding");
        assert_eq!(f.rule, ids::CLUSTER_PROBE);
    }
}
