//! Issue #52 item 2: faults of the clusters users run, on the real node, each with "nothing lost,
//! nothing stuck, status honest". They stop the node's kubelet, which every other real-node test
//! needs, so `make test` skips them (`--skip real_node::chaos::`) and `make chaos`
//! (`hack/chaos.sh`) runs them one at a time, alone on the bed.

use super::two_nodes::{self, fleet_spec, pool_pods_by_node};
use super::*;
use crate::support::s3_server::PrivateS3;

/// `hack/<script> <verb>`, as the bed's root: `real-node.sh kubelet-stop|kubelet-start`,
/// `local-cluster.sh apiserver-restart`.
fn bed_verb(script: &str, verb: &str) {
    let out = Command::new(repo().join("hack").join(script))
        .arg(verb)
        .output()
        .unwrap_or_else(|e| panic!("run hack/{script}: {e}"));
    assert!(
        out.status.success(),
        "hack/{script} {verb}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `hack/real-node.sh <verb>` (kubelet-stop, kubelet-start).
fn node(verb: &str) {
    bed_verb("real-node.sh", verb);
}

/// The script that stops and starts the kubelet of the real node `name`.
fn node_script(name: &str) -> &'static str {
    if name == two_nodes::second_node() {
        "second-node.sh"
    } else {
        "real-node.sh"
    }
}

/// Starts a stopped kubelet again when a test ends, passed or not: the next test needs the node.
struct KubeletBack(&'static str);

impl Drop for KubeletBack {
    fn drop(&mut self) {
        let _ = Command::new(repo().join("hack").join(self.0))
            .arg("kubelet-start")
            .status();
    }
}

/// Stops the kubelet of the real node `name` until the guard is dropped.
fn node_lost(name: &str) -> KubeletBack {
    let script = node_script(name);
    let back = KubeletBack(script);
    bed_verb(script, "kubelet-stop");
    back
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

/// Creates `name` ([`BIG_THEN_SLEEP`], a 5-minute drain timeout), waits until its files are
/// written, stops it, and returns its pod once the packer streams them.
async fn stopped_and_draining(
    runs: &Api<SandboxRun>,
    ns: &str,
    name: &str,
    op: &Operator,
) -> String {
    let mut spec = real_spec(Some(BIG_THEN_SLEEP), &["/work/out"]);
    if let Some(read_back) = spec.read_back.as_mut() {
        read_back.drain_timeout = Some("5m".into());
    }
    create(runs, name, spec).await;
    let run = wait_run(runs, name, "Running", op, |r| phase_is(Phase::Running)(r)).await;
    let pod = pod_of(&run);
    files_written(ns, &pod).await;
    runs.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"stop": true}})),
    )
    .await
    .expect("stop");
    packer_started(ns, &pod).await;
    pod
}

/// Waits until the packer streams `/work/out` from `pod`'s holder.
async fn packer_started(ns: &str, pod: &str) {
    let holder_path = "/sandboxrun-readback/work/out";
    eventually("the packer to start", Duration::from_secs(60), || {
        let running = packer_running(ns, pod, holder_path).then_some(());
        async move { running }
    })
    .await;
}

/// The fault broke a drain (the test would prove nothing if the drain had ended first): the
/// path's drain was started more than once, whether the attempt itself was retried or the whole
/// teardown (its first read failed on the restarting apiserver).
fn assert_fault_hit_the_drain(op: &Operator) {
    let log = op.plain_log_text();
    let started = log
        .lines()
        .filter(|l| l.contains("drain attempt started") && l.contains("path=/work/out"))
        .count();
    assert!(started >= 2, "the fault landed mid-drain: {log}");
}

/// The run ended `Stopped`, its path `Drained`.
fn assert_stopped_and_drained(done: &SandboxRun) {
    let status = done.status.clone().expect("status");
    assert_eq!(status.phase, Some(Phase::Stopped), "{status:?}");
    let path = &status.read_back[0];
    assert_eq!(path.phase, ReadBackPhase::Drained, "{path:?}");
}

/// The files [`BIG_THEN_SLEEP`] wrote, extracted under `root`, are the written ones, byte for byte.
fn assert_every_byte_stored(root: &Path) {
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

/// The run `name` of `bed`, whose drain a fault broke, ends `Stopped` with its path `Drained` and
/// every byte of [`BIG_THEN_SLEEP`] stored.
async fn ended_with_every_byte_after_a_fault(bed: &RealBed, name: &str) {
    let done = wait_run(&bed.runs, name, "a final phase", &bed.op, final_phase).await;
    assert_stopped_and_drained(&done);
    assert_fault_hit_the_drain(&bed.op);
    let dest = files_get(&bed.ns.name, name, &bed.store_url, &[], &[])
        .unwrap_or_else(|e| panic!("files get failed: {e}"));
    assert_every_byte_stored(&extracted(&dest, 0));
}

/// The kubelet restarted while a drain streams: the stream breaks, the drain is retried once
/// the node is back, and every byte is stored; the run ends, its path `Drained`.
#[tokio::test]
async fn a_kubelet_restarted_mid_drain_loses_nothing_and_the_run_ends() {
    let bed = RealBed::new("chaos-kubelet").await;
    stopped_and_draining(&bed.runs, &bed.ns.name, "restart", &bed.op).await;
    let _back = KubeletBack("real-node.sh");
    node("kubelet-stop");
    tokio::time::sleep(Duration::from_secs(5)).await;
    node("kubelet-start");

    ended_with_every_byte_after_a_fault(&bed, "restart").await;
}

/// The apiserver restarted while a drain streams (the exec stream runs through it, and every
/// watch breaks): the drain is retried once the apiserver answers, every byte is stored, and the
/// run ends, its path `Drained`.
#[tokio::test]
async fn an_apiserver_restarted_mid_drain_loses_nothing_and_the_run_ends() {
    let bed = RealBed::new("chaos-apiserver").await;
    stopped_and_draining(&bed.runs, &bed.ns.name, "restart", &bed.op).await;
    bed_verb("local-cluster.sh", "apiserver-restart");

    ended_with_every_byte_after_a_fault(&bed, "restart").await;
}

/// The object store down for 10 s while a drain streams into it (a private S3 server, stopped
/// and started again on the same port and root): the upload is retried, every byte is stored
/// once, and the run ends, its path `Drained`.
#[tokio::test]
async fn a_store_outage_mid_drain_loses_nothing_and_the_run_ends() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = restricted_namespace(&client, "chaos-store").await;
    let mut s3 = PrivateS3::new("chaos-store");
    let store_flags = store_flags(&s3.options());
    let flags: Vec<&str> = store_flags.iter().map(String::as_str).collect();
    let op = start_operator_with(&ns.name, &s3.url(), &flags);
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    stopped_and_draining(&runs, &ns.name, "outage", &op).await;
    s3.stop();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let during = runs.get("outage").await.expect("the run");
    let path = during.status.clone().expect("status").read_back[0].clone();
    assert_eq!(
        path.phase,
        ReadBackPhase::Pending,
        "the outage hit the drain (nothing can be committed without the store): {path:?}"
    );
    s3.start();

    let done = wait_run(&runs, "outage", "a final phase", &op, final_phase).await;
    assert_stopped_and_drained(&done);
    let dest = files_get(&ns.name, "outage", &s3.url(), &s3.options(), &[])
        .unwrap_or_else(|e| panic!("files get failed: {e}"));
    assert_every_byte_stored(&extracted(&dest, 0));
    assert!(
        s3.part_files().is_empty(),
        "no multipart upload left open: {:?}",
        s3.part_files()
    );
}

/// The operator SIGKILLed while a checkpoint streams, and started again: the checkpoint is
/// answered once (never left pending, never two), it holds every byte or says it failed, and the
/// run, still running, then stops and drains as usual.
#[tokio::test]
async fn an_operator_killed_mid_checkpoint_answers_it_once_and_the_run_goes_on() {
    let mut bed = RealBed::new("chaos-checkpoint").await;
    let mut spec = real_spec(Some(BIG_THEN_SLEEP), &["/work/out"]);
    if let Some(read_back) = spec.read_back.as_mut() {
        read_back.drain_timeout = Some("5m".into());
    }
    create(&bed.runs, "agent", spec).await;
    let run = wait_run(&bed.runs, "agent", "Running", &bed.op, |r| {
        phase_is(Phase::Running)(r)
    })
    .await;
    let pod = pod_of(&run);
    files_written(&bed.ns.name, &pod).await;
    bed.runs
        .patch(
            "agent",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"checkpoint": "c1"}})),
        )
        .await
        .expect("ask a checkpoint");
    packer_started(&bed.ns.name, &pod).await;
    bed.op.kill();
    let at_kill = bed.runs.get("agent").await.expect("the run").status;
    let answered_then = at_kill.as_ref().is_some_and(|s| {
        s.checkpoints.iter().any(|c| {
            c.read_back
                .iter()
                .any(|p| p.phase != ReadBackPhase::Pending)
        })
    });
    assert!(
        !answered_then,
        "the kill landed mid-checkpoint: {at_kill:?}"
    );
    bed.op = start_operator(&bed.ns.name, &bed.store_url);

    let answered = wait_run(&bed.runs, "agent", "checkpoint c1 answered", &bed.op, |r| {
        r.status.as_ref().is_some_and(|s| {
            s.checkpoints.iter().any(|c| {
                !c.read_back.is_empty()
                    && c.read_back
                        .iter()
                        .all(|p| p.phase != ReadBackPhase::Pending)
            })
        })
    })
    .await;
    let status = answered.status.clone().expect("status");
    assert_eq!(status.checkpoints.len(), 1, "answered once: {status:?}");
    assert_eq!(status.phase, Some(Phase::Running), "{status:?}");
    let path = &status.checkpoints[0].read_back[0];
    assert_eq!(path.phase, ReadBackPhase::Drained, "{path:?}");
    let dest = files_get_checkpoint(&bed.ns.name, "agent", &bed.store_url, 1);
    assert_every_byte_stored(&dest);

    bed.runs
        .patch(
            "agent",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"stop": true}})),
        )
        .await
        .expect("stop");
    let done = wait_run(&bed.runs, "agent", "a final phase", &bed.op, final_phase).await;
    assert_stopped_and_drained(&done);
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

    let _back = KubeletBack("real-node.sh");
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

/// The operator SIGKILLed the moment a warm claim took a pool pod (the pod labelled claimed; the
/// start delivered, or not yet: the kill lands where it lands, and the test says which), then
/// started again: the run still starts exactly once and succeeds with its file, no claimed pool
/// pod is left without its run, and the pool is back to one ready unclaimed pod.
#[tokio::test]
async fn an_operator_killed_mid_claim_starts_the_run_once_and_the_pool_recovers() {
    use sandboxrun_operator::api::{SandboxRunPool, TemplateRef};
    let RealBed {
        client,
        ns,
        store_url,
        mut op,
        ..
    } = RealBed::with_flags("chaos-claim", &["--warm-pools"]).await;
    ready_pool(
        &client,
        &ns.name,
        real_spec(Some("exit 9"), &["/work/out"]),
        1,
    )
    .await;
    let pools: Api<SandboxRunPool> = Api::namespaced(client.clone(), &ns.name);
    let one_ready = || {
        let pools = pools.clone();
        async move {
            let s = pools.get("agents").await.ok()?.status?;
            (s.ready_replicas == 1 && s.replicas == 1).then_some(())
        }
    };

    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let warm = SandboxRunSpec {
        template_ref: Some(TemplateRef::namespaced("agent")),
        command: Some(vec![
            "sh".into(),
            "-c".into(),
            r#"date +%s%N >> "$ITERION_ARTIFACT_FILES_DIR/starts""#.into(),
        ]),
        ..Default::default()
    };
    create(&runs, "warm", warm).await;
    let claimed = eventually("a pool pod to be claimed", Duration::from_secs(60), || {
        let (client, ns) = (client.clone(), ns.name.clone());
        async move {
            let pods = pool_pods(&client, &ns, "agents").await;
            pods.into_iter().find(|(_, _, claimed)| *claimed)
        }
    })
    .await;
    op.kill();
    let at_kill = runs.get("warm").await.expect("the run").status;
    eprintln!(
        "killed with {} claimed; the run's status then: {at_kill:?}",
        claimed.0
    );
    let op = start_operator_with(&ns.name, &store_url, &["--warm-pools"]);

    let done = wait_run(&runs, "warm", "the warm run to end", &op, final_phase).await;
    let status = done.status.clone().expect("status");
    assert_eq!(status.phase, Some(Phase::Succeeded), "{status:?}");
    assert_eq!(
        status.read_back[0].phase,
        ReadBackPhase::Drained,
        "{status:?}"
    );
    let dest = files_get(&ns.name, "warm", &store_url, &[], &[])
        .unwrap_or_else(|e| panic!("files get failed: {e}"));
    let starts = std::fs::read_to_string(extracted(&dest, 0).join("starts")).expect("starts");
    assert_eq!(
        starts.lines().count(),
        1,
        "started exactly once: {starts:?}"
    );

    // No claimed pool pod outlives its run's start, and the pool makes another ready pod.
    eventually("the pool to recover", Duration::from_secs(180), || {
        let (client, ns, ready) = (client.clone(), ns.name.clone(), one_ready());
        async move {
            ready.await?;
            let pods = pool_pods(&client, &ns, "agents").await;
            let unclaimed = pods.iter().filter(|(_, _, c)| !c).count();
            (unclaimed == 1).then_some(())
        }
    })
    .await;
    let pods = pool_pods(&client, &ns.name, "agents").await;
    let stray: Vec<_> = pods
        .iter()
        .filter(|(name, _, c)| *c && *name != claimed.0)
        .collect();
    assert!(stray.is_empty(), "no second claim: {pods:?}");
}

/// Tolerations of a run (or a template) that leaves a lost node after `seconds` instead of the
/// default 300: the node lifecycle controller's taints, `NoExecute`.
fn leave_a_lost_node_after(spec: &mut SandboxRunSpec, seconds: i64) {
    let tolerations = spec.tolerations.get_or_insert_with(Vec::new);
    for key in [
        "node.kubernetes.io/unreachable",
        "node.kubernetes.io/not-ready",
    ] {
        tolerations.push(Toleration {
            key: Some(key.into()),
            operator: Some("Exists".into()),
            effect: Some("NoExecute".into()),
            toleration_seconds: Some(seconds),
            ..Toleration::default()
        });
    }
}

/// The node a pod is bound to.
async fn node_of(client: &Client, ns: &str, pod: &str) -> String {
    Api::<Pod>::namespaced(client.clone(), ns)
        .get(pod)
        .await
        .expect("the pod")
        .spec
        .and_then(|s| s.node_name)
        .unwrap_or_default()
}

/// The node the scheduler bound `pod` to, from its `Scheduled` Event (the pod of a finished run is
/// gone by the time it is asked).
async fn scheduled_to(client: &Client, ns: &str, pod: &str) -> String {
    let events = Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default().fields(&format!("involvedObject.name={pod}")))
        .await
        .expect("list the pod's Events");
    let said = events
        .items
        .iter()
        .find(|e| e.reason.as_deref() == Some("Scheduled"))
        .and_then(|e| e.message.clone())
        .unwrap_or_else(|| panic!("{pod} has a Scheduled Event: {:?}", events.items));
    said.rsplit(" to ")
        .next()
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// Two real nodes; a run with a retry policy on one of them, which is lost (its kubelet stopped:
/// the Node goes NotReady, the taint manager evicts the pod, which stays Terminating with nobody to
/// end it). The attempt ends as a disruption, its files are reported lost (its path `Failed`, never
/// `Drained` or `Empty`), and the next attempt runs on the other node and succeeds, its files
/// stored. Nothing waits on the lost pod, and a checkpoint taken before the loss stays in the store.
#[tokio::test]
async fn a_run_on_a_lost_node_is_retried_on_the_other_node_and_its_lost_files_are_said() {
    use sandboxrun_operator::api::RetryPolicy;
    let bed = RealBed::new("chaos-node-retry").await;
    let script = r#"echo "attempt $SANDBOXRUN_ATTEMPT on $(hostname)" > "$ITERION_ARTIFACT_FILES_DIR/attempt.txt"
[ "$SANDBOXRUN_ATTEMPT" -ge 2 ] || exec sleep 3600"#;
    let mut spec = fleet_spec(Some(script), &["/work/out"]);
    leave_a_lost_node_after(&mut spec, 5);
    if let Some(read_back) = spec.read_back.as_mut() {
        read_back.drain_timeout = Some("30s".into());
    }
    spec.retry_policy = Some(RetryPolicy {
        limit: 1,
        ..RetryPolicy::default()
    });
    create(&bed.runs, "moved", spec).await;
    let run = wait_run(
        &bed.runs,
        "moved",
        "Running",
        &bed.op,
        phase_is(Phase::Running),
    )
    .await;
    let first_pod = pod_of(&run);
    let lost = node_of(&bed.client, &bed.ns.name, &first_pod).await;
    // A checkpoint taken before the node is lost stays in the store.
    eventually("the first attempt's file", Duration::from_secs(60), || {
        let ok = exec_in_workload(&bed.ns.name, &first_pod, "test -s /work/out/attempt.txt")
            .status
            .success();
        async move { ok.then_some(()) }
    })
    .await;
    bed.runs
        .patch(
            "moved",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"checkpoint": "before"}})),
        )
        .await
        .expect("ask a checkpoint");
    wait_run(&bed.runs, "moved", "the checkpoint kept", &bed.op, |r| {
        r.status.as_ref().is_some_and(|s| {
            s.checkpoints.iter().any(|c| {
                c.read_back
                    .iter()
                    .any(|p| p.phase == ReadBackPhase::Drained)
            })
        })
    })
    .await;
    let _back = node_lost(&lost);

    let done = eventually("the run to end", Duration::from_secs(360), || {
        let runs = bed.runs.clone();
        async move { runs.get("moved").await.ok().filter(final_phase) }
    })
    .await;
    let status = done.status.clone().expect("status");
    assert_eq!(status.phase, Some(Phase::Succeeded), "{status:?}");
    let first = status
        .attempts
        .first()
        .expect("the lost attempt is recorded");
    assert!(!first.counted, "a lost node is a disruption: {first:?}");
    assert_eq!(
        first.read_back[0].phase,
        ReadBackPhase::Failed,
        "the lost attempt's files are said lost: {first:?}"
    );
    let second_pod = status.pod_name.clone().expect("the second attempt's pod");
    let other = scheduled_to(&bed.client, &bed.ns.name, &second_pod).await;
    assert_ne!(other, lost, "the next attempt ran on the other node");
    assert_eq!(
        status.read_back[0].phase,
        ReadBackPhase::Drained,
        "{status:?}"
    );
    let dest = files_get_attempt(&bed.ns.name, "moved", &bed.store_url, 2);
    let said = std::fs::read_to_string(dest.join("attempt.txt")).expect("attempt.txt");
    assert!(said.starts_with("attempt 2 "), "{said}");
    let events = run_events(&bed.client, &bed.ns.name, "moved")
        .await
        .join("\n");
    assert!(
        events.contains("sandbox_runfiles_drain_failed"),
        "the loss is an Event: {events}"
    );
    let kept = files_get_checkpoint(&bed.ns.name, "moved", &bed.store_url, 1);
    let before =
        std::fs::read_to_string(kept.join("attempt.txt")).expect("the checkpoint's attempt.txt");
    assert!(
        before.starts_with("attempt 1 "),
        "the lost attempt's checkpoint: {before}"
    );
}

/// Two real nodes and a pool of two pods, one on each; one node is lost: its pool pod is evicted
/// (and stays Terminating), the pool makes a ready replacement on the node that is left, and a run
/// made from the template is served warm from a ready pod meanwhile.
#[tokio::test]
async fn a_lost_nodes_pool_pod_is_replaced_on_the_other_node() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = restricted_namespace(&client, "chaos-node-pool").await;
    let (_dir, store_url) = file_store("chaos-node-pool");
    let _op = start_operator_with(&ns.name, &store_url, &["--warm-pools"]);
    let mut template = fleet_spec(Some("exit 9"), &["/work/out"]);
    leave_a_lost_node_after(&mut template, 5);
    ready_pool(&client, &ns.name, template, 2).await;
    let before = pool_pods_by_node(&client, &ns.name, "agents").await;
    let lost = two_nodes::second_node();
    assert!(
        before.iter().any(|(_, node, _)| *node == lost),
        "a pool pod on each node first: {before:?}"
    );
    let _back = node_lost(&lost);

    eventually(
        "two ready pool pods on the node left",
        Duration::from_secs(300),
        || {
            let (client, ns, lost) = (client.clone(), ns.name.clone(), lost.clone());
            async move {
                let pods = pool_pods_by_node(&client, &ns, "agents").await;
                let left = pods
                    .iter()
                    .filter(|(_, node, c)| *node != lost && !c)
                    .count();
                let pools: Api<sandboxrun_operator::api::SandboxRunPool> =
                    Api::namespaced(client.clone(), &ns);
                let s = pools.get("agents").await.ok()?.status?;
                (left == 2 && s.ready_replicas == 2).then_some(())
            }
        },
    )
    .await;
}
