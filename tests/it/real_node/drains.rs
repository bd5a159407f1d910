//! Drains on real containers: over-cap files dropped in the pod, a missing ConfigMap shown stuck,
//! the pod passthrough fields, a file shrunk and a directory swapped mid-drain.

use super::*;

/// The cap on a real container: a 64 GiB sparse file beside a small result, under `sizeLimit:
/// 1Mi`, is dropped by the packer in the pod (it never crosses the wire), the result is kept and
/// the path ends `Capped` in seconds. And a path whose only file the holder cannot read (mode
/// 0000) ends `Failed` with the packer's note, never `Empty`.
#[tokio::test]
async fn over_cap_files_are_dropped_in_the_pod_and_unreadable_is_never_empty() {
    let bed = RealBed::new("real-cap").await;

    let huge = r#"set -e
o=$ITERION_ARTIFACT_FILES_DIR
dd if=/dev/zero of="$o/huge.bin" bs=1 count=0 seek=68719476736 2>/dev/null
echo 'the result' > "$o/result.txt""#;
    let mut spec = real_spec(Some(huge), &["/work/out"]);
    if let Some(rb) = spec.read_back.as_mut() {
        rb.paths[0].size_limit = Some(k8s_openapi::apimachinery::pkg::api::resource::Quantity(
            "1Mi".into(),
        ));
    }
    create(&bed.runs, "huge", spec).await;

    let unreadable = r#"echo 'kept from everyone' > "$ITERION_ARTIFACT_FILES_DIR/locked.txt"
chmod 0000 "$ITERION_ARTIFACT_FILES_DIR/locked.txt""#;
    create(
        &bed.runs,
        "locked",
        real_spec(Some(unreadable), &["/work/out"]),
    )
    .await;

    let run = wait_run(&bed.runs, "huge", "a final phase", &bed.op, final_phase).await;
    let status = run.status.expect("status");
    let entry = &status.read_back[0];
    assert_eq!(entry.phase, ReadBackPhase::Capped, "{entry:?}");
    assert_eq!(entry.dropped_members, 1, "{entry:?}");
    assert!(entry.bytes < 1024 * 1024, "{entry:?}");
    let finished = status.completion_time.expect("completionTime").0;
    let created = run
        .metadata
        .creation_timestamp
        .expect("creationTimestamp")
        .0;
    let took = finished.duration_since(created);
    assert!(
        took < jiff::SignedDuration::from_secs(60),
        "64 GiB never crossed the wire: the whole run took {took:?}"
    );
    let dest = files_get(&bed.ns.name, "huge", &bed.store_url, &[], &[])
        .unwrap_or_else(|e| panic!("files get failed: {e}"));
    let out = extracted(&dest, 0);
    assert_eq!(
        std::fs::read_to_string(out.join("result.txt")).expect("result.txt kept"),
        "the result\n"
    );
    assert!(
        !out.join("huge.bin").exists(),
        "the dropped member is not extracted"
    );

    let run = wait_run(&bed.runs, "locked", "a final phase", &bed.op, final_phase).await;
    let entry = &run.status.expect("status").read_back[0];
    assert_eq!(
        entry.phase,
        ReadBackPhase::Failed,
        "unreadable is not Empty: {entry:?}"
    );
    let message = entry.message.clone().unwrap_or_default();
    assert!(
        message.contains("locked.txt"),
        "the packer's note names the file: {message}"
    );
    let events = run_events(&bed.client, &bed.ns.name, "locked")
        .await
        .join("\n");
    assert!(events.contains("sandbox_runfiles_drain_failed"), "{events}");
}

/// A run that mounts a ConfigMap that does not exist: the kubelet reports `FailedMount` only as
/// an Event on the pod, and the pod stays Pending with nothing in its status. The run still says
/// why (Ready=False FailedMount with the kubelet's words) and tells it once (one PodStuck Event,
/// related to the pod), in a namespace enforcing Pod Security `restricted`.
///
/// The pod never gets past mounting its volumes, so no container starts: the holder image is the
/// busybox the test bed always has (the operator image is not needed).
#[tokio::test]
async fn a_run_mounting_a_missing_config_map_is_shown_stuck_with_the_kubelets_failed_mount() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = restricted_namespace(&client, "real-stuck").await;
    let (_dir, store_url) = file_store("real-stuck");
    let op = Operator::builder(&ns.name, &store_url)
        .flags(&["--holder-image", &pod_image("busybox")])
        .start();
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let mut spec = real_spec(Some("cat /etc/cfg/x"), &["/work/out"]);
    spec.mounts = serde_json::from_value(json!([{
        "name": "cfg", "type": "configMap", "source": "no-such-config",
        "target": "/etc/cfg", "readOnly": true,
    }]))
    .expect("mounts");
    create(&runs, "stuck", spec).await;
    let run = wait_run(&runs, "stuck", "Ready=False FailedMount", &op, |r| {
        r.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "False" && c.reason == "FailedMount")
        })
    })
    .await;
    let status = run.status.clone().expect("status");
    assert_eq!(status.phase, Some(Phase::Pending));
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .expect("Ready");
    assert!(
        ready.message.contains("\"no-such-config\" not found"),
        "the kubelet's words: {}",
        ready.message
    );
    assert_eq!(status.message.as_deref(), Some(ready.message.as_str()));
    // The shipped GitOps health checks, on this real run: stuck, not progressing (issue #42).
    assert_eq!(
        crate::gitops::health_of(&run),
        ("Degraded".to_string(), "Failed".to_string()),
        "Argo CD and Flux on the stuck run"
    );

    let first = wait_event(
        &client,
        &ns.name,
        Some("stuck"),
        "PodStuck",
        Duration::from_secs(30),
        &op,
    )
    .await;
    assert_eq!(first.type_.as_deref(), Some("Warning"));
    let note = first.note.clone().unwrap_or_default();
    assert!(
        note.starts_with("FailedMount: ") && note.contains("no-such-config"),
        "{note}"
    );
    let related = first.related.clone().expect("related to the pod");
    assert_eq!(
        (related.kind.as_deref(), related.name.as_deref()),
        (Some("Pod"), Some(pod_of(&run).as_str()))
    );
    // Told once: the operator looks at the pending pod again (every 5 s and more) and the
    // kubelet repeats FailedMount, but the cause is the same, so no second Event, no series.
    tokio::time::sleep(Duration::from_secs(15)).await;
    let all = events_of(&client, &ns.name, "stuck", "PodStuck").await;
    assert_eq!(all.len(), 1, "{all:?}");
    assert!(all[0].series.is_none(), "published again: {:?}", all[0]);
}

/// Issue #14 item 6 on a real container: the pod passthrough fields a sandbox needs reach the
/// kubelet and the container — `runtimeClassName` (a RuntimeClass whose handler is the node's
/// runc), `serviceAccountName` (its token mounted), `env` from a Secret key and a ConfigMap key,
/// pod labels and annotations, and a node affinity — under Pod Security `restricted`.
#[tokio::test]
async fn the_pod_passthrough_fields_reach_a_real_container() {
    let bed = RealBed::new("real-pass").await;
    let ns = bed.ns.name.clone();
    let objects = format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: tool-secret, namespace: {ns}}}\n\
         stringData: {{token: s3cr3t}}\n---\n\
         apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: tool-config, namespace: {ns}}}\n\
         data: {{mode: fast}}\n---\n\
         apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: tool-sa, namespace: {ns}}}\n---\n\
         apiVersion: node.k8s.io/v1\nkind: RuntimeClass\nmetadata: {{name: sandboxrun-test-runc}}\n\
         handler: runc\n"
    );
    let applied = kubectl_apply(&ns, &objects);
    assert!(applied.status.success(), "{applied:?}");

    // The workload stays up a few seconds so the test can read its pod, then reports what it got.
    let script = "sleep 8\n\
        echo \"$TOOL_TOKEN\" > /work/out/token.txt\n\
        echo \"$TOOL_MODE\" > /work/out/mode.txt\n\
        if [ -s /var/run/secrets/kubernetes.io/serviceaccount/token ]; then echo yes; else echo no; fi > /work/out/sa-token.txt";
    let mut spec = serde_json::to_value(real_spec(Some(script), &["/work/out"])).expect("spec");
    let extra = json!({
        "runtimeClassName": "sandboxrun-test-runc",
        "serviceAccountName": "tool-sa",
        "podLabels": {"team": "qa"},
        "podAnnotations": {"example.com/note": "hello"},
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": REAL_NODE_LABEL, "operator": "In", "values": ["true"]}
            ]}]
        }}},
        "env": [
            {"name": "TOOL_TOKEN", "valueFrom": {"secretKeyRef": {"name": "tool-secret", "key": "token"}}},
            {"name": "TOOL_MODE", "valueFrom": {"configMapKeyRef": {"name": "tool-config", "key": "mode"}}},
        ],
    });
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    create(
        &bed.runs,
        "pass",
        serde_json::from_value::<SandboxRunSpec>(spec).expect("a SandboxRun spec"),
    )
    .await;

    let running = wait_run(
        &bed.runs,
        "pass",
        "Running",
        &bed.op,
        phase_is(Phase::Running),
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    let pod = pods.get(&pod_of(&running)).await.expect("the run's pod");
    let pod_spec = pod.spec.clone().expect("pod spec");
    assert_eq!(
        pod_spec.runtime_class_name.as_deref(),
        Some("sandboxrun-test-runc")
    );
    assert_eq!(pod_spec.service_account_name.as_deref(), Some("tool-sa"));
    assert_eq!(
        pod.labels().get("team").map(String::as_str),
        Some("qa"),
        "{:?}",
        pod.labels()
    );
    assert_eq!(
        pod.annotations()
            .get("example.com/note")
            .map(String::as_str),
        Some("hello")
    );
    assert!(
        pod_spec
            .affinity
            .and_then(|a| a.node_affinity)
            .and_then(|n| n.required_during_scheduling_ignored_during_execution)
            .is_some(),
        "the node affinity reached the pod"
    );

    let run = wait_run(&bed.runs, "pass", "a final phase", &bed.op, final_phase).await;
    let status = run.status.clone().expect("status");
    assert_eq!(status.phase, Some(Phase::Succeeded), "{status:?}");
    let dest = files_get(&ns, "pass", &bed.store_url, &[], &[])
        .unwrap_or_else(|e| panic!("files get failed: {e}"));
    let out = extracted(&dest, 0);
    let read = |name: &str| {
        std::fs::read_to_string(out.join(name))
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .trim()
            .to_string()
    };
    assert_eq!(read("token.txt"), "s3cr3t", "env from the Secret key");
    assert_eq!(read("mode.txt"), "fast", "env from the ConfigMap key");
    assert_eq!(
        read("sa-token.txt"),
        "yes",
        "a named ServiceAccount gets its token mounted"
    );
}

/// Issue 25 items 5 and 7 on a real container, with the workload still running when `stop`
/// arrives (docs/contract.md "A changed file is never stored as a clean one", "The packer walks
/// what it listed"). While the packer streams the big file (it listed the root already), the test
/// execs into the workload: `tree` is swapped for a symlink to `/` and the big file is truncated.
/// - The big file is stored zero-padded to its listed size and recorded as changed (`shrunk`):
///   status `changedMembers` 1, a `ReadBackChanged` Event, a CHANGED line in `files ls`. Before
///   the fix it was stored as a clean member and the path said only `Drained`.
/// - Nothing of the holder's own filesystem enters the archive: `tree` is the symlink the walk
///   found (rejected), a name reported replaced, or the directory the walk holds a descriptor of.
///   A walk that lists a directory's types first and descends by path name later (the walkdir
///   walk before the fix) would list the holder's `/` under `tree/` (what the unit test
///   `a_directory_swapped_for_a_symlink_to_slash_mid_walk_never_brings_the_holders_view_in` shows).
#[tokio::test]
async fn a_file_shrunk_and_a_directory_swapped_mid_drain_are_recorded_never_followed() {
    let bed = RealBed::new("real-swap-race").await;
    let mut spec = real_spec(Some(SWAP_RACE), &["/work/swap-race"]);
    if let Some(read_back) = spec.read_back.as_mut() {
        read_back.paths[0].size_limit = Some(
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("1Gi".into()),
        );
    }
    create(&bed.runs, "race", spec).await;
    let run = wait_run(&bed.runs, "race", "its pod", &bed.op, |r| {
        r.status.as_ref().is_some_and(|s| s.pod_name.is_some())
    })
    .await;
    let pod = pod_of(&run);
    let ns = bed.ns.name.clone();
    let exec = |script: &str| exec_in_workload(&ns, &pod, script);
    let ready = "/work/swap-race/tree/sub/inside.txt";
    eventually(
        "the workload to write its files",
        Duration::from_secs(120),
        || {
            let ok = exec(&format!("test -f {ready}")).status.success();
            async move { ok.then_some(()) }
        },
    )
    .await;

    bed.runs
        .patch(
            "race",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"stop": true}})),
        )
        .await
        .expect("stop");
    let holder_path = "/sandboxrun-readback/work/swap-race";
    eventually("the packer to start", Duration::from_secs(60), || {
        let running = packer_running(&ns, &pod, holder_path).then_some(());
        async move { running }
    })
    .await;
    // The packer lists the root at once, then streams the 256 MiB file for seconds.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let swap = exec(
        "cd /work/swap-race && mv tree tree.away && ln -s / tree && : > a-big.bin && echo swapped",
    );
    assert!(swap.status.success(), "{swap:?}");

    let done = wait_run(&bed.runs, "race", "a final phase", &bed.op, final_phase).await;
    let status = done.status.clone().expect("status");
    let path = &status.read_back[0];
    assert_eq!(path.phase, ReadBackPhase::Drained, "{path:?}");
    // The swap came before the truncation in one exec: a truncation that landed while the file
    // streamed (a `shrunk` record) also proves the swap landed before the walk reached `tree`.
    assert_eq!(path.changed_members, 1, "the truncated file: {path:?}");

    let events = run_events(&bed.client, &ns, "race").await.join("\n");
    assert!(events.contains("ReadBackChanged"), "{events}");

    let ls = Command::new(env!("CARGO_BIN_EXE_sandboxrun-operator"))
        .args([
            "files",
            "ls",
            "race",
            "-n",
            &ns,
            "--store-url",
            &bed.store_url,
        ])
        .output()
        .expect("files ls");
    let listing = String::from_utf8_lossy(&ls.stdout).to_string();
    assert!(ls.status.success(), "{ls:?}");
    assert!(
        listing.contains("CHANGED") && listing.contains("a-big.bin") && listing.contains("shrank"),
        "{listing}"
    );

    let dest = files_get(&ns, "race", &bed.store_url, &[], &[])
        .unwrap_or_else(|e| panic!("files get failed: {e}"));
    let root = extracted(&dest, 0);
    let big = std::fs::read(root.join("a-big.bin")).expect("the big file");
    assert_eq!(big.len(), 268_435_456, "padded to its listed size");
    assert!(
        big[big.len() - 4096..].iter().all(|b| *b == 0),
        "zero-padded"
    );
    let stored: Vec<String> = snapshot(&root).into_keys().collect();
    let allowed = ["a-big.bin", "tree", "tree/sub", "tree/sub/inside.txt"];
    assert!(
        stored.iter().all(|p| allowed.contains(&p.as_str())),
        "only what the workload wrote is stored, never the holder's view through `tree`: {stored:?}"
    );
    // What the walk made of `tree` depends on when it got there: the symlink it found (stored as
    // a symlink, which the operator rejects: its target leaves the path), a name that changed
    // between its stat and its open (reported replaced), or the directory it already held.
    let as_symlink = listing.contains("tree (symlink_escape)");
    let replaced = listing.contains("replaced while being packed");
    let held = stored.iter().any(|p| p == "tree/sub/inside.txt");
    assert!(
        as_symlink || replaced || held,
        "`tree` is a rejected symlink, a replaced name or the held directory:\n{listing}\n{stored:?}"
    );
    eprintln!("tree: symlink {as_symlink}, replaced {replaced}, held {held}; stored {stored:?}");
}

/// The workload of [`a_file_shrunk_and_a_directory_swapped_mid_drain_are_recorded_never_followed`]:
/// a 256 MiB file of random bytes (first in the packer's sorted walk, so it streams for seconds),
/// then a directory `tree` holding one file; `inside.txt` is written last, as the go-ahead. Then it
/// keeps running: the drain happens on `stop`, with the workload alive.
const SWAP_RACE: &str = r#"set -e
o=/work/swap-race
head -c 268435456 /dev/urandom > "$o/a-big.bin"
mkdir -p "$o/tree/sub"
echo inside > "$o/tree/sub/inside.txt"
exec sleep 3600
"#;
