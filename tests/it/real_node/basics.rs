//! The core on real containers: what the holder runs, uids and modes in a restricted namespace, the
//! promise variables, the grace window of a deleted or evicted pod, a signal's exit code, a missing
//! image, and the images themselves (rebuilt to the same digests, matching the Dockerfile).

use super::*;

const WRITER: &str = r#"set -e
o=$ITERION_ARTIFACT_FILES_DIR
# The promise, checked from inside the workload: the variable names a mounted, writable directory.
test -d "$o"; touch "$o/.probe"; rm "$o/.probe"
echo "$ITERION_ARTIFACT_FILES_DIR" > "$o/artifact-dir.txt"
echo "$SANDBOXRUN_READBACK_PATHS" > "$o/readback-paths.txt"
id -u > "$o/uid.txt"; id -g > "$o/gid.txt"
mkdir -p "$o/private/nested/deeper"
echo 'secret material' > "$o/private/key.pem"
chmod 0600 "$o/private/key.pem"
head -c 3000000 /dev/urandom > "$o/private/nested/deeper/blob.bin"
chmod 0700 "$o/private"
ln -s private/key.pem "$o/key-link"
cd "$o/private/nested/deeper" && sha256sum blob.bin > /work/logs/blob.sha256
echo 'log line' > /work/logs/run.log
"#;

/// The workload of [`a_program_the_workload_drops_on_the_holders_path_is_stored_never_run`]:
/// a `sandboxrun-operator` in `/usr/local/sbin` (first on the holder image's PATH) that exits 0
/// at once, with a copy of busybox as its interpreter, and a real result beside it.
const FAKE_HOLDER_PROGRAM: &str = r#"set -e
cp /bin/busybox /usr/local/sbin/busybox
printf '#!/usr/local/sbin/busybox sh\necho fake >&2\nexit 0\n' > /usr/local/sbin/sandboxrun-operator
chmod 0755 /usr/local/sbin/sandboxrun-operator
echo 'real result' > /work/out/result.txt
"#;

/// Issue 25 item 2 on the real node (docs/contract.md "The holder runs only the operator's
/// code"). The run declares `/usr/local/sbin` and would drop a fake `sandboxrun-operator` there.
/// Before issue #38 the operator, running here without its webhook, gave it a pod, and the test
/// showed the holder runs only its own binary by absolute path below its own root (that is still
/// so: `every_declared_path_is_an_emptydir_without_size_limit_in_workload_and_holder` and the
/// holder's tests). Since #38 the controller judges the run by the webhook's rules itself: a
/// system directory is refused (rule read-back-path) and the run gets no pod at all; the run
/// that declares only `/work/out` runs and is drained. Before, the holder
/// mounted the path at the same place and ran its program by name: the fake one exited 0 at once
/// and the drain failed. Now the holder sees the path below its own root and runs its binary by
/// absolute path: it keeps running, both paths are drained, and the fake program is stored as
/// the plain file the workload wrote.
#[tokio::test]
async fn a_program_the_workload_drops_on_the_holders_path_is_stored_never_run() {
    let bed = RealBed::new("real-fake-holder").await;
    let spec = real_spec(Some(FAKE_HOLDER_PROGRAM), &["/usr/local/sbin", "/work/out"]);
    create(&bed.runs, "fake", spec).await;
    let held = wait_run(&bed.runs, "fake", "Ready=False InvalidSpec", &bed.op, |r| {
        r.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.reason == "InvalidSpec")
        })
    })
    .await;
    let message = held
        .status
        .as_ref()
        .and_then(|s| s.message.clone())
        .unwrap_or_default();
    assert!(message.contains("rule read-back-path"), "{message}");
    assert_eq!(
        held.status.as_ref().and_then(|s| s.pod_name.clone()),
        None,
        "no pod"
    );
    let pods: Api<Pod> = Api::namespaced(bed.client.clone(), &bed.ns.name);
    let pod_name = sandboxrun_operator::pod::pod_name("fake");
    assert!(pods.get_opt(&pod_name).await.expect("get").is_none());
    // A run of the same image that declares only /work/out runs and is drained.
    let spec = real_spec(
        Some("echo 'real result' > /work/out/result.txt"),
        &["/work/out"],
    );
    create(&bed.runs, "plain", spec).await;
    let run = wait_run(&bed.runs, "plain", "a final phase", &bed.op, final_phase).await;
    let status = run.status.clone().expect("status");
    assert_eq!(
        status.read_back[0].phase,
        ReadBackPhase::Drained,
        "{status:?}"
    );
}

#[tokio::test]
async fn a_real_batch_run_keeps_uid_modes_and_bytes_in_a_restricted_namespace() {
    let bed = RealBed::new("real-batch").await;
    create(
        &bed.runs,
        "batch",
        real_spec(Some(WRITER), &["/work/out", "/work/logs"]),
    )
    .await;

    let run = wait_run(&bed.runs, "batch", "a final phase", &bed.op, final_phase).await;
    let status = run.status.clone().expect("status");
    assert_eq!(
        status.phase,
        Some(Phase::Succeeded),
        "the pod was admitted under `restricted` and the workload exited 0: {status:?}"
    );
    assert_eq!(status.exit_code, Some(0));
    for entry in &status.read_back {
        assert_eq!(entry.phase, ReadBackPhase::Drained, "{entry:?}");
    }

    // Normal teardown: the holder's preStop sees the drained marker, the containers go at once.
    let pod = pod_of(&run);
    let took = containers_gone_within(&bed.ns.name, &pod, Duration::from_secs(30)).await;
    eprintln!("containers of {pod} gone {took:?} after the run reached its final phase");

    // Every path's outcome is visible in the Events (`kubectl describe`), not only the first.
    let events = run_events(&bed.client, &bed.ns.name, "batch")
        .await
        .join("\n");
    for path in ["/work/out", "/work/logs"] {
        assert!(events.contains(path), "no Event names {path}:\n{events}");
    }

    let dest = files_get(&bed.ns.name, "batch", &bed.store_url, &[], &[])
        .unwrap_or_else(|e| panic!("files get failed: {e}"));
    let out = extracted(&dest, 0);
    let logs = extracted(&dest, 1);
    let read = |p: &Path| std::fs::read_to_string(p).expect("read extracted file");
    // The workload ran as uid/gid 1000; the holder read everything it wrote (0600 file, 0700 dir).
    assert_eq!(read(&out.join("uid.txt")).trim(), "1000");
    assert_eq!(read(&out.join("gid.txt")).trim(), "1000");
    assert_eq!(read(&out.join("artifact-dir.txt")).trim(), "/work/out");
    assert_eq!(
        read(&out.join("readback-paths.txt")).trim(),
        "/work/out:/work/logs"
    );
    assert_eq!(read(&out.join("private/key.pem")), "secret material\n");
    assert_eq!(
        mode_of(&out.join("private/key.pem")),
        0o600,
        "a 0600 secret stays 0600"
    );
    assert_eq!(mode_of(&out.join("private")), 0o700);
    assert_eq!(
        std::fs::read_link(out.join("key-link")).expect("symlink kept"),
        Path::new("private/key.pem")
    );
    // Bytes identical: the sha256 the workload computed in the pod matches the extracted file.
    let blob = std::fs::read(out.join("private/nested/deeper/blob.bin")).expect("blob");
    assert_eq!(blob.len(), 3_000_000);
    let in_pod = read(&logs.join("blob.sha256"));
    assert_eq!(
        in_pod.split_whitespace().next(),
        Some(sha256_hex(&blob).as_str())
    );
    assert_eq!(read(&logs.join("run.log")), "log line\n");
}

#[tokio::test]
async fn the_promise_variables_are_absent_when_no_path_is_declared() {
    let bed = RealBed::new("real-canary").await;
    // Exit 0 only if neither variable is set: a path named but never drained is a broken promise.
    let script = r#"env > /tmp/env.txt
if grep -q ITERION_ARTIFACT_FILES_DIR /tmp/env.txt; then exit 3; fi
if grep -q SANDBOXRUN_READBACK_PATHS /tmp/env.txt; then exit 4; fi
exit 0"#;
    create(&bed.runs, "bare", real_spec(Some(script), &[])).await;
    let run = wait_run(&bed.runs, "bare", "a final phase", &bed.op, final_phase).await;
    let status = run.status.expect("status");
    assert_eq!(status.exit_code, Some(0), "{status:?}");
    assert_eq!(status.phase, Some(Phase::Succeeded), "{status:?}");
    assert!(status.read_back.is_empty());
}

/// `kubectl delete pod` of a running run, and the Eviction API: the holder's preStop keeps the
/// read-back volumes alive until the drain is recorded, the files are stored, and then the
/// containers stop within seconds (not at the end of the grace period).
#[tokio::test]
async fn a_deleted_or_evicted_pod_is_drained_in_its_grace_window_then_stops_at_once() {
    let bed = RealBed::new("real-evict").await;
    let pods: Api<Pod> = Api::namespaced(bed.client.clone(), &bed.ns.name);
    let script = r#"echo "written before the end" > "$ITERION_ARTIFACT_FILES_DIR/evidence.txt"
trap 'exit 143' TERM
while true; do sleep 1; done"#;
    for name in ["deleted", "evicted"] {
        create(&bed.runs, name, real_spec(Some(script), &["/work/out"])).await;
    }
    let mut pod_names = BTreeMap::new();
    for name in ["deleted", "evicted"] {
        let run = wait_run(
            &bed.runs,
            name,
            "Running",
            &bed.op,
            phase_is(Phase::Running),
        )
        .await;
        pod_names.insert(name, pod_of(&run));
    }
    // Give the workloads a moment to write (they run as soon as the pod is Running).
    tokio::time::sleep(Duration::from_secs(2)).await;

    // kubectl delete pod (graceful, the pod's own grace period) ...
    let deleted = Command::new(kubectl_path())
        .args([
            "delete",
            "pod",
            "-n",
            &bed.ns.name,
            &pod_names["deleted"],
            "--wait=false",
        ])
        .output()
        .expect("kubectl delete pod");
    assert!(deleted.status.success(), "{deleted:?}");
    // ... and a POST to pods/eviction, as `kubectl drain` does.
    let eviction = json!({
        "apiVersion": "policy/v1", "kind": "Eviction",
        "metadata": {"name": pod_names["evicted"], "namespace": bed.ns.name},
    });
    let req = http::Request::post(format!(
        "/api/v1/namespaces/{}/pods/{}/eviction",
        bed.ns.name, pod_names["evicted"]
    ))
    .header("content-type", "application/json")
    .body(serde_json::to_vec(&eviction).expect("eviction json"))
    .expect("eviction request");
    let _: serde_json::Value = bed.client.request(req).await.expect("evict the pod");

    for name in ["deleted", "evicted"] {
        let run = wait_run(&bed.runs, name, "a drain outcome", &bed.op, |r| {
            r.status.as_ref().is_some_and(|s| {
                s.read_back
                    .iter()
                    .all(|e| e.phase != ReadBackPhase::Pending)
            })
        })
        .await;
        let entry = &run.status.as_ref().expect("status").read_back[0];
        assert_eq!(entry.phase, ReadBackPhase::Drained, "{name}: {entry:?}");
        let took =
            containers_gone_within(&bed.ns.name, &pod_names[name], Duration::from_secs(30)).await;
        eprintln!("{name}: containers gone {took:?} after the drain was recorded");
        let dest = files_get(&bed.ns.name, name, &bed.store_url, &[], &[])
            .unwrap_or_else(|e| panic!("files get failed: {e}"));
        assert_eq!(
            std::fs::read_to_string(extracted(&dest, 0).join("evidence.txt"))
                .expect("evidence.txt drained"),
            "written before the end\n",
            "{name}"
        );
        // The pod is gone from the API too (a moment after its containers: the kubelet's last
        // status, then the apiserver's removal), and the run says why it ended.
        eventually(
            "the pod to be gone from the API",
            Duration::from_secs(30),
            || {
                let (pods, pod) = (pods.clone(), pod_names[name].clone());
                async move { pods.get_opt(&pod).await.ok()?.is_none().then_some(()) }
            },
        )
        .await;
        wait_run(&bed.runs, name, "a final phase", &bed.op, final_phase).await;
    }
}

/// SIGKILL to a container's workload from the host. Under runc its PID 1 is a host process; under
/// gVisor it lives in the sandbox's kernel (the host PID crictl reports is the whole sandbox's
/// sentry), and the runtime delivers the signal: `runsc kill <container> KILL`.
fn kill_from_the_host(container: &str) {
    let killed = if runtime_class().is_none() {
        let inspect = crictl(&["inspect", "-o", "json", container]);
        let info: serde_json::Value =
            serde_json::from_slice(&inspect.stdout).expect("inspect json");
        let pid = info["info"]["pid"]
            .as_i64()
            .expect("the workload's host pid");
        Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
            .expect("kill")
    } else {
        runsc(&["kill", container, "KILL"]).status
    };
    assert!(killed.success(), "kill {container}: {killed:?}");
}

#[tokio::test]
async fn a_workload_killed_by_a_signal_is_reported_with_its_code_and_its_files_drained() {
    let bed = RealBed::new("real-signal").await;
    let script = r#"echo 'last words before the kill'
echo partial > "$ITERION_ARTIFACT_FILES_DIR/partial.txt"; exec sleep 3600"#;
    create(&bed.runs, "killed", real_spec(Some(script), &["/work/out"])).await;
    let run = wait_run(
        &bed.runs,
        "killed",
        "Running",
        &bed.op,
        phase_is(Phase::Running),
    )
    .await;
    let pod = pod_of(&run);
    // The workload is its container's PID 1, which ignores signals sent from inside its own PID
    // namespace; the kernel (an OOM kill) or the host can still kill it. Kill it from the host.
    let id = eventually("the workload container", Duration::from_secs(30), || {
        let found = container_id(&bed.ns.name, &pod, "workload");
        async move { found }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    kill_from_the_host(&id);

    let run = wait_run(&bed.runs, "killed", "a final phase", &bed.op, final_phase).await;
    let status = run.status.expect("status");
    assert_eq!(status.phase, Some(Phase::Failed), "{status:?}");
    assert_eq!(
        status.exit_code,
        Some(137),
        "SIGKILL is 128 + 9: {status:?}"
    );
    // The evidence outlives the pod: the kubelet's record of how the workload ended, with the
    // last lines of its log (terminationMessagePolicy FallbackToLogsOnError), is in status.
    let workload = status.workload.clone().expect("status.workload");
    assert_eq!(workload.exit_code, 137, "{workload:?}");
    assert!(workload.reason.is_some(), "{workload:?}");
    assert!(
        workload
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("last words before the kill"),
        "the log tail is kept: {workload:?}"
    );
    assert!(
        workload.started_at.is_some() && workload.finished_at.is_some(),
        "{workload:?}"
    );
    assert_eq!(
        status.read_back[0].phase,
        ReadBackPhase::Drained,
        "{status:?}"
    );
    let events = run_events(&bed.client, &bed.ns.name, "killed")
        .await
        .join("\n");
    assert!(
        events.contains("137"),
        "the exit code is in the Events:\n{events}"
    );
    let dest = files_get(&bed.ns.name, "killed", &bed.store_url, &[], &[])
        .unwrap_or_else(|e| panic!("files get failed: {e}"));
    assert_eq!(
        std::fs::read_to_string(extracted(&dest, 0).join("partial.txt")).expect("partial.txt"),
        "partial\n"
    );
}

#[tokio::test]
async fn an_image_missing_from_the_registry_fails_the_run_with_image_pull_failed() {
    let bed = RealBed::new("real-noimage").await;
    let mut spec = real_spec(Some("true"), &["/work/out"]);
    let registry = bed_setting("SANDBOXRUN_TEST_POD_REGISTRY");
    spec.image = Some(format!("{registry}/does-not-exist:1"));
    create(&bed.runs, "noimage", spec).await;
    let run = wait_run(&bed.runs, "noimage", "a final phase", &bed.op, final_phase).await;
    let status = run.status.expect("status");
    assert_eq!(status.phase, Some(Phase::Failed), "{status:?}");
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .expect("Ready condition");
    assert_eq!(ready.reason, "ImagePullFailed", "{ready:?}");
    assert!(
        ready.message.contains("not found"),
        "the kubelet's words are kept: {ready:?}"
    );
    let entry = &status.read_back[0];
    assert_eq!(
        entry.phase,
        ReadBackPhase::Empty,
        "nothing ran, nothing to drain: {entry:?}"
    );
    let events = run_events(&bed.client, &bed.ns.name, "noimage")
        .await
        .join("\n");
    assert!(events.contains("ImagePullFailed"), "{events}");
}

/// `hack/images.sh` builds reproducibly: rebuilding the base images from scratch pushes the very
/// digests the test bed started with (fixed owners and mtimes, sorted entries, no timestamps in
/// the config).
#[test]
fn the_base_images_rebuild_to_the_same_digests() {
    let before: Vec<String> = ["pause", "busybox"].iter().map(|n| image_ref(n)).collect();
    let out = Command::new(repo().join("hack/images.sh"))
        .arg("base")
        .output()
        .expect("run hack/images.sh base");
    assert!(
        out.status.success(),
        "hack/images.sh base: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(printed, before, "a rebuild must push the same digests");
}

/// The operator image and the Dockerfile (the production build) agree on what users rely on:
/// the binary's path, the user, the entrypoint and the default command.
#[test]
fn the_image_built_without_docker_matches_the_dockerfile() {
    let dockerfile = std::fs::read_to_string(repo().join("Dockerfile")).expect("Dockerfile");
    let last = |instr: &str| {
        dockerfile
            .lines()
            .filter_map(|l| l.strip_prefix(instr))
            .next_back()
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|| panic!("no {instr} in the Dockerfile"))
    };
    let user = last("USER ");
    let entrypoint: Vec<String> =
        serde_json::from_str(&last("ENTRYPOINT ")).expect("ENTRYPOINT in exec form");
    let cmd: Vec<String> = serde_json::from_str(&last("CMD ")).expect("CMD in exec form");
    let binary_path = last("COPY --from=builder ")
        .split_whitespace()
        .last()
        .expect("COPY destination")
        .trim_start_matches('/')
        .to_string();

    let crane = tools_bin().expect("tools bin").join("crane");
    let reference = operator_ref();
    let run = |args: &[&str]| -> Output {
        let out = Command::new(&crane).args(args).output().expect("run crane");
        assert!(
            out.status.success(),
            "crane {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    };
    let config: serde_json::Value =
        serde_json::from_slice(&run(&["config", "--insecure", &reference]).stdout)
            .expect("image config");
    let c = &config["config"];
    assert_eq!(c["User"], json!(user), "{config}");
    assert_eq!(c["Entrypoint"], json!(entrypoint), "{config}");
    assert_eq!(c["Cmd"], json!(cmd), "{config}");
    assert_eq!(config["os"], "linux");
    assert_eq!(config["architecture"], "amd64");

    // The filesystem: the binary where the Dockerfile puts it, executable, and no shell.
    let export = run(&["export", "--insecure", &reference, "-"]).stdout;
    let mut archive = tar::Archive::new(std::io::Cursor::new(export));
    let mut binary_mode = None;
    let mut names = Vec::new();
    for entry in archive.entries().expect("image tar") {
        let entry = entry.expect("tar entry");
        let name = entry.path().expect("entry path").display().to_string();
        if name.trim_start_matches("./") == binary_path {
            binary_mode = Some(entry.header().mode().expect("mode"));
        }
        names.push(name);
    }
    assert_eq!(
        binary_mode.map(|m| m & 0o777),
        Some(0o755),
        "{binary_path} missing or not 0755 in {names:?}"
    );
    for shell in ["bin/sh", "bin/bash", "bin/busybox"] {
        assert!(
            !names.iter().any(|n| n.trim_start_matches("./") == shell),
            "the operator image has no shell, found {shell}"
        );
    }
}
