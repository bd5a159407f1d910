//! The operator binary as users run it: reading results back with `files`, the metrics endpoint,
//! the deadline, the skip-drain annotation, and two replicas with leader election.

use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::Api;
use sandboxrun_operator::api::{Phase, ReadBackPhase, SandboxRun, SKIP_DRAIN_ANNOTATION};
use serde_json::json;

use crate::support::*;

const BIN: &str = env!("CARGO_BIN_EXE_sandboxrun-operator");

/// These tests wait longer than most for a phase: some start two operators.
const PROC_TIMEOUT: Duration = Duration::from_secs(120);

/// The operator as a user starts it: its own metrics port, its pod name (`identity`, also its
/// leader-election identity) and namespace.
fn operator(ns: &str, store_url: &str, metrics_port: u16, identity: &str) -> OperatorBuilder {
    Operator::builder(ns, store_url).flags(&[
        "--metrics-addr",
        &format!("127.0.0.1:{metrics_port}"),
        "--pod-name",
        identity,
        "--pod-namespace",
        ns,
    ])
}

#[tokio::test]
async fn files_ls_and_get_read_a_drained_run_back_and_catch_tampering() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, "files").await;
    let store_dir = host_dir("store-files");
    let store_url = format!("file://{}", store_dir.display());
    let metrics_port = free_port();
    let op = operator(&ns.name, &store_url, metrics_port, "files-op").start();
    let out = host_dir("out");
    std::fs::create_dir_all(out.join("sub")).unwrap();
    std::fs::write(out.join("a.txt"), b"alpha\n").unwrap();
    std::fs::write(out.join("sub/b.bin"), vec![42u8; 10_000]).unwrap();
    std::os::unix::fs::symlink("a.txt", out.join("link-to-a")).unwrap();
    // A FIFO cannot be archived: the packer skips it and says so, and the manifest keeps the note.
    let fifo = Command::new("mkfifo")
        .arg(out.join("pipe"))
        .status()
        .unwrap();
    assert!(fifo.success());
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    create(
        &runs,
        "files",
        spec(&[&out]).image(TAGGED_IMAGE).user("1000").sh("make"),
    )
    .await;
    let run = wait_phase_within(&runs, "files", Phase::Running, &op, PROC_TIMEOUT).await;
    finish_workload(&Api::namespaced(client.clone(), &ns.name), &pod_of(&run), 0).await;
    wait_phase_within(&runs, "files", Phase::Succeeded, &op, PROC_TIMEOUT).await;

    // files ls: every member with size and hash.
    let ls = Command::new(BIN)
        .args([
            "files",
            "ls",
            "files",
            "-n",
            &ns.name,
            "--store-url",
            &store_url,
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&ls.stdout).to_string();
    assert!(
        ls.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&ls.stderr)
    );
    for needle in [
        "a.txt",
        "sub/b.bin",
        "link-to-a -> a.txt",
        "[Drained]",
        "NOTE     pack: skipped",
        "pipe",
    ] {
        assert!(text.contains(needle), "`files ls` lacks {needle}:\n{text}");
    }

    // files get: extracted and verified.
    let dest = files_get(&ns.name, "files", &store_url, &[], &[]).unwrap_or_else(|e| panic!("{e}"));
    let sub = std::fs::read_dir(&dest)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    assert_eq!(std::fs::read(sub.join("a.txt")).unwrap(), b"alpha\n");
    assert_eq!(
        std::fs::read(sub.join("sub/b.bin")).unwrap(),
        vec![42u8; 10_000]
    );
    assert_eq!(
        std::fs::read_link(sub.join("link-to-a")).unwrap(),
        std::path::Path::new("a.txt")
    );

    // The metrics endpoint counted the drain.
    let metrics = reqwest::get(format!("http://127.0.0.1:{metrics_port}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("sandboxrun_drains_total{phase=\"Drained\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("sandboxrun_reconciles_total"), "{metrics}");

    // A stored archive is untrusted too: flip a byte of a.txt's content and `get` refuses.
    let archive = walk(&store_dir)
        .into_iter()
        .find(|p| p.to_string_lossy().ends_with(".tar"))
        .expect("archive");
    let mut bytes = std::fs::read(&archive).unwrap();
    let at = bytes
        .windows(6)
        .position(|w| w == b"alpha\n")
        .expect("content in archive");
    bytes[at] = b'A';
    std::fs::write(&archive, bytes).unwrap();
    let dest2 = host_dir("dest2");
    let get = Command::new(BIN)
        .args([
            "files",
            "get",
            "files",
            "-n",
            &ns.name,
            "--store-url",
            &store_url,
            "-o",
        ])
        .arg(&dest2)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&get.stderr).to_string();
    assert_eq!(get.status.code(), Some(1), "{err}");
    assert!(err.contains("sha256"), "{err}");

    // Unknown run: a clear error, not an empty listing.
    let none = Command::new(BIN)
        .args([
            "files",
            "ls",
            "nope",
            "-n",
            &ns.name,
            "--store-url",
            &store_url,
        ])
        .output()
        .unwrap();
    assert_eq!(none.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&none.stderr).contains("nothing is stored"));
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[tokio::test]
async fn the_deadline_tears_down_and_skip_drain_releases_at_once() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, "deadline").await;
    let store_url = format!("file://{}", host_dir("store-deadline").display());
    let op = operator(&ns.name, &store_url, free_port(), "deadline-op").start();
    let out = host_dir("out");
    std::fs::write(out.join("partial.txt"), b"half done\n").unwrap();
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let mut s = spec(&[&out])
        .image(TAGGED_IMAGE)
        .user("1000")
        .command(None)
        .build();
    s.active_deadline_seconds = Some(3);
    create(&runs, "deadline", s).await;
    let run = wait_phase_within(&runs, "deadline", Phase::Stopped, &op, PROC_TIMEOUT).await;
    let status = run.status.unwrap();
    assert_eq!(
        status.read_back[0].phase,
        ReadBackPhase::Drained,
        "the deadline drains, it does not kill"
    );
    assert!(status.message.unwrap_or_default().contains("stopped"));

    // skip-drain: deletion releases the finalizer at once, with an Event saying what was not drained.
    create(
        &runs,
        "skipped",
        spec(&[&out]).image(TAGGED_IMAGE).user("1000").command(None),
    )
    .await;
    wait_phase_within(&runs, "skipped", Phase::Running, &op, PROC_TIMEOUT).await;
    let patch = json!({"metadata": {"annotations": {SKIP_DRAIN_ANNOTATION: "true"}}});
    runs.patch("skipped", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    runs.delete("skipped", &DeleteParams::default())
        .await
        .unwrap();
    wait_gone(&runs, "skipped", &op, Duration::from_secs(30)).await;
    let ev = wait_event(
        &client,
        &ns.name,
        None,
        "DrainSkipped",
        Duration::from_secs(20),
        &op,
    )
    .await;
    assert!(ev.note.unwrap_or_default().contains("NOT drained"));
}

#[tokio::test]
async fn with_two_replicas_the_standby_finishes_the_run_when_the_leader_dies() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, "ha").await;
    let store_url = format!("file://{}", host_dir("store-ha").display());
    let lease = format!("sbr-ha-{:08x}", rand_u32());
    let replica = |id: &str| {
        operator(&ns.name, &store_url, free_port(), id)
            .flags(&["--leader-elect", "--lease-name", &lease])
            .start()
    };
    let mut a = replica("replica-a");
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns.name);
    let holder = eventually("replica-a holds the lease", Duration::from_secs(60), || {
        let leases = leases.clone();
        let lease = lease.clone();
        async move { leases.get_opt(&lease).await.ok()??.spec?.holder_identity }
    })
    .await;
    assert_eq!(holder, "replica-a");
    let mut b = replica("replica-b");

    let out = host_dir("out");
    std::fs::write(out.join("result.txt"), b"42\n").unwrap();
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    create(&runs, "ha", spec(&[&out]).image(TAGGED_IMAGE).user("1000")).await;
    let run = wait_phase_within(&runs, "ha", Phase::Running, &a, PROC_TIMEOUT).await;
    assert!(
        !b.log_text().contains("leading: starting the controller"),
        "the standby must not reconcile"
    );

    // The leader dies mid-run; the standby takes the lease and finishes the run.
    a.kill();
    finish_workload(&Api::namespaced(client.clone(), &ns.name), &pod_of(&run), 0).await;
    let done = wait_phase_within(&runs, "ha", Phase::Succeeded, &b, PROC_TIMEOUT).await;
    assert_eq!(
        done.status.unwrap().read_back[0].phase,
        ReadBackPhase::Drained
    );
    let holder = leases
        .get(&lease)
        .await
        .unwrap()
        .spec
        .unwrap()
        .holder_identity;
    assert_eq!(holder.as_deref(), Some("replica-b"));
    b.kill();
}

/// Issue #55: a pool pod's parked launcher is its container's PID 1, which ignores a signal it
/// has no handler for, so a pool pod deleted with a grace period (its pool's garbage
/// collection, its namespace's deletion) waited the whole period out. Parked (its marker taken,
/// reading its stdin, which stays open), it now exits 143 on SIGTERM. On the old code the
/// signal's default action killed it here (no exit code): not PID 1 in this test, it could not
/// show the pod's wait, only that nothing handled the signal.
#[test]
fn a_parked_launcher_exits_143_when_told_to_stop() {
    let control = tempfile::tempdir().expect("a control dir");
    let (mut launcher, parked) = parked_launcher(control.path());
    assert!(parked, "the launcher took its marker and waits");
    let told = Command::new("kill")
        .args(["-TERM", &launcher.id().to_string()])
        .status()
        .expect("kill -TERM");
    assert!(told.success());
    let ended = (0..200).find_map(|_| {
        std::thread::sleep(Duration::from_millis(50));
        launcher.try_wait().expect("wait for the launcher")
    });
    let status = ended.unwrap_or_else(|| {
        let _ = launcher.kill();
        panic!("the launcher did not end within 10 s of SIGTERM")
    });
    assert_eq!(status.code(), Some(143), "{status:?}");
}

/// `THP_enabled` of the process `pid` (its `/proc/<pid>/status` line; 1 or 0), or None on a
/// kernel older than 5.0, which does not print it.
fn thp_enabled(status: &str) -> Option<u8> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("THP_enabled:"))
        .and_then(|v| v.trim().parse().ok())
}

/// docs/contract.md "The operator's processes keep to small pages": the allocator asks for
/// transparent huge pages, which doubled the operator's peak RSS under a flood, so every
/// subcommand turns them off for its own process (`PR_SET_THP_DISABLE`) — but the launcher,
/// whose flag the workload it `exec`s would inherit. Here the holder (a long-running
/// subcommand) has them off, and the command a parked launcher starts keeps what its parent
/// (this test) has. Fails on a binary that disables them in every subcommand (the workload's
/// `cat` reads 0) or in none (the holder reads 1).
#[test]
fn the_operators_processes_keep_to_small_pages_and_a_launched_workload_is_left_alone() {
    use std::io::Write;
    use std::process::Stdio;
    let own = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    let Some(parent) = thp_enabled(&own) else {
        eprintln!("this kernel prints no THP_enabled: nothing to compare");
        return;
    };

    let state = tempfile::tempdir().expect("a state dir");
    let mut holder = Command::new(BIN)
        .args(["holder", "--state-dir"])
        .arg(state.path())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the holder");
    let status_file = format!("/proc/{}/status", holder.id());
    // The flag is set before the runtime starts; give the process a moment to get there.
    let holders = (0..100).find_map(|_| {
        std::thread::sleep(Duration::from_millis(50));
        let s = std::fs::read_to_string(&status_file).ok()?;
        thp_enabled(&s).filter(|v| *v == 0)
    });
    let _ = holder.kill();
    let _ = holder.wait();
    assert_eq!(holders, Some(0), "the holder runs on small pages");

    let control = tempfile::tempdir().expect("a control dir");
    let mut launcher = Command::new(BIN)
        .args(["launch", "--control-dir"])
        .arg(control.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the launcher");
    let start = json!({"run": "thp", "argv": ["/bin/cat", "/proc/self/status"]});
    let mut stdin = launcher.stdin.take().expect("the launcher's stdin");
    writeln!(stdin, "{start}").expect("hand the launcher its start");
    drop(stdin);
    let out = launcher.wait_with_output().expect("the workload's output");
    let workload = thp_enabled(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(
        workload,
        Some(parent),
        "the workload keeps its parent's setting: {:?}",
        out.status
    );
}

/// docs/contract.md "The operator's processes keep to small pages": a parked launcher holds
/// a warm pool pod's workload container until its start, and what it holds is counted against
/// that container. It cannot turn huge pages off for itself (the workload would inherit the
/// flag), so the allocator must not ask for them: no region of a parked launcher is advised
/// `MADV_HUGEPAGE` (smaps `VmFlags` `hg`), and on a node that gives huge pages only when asked
/// it holds none. Fails on a build whose allocator asks for them (mimalloc's default), where
/// the parked launcher held 6.8 MiB of anonymous memory against 0.8 MiB before it.
#[test]
fn a_parked_launcher_asks_for_no_huge_pages() {
    let control = tempfile::tempdir().expect("a control dir");
    let (mut launcher, parked) = parked_launcher(control.path());
    let smaps = std::fs::read_to_string(format!("/proc/{}/smaps", launcher.id()));
    let rollup = std::fs::read_to_string(format!("/proc/{}/smaps_rollup", launcher.id()));
    let _ = launcher.kill();
    let _ = launcher.wait();
    assert!(parked, "the launcher parks on its stdin");
    let smaps = smaps.expect("the parked launcher's smaps");
    let advised: Vec<&str> = smaps
        .lines()
        .filter(|l| l.starts_with("VmFlags:") && l.split_whitespace().any(|f| f == "hg"))
        .collect();
    assert!(
        advised.is_empty(),
        "regions advised for huge pages: {advised:?}"
    );
    let system =
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    if !system.contains("[always]") {
        let huge = rollup
            .expect("the parked launcher's smaps_rollup")
            .lines()
            .find_map(|l| l.strip_prefix("AnonHugePages:"))
            .map(|v| v.trim().to_string());
        assert_eq!(
            huge.as_deref(),
            Some("0 kB"),
            "huge pages held while parked"
        );
    }
}

/// A launcher started on `control` (`launch --control-dir`, its stdin held open), and whether it
/// parked within 10 s: it took the pod's one start (its `started` marker) and waits on its stdin.
fn parked_launcher(control: &std::path::Path) -> (std::process::Child, bool) {
    use std::process::Stdio;
    let launcher = Command::new(BIN)
        .args(["launch", "--control-dir"])
        .arg(control)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the launcher");
    let marker = control.join("started");
    let parked = (0..200).any(|_| {
        std::thread::sleep(Duration::from_millis(50));
        marker.exists()
    });
    (launcher, parked)
}
