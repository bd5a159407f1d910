//! What `kubectl` shows a user of the CRD on the real control plane: `kubectl explain` with the
//! CRD's own root description, the `-o wide` columns (Exit, Duration, Message, Template, TemplateKind), and the binary as
//! the kubectl plugin `kubectl sandboxrun` (files found from the run's status in the context's
//! namespace, `logs` from the status).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use sandboxrun_operator::api::{Phase, ReadBackPhase, SandboxRun};

use crate::support::operator::Operator;
use crate::support::runs::{create, finish_workload, pod_of, read_back, spec};
use crate::support::wait::{wait_final, wait_phase};
use crate::support::*;

#[tokio::test]
async fn kubectl_explain_has_a_root_description_and_unwrapped_field_text() {
    let client = client().await;
    ensure_crd(&client).await;
    // kubectl caches discovery; a fresh CRD version may take a moment to be explained.
    let mut text = String::new();
    for _ in 0..30 {
        text = run_ok(kubectl(&["explain", "sandboxrun"]), None);
        if text.contains("A SandboxRun runs one sandboxed workload") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    assert!(
        text.contains("A SandboxRun runs one sandboxed workload"),
        "{text}"
    );
    assert!(!text.contains("Auto-generated"), "{text}");
    let field = run_ok(
        kubectl(&["explain", "sandboxrun.spec.runtimeClassName"]),
        None,
    );
    assert!(field.contains("gvisor"), "{field}");
}

#[tokio::test]
async fn kubectl_get_wide_shows_exit_code_duration_and_message() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, "wide").await;
    let run_yaml = "apiVersion: sandbox.iterion.io/v1alpha1\nkind: SandboxRun\nmetadata:\n  name: wide\nspec:\n  image: busybox@sha256:0000000000000000000000000000000000000000000000000000000000000000\n  user: \"1000\"\n  command: [\"true\"]\n  templateRef: {name: ci}\n";
    run_ok(
        kubectl(&["apply", "-n", &ns.name, "-f", "-"]),
        Some(run_yaml.as_bytes()),
    );
    run_ok(
        kubectl(&[
            "patch",
            "sandboxrun",
            "wide",
            "-n",
            &ns.name,
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"phase":"Failed","attempt":2,"exitCode":3,"duration":"1m2s","message":"workload failed with exit code 3"}}"#,
        ]),
        None,
    );
    let plain = run_ok(kubectl(&["get", "sbr", "wide", "-n", &ns.name]), None);
    assert!(!plain.contains("EXIT"), "{plain}");
    let wide = run_ok(
        kubectl(&["get", "sbr", "wide", "-n", &ns.name, "-o", "wide"]),
        None,
    );
    let mut lines = wide.lines();
    let header: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        [
            "NAME",
            "PHASE",
            "DRAINED",
            "POD",
            "AGE",
            "ATTEMPT",
            "QUEUED",
            "EXIT",
            "DURATION",
            "MESSAGE",
            "TEMPLATE",
            "TEMPLATEKIND"
        ],
        "{wide}"
    );
    let row = lines.next().unwrap_or_default();
    assert!(
        row.contains(" 2 ")
            && row.contains(" 3 ")
            && row.contains("1m2s")
            && row.contains("workload failed with exit code 3")
            && row
                .split_whitespace()
                .rev()
                .take(2)
                .eq(["SandboxRunTemplate", "ci"]),
        "the template, its kind defaulted to the namespaced template's: {wide}"
    );
}

/// A directory holding the binary as `kubectl-sandboxrun`, and a PATH that starts with it.
fn plugin_path() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let path = link_plugin(dir.path());
    (dir, path)
}

/// Runs `cmd`, which must fail with exit code 1; returns its stderr.
fn fails(cmd: Command) -> String {
    let what = format!("{cmd:?}");
    let out = run(cmd, None);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A copy of the test bed's kubeconfig whose current context's namespace is `namespace`.
fn kubeconfig_in(dir: &Path, namespace: &str) -> PathBuf {
    let copy = dir.join("kubeconfig");
    std::fs::copy(kubeconfig_path(), &copy).unwrap_or_else(|e| panic!("copy kubeconfig: {e}"));
    let mut cmd = kubectl(&[
        "config",
        "set-context",
        "--current",
        "--namespace",
        namespace,
    ]);
    cmd.env("KUBECONFIG", &copy);
    run_ok(cmd, None);
    copy
}

/// The binary as a kubectl plugin: on PATH as `kubectl-sandboxrun`, `kubectl sandboxrun …` runs
/// it and it names itself that way (no cluster needed).
#[test]
fn kubectl_runs_the_binary_as_the_sandboxrun_plugin() {
    let (_dir, path) = plugin_path();
    let mut cmd = kubectl(&["sandboxrun", "files", "--help"]);
    cmd.env("PATH", &path);
    let help = run_ok(cmd, None);
    assert!(help.contains("Usage: kubectl sandboxrun files"), "{help}");
    let mut cmd = kubectl(&["sandboxrun", "completion", "bash"]);
    cmd.env("PATH", &path);
    let script = run_ok(cmd, None);
    assert!(script.contains("kubectl-sandboxrun"), "{script}");
    let mut cmd = kubectl(&["sandboxrun", "doctor", "--strict", "-f", "-"]);
    cmd.env("PATH", &path);
    let report = run_ok(
        cmd,
        Some(b"apiVersion: sandbox.iterion.io/v1alpha1\nkind: SandboxRun\nmetadata: {name: p}\nspec:\n  image: busybox@sha256:0000000000000000000000000000000000000000000000000000000000000000\n  user: \"1000\"\n"),
    );
    assert!(report.contains("all checks passed"), "{report}");
}

/// Issue #14 item 7 on the control plane (kwok plays the node, the operator binary drains into a
/// file:// store): `kubectl sandboxrun files ls|get RUN` with no `--store-url` and no `-n` finds
/// the store and the instance from the run's `status.readBack[].object`, in the kubeconfig
/// context's namespace; `kubectl sandboxrun logs RUN` prints how the workload ended and each
/// path's drain.
#[tokio::test]
async fn the_plugin_reads_a_runs_files_from_its_status_in_the_contexts_namespace() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, "plugin").await;
    let store_dir = host_dir("store-plugin");
    let store_url = format!("file://{}", store_dir.display());
    let op = Operator::builder(&ns.name, &store_url).start();
    let out = host_dir("plugin-out");
    std::fs::write(out.join("report.txt"), b"plugin report\n").expect("write the report");

    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    create(&runs, "report", spec(&[&out])).await;
    let running = wait_phase(&runs, "report", Phase::Running, &op).await;
    finish_workload(&pods, &pod_of(&running), 3).await;
    let run = wait_final(&runs, "report", &op, Duration::from_secs(90)).await;
    let entry = read_back(&run, 0);
    assert_eq!(entry.phase, ReadBackPhase::Drained, "{entry:?}");

    let (plugin_dir, path) = plugin_path();
    let kubeconfig = kubeconfig_in(plugin_dir.path(), &ns.name);
    let listing = run_ok(
        plugin(&path, Some(&kubeconfig), &["files", "ls", "report"]),
        None,
    );
    assert!(
        listing.contains(&out.display().to_string()) && listing.contains("report.txt"),
        "{listing}"
    );
    let uid = run.metadata.uid.clone().unwrap_or_default();
    assert!(listing.contains(&format!("run uid {uid}")), "{listing}");
    let target = plugin_dir.path().join("got");
    let target_arg = target.display().to_string();
    run_ok(
        plugin(
            &path,
            Some(&kubeconfig),
            &["files", "get", "report", "-o", &target_arg],
        ),
        None,
    );
    let slug = sandboxrun_operator::store::path_slug(&out.display().to_string());
    assert_eq!(
        std::fs::read(target.join(format!("00-{slug}/report.txt"))).expect("extracted"),
        b"plugin report\n"
    );

    // The same command in another namespace (the bed's context has none: `default`) does not
    // find the run, and says so; -n finds it again.
    let err = fails(plugin(&path, None, &["files", "ls", "report"]));
    assert!(
        err.contains("no SandboxRun default/report") && err.contains("-n"),
        "{err}"
    );
    let listing = run_ok(
        plugin(&path, None, &["files", "ls", "report", "-n", &ns.name]),
        None,
    );
    assert!(listing.contains("report.txt"), "{listing}");

    let logs = run_ok(plugin(&path, Some(&kubeconfig), &["logs", "report"]), None);
    assert!(
        logs.contains(&format!("SandboxRun {}/report: Failed", ns.name)),
        "{logs}"
    );
    assert!(logs.contains("Workload: exited 3"), "{logs}");
    assert!(logs.contains("Drained  1 member(s)"), "{logs}");
    assert!(
        logs.contains("Drain: every path has an outcome, none failed (1 path(s))"),
        "{logs}"
    );
}

/// `kubectl sandboxrun logs` and `files` on a run whose drain failed and whose workload left no
/// evidence (its status as the operator writes it, set here): both say so in words; `files` names
/// the failed path instead of guessing a store.
#[tokio::test]
async fn the_plugin_says_when_there_is_no_evidence_and_the_drain_failed() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, "plugin-failed").await;
    let run_yaml = "apiVersion: sandbox.iterion.io/v1alpha1\nkind: SandboxRun\nmetadata:\n  name: lost\nspec:\n  image: busybox@sha256:0000000000000000000000000000000000000000000000000000000000000000\n  user: \"1000\"\n  command: [\"true\"]\n  readBack:\n    paths: [{path: /out}]\n";
    run_ok(
        kubectl(&["apply", "-n", &ns.name, "-f", "-"]),
        Some(run_yaml.as_bytes()),
    );
    run_ok(
        kubectl(&[
            "patch",
            "sandboxrun",
            "lost",
            "-n",
            &ns.name,
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"phase":"Failed","message":"the pod was lost","readBack":[{"path":"/out","phase":"Failed","attempts":3,"message":"exec into the holder refused"}]}}"#,
        ]),
        None,
    );
    let (_dir, path) = plugin_path();
    let logs = run_ok(plugin(&path, None, &["logs", "lost", "-n", &ns.name]), None);
    assert!(
        logs.contains("No termination evidence: the workload never terminated"),
        "{logs}"
    );
    assert!(
        logs.contains("/out  Failed  (exec into the holder refused)"),
        "{logs}"
    );
    assert!(logs.contains("Drain: FAILED for 1 of 1 path(s)"), "{logs}");
    let err = fails(plugin(
        &path,
        None,
        &["files", "ls", "lost", "-n", &ns.name],
    ));
    assert!(
        err.contains("has no stored object")
            && err.contains("/out Failed: exec into the holder refused")
            && err.contains("--store-url"),
        "{err}"
    );
    let err = fails(plugin(&path, None, &["logs", "nope", "-n", &ns.name]));
    assert!(
        err.contains(&format!("no SandboxRun {}/nope", ns.name)),
        "{err}"
    );
}

/// Issue #40 part 1: a live sandbox is a session. `kubectl sandboxrun exec RUN -- CMD` runs in
/// its workload and exits with the command's own code; `cp` copies a file into and out of its
/// read-back paths (binary-safe, and only there); both talk with the caller's own kubeconfig, so
/// a caller who may read SandboxRuns but not `pods/exec` is refused by the apiserver, never served
/// with the operator's rights. (On the kwok node the workload's exec runs on this host.)
#[tokio::test]
async fn exec_and_cp_reach_a_live_sandbox_with_the_callers_own_rights() {
    use k8s_openapi::api::core::v1::ServiceAccount;
    use kube::api::PostParams;
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, "session").await;
    let store_dir = host_dir("store-session");
    let op = Operator::builder(&ns.name, &format!("file://{}", store_dir.display())).start();
    let out = host_dir("session-out");
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    create(&runs, "agent", spec(&[&out])).await;
    wait_phase(&runs, "agent", Phase::Running, &op).await;
    let (plugin_dir, path) = plugin_path();
    let kubeconfig = kubeconfig_in(plugin_dir.path(), &ns.name);

    // exec: the output comes back and the exit code passes through.
    let script = "echo from the sandbox; echo to stderr >&2; exit 7";
    let done = run(
        plugin(
            &path,
            Some(&kubeconfig),
            &["exec", "agent", "--", "sh", "-c", script],
        ),
        None,
    );
    assert_eq!(done.status.code(), Some(7), "{done:?}");
    assert_eq!(String::from_utf8_lossy(&done.stdout), "from the sandbox\n");
    assert!(
        String::from_utf8_lossy(&done.stderr).contains("to stderr"),
        "{done:?}"
    );

    // cp into a read-back path, then out again: every byte value, unchanged.
    let bytes: Vec<u8> = (0..=255u8).cycle().take(200_000).collect();
    let local = plugin_dir.path().join("in.bin");
    std::fs::write(&local, &bytes).expect("write");
    let inside = format!("agent:{}/notes/in.bin", out.display());
    std::fs::create_dir_all(out.join("notes")).expect("mkdir");
    run_ok(
        plugin(
            &path,
            Some(&kubeconfig),
            &["cp", &local.display().to_string(), &inside],
        ),
        None,
    );
    assert_eq!(
        std::fs::read(out.join("notes/in.bin")).expect("copied in"),
        bytes
    );
    let back = plugin_dir.path().join("back.bin");
    run_ok(
        plugin(
            &path,
            Some(&kubeconfig),
            &["cp", &inside, &back.display().to_string()],
        ),
        None,
    );
    assert_eq!(std::fs::read(&back).expect("copied out"), bytes);
    // Only inside the read-back paths.
    let refused = fails(plugin(
        &path,
        Some(&kubeconfig),
        &["cp", "agent:/etc/passwd", &back.display().to_string()],
    ));
    assert!(refused.contains("read-back paths"), "{refused}");

    // A caller who may read runs but may not exec into pods is refused by the apiserver.
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), &ns.name);
    let sa: ServiceAccount =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "reader"}})).expect("sa");
    sas.create(&PostParams::default(), &sa)
        .await
        .expect("create sa");
    let rbac = format!(
        "apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: runs-reader, namespace: {ns}}}
rules:
- {{apiGroups: [sandbox.iterion.io], resources: [sandboxruns], verbs: [get]}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: runs-reader, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: runs-reader}}
subjects: [{{kind: ServiceAccount, name: reader, namespace: {ns}}}]
",
        ns = ns.name
    );
    run_ok(kubectl(&["apply", "-f", "-"]), Some(rbac.as_bytes()));
    let reader = service_account_kubeconfig(&client, &ns.name, "reader").await;
    let denied = fails(plugin(
        &path,
        Some(&reader),
        &["exec", "agent", "-n", &ns.name, "--", "true"],
    ));
    assert!(
        denied.contains("forbidden") || denied.contains("Forbidden"),
        "{denied}"
    );
}
