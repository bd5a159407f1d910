//! Commit safety of the drain on the real S3 server (docs/contract.md, "What the store holds
//! across attempts"): a cancelled attempt leaves no open multipart upload; a committed archive is
//! never overwritten.
//!
//! Each test runs its own operator binary and its own s3s-fs against its own namespace. kwok plays
//! the node: its exec runs the packer as a local process, so a declared "container path" is a host
//! directory, and the packer is a script of the test's.

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use sandboxrun_operator::api::{
    Compression, Phase, ReadBack, ReadBackPath, ReadBackPhase, SandboxRun, SandboxRunSpec,
};
use sandboxrun_operator::store::{object_keys, RunRef};
use serde_json::json;

use support::s3_server::PrivateS3;
use support::*;

const MIB: u64 = 1024 * 1024;

fn spec(path: &Path, size_limit: &str, drain_timeout: &str) -> SandboxRunSpec {
    SandboxRunSpec {
        image: Some("registry.example/tool@sha256:0000000000000000000000000000000000000000000000000000000000000000".into()),
        command: Some(vec!["sh".to_string(), "-c".to_string(), "work".to_string()]),
        user: Some("1000:1000".into()),
        read_back: Some(ReadBack {
            paths: vec![ReadBackPath {
                path: path.display().to_string(),
                size_limit: Some(Quantity(size_limit.to_string())),
                ..Default::default()
            }],
            compression: Compression::None,
            drain_timeout: Some(drain_timeout.into()),
        }),
        ..Default::default()
    }
}

fn store_flags(options: &[(String, String)]) -> Vec<String> {
    options
        .iter()
        .flat_map(|(k, v)| ["--store-option".to_string(), format!("{k}={v}")])
        .collect()
}

/// The packer the tests' operators exec: the declared directory says what to do (its `.mode`
/// file); without one it is the real packer.
///
/// - `hang`: sends `.stream` (the start of a tar) and then stalls, as a packer stuck on a file.
fn scripted_packer(bin_dir: &Path) -> PathBuf {
    let script = bin_dir.join("commit-pack.sh");
    let real = env!("CARGO_BIN_EXE_sandboxrun-operator");
    let text = format!(
        r#"#!/bin/sh
# Scripted packer of tests/drain_commit.rs. $1 is the declared path.
d="$1"
mode=real
[ -f "$d/.mode" ] && mode=$(cat "$d/.mode")
case "$mode" in
  hang) cat "$d/.stream"; sleep 40; exit 0 ;;
  *) exec "{real}" pack "$@" ;;
esac
"#
    );
    std::fs::write(&script, text).expect("write the packer");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    script
}

/// The first `sent` bytes of a tar whose one member claims `size` bytes.
fn truncated_tar(size: u64, sent: u64) -> Vec<u8> {
    let mut h = tar::Header::new_ustar();
    h.set_path("big.bin").expect("path");
    h.set_size(size);
    h.set_mode(0o644);
    h.set_mtime(1_700_000_000);
    h.set_entry_type(tar::EntryType::Regular);
    h.set_cksum();
    let mut out = h.as_bytes().to_vec();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    out.reserve(sent as usize);
    for _ in 0..sent / 8 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out
}

async fn wait_phase(api: &Api<SandboxRun>, name: &str, want: Phase, op: &Operator) -> SandboxRun {
    eventually_or_log(
        &format!("{name} to reach {want:?}"),
        Duration::from_secs(90),
        op,
        || {
            let api = api.clone();
            let name = name.to_string();
            async move {
                let r = api.get(&name).await.ok()?;
                (r.status.as_ref()?.phase == Some(want)).then_some(r)
            }
        },
    )
    .await
}

async fn wait_final(
    api: &Api<SandboxRun>,
    name: &str,
    op: &Operator,
    timeout: Duration,
) -> SandboxRun {
    eventually_or_log(
        &format!("{name} to reach a final phase"),
        timeout,
        op,
        || {
            let api = api.clone();
            let name = name.to_string();
            async move {
                let r = api.get(&name).await.ok()?;
                r.status.as_ref()?.phase.filter(|p| p.is_final())?;
                Some(r)
            }
        },
    )
    .await
}

async fn finish_workload(pods: &Api<Pod>, pod_name: &str) {
    let patch = json!({"metadata": {"annotations": {"sandbox.iterion.io/test-exit-code": "0"}}});
    pods.patch(pod_name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("annotate pod");
}

// ---------------------------------------------------------------------------------------------
// No orphaned multipart uploads (issue #10 item 4)
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn an_attempt_cancelled_by_the_drain_timeout_leaves_no_open_multipart_upload() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, "orphan").await;
    let s3 = PrivateS3::new("orphan");
    let bin = host_dir("orphan-bin");
    let pack = format!("{} ", scripted_packer(&bin).display());
    let mut flags = store_flags(&s3.options());
    flags.extend(["--pack-command".to_string(), pack]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let op = Operator::start(&ns.name, &s3.url(), &flags);

    // 12 MiB of a 64 MiB member, then the packer stalls: the archive is past its first 5 MiB
    // part, so it is a multipart upload with parts in the bucket when the drain timeout fires.
    let out = host_dir("orphan");
    std::fs::write(out.join(".mode"), "hang").expect("mode");
    std::fs::write(out.join(".stream"), truncated_tar(64 * MIB, 12 * MIB)).expect("stream");
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let created = runs
        .create(
            &PostParams::default(),
            &SandboxRun::new("stalls", spec(&out, "1Gi", "12s")),
        )
        .await
        .expect("create");
    let run = wait_phase(&runs, "stalls", Phase::Running, &op).await;
    finish_workload(&pods, &run.status.and_then(|s| s.pod_name).expect("pod")).await;

    let run_ref = RunRef {
        namespace: ns.name.clone(),
        name: "stalls".into(),
        uid: created.uid().expect("uid"),
    };
    let keys = object_keys(
        &object_store::path::Path::from("runs"),
        &run_ref,
        0,
        &out.display().to_string(),
        Compression::None,
    );
    let key = keys.archive.to_string();
    // The precondition that makes this test mean something: the upload is open mid-drain.
    let open = eventually_or_log(
        "a multipart upload of the archive to be open",
        Duration::from_secs(60),
        &op,
        || {
            let ids = s3.open_uploads(&key);
            async move { (!ids.is_empty()).then_some(ids) }
        },
    )
    .await;
    assert_eq!(open.len(), 1, "one attempt, one upload: {open:?}");

    let run = wait_final(&runs, "stalls", &op, Duration::from_secs(90)).await;
    let entry = &run.status.as_ref().expect("status").read_back[0];
    assert_eq!(entry.phase, ReadBackPhase::Failed, "{entry:?}");
    assert!(
        entry
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("drain timeout reached while attempt 1 was still streaming"),
        "{entry:?}"
    );
    // The cancelled attempt's upload is aborted: no open upload for the key, no part left.
    eventually_or_log(
        "the cancelled attempt's multipart upload to be aborted",
        Duration::from_secs(30),
        &op,
        || {
            let left = (s3.open_uploads(&key), s3.part_files());
            async move { (left.0.is_empty() && left.1.is_empty()).then_some(()) }
        },
    )
    .await;
    assert!(op.log_text().contains("aborting its multipart upload"));
}
