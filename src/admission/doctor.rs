//! `sandboxrun-operator doctor [--strict]`: front door 1 of the ADR-006 rules. Reads manifests
//! offline, runs the same engine as the webhook ([`super::rules::check`]) and prints every finding
//! with its remediation hint.
//!
//! Exit codes (ADR-006 §4): 2 — usage error (unreadable file, YAML that does not parse, a
//! SandboxRun that does not deserialize); 1 — `--strict` and at least one failing finding;
//! 0 — otherwise. Warnings never change the exit code. Without `--strict` the same checks run and
//! the same report is printed, but failing findings do not make the exit non-zero (a report for
//! humans; `--strict` is the gate for scripts and CI).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, ValueEnum};
use serde::Serialize;
use serde_json::json;
use thiserror::Error;

use super::images::{ImageResolver, ImageSettings, RegistryCredentials};
use super::rules::{check, ids, sort_findings, Finding, RuleSettings, Severity};
use crate::api::SandboxRun;

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
}

impl DoctorArgs {
    /// `base` with the operator settings given as flags (or their environment variables) applied,
    /// checked as the operator checks them at startup.
    pub(crate) fn rule_settings(&self, base: RuleSettings) -> Result<RuleSettings, String> {
        let mut settings = base;
        let cap = |flag: &str, text: &str| {
            let q = k8s_openapi::apimachinery::pkg::api::resource::Quantity(text.to_string());
            crate::units::quantity_to_bytes(&q).map_err(|e| format!("--{flag} {text:?}: {e}"))
        };
        if let Some(text) = &self.max_cap {
            settings.caps.max_bytes = cap("max-cap", text)?;
            if settings.caps.max_bytes < crate::units::MIB {
                return Err(format!("--max-cap {text:?} is below 1Mi"));
            }
        }
        if let Some(text) = &self.default_cap {
            settings.caps.default_bytes = cap("default-cap", text)?;
        }
        if let Some(text) = &self.max_drain_timeout {
            let d = crate::units::parse_duration(text)
                .map_err(|e| format!("--max-drain-timeout {text:?}: {e}"))?;
            settings.max_drain_timeout = Some(d);
        }
        Ok(settings)
    }
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
    Settings(String),
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
    let mut docs: Vec<DocReport> = Vec::new();
    let settings = match args.rule_settings(settings) {
        Ok(s) => s,
        Err(e) => {
            errors.push(UsageError::Settings(e));
            settings
        }
    };

    let resolver = if args.check_images {
        let s = ImageSettings {
            timeout: Duration::from_secs(args.image_timeout_seconds.max(1)),
            insecure_registries: args.insecure_registries.clone(),
            ..Default::default()
        };
        match ImageResolver::new(s) {
            Ok(r) => Some(r),
            Err(e) => {
                errors.push(UsageError::Resolver(e.to_string()));
                None
            }
        }
    } else {
        None
    };
    let creds = match &args.docker_config {
        None => None,
        Some(p) => match std::fs::read(p) {
            Ok(bytes) => match RegistryCredentials::from_docker_config(&bytes) {
                Ok(c) => Some(c),
                Err(e) => {
                    errors.push(UsageError::Credentials(
                        p.display().to_string(),
                        e.to_string(),
                    ));
                    None
                }
            },
            Err(e) => {
                errors.push(UsageError::Credentials(
                    p.display().to_string(),
                    e.to_string(),
                ));
                None
            }
        },
    };

    let inputs: Vec<String> = args
        .files
        .iter()
        .chain(args.filename.iter())
        .cloned()
        .collect();
    for (label, text) in read_inputs(&inputs, &mut errors) {
        for (index, doc) in serde_yaml::Deserializer::from_str(&text).enumerate() {
            let value = match <serde_yaml::Value as serde::Deserialize>::deserialize(doc) {
                Ok(v) => v,
                Err(e) => {
                    // The YAML stream cannot be resynchronized after a syntax error.
                    errors.push(UsageError::Yaml(label.clone(), index, e));
                    break;
                }
            };
            match classify(&label, index, value) {
                Classified::Run(run, mut report, mut findings) => {
                    findings.extend(check(&run.spec, &settings));
                    sort_findings(&mut findings);
                    if let (Some(resolver), Some(image)) = (&resolver, run.spec.image.as_deref()) {
                        if !image.trim().is_empty() {
                            let verdict = resolver.resolve(image.trim(), creds.as_ref()).await;
                            findings.extend(verdict.finding(image.trim()));
                            sort_findings(&mut findings);
                        }
                    }
                    report.findings = findings;
                    docs.push(report);
                }
                Classified::Empty => {}
                Classified::Skipped(report) => docs.push(report),
                Classified::Invalid(e) => errors.push(e),
            }
        }
    }

    let failures = docs
        .iter()
        .flat_map(|d| &d.findings)
        .filter(|f| f.is_fail())
        .count();
    let warnings = docs
        .iter()
        .flat_map(|d| &d.findings)
        .filter(|f| f.severity == Severity::Warn)
        .count();
    let code: u8 = if !errors.is_empty() {
        2
    } else if args.strict && failures > 0 {
        1
    } else {
        0
    };
    let checked = docs.iter().filter(|d| d.status == "checked").count();
    let written = match args.output {
        Output::Json => {
            let report = json!({
                "version": 1,
                "strict": args.strict,
                "documents": docs,
                "errors": errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
                "summary": {
                    "documents": docs.len(),
                    "checked": checked,
                    "skipped": docs.len() - checked,
                    "failures": failures,
                    "warnings": warnings,
                },
                "exitCode": code,
            });
            serde_json::to_writer_pretty(&mut *out, &report)
                .map_err(std::io::Error::other)
                .and_then(|()| writeln!(out))
        }
        Output::Text => write_text(out, &docs, &errors, failures, warnings, code, args.strict),
    };
    if let Err(e) = written {
        tracing::error!(error = %e, "cannot write the doctor report");
        return 2;
    }
    code
}

/// What one YAML document is.
enum Classified {
    /// A SandboxRun to check, with what the apiserver would judge before the rules
    /// ([`document_findings`]).
    Run(Box<SandboxRun>, DocReport, Vec<Finding>),
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
    match serde_yaml::from_value::<SandboxRun>(value) {
        Ok(run) => Classified::Run(Box::new(run), report, findings),
        Err(e) => Classified::Invalid(UsageError::Deserialize(label.to_string(), index, e)),
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

/// What the cluster judges before the webhook sees a document that should be a SandboxRun: its
/// apiVersion and kind ([`ids::API_VERSION_KIND`]) and the fields its structural schema does not
/// know ([`super::schema::unknown_fields`]). Empty for a document that is not SandboxRun-like.
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
        Ok(json) => out.extend(super::schema::unknown_fields(&json)),
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

fn write_text(
    out: &mut impl Write,
    docs: &[DocReport],
    errors: &[UsageError],
    failures: usize,
    warnings: usize,
    code: u8,
    strict: bool,
) -> std::io::Result<()> {
    for d in docs {
        let who = format!(
            "{}#{} {}/{}",
            d.file,
            d.index,
            d.namespace.as_deref().unwrap_or("-"),
            d.name.as_deref().unwrap_or("-")
        );
        if d.status == "skipped" {
            writeln!(out, "- {who} skipped: {}", d.note.as_deref().unwrap_or(""))?;
            continue;
        }
        if d.findings.is_empty() {
            writeln!(out, "✓ {who} all checks passed")?;
        }
        for f in &d.findings {
            let mark = if f.is_fail() { "✗" } else { "⚠" };
            writeln!(
                out,
                "{mark} {who} {} {}: {} — hint: {}",
                f.rule, f.field, f.message, f.hint
            )?;
        }
    }
    for e in errors {
        writeln!(out, "✗ error: {e}")?;
    }
    let checked = docs.iter().filter(|d| d.status == "checked").count();
    let verdict = match code {
        2 => "usage error".to_string(),
        1 => "failed (--strict)".to_string(),
        _ if failures > 0 && !strict => "failures reported (exit 0 without --strict)".to_string(),
        _ => "ok".to_string(),
    };
    writeln!(
        out,
        "{checked} checked, {} skipped, {failures} failure(s), {warnings} warning(s), {} error(s): {verdict}",
        docs.len() - checked,
        errors.len()
    )
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
        let wrong = write(dir.path(), "wrong.yaml", "apiVersion: sandbox.iterion.io/v1alpha1\nkind: SandboxRun\nmetadata: {name: w}\nspec:\n  hostState: sometimes\n");
        let (code, out) = doctor(vec![wrong], false, Output::Text).await;
        assert_eq!(code, 2);
        assert!(out.contains("not a valid SandboxRun"), "{out}");
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
