//! `doctor` through its public entry point, in-process (the binary's wiring lives in main.rs).

mod support;

use sandboxrun_operator::admission::doctor::{run, DoctorArgs, Output};
use sandboxrun_operator::admission::RuleSettings;
use sandboxrun_operator::caps::CapSettings;
use sandboxrun_operator::units::GIB;

use support::ports::free_port;

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

async fn doctor(args: DoctorArgs, settings: RuleSettings) -> (u8, String) {
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
    let (code, text) = doctor(args, RuleSettings::default()).await;
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
    let (code, text) = doctor(args, tight).await;
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
    let (code, text) = doctor(args, RuleSettings::default()).await;
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
    let (code, text) = doctor(args, RuleSettings::default()).await;
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
    let (code, text) = doctor(args, RuleSettings::default()).await;
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("⚠")
            && text.contains("image-resolvable")
            && text.contains("kubelet may still pull"),
        "{text}"
    );
}
