//! kubectl as the tests run it: the bed's binary by path, a command with arguments, a run that
//! must succeed, `apply` of a manifest, and the binary under test as the `kubectl sandboxrun`
//! plugin.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use super::{run, tool, tools_bin};

/// The kubectl of the test bed (falls back to the one on PATH).
pub fn kubectl_path() -> PathBuf {
    tools_bin()
        .map(|b| b.join("kubectl"))
        .unwrap_or_else(|| "kubectl".into())
}

/// The bed's kubectl with `args` (its kubeconfig, run from the repository root).
pub fn kubectl(args: &[&str]) -> Command {
    let mut cmd = tool("kubectl");
    cmd.args(args);
    cmd
}

/// Runs `cmd` with `stdin` and asserts it succeeded, showing its stdout and stderr when it did
/// not; its stdout.
pub fn run_ok(cmd: Command, stdin: Option<&[u8]>) -> String {
    let what = format!("{cmd:?}");
    let out = run(cmd, stdin);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{what} failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// `kubectl apply -n ns -f -` of `manifest` (the caller reads the outcome).
pub fn kubectl_apply(ns: &str, manifest: &str) -> Output {
    run(
        kubectl(&["apply", "-n", ns, "-f", "-"]),
        Some(manifest.as_bytes()),
    )
}

/// Links this build as `kubectl-sandboxrun` into `dir` (made if missing); the PATH that finds it
/// first.
pub fn link_plugin(dir: &Path) -> String {
    std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let link = dir.join("kubectl-sandboxrun");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_sandboxrun-operator"), &link)
        .unwrap_or_else(|e| panic!("link the plugin {}: {e}", link.display()));
    format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// `kubectl sandboxrun args…` with the plugin found on `path` (see [`link_plugin`]), no store URL
/// from the environment, and `kubeconfig` (the test bed's when None).
pub fn plugin(path: &str, kubeconfig: Option<&Path>, args: &[&str]) -> Command {
    let mut cmd = kubectl(&["sandboxrun"]);
    cmd.args(args)
        .env("PATH", path)
        .env_remove("SANDBOXRUN_STORE_URL")
        .env_remove("SANDBOXRUN_STORE_OPTIONS");
    if let Some(k) = kubeconfig {
        cmd.env("KUBECONFIG", k);
    }
    cmd
}
