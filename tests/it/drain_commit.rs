//! Commit safety of the drain on the real S3 server (docs/contract.md, "What the store holds
//! across attempts"): a cancelled attempt leaves no open multipart upload; a committed archive is
//! never overwritten; and drains that hang never starve the controller.
//!
//! Each test runs its own operator binary and its own s3s-fs against its own namespace. kwok plays
//! the node: its exec runs the packer as a local process, so a declared "container path" is a host
//! directory, and the packer is a script of the test's.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::TryStreamExt;
use object_store::ObjectStore;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use sandboxrun_operator::api::{Compression, Phase, ReadBackPhase, SandboxRun};
use sandboxrun_operator::identity::RunId;
use sandboxrun_operator::store::{list_manifests, object_keys, store_from_url};
use serde_json::json;

use crate::support::s3_server::PrivateS3;
use crate::support::*;

const MIB: u64 = 1024 * 1024;

/// The packer the tests' operators exec: the declared directory says what to do (its `.mode`
/// file); without one it is the real packer.
///
/// - `hang`: sends `.stream` (the start of a tar) and then stalls, as a packer stuck on a file.
/// - `stuck`: sends nothing for 100 s, as a packer blocked in the pod.
/// - `nonce`: writes a fresh `nonce.txt` into the path, then packs it: every attempt's archive
///   differs, as a live workload's would, so an archive rewritten by a later attempt no longer
///   matches the manifest that committed the first.
/// - `slowfirst`: the first exec (it creates `.first`) waits 45 s before it writes its nonce and
///   packs; later ones are `nonce`.
fn scripted_packer(bin_dir: &Path) -> PathBuf {
    let script = bin_dir.join("commit-pack.sh");
    let real = env!("CARGO_BIN_EXE_sandboxrun-operator");
    let text = format!(
        r#"#!/bin/sh
# Scripted packer of tests/it/drain_commit.rs. $1 is the declared path.
d="$1"
mode=real
[ -f "$d/.mode" ] && mode=$(cat "$d/.mode")
case "$mode" in
  hang) cat "$d/.stream"; sleep 40; exit 0 ;;
  stuck) sleep 100; exit 0 ;;
  nonce) echo "$$ $(date +%s%N)" > "$d/nonce.txt"; exec "{real}" pack "$@" ;;
  slowfirst)
    if mkdir "$d/.first" 2>/dev/null; then sleep 45; fi
    echo "$$ $(date +%s%N)" > "$d/nonce.txt"; exec "{real}" pack "$@" ;;
  *) exec "{real}" pack "$@" ;;
esac
"#
    );
    std::fs::write(&script, text).expect("write the packer");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    script
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
    let op = Operator::builder(&ns.name, &s3.url())
        .store_options(&s3.options())
        .flags(&["--pack-command", &pack])
        .start();

    // 12 MiB of a 64 MiB member, then the packer stalls: the archive is past its first 5 MiB
    // part, so it is a multipart upload with parts in the bucket when the drain timeout fires.
    let out = host_dir("orphan");
    std::fs::write(out.join(".mode"), "hang").expect("mode");
    std::fs::write(out.join(".stream"), truncated_tar(64 * MIB, 12 * MIB)).expect("stream");
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let created = create(
        &runs,
        "stalls",
        spec(&[&out]).size_limit("1Gi").drain_timeout("12s"),
    )
    .await;
    let run = wait_phase(&runs, "stalls", Phase::Running, &op).await;
    finish_workload(&pods, &pod_of(&run), 0).await;

    let run_ref = RunId {
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

// ---------------------------------------------------------------------------------------------
// A committed archive is never overwritten (issue #10 item 3)
// ---------------------------------------------------------------------------------------------

/// A loopback TCP proxy in front of the S3 server that, once armed, lets the first manifest PUT
/// through to the server and then drops the connection before the server's response reaches the
/// operator — and then plays a dead store for `dead_for` (every connection dropped), longer than
/// the store client's own retries: the store committed, the operator only saw errors.
struct ManifestPutCutter {
    port: u16,
    tripped: Arc<AtomicBool>,
}

/// When the proxy's store comes back to life (None: alive, not yet tripped).
type DeadUntil = Arc<std::sync::Mutex<Option<std::time::Instant>>>;

fn is_dead(dead: &DeadUntil) -> bool {
    dead.lock()
        .expect("lock")
        .is_some_and(|until| std::time::Instant::now() < until)
}

impl ManifestPutCutter {
    async fn start(upstream: u16, dead_for: Duration) -> ManifestPutCutter {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().expect("addr").port();
        let tripped = Arc::new(AtomicBool::new(false));
        let dead: DeadUntil = Arc::default();
        let trip = Arc::clone(&tripped);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if is_dead(&dead) {
                    drop(client);
                    continue;
                }
                let trip = Arc::clone(&trip);
                let dead = Arc::clone(&dead);
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await {
                        Self::relay(client, server, trip, dead, dead_for).await;
                    }
                });
            }
        });
        ManifestPutCutter { port, tripped }
    }

    /// Relays one connection. HTTP/1.1 without pipelining: once the client has sent a request,
    /// every byte the server sends next belongs to that request's response.
    async fn relay(
        client: TcpStream,
        server: TcpStream,
        trip: Arc<AtomicBool>,
        dead: DeadUntil,
        dead_for: Duration,
    ) {
        let (mut client_rx, mut client_tx) = client.into_split();
        let (mut server_rx, mut server_tx) = server.into_split();
        let cut = Arc::new(AtomicBool::new(false));
        let cut_up = Arc::clone(&cut);
        let dead_up = Arc::clone(&dead);
        let up = tokio::spawn(async move {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = match client_rx.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                if is_dead(&dead_up) {
                    return;
                }
                let text = String::from_utf8_lossy(&buf[..n]);
                let manifest_put = text.lines().any(|l| {
                    l.starts_with("PUT ") && l.contains(".manifest.json") && l.ends_with("HTTP/1.1")
                });
                if manifest_put && !trip.swap(true, Ordering::SeqCst) {
                    cut_up.store(true, Ordering::SeqCst);
                }
                if server_tx.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        });
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match server_rx.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if cut.load(Ordering::SeqCst) {
                // The server answered the manifest PUT: it committed. The operator never hears
                // it, and the store is dead for a while.
                *dead.lock().expect("lock") = Some(std::time::Instant::now() + dead_for);
                break;
            }
            if is_dead(&dead) || client_tx.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        up.abort();
    }
}

async fn store_keys(store: &Arc<dyn ObjectStore>) -> Vec<String> {
    let metas: Vec<_> = store.list(None).try_collect().await.expect("list");
    let mut keys: Vec<String> = metas.into_iter().map(|m| m.location.to_string()).collect();
    keys.sort();
    keys
}

/// The store holds exactly one archive and its manifest for the run, the archive matches the
/// manifest (`files get` verifies every member's sha256), and the path is Drained.
async fn assert_one_verified_commit(
    s3: &PrivateS3,
    ns: &str,
    name: &str,
    run: &SandboxRun,
    op: &Operator,
) {
    let entry = &run.status.as_ref().expect("status").read_back[0];
    assert_eq!(
        entry.phase,
        ReadBackPhase::Drained,
        "{entry:?}\n{}",
        op.log_text()
    );
    let (store, prefix) = store_from_url(&s3.url(), &s3.options()).expect("store");
    let manifests = list_manifests(&store, &prefix, ns, name)
        .await
        .expect("manifests");
    assert_eq!(manifests.len(), 1, "one commit");
    let keys = store_keys(&store).await;
    assert_eq!(keys.len(), 2, "one archive and its manifest: {keys:?}");
    assert!(
        keys.contains(&manifests[0].1.archive_key),
        "{keys:?} lacks {}",
        manifests[0].1.archive_key
    );
    let dest = files_get(ns, name, &s3.url(), &s3.options(), &[]).unwrap_or_else(|e| {
        panic!(
            "files get must succeed (the archive matches its manifest): {e}\n{}",
            op.log_text()
        )
    });
    let extracted = walkdir::WalkDir::new(&dest)
        .into_iter()
        .filter_map(Result::ok)
        .any(|e| e.file_name() == "nonce.txt" && e.file_type().is_file());
    assert!(extracted, "files get wrote the path's files");
    let _ = std::fs::remove_dir_all(&dest);
}

#[tokio::test]
async fn a_manifest_put_whose_response_is_lost_is_recognized_not_redone() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, "lostput").await;
    let s3 = PrivateS3::new("lostput");
    // Dead for longer than the store client retries a request (8 retries, backoff up to 15 s).
    let proxy = ManifestPutCutter::start(s3.port, Duration::from_secs(60)).await;
    let bin = host_dir("lostput-bin");
    let pack = format!("{} ", scripted_packer(&bin).display());
    let op = Operator::builder(&ns.name, &s3.url())
        .store_options(&s3.options_via(&format!("http://127.0.0.1:{}", proxy.port)))
        .flags(&["--pack-command", &pack])
        .start();

    let out = host_dir("lostput");
    std::fs::write(out.join(".mode"), "nonce").expect("mode");
    std::fs::write(out.join("result.json"), b"{\"ok\":true}\n").expect("result");
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    create(
        &runs,
        "lostput",
        spec(&[&out]).size_limit("64Mi").drain_timeout("4m"),
    )
    .await;
    let run = wait_phase(&runs, "lostput", Phase::Running, &op).await;
    finish_workload(&pods, &pod_of(&run), 0).await;
    let run = wait_final(&runs, "lostput", &op, Duration::from_secs(240)).await;
    assert!(
        proxy.tripped.load(Ordering::SeqCst),
        "the proxy cut a manifest PUT's response (else this test proves nothing)"
    );
    assert_eq!(
        run.status.as_ref().and_then(|s| s.phase),
        Some(Phase::Succeeded),
        "{:?}",
        run.status
    );
    assert_one_verified_commit(&s3, &ns.name, "lostput", &run, &op).await;
}

#[tokio::test]
async fn a_leader_that_loses_its_lease_mid_drain_stops_and_the_next_one_commits_once() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, "handover").await;
    let s3 = PrivateS3::new("handover");
    let bin = host_dir("handover-bin");
    let pack = format!("{} ", scripted_packer(&bin).display());
    let lease = format!("lease-{}", ns.name);
    let start = |identity: &str| {
        Operator::builder(&ns.name, &s3.url())
            .store_options(&s3.options())
            .flags(&[
                "--pack-command",
                &pack,
                "--leader-elect",
                "--lease-name",
                &lease,
                "--pod-namespace",
                &ns.name,
                "--pod-name",
                identity,
            ])
            .start()
    };
    let mut first = start("first");
    eventually_or_log(
        "the first replica to lead",
        Duration::from_secs(60),
        &first,
        || {
            let led = first
                .log_text()
                .contains("leading: starting the controller");
            async move { led.then_some(()) }
        },
    )
    .await;
    let second = start("second");

    let out = host_dir("handover");
    std::fs::write(out.join(".mode"), "slowfirst").expect("mode");
    std::fs::write(out.join("result.json"), b"{\"ok\":true}\n").expect("result");
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    create(
        &runs,
        "handover",
        spec(&[&out]).size_limit("64Mi").drain_timeout("4m"),
    )
    .await;
    let run = wait_phase(&runs, "handover", Phase::Running, &first).await;
    finish_workload(&pods, &pod_of(&run), 0).await;
    // The first leader's packer is running (and holds its stream back): freeze the leader, so
    // its lease runs out while its drain is in flight.
    let marker = out.join(".first");
    eventually_or_log(
        "the first leader's packer to start",
        Duration::from_secs(60),
        &first,
        || {
            let started = marker.is_dir();
            async move { started.then_some(()) }
        },
    )
    .await;
    let signal = |sig: &str, pid: u32| {
        let status = Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .expect("kill");
        assert!(status.success(), "kill {sig} {pid}");
    };
    signal("-STOP", first.pid());
    let run = wait_final(&runs, "handover", &second, Duration::from_secs(120)).await;
    assert!(
        second
            .log_text()
            .contains("leading: starting the controller"),
        "the second replica took over"
    );
    // The old leader wakes up with its drain still in flight and its lease gone. It must stop
    // that drain (record nothing, upload nothing) and exit.
    signal("-CONT", first.pid());
    let give_up = std::time::Instant::now() + Duration::from_secs(90);
    while first.is_alive() {
        assert!(
            std::time::Instant::now() < give_up,
            "the replica that lost its lease did not exit:\n{}",
            first.log_text()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(
        first.log_text().contains("leadership lost"),
        "{}",
        first.log_text()
    );
    // Its packer has by now written a new nonce and packed the path: had the old leader kept
    // draining, it would have rewritten the committed archive.
    let run_after = runs.get("handover").await.expect("run");
    assert_eq!(
        run_after.status.as_ref().map(|s| &s.read_back),
        run.status.as_ref().map(|s| &s.read_back),
        "the old leader recorded nothing"
    );
    assert_one_verified_commit(&s3, &ns.name, "handover", &run_after, &second).await;
}

// ---------------------------------------------------------------------------------------------
// Drains cannot starve the controller (issue #10 item 6)
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn sixteen_stuck_drains_never_keep_a_new_run_from_running() {
    const STUCK: usize = 16;
    const MAX_DRAINS: usize = 8;
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, "starve").await;
    let store_dir = host_dir("store-starve");
    let store_url = format!("file://{}", store_dir.display());
    let bin = host_dir("starve-bin");
    let pack = format!("{} ", scripted_packer(&bin).display());
    // --concurrency stays at its default (16): as many reconcile workers as stuck drains.
    let op = Operator::builder(&ns.name, &store_url)
        .flags(&[
            "--pack-command",
            &pack,
            "--max-concurrent-drains",
            &MAX_DRAINS.to_string(),
        ])
        .start();
    let out = host_dir("starve");
    std::fs::write(out.join(".mode"), "stuck").expect("mode");
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let long_lived = |path: &Path| {
        spec(&[path])
            .size_limit("1Mi")
            .drain_timeout("3m")
            .command(None)
    };
    for i in 0..STUCK {
        create(&runs, &format!("stuck-{i:02}"), long_lived(&out)).await;
    }
    for i in 0..STUCK {
        wait_phase(&runs, &format!("stuck-{i:02}"), Phase::Running, &op).await;
    }
    for i in 0..STUCK {
        runs.patch(
            &format!("stuck-{i:02}"),
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"stop": true}})),
        )
        .await
        .expect("stop");
    }
    // The drains are under way: at least MAX_DRAINS runs are draining, their packers stuck.
    let draining = |list: &[SandboxRun]| {
        list.iter()
            .filter(|r| r.status.as_ref().and_then(|s| s.phase) == Some(Phase::Draining))
            .count()
    };
    eventually_or_log(
        "the drain pool to fill with stuck drains",
        Duration::from_secs(90),
        &op,
        || {
            let runs = runs.clone();
            async move {
                let list = runs.list(&Default::default()).await.ok()?.items;
                (draining(&list) >= MAX_DRAINS).then_some(())
            }
        },
    )
    .await;

    // A new run still gets its pod and reaches Running while every drain hangs (they hang for
    // 100 s, their drainTimeout is 3 min: a controller they starve could not do this before).
    let fresh = host_dir("starve-fresh");
    create(&runs, "fresh", long_lived(&fresh)).await;
    eventually_or_log(
        "the new run to reach Running while 16 drains hang",
        Duration::from_secs(45),
        &op,
        || {
            let runs = runs.clone();
            async move {
                let r = runs.get("fresh").await.ok()?;
                (r.status.as_ref()?.phase == Some(Phase::Running)).then_some(())
            }
        },
    )
    .await;
    let list = runs.list(&Default::default()).await.expect("list").items;
    assert_eq!(
        draining(&list),
        MAX_DRAINS,
        "never more drains than --max-concurrent-drains, the stuck ones still in flight"
    );
    let _ = std::fs::remove_dir_all(&store_dir);
}
