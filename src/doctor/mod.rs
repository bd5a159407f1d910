//! `sandboxrun-operator doctor [--strict]`: front door 1 of the ADR-006 rules. Reads manifests
//! offline, runs the same engine as the webhook ([`crate::policy::rules::check`]) and prints every finding
//! with its remediation hint.
//!
//! Exit codes (ADR-006 §4, docs/contract.md "Exit codes split config from usage"): 2 — usage
//! error (unreadable file, YAML that does not parse, a SandboxRun that does not deserialize even
//! without its bad values, e.g. `spec: 42`); 1 — `--strict` and at least one failing finding (a
//! value of the wrong type or outside its enum is one: `invalid-value`);
//! 0 — otherwise. Warnings never change the exit code. Without `--strict` the same checks run and
//! the same report is printed, but failing findings do not make the exit non-zero (a report for
//! humans; `--strict` is the gate for scripts and CI).

pub(crate) mod live;
pub(crate) mod live_verdicts;
mod schema;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, ValueEnum};
use serde::Serialize;
use serde_json::json;
use thiserror::Error;

use crate::api::{SandboxRun, SandboxRunTemplateSpec, TemplateKind, TemplateRef};
use crate::policy::rules::{check, ids, sort_findings, Finding, RuleSettings, Severity};
use crate::registry::{ImageResolver, ImageSettings, RegistryCredentials};
use live_verdicts::{Probe, RefKind, StreamObject};

/// Report format.
#[derive(ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Output {
    /// One line per check, for humans.
    #[default]
    Text,
    /// A stable JSON document (see [`run`]).
    Json,
}

/// Arguments of `doctor`.
#[derive(Args, Debug, Clone, Default)]
pub struct DoctorArgs {
    /// Manifests to check: files, directories (every *.yaml, *.yml, *.json in them, sorted) or `-`
    /// for stdin. Multi-document YAML is read document by document. Given as arguments, with
    /// `-f`/`--filename` (kubectl's spelling, repeatable), or both.
    #[arg(value_name = "FILE", required_unless_present = "filename")]
    pub files: Vec<String>,
    /// Same as a FILE argument (repeatable), as `kubectl apply -f` takes it.
    #[arg(short = 'f', long = "filename", value_name = "FILE")]
    pub filename: Vec<String>,
    /// Report format.
    #[arg(long, short = 'o', value_enum, default_value_t = Output::Text)]
    pub output: Output,
    /// Also check that each image's manifest exists in its registry (HEAD, never a pull).
    #[arg(long)]
    pub check_images: bool,
    /// Exit 1 when any check fails (ADR-006). Without it the report is printed and the exit is 0
    /// unless a file cannot be read or parsed (exit 2).
    #[arg(long)]
    pub strict: bool,
    /// A dockerconfigjson (or ~/.docker/config.json) with registry credentials for --check-images.
    #[arg(long, value_name = "FILE")]
    pub docker_config: Option<PathBuf>,
    /// Registries (host[:port]) reached over plain HTTP by --check-images (loopback always is).
    #[arg(long, value_delimiter = ',')]
    pub insecure_registries: Vec<String>,
    /// Bound of one image check, in seconds.
    #[arg(long, default_value_t = 5)]
    pub image_timeout_seconds: u64,
    /// The operator's `--max-cap` to judge `sizeLimit`s with (same variable as the operator's, so
    /// CI can share the Deployment's settings). Default: the operator's default, 16Gi.
    #[arg(long, env = "SANDBOXRUN_READBACK_CAP", value_name = "QUANTITY")]
    pub max_cap: Option<String>,
    /// The operator's `--default-cap` (the cap of a path without `sizeLimit`). Default: 1Gi.
    #[arg(long, env = "SANDBOXRUN_READBACK_DEFAULT_CAP", value_name = "QUANTITY")]
    pub default_cap: Option<String>,
    /// The operator's `--max-drain-timeout` to judge `drainTimeout`s with. Default: 1h.
    #[arg(long, env = "SANDBOXRUN_MAX_DRAIN_TIMEOUT", value_name = "DURATION")]
    pub max_drain_timeout: Option<String>,
    /// The operator's `--allowed-runtime-classes` (the run policy; unset: any, empty: none).
    #[arg(long, env = "SANDBOXRUN_ALLOWED_RUNTIME_CLASSES", value_name = "NAMES")]
    pub allowed_runtime_classes: Option<String>,
    /// The operator's `--allowed-priority-classes`.
    #[arg(
        long,
        env = "SANDBOXRUN_ALLOWED_PRIORITY_CLASSES",
        value_name = "NAMES"
    )]
    pub allowed_priority_classes: Option<String>,
    /// The operator's `--allowed-toleration-keys`.
    #[arg(long, env = "SANDBOXRUN_ALLOWED_TOLERATION_KEYS", value_name = "KEYS")]
    pub allowed_toleration_keys: Option<String>,
    /// The operator's `--namespace-policies` file (docs/contract.md "The platform's namespace
    /// policies"), judged with --namespace-labels offline, with the namespace's own labels under
    /// --context (which reads the operator's published policies instead).
    #[arg(long, env = "SANDBOXRUN_NAMESPACE_POLICIES", value_name = "FILE")]
    pub namespace_policies: Option<PathBuf>,
    /// Offline: the labels (`k=v,k2=v2`) of the namespace the manifests go to, for the namespace
    /// policies that select namespaces by label (without it those are reported, not judged).
    #[arg(long, value_name = "LABELS")]
    pub namespace_labels: Option<String>,
    /// Also probe this kubeconfig context (ADR-006's live probe, advisory): the CRD, the webhook
    /// and its endpoint, the operator's heartbeat and published settings (which then replace
    /// the cap and timeout flags), a server-side dry run of each manifest and the objects its
    /// pod needs. Without it (and without --kubeconfig) doctor never contacts a cluster.
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
    /// The kubeconfig of the live probe (its current context unless --context names one).
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// A probe that cannot be made or finds the cluster not ready fails (exit 1) instead of
    /// warning; implies --strict. Needs --context or --kubeconfig.
    #[arg(long)]
    pub require_context: bool,
    /// Bound of each live probe (a duration: 5s, 500ms).
    #[arg(
        long,
        env = "SANDBOXRUN_DOCTOR_TIMEOUT",
        value_name = "DURATION",
        default_value = "5s"
    )]
    pub timeout: String,
    /// Namespace of the operator, where its published settings are (default: that of the
    /// webhook's Service, else sandboxrun-system).
    #[arg(long, value_name = "NAMESPACE")]
    pub operator_namespace: Option<String>,
}

/// An operator setting given to `doctor` as a flag that cannot serve (exit 2).
#[derive(Debug, Error)]
pub(crate) enum SettingsError {
    /// A cap that is not a byte quantity.
    #[error("--{flag} {text:?}: {source}")]
    Cap {
        /// The flag, without its dashes.
        flag: &'static str,
        /// The value.
        text: String,
        /// Why.
        #[source]
        source: crate::units::QuantityError,
    },
    /// `--max-cap` below 1Mi.
    #[error("--max-cap {0:?} is below 1Mi")]
    MaxCapTooSmall(String),
    /// `--max-drain-timeout` is not a duration.
    #[error("--max-drain-timeout {text:?}: {source}")]
    DrainTimeout {
        /// The value.
        text: String,
        /// Why.
        #[source]
        source: crate::units::DurationError,
    },
    /// `--namespace-policies` cannot be read.
    #[error("--namespace-policies {path}: {source}")]
    NamespacePoliciesRead {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// `--namespace-policies` holds policies that cannot be used.
    #[error("--namespace-policies {path}: {source}")]
    NamespacePolicies {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: crate::policy::namespace_policy::PolicyFileError,
    },
    /// A `--namespace-labels` pair that is not `key=value`.
    #[error("--namespace-labels: `{0}` is not key=value")]
    NamespaceLabel(String),
}

impl DoctorArgs {
    /// `base` with the operator settings given as flags (or their environment variables) applied,
    /// checked as the operator checks them at startup.
    pub(crate) fn rule_settings(&self, base: RuleSettings) -> Result<RuleSettings, SettingsError> {
        let mut settings = base;
        let cap = |flag: &'static str, text: &str| {
            let q = k8s_openapi::apimachinery::pkg::api::resource::Quantity(text.to_string());
            crate::units::quantity_to_bytes(&q).map_err(|source| SettingsError::Cap {
                flag,
                text: text.to_string(),
                source,
            })
        };
        if let Some(text) = &self.max_cap {
            settings.caps.max_bytes = cap("max-cap", text)?;
            if settings.caps.max_bytes < crate::units::MIB {
                return Err(SettingsError::MaxCapTooSmall(text.clone()));
            }
        }
        if let Some(text) = &self.default_cap {
            settings.caps.default_bytes = cap("default-cap", text)?;
        }
        if let Some(text) = &self.max_drain_timeout {
            let d = crate::units::parse_duration(text).map_err(|source| {
                SettingsError::DrainTimeout {
                    text: text.clone(),
                    source,
                }
            })?;
            settings.max_drain_timeout = Some(d);
        }
        use crate::policy::run_policy::parse_list;
        for (flag, field) in [
            (
                &self.allowed_runtime_classes,
                &mut settings.policy.runtime_classes,
            ),
            (
                &self.allowed_priority_classes,
                &mut settings.policy.priority_classes,
            ),
            (
                &self.allowed_toleration_keys,
                &mut settings.policy.toleration_keys,
            ),
        ] {
            if flag.is_some() {
                *field = parse_list(flag.as_deref());
            }
        }
        if let Some(path) = &self.namespace_policies {
            let text = std::fs::read_to_string(path).map_err(|source| {
                SettingsError::NamespacePoliciesRead {
                    path: path.display().to_string(),
                    source,
                }
            })?;
            settings.namespace_policies =
                crate::policy::namespace_policy::load(&text).map_err(|source| {
                    SettingsError::NamespacePolicies {
                        path: path.display().to_string(),
                        source,
                    }
                })?;
        }
        Ok(settings)
    }

    /// `--namespace-labels` as a map (None when not given).
    pub(crate) fn namespace_labels(
        &self,
    ) -> Result<Option<BTreeMap<String, String>>, SettingsError> {
        let Some(text) = &self.namespace_labels else {
            return Ok(None);
        };
        text.split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(|pair| match pair.split_once('=') {
                Some((k, v)) if !k.trim().is_empty() => {
                    Ok((k.trim().to_string(), v.trim().to_string()))
                }
                _ => Err(SettingsError::NamespaceLabel(pair.to_string())),
            })
            .collect::<Result<BTreeMap<_, _>, _>>()
            .map(Some)
    }
}

/// The namespace policies' findings about `spec` in a namespace with `labels` (None: unknown
/// offline; a policy that selects by label is then reported as not judged, a warning).
pub(crate) fn namespace_policy_findings(
    spec: &crate::api::SandboxRunSpec,
    policies: &[crate::policy::namespace_policy::Compiled],
    labels: Option<&BTreeMap<String, String>>,
) -> Vec<Finding> {
    let Some(labels) = labels else {
        let (selecting, everywhere): (Vec<_>, Vec<_>) =
            policies.iter().cloned().partition(|p| p.needs_labels());
        let mut out: Vec<Finding> = selecting
            .iter()
            .map(|p| {
                Finding::warn(
                    ids::RUN_POLICY,
                    "metadata.namespace",
                    format!(
                        "namespace policy `{}` selects namespaces by label and was not judged",
                        p.policy.name
                    ),
                    "pass --namespace-labels with the namespace's labels, or --context",
                )
            })
            .collect();
        out.extend(namespace_policy_findings(
            spec,
            &everywhere,
            Some(&BTreeMap::new()),
        ));
        return out;
    };
    crate::policy::namespace_policy::violations(spec, labels, policies)
        .into_iter()
        .map(|v| Finding::fail(ids::RUN_POLICY, v.field, v.message, v.hint))
        .collect()
}

/// Group/version and kind of the documents the doctor checks.
const API_VERSION: &str = "sandbox.iterion.io/v1alpha1";
const KIND: &str = "SandboxRun";

/// A usage error (exit 2).
#[derive(Debug, Error)]
enum UsageError {
    #[error("{0}: cannot read: {1}")]
    Read(String, std::io::Error),
    #[error("{0}#{1}: YAML does not parse: {2}")]
    Yaml(String, usize, serde_yaml::Error),
    #[error("{0}#{1}: not a valid SandboxRun: {2}")]
    Deserialize(String, usize, serde_yaml::Error),
    #[error("{0}: cannot read credentials: {1}")]
    Credentials(String, String),
    #[error("cannot start the image checker: {0}")]
    Resolver(String),
    #[error("operator settings: {0}")]
    Settings(#[from] SettingsError),
    #[error("cluster: {0}")]
    Context(#[from] live::ConnectError),
}

/// What happened to one document.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct DocReport {
    file: String,
    index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    namespace: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    /// `checked`, or `skipped` with a note.
    status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<String>,
    findings: Vec<Finding>,
}

/// Runs the doctor and writes the report to `out`; returns the exit code.
///
/// JSON report (`--output json`), version 1:
/// `{"version":1,"strict":bool,"documents":[{"file","index","namespace"?,"name"?,"status":"checked"|"skipped","note"?,"findings":[{"rule","severity":"fail"|"warn","field","message","hint"}]}],"errors":[string],"summary":{"documents","checked","skipped","failures","warnings"},"exitCode":n}`.
pub async fn run(args: DoctorArgs, settings: RuleSettings, out: &mut impl Write) -> u8 {
    let mut errors: Vec<UsageError> = Vec::new();
    let settings = args.rule_settings(settings.clone()).unwrap_or_else(|e| {
        errors.push(UsageError::Settings(e));
        settings
    });
    let resolver = image_checker(&args, &mut errors);
    let creds = registry_credentials(&args, &mut errors);
    let inputs: Vec<String> = args
        .files
        .iter()
        .chain(args.filename.iter())
        .cloned()
        .collect();
    // Read everything first: the live probe needs every namespace, and what the stream brings.
    let mut read = read_documents(&inputs, &mut errors);
    let labels = args.namespace_labels().unwrap_or_else(|e| {
        errors.push(UsageError::Settings(e));
        None
    });
    let not_given = read.merge_templates();
    let live = connect_live(&args, &read.runs, settings, &mut errors).await;
    match &live.cluster {
        Some(c) => read.templates_from_cluster(c, &not_given).await,
        None => read.templates_not_given(&not_given),
    }
    for pending in &mut read.runs {
        pending.findings.extend(
            offline_findings(
                &pending.run,
                &live.settings,
                resolver.as_ref(),
                creds.as_ref(),
            )
            .await,
        );
        // Offline, the namespace policies are judged with --namespace-labels; live, with the
        // namespace's own labels (below).
        if live.cluster.is_none() {
            let policies = &live.settings.namespace_policies;
            let found = namespace_policy_findings(&pending.run.spec, policies, labels.as_ref());
            pending.findings.extend(found);
        }
    }
    if let Some(c) = &live.cluster {
        read.probe_runs(c, &live).await;
    }
    let docs = read.into_reports();
    let report = Report {
        tally: Tally::of(&args, &docs, live.report.as_ref(), &errors),
        cluster: live.report.as_ref(),
        docs: &docs,
        errors: &errors,
    };
    let written = match args.output {
        Output::Json => report.write_json(out),
        Output::Text => report.write_text(out),
    };
    if let Err(e) = written {
        tracing::error!(error = %e, "cannot write the doctor report");
        return 2;
    }
    report.tally.code
}

/// The registry checker of `--check-images` (None without it, or when it cannot start).
fn image_checker(args: &DoctorArgs, errors: &mut Vec<UsageError>) -> Option<ImageResolver> {
    if !args.check_images {
        return None;
    }
    let s = ImageSettings {
        timeout: Duration::from_secs(args.image_timeout_seconds.max(1)),
        insecure_registries: args.insecure_registries.clone(),
        ..Default::default()
    };
    ImageResolver::new(s)
        .map_err(|e| errors.push(UsageError::Resolver(e.to_string())))
        .ok()
}

/// The registry credentials of `--docker-config`, when given and readable.
fn registry_credentials(
    args: &DoctorArgs,
    errors: &mut Vec<UsageError>,
) -> Option<RegistryCredentials> {
    let p = args.docker_config.as_ref()?;
    std::fs::read(p)
        .map_err(|e| e.to_string())
        .and_then(|bytes| {
            RegistryCredentials::from_docker_config(&bytes).map_err(|e| e.to_string())
        })
        .map_err(|e| errors.push(UsageError::Credentials(p.display().to_string(), e)))
        .ok()
}

/// Every document of the input: its report (in input order), the checkable runs, and the
/// objects the stream brings along (what a run may reference).
#[derive(Default)]
struct ReadDocuments {
    docs: Vec<DocReport>,
    /// The checkable runs (each names its report's index in `docs`).
    runs: Vec<PendingRun>,
    stream: BTreeSet<StreamObject>,
    stream_namespaces: BTreeSet<String>,
    /// The templates of the inputs: a run that names one is judged merged with it.
    templates: Vec<InputTemplate>,
}

/// Reads and classifies every document of `inputs`.
fn read_documents(inputs: &[String], errors: &mut Vec<UsageError>) -> ReadDocuments {
    let mut read = ReadDocuments::default();
    for (label, text) in read_inputs(inputs, errors) {
        for (index, doc) in serde_yaml::Deserializer::from_str(&text).enumerate() {
            let value = match <serde_yaml::Value as serde::Deserialize>::deserialize(doc) {
                Ok(v) => v,
                Err(e) => {
                    // The YAML stream cannot be resynchronized after a syntax error.
                    errors.push(UsageError::Yaml(label.clone(), index, e));
                    break;
                }
            };
            note_stream_object(&value, &mut read.stream, &mut read.stream_namespaces);
            let json = serde_json::to_value(&value).unwrap_or_default();
            match classify(&label, index, value) {
                Classified::Run(run, report, findings) => {
                    read.runs.push(PendingRun {
                        doc: read.docs.len(),
                        run,
                        json,
                        findings,
                    });
                    read.docs.push(report);
                }
                Classified::Empty => {}
                Classified::Template(template, report) => {
                    read.templates.push(*template);
                    read.docs.push(report);
                }
                Classified::Skipped(report) => read.docs.push(report),
                Classified::Invalid(e) => errors.push(e),
            }
        }
    }
    read
}

impl ReadDocuments {
    /// Adds what the live probe finds about each run (the server-side dry run, the objects its
    /// pod needs, a namespace the operator does not watch, its store, its namespace's policies).
    async fn probe_runs(&mut self, c: &live::Cluster, live: &Live) {
        let policies = &live.settings.namespace_policies;
        let targets: Vec<(&serde_json::Value, &SandboxRun, String)> = self
            .runs
            .iter()
            .map(|r| {
                (
                    &r.json,
                    r.run.as_ref(),
                    namespace_of(&r.run, &c.default_namespace),
                )
            })
            .collect();
        let probed = live::probe_runs(c, &targets, &self.stream, &self.stream_namespaces).await;
        let namespaces: Vec<String> = targets.into_iter().map(|(_, _, ns)| ns).collect();
        let mut labels: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
        for ((pending, found), namespace) in self.runs.iter_mut().zip(probed).zip(namespaces) {
            pending.findings.extend(found);
            pending
                .findings
                .extend(crate::policy::rules::unwatched_namespace(
                    Some(&namespace),
                    &live.watched,
                ));
            // The store, as the operator would resolve it (only with its published rules: an
            // older operator's record has none; the dry run still judges a named store).
            if let Some(tenant) = &live.tenant {
                if !pending.run.spec.read_back_paths().is_empty() {
                    let found = c
                        .probe_store(&pending.run, &namespace, tenant, &self.stream)
                        .await;
                    pending.findings.extend(found);
                }
            }
            if policies.is_empty() {
                continue;
            }
            if !labels.contains_key(&namespace) {
                // A namespace that does not exist (or cannot be read) is reported by the dry run;
                // its policies are then judged as for a namespace without labels.
                let read = c.namespace_labels(&namespace).await.ok().flatten();
                labels.insert(namespace.clone(), read.unwrap_or_default());
            }
            let found =
                namespace_policy_findings(&pending.run.spec, policies, labels.get(&namespace));
            pending.findings.extend(found);
        }
    }

    /// Each run that names a template (docs/contract.md "Templates") is judged as the webhook
    /// judges it: merged with the template of the same kind and name (and namespace, for a
    /// SandboxRunTemplate) in the inputs, a locked field it sets refused by name. Returns the
    /// runs (their index) whose template is not in the inputs.
    fn merge_templates(&mut self) -> Vec<usize> {
        let mut not_given = Vec::new();
        for (i, pending) in self.runs.iter_mut().enumerate() {
            let Some(reference) = pending.run.spec.template_ref.clone() else {
                continue;
            };
            let ns = pending.run.metadata.namespace.clone();
            let template = self
                .templates
                .iter()
                .find(|t| t.is(&reference, ns.as_deref()));
            match template {
                Some(t) => {
                    let ns = ns.unwrap_or_else(|| "-".into());
                    let judged = crate::policy::templates::judge_with(
                        Some(&t.spec),
                        &ns,
                        &reference,
                        &pending.run.spec,
                        None,
                    );
                    pending.made_from(judged);
                }
                None => not_given.push(i),
            }
        }
        not_given
    }

    /// Offline, a run whose template is not in the inputs (`not_given`) is judged on its own
    /// spec, with a warning.
    fn templates_not_given(&mut self, not_given: &[usize]) {
        for (_, pending) in self
            .runs
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| not_given.contains(i))
        {
            let Some(reference) = &pending.run.spec.template_ref else {
                continue;
            };
            let same = if reference.kind.namespaced() {
                " (same namespace)"
            } else {
                ""
            };
            pending.findings.push(Finding::warn(
                crate::policy::rules::ids::TEMPLATE_UNUSABLE,
                "spec.templateRef.name",
                format!("the {} is not in these inputs: the run's own spec is judged, not the spec it would run with", reference.label()),
                format!("give doctor the template's manifest too{same}, or --context to read it from the cluster"),
            ));
        }
    }

    /// With `--context`, a run whose template is not in the inputs (`not_given`) is judged
    /// merged with the template read from the cluster, as the webhook would judge it
    /// ([`crate::doctor::live_verdicts::template_from_cluster`]).
    async fn templates_from_cluster(&mut self, c: &live::Cluster, not_given: &[usize]) {
        for (_, pending) in self
            .runs
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| not_given.contains(i))
        {
            let Some(reference) = pending.run.spec.template_ref.clone() else {
                continue;
            };
            let ns = namespace_of(&pending.run, &c.default_namespace);
            let read = c.template(&reference, &ns).await;
            let judged = crate::doctor::live_verdicts::template_from_cluster(
                c.probe(),
                &reference,
                &ns,
                read,
                &pending.run.spec,
            );
            pending.made_from(judged);
        }
    }

    /// The reports, each run's findings sorted into its own.
    fn into_reports(self) -> Vec<DocReport> {
        let mut docs = self.docs;
        for pending in self.runs {
            let mut findings = pending.findings;
            sort_findings(&mut findings);
            if let Some(report) = docs.get_mut(pending.doc) {
                report.findings = findings;
            }
        }
        docs
    }
}

/// The rules' findings about `run`, and with `--check-images` its image's.
async fn offline_findings(
    run: &SandboxRun,
    settings: &RuleSettings,
    resolver: Option<&ImageResolver>,
    creds: Option<&RegistryCredentials>,
) -> Vec<Finding> {
    let mut findings = check(&run.spec, settings);
    if let (Some(resolver), Some(image)) = (resolver, run.spec.image.as_deref()) {
        if !image.trim().is_empty() {
            let verdict = resolver.resolve(image.trim(), creds).await;
            findings.extend(crate::policy::resolvable::finding(&verdict, image.trim()));
        }
    }
    findings
}

/// What the live probe brings: the cluster (to probe each run), its report, and the settings
/// to judge with (the operator's published ones when they can be read).
struct Live {
    cluster: Option<live::Cluster>,
    report: Option<ClusterReport>,
    settings: RuleSettings,
    /// The namespaces the operator watches, as it published them (empty: every namespace).
    watched: Vec<String>,
    /// The operator's tenant-store rules, as it published them (None: not published).
    tenant: Option<crate::store::tenant::TenantStorePolicy>,
}

/// The live probe (`--context` / `--kubeconfig`), when asked for and nothing went wrong so far.
async fn connect_live(
    args: &DoctorArgs,
    runs: &[PendingRun],
    settings: RuleSettings,
    errors: &mut Vec<UsageError>,
) -> Live {
    let mut live = Live {
        cluster: None,
        report: None,
        settings,
        watched: Vec::new(),
        tenant: None,
    };
    let wanted = args.context.is_some() || args.kubeconfig.is_some();
    if args.require_context && !wanted {
        errors.push(UsageError::Context(live::ConnectError::NothingToProbe));
    }
    if !wanted || !errors.is_empty() {
        return live;
    }
    let probe = Probe {
        required: args.require_context,
    };
    let connected = match parse_timeout(&args.timeout) {
        Err(e) => Err(e.into()),
        Ok(timeout) => {
            live::connect(
                args.context.as_deref(),
                args.kubeconfig.as_ref(),
                timeout,
                probe,
            )
            .await
        }
    };
    let c = match connected {
        Ok(c) => c,
        Err(e) => {
            errors.push(UsageError::Context(e));
            return live;
        }
    };
    let namespaces: BTreeSet<String> = runs
        .iter()
        .map(|r| namespace_of(&r.run, &c.default_namespace))
        .collect();
    let found = c
        .probe_cluster(&namespaces, args.operator_namespace.as_deref())
        .await;
    let mut report = ClusterReport {
        context: c.context.clone(),
        settings_source: None,
        settings: None,
        findings: found.findings,
    };
    if let Some(published) = found.published {
        live.settings = published.settings.rules.clone();
        live.watched = published.settings.watched_namespaces.clone();
        live.tenant = published.settings.tenant_stores.clone();
        report.settings = Some(published.settings.describe());
        report.settings_source = Some(published.source);
    }
    live.report = Some(report);
    live.cluster = Some(c);
    live
}

/// A SandboxRun read from the input, checked once the settings are known.
struct PendingRun {
    /// Its report's index in the list of documents.
    doc: usize,
    run: Box<SandboxRun>,
    /// The document as written (for the server-side dry run).
    json: serde_json::Value,
    findings: Vec<Finding>,
}

impl PendingRun {
    /// The run as its template makes it: judged as the merged spec, or with the template's
    /// findings (a locked field, a template that cannot be used or read).
    fn made_from(&mut self, judged: crate::policy::templates::Templated) {
        use crate::policy::templates::Templated;
        match judged {
            Templated::Merged { new, .. } => {
                if let Ok(spec) = serde_json::from_value(new) {
                    self.run.spec = spec;
                }
            }
            Templated::Refused(findings) | Templated::Plain(findings) => {
                self.findings.extend(findings)
            }
        }
    }
}

/// What the live probe found about the cluster (JSON: the report's `cluster`).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ClusterReport {
    context: String,
    /// `namespace/name` of the operator's published settings, when they were used.
    #[serde(skip_serializing_if = "Option::is_none")]
    settings_source: Option<String>,
    /// Those settings, in words.
    #[serde(skip_serializing_if = "Option::is_none")]
    settings: Option<String>,
    findings: Vec<Finding>,
}

/// The namespace `run` goes to: its own, else the context's.
fn namespace_of(run: &SandboxRun, default: &str) -> String {
    run.metadata
        .namespace
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| default.to_string())
}

/// `--timeout` (empty: 5 s).
fn parse_timeout(text: &str) -> Result<Duration, live::TimeoutError> {
    if text.trim().is_empty() {
        return Ok(DEFAULT_PROBE_TIMEOUT);
    }
    match crate::units::parse_duration(text.trim()) {
        Ok(d) if !d.is_zero() => Ok(d),
        Ok(_) => Err(live::TimeoutError::NotPositive(text.to_string())),
        Err(source) => Err(live::TimeoutError::NotADuration {
            text: text.to_string(),
            source,
        }),
    }
}

/// The default bound of each live probe (ADR-006: 5 s).
const DEFAULT_PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Records an object of the input a run may reference (a Secret, a PVC, a Namespace, …).
fn note_stream_object(
    value: &serde_yaml::Value,
    stream: &mut BTreeSet<StreamObject>,
    namespaces: &mut BTreeSet<String>,
) {
    let text = |v: Option<&serde_yaml::Value>| v.and_then(|v| v.as_str()).map(str::to_string);
    let kind = text(value.get("kind")).unwrap_or_default();
    let meta = value.get("metadata");
    let Some(name) = text(meta.and_then(|m| m.get("name"))) else {
        return;
    };
    if kind == "Namespace" {
        namespaces.insert(name);
        return;
    }
    if let Some(k) = RefKind::of_kind(&kind) {
        let ns = if k.namespaced() {
            text(meta.and_then(|m| m.get("namespace"))).unwrap_or_else(|| "default".to_string())
        } else {
            String::new()
        };
        stream.insert((k, ns, name));
    }
}

/// What one YAML document is.
enum Classified {
    /// A SandboxRun to check, with what the apiserver would judge before the rules
    /// ([`document_findings`]).
    Run(Box<SandboxRun>, DocReport, Vec<Finding>),
    /// A SandboxRunTemplate or ClusterSandboxRunTemplate: the runs that name it are judged
    /// merged with it (reported as skipped, with a note).
    Template(Box<InputTemplate>, DocReport),
    /// Another kind: reported with a note.
    Skipped(DocReport),
    /// An empty document (e.g. a trailing `---`): ignored silently.
    Empty,
    /// A SandboxRun that does not deserialize (usage error).
    Invalid(UsageError),
}

fn classify(label: &str, index: usize, value: serde_yaml::Value) -> Classified {
    if value.is_null() {
        return Classified::Empty;
    }
    let field = |k: &str| value.get(k).and_then(|v| v.as_str()).map(str::to_string);
    let meta = |k: &str| {
        value
            .get("metadata")
            .and_then(|m| m.get(k))
            .and_then(|v| v.as_str())
            .map(str::to_string)
    };
    let (api_version, kind) = (field("apiVersion"), field("kind"));
    let mut report = DocReport {
        file: label.to_string(),
        index,
        namespace: meta("namespace"),
        name: meta("name"),
        status: "checked",
        note: None,
        findings: Vec::new(),
    };
    if let Some(template_kind) = template_kind(api_version.as_deref(), kind.as_deref()) {
        report.status = "skipped";
        let what = template_kind.as_str();
        return match InputTemplate::of(template_kind, value) {
            Ok(template) => {
                report.note = Some(format!(
                    "a {what}: the runs of these inputs that name it are judged merged with it"
                ));
                Classified::Template(Box::new(template), report)
            }
            Err(e) => {
                report.note = Some(format!("a {what} that does not parse: {e}"));
                Classified::Skipped(report)
            }
        };
    }
    let findings = document_findings(&value);
    let like = sandbox_run_like(api_version.as_deref(), kind.as_deref());
    if !like && (api_version.as_deref() != Some(API_VERSION) || kind.as_deref() != Some(KIND)) {
        report.status = "skipped";
        report.note = Some(format!(
            "not a {API_VERSION} {KIND} (apiVersion {}, kind {})",
            api_version.as_deref().unwrap_or("unset"),
            kind.as_deref().unwrap_or("unset")
        ));
        return Classified::Skipped(report);
    }
    // A value outside its type or enum is a finding (in `findings`); the rest is still judged.
    match serde_yaml::from_value::<SandboxRun>(without_invalid_values(&value)) {
        Ok(run) => Classified::Run(Box::new(run), report, findings),
        // Still not a SandboxRun: the error of the document as written says why.
        Err(e) => {
            let e = serde_yaml::from_value::<SandboxRun>(value)
                .err()
                .unwrap_or(e);
            Classified::Invalid(UsageError::Deserialize(label.to_string(), index, e))
        }
    }
}

/// The template kind of a document of our group and version (None: not a template).
fn template_kind(api_version: Option<&str>, kind: Option<&str>) -> Option<TemplateKind> {
    if api_version != Some(API_VERSION) {
        return None;
    }
    [
        TemplateKind::SandboxRunTemplate,
        TemplateKind::ClusterSandboxRunTemplate,
    ]
    .into_iter()
    .find(|k| Some(k.as_str()) == kind)
}

/// A template of the inputs (either kind).
#[derive(Debug)]
struct InputTemplate {
    kind: TemplateKind,
    /// Its namespace (a SandboxRunTemplate's; None for a cluster template).
    namespace: Option<String>,
    name: String,
    spec: SandboxRunTemplateSpec,
}

impl InputTemplate {
    fn of(
        kind: TemplateKind,
        value: serde_yaml::Value,
    ) -> Result<InputTemplate, serde_yaml::Error> {
        let (meta, spec) = match kind {
            TemplateKind::SandboxRunTemplate => {
                let t: crate::api::SandboxRunTemplate = serde_yaml::from_value(value)?;
                (t.metadata, t.spec)
            }
            TemplateKind::ClusterSandboxRunTemplate => {
                let t: crate::api::ClusterSandboxRunTemplate = serde_yaml::from_value(value)?;
                (t.metadata, t.spec.0)
            }
        };
        Ok(InputTemplate {
            kind,
            namespace: meta.namespace.filter(|_| kind.namespaced()),
            name: meta.name.unwrap_or_default(),
            spec,
        })
    }

    /// Whether this is the template `reference` names for a run of `namespace`.
    fn is(&self, reference: &TemplateRef, namespace: Option<&str>) -> bool {
        self.kind == reference.kind
            && self.name == reference.name
            && (!self.kind.namespaced() || self.namespace.as_deref() == namespace)
    }
}

/// Whether a document is meant to be a SandboxRun even if its apiVersion or kind is off: our
/// group with any version or kind, or a kind that is SandboxRun in another case, its plural, its
/// short name or a near typo of it.
fn sandbox_run_like(api_version: Option<&str>, kind: Option<&str>) -> bool {
    let group = api_version.map(|v| v.split_once('/').map_or(v, |(g, _)| g));
    if group == Some(crate::api::GROUP) {
        return true;
    }
    kind.is_some_and(|k| {
        let k = k.to_ascii_lowercase();
        ["sandboxrun", "sandboxruns", "sbr"].contains(&k.as_str())
            || strsim::damerau_levenshtein(&k, "sandboxrun") <= 2
    })
}

/// `value` without the values its structural schema refuses ([`schema::invalid_values`]):
/// what `doctor` deserializes and judges, so that one bad value does not hide the other rules.
pub fn without_invalid_values(value: &serde_yaml::Value) -> serde_yaml::Value {
    serde_json::to_value(value)
        .ok()
        .and_then(|json| serde_yaml::to_value(schema::invalid_values(&json).1).ok())
        .unwrap_or_else(|| value.clone())
}

/// What the cluster judges before the webhook sees a document that should be a SandboxRun: its
/// apiVersion and kind ([`ids::API_VERSION_KIND`]), the fields its structural schema does not
/// know ([`schema::unknown_fields`]) and the values outside their type or enum
/// ([`schema::invalid_values`]). Empty for a document that is not SandboxRun-like.
pub fn document_findings(value: &serde_yaml::Value) -> Vec<Finding> {
    let field = |k: &str| value.get(k).and_then(|v| v.as_str());
    let (api_version, kind) = (field("apiVersion"), field("kind"));
    if !sandbox_run_like(api_version, kind) {
        return Vec::new();
    }
    let mut out = Vec::new();
    if api_version != Some(API_VERSION) {
        out.push(Finding::fail(
            ids::API_VERSION_KIND,
            "apiVersion",
            format!(
                "apiVersion {} is not served for SandboxRuns: the cluster answers \"no matches for kind\"",
                api_version.map_or_else(|| "unset".to_string(), |v| format!("{v:?}"))
            ),
            format!("apiVersion: {API_VERSION} (the only version the CRD serves)"),
        ));
    }
    if kind != Some(KIND) {
        out.push(Finding::fail(
            ids::API_VERSION_KIND,
            "kind",
            format!(
                "kind {} is not a kind the cluster serves in {}: kinds are case-sensitive",
                kind.map_or_else(|| "unset".to_string(), |k| format!("{k:?}")),
                crate::api::GROUP
            ),
            format!("kind: {KIND}"),
        ));
    }
    match serde_json::to_value(value) {
        Ok(json) => {
            out.extend(schema::unknown_fields(&json));
            out.extend(schema::invalid_values(&json).0);
        }
        Err(e) => tracing::debug!(error = %e, "document is not JSON-shaped; fields not walked"),
    }
    sort_findings(&mut out);
    out
}

/// (label, content) of every input, in order; unreadable inputs are recorded as usage errors.
fn read_inputs(files: &[String], errors: &mut Vec<UsageError>) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for f in files {
        if f == "-" {
            let mut text = String::new();
            match std::io::stdin().read_to_string(&mut text) {
                Ok(_) => out.push(("<stdin>".to_string(), text)),
                Err(e) => errors.push(UsageError::Read("<stdin>".to_string(), e)),
            }
            continue;
        }
        let path = Path::new(f);
        if path.is_dir() {
            match manifests_in(path) {
                Ok(paths) => {
                    for p in paths {
                        read_one(&p, &mut out, errors);
                    }
                }
                Err(e) => errors.push(UsageError::Read(f.clone(), e)),
            }
        } else {
            read_one(path, &mut out, errors);
        }
    }
    out
}

fn read_one(path: &Path, out: &mut Vec<(String, String)>, errors: &mut Vec<UsageError>) {
    let label = path.display().to_string();
    match std::fs::read_to_string(path) {
        Ok(text) => out.push((label, text)),
        Err(e) => errors.push(UsageError::Read(label, e)),
    }
}

/// Every *.yaml, *.yml, *.json directly in `dir`, sorted by name.
fn manifests_in(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut paths = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let p = entry?.path();
        let ext = p.extension().and_then(|e| e.to_str()).unwrap_or("");
        if p.is_file() && matches!(ext, "yaml" | "yml" | "json") {
            paths.push(p);
        }
    }
    paths.sort();
    Ok(paths)
}

/// The totals the report ends with.
struct Tally {
    failures: usize,
    warnings: usize,
    code: u8,
    strict: bool,
}

impl Tally {
    /// The counts and the exit code: 2 on a usage error, 1 with `--strict` (or
    /// `--require-context`) and a failure, else 0.
    fn of(
        args: &DoctorArgs,
        docs: &[DocReport],
        cluster: Option<&ClusterReport>,
        errors: &[UsageError],
    ) -> Tally {
        let cluster_findings = cluster.map(|c| c.findings.as_slice()).unwrap_or_default();
        let all_findings = || {
            docs.iter()
                .flat_map(|d| &d.findings)
                .chain(cluster_findings)
        };
        let failures = all_findings().filter(|f| f.is_fail()).count();
        let warnings = all_findings()
            .filter(|f| f.severity == Severity::Warn)
            .count();
        let strict = args.strict || args.require_context;
        let code: u8 = if !errors.is_empty() {
            2
        } else if strict && failures > 0 {
            1
        } else {
            0
        };
        Tally {
            failures,
            warnings,
            code,
            strict,
        }
    }
}

/// Everything the report says: the live probe's cluster, each document, the usage errors and
/// the totals.
struct Report<'a> {
    cluster: Option<&'a ClusterReport>,
    docs: &'a [DocReport],
    errors: &'a [UsageError],
    tally: Tally,
}

impl Report<'_> {
    /// The JSON report (its format: [`run`]).
    fn write_json(&self, out: &mut impl Write) -> std::io::Result<()> {
        let Report {
            cluster,
            docs,
            errors,
            tally,
        } = self;
        let checked = docs.iter().filter(|d| d.status == "checked").count();
        let mut report = json!({
            "version": 1,
            "strict": tally.strict,
            "documents": docs,
            "errors": errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "summary": {
                "documents": docs.len(),
                "checked": checked,
                "skipped": docs.len() - checked,
                "failures": tally.failures,
                "warnings": tally.warnings,
            },
            "exitCode": tally.code,
        });
        if let (Some(c), Some(obj)) = (cluster, report.as_object_mut()) {
            obj.insert("cluster".into(), json!(c));
        }
        serde_json::to_writer_pretty(&mut *out, &report)
            .map_err(std::io::Error::other)
            .and_then(|()| writeln!(out))
    }

    /// The text report: the cluster, each document, the usage errors, then the totals.
    fn write_text(&self, out: &mut impl Write) -> std::io::Result<()> {
        let Tally {
            failures,
            warnings,
            code,
            strict,
        } = self.tally;
        if let Some(c) = self.cluster {
            write_cluster(out, c)?;
        }
        for d in self.docs {
            write_document(out, d)?;
        }
        for e in self.errors {
            writeln!(out, "✗ error: {e}")?;
        }
        let checked = self.docs.iter().filter(|d| d.status == "checked").count();
        let verdict = match code {
            2 => "usage error".to_string(),
            1 => "failed (--strict)".to_string(),
            _ if failures > 0 && !strict => {
                "failures reported (exit 0 without --strict)".to_string()
            }
            _ => "ok".to_string(),
        };
        writeln!(
            out,
            "{checked} checked, {} skipped, {failures} failure(s), {warnings} warning(s), {} error(s): {verdict}",
            self.docs.len() - checked,
            self.errors.len()
        )
    }
}

/// The live probe's lines: which settings judged, then its findings (or that all is well).
fn write_cluster(out: &mut impl Write, c: &ClusterReport) -> std::io::Result<()> {
    let who = format!("cluster {}", c.context);
    match (&c.settings_source, &c.settings) {
        (Some(source), Some(settings)) => writeln!(
            out,
            "- {who}: judged with the operator's published settings ({source}): {settings}"
        )?,
        _ => writeln!(
            out,
            "- {who}: judged with doctor's own settings (flags or defaults)"
        )?,
    }
    if c.findings.is_empty() {
        writeln!(
            out,
            "✓ {who} CRD served, webhook ready with its caBundle, operator Ready"
        )?;
    }
    write_findings(out, &who, &c.findings)
}

/// One document's lines: skipped, all passed, or its findings.
fn write_document(out: &mut impl Write, d: &DocReport) -> std::io::Result<()> {
    let who = format!(
        "{}#{} {}/{}",
        d.file,
        d.index,
        d.namespace.as_deref().unwrap_or("-"),
        d.name.as_deref().unwrap_or("-")
    );
    if d.status == "skipped" {
        return writeln!(out, "- {who} skipped: {}", d.note.as_deref().unwrap_or(""));
    }
    if d.findings.is_empty() {
        writeln!(out, "✓ {who} all checks passed")?;
    }
    write_findings(out, &who, &d.findings)
}

/// A line per finding about `who`: its mark, rule, field, message and hint.
fn write_findings(out: &mut impl Write, who: &str, findings: &[Finding]) -> std::io::Result<()> {
    for f in findings {
        let mark = if f.is_fail() { "✗" } else { "⚠" };
        writeln!(
            out,
            "{mark} {who} {} {}: {} — hint: {}",
            f.rule, f.field, f.message, f.hint
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn doctor(files: Vec<String>, strict: bool, output: Output) -> (u8, String) {
        let args = DoctorArgs {
            files,
            strict,
            output,
            ..Default::default()
        };
        let mut buf = Vec::new();
        let code = run(args, RuleSettings::default(), &mut buf).await;
        (code, String::from_utf8_lossy(&buf).into_owned())
    }

    fn write(dir: &Path, name: &str, text: &str) -> String {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap_or_else(|e| panic!("{e}"));
        p.display().to_string()
    }

    const GOOD: &str = "apiVersion: sandbox.iterion.io/v1alpha1\nkind: SandboxRun\nmetadata: {name: good}\nspec:\n  image: ghcr.io/a/b@sha256:0000000000000000000000000000000000000000000000000000000000000000\n  user: \"1000\"\n";
    const ROOT: &str = "apiVersion: sandbox.iterion.io/v1alpha1\nkind: SandboxRun\nmetadata: {name: root, namespace: dev}\nspec:\n  image: alpine:3\n  user: \"0\"\n";

    #[test]
    fn the_probe_timeout_is_a_positive_duration_defaulting_to_five_seconds() {
        assert_eq!(parse_timeout(""), Ok(Duration::from_secs(5)));
        assert_eq!(parse_timeout("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_timeout("2s"), Ok(Duration::from_secs(2)));
        assert!(parse_timeout("0s").is_err());
        assert!(parse_timeout("soon").is_err());
    }

    #[tokio::test]
    async fn the_live_probe_needs_a_context_and_a_kubeconfig_that_names_it() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let f = write(dir.path(), "good.yaml", GOOD);
        let mut buf = Vec::new();
        let args = DoctorArgs {
            files: vec![f.clone()],
            require_context: true,
            ..Default::default()
        };
        let code = run(args, RuleSettings::default(), &mut buf).await;
        let out = String::from_utf8_lossy(&buf).into_owned();
        assert_eq!(code, 2, "{out}");
        assert!(
            out.contains("--require-context needs --context or --kubeconfig"),
            "{out}"
        );
        // A context the kubeconfig does not have: a usage error, before any connection.
        let kubeconfig = write(
            dir.path(),
            "kubeconfig",
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'https://127.0.0.1:1'}\n\
             users:\n- name: u\n  user: {token: t}\ncontexts:\n- name: here\n  context: {cluster: c, user: u}\n\
             current-context: here\n",
        );
        let mut buf = Vec::new();
        let args = DoctorArgs {
            files: vec![f],
            strict: true,
            context: Some("elsewhere".into()),
            kubeconfig: Some(PathBuf::from(kubeconfig)),
            ..Default::default()
        };
        let code = run(args, RuleSettings::default(), &mut buf).await;
        let out = String::from_utf8_lossy(&buf).into_owned();
        assert_eq!(code, 2, "{out}");
        assert!(out.contains("\"elsewhere\": no such context"), "{out}");
    }

    #[tokio::test]
    async fn an_unreachable_cluster_only_warns_unless_required_and_every_probe_is_bounded() {
        // Nothing listens on port 1: every probe fails at once; the verdicts of the rules stand.
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let f = write(dir.path(), "good.yaml", GOOD);
        let kubeconfig = write(
            dir.path(),
            "kubeconfig",
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'https://127.0.0.1:1'}\n\
             users:\n- name: u\n  user: {token: t}\ncontexts:\n- name: here\n  context: {cluster: c, user: u}\n\
             current-context: here\n",
        );
        let probe = |require: bool| {
            let (f, kubeconfig) = (f.clone(), kubeconfig.clone());
            async move {
                let mut buf = Vec::new();
                let args = DoctorArgs {
                    files: vec![f],
                    strict: true,
                    kubeconfig: Some(PathBuf::from(kubeconfig)),
                    require_context: require,
                    timeout: "2s".into(),
                    ..Default::default()
                };
                let started = std::time::Instant::now();
                let code = run(args, RuleSettings::default(), &mut buf).await;
                (
                    code,
                    String::from_utf8_lossy(&buf).into_owned(),
                    started.elapsed(),
                )
            }
        };
        let (code, out, took) = probe(false).await;
        assert_eq!(code, 0, "{out}");
        assert!(out.contains("⚠ cluster here cluster-probe"), "{out}");
        assert!(!out.contains('✗'), "{out}");
        assert!(took < Duration::from_secs(60), "bounded: {took:?}");
        let (code, out, _) = probe(true).await;
        assert_eq!(code, 1, "{out}");
        assert!(out.contains("✗ cluster here cluster-probe"), "{out}");
    }

    #[tokio::test]
    async fn strict_exits_one_on_a_failure_and_zero_without_strict() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let f = write(dir.path(), "root.yaml", ROOT);
        let (code, text) = doctor(vec![f.clone()], true, Output::Text).await;
        assert_eq!(code, 1, "{text}");
        assert!(
            text.contains("✗")
                && text.contains("dev/root")
                && text.contains("user-non-root")
                && text.contains("hint:"),
            "{text}"
        );
        assert!(
            text.contains("⚠") && text.contains("image-digest"),
            "{text}"
        );
        let (code, _) = doctor(vec![f], false, Output::Text).await;
        assert_eq!(code, 0);
    }

    #[tokio::test]
    async fn other_kinds_are_skipped_with_a_note_and_multi_docs_are_indexed() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let text =
            format!("apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: c}}\n---\n{GOOD}---\n");
        let f = write(dir.path(), "multi.yaml", &text);
        let (code, out) = doctor(vec![f], true, Output::Text).await;
        assert_eq!(code, 0, "{out}");
        assert!(out.contains("multi.yaml#0 -/c skipped"), "{out}");
        assert!(
            out.contains("multi.yaml#1 -/good all checks passed"),
            "{out}"
        );
        assert!(out.contains("1 checked, 1 skipped, 0 failure(s)"), "{out}");
    }

    #[tokio::test]
    async fn a_run_is_judged_merged_with_a_template_of_the_inputs_and_refused_for_a_locked_field() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let template = "apiVersion: sandbox.iterion.io/v1alpha1\nkind: SandboxRunTemplate\nmetadata: {name: ci, namespace: dev}\nspec:\n  openFields: [command]\n  template:\n    image: ghcr.io/a/b@sha256:0000000000000000000000000000000000000000000000000000000000000000\n    user: \"1000\"\n";
        let run = |extra: &str| {
            format!("apiVersion: sandbox.iterion.io/v1alpha1\nkind: SandboxRun\nmetadata: {{name: r, namespace: dev}}\nspec:\n  templateRef: {{name: ci}}\n  command: [make]\n{extra}")
        };
        let open = write(
            dir.path(),
            "open.yaml",
            &format!("{template}---\n{}", run("")),
        );
        let (code, out) = doctor(vec![open], true, Output::Text).await;
        assert_eq!(
            code, 0,
            "merged: the template gives the image and the user\n{out}"
        );
        assert!(out.contains("open.yaml#0 dev/ci skipped"), "{out}");
        let locked = write(
            dir.path(),
            "locked.yaml",
            &format!("{template}---\n{}", run("  user: \"0\"\n")),
        );
        let (code, out) = doctor(vec![locked], true, Output::Text).await;
        assert_eq!(code, 1, "{out}");
        assert!(
            out.contains("template-locked") && out.contains("spec.user"),
            "{out}"
        );
        let alone = write(dir.path(), "alone.yaml", &run(""));
        let (code, out) = doctor(vec![alone], true, Output::Text).await;
        assert_eq!(code, 1, "judged on its own: no image\n{out}");
        assert!(
            out.contains("template-unusable") && out.contains("not in these inputs"),
            "{out}"
        );
    }

    #[tokio::test]
    async fn a_run_is_judged_merged_with_a_cluster_template_of_the_inputs_by_kind() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let template = |kind: &str, meta: &str| {
            format!("apiVersion: sandbox.iterion.io/v1alpha1\nkind: {kind}\nmetadata: {meta}\nspec:\n  openFields: [command]\n  template:\n    image: ghcr.io/a/b@sha256:0000000000000000000000000000000000000000000000000000000000000000\n    user: \"1000\"\n")
        };
        let cluster = template("ClusterSandboxRunTemplate", "{name: ci}");
        let run = |reference: &str, extra: &str| {
            format!("apiVersion: sandbox.iterion.io/v1alpha1\nkind: SandboxRun\nmetadata: {{name: r, namespace: dev}}\nspec:\n  templateRef: {reference}\n  command: [make]\n{extra}")
        };
        let by_kind = "{kind: ClusterSandboxRunTemplate, name: ci}";
        let open = write(
            dir.path(),
            "open.yaml",
            &format!("{cluster}---\n{}", run(by_kind, "")),
        );
        let (code, out) = doctor(vec![open], true, Output::Text).await;
        assert_eq!(code, 0, "merged with the cluster template\n{out}");
        assert!(out.contains("a ClusterSandboxRunTemplate"), "{out}");
        let locked = write(
            dir.path(),
            "locked.yaml",
            &format!("{cluster}---\n{}", run(by_kind, "  user: \"0\"\n")),
        );
        let (code, out) = doctor(vec![locked], true, Output::Text).await;
        assert_eq!(code, 1, "{out}");
        assert!(
            out.contains("template-locked")
                && out.contains("spec.user")
                && out.contains("ClusterSandboxRunTemplate ci"),
            "{out}"
        );
        // A run naming the namespaced template of the same name is not made from the cluster one.
        let other = write(
            dir.path(),
            "other.yaml",
            &format!("{cluster}---\n{}", run("{name: ci}", "")),
        );
        let (code, out) = doctor(vec![other], true, Output::Text).await;
        assert_eq!(code, 1, "judged on its own: no image\n{out}");
        assert!(
            out.contains("template-unusable")
                && out.contains("SandboxRunTemplate ci is not in these inputs"),
            "{out}"
        );
    }

    #[tokio::test]
    async fn unreadable_unparseable_and_undeserializable_inputs_exit_two() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let (code, out) = doctor(
            vec![dir.path().join("missing.yaml").display().to_string()],
            true,
            Output::Text,
        )
        .await;
        assert_eq!(code, 2, "{out}");
        assert!(out.contains("cannot read"), "{out}");
        let bad = write(dir.path(), "bad.yaml", "a: [unclosed\n");
        assert_eq!(doctor(vec![bad], false, Output::Text).await.0, 2);
        let wrong = write(dir.path(), "wrong.yaml", "apiVersion: sandbox.iterion.io/v1alpha1\nkind: SandboxRun\nmetadata: {name: w}\nspec: 42\n");
        let (code, out) = doctor(vec![wrong], false, Output::Text).await;
        assert_eq!(code, 2);
        assert!(out.contains("not a valid SandboxRun"), "{out}");
    }

    /// Issue #27: a value outside its enum or type used to be a usage error (exit 2, "0
    /// checked", no other rule run); it is a config finding (exit 1 with --strict) that lists the
    /// valid values, and the document's other rules are still judged.
    #[tokio::test]
    async fn a_bad_enum_value_is_a_finding_and_the_other_rules_still_run() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let text = GOOD.replace(
            "spec:\n",
            "spec:\n  hostState: sometimes\n  activeDeadlineSeconds: soon\n  readBack:\n    paths: [{path: /etc}]\n",
        );
        assert_ne!(text, GOOD, "GOOD has a spec to add to");
        let f = write(dir.path(), "enum.yaml", &text);
        let (code, out) = doctor(vec![f], true, Output::Text).await;
        assert_eq!(code, 1, "{out}");
        assert!(out.contains("invalid-value spec.hostState"), "{out}");
        assert!(out.contains(r#"one of: "none", "auto""#), "{out}");
        assert!(
            out.contains("invalid-value spec.activeDeadlineSeconds")
                && out.contains("not an integer"),
            "{out}"
        );
        assert!(
            out.contains("read-back-path spec.readBack.paths[0].path"),
            "the other rules still run: {out}"
        );
        assert!(out.contains("1 checked, 0 skipped, 3 failure(s)"), "{out}");
    }

    #[tokio::test]
    async fn a_directory_is_read_sorted_and_json_is_stable() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        write(dir.path(), "b.yaml", ROOT);
        write(dir.path(), "a.yml", GOOD);
        write(dir.path(), "notes.txt", "not a manifest");
        let (code, out) = doctor(vec![dir.path().display().to_string()], true, Output::Json).await;
        assert_eq!(code, 1, "{out}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
        assert_eq!(v["version"], 1);
        assert_eq!(v["exitCode"], 1);
        assert_eq!(v["summary"]["checked"], 2);
        let docs = v["documents"].as_array().cloned().unwrap_or_default();
        assert!(docs[0]["file"]
            .as_str()
            .is_some_and(|f| f.ends_with("a.yml")));
        assert_eq!(docs[1]["findings"][0]["severity"], "warn");
        assert_eq!(docs[1]["findings"][0]["rule"], "image-digest");
        assert_eq!(docs[1]["findings"][1]["rule"], "user-non-root");
        assert_eq!(docs[1]["findings"][1]["severity"], "fail");
        assert!(docs[1]["findings"][1]["hint"]
            .as_str()
            .is_some_and(|h| !h.is_empty()));
    }
}
