//! `doctor` through its public entry point, in-process (the binary's wiring lives in main.rs).

use sandboxrun_operator::caps::CapSettings;
use sandboxrun_operator::doctor::{run, DoctorArgs, Output};
use sandboxrun_operator::policy::RuleSettings;
use sandboxrun_operator::units::GIB;

use crate::support::ports::free_port;

const RUN: &str = "apiVersion: sandbox.iterion.io/v1alpha1
kind: SandboxRun
metadata:
  name: cli-run
  namespace: team-a
spec:
  image: alpine:3.20
  user: \"1000\"
  readBack:
    paths:
      - path: /out
        sizeLimit: 4Gi
";

async fn doctor_in_process(args: DoctorArgs, settings: RuleSettings) -> (u8, String) {
    let mut out = Vec::new();
    let code = run(args, settings, &mut out).await;
    (code, String::from_utf8_lossy(&out).into_owned())
}

fn file(text: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let path = dir.path().join("run.yaml");
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("{e}"));
    (dir, path.display().to_string())
}

#[tokio::test]
async fn warnings_never_change_the_exit_code() {
    let (_d, f) = file(RUN);
    let args = DoctorArgs {
        files: vec![f.clone()],
        filename: Vec::new(),
        strict: true,
        ..Default::default()
    };
    let (code, text) = doctor_in_process(args, RuleSettings::default()).await;
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains(&format!("⚠ {f}#0 team-a/cli-run image-digest spec.image")),
        "{text}"
    );
    assert!(text.contains("0 failure(s), 1 warning(s)"), "{text}");
}

#[tokio::test]
async fn the_operator_maximum_comes_from_the_settings() {
    let (_d, f) = file(RUN);
    let tight = RuleSettings {
        caps: CapSettings {
            default_bytes: GIB,
            max_bytes: 2 * GIB,
        },
        ..RuleSettings::default()
    };
    let args = DoctorArgs {
        files: vec![f],
        filename: Vec::new(),
        strict: true,
        ..Default::default()
    };
    let (code, text) = doctor_in_process(args, tight).await;
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("✗")
            && text.contains("read-back-size-limit spec.readBack.paths[0].sizeLimit"),
        "{text}"
    );
    assert!(text.contains("hint: lower sizeLimit"), "{text}");
}

#[tokio::test]
async fn json_output_is_machine_readable_and_carries_the_exit_code() {
    let (_d, f) = file(&RUN.replace("user: \"1000\"", "user: root"));
    let args = DoctorArgs {
        files: vec![f],
        filename: Vec::new(),
        strict: true,
        output: Output::Json,
        ..Default::default()
    };
    let (code, text) = doctor_in_process(args, RuleSettings::default()).await;
    assert_eq!(code, 1);
    let v: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(v["exitCode"], 1);
    assert_eq!(v["summary"]["failures"], 1);
    assert_eq!(v["documents"][0]["namespace"], "team-a");
    let rules: Vec<&str> = v["documents"][0]["findings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f["rule"].as_str())
        .collect();
    assert_eq!(rules, ["image-digest", "user-numeric"]);
}

#[tokio::test]
async fn usage_errors_win_over_failures_and_are_reported_in_json() {
    let (_d, f) = file(&RUN.replace("user: \"1000\"", "user: root"));
    let args = DoctorArgs {
        files: vec![f, "/nonexistent/x.yaml".into()],
        filename: Vec::new(),
        strict: true,
        output: Output::Json,
        ..Default::default()
    };
    let (code, text) = doctor_in_process(args, RuleSettings::default()).await;
    assert_eq!(code, 2, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    assert!(
        v["errors"][0]
            .as_str()
            .is_some_and(|e| e.contains("/nonexistent/x.yaml") && e.contains("cannot read")),
        "{text}"
    );
    assert_eq!(
        v["summary"]["checked"], 1,
        "the readable file is still checked"
    );
}

#[tokio::test]
async fn check_images_reports_an_unreachable_registry_as_a_warning() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let port = free_port();
    let (_d, f) = file(&RUN.replace("alpine:3.20", &format!("127.0.0.1:{port}/team/app:v1")));
    let args = DoctorArgs {
        files: vec![f],
        filename: Vec::new(),
        strict: true,
        check_images: true,
        image_timeout_seconds: 2,
        ..Default::default()
    };
    let (code, text) = doctor_in_process(args, RuleSettings::default()).await;
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("⚠")
            && text.contains("image-resolvable")
            && text.contains("kubelet may still pull"),
        "{text}"
    );
}

#[tokio::test]
async fn caps_and_the_drain_timeout_maximum_come_from_the_operators_flags() {
    let (_d, f) = file(&RUN.replace(
        "        sizeLimit: 4Gi\n",
        "        sizeLimit: 4Gi\n    drainTimeout: 30m\n",
    ));
    let with = |max_cap: Option<&str>, max_drain: Option<&str>| DoctorArgs {
        files: vec![f.clone()],
        strict: true,
        max_cap: max_cap.map(str::to_string),
        max_drain_timeout: max_drain.map(str::to_string),
        ..Default::default()
    };
    // Defaults (16Gi, 1h): both fit.
    let (code, text) = doctor_in_process(with(None, None), RuleSettings::default()).await;
    assert_eq!(code, 0, "{text}");
    // --max-cap 2Gi: the 4Gi sizeLimit is over the operator's maximum.
    let (code, text) = doctor_in_process(with(Some("2Gi"), None), RuleSettings::default()).await;
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("read-back-size-limit spec.readBack.paths[0].sizeLimit"),
        "{text}"
    );
    // --max-drain-timeout 10m: the 30m drainTimeout is over it.
    let (code, text) = doctor_in_process(with(None, Some("10m")), RuleSettings::default()).await;
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("read-back-drain-timeout spec.readBack.drainTimeout"),
        "{text}"
    );
    // A flag that does not parse is a usage error, as the operator refuses to start with it.
    let (code, text) = doctor_in_process(with(Some("lots"), None), RuleSettings::default()).await;
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("--max-cap \"lots\""), "{text}");
}

#[tokio::test]
async fn a_typo_and_a_wrong_kind_fail_strict_instead_of_passing_silently() {
    let typo = RUN.replace("  readBack:\n", "  readback:\n");
    let wrong_kind = RUN
        .replace("kind: SandboxRun", "kind: Sandboxrun")
        .replace("cli-run", "wrong-kind");
    let (_d, f) = file(&format!("{typo}---\n{wrong_kind}"));
    let args = DoctorArgs {
        files: vec![f.clone()],
        strict: true,
        ..Default::default()
    };
    let (code, text) = doctor_in_process(args, RuleSettings::default()).await;
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains(&format!(
            "✗ {f}#0 team-a/cli-run unknown-field spec.readback"
        )) && text.contains("hint: did you mean readBack?"),
        "{text}"
    );
    assert!(
        text.contains(&format!("✗ {f}#1 team-a/wrong-kind api-version-kind kind"))
            && text.contains("hint: kind: SandboxRun"),
        "{text}"
    );
    assert!(text.contains("2 checked, 0 skipped"), "{text}");
}

/// The binary as CI runs it from the image: manifests on stdin (`-f -`), the operator's settings
/// from the same environment variables as its Deployment.
#[test]
fn the_binary_reads_stdin_and_takes_the_caps_from_the_operators_environment() {
    use std::io::Write as _;
    use std::process::{Command, Stdio};
    let run = |env: &[(&str, &str)]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_sandboxrun-operator"));
        cmd.args(["doctor", "--strict", "-f", "-"])
            .env_remove("SANDBOXRUN_READBACK_CAP")
            .env_remove("SANDBOXRUN_READBACK_DEFAULT_CAP")
            .env_remove("SANDBOXRUN_MAX_DRAIN_TIMEOUT")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("{e}"));
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(RUN.as_bytes())
                .unwrap_or_else(|e| panic!("{e}"));
        }
        let out = child.wait_with_output().unwrap_or_else(|e| panic!("{e}"));
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (code, text) = run(&[]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("<stdin>#0 team-a/cli-run"), "{text}");
    let (code, text) = run(&[("SANDBOXRUN_READBACK_CAP", "2Gi")]);
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("read-back-size-limit"), "{text}");
}
