//! Admission (docs/contract.md, "ADR-006") end to end: the real operator binary serves the validating webhook on
//! loopback with self-managed certificates (it patches the caBundle of a
//! ValidatingWebhookConfiguration this test registers by URL), and the real apiserver calls it.
//! The corpus in `tests/admission-corpus/` is checked three ways — the engine, `doctor --strict`
//! through the binary, and `kubectl apply --dry-run=server` through the webhook — and the three
//! must agree. Also: update rules, ratcheting (a run admitted under a larger `--max-cap` is still
//! let go of after a restart with a smaller one), failurePolicy with the webhook down, the
//! doctor's exit codes, and `--check-images` against the test bed's real registry.
//!
//! The configurations here are registered by URL, without the chart's matchConditions (which
//! spare the operator's ServiceAccount; tests/it/chart.rs checks them): the operator runs with the
//! test bed's kubeconfig, and its own writes go through the webhook like anyone's.
//!
//! Every webhook configuration selects only its own test namespace (`sandboxrun-test=<ns>`), so
//! tests running in parallel, and other test binaries, are unaffected.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use sandboxrun_operator::api::{Phase, SandboxRun, SandboxRunSpec, FINALIZER};
use sandboxrun_operator::policy::{check, check_update, Finding, RuleSettings, Severity};
use sandboxrun_operator::store::{list_manifests, store_from_url};
use serde_json::{json, Value};

use crate::support::*;

const DIGEST_IMAGE: &str =
    "ghcr.io/iterion/workload@sha256:3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f";
/// How long the apiserver may take to see a new or changed webhook configuration.
const CONVERGE: Duration = Duration::from_secs(60);
/// The webhook's denial message names the admission this way (webhook.rs `respond`).
const DENIED_BY_US: &str = "refused by ADR-006 admission";

// ---------------------------------------------------------------------------------------------
// Tools

/// kubectl of the test bed, with its kubeconfig. Returns (exit code, stdout, stderr).
fn kubectl_run(args: &[&str], stdin: Option<&str>) -> (i32, String, String) {
    static PATH: OnceLock<String> = OnceLock::new();
    let path = PATH.get_or_init(|| {
        let bin = tools_bin().expect(
            "hack/local-cluster.sh env names no tools directory: start the test bed with \
             `hack/local-cluster.sh up`",
        );
        format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        )
    });
    let mut child = Command::new("kubectl")
        .args(args)
        .env("PATH", path)
        .env("KUBECONFIG", kubeconfig_path())
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run kubectl");
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        use std::io::Write;
        pipe.write_all(text.as_bytes()).expect("kubectl stdin");
    }
    let out = child.wait_with_output().expect("kubectl output");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The apiserver's refusal of a create (`result`), which must be a 422 (`what` names the case).
fn refused_422(result: Result<SandboxRun, kube::Error>, what: &str) -> Box<kube::core::Status> {
    match result {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 422, "{what}: {status:?}");
            status
        }
        other => panic!("{what}: not an apiserver refusal: {other:?}"),
    }
}

fn run_from(value: Value) -> SandboxRun {
    serde_json::from_value(value).expect("a SandboxRun")
}

fn spec_from(value: Value) -> SandboxRunSpec {
    serde_json::from_value(value).expect("a SandboxRunSpec")
}

// ---------------------------------------------------------------------------------------------
// The live webhook

/// The operator binary serving the webhook for one test namespace.
struct LiveWebhook {
    client: Client,
    vwc: String,
    port: u16,
    op: Operator,
    /// The namespace the controller watches (the test's, or one that does not exist).
    watched: String,
    /// The `file://` store the controller drains into.
    store_url: String,
    /// The operator's flags besides the watched namespace and the store (for restarts).
    flags: Vec<String>,
    // Dropped last: the namespace (with the certificate Secret in it).
    ns: TestNamespace,
}

impl LiveWebhook {
    /// Registers the configuration (URL, no caBundle), starts the operator with self-managed
    /// certificates, and waits until the apiserver refuses a bad run through it. The controller
    /// stays away from the test's runs.
    async fn start(prefix: &str) -> LiveWebhook {
        LiveWebhook::start_with(prefix, false, &[]).await
    }

    /// [`LiveWebhook::start`]; with `watch`, the controller also reconciles the test namespace
    /// (finalizer, pod on the kwok node, drain into the store), and `extra` flags are added (e.g.
    /// `--max-cap`). The operator runs with the test bed's kubeconfig, not as a ServiceAccount,
    /// and this configuration has no matchConditions: every write of the controller to a run —
    /// its finalizer release too — goes through the webhook.
    async fn start_with(prefix: &str, watch: bool, extra: &[&str]) -> LiveWebhook {
        let client = client().await;
        ensure_crd(&client).await;
        let ns = TestNamespace::new(&client, prefix).await;
        let port = free_port();
        let vwc = format!("sandboxrun-live-{}", ns.name);
        let config = loopback_webhook(
            &vwc,
            "validate.sandbox.iterion.io",
            &ns.name,
            format!("https://127.0.0.1:{port}/validate-sandboxrun"),
            None,
            sandboxrun_rule(),
        );
        let vwcs: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
        vwcs.create(&PostParams::default(), &config)
            .await
            .expect("register the webhook configuration");

        let store = std::env::temp_dir().join(format!("sandboxrun-live-store-{}", ns.name));
        std::fs::create_dir_all(&store).expect("store dir");
        let store_url = format!("file://{}", store.display());
        let addr = format!("127.0.0.1:{port}");
        let secret = format!("webhook-tls-{:08x}", rand_u32());
        // Unless asked to watch, the controller watches a namespace that does not exist: it stays
        // away from this test's runs (no finalizers, no pods, no status writes), so the test owns
        // their status.
        let watched = if watch {
            ns.name.clone()
        } else {
            format!("{}-unwatched", ns.name)
        };
        let mut flags: Vec<String> = [
            "--webhook-addr",
            &addr,
            "--webhook-cert-mode",
            "self-managed",
            "--webhook-hosts",
            "127.0.0.1,localhost",
            "--pod-namespace",
            &ns.name,
            "--webhook-secret",
            &secret,
            "--webhook-config",
            &vwc,
        ]
        .map(String::from)
        .to_vec();
        flags.extend(extra.iter().map(|f| f.to_string()));
        let op = Operator::builder(&watched, &store_url)
            .flags(&flags)
            .start();
        let live = LiveWebhook {
            client,
            vwc,
            port,
            op,
            watched,
            store_url,
            flags,
            ns,
        };

        // The operator patches the caBundle with the CA it keeps in the Secret.
        let ca = live
            .wait("the operator to patch the caBundle", || {
                let vwcs = vwcs.clone();
                let name = live.vwc.clone();
                async move {
                    let c = vwcs.get(&name).await.ok()?;
                    c.webhooks?.first()?.client_config.ca_bundle.clone()
                }
            })
            .await;
        let pem = String::from_utf8_lossy(&ca.0).into_owned();
        assert!(pem.starts_with("-----BEGIN CERTIFICATE-----"), "{pem}");
        let secrets: Api<k8s_openapi::api::core::v1::Secret> =
            Api::namespaced(live.client.clone(), &live.ns.name);
        let stored = secrets.get(&secret).await.expect("certificate Secret");
        let stored_ca = stored
            .data
            .unwrap_or_default()
            .get("ca.crt")
            .map(|b| String::from_utf8_lossy(&b.0).into_owned());
        assert_eq!(
            stored_ca.as_deref(),
            Some(pem.as_str()),
            "caBundle is the CA kept in the Secret"
        );

        // …and the apiserver reaches the webhook over TLS and gets its verdict.
        live.wait_until_judging().await;
        live
    }

    /// Waits until the apiserver refuses a bad run (dry run) through the webhook.
    async fn wait_until_judging(&self) {
        let bad = run_from(json!({
            "apiVersion": "sandbox.iterion.io/v1alpha1",
            "kind": "SandboxRun",
            "metadata": {"name": "probe-root"},
            "spec": {"image": DIGEST_IMAGE, "user": "0"},
        }));
        let api = self.runs();
        self.wait(
            "the apiserver to refuse a bad run through the webhook",
            || {
                let api = api.clone();
                let bad = bad.clone();
                async move {
                    match api.create(&dry_run(), &bad).await {
                        Err(kube::Error::Api(e)) if e.message.contains(DENIED_BY_US) => Some(()),
                        _ => None,
                    }
                }
            },
        )
        .await;
    }

    /// Stops the operator and starts it again with `extra` (`--name value` pairs) in place of the
    /// same flags it was started with, or added to them (clap refuses a single-value flag given
    /// twice). The certificates are kept in the Secret, so the caBundle stays valid.
    async fn restart_with(&mut self, extra: &[&str]) {
        self.op.kill();
        let mut flags = self.flags.clone();
        let mut rest = extra.iter();
        while let Some(flag) = rest.next() {
            let value = rest.next().map(|v| v.to_string());
            match flags.iter().position(|f| f == flag) {
                Some(i) => {
                    if let (Some(v), Some(slot)) = (value, flags.get_mut(i + 1)) {
                        *slot = v;
                    }
                }
                None => {
                    flags.push(flag.to_string());
                    flags.extend(value);
                }
            }
        }
        self.op = Operator::builder(&self.watched, &self.store_url)
            .flags(&flags)
            .start();
        self.flags = flags;
        self.wait_until_judging().await;
    }

    fn runs(&self) -> Api<SandboxRun> {
        Api::namespaced(self.client.clone(), &self.ns.name)
    }

    /// `eventually`, with the operator's log in the failure message.
    async fn wait<T, F, Fut>(&self, what: &str, f: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        eventually_or_log(what, CONVERGE, &self.op, f).await
    }

    /// `kubectl apply --dry-run=server -n <ns> -f <file>`.
    fn dry_run_apply(&self, file: &Path) -> (i32, String, String) {
        kubectl_run(
            &[
                "apply",
                "--dry-run=server",
                "-n",
                &self.ns.name,
                "-f",
                &file.display().to_string(),
            ],
            None,
        )
    }
}

fn dry_run() -> PostParams {
    PostParams {
        dry_run: true,
        ..Default::default()
    }
}

impl Drop for LiveWebhook {
    fn drop(&mut self) {
        // Synchronous (Drop cannot await); the namespace and the operator go after this.
        let _ = kubectl_run(
            &[
                "delete",
                "validatingwebhookconfiguration",
                &self.vwc,
                "--ignore-not-found",
                "--wait=false",
            ],
            None,
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The corpus, three ways

/// The engine over every SandboxRun of a file; None when the file does not parse/deserialize.
fn engine(text: &str) -> Option<Vec<Finding>> {
    let runs = corpus_runs(text)?;
    Some(
        runs.iter()
            .flat_map(|run| check(&run.spec, &RuleSettings::default()))
            .collect(),
    )
}

/// Rules doctor applies to the document around the spec (src/doctor/schema.rs), which the
/// apiserver applies itself on a live cluster before any webhook.
const DOCUMENT_RULES: [&str; 3] = ["unknown-field", "api-version-kind", "invalid-value"];

fn verdict_of(findings: &[Finding]) -> &'static str {
    if findings.iter().any(Finding::is_fail) {
        "fail"
    } else if findings.is_empty() {
        "ok"
    } else {
        "warn"
    }
}

/// What `kubectl apply --dry-run=server` showed: ok, warn, fail (denied by our webhook),
/// schema (refused by the CRD schema / CEL before the webhook), client (kubectl could not even
/// parse the file), unreachable (the apiserver could not call the webhook), or other.
fn kubectl_verdict(code: i32, stderr: &str) -> &'static str {
    if code == 0 {
        if stderr.contains("Warning:") {
            "warn"
        } else {
            "ok"
        }
    } else if stderr.contains(DENIED_BY_US) {
        "fail"
    } else if stderr.contains("failed calling webhook") {
        "unreachable"
    } else if stderr.contains("is invalid:")
        || stderr.contains("strict decoding error")
        || stderr.contains("no matches for kind")
    {
        // Refused by the apiserver itself: the CRD schema, its CEL rules, an unknown field, or a
        // kind it does not serve.
        "schema"
    } else if stderr.contains("error converting YAML") || stderr.contains("error parsing") {
        "client"
    } else {
        "other"
    }
}

struct Row {
    file: String,
    expected: String,
    engine: String,
    cli: String,
    webhook: String,
    problems: Vec<String>,
}

#[tokio::test]
async fn the_corpus_gets_the_same_verdict_from_the_engine_the_cli_and_the_live_webhook() {
    let live = LiveWebhook::start("live-corpus").await;
    let mut rows = Vec::new();
    for path in corpus() {
        let text = std::fs::read_to_string(&path).expect("corpus file");
        let want = expectation(&path, &text);
        let mut problems = Vec::new();

        // 1. The engine.
        let findings = engine(&text);
        let engine_verdict = findings.as_deref().map(verdict_of).unwrap_or("usage");
        let engine_rules: BTreeSet<String> = findings
            .iter()
            .flatten()
            .map(|f| f.rule.to_string())
            .collect();
        // The rule engine judges a run's spec; the document checks only doctor makes (unknown
        // fields, apiVersion/kind) are the apiserver's own on a live cluster.
        let want_engine_rules: BTreeSet<String> = want
            .rules
            .iter()
            .filter(|r| !DOCUMENT_RULES.contains(&r.as_str()))
            .cloned()
            .collect();
        let want_engine_verdict = if want_engine_rules.len() < want.rules.len()
            && want_engine_rules.is_empty()
            && want.verdict == "fail"
        {
            "ok"
        } else {
            want.verdict.as_str()
        };
        if engine_verdict != want_engine_verdict || engine_rules != want_engine_rules {
            problems.push(format!(
                "engine: {engine_verdict} {engine_rules:?}, the file expects {want_engine_verdict} {want_engine_rules:?}"
            ));
        }

        // 2. The binary: `doctor --strict`, JSON report.
        let file = path.display().to_string();
        let (code, stdout, stderr) = doctor(&["--strict", "--output", "json", &file], None);
        let report: Value = serde_json::from_str(&stdout).unwrap_or(Value::Null);
        let cli_rules: BTreeSet<String> = report["documents"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|d| d["findings"].as_array().into_iter().flatten())
            .filter_map(|f| f["rule"].as_str().map(str::to_string))
            .collect();
        let cli_verdict = match code {
            0 if report["summary"]["warnings"].as_u64().unwrap_or(0) > 0 => "warn",
            0 => "ok",
            1 => "fail",
            2 => "usage",
            _ => "crashed",
        };
        if report.is_null() {
            problems.push(format!(
                "cli: --output json did not parse: {stdout:?} {stderr:?}"
            ));
        } else if report["exitCode"].as_i64() != Some(i64::from(code)) {
            problems.push(format!(
                "cli: exit {code} but the report says {}",
                report["exitCode"]
            ));
        }
        if cli_verdict != want.verdict || cli_rules != want.rules {
            problems.push(format!(
                "cli: {cli_verdict} {cli_rules:?} (exit {code}), the file expects {} {:?}",
                want.verdict, want.rules
            ));
        }

        // 3. The apiserver through the live webhook.
        let (code, stdout, stderr) = live.dry_run_apply(&path);
        let webhook_verdict = kubectl_verdict(code, &stderr);
        let expected_webhook = match (engine_verdict, want.schema) {
            ("usage", false) => "client",
            (_, true) => "schema",
            (v, false) => v,
        };
        if webhook_verdict != expected_webhook {
            problems.push(format!(
                "webhook: {webhook_verdict}, expected {expected_webhook}; kubectl exit {code}\n    stdout: {}\n    stderr: {}",
                stdout.trim(),
                stderr.trim()
            ));
        } else {
            let all = findings.clone().unwrap_or_default();
            match webhook_verdict {
                // Every failing check is in the denial, with its field and hint.
                "fail" => {
                    for f in all.iter().filter(|f| f.is_fail()) {
                        let line = format!("[{}] {}:", f.rule, f.field);
                        if !stderr.contains(&line) || !stderr.contains(&f.hint) {
                            problems.push(format!(
                                "webhook: the denial lacks `{line}` or its hint {:?}:\n    {}",
                                f.hint,
                                stderr.trim()
                            ));
                        }
                    }
                }
                // Every warning is printed by kubectl.
                "warn" => {
                    for f in all.iter().filter(|f| f.severity == Severity::Warn) {
                        let line = format!("Warning: [{}] {}:", f.rule, f.field);
                        if !stderr.contains(&line) || !stderr.contains(&f.hint) {
                            problems.push(format!(
                                "webhook: kubectl did not print `{line}` with hint {:?}:\n    {}",
                                f.hint,
                                stderr.trim()
                            ));
                        }
                    }
                }
                // The schema refusal names the field the engine flags too (a strict-decoding or
                // unknown-kind refusal stops before the fields are validated).
                "schema" if stderr.contains("is invalid:") => {
                    for f in all.iter().filter(|f| f.is_fail()) {
                        let top = f
                            .field
                            .split(['[', '.'])
                            .take(2)
                            .collect::<Vec<_>>()
                            .join(".");
                        if !stderr.contains(&top) {
                            problems.push(format!(
                                "webhook: the schema error does not mention {top} ({}):\n    {}",
                                f.field,
                                stderr.trim()
                            ));
                        }
                    }
                }
                _ => {}
            }
        }
        rows.push(Row {
            file: path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            expected: format!(
                "{}{}",
                want.verdict,
                if want.schema { " (schema)" } else { "" }
            ),
            engine: engine_verdict.to_string(),
            cli: cli_verdict.to_string(),
            webhook: webhook_verdict.to_string(),
            problems,
        });
    }

    assert!(rows.len() >= 40, "only {} corpus files", rows.len());
    let bad = rows.iter().filter(|r| !r.problems.is_empty()).count();
    if bad > 0 {
        let mut table = format!(
            "{bad} of {} corpus files disagree\n{:<48} {:<16} {:<7} {:<7} {:<12}\n",
            rows.len(),
            "file",
            "expected",
            "engine",
            "cli",
            "webhook"
        );
        for r in &rows {
            table.push_str(&format!(
                "{} {:<46} {:<16} {:<7} {:<7} {:<12}\n",
                if r.problems.is_empty() { " " } else { "✗" },
                r.file,
                r.expected,
                r.engine,
                r.cli,
                r.webhook
            ));
        }
        for r in rows.iter().filter(|r| !r.problems.is_empty()) {
            table.push_str(&format!("\n{}:\n  {}", r.file, r.problems.join("\n  ")));
        }
        panic!("{table}");
    }
}

// ---------------------------------------------------------------------------------------------
// Live webhook behaviour

#[tokio::test]
async fn a_run_failing_many_rules_is_denied_with_every_problem_and_its_hint() {
    let live = LiveWebhook::start("live-every").await;
    // Schema-valid, so the apiserver asks the webhook; wrong in at least three ADR-006 ways.
    let run = run_from(json!({
        "apiVersion": "sandbox.iterion.io/v1alpha1",
        "kind": "SandboxRun",
        "metadata": {"name": "wrong-everywhere"},
        "spec": {
            "image": "alpine:3.20",
            "user": "0",
            "hostState": "auto",
            "build": {"context": "."},
            "mounts": [{"name": "sock", "type": "bind", "source": "/var/run/docker.sock", "target": "/var/run/docker.sock"}],
            "network": {"mode": "allowlist", "rules": ["!!example.com"]},
        },
    }));
    let expected: Vec<Finding> = check(&run.spec, &RuleSettings::default());
    let failing: Vec<&Finding> = expected.iter().filter(|f| f.is_fail()).collect();
    assert!(
        failing.len() >= 3,
        "the fixture must fail 3+ rules: {expected:?}"
    );

    let status = refused_422(
        live.runs().create(&PostParams::default(), &run).await,
        "the webhook must deny the run",
    );
    assert!(
        status.message.contains(&format!(
            "SandboxRun {}/wrong-everywhere {DENIED_BY_US} ({} failing check(s))",
            live.ns.name,
            failing.len()
        )),
        "{}",
        status.message
    );
    for f in &failing {
        let line = format!(
            "- [{}] {}: {} (hint: {})",
            f.rule, f.field, f.message, f.hint
        );
        assert!(
            status.message.contains(&line),
            "missing `{line}` in:\n{}",
            status.message
        );
    }
    // Nothing was created.
    assert!(live
        .runs()
        .get_opt("wrong-everywhere")
        .await
        .expect("get")
        .is_none());
}

/// Issue 25 item 3 (docs/contract.md "A run uses only its author's rights"): through the live
/// webhook, as impersonated users. alice may create SandboxRuns and nothing else; bob may also
/// create pods and read the Secret `db`, the ConfigMap `cfg` and the PVC `data`. Each field that
/// reaches beyond the run is refused for alice, naming the right and the `kubectl auth can-i`
/// line, and allowed for bob; a Secret bob may not read is refused for him too; a run that uses
/// none of them is allowed for alice.
#[tokio::test]
async fn a_run_may_use_only_what_its_author_may() {
    let live = LiveWebhook::start("live-access").await;
    let ns = live.ns.name.clone();
    let rbac = format!(
        "apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: runs-only, namespace: {ns}}}
rules:
- {{apiGroups: [sandbox.iterion.io], resources: [sandboxruns], verbs: [create, get]}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: pods-and-refs, namespace: {ns}}}
rules:
- {{apiGroups: [''], resources: [pods], verbs: [create]}}
- {{apiGroups: [''], resources: [secrets], resourceNames: [db], verbs: [get]}}
- {{apiGroups: [''], resources: [configmaps], resourceNames: [cfg], verbs: [get]}}
- {{apiGroups: [''], resources: [persistentvolumeclaims], resourceNames: [data], verbs: [get]}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: runs-only, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: runs-only}}
subjects:
- {{apiGroup: rbac.authorization.k8s.io, kind: User, name: alice}}
- {{apiGroup: rbac.authorization.k8s.io, kind: User, name: bob}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: pods-and-refs, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: pods-and-refs}}
subjects:
- {{apiGroup: rbac.authorization.k8s.io, kind: User, name: bob}}
"
    );
    let (code, out, err) = kubectl_run(&["apply", "-f", "-"], Some(&rbac));
    assert_eq!(code, 0, "{out}{err}");
    let env_from = |kind: &str, name: &str| json!([{"name": "X", "valueFrom": {kind: {"name": name, "key": "k"}}}]);
    let mount = |kind: &str, source: &str| json!([{"name": "m", "type": kind, "source": source, "target": "/m", "readOnly": true}]);
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "serviceAccountName",
            json!({"serviceAccountName": "default"}),
            "may not create pods",
        ),
        (
            "runtimeClassName",
            json!({"runtimeClassName": "gvisor"}),
            "may not create pods",
        ),
        (
            "a Secret mount",
            json!({"mounts": mount("secret", "db")}),
            "may not get secrets \"db\"",
        ),
        (
            "a secretKeyRef",
            json!({"env": env_from("secretKeyRef", "db")}),
            "may not get secrets \"db\"",
        ),
        (
            "a ConfigMap mount",
            json!({"mounts": mount("configMap", "cfg")}),
            "may not get configmaps \"cfg\"",
        ),
        (
            "a configMapKeyRef",
            json!({"env": env_from("configMapKeyRef", "cfg")}),
            "may not get configmaps \"cfg\"",
        ),
        (
            "a PVC mount",
            json!({"mounts": mount("persistentVolumeClaim", "data")}),
            "may not get persistentvolumeclaims \"data\"",
        ),
        (
            "an imagePullSecret",
            json!({"imagePullSecrets": ["db"]}),
            "may not get secrets \"db\"",
        ),
    ];
    let run_with = |name: &str, extra: &Value| {
        let mut spec = json!({"image": DIGEST_IMAGE, "user": "1000"});
        for (k, v) in extra.as_object().expect("an object") {
            spec[k] = v.clone();
        }
        run_from(json!({
            "apiVersion": "sandbox.iterion.io/v1alpha1",
            "kind": "SandboxRun",
            "metadata": {"name": name},
            "spec": spec,
        }))
    };
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let alice: Api<SandboxRun> = Api::namespaced(client_as("alice").await, &ns);
    let bob: Api<SandboxRun> = Api::namespaced(client_as("bob").await, &ns);
    // RBAC and the webhook converge: a plain run passes for alice first.
    live.wait("alice to create a plain run", || {
        let (alice, run, dry) = (alice.clone(), run_with("plain", &json!({})), dry.clone());
        async move { alice.create(&dry, &run).await.ok() }
    })
    .await;
    for (what, extra, refusal) in &cases {
        let status = refused_422(alice.create(&dry, &run_with("r", extra)).await, what);
        assert!(
            status.message.contains("- [access] spec."),
            "{what}: {}",
            status.message
        );
        assert!(
            status
                .message
                .contains(&format!("alice {refusal} in namespace {ns}")),
            "{what}: {}",
            status.message
        );
        assert!(
            status.message.contains("kubectl auth can-i"),
            "{what}: {}",
            status.message
        );
        bob.create(&dry, &run_with("r", extra))
            .await
            .unwrap_or_else(|e| panic!("{what}: bob holds the right: {e}"));
    }
    let err = bob
        .create(
            &dry,
            &run_with("r", &json!({"mounts": mount("secret", "other")})),
        )
        .await
        .expect_err("a Secret bob may not read");
    assert!(
        err.to_string()
            .contains("bob may not get secrets \"other\""),
        "{err}"
    );
}

/// docs/contract.md "Pause, resume and fork": through the live webhook, as impersonated users. A
/// fork reads its source run's files, so its author must hold `get` on that run: dave may create
/// SandboxRuns but not read `a` and is refused, naming the right and the `kubectl auth can-i`
/// line; erin may read `a` and is allowed. A fork of a run that does not exist is refused, and
/// `workspace.from` cannot change after creation. On the old code the field does not exist.
#[tokio::test]
async fn a_fork_without_get_on_its_source_is_refused_at_admission() {
    let live = LiveWebhook::start("live-fork").await;
    let ns = live.ns.name.clone();
    let rbac = format!(
        "apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: create-runs, namespace: {ns}}}
rules:
- {{apiGroups: [sandbox.iterion.io], resources: [sandboxruns], verbs: [create]}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: read-a, namespace: {ns}}}
rules:
- {{apiGroups: [sandbox.iterion.io], resources: [sandboxruns], resourceNames: [a], verbs: [get]}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: create-runs, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: create-runs}}
subjects:
- {{apiGroup: rbac.authorization.k8s.io, kind: User, name: dave}}
- {{apiGroup: rbac.authorization.k8s.io, kind: User, name: erin}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: read-a, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: read-a}}
subjects:
- {{apiGroup: rbac.authorization.k8s.io, kind: User, name: erin}}
"
    );
    let (code, out, err) = kubectl_run(&["apply", "-f", "-"], Some(&rbac));
    assert_eq!(code, 0, "{out}{err}");
    let run = |name: &str, from: Option<&str>| {
        let mut spec = json!({"image": DIGEST_IMAGE, "user": "1000", "command": ["true"]});
        if let Some(from) = from {
            spec["workspace"] = json!({"from": {"run": from}});
        }
        run_from(json!({
            "apiVersion": "sandbox.iterion.io/v1alpha1",
            "kind": "SandboxRun",
            "metadata": {"name": name},
            "spec": spec,
        }))
    };
    let runs = live.runs();
    runs.create(&PostParams::default(), &run("a", None))
        .await
        .expect("create the source a");
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let dave: Api<SandboxRun> = Api::namespaced(client_as("dave").await, &ns);
    let erin: Api<SandboxRun> = Api::namespaced(client_as("erin").await, &ns);
    live.wait("erin to fork a", || {
        let (erin, run, dry) = (erin.clone(), run("b", Some("a")), dry.clone());
        async move { erin.create(&dry, &run).await.ok() }
    })
    .await;
    let status = refused_422(dave.create(&dry, &run("b", Some("a"))).await, "dave");
    for said in [
        "- [access] spec.workspace.from.run",
        &format!("dave may not get sandboxruns \"a\" in namespace {ns}"),
        &format!("kubectl auth can-i get sandboxruns.sandbox.iterion.io/a -n {ns} --as dave"),
    ] {
        assert!(status.message.contains(said), "{said}: {}", status.message);
    }
    // A source that does not exist (erin may not read it: refused for the right first).
    let status = refused_422(
        runs.create(&dry, &run("c", Some("nobody"))).await,
        "no source",
    );
    assert!(
        status
            .message
            .contains("the source run nobody does not exist"),
        "{}",
        status.message
    );
    // Fixed at creation.
    runs.create(&PostParams::default(), &run("b", Some("a")))
        .await
        .expect("create the fork b");
    let moved = runs
        .patch(
            "b",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"workspace": {"from": {"run": "other"}}}})),
        )
        .await;
    let status = refused_422(moved, "moved");
    assert!(
        status
            .message
            .contains("[update-immutable] spec.workspace.from"),
        "{}",
        status.message
    );
}

/// Issue #38 item 1 (docs/contract.md "A run uses only its author's rights"): with the webhook
/// out of the way a run naming a Secret got a pod made with the operator's rights. The controller
/// (`--unadmitted-references hold`, the chart's default) gives such a run a pod only with the
/// stamp of the webhook's mutating half, which it writes after verifying every right for the
/// requesting user. A run admitted by the validating half alone (no stamp), and one carrying a
/// stamp copied from another run, are held `RightsUnverified` with no pod; a run that uses no
/// right runs either way; re-applied through the mutating half, the held run gets its pod.
/// On the old code every one of these runs got a pod.
#[tokio::test]
async fn a_run_whose_authors_rights_no_admission_verified_gets_no_pod() {
    use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
    use k8s_openapi::api::core::v1::Pod;
    let live =
        LiveWebhook::start_with("live-stamp", true, &["--unadmitted-references", "hold"]).await;
    let ns = live.ns.name.clone();
    let runs = live.runs();
    let pods: Api<Pod> = Api::namespaced(live.client.clone(), &ns);
    let run = |name: &str, secret: bool| {
        let mut spec = json!({"image": DIGEST_IMAGE, "user": "1000", "command": ["sleep", "3600"]});
        if secret {
            spec["mounts"] = json!([{"name": "db", "type": "secret", "source": "db", "target": "/db", "readOnly": true}]);
        }
        run_from(json!({
            "apiVersion": "sandbox.iterion.io/v1alpha1",
            "kind": "SandboxRun",
            "metadata": {"name": name},
            "spec": spec,
        }))
    };
    let reason_of = |r: &SandboxRun| {
        let status = r.status.as_ref()?;
        let ready = status.conditions.iter().find(|c| c.type_ == "Ready")?;
        Some((
            ready.reason.clone(),
            status.message.clone().unwrap_or_default(),
        ))
    };
    // The validating half alone: admitted, never stamped.
    runs.create(&PostParams::default(), &run("unstamped", true))
        .await
        .expect("create");
    runs.create(&PostParams::default(), &run("plain", false))
        .await
        .expect("create");
    let held = live
        .wait("the unstamped run held RightsUnverified", || {
            let runs = runs.clone();
            async move {
                let r = runs.get("unstamped").await.ok()?;
                reason_of(&r).filter(|(reason, _)| reason == "RightsUnverified")
            }
        })
        .await;
    assert!(
        held.1.contains("spec.mounts[0].source") && held.1.contains("no admission stamp"),
        "{}",
        held.1
    );
    live.wait("the plain run's pod", || {
        let pods = pods.clone();
        async move { pods.get_opt("plain-sbr").await.ok().flatten() }
    })
    .await;
    // The mutating half, trusting the CA the operator published in the validating one.
    let vwcs: Api<ValidatingWebhookConfiguration> = Api::all(live.client.clone());
    let vwc = vwcs
        .get(&live.vwc)
        .await
        .expect("the validating configuration");
    let ca = vwc.webhooks.unwrap_or_default()[0]
        .client_config
        .ca_bundle
        .clone()
        .expect("caBundle");
    let mwcs: Api<MutatingWebhookConfiguration> = Api::all(live.client.clone());
    let url = format!("https://127.0.0.1:{}/mutate-sandboxrun", live.port);
    mwcs.create(
        &PostParams::default(),
        &loopback_mutating_webhook(&live.vwc, &ns, url, ca.0),
    )
    .await
    .expect("register the mutating half");
    // The apiserver's webhook cache picks the new configuration up a moment later: a run created
    // before that lands unstamped for good (CI saw it), so wait until a dry run comes back stamped.
    live.wait("the apiserver to call the mutating half", || {
        let runs = runs.clone();
        let probe = run("probe", true);
        async move {
            let out = runs.create(&dry_run(), &probe).await.ok()?;
            out.annotations()
                .contains_key("sandbox.iterion.io/admitted-rights")
                .then_some(())
        }
    })
    .await;
    let created = runs
        .create(&PostParams::default(), &run("stamped", true))
        .await
        .expect("create through the mutating half");
    let stamped = created
        .annotations()
        .get("sandbox.iterion.io/admitted-rights")
        .cloned()
        .expect("the run created through the mutating half is stamped");
    live.wait("the stamped run's pod", || {
        let pods = pods.clone();
        async move { pods.get_opt("stamped-sbr").await.ok().flatten() }
    })
    .await;
    // Re-applied through the webhook (a change before the pod exists re-checks every right and
    // stamps), the held run gets its pod.
    runs.patch(
        "unstamped",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"command": ["sleep", "3601"]}})),
    )
    .await
    .expect("re-apply");
    live.wait("the re-applied run's pod", || {
        let pods = pods.clone();
        async move { pods.get_opt("unstamped-sbr").await.ok().flatten() }
    })
    .await;
    // Without the mutating half, a stamp copied from another run vouches for nothing.
    mwcs.delete(&live.vwc, &DeleteParams::default())
        .await
        .expect("unregister");
    // The apiserver's webhook cache lets go of it (a dry run returns the object as the mutating
    // webhooks left it: no stamp once the mutating half is gone).
    live.wait("the apiserver to stop calling the mutating half", || {
        let runs = runs.clone();
        let probe = run("probe", true);
        async move {
            let out = runs.create(&dry_run(), &probe).await.ok()?;
            (!out
                .annotations()
                .contains_key("sandbox.iterion.io/admitted-rights"))
            .then_some(())
        }
    })
    .await;
    let mut copied = run("copied", true);
    copied
        .annotations_mut()
        .insert("sandbox.iterion.io/admitted-rights".into(), stamped);
    live.wait(
        "the copied-stamp run created without the mutating half",
        || {
            let runs = runs.clone();
            let copied = copied.clone();
            async move {
                let _ = runs.create(&PostParams::default(), &copied).await;
                let r = runs.get("copied").await.ok()?;
                reason_of(&r).filter(|(reason, _)| reason == "RightsUnverified")
            }
        },
    )
    .await;
    assert!(
        pods.get_opt("copied-sbr").await.expect("get").is_none(),
        "no pod for a copied stamp"
    );
}

/// POSTs `review` to the operator's webhook at `path` as any caller that reaches its port would
/// (a pod, say): `curl`, trusting any certificate. The AdmissionReview it answers.
fn post_review(port: u16, path: &str, review: &Value) -> Value {
    let mut child = Command::new("curl")
        .args(["-sSk", "-X", "POST", "-H", "Content-Type: application/json"])
        .args([
            "--data-binary",
            "@-",
            &format!("https://127.0.0.1:{port}{path}"),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("curl");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin
            .write_all(review.to_string().as_bytes())
            .expect("write the review");
    }
    let out = child.wait_with_output().expect("curl ran");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not an AdmissionReview ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// The stamp a mutating answer writes, if any (from its JSON patch).
fn stamp_in(answer: &Value) -> Option<String> {
    use base64::Engine;
    // kube's AdmissionResponse writes the patch as a byte array; the apiserver's wire form is
    // base64: read either.
    let bytes = match &answer["response"]["patch"] {
        Value::String(patch) => base64::engine::general_purpose::STANDARD
            .decode(patch)
            .expect("base64"),
        Value::Array(bytes) => bytes
            .iter()
            .map(|b| {
                b.as_u64()
                    .and_then(|b| u8::try_from(b).ok())
                    .expect("a byte")
            })
            .collect(),
        _ => return None,
    };
    let ops: Value = serde_json::from_slice(&bytes).expect("a JSON patch");
    let value = &ops[0]["value"];
    value
        .as_str()
        .or_else(|| value["sandbox.iterion.io/admitted-rights"].as_str())
        .map(str::to_string)
}

/// Issue #51 item 3 (docs/contract.md "A run uses only its author's rights"): any caller that
/// reached the webhook's port could POST a review it made up — a CREATE of a run already held
/// `RightsUnverified`, as the cluster's admin — get a stamp, and write it on the held run with a
/// metadata-only patch: the run got its pod. Through the live operator: a made-up CREATE of the
/// existing run and a made-up UPDATE claiming the generation before are not stamped; the shape
/// of a real UPDATE is, but its stamp names a generation the run does not have, and written on
/// the run by a metadata patch it vouches for nothing: still held, no pod. On the old code the
/// made-up CREATE came back stamped and the run got its pod.
#[tokio::test]
async fn a_review_made_up_by_a_caller_yields_no_stamp_for_a_held_run() {
    use k8s_openapi::api::core::v1::Pod;
    let live =
        LiveWebhook::start_with("live-forge", true, &["--unadmitted-references", "hold"]).await;
    let ns = live.ns.name.clone();
    let runs = live.runs();
    let pods: Api<Pod> = Api::namespaced(live.client.clone(), &ns);
    let held_run = run_from(json!({
        "apiVersion": "sandbox.iterion.io/v1alpha1",
        "kind": "SandboxRun",
        "metadata": {"name": "held"},
        "spec": {
            "image": DIGEST_IMAGE, "user": "1000", "command": ["sleep", "3600"],
            "mounts": [{"name": "db", "type": "secret", "source": "db", "target": "/db", "readOnly": true}],
        },
    }));
    runs.create(&PostParams::default(), &held_run)
        .await
        .expect("create (the validating half alone)");
    let reason = |runs: Api<SandboxRun>| async move {
        let r = runs.get("held").await.ok()?;
        let status = r.status?;
        let ready = status.conditions.into_iter().find(|c| c.type_ == "Ready")?;
        Some((ready.reason, status.message.unwrap_or_default()))
    };
    live.wait("the run held RightsUnverified", || {
        let runs = runs.clone();
        async move { reason(runs).await.filter(|(r, _)| r == "RightsUnverified") }
    })
    .await;
    let stored = serde_json::to_value(runs.get("held").await.expect("get")).expect("json");
    let review = |operation: &str, object: &Value, old: Option<&Value>| {
        json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "made-up",
                "kind": {"group": "sandbox.iterion.io", "version": "v1alpha1", "kind": "SandboxRun"},
                "resource": {"group": "sandbox.iterion.io", "version": "v1alpha1", "resource": "sandboxruns"},
                "name": "held",
                "namespace": ns,
                "operation": operation,
                "userInfo": {"username": "kubernetes-admin", "groups": ["system:masters", "system:authenticated"]},
                "object": object,
                "oldObject": old,
                "dryRun": false,
            }
        })
    };
    let create = post_review(
        live.port,
        "/mutate-sandboxrun",
        &review("CREATE", &stored, None),
    );
    assert_eq!(create["response"]["allowed"], true, "{create}");
    assert_eq!(
        stamp_in(&create),
        None,
        "a made-up CREATE of an existing run: {create}"
    );
    let mut before = stored.clone();
    before["metadata"]["generation"] = json!(0);
    before["spec"]["command"] = json!(["true"]);
    let update = post_review(
        live.port,
        "/mutate-sandboxrun",
        &review("UPDATE", &stored, Some(&before)),
    );
    assert_eq!(
        stamp_in(&update),
        None,
        "a made-up UPDATE of the generation before: {update}"
    );
    // The shape of a real UPDATE of the stored run is stamped — for the generation it would make.
    let mut next = stored.clone();
    next["spec"]["command"] = json!(["sleep", "3601"]);
    let real = post_review(
        live.port,
        "/mutate-sandboxrun",
        &review("UPDATE", &next, Some(&stored)),
    );
    let stamp =
        stamp_in(&real).unwrap_or_else(|| panic!("an UPDATE of the stored run is stamped: {real}"));
    assert!(
        stamp.starts_with("v2.") && stamp.contains(".u2."),
        "{stamp}"
    );
    // Written on the run by a metadata-only patch (no mutating half registered to put it back):
    // it names generation 2 and another spec; the run is generation 1. Still held.
    runs.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(
            &json!({"metadata": {"annotations": {"sandbox.iterion.io/admitted-rights": stamp}}}),
        ),
    )
    .await
    .expect("a metadata-only patch");
    live.wait("the controller to judge the written stamp", || {
        let runs = runs.clone();
        async move {
            reason(runs)
                .await
                .filter(|(r, m)| r == "RightsUnverified" && m.contains("admitted-rights stamp"))
        }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        pods.get_opt("held-sbr").await.expect("get").is_none(),
        "no pod for a stamp the run's own request did not get"
    );
}

/// Issue 29 item 1 (docs/contract.md "A store per namespace"): a run that names a store
/// (`spec.readBack.storeRef`) needs its author to read that ConfigMap and the Secret it names,
/// through the live webhook, as impersonated users. carol may read the ConfigMap but not its
/// Secret: refused, naming the Secret; dave may read both: allowed. A store ConfigMap that does
/// not exist is refused for anyone.
#[tokio::test]
async fn a_run_naming_a_store_needs_its_author_to_read_the_store_and_its_secret() {
    let endpoint = bed_setting("SANDBOXRUN_TEST_S3_ENDPOINT");
    let live = LiveWebhook::start_with(
        "live-store",
        false,
        &["--tenant-store-endpoints", &endpoint],
    )
    .await;
    let ns = live.ns.name.clone();
    let objects = format!(
        "apiVersion: v1
kind: ConfigMap
metadata: {{name: fast, namespace: {ns}}}
data: {{url: 's3://sandboxrun-test/x', options: 'endpoint={endpoint}', secretName: fast-creds}}
---
apiVersion: v1
kind: Secret
metadata: {{name: fast-creds, namespace: {ns}, labels: {{sandbox.iterion.io/store-credentials: 'true'}}}}
stringData: {{AWS_ACCESS_KEY_ID: a, AWS_SECRET_ACCESS_KEY: b}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: runs-and-store, namespace: {ns}}}
rules:
- {{apiGroups: [sandbox.iterion.io], resources: [sandboxruns], verbs: [create, get]}}
- {{apiGroups: [''], resources: [configmaps], resourceNames: [fast, nope], verbs: [get]}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: store-secret, namespace: {ns}}}
rules:
- {{apiGroups: [''], resources: [secrets], resourceNames: [fast-creds], verbs: [get]}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: runs-and-store, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: runs-and-store}}
subjects:
- {{apiGroup: rbac.authorization.k8s.io, kind: User, name: carol}}
- {{apiGroup: rbac.authorization.k8s.io, kind: User, name: dave}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: store-secret, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: store-secret}}
subjects:
- {{apiGroup: rbac.authorization.k8s.io, kind: User, name: dave}}
"
    );
    let (code, out, err) = kubectl_run(&["apply", "-f", "-"], Some(&objects));
    assert_eq!(code, 0, "{out}{err}");
    let run_with = |store: &str| {
        run_from(json!({
            "apiVersion": "sandbox.iterion.io/v1alpha1",
            "kind": "SandboxRun",
            "metadata": {"name": "r"},
            "spec": {"image": DIGEST_IMAGE, "user": "1000",
                     "readBack": {"paths": [{"path": "/out"}], "storeRef": store}},
        }))
    };
    let carol: Api<SandboxRun> = Api::namespaced(client_as("carol").await, &ns);
    let dave: Api<SandboxRun> = Api::namespaced(client_as("dave").await, &ns);
    // RBAC, the CRD's new field and the webhook converge: dave's run passes.
    live.wait("dave to create a run naming the store", || {
        let (dave, run) = (dave.clone(), run_with("fast"));
        async move { dave.create(&dry_run(), &run).await.ok() }
    })
    .await;
    let status = refused_422(
        carol.create(&dry_run(), &run_with("fast")).await,
        "carol may not read the store's Secret",
    );
    assert!(
        status.message.contains(&format!(
            "carol may not get secrets \"fast-creds\" in namespace {ns}"
        )) && status.message.contains("spec.readBack.storeRef"),
        "{}",
        status.message
    );
    let err = dave
        .create(&dry_run(), &run_with("nope"))
        .await
        .expect_err("a store that does not exist");
    assert!(
        err.to_string()
            .contains(&format!("the store ConfigMap {ns}/nope does not exist")),
        "{err}"
    );
}

#[tokio::test]
async fn a_good_run_pinned_by_tag_is_accepted_with_a_warning() {
    let live = LiveWebhook::start("live-tag").await;
    let manifest = "apiVersion: sandbox.iterion.io/v1alpha1
kind: SandboxRun
metadata:
  name: tagged
spec:
  image: alpine:3.20
  user: \"1000\"
";
    let (code, stdout, stderr) =
        kubectl_run(&["apply", "-n", &live.ns.name, "-f", "-"], Some(manifest));
    assert_eq!(code, 0, "stdout: {stdout}\nstderr: {stderr}");
    assert!(
        stdout.contains("sandboxrun.sandbox.iterion.io/tagged created"),
        "{stdout}"
    );
    let spec = spec_from(json!({"image": "alpine:3.20", "user": "1000"}));
    let warnings = check(&spec, &RuleSettings::default());
    assert_eq!(
        warnings.iter().map(|f| f.rule).collect::<Vec<_>>(),
        vec!["image-digest"]
    );
    let w = &warnings[0];
    let line = format!(
        "Warning: [{}] {}: {} (hint: {})",
        w.rule, w.field, w.message, w.hint
    );
    assert!(stderr.contains(&line), "missing `{line}` in:\n{stderr}");
    let stored = live.runs().get("tagged").await.expect("the run exists");
    assert_eq!(stored.spec.image.as_deref(), Some("alpine:3.20"));
}

#[tokio::test]
async fn once_the_pod_exists_the_image_is_frozen_but_stop_may_change() {
    let live = LiveWebhook::start("live-update").await;
    let api = live.runs();
    let run = run_from(json!({
        "apiVersion": "sandbox.iterion.io/v1alpha1",
        "kind": "SandboxRun",
        "metadata": {"name": "frozen"},
        "spec": {"image": DIGEST_IMAGE, "user": "1000"},
    }));
    api.create(&PostParams::default(), &run)
        .await
        .expect("a good run is admitted");
    let other_image =
        "ghcr.io/iterion/workload@sha256:4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e";
    let patch = |v: Value| Patch::Merge(json!({ "spec": v }));

    // No pod yet: the spec may still change.
    api.patch(
        "frozen",
        &PatchParams::default(),
        &patch(json!({"image": other_image})),
    )
    .await
    .expect("before the pod exists the image may change");

    // The pod exists (status written through the status subresource, which the webhook does
    // not intercept — as the controller does).
    api.patch_status(
        "frozen",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"podName": "frozen-pod"}})),
    )
    .await
    .expect("status patch");
    let stored = api.get("frozen").await.expect("get");
    assert_eq!(
        stored.status.as_ref().and_then(|s| s.pod_name.as_deref()),
        Some("frozen-pod")
    );

    let err = api
        .patch(
            "frozen",
            &PatchParams::default(),
            &patch(json!({"image": DIGEST_IMAGE})),
        )
        .await
        .expect_err("changing the image of a run whose pod exists is refused");
    let kube::Error::Api(status) = err else {
        panic!("not an apiserver refusal: {err:?}");
    };
    let mut new_spec = stored.spec.clone();
    new_spec.image = Some(DIGEST_IMAGE.to_string());
    let expected = check_update(&stored.spec, &new_spec, true);
    assert_eq!(
        expected.iter().map(|f| f.rule).collect::<Vec<_>>(),
        vec!["update-immutable"]
    );
    let line = format!(
        "- [{}] {}: {} (hint: {})",
        expected[0].rule, expected[0].field, expected[0].message, expected[0].hint
    );
    assert!(
        status.message.contains(DENIED_BY_US) && status.message.contains(&line),
        "missing `{line}` in:\n{}",
        status.message
    );
    assert_eq!(
        api.get("frozen").await.expect("get").spec.image.as_deref(),
        Some(other_image),
        "the refused change was not stored"
    );

    // stop may change at any time…
    let stopped = api
        .patch(
            "frozen",
            &PatchParams::default(),
            &patch(json!({"stop": true})),
        )
        .await
        .expect("spec.stop may change once the pod exists");
    assert!(stopped.spec.stop);
    // …but only one way.
    let err = api
        .patch(
            "frozen",
            &PatchParams::default(),
            &patch(json!({"stop": false})),
        )
        .await
        .expect_err("stop cannot be undone");
    assert!(format!("{err}").contains("update-stop-final"), "{err}");
}

#[tokio::test]
async fn with_the_webhook_down_the_failure_policy_decides_and_the_schema_still_guards() {
    let mut live = LiveWebhook::start("live-down").await;
    let api = live.runs();
    let good = |name: &str| {
        run_from(json!({
            "apiVersion": "sandbox.iterion.io/v1alpha1",
            "kind": "SandboxRun",
            "metadata": {"name": name},
            "spec": {"image": DIGEST_IMAGE, "user": "1000"},
        }))
    };
    // Root by uid passes the schema (a number) and is only caught by the webhook.
    let root_uid = run_from(json!({
        "apiVersion": "sandbox.iterion.io/v1alpha1",
        "kind": "SandboxRun",
        "metadata": {"name": "root-uid"},
        "spec": {"image": DIGEST_IMAGE, "user": "0"},
    }));
    let err = api
        .create(&PostParams::default(), &root_uid)
        .await
        .expect_err("the webhook is up: uid 0 is refused");
    assert!(format!("{err}").contains("user-non-root"), "{err}");

    live.op.kill();

    // failurePolicy Fail: no webhook, no admission — even for a good run.
    let refused = live
        .wait("creation to be refused while the webhook is down", || {
            let api = api.clone();
            let run = good("good-while-down");
            async move {
                match api.create(&PostParams::default(), &run).await {
                    Err(kube::Error::Api(e)) if e.message.contains("failed calling webhook") => {
                        Some(e.message)
                    }
                    _ => None,
                }
            }
        })
        .await;
    assert!(refused.contains("validate.sandbox.iterion.io"), "{refused}");
    assert!(api.get_opt("good-while-down").await.expect("get").is_none());

    // failurePolicy Ignore: admission goes on without the webhook.
    let vwcs: Api<ValidatingWebhookConfiguration> = Api::all(live.client.clone());
    let mut config = vwcs.get(&live.vwc).await.expect("get the configuration");
    for hook in config.webhooks.iter_mut().flatten() {
        hook.failure_policy = Some("Ignore".into());
    }
    vwcs.replace(&live.vwc, &PostParams::default(), &config)
        .await
        .expect("switch to failurePolicy Ignore");
    live.wait("creation to pass with failurePolicy Ignore", || {
        let api = api.clone();
        let run = good("good-while-ignored");
        async move { api.create(&PostParams::default(), &run).await.ok() }
    })
    .await;
    // What only the webhook checks now passes: the cost of Ignore.
    api.create(&PostParams::default(), &root_uid)
        .await
        .expect("with the webhook down and Ignore, uid 0 is not caught");
    // The CRD schema still refuses the worst specs on its own.
    let root_name = run_from(json!({
        "apiVersion": "sandbox.iterion.io/v1alpha1",
        "kind": "SandboxRun",
        "metadata": {"name": "root-name"},
        "spec": {"image": DIGEST_IMAGE, "user": "root"},
    }));
    let status = refused_422(
        api.create(&PostParams::default(), &root_name).await,
        "the schema pattern refuses a user name",
    );
    assert!(
        status.message.contains("spec.user") && status.message.contains("should match"),
        "{}",
        status.message
    );
    assert!(!status.message.contains(DENIED_BY_US), "{}", status.message);
    let _ = live.port;
}

// ---------------------------------------------------------------------------------------------
// Ratcheting: a run admitted once can always be let go of (issue #11)

/// How long a run on the kwok node may take to start, or to be drained and let go of.
const LIFECYCLE: Duration = Duration::from_secs(120);

/// A run whose one read-back path asks for 8Gi: admitted while the operator allows `--max-cap
/// 16Gi`, refused on CREATE once it allows 4Gi.
fn run_asking_8gi(name: &str, path: &Path) -> SandboxRun {
    run_from(json!({
        "apiVersion": "sandbox.iterion.io/v1alpha1",
        "kind": "SandboxRun",
        "metadata": {"name": name},
        "spec": {
            "image": DIGEST_IMAGE,
            "user": "1000:1000",
            "readBack": {
                "paths": [{"path": path.display().to_string(), "sizeLimit": "8Gi"}],
                "drainTimeout": "60s",
            },
        },
    }))
}

/// Waits until the webhook refuses a new run asking 8Gi (dry run): the smaller cap is in force,
/// so what passes afterwards passes despite it.
async fn wait_until_8gi_is_refused(live: &LiveWebhook, path: &Path) {
    let probe = run_asking_8gi("probe-8gi", path);
    let api = live.runs();
    live.wait("the webhook to refuse a new 8Gi path", || {
        let (api, probe) = (api.clone(), probe.clone());
        async move {
            match api.create(&dry_run(), &probe).await {
                Err(kube::Error::Api(e))
                    if e.message.contains(DENIED_BY_US)
                        && e.message.contains("[read-back-size-limit]") =>
                {
                    Some(())
                }
                _ => None,
            }
        }
    })
    .await;
}

#[tokio::test]
async fn a_run_admitted_under_a_larger_max_cap_is_deleted_after_a_restart_with_a_smaller_one() {
    // As reported: the operator allowed --max-cap 16Gi when the run was admitted, and restarts
    // with 4Gi. The drain runs, then the finalizer release — an UPDATE — goes through the webhook
    // (this configuration spares nobody: see LiveWebhook::start_with), which must not re-judge
    // the spec it admitted earlier.
    let mut live = LiveWebhook::start_with("live-shrink", true, &["--max-cap", "16Gi"]).await;
    let api = live.runs();
    let out = host_dir("out");
    std::fs::write(out.join("result.json"), b"{\"ok\":true}\n").expect("write a result");
    api.create(&PostParams::default(), &run_asking_8gi("kept", &out))
        .await
        .expect("8Gi is admitted under --max-cap 16Gi");
    eventually_or_log(
        "the run to be Running, held by its finalizer",
        LIFECYCLE,
        &live.op,
        || {
            let api = api.clone();
            async move {
                let run = api.get("kept").await.ok()?;
                let held = run.finalizers().iter().any(|f| f == FINALIZER);
                (held && run.status.as_ref()?.phase == Some(Phase::Running)).then_some(())
            }
        },
    )
    .await;

    live.restart_with(&["--max-cap", "4Gi"]).await;
    wait_until_8gi_is_refused(&live, &out).await;

    api.delete("kept", &DeleteParams::default())
        .await
        .expect("delete the run");
    eventually_or_log(
        "the run to be drained and gone",
        LIFECYCLE,
        &live.op,
        || {
            let api = api.clone();
            async move { api.get_opt("kept").await.ok()?.is_none().then_some(()) }
        },
    )
    .await;
    let log = live.op.log_text();
    assert!(
        !log.contains("denied the request"),
        "no write of the operator was refused:\n{log}"
    );
    // Let go of after its drain, not instead of it.
    let (store, prefix) = store_from_url(&live.store_url, &[]).expect("the test's store");
    let manifests = list_manifests(&store, &prefix, &live.ns.name, "kept")
        .await
        .expect("list the run's manifests");
    assert_eq!(
        manifests.len(),
        1,
        "drained before the run went; log:\n{log}"
    );
    assert!(
        manifests[0]
            .1
            .members
            .iter()
            .any(|m| m.path == "result.json"),
        "{:?}",
        manifests[0].1.members
    );
}

#[tokio::test]
async fn after_the_cap_shrinks_metadata_patches_pass_and_a_spec_edit_of_a_started_run_is_refused() {
    let mut live = LiveWebhook::start_with("live-ratchet", false, &["--max-cap", "16Gi"]).await;
    let api = live.runs();
    let path = Path::new("/work/out");
    api.create(&PostParams::default(), &run_asking_8gi("started", path))
        .await
        .expect("8Gi is admitted under --max-cap 16Gi");
    // The pod exists (written through the status subresource, as the controller does).
    api.patch_status(
        "started",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"podName": "started-sbr"}})),
    )
    .await
    .expect("status patch");
    live.restart_with(&["--max-cap", "4Gi"]).await;
    wait_until_8gi_is_refused(&live, path).await;

    // Metadata only: not re-judged.
    let metadata = |v: Value| Patch::Merge(json!({ "metadata": v }));
    api.patch(
        "started",
        &PatchParams::default(),
        &metadata(json!({"labels": {"team": "a"}})),
    )
    .await
    .expect("a label patch passes");
    api.patch(
        "started",
        &PatchParams::default(),
        &metadata(json!({"finalizers": ["example.com/hold"]})),
    )
    .await
    .expect("a finalizer patch passes");

    // A real spec edit of the started run is refused, for the edit and not for the admitted cap.
    let other_image =
        "ghcr.io/iterion/workload@sha256:4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e";
    let err = api
        .patch(
            "started",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"image": other_image}})),
        )
        .await
        .expect_err("the image of a started run is frozen");
    let kube::Error::Api(status) = err else {
        panic!("not an apiserver refusal: {err:?}");
    };
    assert!(
        status.message.contains(DENIED_BY_US)
            && status.message.contains("[update-immutable] spec.image"),
        "{}",
        status.message
    );
    assert!(
        !status.message.contains("[read-back-size-limit]"),
        "the admitted cap is not re-judged: {}",
        status.message
    );
    assert_eq!(
        api.get("started").await.expect("get").spec.image.as_deref(),
        Some(DIGEST_IMAGE)
    );
    // stop is the one edit a started run may get, and the admitted cap does not block it.
    let stopped = api
        .patch(
            "started",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"stop": true}})),
        )
        .await
        .expect("stop may be set");
    assert!(stopped.spec.stop);

    // Deletion: the finalizer holds the run, and its release on the deleting object passes.
    api.delete("started", &DeleteParams::default())
        .await
        .expect("delete");
    let held = api.get("started").await.expect("held by its finalizer");
    assert!(held.metadata.deletion_timestamp.is_some());
    api.patch(
        "started",
        &PatchParams::default(),
        &metadata(json!({"finalizers": []})),
    )
    .await
    .expect("the finalizer release passes");
    live.wait("the run to be gone", || {
        let api = api.clone();
        async move { api.get_opt("started").await.ok()?.is_none().then_some(()) }
    })
    .await;
}

#[tokio::test]
async fn a_configuration_created_after_the_operator_still_gets_its_ca_bundle() {
    // The usual install race (or a GitOps re-apply that drops caBundle): the operator starts, and
    // its startup patch finds no configuration. It must heal on its own, not after hours.
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, "live-late").await;
    let port = free_port();
    let vwc_name = format!("sandboxrun-live-{}", ns.name);
    let store = std::env::temp_dir().join(format!("sandboxrun-live-store-{}", ns.name));
    std::fs::create_dir_all(&store).expect("store dir");
    let addr = format!("127.0.0.1:{port}");
    let op = Operator::builder(
        &format!("{}-unwatched", ns.name),
        &format!("file://{}", store.display()),
    )
    .flags(&[
        "--webhook-addr",
        &addr,
        "--webhook-hosts",
        "127.0.0.1,localhost",
        "--pod-namespace",
        &ns.name,
        "--webhook-secret",
        "webhook-tls",
        "--webhook-config",
        &vwc_name,
    ])
    .start();
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(client.clone(), &ns.name);
    eventually("the operator to create its certificates", CONVERGE, || {
        let secrets = secrets.clone();
        async move { secrets.get_opt("webhook-tls").await.ok().flatten() }
    })
    .await;

    let vwcs: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let config = loopback_webhook(
        &vwc_name,
        "validate.sandbox.iterion.io",
        &ns.name,
        format!("https://127.0.0.1:{port}/validate-sandboxrun"),
        None,
        sandboxrun_rule(),
    );
    vwcs.create(&PostParams::default(), &config)
        .await
        .expect("register the webhook configuration");
    let _cleanup = VwcCleanup(vwc_name.clone());

    let patched = {
        let start = std::time::Instant::now();
        loop {
            let c = vwcs.get(&vwc_name).await.expect("get the configuration");
            if let Some(ca) = c
                .webhooks
                .and_then(|w| w.into_iter().next())
                .and_then(|w| w.client_config.ca_bundle)
            {
                break ca;
            }
            assert!(
                start.elapsed() < Duration::from_secs(90),
                "the caBundle of a configuration created after the operator was never patched; \
                 operator log:\n{}",
                op.log_text()
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    };
    assert!(String::from_utf8_lossy(&patched.0).contains("BEGIN CERTIFICATE"));
    let api: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let bad = run_from(json!({
        "apiVersion": "sandbox.iterion.io/v1alpha1",
        "kind": "SandboxRun",
        "metadata": {"name": "late-root"},
        "spec": {"image": DIGEST_IMAGE, "user": "0"},
    }));
    eventually("the webhook to judge runs", CONVERGE, || {
        let (api, bad) = (api.clone(), bad.clone());
        async move {
            match api.create(&PostParams::default(), &bad).await {
                Err(kube::Error::Api(e)) if e.message.contains(DENIED_BY_US) => Some(()),
                _ => None,
            }
        }
    })
    .await;
}

/// Deletes a webhook configuration when dropped.
struct VwcCleanup(String);

impl Drop for VwcCleanup {
    fn drop(&mut self) {
        let _ = kubectl_run(
            &[
                "delete",
                "validatingwebhookconfiguration",
                &self.0,
                "--ignore-not-found",
                "--wait=false",
            ],
            None,
        );
    }
}

// ---------------------------------------------------------------------------------------------
// doctor --strict through the binary

#[test]
fn doctor_strict_exit_codes_through_the_binary() {
    let corpus = corpus_dir();
    let f = |name: &str| corpus.join(name).display().to_string();
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("absent.yaml").display().to_string();

    // 0: ok, and ok with warnings (warnings never change the exit code).
    let (code, out, err) = doctor(&["--strict", &f("ok-minimal.yaml")], None);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("0 failure(s), 0 warning(s)") && out.contains(": ok"),
        "{out}"
    );
    let (code, out, err) = doctor(&["--strict", &f("warn-image-digest-tag.yaml")], None);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("⚠") && out.contains("image-digest spec.image") && out.contains("hint:"),
        "{out}"
    );
    assert!(out.contains("0 failure(s), 1 warning(s)"), "{out}");

    // 1: a failing check under --strict (0 without it: a report for humans).
    let (code, out, err) = doctor(&["--strict", &f("fail-user-non-root-zero.yaml")], None);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains("✗") && out.contains("user-non-root") && out.contains("failed (--strict)"),
        "{out}"
    );
    let (code, out, err) = doctor(&[&f("fail-user-non-root-zero.yaml")], None);
    assert_eq!(code, 0, "{out}{err}");

    // 2: unparseable YAML, unknown flag, missing file — and usage wins over failures.
    let (code, out, err) = doctor(&["--strict", &f("usage-yaml-syntax.yaml")], None);
    assert_eq!(code, 2, "{out}{err}");
    assert!(out.contains("YAML does not parse"), "{out}");
    let (code, out, err) = doctor(&["--strict", "--frobnicate", &f("ok-minimal.yaml")], None);
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains("--frobnicate"), "{err}");
    let (code, out, err) = doctor(&["--strict", &missing], None);
    assert_eq!(code, 2, "{out}{err}");
    assert!(out.contains("cannot read"), "{out}");
    let (code, out, err) = doctor(
        &["--strict", &f("fail-user-non-root-zero.yaml"), &missing],
        None,
    );
    assert_eq!(code, 2, "{out}{err}");
    let (code, out, err) = doctor(&["--strict"], None);
    assert_eq!(code, 2, "no file is a usage error: {out}{err}");

    // --output json parses and carries the same exit code, for every outcome.
    for (args, want) in [
        (vec![f("ok-minimal.yaml")], 0),
        (vec![f("warn-image-digest-tag.yaml")], 0),
        (vec![f("fail-everything-at-once.yaml")], 1),
        (vec![f("usage-yaml-syntax.yaml")], 2),
        (vec![missing.clone()], 2),
    ] {
        let mut all = vec!["--strict", "--output", "json"];
        all.extend(args.iter().map(String::as_str));
        let (code, out, err) = doctor(&all, None);
        assert_eq!(code, want, "{args:?}: {out}{err}");
        let report: Value = serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {out}"));
        assert_eq!(report["version"], 1, "{out}");
        assert_eq!(report["exitCode"], want, "{out}");
        assert_eq!(report["strict"], true, "{out}");
        let findings: Vec<&Value> = report["documents"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|d| d["findings"].as_array().into_iter().flatten())
            .collect();
        assert_eq!(
            report["summary"]["failures"].as_u64(),
            Some(findings.iter().filter(|f| f["severity"] == "fail").count() as u64),
            "{out}"
        );
        for f in findings {
            for key in ["rule", "severity", "field", "message", "hint"] {
                assert!(f[key].as_str().is_some_and(|s| !s.is_empty()), "{key}: {f}");
            }
        }
        if want == 2 {
            assert!(
                report["errors"].as_array().is_some_and(|e| !e.is_empty()),
                "{out}"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// --check-images against the test bed's registry

/// `host:port` of the test bed's plain-HTTP registry.
fn registry() -> String {
    if let Ok(r) = std::env::var("SANDBOXRUN_TEST_REGISTRY") {
        if !r.is_empty() {
            return r;
        }
    }
    let out = Command::new(repo().join("hack/local-cluster.sh"))
        .arg("env")
        .output()
        .expect("run hack/local-cluster.sh env");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("export SANDBOXRUN_TEST_REGISTRY=").map(str::to_string))
        .unwrap_or_else(|| {
            panic!(
                "no SANDBOXRUN_TEST_REGISTRY: the test bed is not running (`hack/local-cluster.sh up`)"
            )
        })
}

fn sha256(bytes: &[u8]) -> String {
    use sha2::Digest;
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(bytes)))
}

/// Pushes a tiny image (a config blob and an OCI manifest without layers) with the registry
/// HTTP API; returns the manifest digest.
async fn push_image(registry: &str, repo: &str, tag: &str) -> String {
    let http = reqwest::Client::new();
    let base = format!("http://{registry}");
    let config = serde_json::to_vec(&json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {},
        "rootfs": {"type": "layers", "diff_ids": []},
    }))
    .expect("config json");
    let config_digest = sha256(&config);

    let start = http
        .post(format!("{base}/v2/{repo}/blobs/uploads/"))
        .send()
        .await
        .unwrap_or_else(|e| panic!("registry {registry} does not answer: {e}"));
    assert_eq!(start.status().as_u16(), 202, "start upload: {start:?}");
    let location = start
        .headers()
        .get("location")
        .and_then(|v| v.to_str().ok())
        .expect("upload Location")
        .to_string();
    let mut upload = if location.starts_with("http") {
        url::Url::parse(&location)
    } else {
        url::Url::parse(&base).and_then(|b| b.join(&location))
    }
    .expect("upload URL");
    upload
        .query_pairs_mut()
        .append_pair("digest", &config_digest);
    let put = http
        .put(upload)
        .header("content-type", "application/octet-stream")
        .body(config.clone())
        .send()
        .await
        .expect("upload the config blob");
    assert_eq!(put.status().as_u16(), 201, "blob: {put:?}");

    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": config_digest,
            "size": config.len(),
        },
        "layers": [],
    }))
    .expect("manifest json");
    let put = http
        .put(format!("{base}/v2/{repo}/manifests/{tag}"))
        .header("content-type", "application/vnd.oci.image.manifest.v1+json")
        .body(manifest.clone())
        .send()
        .await
        .expect("put the manifest");
    assert_eq!(put.status().as_u16(), 201, "manifest: {put:?}");
    sha256(&manifest)
}

fn run_manifest(dir: &Path, name: &str, image: &str) -> String {
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &path,
        format!(
            "apiVersion: sandbox.iterion.io/v1alpha1\nkind: SandboxRun\nmetadata:\n  name: {name}\nspec:\n  image: {image}\n  user: \"1000\"\n"
        ),
    )
    .expect("write manifest");
    path.display().to_string()
}

#[tokio::test]
async fn check_images_resolves_against_the_real_registry_without_pulling() {
    crypto();
    let registry = registry();
    let repo = format!("sandboxrun-live/img-{:08x}", rand_u32());
    let digest = push_image(&registry, &repo, "v1").await;
    let dir = tempfile::tempdir().expect("tempdir");

    // The pushed tag resolves (a tag still warns image-digest: warnings keep exit 0).
    let tagged = run_manifest(dir.path(), "tagged", &format!("{registry}/{repo}:v1"));
    let (code, out, err) = doctor(
        &["--strict", "--check-images", "--output", "json", &tagged],
        None,
    );
    assert_eq!(code, 0, "{out}{err}");
    let report: Value = serde_json::from_str(&out).expect("json report");
    let rules: Vec<&str> = report["documents"][0]["findings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f["rule"].as_str())
        .collect();
    assert_eq!(rules, vec!["image-digest"], "{out}");

    // Pinned by the pushed digest: nothing to say at all.
    let pinned = run_manifest(dir.path(), "pinned", &format!("{registry}/{repo}@{digest}"));
    let (code, out, err) = doctor(&["--strict", "--check-images", &pinned], None);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("all checks passed"), "{out}");

    // A tag that does not exist fails (404 / MANIFEST_UNKNOWN is definitive).
    let missing = run_manifest(dir.path(), "missing", &format!("{registry}/{repo}:nope"));
    let (code, out, err) = doctor(&["--strict", "--check-images", &missing], None);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains("✗") && out.contains("spec.image") && out.contains("404"),
        "{out}"
    );
    // So does a repository that does not exist.
    let no_repo = run_manifest(
        dir.path(),
        "norepo",
        &format!(
            "{registry}/sandboxrun-live/never-pushed-{:08x}:v1",
            rand_u32()
        ),
    );
    let (code, out, err) = doctor(&["--strict", "--check-images", &no_repo], None);
    assert_eq!(code, 1, "{out}{err}");

    // A stopped registry (nothing listens on the port) is transient: a warning, exit 0.
    let closed = free_port();
    let down = run_manifest(dir.path(), "down", &format!("127.0.0.1:{closed}/{repo}:v1"));
    let (code, out, err) = doctor(
        &[
            "--strict",
            "--check-images",
            "--image-timeout-seconds",
            "2",
            "--output",
            "json",
            &down,
        ],
        None,
    );
    assert_eq!(code, 0, "{out}{err}");
    let report: Value = serde_json::from_str(&out).expect("json report");
    let image_warning = report["documents"][0]["findings"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|f| f["field"] == "spec.image" && f["rule"] != "image-digest")
        .cloned()
        .unwrap_or_else(|| panic!("no resolvability warning: {out}"));
    assert_eq!(image_warning["severity"], "warn", "{out}");
    assert!(
        image_warning["hint"]
            .as_str()
            .is_some_and(|h| h.contains("kubelet may still pull")),
        "{out}"
    );
    assert_eq!(report["summary"]["failures"], 0, "{out}");
}

/// The platform's namespace policies (issue #29 item 2; docs/contract.md "The platform's
/// namespace policies"), one table through the live webhook and through `doctor`: each rule of a
/// policy that selects `tier=free` namespaces refuses its field, naming the policy, while the
/// namespace carries `tier=free`, and lets the same run through once the namespace is relabelled
/// `tier=paid` (the webhook reads the labels at each review). `doctor` judges the same runs with
/// `--namespace-policies` and `--namespace-labels`, and says a selecting policy was not judged
/// when it is given no labels.
#[tokio::test]
async fn namespace_policies_refuse_each_field_where_they_select_naming_the_policy() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("policies.yaml");
    std::fs::write(
        &file,
        "- name: free-tier
  namespaceSelector: {matchLabels: {sandboxrun-test-tier: free}}
  runtimeClasses: [gvisor]
  priorityClasses: []
  images: [\"ghcr.io/iterion/**\"]
  maxSizeLimit: 1Gi
  maxDrainTimeout: 10m
  serviceAccounts: false
  secrets: false
",
    )
    .expect("write the policies");
    let path = file.display().to_string();
    let live =
        LiveWebhook::start_with("live-nspolicy", false, &["--namespace-policies", &path]).await;
    let ns = live.ns.name.clone();
    let label = |tier: &str| {
        let (code, out, err) = kubectl_run(
            &[
                "label",
                "namespace",
                &ns,
                "--overwrite",
                &format!("sandboxrun-test-tier={tier}"),
            ],
            None,
        );
        assert_eq!(code, 0, "{out}{err}");
    };
    let read_back = |size: &str, timeout: &str| json!({"paths": [{"path": "/out", "sizeLimit": size}], "drainTimeout": timeout});
    let cases: Vec<(&str, Value)> = vec![
        ("spec.runtimeClassName", json!({"runtimeClassName": "runc"})),
        (
            "spec.priorityClassName",
            json!({"priorityClassName": "high"}),
        ),
        (
            "spec.image",
            json!({"image": "docker.io/evil/miner@sha256:3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f"}),
        ),
        (
            "spec.readBack.paths[0].sizeLimit",
            json!({"readBack": read_back("2Gi", "5m")}),
        ),
        (
            "spec.readBack.drainTimeout",
            json!({"readBack": read_back("1Gi", "30m")}),
        ),
        (
            "spec.serviceAccountName",
            json!({"serviceAccountName": "default"}),
        ),
        (
            "spec.env[0].valueFrom.secretKeyRef",
            json!({"env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "db", "key": "k"}}}]}),
        ),
        (
            "spec.mounts[0]",
            json!({"mounts": [{"name": "m", "type": "secret", "source": "db", "target": "/m", "readOnly": true}]}),
        ),
    ];
    let manifest = |extra: &Value| {
        let mut spec = json!({"image": DIGEST_IMAGE, "user": "1000", "runtimeClassName": "gvisor"});
        for (k, v) in extra.as_object().expect("an object") {
            spec[k] = v.clone();
        }
        json!({
            "apiVersion": "sandbox.iterion.io/v1alpha1",
            "kind": "SandboxRun",
            "metadata": {"name": "r", "namespace": ns},
            "spec": spec,
        })
    };
    let runs = live.runs();
    label("free");
    // The webhook converges on the labels: a plain run passes, a refused one names the policy.
    let plain = run_from(manifest(&json!({})));
    runs.create(&dry_run(), &plain)
        .await
        .expect("a run within the policy passes");
    for (field, extra) in &cases {
        let run = run_from(manifest(extra));
        let status = refused_422(runs.create(&dry_run(), &run).await, field);
        assert!(
            status.message.contains(&format!("- [run-policy] {field}:"))
                && status.message.contains("namespace policy `free-tier`"),
            "{field}: {}",
            status.message
        );
        // doctor, offline, with the namespace's labels: the same field, the same policy.
        let doc = dir.path().join("run.yaml");
        std::fs::write(&doc, serde_yaml::to_string(&manifest(extra)).expect("yaml"))
            .expect("write");
        let doc = doc.display().to_string();
        let policies = ["--strict", "--namespace-policies", path.as_str()];
        let (code, out, err) = doctor(
            &[
                &doc,
                policies[0],
                policies[1],
                policies[2],
                "--namespace-labels",
                "sandboxrun-test-tier=free",
            ],
            None,
        );
        assert_eq!(code, 1, "{field}: {out}{err}");
        assert!(
            out.contains(field) && out.contains("free-tier"),
            "{field}: {out}"
        );
        let (code, out, err) = doctor(
            &[
                &doc,
                policies[0],
                policies[1],
                policies[2],
                "--namespace-labels",
                "sandboxrun-test-tier=paid",
            ],
            None,
        );
        assert_eq!(code, 0, "{field}: {out}{err}");
        let (_, out, _) = doctor(&[&doc, policies[0], policies[1], policies[2]], None);
        assert!(out.contains("was not judged"), "{field}: {out}");
    }
    // Relabelled out of the policy's selector: every run passes.
    label("paid");
    for (field, extra) in &cases {
        runs.create(&dry_run(), &run_from(manifest(extra)))
            .await
            .unwrap_or_else(|e| panic!("{field}: allowed outside the policy's namespaces: {e}"));
    }
}
