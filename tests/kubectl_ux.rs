//! What `kubectl` shows a user of the CRD on the real control plane: `kubectl explain` with the
//! CRD's own root description, and the `-o wide` columns (Exit, Duration, Message).

mod support;

use std::process::Command;

use support::*;

fn kubectl(args: &[&str]) -> Command {
    let mut cmd = tool("kubectl");
    cmd.args(args);
    cmd
}

fn ok(cmd: Command, stdin: Option<&[u8]>) -> String {
    let what = format!("{cmd:?}");
    let out = run(cmd, stdin);
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test]
async fn kubectl_explain_has_a_root_description_and_unwrapped_field_text() {
    let client = client().await;
    ensure_crd(&client).await;
    // kubectl caches discovery; a fresh CRD version may take a moment to be explained.
    let mut text = String::new();
    for _ in 0..30 {
        text = ok(kubectl(&["explain", "sandboxrun"]), None);
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
    let field = ok(
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
    let run_yaml = "apiVersion: sandbox.iterion.io/v1alpha1\nkind: SandboxRun\nmetadata:\n  name: wide\nspec:\n  image: busybox@sha256:0000000000000000000000000000000000000000000000000000000000000000\n  user: \"1000\"\n  command: [\"true\"]\n";
    ok(
        kubectl(&["apply", "-n", &ns.name, "-f", "-"]),
        Some(run_yaml.as_bytes()),
    );
    ok(
        kubectl(&[
            "patch",
            "sandboxrun",
            "wide",
            "-n",
            &ns.name,
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"phase":"Failed","exitCode":3,"duration":"1m2s","message":"workload failed with exit code 3"}}"#,
        ]),
        None,
    );
    let plain = ok(kubectl(&["get", "sbr", "wide", "-n", &ns.name]), None);
    assert!(!plain.contains("EXIT"), "{plain}");
    let wide = ok(
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
        ["NAME", "PHASE", "DRAINED", "POD", "AGE", "EXIT", "DURATION", "MESSAGE"],
        "{wide}"
    );
    let row = lines.next().unwrap_or_default();
    assert!(
        row.contains(" 3 ")
            && row.contains("1m2s")
            && row.ends_with("workload failed with exit code 3"),
        "{wide}"
    );
}

/// The binary as a kubectl plugin: on PATH as `kubectl-sandboxrun`, `kubectl sandboxrun …` runs
/// it and it names itself that way (no cluster needed).
#[test]
fn kubectl_runs_the_binary_as_the_sandboxrun_plugin() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let link = dir.path().join("kubectl-sandboxrun");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_sandboxrun-operator"), &link)
        .unwrap_or_else(|e| panic!("{e}"));
    let path = format!(
        "{}:{}",
        dir.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = kubectl(&["sandboxrun", "files", "--help"]);
    cmd.env("PATH", &path);
    let help = ok(cmd, None);
    assert!(help.contains("Usage: kubectl sandboxrun files"), "{help}");
    let mut cmd = kubectl(&["sandboxrun", "completion", "bash"]);
    cmd.env("PATH", &path);
    let script = ok(cmd, None);
    assert!(script.contains("kubectl-sandboxrun"), "{script}");
    let mut cmd = kubectl(&["sandboxrun", "doctor", "--strict", "-f", "-"]);
    cmd.env("PATH", &path);
    let report = ok(
        cmd,
        Some(b"apiVersion: sandbox.iterion.io/v1alpha1\nkind: SandboxRun\nmetadata: {name: p}\nspec:\n  image: busybox@sha256:0000000000000000000000000000000000000000000000000000000000000000\n  user: \"1000\"\n"),
    );
    assert!(report.contains("all checks passed"), "{report}");
}
