//! The packer's stream on the exec wire (docs/contract.md "The stream on the wire",
//! src/drain/wire.rs): by default (`--drain-wire adaptive`) the holder sends its tar in blocks,
//! each compressed when that shrinks it and stored when it does not, and the manifest records
//! which; with `--drain-wire zstd` it compresses the whole tar; either way the drain decodes it
//! before the sanitizer, so the same tree lands in the store byte for byte, with far fewer bytes
//! on the wire for compressible output; with `--drain-wire tar` the tar goes as is; a packer that
//! predates `adaptive` gets zstd on the next attempt, one that predates `pack --wire` (its usage
//! error names the flag) a plain tar. The operator's `/metrics` say which encoding crossed the
//! wire and how many bytes.
//!
//! kwok plays the node (its exec runs the packer as a local process), as in tests/it/drain_e2e.rs.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use sandboxrun_operator::api::{Phase, ReadBackPhase, SandboxRun};

use crate::support::*;

/// ~6 MiB of JSON-like log lines (compresses well, as tool output does) and 1 MiB of noise.
fn compressible_tree(root: &Path) {
    let mut log = String::new();
    for i in 0..60_000u32 {
        log.push_str(&format!(
            "{{\"ts\":\"2026-12-01T06:{:02}:{:02}Z\",\"level\":\"info\",\"step\":{i},\"msg\":\"processed item\",\"ok\":true}}\n",
            (i / 60) % 60,
            i % 60
        ));
    }
    std::fs::create_dir_all(root.join("logs")).expect("mkdir");
    std::fs::write(root.join("logs/run.jsonl"), &log).expect("write log");
    write_pattern(&root.join("noise.bin"), 1024 * 1024, 7);
}

/// A metric's value in a Prometheus text exposition (0 when absent).
fn metric(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
        .unwrap_or(0)
}

async fn metrics_text(port: u16) -> String {
    let out = tokio::process::Command::new("curl")
        .args(["-s", &format!("http://127.0.0.1:{port}/metrics")])
        .output()
        .await
        .expect("curl /metrics");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A packer as an older holder image: clap's usage error for `--wire`, else the real packer.
fn packer_without_wire(bin_dir: &Path) -> PathBuf {
    let script = bin_dir.join("old-pack.sh");
    let real = env!("CARGO_BIN_EXE_sandboxrun-operator");
    let text = format!(
        r#"#!/bin/sh
# A packer from before `pack --wire` (tests/it/drain_wire.rs).
for a in "$@"; do
  if [ "$a" = "--wire" ]; then
    echo "error: unexpected argument '--wire' found" >&2
    exit 2
  fi
done
exec "{real}" pack "$@"
"#
    );
    std::fs::write(&script, text).expect("write the packer");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    script
}

/// A packer as a holder image from before `pack --wire adaptive`: clap's refusal of the value,
/// else the real packer.
fn packer_without_adaptive(bin_dir: &Path) -> PathBuf {
    let script = bin_dir.join("zstd-only-pack.sh");
    let real = env!("CARGO_BIN_EXE_sandboxrun-operator");
    let text = format!(
        r#"#!/bin/sh
# A packer that knows `--wire tar|zstd` only (tests/it/drain_wire.rs).
for a in "$@"; do
  if [ "$a" = "adaptive" ]; then
    echo "error: invalid value 'adaptive' for '--wire <WIRE>'" >&2
    echo "  [possible values: tar, zstd]" >&2
    exit 2
  fi
done
exec "{real}" pack "$@"
"#
    );
    std::fs::write(&script, text).expect("write the packer");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    script
}

/// 8 MiB that no compressor shrinks (xorshift), in two files.
fn random_tree(root: &Path) {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut noise = vec![0u8; 4 << 20];
    for file in ["a.bin", "b.bin"] {
        for b in noise.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = (x >> 24) as u8;
        }
        std::fs::write(root.join(file), &noise).expect("write noise");
    }
}

struct Drained {
    metrics: String,
    attempts: u32,
    stored_bytes: u64,
    /// The path's manifest as JSON (read as a value: what it records, whatever the version).
    manifest: serde_json::Value,
}

/// The one manifest under the `file://` store at `dir`.
fn the_manifest(dir: &Path) -> serde_json::Value {
    fn walk(dir: &Path, found: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, found);
            } else if path.to_string_lossy().ends_with(".manifest.json") {
                found.push(path);
            }
        }
    }
    let mut found = Vec::new();
    walk(dir, &mut found);
    assert_eq!(found.len(), 1, "{found:?}");
    serde_json::from_slice(&std::fs::read(&found[0]).expect("read the manifest"))
        .expect("the manifest is JSON")
}

/// Drains the compressible tree with an operator started with `flags`, checks that `files get`
/// returns it identical, and returns the operator's metrics and the path's status.
async fn drain_with(tag: &str, flags: &[&str]) -> Drained {
    drain_tree_with(tag, flags, compressible_tree).await
}

/// [`drain_with`] of the tree `tree` writes.
async fn drain_tree_with(tag: &str, flags: &[&str], tree: fn(&Path)) -> Drained {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, tag).await;
    let (store_dir, store_url) = file_store(tag);
    let _remove_store = RemoveOnDrop(store_dir.clone());
    let port = free_port();
    let metrics_addr = format!("127.0.0.1:{port}");
    let mut all_flags = vec!["--metrics-addr", metrics_addr.as_str()];
    all_flags.extend_from_slice(flags);
    let op = Operator::builder(&ns.name, &store_url)
        .flags(&all_flags)
        .start();
    let src = host_dir(tag);
    let _remove_src = RemoveOnDrop(src.clone());
    tree(&src);
    let want = snapshot(&src);

    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    create(&runs, "wire", spec(&[&src]).drain_timeout("2m")).await;
    run_then_finish(&runs, &pods, "wire", &op).await;
    let run = wait_final(&runs, "wire", &op, Duration::from_secs(150)).await;
    let e = read_back(&run, 0);
    assert_eq!(e.phase, ReadBackPhase::Drained, "{e:?}\n{}", op.log_text());
    assert_eq!(
        run.status.as_ref().and_then(|s| s.phase),
        Some(Phase::Succeeded)
    );

    let got = files_get(&ns.name, "wire", &store_url, &[], &[]).expect("files get");
    let _remove_got = RemoveOnDrop(got.clone());
    // `files get` writes each declared path under its slug (`00-<path>`).
    let slugs: Vec<PathBuf> = std::fs::read_dir(&got)
        .expect("read the files get output")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    assert_eq!(slugs.len(), 1, "{slugs:?}");
    assert_eq!(snapshot(&slugs[0]), want, "the tree comes back identical");
    Drained {
        metrics: metrics_text(port).await,
        attempts: e.attempts,
        stored_bytes: e.bytes,
        manifest: the_manifest(&store_dir),
    }
}

/// `wire.<field>` of the manifest, as a number (absent: 0).
fn recorded(d: &Drained, field: &str) -> u64 {
    d.manifest["wire"][field].as_u64().unwrap_or(0)
}

#[tokio::test]
async fn by_default_each_block_crosses_the_wire_compressed_or_stored_and_the_manifest_says_which() {
    let d = drain_with("wire-adaptive", &[]).await;
    assert_eq!(d.manifest["wire"]["encoding"], "adaptive", "{}", d.manifest);
    let adaptive = metric(
        &d.metrics,
        "sandboxrun_drain_wire_bytes_total{wire=\"adaptive\"}",
    );
    assert_eq!(recorded(&d, "bytes"), adaptive, "{}", d.manifest);
    // 6 MiB of log lines compress many times over; the 1 MiB of noise does not.
    assert!(
        adaptive * 3 < d.stored_bytes,
        "wire {adaptive} bytes for {} member bytes",
        d.stored_bytes
    );
    assert!(recorded(&d, "compressedBlocks") >= 8, "{}", d.manifest);
    assert!(recorded(&d, "storedBlocks") >= 1, "{}", d.manifest);
    assert_eq!(d.attempts, 1);
}

#[tokio::test]
async fn random_bytes_cross_the_wire_stored_and_the_manifest_records_it() {
    let d = drain_tree_with("wire-random", &[], random_tree).await;
    assert_eq!(d.manifest["wire"]["encoding"], "adaptive", "{}", d.manifest);
    // 8 MiB in blocks of 512 KiB: all of them sent as they are (the tar's last block, its
    // end-of-archive zeros after a few bytes of noise, may shrink).
    assert!(recorded(&d, "storedBlocks") >= 16, "{}", d.manifest);
    assert!(recorded(&d, "compressedBlocks") <= 1, "{}", d.manifest);
    let input = d.manifest["totals"]["inputBytes"].as_u64().unwrap_or(0);
    let wire = recorded(&d, "bytes");
    assert!(
        wire <= input + 1024 && wire + 64 * 1024 >= input,
        "wire {wire} bytes for a {input}-byte tar"
    );
}

#[tokio::test]
async fn a_packer_that_predates_the_adaptive_wire_gets_zstd_on_the_next_attempt() {
    let bin = host_dir("wire-zstd-only-bin");
    let pack = format!("{} ", packer_without_adaptive(&bin).display());
    let d = drain_with("wire-zstd-only", &["--pack-command", &pack]).await;
    assert_eq!(d.manifest["wire"]["encoding"], "zstd", "{}", d.manifest);
    let zstd = metric(
        &d.metrics,
        "sandboxrun_drain_wire_bytes_total{wire=\"zstd\"}",
    );
    assert!(zstd > 0 && zstd * 3 < d.stored_bytes, "{}", d.metrics);
    // The refused attempt, then the zstd one.
    assert_eq!(d.attempts, 2);
}

#[tokio::test]
async fn a_packer_that_predates_the_wire_flag_gets_a_plain_tar_after_adaptive_and_zstd() {
    let bin = host_dir("wire-older-bin");
    let pack = format!("{} ", packer_without_wire(&bin).display());
    let d = drain_with("wire-older", &["--pack-command", &pack]).await;
    assert_eq!(d.manifest["wire"]["encoding"], "tar", "{}", d.manifest);
    assert!(recorded(&d, "bytes") > d.stored_bytes, "{}", d.manifest);
    assert_eq!(d.attempts, 3);
}

#[tokio::test]
async fn with_drain_wire_zstd_the_tar_crosses_the_wire_zstd_compressed_and_lands_identical() {
    let d = drain_with("wire-zstd", &["--drain-wire", "zstd"]).await;
    let zstd = metric(
        &d.metrics,
        "sandboxrun_drain_wire_bytes_total{wire=\"zstd\"}",
    );
    let tar = metric(
        &d.metrics,
        "sandboxrun_drain_wire_bytes_total{wire=\"tar\"}",
    );
    assert!(zstd > 0, "{}", d.metrics);
    assert_eq!(tar, 0, "{}", d.metrics);
    // 6 MiB of log lines compress many times over; the 1 MiB of noise does not.
    assert!(
        zstd * 3 < d.stored_bytes,
        "wire {zstd} bytes for {} member bytes",
        d.stored_bytes
    );
    assert_eq!(d.attempts, 1);
}

#[tokio::test]
async fn with_drain_wire_tar_the_stream_is_the_plain_tar() {
    let d = drain_with("wire-tar", &["--drain-wire", "tar"]).await;
    let zstd = metric(
        &d.metrics,
        "sandboxrun_drain_wire_bytes_total{wire=\"zstd\"}",
    );
    let tar = metric(
        &d.metrics,
        "sandboxrun_drain_wire_bytes_total{wire=\"tar\"}",
    );
    assert_eq!(zstd, 0, "{}", d.metrics);
    // The tar: every member's bytes plus headers and padding.
    assert!(tar > d.stored_bytes, "{}", d.metrics);
}

#[tokio::test]
async fn a_packer_that_predates_the_wire_flag_gets_a_plain_tar_on_the_next_attempt() {
    let bin = host_dir("wire-old-bin");
    let pack = format!("{} ", packer_without_wire(&bin).display());
    let d = drain_with(
        "wire-old",
        &["--pack-command", &pack, "--drain-wire", "zstd"],
    )
    .await;
    let tar = metric(
        &d.metrics,
        "sandboxrun_drain_wire_bytes_total{wire=\"tar\"}",
    );
    assert!(tar > d.stored_bytes, "{}", d.metrics);
    // The refused attempt, then the plain one.
    assert_eq!(d.attempts, 2);
}
