//! Issue #52 item 2: faults of the clusters users run, on the real node, each with "nothing lost,
//! nothing stuck, status honest". They stop the node's kubelet, which every other real-node test
//! needs, so `make test` skips them (`--skip real_node::chaos::`) and `make chaos`
//! (`hack/chaos.sh`) runs them one at a time, alone on the bed.

use super::*;

/// `hack/real-node.sh <verb>` (kubelet-stop, kubelet-start), as the bed's root.
fn node(verb: &str) {
    let out = Command::new(repo().join("hack/real-node.sh"))
        .arg(verb)
        .output()
        .expect("run hack/real-node.sh");
    assert!(
        out.status.success(),
        "hack/real-node.sh {verb}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Starts the kubelet again when a test ends, passed or not: the next test needs the node.
struct KubeletBack;

impl Drop for KubeletBack {
    fn drop(&mut self) {
        let _ = Command::new(repo().join("hack/real-node.sh"))
            .arg("kubelet-start")
            .status();
    }
}

/// A workload that writes 64 MiB of random bytes and a small file, then sleeps: its digest is
/// written beside them, so the stored copy can be checked byte for byte.
const BIG_THEN_SLEEP: &str = r#"set -e
o=/work/out
head -c 67108864 /dev/urandom > "$o/big.bin"
sha256sum "$o/big.bin" | cut -d' ' -f1 > "$o/big.sha256"
echo small > "$o/small.txt"
exec sleep 3600
"#;

/// Waits until the workload wrote its files (the digest comes last).
async fn files_written(ns: &str, pod: &str) {
    eventually("the workload's files", Duration::from_secs(180), || {
        let ok = exec_in_workload(ns, pod, "test -s /work/out/big.sha256")
            .status
            .success();
        async move { ok.then_some(()) }
    })
    .await;
}

/// The kubelet restarted while a drain streams: the stream breaks, the drain is retried once
/// the node is back, and every byte is stored; the run ends, its path `Drained`.
#[tokio::test]
async fn a_kubelet_restarted_mid_drain_loses_nothing_and_the_run_ends() {
    let bed = RealBed::new("chaos-kubelet").await;
    let mut spec = real_spec(Some(BIG_THEN_SLEEP), &["/work/out"]);
    if let Some(read_back) = spec.read_back.as_mut() {
        read_back.drain_timeout = Some("5m".into());
    }
    create(&bed.runs, "restart", spec).await;
    let run = wait_run(&bed.runs, "restart", "Running", &bed.op, |r| {
        phase_is(Phase::Running)(r)
    })
    .await;
    let pod = pod_of(&run);
    files_written(&bed.ns.name, &pod).await;

    bed.runs
        .patch(
            "restart",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"stop": true}})),
        )
        .await
        .expect("stop");
    let holder_path = "/sandboxrun-readback/work/out";
    eventually("the packer to start", Duration::from_secs(60), || {
        let running = packer_running(&bed.ns.name, &pod, holder_path).then_some(());
        async move { running }
    })
    .await;
    let _back = KubeletBack;
    node("kubelet-stop");
    tokio::time::sleep(Duration::from_secs(5)).await;
    node("kubelet-start");

    let done = wait_run(&bed.runs, "restart", "a final phase", &bed.op, final_phase).await;
    let status = done.status.clone().expect("status");
    assert_eq!(status.phase, Some(Phase::Stopped), "{status:?}");
    let path = &status.read_back[0];
    assert_eq!(path.phase, ReadBackPhase::Drained, "{path:?}");

    let dest = files_get(&bed.ns.name, "restart", &bed.store_url, &[], &[])
        .unwrap_or_else(|e| panic!("files get failed: {e}"));
    let root = extracted(&dest, 0);
    let big = std::fs::read(root.join("big.bin")).expect("the big file");
    let want = std::fs::read_to_string(root.join("big.sha256")).expect("its digest");
    assert_eq!(big.len(), 64 << 20);
    assert_eq!(
        sha256_hex(&big),
        want.trim(),
        "the stored bytes are the written ones"
    );
    assert_eq!(
        std::fs::read_to_string(root.join("small.txt")).expect("small"),
        "small\n"
    );
}

/// The node lost while its run is stopped (the kubelet down for longer than the drain may take):
/// the drain cannot reach the pod, and the run says so — its path `Failed` with the
/// `sandbox_runfiles_drain_failed` Warning, never `Drained` or `Empty` — and it still ends, so
/// nothing waits on it. Deleting the run is not held by the lost node.
#[tokio::test]
async fn a_node_lost_mid_run_ends_the_run_with_its_files_reported_lost_never_stored() {
    let bed = RealBed::new("chaos-lost").await;
    let mut spec = real_spec(Some(BIG_THEN_SLEEP), &["/work/out"]);
    if let Some(read_back) = spec.read_back.as_mut() {
        read_back.drain_timeout = Some("30s".into());
    }
    create(&bed.runs, "lost", spec).await;
    let run = wait_run(&bed.runs, "lost", "Running", &bed.op, |r| {
        phase_is(Phase::Running)(r)
    })
    .await;
    let pod = pod_of(&run);
    files_written(&bed.ns.name, &pod).await;

    let _back = KubeletBack;
    node("kubelet-stop");
    bed.runs
        .patch(
            "lost",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"stop": true}})),
        )
        .await
        .expect("stop");
    let done = eventually("the run to end", Duration::from_secs(240), || {
        let runs = bed.runs.clone();
        async move { runs.get("lost").await.ok().filter(final_phase) }
    })
    .await;
    let status = done.status.clone().expect("status");
    let path = &status.read_back[0];
    assert_eq!(
        path.phase,
        ReadBackPhase::Failed,
        "never stored: {status:?}"
    );
    let events = run_events(&bed.client, &bed.ns.name, "lost")
        .await
        .join("\n");
    assert!(
        events.contains("sandbox_runfiles_drain_failed"),
        "the loss is an Event: {events}"
    );

    bed.runs
        .delete("lost", &Default::default())
        .await
        .expect("delete the run");
    eventually("the run to be gone", Duration::from_secs(120), || {
        let runs = bed.runs.clone();
        async move {
            runs.get_opt("lost")
                .await
                .ok()
                .and_then(|r| r.is_none().then_some(()))
        }
    })
    .await;
}
