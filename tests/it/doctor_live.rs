//! `doctor --context` / `--kubeconfig` against the real control plane (docs/contract.md ADR-006
//! §3): the real operator binary serves its webhook on loopback (registered by URL for this
//! test's namespace only, self-managed certificates) and publishes its settings; the real
//! `doctor` binary probes the cluster. With the webhook up a good manifest is clean; with the
//! operator killed the same manifest gets warnings (exit 0), and `--require-context` turns them
//! into exit 1. A manifest that mounts a Secret the cluster does not have fails; the operator's
//! published `--max-cap` is what a `sizeLimit` is judged by, not doctor's default. A run whose
//! template is not among the manifests is judged merged with the template read from the cluster.

use std::process::{Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, PostParams};
use kube::config::Kubeconfig;
use kube::{Api, Client};

use crate::support::*;

const BIN: &str = env!("CARGO_BIN_EXE_sandboxrun-operator");
const DIGEST_IMAGE: &str =
    "ghcr.io/iterion/workload@sha256:3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f";
/// How long the apiserver may take to see a new webhook configuration.
const CONVERGE: Duration = Duration::from_secs(60);

/// The real binary's `doctor` with the test bed's kubeconfig and `args`; `stdin` piped in.
/// Returns (exit code, stdout, stderr).
fn doctor_with_kubeconfig(args: &[&str], stdin: &str) -> (i32, String, String) {
    let kubeconfig = kubeconfig_path().display().to_string();
    let mut cmd =
        doctor_command(&[&["--kubeconfig", &kubeconfig][..], args, &["-f", "-"]].concat());
    cmd.env_remove("KUBECONFIG");
    outcome(run(cmd, Some(stdin.as_bytes())))
}

/// The current context's name in the test bed's kubeconfig.
fn current_context() -> String {
    Kubeconfig::read_from(kubeconfig_path())
        .ok()
        .and_then(|k| k.current_context)
        .expect("the test bed's kubeconfig names a current context")
}

fn run_yaml(ns: &str, name: &str, extra_spec: &str) -> String {
    format!(
        "apiVersion: sandbox.iterion.io/v1alpha1\nkind: SandboxRun\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n  image: {DIGEST_IMAGE}\n  user: \"1000\"\n  command: [sh, -c, 'true']\n{extra_spec}"
    )
}

/// The operator's webhook for the test namespace, and the operator publishing its settings in
/// that namespace with `--max-cap 2Gi`.
struct Bed {
    client: Client,
    ns: TestNamespace,
    vwc: String,
    op: Operator,
}

impl Bed {
    async fn start() -> Bed {
        Bed::start_with(&[]).await
    }

    /// The bed with `extra` operator flags.
    async fn start_with(extra: &[&str]) -> Bed {
        let client = client().await;
        ensure_crd(&client).await;
        let ns = TestNamespace::new(&client, "doctor-live").await;
        let port = free_port();
        let vwc = format!("sandboxrun-doctor-{}", ns.name);
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
        let (_dir, store_url) = file_store("doctor-live");
        let addr = format!("127.0.0.1:{port}");
        // The controller watches the test's namespace (doctor only dry-runs there: nothing is
        // created); the webhook and the settings publisher matter here.
        let op = Operator::builder(&ns.name, &store_url)
            .flags(&[
                "--webhook-addr",
                &addr,
                "--webhook-cert-mode",
                "self-managed",
                "--webhook-hosts",
                "127.0.0.1,localhost",
                "--pod-namespace",
                &ns.name,
                "--webhook-secret",
                "doctor-live-tls",
                "--webhook-config",
                &vwc,
                "--max-cap",
                "2Gi",
                "--settings-configmap",
                "sbr-settings",
            ])
            .flags(extra)
            .start();
        let bed = Bed {
            client,
            ns,
            vwc,
            op,
        };
        // Ready when the caBundle is patched, the settings are published and the apiserver
        // judges a bad run through the webhook.
        let cms: Api<ConfigMap> = Api::namespaced(bed.client.clone(), &bed.ns.name);
        eventually_or_log("the settings ConfigMap", CONVERGE, &bed.op, || {
            let cms = cms.clone();
            async move { cms.get_opt("sbr-settings").await.ok().flatten() }
        })
        .await;
        let bad: sandboxrun_operator::api::SandboxRun = serde_yaml::from_str(
            &run_yaml(&bed.ns.name, "probe-root", "").replace("user: \"1000\"", "user: \"0\""),
        )
        .expect("a SandboxRun");
        let runs: Api<sandboxrun_operator::api::SandboxRun> =
            Api::namespaced(bed.client.clone(), &bed.ns.name);
        eventually_or_log("the webhook to judge", CONVERGE, &bed.op, || {
            let runs = runs.clone();
            let bad = bad.clone();
            async move {
                let dry = PostParams {
                    dry_run: true,
                    ..Default::default()
                };
                match runs.create(&dry, &bad).await {
                    Err(kube::Error::Api(e)) if e.message.contains("refused by ADR-006") => {
                        Some(())
                    }
                    _ => None,
                }
            }
        })
        .await;
        bed
    }

    fn doctor(&self, extra: &[&str], stdin: &str) -> (i32, String, String) {
        let mut args = vec!["--strict", "--operator-namespace", self.ns.name.as_str()];
        args.extend_from_slice(extra);
        doctor_with_kubeconfig(&args, stdin)
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        let name = self.vwc.clone();
        clean_up_from_drop(move |client| async move {
            let _ = Api::<ValidatingWebhookConfiguration>::all(client)
                .delete(&name, &DeleteParams::default())
                .await;
        });
    }
}

#[tokio::test]
async fn with_the_webhook_up_a_good_manifest_is_clean_and_down_it_warns_unless_required() {
    let mut bed = Bed::start().await;
    let good = run_yaml(&bed.ns.name, "good", "");
    let context = current_context();

    let (code, out, err) = bed.doctor(&["--context", &context], &good);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains(&format!("✓ cluster {context} CRD served, webhook ready")),
        "{out}"
    );
    assert!(!out.contains('⚠') && !out.contains('✗'), "clean: {out}");
    assert!(
        out.contains(&format!(
            "judged with the operator's published settings ({}/sbr-settings)",
            bed.ns.name
        )),
        "{out}"
    );
    assert!(out.contains("all checks passed"), "{out}");

    // Issue #27: a run bound for a namespace the operator does not watch would sit with no
    // status for ever; doctor --context says so from the published settings.
    let elsewhere = run_yaml("default", "elsewhere", "");
    let (code, out, err) = bed.doctor(&["--context", &context], &elsewhere);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains("namespace-not-watched metadata.namespace")
            && out.contains(&format!("it watches {}", bed.ns.name)),
        "{out}"
    );

    // The operator goes away: its webhook endpoint is dead, the dry run cannot be judged.
    bed.op.kill();
    let (code, out, err) = bed.doctor(&[], &good);
    assert_eq!(code, 0, "probe failures only warn: {out}{err}");
    assert!(
        out.contains("⚠ cluster") && out.contains("cluster-webhook"),
        "{out}"
    );
    assert!(out.contains("endpoint is not serving"), "{out}");
    assert!(
        out.contains("cluster-probe") && out.contains("failed calling webhook"),
        "the dry run through the dead webhook: {out}"
    );
    assert!(!out.contains('✗'), "{out}");

    let (code, out, err) = bed.doctor(&["--require-context"], &good);
    assert_eq!(code, 1, "--require-context fails on them: {out}{err}");
    assert!(
        out.contains("✗ cluster") && out.contains("cluster-webhook"),
        "{out}"
    );

    // JSON carries the cluster section.
    let (code, out, _) = bed.doctor(&["-o", "json"], &good);
    assert_eq!(code, 0, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
    assert_eq!(v["cluster"]["context"], context.as_str(), "{out}");
    assert!(
        v["cluster"]["findings"]
            .as_array()
            .is_some_and(|f| f.iter().any(|f| f["rule"] == "cluster-webhook")),
        "{out}"
    );
}

#[tokio::test]
async fn a_missing_secret_fails_and_the_operators_published_cap_is_the_one_judged() {
    let bed = Bed::start().await;
    let ns = bed.ns.name.clone();
    let mount =
        "  mounts:\n    - {name: creds, type: secret, source: no-such-secret, target: /creds}\n";
    let (code, out, err) = bed.doctor(&[], &run_yaml(&ns, "needs-secret", mount));
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains("✗")
            && out.contains("reference-missing spec.mounts[0].source")
            && out.contains(&format!(
                "Secret \"no-such-secret\" in namespace {ns} does not exist"
            )),
        "{out}"
    );
    // The same Secret in the manifests themselves satisfies the reference.
    let with_secret = format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: no-such-secret, namespace: {ns}}}\n---\n{}",
        run_yaml(&ns, "needs-secret", mount)
    );
    let (code, out, err) = bed.doctor(&[], &with_secret);
    assert_eq!(code, 0, "{out}{err}");
    assert!(!out.contains("reference-missing"), "{out}");

    // The operator runs with --max-cap 2Gi; doctor's own default is 16Gi. A 4Gi sizeLimit fails
    // because doctor judges with the published settings (the webhook's dry run agrees).
    let big = "  readBack:\n    paths:\n      - {path: /out, sizeLimit: 4Gi}\n";
    let (code, out, err) = bed.doctor(&[], &run_yaml(&ns, "big", big));
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains("read-back-size-limit spec.readBack.paths[0].sizeLimit"),
        "{out}"
    );
    assert!(out.contains("dry-run"), "the cluster refuses it too: {out}");
    // Offline, the same manifest passes: the flags' default is larger.
    let offline = Command::new(BIN)
        .args(["doctor", "--strict", "-f", "-"])
        .env_remove("SANDBOXRUN_READBACK_CAP")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            if let Some(mut p) = c.stdin.take() {
                p.write_all(run_yaml(&ns, "big", big).as_bytes())?;
            }
            c.wait_with_output()
        })
        .expect("offline doctor");
    assert_eq!(
        offline.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&offline.stdout)
    );
}

/// Issue #29 item 2: `doctor --context` judges the operator's published namespace policies with
/// the labels the namespace has in the cluster, naming the policy; relabelled out of its
/// selector, the same manifest is clean.
#[tokio::test]
async fn the_published_namespace_policies_are_judged_with_the_namespaces_own_labels() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("policies.yaml");
    std::fs::write(
        &file,
        "- name: free-tier\n  namespaceSelector: {matchLabels: {sandboxrun-test-tier: free}}\n  serviceAccounts: false\n",
    )
    .expect("write the policies");
    let bed = Bed::start_with(&["--namespace-policies", &file.display().to_string()]).await;
    let ns = bed.ns.name.clone();
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(bed.client.clone());
    let label = |tier: &'static str| {
        let (namespaces, ns) = (namespaces.clone(), ns.clone());
        let patch = serde_json::json!({"metadata": {"labels": {"sandboxrun-test-tier": tier}}});
        async move {
            namespaces
                .patch(
                    &ns,
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Merge(patch),
                )
                .await
                .expect("label the namespace");
        }
    };
    let manifest = run_yaml(&ns, "with-sa", "  serviceAccountName: default\n");
    label("free").await;
    let (code, out, err) = bed.doctor(&[], &manifest);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains("run-policy spec.serviceAccountName")
            && out.contains("namespace policy `free-tier`"),
        "{out}"
    );
    assert!(out.contains("namespace policies: free-tier"), "{out}");
    label("paid").await;
    let (code, out, err) = bed.doctor(&[], &manifest);
    assert_eq!(code, 0, "{out}{err}");
}

/// Issue #29 item 1: `doctor --context` reports a run whose store cannot be used, judged as the
/// operator would with the tenant-store rules it publishes: the namespace's default store names
/// a Secret that does not exist (a failure, unless the manifests bring it), a store the run
/// names whose Secret is not among `--tenant-store-secret-names` (the webhook's dry-run refusal
/// and doctor's own finding); once the Secret exists the run is clean.
#[tokio::test]
async fn doctor_judges_a_runs_store_as_the_operator_would() {
    let endpoint = bed_setting("SANDBOXRUN_TEST_S3_ENDPOINT");
    let bed = Bed::start_with(&[
        "--tenant-store-endpoints",
        &endpoint,
        "--tenant-store-secret-names",
        "team-creds",
    ])
    .await;
    let ns = bed.ns.name.clone();
    let configmaps: Api<ConfigMap> = Api::namespaced(bed.client.clone(), &ns);
    for (name, secret) in [
        ("sandboxrun-store", "team-creds"),
        ("rogue", "default-token"),
    ] {
        let yaml = format!(
            "metadata: {{name: {name}}}\n\
             data: {{url: 's3://sandboxrun-test/doctor', options: 'endpoint={endpoint},allow_http=true', secretName: {secret}}}\n"
        );
        let cm: ConfigMap = serde_yaml::from_str(&yaml).expect("a ConfigMap");
        configmaps
            .create(&PostParams::default(), &cm)
            .await
            .expect("create the store ConfigMap");
    }
    let secret = format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: team-creds, namespace: {ns}, \
         labels: {{sandbox.iterion.io/store-credentials: 'true'}}}}\n\
         stringData: {{AWS_ACCESS_KEY_ID: a, AWS_SECRET_ACCESS_KEY: b}}\n"
    );
    let paths = "  readBack:\n    paths:\n    - path: /out\n";
    let manifest = run_yaml(&ns, "default-store", paths);
    let (code, out, err) = bed.doctor(&[], &manifest);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains("store-unusable")
            && out.contains(&format!("{ns}/sandboxrun-store"))
            && out.contains(&format!("{ns}/team-creds does not exist")),
        "{out}"
    );
    assert!(
        out.contains("store Secrets: team-creds"),
        "the published rules are described: {out}"
    );
    // The manifests bring the Secret: nothing is missing.
    let (code, out, err) = bed.doctor(&[], &format!("{secret}---\n{manifest}"));
    assert_eq!(code, 0, "{out}{err}");
    // A named store whose Secret the platform does not let the operator read.
    let named = run_yaml(&ns, "rogue-store", &format!("{paths}    storeRef: rogue\n"));
    let (code, out, err) = bed.doctor(&[], &named);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains("store-unusable")
            && out.contains("\"default-token\"")
            && out.contains("--tenant-store-secret-names"),
        "{out}"
    );
    assert!(
        out.contains("dry-run") && out.contains("team-creds"),
        "the webhook refuses it too: {out}"
    );
    let typed: k8s_openapi::api::core::v1::Secret =
        serde_yaml::from_str(&secret).expect("a Secret");
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(bed.client.clone(), &ns)
        .create(&PostParams::default(), &typed)
        .await
        .expect("create the Secret");
    let (code, out, err) = bed.doctor(&[], &manifest);
    assert_eq!(code, 0, "{out}{err}");
}

/// The findings of the first document of doctor's JSON report, as (rule, severity, field,
/// message).
fn findings(json: &str) -> Vec<(String, String, String, String)> {
    let v: serde_json::Value = serde_json::from_str(json).unwrap_or_default();
    let text = |f: &serde_json::Value, k: &str| f[k].as_str().unwrap_or_default().to_string();
    v["documents"][0]["findings"]
        .as_array()
        .map(|all| {
            all.iter()
                .map(|f| {
                    (
                        text(f, "rule"),
                        text(f, "severity"),
                        text(f, "field"),
                        text(f, "message"),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Issue #29 item 3: a run whose template is not among the inputs is judged with `--context`
/// merged with the template read from the cluster (a ClusterSandboxRunTemplate, or a
/// SandboxRunTemplate of its namespace), as the webhook would: a locked field refused by name
/// (doctor's own finding, not only the dry run's), a missing template `template-unusable`.
#[tokio::test]
async fn doctor_judges_a_run_with_its_template_read_from_the_cluster() {
    use sandboxrun_operator::api::{
        ClusterSandboxRunTemplate, ClusterSandboxRunTemplateSpec, OpenField, SandboxRunSpec,
        SandboxRunTemplate, SandboxRunTemplateSpec,
    };
    let bed = Bed::start().await;
    let ns = bed.ns.name.clone();
    let spec = SandboxRunTemplateSpec {
        template: SandboxRunSpec {
            image: Some(DIGEST_IMAGE.into()),
            user: Some("1000".into()),
            ..SandboxRunSpec::default()
        },
        open_fields: vec![OpenField::Command],
    };
    let cluster_name = format!("{ns}-ci");
    let pp = PostParams::default();
    let clusters: Api<ClusterSandboxRunTemplate> = Api::all(bed.client.clone());
    clusters
        .create(
            &pp,
            &ClusterSandboxRunTemplate::new(
                &cluster_name,
                ClusterSandboxRunTemplateSpec(spec.clone()),
            ),
        )
        .await
        .expect("create the ClusterSandboxRunTemplate");
    let _cluster = ClusterTemplate(cluster_name.clone());
    Api::<SandboxRunTemplate>::namespaced(bed.client.clone(), &ns)
        .create(&pp, &SandboxRunTemplate::new("team-ci", spec))
        .await
        .expect("create the SandboxRunTemplate");
    let run = |name: &str, reference: &str, extra: &str| {
        format!(
            "apiVersion: sandbox.iterion.io/v1alpha1\nkind: SandboxRun\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  templateRef: {reference}\n  command: [sh, -c, 'true']\n{extra}"
        )
    };
    let by_cluster = format!("{{kind: ClusterSandboxRunTemplate, name: {cluster_name}}}");
    let template_findings = |out: &str| {
        findings(out)
            .into_iter()
            .filter(|f| f.0.starts_with("template-"))
            .collect::<Vec<_>>()
    };

    // Only open fields: the merged spec (the template's image and user) is clean.
    for (name, reference) in [("open", by_cluster.as_str()), ("team", "{name: team-ci}")] {
        let (code, out, err) = bed.doctor(&["-o", "json"], &run(name, reference, ""));
        assert_eq!(
            code, 0,
            "{name}: merged with the cluster's template\n{out}{err}"
        );
        assert_eq!(template_findings(&out), [], "{name}: {out}");
    }
    // A locked field: doctor's own template-locked finding, naming the field and the template.
    let (code, out, err) = bed.doctor(
        &["-o", "json"],
        &run("locked", &by_cluster, "  user: \"0\"\n"),
    );
    assert_eq!(code, 1, "{out}{err}");
    let found = template_findings(&out);
    assert!(
        found
            .iter()
            .any(|(rule, severity, field, message)| rule == "template-locked"
                && severity == "fail"
                && field == "spec.user"
                && message.contains(&format!("ClusterSandboxRunTemplate {cluster_name}"))),
        "{out}"
    );
    // A template the cluster does not have: template-unusable, failing.
    let missing = format!("{{kind: ClusterSandboxRunTemplate, name: {ns}-nope}}");
    let (code, out, err) = bed.doctor(&["-o", "json"], &run("missing", &missing, ""));
    assert_eq!(code, 1, "{out}{err}");
    let found = template_findings(&out);
    assert!(
        found
            .iter()
            .any(|(rule, severity, _, message)| rule == "template-unusable"
                && severity == "fail"
                && message.contains(&format!(
                    "ClusterSandboxRunTemplate {ns}-nope does not exist"
                ))),
        "{out}"
    );
    assert!(
        !out.contains("not in these inputs"),
        "read from the cluster, not warned about: {out}"
    );
}

#[tokio::test]
async fn a_context_that_does_not_exist_is_a_usage_error() {
    let (code, out, err) = doctor_with_kubeconfig(
        &["--strict", "--context", "no-such-context"],
        &run_yaml("default", "x", ""),
    );
    assert_eq!(code, 2, "{out}{err}");
    assert!(out.contains("no such context"), "{out}");
    let (code, out, _) = Command::new(BIN)
        .args(["doctor", "--require-context", "-f", "/dev/null"])
        .output()
        .map(|o| {
            (
                o.status.code().unwrap_or(-1),
                String::from_utf8_lossy(&o.stdout).into_owned(),
                (),
            )
        })
        .expect("doctor");
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("--require-context needs --context or --kubeconfig"),
        "{out}"
    );
}
