//! The product on REAL containers: the real node of the test bed (kubelet + containerd + runc +
//! bridge CNI, `hack/real-node.sh`), images built without Docker (`hack/images.sh`) and pulled
//! from the local registry. What kwok cannot show is proven here: file permissions and uids across
//! the workload and the holder, `fsGroup`, Pod Security `restricted`, preStop and the grace
//! period, eviction, real exit codes and image pulls, exec through the kubelet.
//!
//! The operator runs on this host (the code under test, `target/debug`), except in the Helm test,
//! where the chart installs the operator image as pods with its own ServiceAccount. The holder of
//! every run pod is the operator image (`hack/images.sh operator`, built from this checkout).
//! Nothing here skips: without the real node or the image every test fails and says why.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, Namespace, Pod, Toleration};
use kube::api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use sandboxrun_operator::api::{
    Phase, ReadBack, ReadBackPath, ReadBackPhase, SandboxRun, SandboxRunSpec,
};
use serde_json::json;

use crate::support::*;

mod chaos;
mod pause;
mod session;
mod two_nodes;
mod upgrade;

const REAL_NODE_LABEL: &str = "sandbox.iterion.io/real-node";

/// The pinned operator image: `SANDBOXRUN_TEST_OPERATOR_IMAGE` when set (a branch's image pushed
/// beside `:dev`, e.g. `$(SANDBOXRUN_OPERATOR_TAG=mine hack/images.sh operator | tail -1)`), else
/// the `:dev` one `hack/images.sh operator` pinned.
fn operator_ref() -> String {
    match std::env::var("SANDBOXRUN_TEST_OPERATOR_IMAGE") {
        Ok(pinned) if !pinned.trim().is_empty() => pinned.trim().to_string(),
        _ => image_ref("sandboxrun-operator"),
    }
}

/// A pinned image reference `hack/images.sh` pushed (`busybox`, `sandboxrun-operator`).
fn image_ref(name: &str) -> String {
    let file = state_dir().join("images").join(format!("{name}.ref"));
    let text = std::fs::read_to_string(&file).unwrap_or_else(|e| {
        panic!(
            "no image {name} ({}: {e}). `hack/local-cluster.sh up` pushes busybox; \
             `hack/images.sh operator` builds and pushes the operator image (make test runs both)",
            file.display()
        )
    });
    text.trim().to_string()
}

/// The same reference as the real node pulls it (localhost:<port>/…).
fn pod_image(name: &str) -> String {
    pod_ref(&image_ref(name))
}

/// `pinned` (as pushed) as the real node pulls it (localhost:<port>/…).
fn pod_ref(pinned: &str) -> String {
    let pinned = pinned.to_string();
    let registry = bed_setting("SANDBOXRUN_TEST_POD_REGISTRY");
    match pinned.split_once('/') {
        Some((_, rest)) => format!("{registry}/{rest}"),
        None => pinned,
    }
}

/// The RuntimeClass the real-node runs are made with (issue #52): `SANDBOXRUN_TEST_RUNTIME_CLASS`,
/// none (the node's default, runc) when unset or empty. `hack/test.sh` runs this area twice: under
/// runc, then under `gvisor` (the bed's RuntimeClass for gVisor's runsc, `hack/real-node.sh`).
fn runtime_class() -> Option<String> {
    std::env::var("SANDBOXRUN_TEST_RUNTIME_CLASS")
        .ok()
        .map(|class| class.trim().to_string())
        .filter(|class| !class.is_empty())
}

/// Which real node the runs of [`real_spec`] land on: its [`REAL_NODE_LABEL`] value,
/// `SANDBOXRUN_TEST_REAL_NODE_VALUE` (`true`, the first node, when unset; `second`, the second:
/// `hack/test.sh` runs the core flows there too, issue #52).
fn real_node_value() -> String {
    std::env::var("SANDBOXRUN_TEST_REAL_NODE_VALUE")
        .ok()
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "true".to_string())
}

/// A spec that lands on the real node ([`real_node_value`]), runs busybox as uid 1000 and
/// declares `paths`, under [`runtime_class`].
fn real_spec(script: Option<&str>, paths: &[&str]) -> SandboxRunSpec {
    SandboxRunSpec {
        image: Some(pod_image("busybox")),
        runtime_class_name: runtime_class(),
        command: script.map(|s| vec!["sh".into(), "-c".into(), s.into()]),
        user: Some("1000:1000".into()),
        node_selector: Some(BTreeMap::from([(
            REAL_NODE_LABEL.to_string(),
            real_node_value(),
        )])),
        tolerations: Some(vec![Toleration {
            key: Some(REAL_NODE_LABEL.into()),
            operator: Some("Equal".into()),
            value: Some(real_node_value()),
            effect: Some("NoSchedule".into()),
            ..Toleration::default()
        }]),
        read_back: (!paths.is_empty()).then(|| ReadBack {
            paths: paths
                .iter()
                .map(|p| ReadBackPath {
                    path: p.to_string(),
                    ..Default::default()
                })
                .collect(),
            drain_timeout: Some("2m".into()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A namespace that enforces Pod Security `restricted` (the run pods must pass it).
async fn restricted_namespace(client: &Client, prefix: &str) -> TestNamespace {
    let ns = TestNamespace::new(client, prefix).await;
    let patch = json!({"metadata": {"labels": {
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": "latest",
    }}});
    Api::<Namespace>::all(client.clone())
        .patch(&ns.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("label the namespace restricted");
    ns
}

/// The operator under test on this host, with the operator image as the holder of run pods.
fn start_operator(ns: &str, store_url: &str) -> Operator {
    start_operator_with(ns, store_url, &[])
}

/// [`start_operator`] with more flags.
fn start_operator_with(ns: &str, store_url: &str, flags: &[&str]) -> Operator {
    let holder = pod_ref(&operator_ref());
    Operator::builder(ns, store_url)
        .flags(&[
            "--holder-image",
            &holder,
            "--holder-binary",
            "/usr/local/bin/sandboxrun-operator",
        ])
        .flags(flags)
        .start()
}

/// What every real-node test starts from: a client, a namespace enforcing `restricted`, a
/// `file://` store on this host, the operator under test watching the namespace, and its runs.
struct RealBed {
    client: Client,
    ns: TestNamespace,
    store_url: String,
    op: Operator,
    runs: Api<SandboxRun>,
}

impl RealBed {
    async fn new(tag: &str) -> RealBed {
        let client = client().await;
        ensure_crd(&client).await;
        let ns = restricted_namespace(&client, tag).await;
        let (_dir, store_url) = file_store(tag);
        let op = start_operator(&ns.name, &store_url);
        let runs = Api::namespaced(client.clone(), &ns.name);
        RealBed {
            client,
            ns,
            store_url,
            op,
            runs,
        }
    }
}

/// Waits until the run satisfies `done` (real pulls and container starts take seconds).
async fn wait_run(
    api: &Api<SandboxRun>,
    name: &str,
    what: &str,
    op: &Operator,
    done: impl Fn(&SandboxRun) -> bool,
) -> SandboxRun {
    wait_for_reporting(
        api,
        name,
        op,
        Duration::from_secs(180),
        what,
        done,
        node_report,
    )
    .await
}

/// What the real node says about itself, for a wait that timed out (issue #27: a run stuck
/// because the kubelet was evicting under DiskPressure said nothing of it): the node's
/// conditions, then the Events about the node and every `Evicted` Event, newest last.
fn node_report() -> String {
    let node = bed_setting("SANDBOXRUN_TEST_REAL_NODE");
    let kubectl_out = |args: &[&str]| {
        Command::new(kubectl())
            .args(args)
            .output()
            .map(|o| {
                format!(
                    "{}{}",
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                )
            })
            .unwrap_or_else(|e| format!("kubectl: {e}\n"))
    };
    let conditions = kubectl_out(&[
        "get",
        "node",
        &node,
        "-o",
        r#"jsonpath={range .status.conditions[*]}{.type}={.status} {.reason}: {.message}{"\n"}{end}"#,
    ]);
    let node_events = kubectl_out(&[
        "get",
        "events",
        "-A",
        "--field-selector",
        &format!("involvedObject.kind=Node,involvedObject.name={node}"),
        "--sort-by=.lastTimestamp",
    ]);
    let evictions = kubectl_out(&[
        "get",
        "events",
        "-A",
        "--field-selector",
        "reason=Evicted",
        "--sort-by=.lastTimestamp",
    ]);
    format!(
        "\n; the real node {node}'s conditions:\n{conditions}; its Events:\n{node_events}; Evicted Events:\n{evictions}"
    )
}

/// The report a timed-out wait prints names the node's pressure conditions.
#[test]
fn a_timed_out_wait_reports_the_nodes_pressure_conditions() {
    let report = node_report();
    for condition in [
        "MemoryPressure=",
        "DiskPressure=",
        "PIDPressure=",
        "Ready=True",
    ] {
        assert!(report.contains(condition), "{report}");
    }
}

fn phase_is(want: Phase) -> impl Fn(&SandboxRun) -> bool {
    move |r| phase(r) == Some(want)
}

fn final_phase(r: &SandboxRun) -> bool {
    phase(r).is_some_and(Phase::is_final)
}

/// The extracted directory of declared path `index` under a `files get` destination.
fn extracted(dest: &Path, index: usize) -> PathBuf {
    let prefix = format!("{index:02}-");
    std::fs::read_dir(dest)
        .expect("read files get output")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&prefix))
        })
        .unwrap_or_else(|| panic!("no {prefix}* directory in {}", dest.display()))
}

fn mode_of(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::symlink_metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

/// The Events about a run, oldest first, as "reason: note" lines.
async fn run_events(client: &Client, ns: &str, run: &str) -> Vec<String> {
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    let list = events
        .list(&ListParams::default().fields(&format!("involvedObject.name={run}")))
        .await
        .expect("list events");
    list.items
        .iter()
        .map(|e| {
            format!(
                "{}: {}",
                e.reason.as_deref().unwrap_or(""),
                e.message.as_deref().unwrap_or("")
            )
        })
        .collect()
}

/// Runs crictl against the real node's containerd; fails the test on an error.
fn crictl(args: &[&str]) -> Output {
    let sock = format!(
        "unix://{}",
        state_dir()
            .join("node/containerd/containerd.sock")
            .display()
    );
    let out = Command::new(tools_bin().expect("tools bin").join("crictl"))
        .args(["--runtime-endpoint", &sock, "--timeout", "10s"])
        .args(args)
        .output()
        .expect("run crictl");
    assert!(
        out.status.success(),
        "crictl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Containers of `pod` the container runtime still runs (asked of containerd through crictl:
/// the API object can be gone while the kubelet still runs its containers).
fn running_containers(ns: &str, pod: &str) -> Vec<String> {
    let crictl = tools_bin().expect("tools bin").join("crictl");
    let sock = format!(
        "unix://{}",
        state_dir()
            .join("node/containerd/containerd.sock")
            .display()
    );
    let out = Command::new(crictl)
        .args([
            "--runtime-endpoint",
            &sock,
            "--timeout",
            "10s",
            "ps",
            "-o",
            "json",
        ])
        .args(["--label", &format!("io.kubernetes.pod.name={pod}")])
        .args(["--label", &format!("io.kubernetes.pod.namespace={ns}")])
        .output()
        .expect("run crictl");
    assert!(
        out.status.success(),
        "crictl ps: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("crictl json");
    v["containers"]
        .as_array()
        .map(|cs| {
            cs.iter()
                .filter(|c| c["state"] == "CONTAINER_RUNNING")
                .map(|c| c["metadata"]["name"].as_str().unwrap_or("?").to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// Asserts the pod's containers stop within `limit` once the drain is recorded (the holder's
/// preStop returns on the drained marker; without it the kubelet holds them for the whole grace
/// period, drainTimeout + 30 s = 150 s here).
async fn containers_gone_within(ns: &str, pod: &str, limit: Duration) -> Duration {
    let start = Instant::now();
    loop {
        let left = running_containers(ns, pod);
        if left.is_empty() {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < limit,
            "{pod}: containers {left:?} still running {:?} after the drain was recorded",
            start.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

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
    let deleted = Command::new(kubectl())
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

/// The id of a pod's container as containerd knows it.
fn container_id(ns: &str, pod: &str, container: &str) -> Option<String> {
    let out = crictl(&[
        "ps",
        "-q",
        "--label",
        &format!("io.kubernetes.pod.name={pod}"),
        "--label",
        &format!("io.kubernetes.pod.namespace={ns}"),
        "--name",
        &format!("^{container}$"),
    ]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .map(str::to_string)
}

/// `runsc <args>` on the real node's gVisor sandboxes (their state under the node's containerd).
fn runsc(args: &[&str]) -> Output {
    Command::new(bed_setting("SANDBOXRUN_TEST_RUNSC"))
        .arg("--root")
        .arg(state_dir().join("node/containerd/runsc-state/k8s.io"))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("runsc {args:?}: {e}"))
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

/// A Helm release that is uninstalled when dropped (before its namespace goes, so its
/// cluster-scoped objects — ClusterRoles, the webhook configuration — go with it).
struct HelmRelease {
    name: String,
    namespace: String,
    /// The namespaces its operator watches.
    runs_namespaces: Vec<String>,
}

impl Drop for HelmRelease {
    fn drop(&mut self) {
        if std::env::var_os("SANDBOXRUN_KEEP_NAMESPACES").is_some() {
            return;
        }
        // The runs first, while the release's operator still runs: it holds their drain
        // finalizer, and once it is uninstalled nothing releases it (the namespace then stays
        // Terminating for good).
        for ns in &self.runs_namespaces {
            let mut cmd = tool("kubectl");
            cmd.args([
                "delete",
                "sandboxruns",
                "--all",
                "-n",
                ns,
                "--wait",
                "--timeout",
                "90s",
            ]);
            let _ = run(cmd, None);
        }
        let _ = run_helm(&[
            "uninstall",
            &self.name,
            "-n",
            &self.namespace,
            "--wait",
            "--timeout",
            "2m",
        ]);
    }
}

fn kubectl_apply(ns: &str, manifest: &str) -> Output {
    let mut cmd = tool("kubectl");
    cmd.args(["apply", "-n", ns, "-f", "-"]);
    run(cmd, Some(manifest.as_bytes()))
}

/// `helm install` of charts/ into `release_ns` as release `fullname`, with the operator image
/// built without Docker, the S3 store of the bed (credentials in a Secret, as
/// config/samples/s3-store.yaml says), the operator on the real node, and `values` on top (each
/// top-level key replaces the default). Waits until the release is ready; fails with the pods'
/// description when it is not.
fn install_operator_by_helm(
    release_ns: &str,
    fullname: &str,
    store_url: &str,
    values: serde_json::Value,
) -> HelmRelease {
    let chart = repo().join("charts/sandboxrun-operator");
    install_chart_by_helm(
        (release_ns, fullname),
        store_url,
        values,
        (&chart, &pod_ref(&operator_ref())),
    )
}

/// [`install_operator_by_helm`] of `chart` (a directory or a packaged .tgz) with the operator
/// image `image` (pinned, as the real node pulls it).
fn install_chart_by_helm(
    (release_ns, fullname): (&str, &str),
    store_url: &str,
    values: serde_json::Value,
    (chart, image): (&Path, &str),
) -> HelmRelease {
    let s3 = s3();
    let secret = json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "store", "namespace": release_ns},
        "stringData": {
            "AWS_ACCESS_KEY_ID": s3.access_key,
            "AWS_SECRET_ACCESS_KEY": s3.secret_key,
            "AWS_REGION": "us-east-1",
        },
    });
    let applied = kubectl_apply(release_ns, &secret.to_string());
    assert!(applied.status.success(), "{applied:?}");
    let values_file = helm_values_file(fullname, store_url, values.clone(), image);
    let runs_namespaces = values["watchNamespaces"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|n| n.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let release = HelmRelease {
        name: fullname.to_string(),
        namespace: release_ns.to_string(),
        runs_namespaces,
    };
    let installed = run_helm(&[
        "install",
        fullname,
        &chart.display().to_string(),
        "-n",
        release_ns,
        "-f",
        &values_file.display().to_string(),
        "--wait",
        "--timeout",
        "4m",
    ]);
    if !installed.status.success() {
        panic!(
            "helm install failed: {}\n{}",
            String::from_utf8_lossy(&installed.stderr),
            describe_pods(release_ns)
        );
    }
    release
}

/// The values file of a release `fullname` on the real node: the bed's S3 store at `store_url`
/// (its credentials in the Secret `store`), the operator image `image` (pinned, as the real node
/// pulls it; empty: none, the chart's own), and `values` on top (each top-level key replaces the
/// default).
fn helm_values_file(
    fullname: &str,
    store_url: &str,
    values: serde_json::Value,
    image: &str,
) -> PathBuf {
    let mut all = json!({
        "fullnameOverride": fullname,
        "store": {
            "url": store_url,
            "existingSecret": "store",
            "options": [
                format!("endpoint={}", bed_setting("SANDBOXRUN_TEST_POD_S3_ENDPOINT")),
                "allow_http=true",
            ],
        },
        "readBack": {"drainTimeout": "2m"},
        "log": {"format": "text"},
        "nodeSelector": {REAL_NODE_LABEL: "true"},
        "tolerations": [real_node_toleration()],
    });
    if let Some((repository, digest)) = image.split_once('@') {
        all["image"] = json!({"repository": repository, "digest": digest});
    } else {
        assert!(image.is_empty(), "a pinned image, or none: {image}");
    }
    if let (Some(all), serde_json::Value::Object(extra)) = (all.as_object_mut(), values) {
        all.extend(extra);
    }
    let file = host_dir("helm-values").join(format!("{fullname}-{}.json", rand_u32()));
    std::fs::write(&file, all.to_string()).expect("write values");
    file
}

/// `kubectl describe pods` of `ns`, for a failed install's message.
fn describe_pods(ns: &str) -> String {
    Command::new(kubectl())
        .args(["describe", "pods", "-n", ns])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
        .unwrap_or_default()
}

/// The toleration of the real node's taint, as a chart value.
fn real_node_toleration() -> serde_json::Value {
    json!({"key": REAL_NODE_LABEL, "operator": "Equal", "value": "true", "effect": "NoSchedule"})
}

/// The operator as users install it: `helm install` of charts/ with the image built without
/// Docker, two replicas (active-active, sharing the shard Leases), the S3 store, the webhook behind the chart's Service.
/// It runs in the cluster with only the chart's ServiceAccount and RBAC; the apiserver reaches
/// its webhook through the Service (denial of a bad run, a warning for a tag, via `kubectl
/// apply`); a run on the real node is drained into S3; `/metrics` answers through its Service.
#[tokio::test]
async fn the_operator_installed_by_helm_runs_in_cluster_with_webhook_election_and_metrics() {
    let client = client().await;
    ensure_crd(&client).await;
    let release_ns = TestNamespace::new(&client, "helm").await;
    let runs_ns = restricted_namespace(&client, "helm-runs").await;
    let s3 = s3();
    let fullname = format!("sbr-{:08x}", rand_u32());
    let store_url = format!("s3://{}/helm-{fullname}", s3.bucket);
    let _release = install_operator_by_helm(
        &release_ns.name,
        &fullname,
        &store_url,
        json!({
            "replicas": 2,
            "watchNamespaces": [runs_ns.name],
            // Only this test's namespace goes through this release's webhook.
            "webhook": {"namespaceSelector": {"matchLabels": {"sandboxrun-test": runs_ns.name}}},
            // `helm test`: its tiny run in the watched namespace, on the real node.
            "test": {
                "image": pod_image("busybox"),
                "timeout": "3m",
                "nodeSelector": {REAL_NODE_LABEL: "true"},
                "tolerations": [real_node_toleration()],
            },
        }),
    );
    let operator_pods: Api<Pod> = Api::namespaced(client.clone(), &release_ns.name);
    // The operator's own pods (the chart's egress proxy runs beside them).
    let pod_names: Vec<String> = operator_pods
        .list(&ListParams::default().labels("app.kubernetes.io/component=controller"))
        .await
        .expect("list operator pods")
        .items
        .iter()
        .map(|p| p.name_any())
        .collect();
    assert_eq!(pod_names.len(), 2, "two replicas: {pod_names:?}");
    let logs = || {
        pod_names
            .iter()
            .map(|p| {
                Command::new(kubectl())
                    .args(["logs", "-n", &release_ns.name, p, "--tail", "40"])
                    .output()
                    .map(|o| format!("--- {p}\n{}", String::from_utf8_lossy(&o.stdout)))
                    .unwrap_or_default()
            })
            .collect::<Vec<_>>()
            .join("\n")
    };

    // Two replicas run active-active by default (issue #28): each holds some of the shard Leases
    // (`<lease-name>-shard-<k>`, the lease name being the release's fullname).
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), &release_ns.name);
    let holders = eventually(
        "both replicas to hold shards",
        Duration::from_secs(90),
        || {
            let leases = leases.clone();
            let prefix = format!("{fullname}-shard-");
            let pod_names = pod_names.clone();
            async move {
                let listed = leases.list(&ListParams::default()).await.ok()?.items;
                let holders: std::collections::BTreeSet<String> = listed
                    .iter()
                    .filter(|l| l.name_any().starts_with(&prefix))
                    .filter_map(|l| l.spec.as_ref()?.holder_identity.clone())
                    .filter(|h| !h.is_empty())
                    .collect();
                (pod_names.iter().all(|p| holders.contains(p))).then_some(holders)
            }
        },
    )
    .await;
    assert!(
        holders.iter().all(|h| pod_names.contains(h)),
        "the shard holders {holders:?} are the replicas {pod_names:?}"
    );

    // The webhook, reached by the apiserver through the chart's Service: a run breaking the
    // ADR-006 rules is denied with its hints (retried while the caBundle is being published).
    let registry = bed_setting("SANDBOXRUN_TEST_POD_REGISTRY");
    let bad = format!(
        "apiVersion: sandbox.iterion.io/v1alpha1\nkind: SandboxRun\nmetadata: {{name: bad}}\n\
         spec: {{image: {registry}/busybox:1.35, user: \"1000\", hostState: auto, \
         readBack: {{paths: [{{path: /work/out}}]}}}}\n"
    );
    let denial = eventually("the webhook to answer", Duration::from_secs(90), || {
        let out = kubectl_apply(&runs_ns.name, &bad);
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        let answered = !out.status.success() && stderr.contains("denied the request");
        async move { answered.then_some(stderr) }
    })
    .await;
    assert!(
        denial.contains("hostState"),
        "the denial names the rule: {denial}"
    );

    // A tag instead of a digest is admitted with a warning, and the run drains into S3.
    let good = format!(
        "apiVersion: sandbox.iterion.io/v1alpha1\nkind: SandboxRun\nmetadata: {{name: good}}\n\
         spec:\n  image: {registry}/busybox:1.35\n  user: \"1000:1000\"\n  command: [sh, -c, \
         'echo from-helm > $ITERION_ARTIFACT_FILES_DIR/report.txt']\n  nodeSelector: \
         {{{REAL_NODE_LABEL}: \"true\"}}\n  tolerations: [{{key: {REAL_NODE_LABEL}, operator: \
         Equal, value: \"true\", effect: NoSchedule}}]\n  readBack: {{paths: [{{path: \
         /work/out}}], drainTimeout: 2m}}\n"
    );
    let admitted = kubectl_apply(&runs_ns.name, &good);
    let stderr = String::from_utf8_lossy(&admitted.stderr).to_string();
    assert!(admitted.status.success(), "{stderr}");
    assert!(
        stderr.contains("Warning:"),
        "a tag draws a warning: {stderr}"
    );

    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &runs_ns.name);
    let start = Instant::now();
    let run = loop {
        let r = runs.get("good").await.expect("get run");
        if final_phase(&r) {
            break r;
        }
        assert!(
            start.elapsed() < Duration::from_secs(180),
            "run did not finish: {:?}\n{}",
            r.status,
            logs()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let status = run.status.expect("status");
    assert_eq!(
        status.phase,
        Some(Phase::Succeeded),
        "{status:?}\n{}",
        logs()
    );
    assert_eq!(
        status.read_back[0].phase,
        ReadBackPhase::Drained,
        "{status:?}"
    );
    let host_store_env = s3.host_env();
    let dest = files_get(&runs_ns.name, "good", &store_url, &[], &host_store_env)
        .unwrap_or_else(|e| panic!("files get failed: {e}"));
    assert_eq!(
        std::fs::read_to_string(extracted(&dest, 0).join("report.txt")).expect("report.txt"),
        "from-helm\n"
    );

    // /metrics through the chart's metrics Service (its ClusterIP, via kube-proxy): the leader
    // counted the drain. Each replica has its own registry, so scrape until the leader answers.
    let services: Api<k8s_openapi::api::core::v1::Service> =
        Api::namespaced(client.clone(), &release_ns.name);
    let svc = services
        .get(&format!("{fullname}-metrics"))
        .await
        .expect("metrics Service");
    let ip = svc
        .spec
        .and_then(|s| s.cluster_ip)
        .expect("metrics Service ClusterIP");
    let url = format!("http://{ip}:8080/metrics");
    let text = eventually(
        "the leader's metrics through the Service",
        Duration::from_secs(60),
        || {
            let url = url.clone();
            async move {
                let text = reqwest::get(&url).await.ok()?.text().await.ok()?;
                text.contains("sandboxrun_drains_total{phase=\"Drained\"} 1")
                    .then_some(text)
            }
        },
    )
    .await;
    assert!(text.contains("sandboxrun_"), "{text}");

    let chart = repo().join("charts/sandboxrun-operator");
    helm_test_passes_then_fails_when_the_run_cannot_drain(
        &client,
        &fullname,
        &release_ns.name,
        &runs_ns.name,
        &chart,
    )
    .await;
}

/// Issue #14 item 5: `helm test` of the release above. Its pod (the operator image, `selftest`)
/// creates a tiny run on the real node, which drains into S3, and deletes it: the test passes and
/// leaves no run behind. Then, with a workload that leaves only a file the holder cannot read
/// (`test.script`), the path ends `Failed`: `helm test` fails and the pod's log says why.
async fn helm_test_passes_then_fails_when_the_run_cannot_drain(
    client: &Client,
    release: &str,
    release_ns: &str,
    runs_ns: &str,
    chart: &Path,
) {
    let test_pod = format!("{release}-selftest");
    let pod_log = || {
        Command::new(kubectl())
            .args(["logs", "-n", release_ns, &test_pod])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
            .unwrap_or_default()
    };
    let tested = run_helm(&["test", release, "-n", release_ns, "--timeout", "5m"]);
    let stdout = String::from_utf8_lossy(&tested.stdout).to_string();
    assert!(
        tested.status.success(),
        "helm test failed: {stdout}{}\n{}",
        String::from_utf8_lossy(&tested.stderr),
        pod_log()
    );
    // Helm lists each test hook with its phase; the pod is among them.
    let phases: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("Phase:"))
        .map(str::trim)
        .collect();
    assert!(
        stdout.contains(&test_pod)
            && !phases.is_empty()
            && phases.iter().all(|p| *p == "Succeeded"),
        "{stdout}"
    );
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), runs_ns);
    let left = runs
        .list(&ListParams::default().labels("app.kubernetes.io/managed-by=helm-test"))
        .await
        .expect("list runs");
    assert!(
        left.items.is_empty(),
        "the selftest deleted its run: {left:?}"
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), release_ns);
    assert!(
        pods.get_opt(&test_pod).await.expect("get pod").is_none(),
        "a passing test pod is deleted (hook-succeeded)"
    );

    let unreadable = r#"echo locked > "$ITERION_ARTIFACT_FILES_DIR/locked.txt"; chmod 0000 "$ITERION_ARTIFACT_FILES_DIR/locked.txt""#;
    let upgraded = run_helm(&[
        "upgrade",
        release,
        &chart.display().to_string(),
        "-n",
        release_ns,
        "--reuse-values",
        "--set-string",
        &format!("test.script={unreadable}"),
        "--wait",
        "--timeout",
        "4m",
    ]);
    assert!(
        upgraded.status.success(),
        "helm upgrade: {}",
        String::from_utf8_lossy(&upgraded.stderr)
    );
    let tested = run_helm(&["test", release, "-n", release_ns, "--timeout", "5m"]);
    assert!(
        !tested.status.success(),
        "helm test passed with an undrainable run: {}",
        String::from_utf8_lossy(&tested.stdout)
    );
    let log = pod_log();
    assert!(
        log.contains("selftest: FAIL")
            && log.contains("path /work/out ended Failed, not Drained")
            && log.contains("locked.txt"),
        "the failed test pod says why: {log}\n{}",
        String::from_utf8_lossy(&tested.stderr)
    );
    let left = runs
        .list(&ListParams::default().labels("app.kubernetes.io/managed-by=helm-test"))
        .await
        .expect("list runs");
    assert!(
        left.items.is_empty(),
        "a failed selftest deletes its run too: {left:?}"
    );
}

/// What a run's workload does in the egress test: waits for the test's go-ahead (the enforcer has
/// programmed this pod), then tries each address directly and, when the operator gave it a proxy,
/// through the egress proxy, and writes one `name=ok|fail <answer>` line per attempt to its
/// termination message. busybox's applets are called through `busybox` (the image links only a
/// few); its wget has no timeout option, hence `timeout`.
const EGRESS_PROBE: &str = r#"bb=/bin/busybox
i=0; while [ ! -e /tmp/go ] && [ $i -lt 600 ]; do sleep 0.2; i=$((i+1)); done
try() {
  name=$1; shift
  if r=$($bb timeout 10 $bb wget -q -O - "$@" 2>&1); then echo "$name=ok $r"; else echo "$name=fail $r"; fi
}
{
  try direct_allowed -Y off "http://$ALLOWED/"
  try direct_denied -Y off "http://$DENIED/"
  if [ -n "${http_proxy:-}" ]; then
    echo "proxy_host=${http_proxy##*@}"
    # The bed has no cluster DNS: the proxy's Service name is swapped for its ClusterIP; the
    # scheme, the run's uid:token and the port stay the operator's.
    export http_proxy="${http_proxy%@*}@$PROXY_ADDR:${http_proxy##*:}"
    try proxy_allowed "http://$ALLOWED/"
    try proxy_denied "http://$DENIED/"
  fi
} > /dev/termination-log
cat /dev/termination-log
"#;

/// An HTTP server on `ip` (a port outside the NodePort range, which kube-router lets through to
/// local addresses before any policy) answering every request with `<name> from <peer address>`;
/// the peers it served, in order.
async fn echo_listener(ip: &str, name: &'static str) -> (String, Arc<Mutex<Vec<String>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind((ip, 0))
        .await
        .unwrap_or_else(|e| panic!("listen on {ip}: {e}"));
    let addr = listener.local_addr().expect("local addr");
    assert!(
        !(30000..=32767).contains(&addr.port()),
        "{addr} is in the NodePort range"
    );
    let peers = Arc::new(Mutex::new(Vec::new()));
    let seen = peers.clone();
    tokio::spawn(async move {
        while let Ok((mut conn, peer)) = listener.accept().await {
            let peer = peer.ip().to_string();
            seen.lock().expect("peers").push(peer.clone());
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") && got.len() < 64 * 1024 {
                    match tokio::time::timeout(Duration::from_secs(5), conn.read(&mut buf)).await {
                        Ok(Ok(n)) if n > 0 => got.extend_from_slice(&buf[..n]),
                        _ => break,
                    }
                }
                let body = format!("{name} from {peer}\n");
                let reply = format!(
                    "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(reply.as_bytes()).await;
                let _ = conn.shutdown().await;
            });
        }
    });
    (addr.to_string(), peers)
}

/// An IPv4 address of this host other than the real node's (its bridge's): pods reach it through
/// their gateway, so it is on the node network without being the node IP.
fn other_host_address(node_ip: &str) -> String {
    let out = Command::new("ip")
        .args(["-o", "-4", "addr", "show", "scope", "global"])
        .output()
        .expect("run ip addr");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(3))
        .filter_map(|cidr| cidr.split('/').next())
        .find(|a| *a != node_ip)
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no global IPv4 address on this host besides {node_ip}"))
}

/// The termination message of a finished run as `name -> answer` (`ok …` or `fail …`).
fn probe_lines(run: &SandboxRun) -> BTreeMap<String, String> {
    run.status
        .as_ref()
        .and_then(|s| s.workload.as_ref())
        .and_then(|w| w.message.clone())
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Starts the run's probe once the NetworkPolicy enforcer (kube-router, hack/real-node.sh) has
/// programmed its pod: a plugin applies a new pod's rules a moment after the pod got its address,
/// so the workload waits for the go-ahead instead of racing it. Returns the pod's IP.
async fn release_probe(pods: &Api<Pod>, ns: &str, run: &SandboxRun) -> String {
    let pod = pod_of(run);
    let ip = eventually(
        "the run's pod to get an IP",
        Duration::from_secs(120),
        || {
            let pods = pods.clone();
            let pod = pod.clone();
            async move { pods.get(&pod).await.ok()?.status?.pod_ip }
        },
    )
    .await;
    let rule = format!("-s {ip}/32 ");
    eventually(
        "kube-router to program the pod",
        Duration::from_secs(60),
        || {
            let out = Command::new("iptables")
                .args(["-t", "filter", "-S", "KUBE-ROUTER-FORWARD"])
                .output();
            let programmed = out
                .map(|o| String::from_utf8_lossy(&o.stdout).contains(&rule))
                .unwrap_or(false);
            async move { programmed.then_some(()) }
        },
    )
    .await;
    // A filtered run's pod starts with the egress gate (an init container): its IP exists while
    // the gate waits for the policy, and the workload container does not yet.
    eventually(
        "the workload container to run",
        Duration::from_secs(120),
        || {
            let pods = pods.clone();
            let pod = pod.clone();
            async move {
                pods.get(&pod)
                    .await
                    .ok()?
                    .status?
                    .container_statuses?
                    .into_iter()
                    .find(|c| c.name == "workload")?
                    .state?
                    .running
            }
        },
    )
    .await;
    let go = Command::new(kubectl())
        .args([
            "exec",
            "-n",
            ns,
            &pod,
            "-c",
            "workload",
            "--",
            "/bin/touch",
            "/tmp/go",
        ])
        .output()
        .expect("kubectl exec");
    assert!(go.status.success(), "{go:?}");
    ip
}

/// Issue 13 on the real node, where kube-router enforces NetworkPolicy (hack/real-node.sh): from
/// inside real containers, a run whose `spec.network` allows one address and denies another
/// (docs/contract.md "ADR-006 network rules: validated and enforced").
/// - Control: a run with open egress reaches BOTH addresses directly, so the network works and
///   the denied address is reachable without the policy.
/// - Filtered (`allowlist`: `<host>/32`, `10.244.0.0/24`, `!<node IP>/32`): the allowed address
///   is reached directly, the denied one is not (its listener never sees this pod); through the
///   chart's egress proxy (with the run's token), the allowed address is fetched — the listener
///   sees the proxy pod, not the run's — and the denied one is refused with 403.
#[tokio::test]
async fn a_runs_network_policy_and_egress_proxy_are_enforced_from_inside_a_real_container() {
    let client = client().await;
    ensure_crd(&client).await;
    let release_ns = TestNamespace::new(&client, "egress").await;
    let runs_ns = restricted_namespace(&client, "egress-runs").await;
    let fullname = format!("sbr-{:08x}", rand_u32());
    let store_url = format!("s3://{}/egress-{fullname}", s3().bucket);
    let _release = install_operator_by_helm(
        &release_ns.name,
        &fullname,
        &store_url,
        json!({
            "replicas": 1,
            "watchNamespaces": [runs_ns.name],
            "webhook": {"enabled": false},
            // Without the webhook no admission stamps its runs, and they tolerate the real
            // node's taint (a right of their author's: docs/contract.md "A run uses only its
            // author's rights"): this test is about egress, so the release trusts them.
            "unadmittedReferences": "trust",
            // The bed has no cluster DNS: the gate could not resolve the proxy's Service name
            // to anchor on it (docs/contract.md "A filtered run never has an unfiltered instant").
            "runNetworkPolicy": {"gate": {"anchor": false}},
            "egressProxy": {
                "replicas": 1,
                "pdb": {"enabled": false},
                "nodeSelector": {REAL_NODE_LABEL: "true"},
                "tolerations": [real_node_toleration()],
            },
        }),
    );
    let services: Api<k8s_openapi::api::core::v1::Service> =
        Api::namespaced(client.clone(), &release_ns.name);
    let proxy_svc = format!("{fullname}-egress-proxy");
    let proxy_addr = services
        .get(&proxy_svc)
        .await
        .expect("egress proxy Service")
        .spec
        .and_then(|s| s.cluster_ip)
        .expect("egress proxy ClusterIP");
    let proxy_pod_ips: Vec<String> = Api::<Pod>::namespaced(client.clone(), &release_ns.name)
        .list(&ListParams::default().labels("app.kubernetes.io/component=egress-proxy"))
        .await
        .expect("list egress proxy pods")
        .items
        .into_iter()
        .filter_map(|p| p.status?.pod_ip)
        .collect();
    assert!(!proxy_pod_ips.is_empty(), "the egress proxy runs");

    let node_ip = bed_setting("SANDBOXRUN_TEST_NODE_IP");
    let host_ip = other_host_address(&node_ip);
    let (allowed, allowed_peers) = echo_listener(&host_ip, "allowed").await;
    let (denied, denied_peers) = echo_listener(&node_ip, "denied").await;

    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &runs_ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &runs_ns.name);
    let probe_spec = |network: Option<sandboxrun_operator::api::NetworkPolicy>| {
        let mut spec = real_spec(Some(EGRESS_PROBE), &[]);
        spec.env = vec![
            env_var("ALLOWED", &allowed),
            env_var("DENIED", &denied),
            env_var("PROXY_ADDR", &proxy_addr),
        ];
        spec.network = network;
        spec
    };
    let finished = |name: &'static str| {
        let runs = runs.clone();
        async move {
            eventually("the probe run to finish", Duration::from_secs(180), || {
                let runs = runs.clone();
                async move { runs.get(name).await.ok().filter(final_phase) }
            })
            .await
        }
    };

    // Control: open egress, no NetworkPolicy.
    let open = create(&runs, "open", probe_spec(None)).await;
    let open = wait_for_pod_name(&runs, open).await;
    let open_ip = release_probe(&pods, &runs_ns.name, &open).await;
    let open_done = finished("open").await;
    let lines = probe_lines(&open_done);
    assert_eq!(
        lines.get("direct_allowed").map(String::as_str),
        Some(format!("ok allowed from {open_ip}").as_str()),
        "{:?}",
        open_done.status
    );
    assert_eq!(
        lines.get("direct_denied").map(String::as_str),
        Some(format!("ok denied from {open_ip}").as_str()),
        "without a policy the denied address is reachable: {:?}",
        open_done.status
    );
    assert!(
        !lines.contains_key("proxy_host"),
        "open egress gets no proxy: {lines:?}"
    );

    // Filtered: allowlist, one address allowed, the node IP carved out of the range it is in.
    let filtered = create(
        &runs,
        "filtered",
        probe_spec(filtered_network(&host_ip, &node_ip)),
    )
    .await;
    let filtered = wait_for_pod_name(&runs, filtered).await;
    let filtered_ip = release_probe(&pods, &runs_ns.name, &filtered).await;
    let done = finished("filtered").await;
    let lines = probe_lines(&done);
    let line = |k: &str| lines.get(k).cloned().unwrap_or_default();
    assert_eq!(
        line("direct_allowed"),
        format!("ok allowed from {filtered_ip}"),
        "{lines:?}"
    );
    assert!(
        line("direct_denied").starts_with("fail"),
        "the NetworkPolicy stops a direct connection to the denied address: {lines:?}"
    );
    assert_eq!(
        line("proxy_host"),
        format!("{proxy_svc}.{}.svc:3128", release_ns.name),
        "the operator pointed the workload at the chart's proxy: {lines:?}"
    );
    let through_proxy = line("proxy_allowed");
    assert!(
        proxy_pod_ips
            .iter()
            .any(|ip| through_proxy == format!("ok allowed from {ip}")),
        "the allowed address is fetched through the proxy (peer is a proxy pod {proxy_pod_ips:?}): {lines:?}"
    );
    let refused = line("proxy_denied");
    assert!(
        refused.starts_with("fail") && refused.contains("403"),
        "the proxy refuses the denied address with 403: {lines:?}"
    );
    // The denied listener only ever saw the control run.
    let denied_seen = denied_peers.lock().expect("peers").clone();
    assert_eq!(
        denied_seen,
        vec![open_ip.clone()],
        "peers of the denied address"
    );
    let allowed_seen = allowed_peers.lock().expect("peers").clone();
    assert!(allowed_seen.contains(&filtered_ip), "{allowed_seen:?}");

    // Warm (issue #39): a run made from a pooled template of the same policy takes the pool's
    // ready pod, and its FIRST instruction fetches through the proxy: the proxy knows the run
    // (its status recorded the template before the claim) and learns the claimed pod is the
    // run's (waiting a moment for its pod watch when the request comes first).
    warm_run_through_the_proxy(&client, &runs_ns.name, &proxy_pod_ips, |spec| {
        spec.env = probe_spec(None).env;
        spec.network = filtered_network(&host_ip, &node_ip);
    })
    .await;
}

/// The network of [`a_runs_network_policy_and_egress_proxy_are_enforced_from_inside_a_real_container`]'s
/// filtered runs.
fn filtered_network(
    host_ip: &str,
    node_ip: &str,
) -> Option<sandboxrun_operator::api::NetworkPolicy> {
    Some(sandboxrun_operator::api::NetworkPolicy {
        mode: sandboxrun_operator::api::NetworkMode::Allowlist,
        rules: vec![
            format!("{host_ip}/32"),
            "10.244.0.0/24".to_string(),
            format!("!{node_ip}/32"),
        ],
    })
}

/// A warm run's first instruction: a fetch of `$ALLOWED` through the proxy (its Service name
/// swapped for `$PROXY_ADDR`: the bed has no cluster DNS).
const WARM_PROXY_FIRST: &str = r#"export http_proxy="${http_proxy%@*}@$PROXY_ADDR:${http_proxy##*:}"
if r=$(/bin/busybox timeout 10 /bin/busybox wget -q -O - "http://$ALLOWED/" 2>&1); then echo "first=ok $r"; else echo "first=fail $r"; fi > /dev/termination-log"#;

/// A pool of one of a template (`shape` fills in its env and network) in `ns`, then a run made
/// from it whose first instruction is [`WARM_PROXY_FIRST`]: it takes the pool's pod, and the
/// fetch is served by a proxy pod.
async fn warm_run_through_the_proxy(
    client: &Client,
    ns: &str,
    proxy_pod_ips: &[String],
    shape: impl FnOnce(&mut SandboxRunSpec),
) {
    use sandboxrun_operator::api::{
        OpenField, SandboxRunPool, SandboxRunPoolSpec, SandboxRunTemplate, SandboxRunTemplateSpec,
        TemplateRef,
    };
    let mut spec = real_spec(Some("exit 9"), &[]);
    shape(&mut spec);
    let template = SandboxRunTemplate::new(
        "filtered-agent",
        SandboxRunTemplateSpec {
            template: spec,
            open_fields: vec![OpenField::Command],
        },
    );
    Api::<SandboxRunTemplate>::namespaced(client.clone(), ns)
        .create(&Default::default(), &template)
        .await
        .expect("create the template");
    let pools: Api<SandboxRunPool> = Api::namespaced(client.clone(), ns);
    let pool = SandboxRunPool::new(
        "filtered-agents",
        SandboxRunPoolSpec {
            template_ref: TemplateRef::namespaced("filtered-agent"),
            replicas: 1,
        },
    );
    pools
        .create(&Default::default(), &pool)
        .await
        .expect("create the pool");
    eventually(
        "the filtered pool's pod to be ready",
        Duration::from_secs(180),
        || {
            let pools = pools.clone();
            async move {
                let s = pools.get("filtered-agents").await.ok()?.status?;
                (s.ready_replicas == 1).then_some(())
            }
        },
    )
    .await;
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), ns);
    let warm = SandboxRunSpec {
        template_ref: Some(TemplateRef::namespaced("filtered-agent")),
        command: Some(vec!["sh".into(), "-c".into(), WARM_PROXY_FIRST.into()]),
        ..Default::default()
    };
    create(&runs, "warm", warm).await;
    let done = eventually("the warm run to end", Duration::from_secs(180), || {
        let runs = runs.clone();
        async move { runs.get("warm").await.ok().filter(final_phase) }
    })
    .await;
    let status = done.status.clone().expect("status");
    let took = status.warm_start.as_ref().and_then(|w| w.pod.clone());
    assert!(took.is_some(), "a pool pod was taken: {status:?}");
    let first = probe_lines(&done).get("first").cloned().unwrap_or_default();
    assert!(
        proxy_pod_ips
            .iter()
            .any(|ip| first == format!("ok allowed from {ip}")),
        "the warm run's first instruction was served by the proxy {proxy_pod_ips:?}: {first:?} {status:?}"
    );
}

/// The real node's kubelet port, as its Node says (the egress gate's default probe is the node's
/// kubelet port; the bed's is not 10250, which kwok has).
async fn real_kubelet_port(client: &Client) -> i32 {
    let node = Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
        .get(&bed_setting("SANDBOXRUN_TEST_REAL_NODE"))
        .await
        .expect("the real node");
    node.status
        .and_then(|s| s.daemon_endpoints)
        .and_then(|d| d.kubelet_endpoint)
        .map(|k| k.port)
        .expect("the real node's kubelet port")
}

/// The workload of [`a_filtered_runs_first_instruction_is_already_filtered`]: its FIRST
/// instruction connects to `$DENIED`, with no wait of any kind.
/// (It stays 5 s more, so that the test sees its pod's gate before the pod is deleted.)
const FIRST_INSTRUCTION_PROBE: &str = r#"if r=$(/bin/busybox timeout 5 /bin/busybox wget -q -O - -Y off "http://$DENIED/" 2>&1); then echo "first=ok $r"; else echo "first=fail $r"; fi > /dev/termination-log; sleep 5"#;

/// Issue 25 item 6 on the real node (docs/contract.md "A filtered run never has an unfiltered
/// instant"): kube-router programs a pod's NetworkPolicy only after the pod has its address, so a
/// workload that connects at once used to reach what its policy denies. With the egress gate (an
/// init container holding the workload until a probe the policy denies is refused):
/// - control: a run with open egress reaches the address in its first instruction (no gate);
/// - restricted: the same first instruction, from a run whose allowlist does not cover the
///   address, from a denylist run that lists it, and from a denylist run of another range (the
///   node is denied to a node-probed run once scheduled), is refused, the address's listener never
///   sees those pods, and each gate exited 0.
#[tokio::test]
async fn a_filtered_runs_first_instruction_is_already_filtered() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = restricted_namespace(&client, "gate").await;
    let (_dir, store_url) = file_store("gate");
    let probe = format!("node:{}", real_kubelet_port(&client).await);
    let op = start_operator_with(&ns.name, &store_url, &["--egress-gate-probe", &probe]);
    let node_ip = bed_setting("SANDBOXRUN_TEST_NODE_IP");
    let (denied, denied_peers) = echo_listener(&node_ip, "denied").await;
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let spec = |network: Option<sandboxrun_operator::api::NetworkPolicy>| {
        let mut spec = real_spec(Some(FIRST_INSTRUCTION_PROBE), &[]);
        spec.env = vec![env_var("DENIED", &denied)];
        spec.network = network;
        spec
    };
    let first_line = |run: &SandboxRun| probe_lines(run).get("first").cloned().unwrap_or_default();

    // Control: open egress, no gate, and the address is reached at once.
    create(&runs, "open", spec(None)).await;
    let open = wait_run(&runs, "open", "the open run to end", &op, final_phase).await;
    assert!(
        first_line(&open).starts_with("ok denied from"),
        "{:?}",
        open.status
    );

    // Restricted, three ways: an allowlist of a range that does not hold the node's address; a
    // denylist that lists the address (it used to start ungated and reach it at once); a denylist
    // of another range (the gate probes the node, so the node is denied to it once scheduled).
    let restricted = |mode, rule: &str| {
        spec(Some(sandboxrun_operator::api::NetworkPolicy {
            mode,
            rules: vec![rule.to_string()],
        }))
    };
    use sandboxrun_operator::api::NetworkMode::{Allowlist, Denylist};
    for (name, filtered) in [
        ("filtered", restricted(Allowlist, "192.0.2.0/24")),
        ("denylist-listed", restricted(Denylist, &node_ip)),
        ("denylist-other", restricted(Denylist, "192.0.2.0/24")),
    ] {
        create(&runs, name, filtered).await;
        let pod_name = pod_of(&wait_for_pod_name(&runs, runs.get(name).await.expect("run")).await);
        let gate = eventually("the egress gate to end", Duration::from_secs(120), || {
            let (pods, pod_name) = (pods.clone(), pod_name.clone());
            async move {
                pods.get(&pod_name)
                    .await
                    .ok()?
                    .status?
                    .init_container_statuses?
                    .into_iter()
                    .find(|c| c.name == "egress-gate")?
                    .state?
                    .terminated
            }
        })
        .await;
        assert_eq!(
            gate.exit_code, 0,
            "{name}: the gate saw the policy in force: {gate:?}"
        );
        let done = wait_run(&runs, name, "the restricted run to end", &op, final_phase).await;
        let line = first_line(&done);
        assert!(
            line.starts_with("fail"),
            "{name}: the first instruction was filtered: {line:?} {:?}",
            done.status
        );
        let seen = denied_peers.lock().expect("peers").clone();
        assert_eq!(
            seen.len(),
            1,
            "{name}: only the open run reached the denied address: {seen:?}"
        );
    }
}

/// A stand-in for the egress proxy on the real node: busybox's httpd on the proxy's port and on
/// its canary port (the same pod, so only a policy tells the two ports apart). Returns its IP.
async fn canary_proxy_stand_in(client: &Client, ns: &str) -> String {
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "proxy", "labels": {"app": "stand-in-proxy"}},
        "spec": {
            "nodeSelector": {REAL_NODE_LABEL: "true"},
            "tolerations": [real_node_toleration()],
            "securityContext": {"runAsNonRoot": true, "runAsUser": 1000,
                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "httpd",
                "image": pod_image("busybox"),
                "command": ["sh", "-c",
                    "/bin/busybox httpd -f -p 3128 & exec /bin/busybox httpd -f -p 3129"],
                "securityContext": {"allowPrivilegeEscalation": false,
                    "capabilities": {"drop": ["ALL"]}},
                "readinessProbe": {"tcpSocket": {"port": 3129}, "periodSeconds": 1},
            }],
        },
    }))
    .expect("the stand-in pod");
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    pods.create(&Default::default(), &pod)
        .await
        .expect("create the stand-in proxy");
    eventually(
        "the stand-in proxy to be ready",
        Duration::from_secs(120),
        || {
            let pods = pods.clone();
            async move {
                let status = pods.get("proxy").await.ok()?.status?;
                let ready = status
                    .conditions?
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True");
                ready.then_some(status.pod_ip?)
            }
        },
    )
    .await
}

/// The workload of [`a_gate_anchored_on_the_proxy_probes_its_canary_so_a_dead_node_probe_never_opens_it`]:
/// it only ends, 0.
const GATED_ONLY: &str = "echo started > /dev/termination-log";

/// Issue #38 item 4 on the real node (docs/contract.md "A filtered run never has an unfiltered
/// instant"): a probe where nothing listens reads as refused, so with the node probe at a closed
/// port (`node:1`, as on a node whose kubelet port is closed or firewalled for pods) the gate of
/// old opened at once whether or not any policy was in force. The gate of a run anchored on the
/// proxy now probes the proxy's canary (a stand-in: the same pod answers both ports):
/// - the namespace widened by its tenant (an allow-all egress NetworkPolicy: policies add up, so
///   the run's own is not in force): the canary answers, the gate stays shut and the run fails
///   `EgressNotEnforced` with the gate's words, its workload never started; so does a run that
///   also allows an address range the proxy is outside (`192.0.2.0/24`), whose gate used to
///   probe the node, one whose range holds the proxy's pod (its `/16`), and one that may reach
///   nothing (`allowlist` without rules): the gates of the last two probed the dead node port
///   until now and opened at once;
/// - without that policy: the canary is refused, the anchor answers, the gate exits 0 and the
///   run succeeds — the covering run too (while its gate waits its policy denies the proxy's
///   pod in that range: the operator watches the proxy's pods), and the one that may reach
///   nothing (its policy allows the proxy's port alone, its gate's anchor, by address).
#[tokio::test]
async fn a_gate_anchored_on_the_proxy_probes_its_canary_so_a_dead_node_probe_never_opens_it() {
    use sandboxrun_operator::api::NetworkMode::Allowlist;
    let client = client().await;
    ensure_crd(&client).await;
    let ns = restricted_namespace(&client, "canary").await;
    let proxy_ns = TestNamespace::new(&client, "canary-proxy").await;
    let proxy_ip = canary_proxy_stand_in(&client, &proxy_ns.name).await;
    let (dir, store_url) = file_store("canary");
    let secret = dir.join("token-secret");
    std::fs::create_dir_all(&dir).expect("store dir");
    std::fs::write(&secret, "canary-test-token-secret-0123456789").expect("token secret");
    let proxy_url = format!("http://{proxy_ip}:3128");
    let op = start_operator_with(
        &ns.name,
        &store_url,
        &[
            "--egress-gate-probe",
            "node:1",
            "--egress-gate-timeout",
            "15s",
            "--egress-proxy-url",
            &proxy_url,
            "--egress-proxy-namespace",
            &proxy_ns.name,
            "--egress-proxy-selector",
            "app=stand-in-proxy",
            "--egress-proxy-port",
            "3128",
            "--egress-proxy-canary-port",
            "3129",
            "--egress-token-secret-file",
            secret.to_str().expect("utf-8 path"),
        ],
    );
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let spec = || {
        let mut spec = real_spec(Some(GATED_ONLY), &[]);
        spec.network = Some(sandboxrun_operator::api::NetworkPolicy {
            mode: Allowlist,
            rules: vec!["example.com".to_string()],
        });
        spec
    };
    // The tenant widens its namespace: every pod may send anywhere.
    let allow_all: k8s_openapi::api::networking::v1::NetworkPolicy =
        serde_json::from_value(json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": "allow-all-egress"},
            "spec": {"podSelector": {}, "policyTypes": ["Egress"], "egress": [{}]},
        }))
        .expect("policy");
    let policies: Api<k8s_openapi::api::networking::v1::NetworkPolicy> =
        Api::namespaced(client.clone(), &ns.name);
    policies
        .create(&Default::default(), &allow_all)
        .await
        .expect("create the allow-all policy");
    // (Its pod goes as soon as the run fails: the gate's words are read from the run.)
    create(&runs, "widened", spec()).await;
    // A run that also allows an address range the proxy is not in: its gate probes the canary
    // too (before, any range sent it to the node's probe, which, dead, opened it at once).
    let mut ranged = spec();
    if let Some(network) = ranged.network.as_mut() {
        network.rules.push("192.0.2.0/24".to_string());
    }
    create(&runs, "widened-ranged", ranged).await;
    // A run allowing a range that holds the proxy's pod: before, its gate probed the node.
    let covering = || {
        let octets: Vec<&str> = proxy_ip.split('.').collect();
        let mut spec = spec();
        if let (Some(network), [a, b, ..]) = (spec.network.as_mut(), octets.as_slice()) {
            network.rules.push(format!("{a}.{b}.0.0/16"));
        }
        spec
    };
    create(&runs, "widened-covering", covering()).await;
    // A run that may reach nothing: its gate probed the dead node port and opened at once; now
    // it is anchored on the proxy by address (the flag's URL names it by address here).
    let nothing = || {
        let mut spec = spec();
        if let Some(network) = spec.network.as_mut() {
            network.rules.clear();
        }
        spec
    };
    create(&runs, "widened-nothing", nothing()).await;
    for name in [
        "widened",
        "widened-ranged",
        "widened-covering",
        "widened-nothing",
    ] {
        let done = wait_run(&runs, name, "the widened run to fail", &op, final_phase).await;
        let status = done.status.clone().unwrap_or_default();
        assert_eq!(status.phase, Some(Phase::Failed), "{name}: {status:?}");
        let said = status.message.clone().unwrap_or_default();
        assert!(
            said.contains(&format!("{proxy_ip}:3129")) && said.contains("still reachable"),
            "{name}: the gate, shut, names the canary: {said:?}"
        );
        assert!(
            status.workload.is_none() || status.exit_code.is_none(),
            "{name}: the workload never started: {status:?}"
        );
        assert!(
            status
                .conditions
                .iter()
                .any(|c| c.reason == "EgressNotEnforced"),
            "{name}: {status:?}"
        );
    }

    // Without the tenant's policy the run's own is in force: the canary is refused.
    policies
        .delete("allow-all-egress", &Default::default())
        .await
        .expect("delete the allow-all policy");
    create(&runs, "enforced", spec()).await;
    create(&runs, "enforced-covering", covering()).await;
    create(&runs, "enforced-nothing", nothing()).await;
    // Each gate opened (the canary refused, the anchor answered): a shut one fails its run
    // `EgressNotEnforced` before the workload starts.
    for name in ["enforced", "enforced-covering", "enforced-nothing"] {
        let done = wait_run(&runs, name, "the enforced run to end", &op, final_phase).await;
        assert_eq!(
            phase(&done),
            Some(Phase::Succeeded),
            "{name}: {:?}",
            done.status
        );
    }
}

/// The workload of [`no_run_reaches_what_its_namespaces_default_deny_egress_policy_denies`]:
/// waits for the test's go-ahead (the enforcer has programmed this pod), then tries `$HOST`
/// directly and writes `host=ok|fail <answer>` to its termination message.
const HOST_PROBE: &str = r#"bb=/bin/busybox
i=0; while [ ! -e /tmp/go ] && [ $i -lt 600 ]; do sleep 0.2; i=$((i+1)); done
if r=$($bb timeout 10 $bb wget -q -O - -Y off "http://$HOST/" 2>&1); then echo "host=ok $r"; else echo "host=fail $r"; fi > /dev/termination-log
cat /dev/termination-log
"#;

/// Issue #38 item 2 on the real node (docs/contract.md "ADR-006 network rules: validated and
/// enforced"): NetworkPolicies add up, so a run's own policy must never allow what its
/// namespace's policies deny. In a namespace whose own policy denies all egress:
/// - control, before that policy exists: an open run reaches a listener on this host;
/// - with it: an open run, an allowlist run (`192.0.2.0/24`) and a denylist run
///   (`203.0.113.0/24`, whose policy used to allow `0.0.0.0/0` minus that range) all fail to
///   reach the same listener, which never sees their pods.
#[tokio::test]
async fn no_run_reaches_what_its_namespaces_default_deny_egress_policy_denies() {
    use sandboxrun_operator::api::NetworkMode::{Allowlist, Denylist};
    let client = client().await;
    ensure_crd(&client).await;
    let ns = restricted_namespace(&client, "deny-ns").await;
    let (_dir, store_url) = file_store("deny-ns");
    let probe = format!("node:{}", real_kubelet_port(&client).await);
    let op = start_operator_with(&ns.name, &store_url, &["--egress-gate-probe", &probe]);
    let node_ip = bed_setting("SANDBOXRUN_TEST_NODE_IP");
    let host_ip = other_host_address(&node_ip);
    let (host, host_peers) = echo_listener(&host_ip, "host").await;
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let spec = |network: Option<sandboxrun_operator::api::NetworkPolicy>| {
        let mut spec = real_spec(Some(HOST_PROBE), &[]);
        spec.env = vec![env_var("HOST", &host)];
        spec.network = network;
        spec
    };
    let restricted = |mode, rule: &str| {
        spec(Some(sandboxrun_operator::api::NetworkPolicy {
            mode,
            rules: vec![rule.to_string()],
        }))
    };
    let host_line = |run: &SandboxRun| probe_lines(run).get("host").cloned().unwrap_or_default();

    // Control: no policy in the namespace yet, and an open run reaches the listener.
    let control = create(&runs, "control", spec(None)).await;
    let control = wait_for_pod_name(&runs, control).await;
    let control_ip = release_probe(&pods, &ns.name, &control).await;
    let done = wait_run(&runs, "control", "the control run to end", &op, final_phase).await;
    assert_eq!(
        host_line(&done),
        format!("ok host from {control_ip}"),
        "without a policy the host is reachable: {:?}",
        done.status
    );

    // The namespace's own policy: no pod of it may send anything anywhere.
    let default_deny: k8s_openapi::api::networking::v1::NetworkPolicy =
        serde_json::from_value(json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": "default-deny-egress"},
            "spec": {"podSelector": {}, "policyTypes": ["Egress"], "egress": []},
        }))
        .expect("a NetworkPolicy");
    Api::<k8s_openapi::api::networking::v1::NetworkPolicy>::namespaced(client.clone(), &ns.name)
        .create(&kube::api::PostParams::default(), &default_deny)
        .await
        .expect("create the namespace's default-deny egress policy");

    // An allowlist of a range that holds the listener's address allows it explicitly (the run
    // asked for it): the range must be one this host's address is not in (the bed's machine has
    // had 192.0.2.2 on eth0).
    let allowlisted = ["198.51.100.0/24", "192.0.2.0/24"]
        .into_iter()
        .find(|cidr| !host_ip.starts_with(&cidr[..cidr.len() - 4]))
        .expect("a documentation range without this host's address");
    for (name, run_spec) in [
        ("open", spec(None)),
        ("allowlist", restricted(Allowlist, allowlisted)),
        ("denylist", restricted(Denylist, "203.0.113.0/24")),
    ] {
        let run = create(&runs, name, run_spec).await;
        let run = wait_for_pod_name(&runs, run).await;
        release_probe(&pods, &ns.name, &run).await;
        let done = wait_run(&runs, name, "the run to end", &op, final_phase).await;
        let line = host_line(&done);
        assert!(
            line.starts_with("fail"),
            "{name}: the namespace's default-deny holds: {line:?} {:?}",
            done.status
        );
        let seen = host_peers.lock().expect("peers").clone();
        assert_eq!(
            seen,
            vec![control_ip.clone()],
            "{name}: only the control run reached the host"
        );
    }
}

/// The run, once its status names its pod.
async fn wait_for_pod_name(runs: &Api<SandboxRun>, run: SandboxRun) -> SandboxRun {
    let name = run.name_any();
    eventually(
        "the run's pod to be created",
        Duration::from_secs(120),
        || {
            let runs = runs.clone();
            let name = name.clone();
            async move {
                runs.get(&name)
                    .await
                    .ok()
                    .filter(|r| r.status.as_ref().is_some_and(|s| s.pod_name.is_some()))
            }
        },
    )
    .await
}

fn env_var(name: &str, value: &str) -> sandboxrun_operator::api::EnvVar {
    sandboxrun_operator::api::EnvVar {
        name: name.into(),
        value: value.into(),
        value_from: None,
    }
}

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

/// The pid of the packer draining `holder_path` on this host (the real node shares the host's
/// process table), once it runs.
fn packer_pid(holder_path: &str) -> Option<u32> {
    let wanted = format!("\0pack\0{holder_path}\0");
    std::fs::read_dir("/proc").ok()?.find_map(|entry| {
        let entry = entry.ok()?;
        let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
        String::from_utf8_lossy(&cmdline)
            .contains(&wanted)
            .then_some(pid)
    })
}

/// Whether a drain's packer runs in the pod's holder. Under runc it is a host process
/// ([`packer_pid`]); under gVisor a sandbox's processes are the sentry's, invisible in the host's
/// /proc: `runsc ps` lists the holder container's, and a second operator process beside the
/// holder's own is the packer the drain exec'd.
fn packer_running(ns: &str, pod: &str, holder_path: &str) -> bool {
    if runtime_class().is_none() {
        return packer_pid(holder_path).is_some();
    }
    let Some(id) = container_id(ns, pod, "holder") else {
        return false;
    };
    let out = runsc(&["ps", &id]);
    let listing = String::from_utf8_lossy(&out.stdout);
    listing
        .lines()
        .filter(|line| line.contains("sandboxrun"))
        .count()
        >= 2
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

/// `kubectl exec` of `sh -c script` in the workload container of `pod`.
fn exec_in_workload(ns: &str, pod: &str, script: &str) -> Output {
    Command::new(kubectl())
        .args([
            "exec", "-n", ns, pod, "-c", "workload", "--", "sh", "-c", script,
        ])
        .output()
        .expect("kubectl exec")
}

/// Issue #27: every sample in config/samples runs on the bed to the end its header documents,
/// applied as a user would (`kubectl apply -f`, the bed registry's address for `localhost:15000`).
/// - batch-run.yaml: Complete (`Succeeded`), `/work/out` drained with its report;
/// - long-lived-sandbox.yaml (with its ConfigMap): Running until `stop`, a file written through
///   `kubectl exec` drained, the untouched path `Empty`, phase `Stopped`;
/// - real-node-run.yaml (`make demo`'s): Complete;
/// - retries.yaml: Complete on its third attempt, the first attempt's files readable;
/// - kueue.yaml (the operator with `--kueue`, Kueue on the bed): admitted (`Queued=False
///   Admitted`), Complete, its Workload Finished.
#[tokio::test]
async fn every_sample_runs_on_the_bed_to_its_documented_end() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = restricted_namespace(&client, "real-samples").await;
    let (_dir, store_url) = file_store("real-samples");
    let probe = format!("node:{}", real_kubelet_port(&client).await);
    let op = start_operator_with(
        &ns.name,
        &store_url,
        &["--egress-gate-probe", &probe, "--kueue"],
    );
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let registry = bed_setting("SANDBOXRUN_TEST_POD_REGISTRY");
    let samples = repo().join("config/samples");
    let listed =
        std::fs::read_to_string(samples.join("kustomization.yaml")).expect("kustomization");
    for file in ["batch-run.yaml", "long-lived-sandbox.yaml"] {
        assert!(
            listed.contains(file),
            "{file} is in config/samples' kustomization"
        );
    }
    for file in [
        "batch-run.yaml",
        "long-lived-sandbox.yaml",
        "real-node-run.yaml",
        "retries.yaml",
        "kueue.yaml",
    ] {
        let text = std::fs::read_to_string(samples.join(file)).expect("sample");
        let text = text.replace("localhost:15000/", &format!("{registry}/"));
        let mut apply = tool("kubectl");
        apply.args(["apply", "-n", &ns.name, "-f", "-"]);
        let out = run(apply, Some(text.as_bytes()));
        assert!(out.status.success(), "kubectl apply {file}: {out:?}");
    }

    for name in ["batch-report", "demo-report"] {
        let done = wait_run(&runs, name, "a final phase", &op, final_phase).await;
        let status = done.status.clone().expect("status");
        assert_eq!(status.phase, Some(Phase::Succeeded), "{name}: {status:?}");
        assert_eq!(status.read_back[0].phase, ReadBackPhase::Drained, "{name}");
    }
    let dest = files_get(&ns.name, "batch-report", &store_url, &[], &[])
        .unwrap_or_else(|e| panic!("files get failed: {e}"));
    let report = std::fs::read_to_string(extracted(&dest, 0).join("report.md")).expect("report");
    assert!(report.contains("samples: 1000"), "{report}");
    // kueue.yaml: admitted, Complete, its Workload Finished.
    let queued = wait_run(&runs, "queued-report", "a final phase", &op, final_phase).await;
    let status = queued.status.clone().expect("status");
    assert_eq!(status.phase, Some(Phase::Succeeded), "{status:?}");
    assert!(
        status
            .conditions
            .iter()
            .any(|c| c.type_ == "Queued" && c.status == "False" && c.reason == "Admitted"),
        "{status:?}"
    );
    let workloads: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns.name,
        &sandboxrun_operator::kueue::workload_resource(),
    );
    let finished = eventually(
        "its Workload to be Finished",
        Duration::from_secs(60),
        || {
            let workloads = workloads.clone();
            async move {
                let w = workloads.get("queued-report-sbr").await.ok()?;
                let conditions = w.data["status"]["conditions"].as_array()?.clone();
                conditions
                    .iter()
                    .any(|c| c["type"] == "Finished" && c["status"] == "True")
                    .then_some(())
            }
        },
    )
    .await;
    let () = finished;
    // retries.yaml: two failed attempts, then Complete, each attempt's report kept.
    let flaky = wait_run(&runs, "flaky-job", "a final phase", &op, final_phase).await;
    let status = flaky.status.clone().expect("status");
    assert_eq!(status.phase, Some(Phase::Succeeded), "{status:?}");
    assert_eq!(status.attempts.len(), 2, "{status:?}");
    let first = files_get_attempt(&ns.name, "flaky-job", &store_url, 1);
    assert_eq!(
        std::fs::read_to_string(first.join("report.txt")).expect("report.txt"),
        "attempt 1\n"
    );

    let sandbox = wait_run(
        &runs,
        "dev-sandbox",
        "Running",
        &op,
        phase_is(Phase::Running),
    )
    .await;
    let pod = pod_of(&sandbox);
    let exec = exec_in_workload(
        &ns.name,
        &pod,
        "cat /etc/devbox/settings.toml > /home/dev/artifacts/out.txt",
    );
    assert!(exec.status.success(), "{exec:?}");
    runs.patch(
        "dev-sandbox",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"stop": true}})),
    )
    .await
    .expect("stop");
    let stopped = wait_run(&runs, "dev-sandbox", "Stopped", &op, final_phase).await;
    let status = stopped.status.clone().expect("status");
    assert_eq!(status.phase, Some(Phase::Stopped), "{status:?}");
    let phases: Vec<ReadBackPhase> = status.read_back.iter().map(|p| p.phase).collect();
    assert_eq!(phases, [ReadBackPhase::Drained, ReadBackPhase::Empty]);
    let dest = files_get(&ns.name, "dev-sandbox", &store_url, &[], &[])
        .unwrap_or_else(|e| panic!("files get failed: {e}"));
    let out = std::fs::read_to_string(extracted(&dest, 0).join("out.txt")).expect("out.txt");
    assert_eq!(out, "editor = \"vi\"\n");
}

/// `files get --attempt N` of a run into a fresh directory: the extracted first path's directory.
fn files_get_attempt(ns: &str, run: &str, store_url: &str, attempt: u32) -> PathBuf {
    files_get_one(ns, run, store_url, ("--attempt", attempt))
}

/// `files get --checkpoint N` of `run` (its first path's extracted directory).
fn files_get_checkpoint(ns: &str, run: &str, store_url: &str, checkpoint: u32) -> PathBuf {
    files_get_one(ns, run, store_url, ("--checkpoint", checkpoint))
}

/// `files get <flag> N` of `run` into a fresh directory; its first path's extracted directory.
fn files_get_one(ns: &str, run: &str, store_url: &str, (flag, n): (&str, u32)) -> PathBuf {
    let dest = host_dir(&format!("{run}-get{flag}-{n}"));
    let out = Command::new(env!("CARGO_BIN_EXE_sandboxrun-operator"))
        .args(["files", "get", run, "-n", ns, "--store-url", store_url])
        .args([flag, &n.to_string(), "-o"])
        .arg(&dest)
        .output()
        .expect("run files get");
    assert!(
        out.status.success(),
        "files get {flag} {n}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    extracted(&dest, 0)
}

/// Issue #41 on real containers: a run whose workload exits 3 on its first two attempts and 0 on
/// its third (it reads `SANDBOXRUN_ATTEMPT`) retries under `spec.retryPolicy` and Succeeds; each
/// attempt's files are drained into their own generation (`files get --attempt N`) and listed in
/// `status.attempts` with their exit code; a Warning `AttemptFailed` tells each retry. A second
/// run whose exit code 42 a `FailRun` rule names fails at once, with one attempt. On the old code
/// the first run ends `Failed` after its first attempt (no retry exists).
#[tokio::test]
async fn a_run_retries_by_exit_code_keeping_every_attempts_files_and_a_fatal_code_fails_at_once() {
    use sandboxrun_operator::api::{
        ExitCodeOperator, ExitCodeRule, RetryAction, RetryBackoff, RetryPolicy, RetryRule,
    };
    let bed = RealBed::new("real-retry").await;
    let policy = RetryPolicy {
        limit: 3,
        backoff: Some(RetryBackoff {
            base_seconds: Some(1),
            factor: Some(2),
            cap_seconds: Some(2),
        }),
        rules: vec![RetryRule {
            action: RetryAction::FailRun,
            on_exit_codes: Some(ExitCodeRule {
                operator: ExitCodeOperator::In,
                values: vec![42],
            }),
            on_pod_conditions: Vec::new(),
        }],
    };
    let flaky = r#"echo "attempt $SANDBOXRUN_ATTEMPT" > "$ITERION_ARTIFACT_FILES_DIR/attempt.txt"
[ "$SANDBOXRUN_ATTEMPT" -ge 3 ] || exit 3"#;
    let mut spec = real_spec(Some(flaky), &["/work/out"]);
    spec.retry_policy = Some(policy.clone());
    create(&bed.runs, "flaky", spec).await;
    let mut fatal = real_spec(
        Some("echo doomed > \"$ITERION_ARTIFACT_FILES_DIR/x\"; exit 42"),
        &["/work/out"],
    );
    fatal.retry_policy = Some(policy);
    create(&bed.runs, "fatal", fatal).await;

    let run = wait_run(&bed.runs, "flaky", "a final phase", &bed.op, final_phase).await;
    let status = run.status.clone().expect("status");
    assert_eq!(status.phase, Some(Phase::Succeeded), "{status:?}");
    let ended: Vec<(u32, Option<i32>, bool)> = status
        .attempts
        .iter()
        .map(|a| (a.index, a.exit_code, a.counted))
        .collect();
    assert_eq!(
        ended,
        [(1, Some(3), true), (2, Some(3), true)],
        "{status:?}"
    );
    for a in &status.attempts {
        assert_eq!(a.read_back[0].phase, ReadBackPhase::Drained, "{a:?}");
        assert_ne!(a.pod_name, status.pod_name.clone().unwrap_or_default());
    }
    assert_eq!(status.exit_code, Some(0));
    assert_eq!(status.read_back[0].phase, ReadBackPhase::Drained);
    for attempt in 1..=3 {
        let dir = files_get_attempt(&bed.ns.name, "flaky", &bed.store_url, attempt);
        assert_eq!(
            std::fs::read_to_string(dir.join("attempt.txt")).expect("attempt.txt"),
            format!("attempt {attempt}\n"),
            "attempt {attempt}'s own files"
        );
    }
    let events = run_events(&bed.client, &bed.ns.name, "flaky")
        .await
        .join("\n");
    assert!(
        events.contains("AttemptFailed") && events.contains("attempt 2 ended"),
        "each retry is told:\n{events}"
    );

    let run = wait_run(&bed.runs, "fatal", "a final phase", &bed.op, final_phase).await;
    let status = run.status.clone().expect("status");
    assert_eq!(status.phase, Some(Phase::Failed), "{status:?}");
    assert!(status.attempts.is_empty(), "no retry: {status:?}");
    assert!(
        status
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("rule 1 of spec.retryPolicy fails the run"),
        "{status:?}"
    );
    assert_eq!(status.read_back[0].phase, ReadBackPhase::Drained);
}

/// Issue #55 item 4 on real containers (docs/contract.md "A run's next step follows its drain"):
/// a run whose first attempt fails is retried when its 1 s backoff ends — its second attempt's pod
/// created a few seconds after the first attempt's drain ended, not after the 30 s in-flight
/// requeue the old code waited for (the drain's last write woke the run while the drain still
/// counted as in flight, and nothing woke it again).
#[tokio::test]
async fn a_retried_runs_next_attempt_follows_its_drain_not_the_in_flight_requeue() {
    use sandboxrun_operator::api::{RetryBackoff, RetryPolicy};
    let bed = RealBed::new("real-next-step").await;
    let script = r#"echo "attempt $SANDBOXRUN_ATTEMPT" > "$ITERION_ARTIFACT_FILES_DIR/attempt.txt"
[ "$SANDBOXRUN_ATTEMPT" -ge 2 ] || exit 3"#;
    let mut spec = real_spec(Some(script), &["/work/out"]);
    spec.retry_policy = Some(RetryPolicy {
        limit: 1,
        backoff: Some(RetryBackoff {
            base_seconds: Some(1),
            factor: Some(1),
            cap_seconds: Some(1),
        }),
        rules: Vec::new(),
    });
    create(&bed.runs, "next", spec).await;
    let pods: Api<Pod> = Api::namespaced(bed.client.clone(), &bed.ns.name);
    let second = eventually_or_log(
        "the second attempt's pod",
        Duration::from_secs(180),
        &bed.op,
        || {
            let pods = pods.clone();
            async move { pods.get_opt("next-sbr-a2").await.ok().flatten() }
        },
    )
    .await;
    let done = wait_run(&bed.runs, "next", "a final phase", &bed.op, final_phase).await;
    let status = done.status.clone().expect("status");
    assert_eq!(status.phase, Some(Phase::Succeeded), "{status:?}");
    let ended = status
        .attempts
        .first()
        .and_then(|a| a.end_time.clone())
        .expect("the first attempt's end");
    let created = second
        .metadata
        .creation_timestamp
        .clone()
        .expect("the second pod's creation");
    // Both in whole seconds; the backoff is 1 s.
    let after = created.0.duration_since(ended.0).as_secs_f64();
    assert!(
        after < 10.0,
        "attempt 2's pod was created {after} s after attempt 1 ended (backoff 1 s): the run \
         waited for something other than its backoff: {status:?}"
    );
}

/// Issue #41 `spec.suspend` on real containers: a run created suspended gets no pod (Pending,
/// Ready=False `Suspended`); resumed, it runs. Suspended while running, its pod is stopped with
/// its files drained into that attempt's generation (an attempt that does not count, reason
/// `Suspended`); resumed, attempt 2 runs in a new pod and the run ends with both generations
/// stored. On the old code the field does not exist: the run starts at once.
#[tokio::test]
async fn a_suspended_run_has_no_pod_and_a_running_one_is_stopped_with_its_files_then_resumed() {
    let bed = RealBed::new("real-suspend").await;
    let pods: Api<Pod> = Api::namespaced(bed.client.clone(), &bed.ns.name);
    let script = r#"echo "attempt $SANDBOXRUN_ATTEMPT" > "$ITERION_ARTIFACT_FILES_DIR/attempt.txt"
[ "$SANDBOXRUN_ATTEMPT" -ge 2 ] || exec sleep 3600"#;
    let mut spec = real_spec(Some(script), &["/work/out"]);
    spec.suspend = true;
    create(&bed.runs, "held", spec).await;
    let held = wait_run(&bed.runs, "held", "Ready=False Suspended", &bed.op, |r| {
        r.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.reason == "Suspended")
        })
    })
    .await;
    assert_eq!(
        held.status.as_ref().and_then(|s| s.phase),
        Some(Phase::Pending)
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let listed = pods.list(&ListParams::default()).await.expect("pods");
    assert!(
        listed.items.is_empty(),
        "no pod while suspended: {:?}",
        listed.items.len()
    );

    let set = |on: bool| json!({"spec": {"suspend": on}});
    bed.runs
        .patch("held", &PatchParams::default(), &Patch::Merge(&set(false)))
        .await
        .expect("resume");
    wait_run(
        &bed.runs,
        "held",
        "Running",
        &bed.op,
        phase_is(Phase::Running),
    )
    .await;
    bed.runs
        .patch("held", &PatchParams::default(), &Patch::Merge(&set(true)))
        .await
        .expect("suspend while running");
    let stopped = wait_run(
        &bed.runs,
        "held",
        "attempt 1 recorded, suspended",
        &bed.op,
        |r| {
            r.status.as_ref().is_some_and(|s| {
                s.attempts.len() == 1
                    && s.conditions
                        .iter()
                        .any(|c| c.type_ == "Ready" && c.reason == "Suspended")
            })
        },
    )
    .await;
    let status = stopped.status.clone().expect("status");
    let first = &status.attempts[0];
    assert_eq!(
        (first.reason.as_str(), first.counted),
        ("Suspended", false),
        "{first:?}"
    );
    assert_eq!(
        first.read_back[0].phase,
        ReadBackPhase::Drained,
        "{first:?}"
    );
    assert_eq!(status.phase, Some(Phase::Pending));

    bed.runs
        .patch("held", &PatchParams::default(), &Patch::Merge(&set(false)))
        .await
        .expect("resume again");
    let done = wait_run(&bed.runs, "held", "a final phase", &bed.op, final_phase).await;
    let status = done.status.clone().expect("status");
    assert_eq!(status.phase, Some(Phase::Succeeded), "{status:?}");
    for attempt in 1..=2 {
        let dir = files_get_attempt(&bed.ns.name, "held", &bed.store_url, attempt);
        assert_eq!(
            std::fs::read_to_string(dir.join("attempt.txt")).expect("attempt.txt"),
            format!("attempt {attempt}\n")
        );
    }
}

/// Issue #41: an attempt whose pod is evicted (a POST to pods/eviction, as `kubectl drain` does)
/// is drained, recorded as `Disrupted` and retried **without counting**: with `limit: 0` (no
/// counted retry at all) the run still gets its second attempt, which succeeds. On the old code
/// the eviction ends the run `Stopped` (`PodDeleted`).
#[tokio::test]
async fn an_evicted_attempt_is_drained_and_retried_without_counting() {
    use sandboxrun_operator::api::RetryPolicy;
    let bed = RealBed::new("real-evict-retry").await;
    let script = r#"echo "attempt $SANDBOXRUN_ATTEMPT" > "$ITERION_ARTIFACT_FILES_DIR/attempt.txt"
[ "$SANDBOXRUN_ATTEMPT" -ge 2 ] || exec sleep 3600"#;
    let mut spec = real_spec(Some(script), &["/work/out"]);
    spec.retry_policy = Some(RetryPolicy {
        limit: 0,
        ..RetryPolicy::default()
    });
    create(&bed.runs, "evicted", spec).await;
    let run = wait_run(
        &bed.runs,
        "evicted",
        "Running",
        &bed.op,
        phase_is(Phase::Running),
    )
    .await;
    let pod = pod_of(&run);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let eviction = json!({
        "apiVersion": "policy/v1", "kind": "Eviction",
        "metadata": {"name": pod, "namespace": bed.ns.name},
    });
    let req = http::Request::post(format!(
        "/api/v1/namespaces/{}/pods/{}/eviction",
        bed.ns.name, pod
    ))
    .header("content-type", "application/json")
    .body(serde_json::to_vec(&eviction).expect("eviction json"))
    .expect("eviction request");
    let _: serde_json::Value = bed.client.request(req).await.expect("evict the pod");

    let done = wait_run(&bed.runs, "evicted", "a final phase", &bed.op, final_phase).await;
    let status = done.status.clone().expect("status");
    assert_eq!(status.phase, Some(Phase::Succeeded), "{status:?}");
    assert_eq!(status.attempts.len(), 1, "{status:?}");
    let first = &status.attempts[0];
    assert_eq!(
        (first.reason.as_str(), first.counted, first.exit_code),
        ("Disrupted", false, None),
        "{first:?}"
    );
    assert_eq!(
        first.read_back[0].phase,
        ReadBackPhase::Drained,
        "{first:?}"
    );
    let dir = files_get_attempt(&bed.ns.name, "evicted", &bed.store_url, 1);
    assert_eq!(
        std::fs::read_to_string(dir.join("attempt.txt")).expect("attempt.txt"),
        "attempt 1\n"
    );
}

/// Issue #40 part 2 on real containers: a running sandbox asked for a checkpoint
/// (`spec.checkpoint: c1`) has its read-back paths drained without stopping it (a path whose only
/// file it cannot read is `Failed` with the drain's Warning, never an empty set) — recorded in
/// `status.checkpoints`, readable with `files get --checkpoint 1` — then writes more; a second
/// checkpoint past `--max-checkpoints 1` is refused (recorded with why, nothing drained); then its
/// pod is deleted with `--grace-period=0 --force`, so the teardown cannot read it: the
/// checkpoint's files are still in the store. On the old code the field does not exist and a
/// forced deletion loses everything.
#[tokio::test]
async fn a_checkpoint_saves_a_running_sandboxs_files_which_survive_a_forced_deletion() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = restricted_namespace(&client, "real-checkpoint").await;
    let (_dir, store_url) = file_store("real-checkpoint");
    let op = start_operator_with(&ns.name, &store_url, &["--max-checkpoints", "1"]);
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let script = r#"echo first > "$ITERION_ARTIFACT_FILES_DIR/notes.txt"
echo secret > /work/locked/x; chmod 0000 /work/locked/x; exec sleep 3600"#;
    create(
        &runs,
        "agent",
        real_spec(Some(script), &["/work/out", "/work/locked"]),
    )
    .await;
    let running = wait_run(&runs, "agent", "Running", &op, phase_is(Phase::Running)).await;
    let pod = pod_of(&running);
    let ask = |token: &str| json!({"spec": {"checkpoint": token}});
    // The first through the plugin verb (the caller's own rights), which waits for the record:
    // exit 1, since a path failed, and it says which.
    let asked = Command::new(env!("CARGO_BIN_EXE_sandboxrun-operator"))
        .args(["checkpoint", "agent", "--token", "c1", "-n", &ns.name])
        .output()
        .expect("run the checkpoint verb");
    let said = String::from_utf8_lossy(&asked.stdout).to_string();
    assert_eq!(asked.status.code(), Some(1), "a path failed: {asked:?}");
    assert!(
        said.contains("checkpoint 1 (token c1)")
            && said.contains("/work/out: Drained")
            && said.contains("/work/locked: Failed")
            && said.contains("files get agent --checkpoint 1"),
        "{said}"
    );
    let saved = wait_run(&runs, "agent", "checkpoint 1 recorded", &op, |r| {
        r.status.as_ref().is_some_and(|s| !s.checkpoints.is_empty())
    })
    .await;
    let status = saved.status.clone().expect("status");
    let cp = &status.checkpoints[0];
    assert_eq!((cp.index, cp.token.as_str()), (1, "c1"), "{cp:?}");
    assert_eq!(cp.read_back[0].phase, ReadBackPhase::Drained, "{cp:?}");
    // A failed checkpoint path is Failed and a Warning, never an empty set.
    assert_eq!(cp.read_back[1].phase, ReadBackPhase::Failed, "{cp:?}");
    let events = run_events(&client, &ns.name, "agent").await.join("\n");
    assert!(
        events.contains("sandbox_runfiles_drain_failed"),
        "the failed checkpoint path is told:\n{events}"
    );
    assert_eq!(
        status.phase,
        Some(Phase::Running),
        "the sandbox keeps running"
    );
    let more = exec_in_workload(&ns.name, &pod, "echo second >> /work/out/notes.txt");
    assert!(more.status.success(), "{more:?}");

    runs.patch("agent", &PatchParams::default(), &Patch::Merge(&ask("c2")))
        .await
        .expect("ask a second checkpoint");
    let refused = wait_run(&runs, "agent", "checkpoint 2 refused", &op, |r| {
        r.status.as_ref().is_some_and(|s| s.checkpoints.len() == 2)
    })
    .await;
    let second = &refused.status.as_ref().expect("status").checkpoints[1];
    assert!(
        second.read_back.is_empty()
            && second
                .message
                .as_deref()
                .unwrap_or_default()
                .contains("--max-checkpoints"),
        "{second:?}"
    );

    let mut force = tool("kubectl");
    force.args([
        "delete",
        "pod",
        &pod,
        "-n",
        &ns.name,
        "--grace-period=0",
        "--force",
        "--wait=false",
    ]);
    let out = run(force, None);
    assert!(out.status.success(), "{out:?}");
    wait_run(&runs, "agent", "a final phase", &op, final_phase).await;
    let dest = files_get_checkpoint(&ns.name, "agent", &store_url, 1);
    assert_eq!(
        std::fs::read_to_string(dest.join("notes.txt")).expect("notes.txt"),
        "first\n",
        "the checkpoint's copy, taken before the second line"
    );
}

/// Deletes the cluster-scoped objects [`kueue_queue`] made (the flavor, the ClusterQueue, the
/// priority classes), last made first; the namespaced ones go with the test's namespace.
async fn delete_kueue_cluster_objects(
    client: &Client,
    made: Vec<(ApiResource, Option<String>, String)>,
) {
    for (res, namespace, name) in made.into_iter().rev() {
        if namespace.is_none() {
            let api: Api<DynamicObject> = Api::all_with(client.clone(), &res);
            let _ = api.delete(&name, &Default::default()).await;
        }
    }
}

/// Kueue's objects for [`runs_queue_through_real_kueue_and_a_preempted_run_is_drained_and_retried`]:
/// a flavor, a ClusterQueue with `cpu` quota for two runs (300m workload + 10m holder each; memory
/// plenty) that
/// preempts lower priorities within itself, a LocalQueue in `ns`, and two priority classes. Written
/// fully defaulted: Kueue's webhooks do not run on the bed (hack/kueue.sh).
async fn kueue_queue(
    client: &Client,
    ns: &str,
    tag: &str,
) -> Vec<(ApiResource, Option<String>, String)> {
    let ar = |kind: &str, plural: &str| ApiResource {
        group: "kueue.x-k8s.io".into(),
        version: "v1beta2".into(),
        api_version: "kueue.x-k8s.io/v1beta2".into(),
        kind: kind.into(),
        plural: plural.into(),
    };
    let objects = [
        (
            ar("ResourceFlavor", "resourceflavors"),
            None,
            // Its node label is the real node's own: Kueue's placement lands on the pod.
            json!({"metadata": {"name": format!("{tag}-flavor")},
                "spec": {"nodeLabels": {"kubernetes.io/hostname": "real-node-0"}}}),
        ),
        (
            ar("ClusterQueue", "clusterqueues"),
            None,
            json!({
                "metadata": {"name": format!("{tag}-cq")},
                "spec": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                    "queueingStrategy": "BestEffortFIFO",
                    "stopPolicy": "None",
                    "flavorFungibility": {"whenCanBorrow": "MayStopSearch", "whenCanPreempt": "TryNextFlavor"},
                    "preemption": {"withinClusterQueue": "LowerPriority", "reclaimWithinCohort": "Never",
                        "borrowWithinCohort": {"policy": "Never"}},
                    "resourceGroups": [{
                        "coveredResources": ["cpu", "memory"],
                        "flavors": [{"name": format!("{tag}-flavor"),
                            "resources": [{"name": "cpu", "nominalQuota": "700m"},
                                          {"name": "memory", "nominalQuota": "4Gi"}]}],
                    }],
                },
            }),
        ),
        (
            ar("LocalQueue", "localqueues"),
            Some(ns.to_string()),
            json!({
                "metadata": {"name": "lq", "namespace": ns},
                "spec": {"clusterQueue": format!("{tag}-cq"), "stopPolicy": "None"},
            }),
        ),
        (
            ar("WorkloadPriorityClass", "workloadpriorityclasses"),
            None,
            json!({"metadata": {"name": format!("{tag}-low")}, "value": 10}),
        ),
        (
            ar("WorkloadPriorityClass", "workloadpriorityclasses"),
            None,
            json!({"metadata": {"name": format!("{tag}-high")}, "value": 1000}),
        ),
    ];
    let mut made = Vec::new();
    for (res, namespace, mut body) in objects {
        body["apiVersion"] = json!(res.api_version);
        body["kind"] = json!(res.kind);
        let name = body["metadata"]["name"].as_str().expect("name").to_string();
        let object: DynamicObject = serde_json::from_value(body).expect("object");
        let api: Api<DynamicObject> = match &namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &res),
            None => Api::all_with(client.clone(), &res),
        };
        api.create(&Default::default(), &object)
            .await
            .unwrap_or_else(|e| panic!("create {} {name}: {e}", res.kind));
        made.push((res, namespace, name));
    }
    made
}

/// Issue #41 part 2 on the real node with the real Kueue (v0.17, hack/kueue.sh; the operator's
/// `--kueue`): runs labelled with a LocalQueue get a Workload and no pod until Kueue admits them.
/// - Six runs in a queue with quota for two: never more than two of their pods at once, a run
///   seen waiting (`Queued=True`, Kueue's reason), all six Succeeded with their files.
/// - Two low-priority runs fill the quota; a high-priority run preempts one of them: its attempt
///   ends `Preempted` (not counted) with its files drained, the high run succeeds, and the
///   preempted run, admitted again, succeeds in its second attempt.
#[tokio::test]
async fn runs_queue_through_real_kueue_and_a_preempted_run_is_drained_and_retried() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = restricted_namespace(&client, "kueue").await;
    let tag = format!("sbr-{:08x}", rand_u32());
    let made = kueue_queue(&client, &ns.name, &tag).await;
    let (_dir, store_url) = file_store("kueue");
    let op = start_operator_with(&ns.name, &store_url, &["--kueue"]);
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let queued = |script: &str, class: Option<&str>| {
        let mut spec = real_spec(Some(script), &["/work/out"]);
        spec.resources = Some(k8s_openapi::api::core::v1::ResourceRequirements {
            requests: Some(BTreeMap::from([(
                "cpu".to_string(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity("300m".into()),
            )])),
            ..Default::default()
        });
        let mut labels =
            BTreeMap::from([("kueue.x-k8s.io/queue-name".to_string(), "lq".to_string())]);
        if let Some(class) = class {
            labels.insert("kueue.x-k8s.io/priority-class".into(), class.to_string());
        }
        (spec, labels)
    };
    let submit = |name: String, (spec, labels): (SandboxRunSpec, BTreeMap<String, String>)| {
        let runs = runs.clone();
        async move {
            let mut run = SandboxRun::new(&name, spec);
            run.metadata.labels = Some(labels);
            runs.create(&Default::default(), &run)
                .await
                .expect("create the run");
        }
    };

    // Six runs, quota for two.
    let script = r#"echo "$HOSTNAME" > "$ITERION_ARTIFACT_FILES_DIR/who.txt"; sleep 4"#;
    for i in 1..=6 {
        submit(format!("q{i}"), queued(script, None)).await;
    }
    let (mut most, mut saw_queued, mut placed) = (0usize, false, false);
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let listed = pods
            .list(&ListParams::default())
            .await
            .expect("list pods")
            .items;
        placed |= listed.iter().any(|p| {
            p.spec
                .as_ref()
                .and_then(|s| s.node_selector.as_ref())
                .is_some_and(|s| {
                    s.get("kubernetes.io/hostname").map(String::as_str) == Some("real-node-0")
                })
        });
        let live = listed
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .count();
        most = most.max(live);
        let all = runs
            .list(&ListParams::default())
            .await
            .expect("list runs")
            .items;
        saw_queued |= all.iter().any(|r| {
            r.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "Queued" && c.status == "True" && c.reason == "Pending")
            })
        });
        if all.len() == 6 && all.iter().all(final_phase) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the six runs did not end: {:#?}\n{}",
            all.iter()
                .map(|r| (
                    r.name_any(),
                    r.status.as_ref().and_then(|s| s.message.clone())
                ))
                .collect::<Vec<_>>(),
            {
                let log = op.log_text();
                log[log.len().saturating_sub(4000)..].to_string()
            }
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(most <= 2, "at most two pods at once, saw {most}");
    assert!(saw_queued, "a run waited in the queue with Kueue's reason");
    assert!(placed, "the admitted flavor's node label is on the pods");
    for i in 1..=6 {
        let name = format!("q{i}");
        let run = runs.get(&name).await.expect("run");
        assert_eq!(
            phase(&run),
            Some(Phase::Succeeded),
            "{name}: {:?}",
            run.status
        );
        let dir = files_get_attempt(&ns.name, &name, &store_url, 1);
        let who = std::fs::read_to_string(dir.join("who.txt")).expect("who.txt");
        assert!(who.starts_with(&name), "{name}: its own files: {who:?}");
    }

    // Preemption: two low runs fill the quota, a high one takes a place.
    let low_script = r#"echo "attempt $SANDBOXRUN_ATTEMPT" > "$ITERION_ARTIFACT_FILES_DIR/attempt.txt"
[ "$SANDBOXRUN_ATTEMPT" -ge 2 ] || exec sleep 3600"#;
    let (low, high) = (format!("{tag}-low"), format!("{tag}-high"));
    for name in ["low-1", "low-2"] {
        submit(name.to_string(), queued(low_script, Some(&low))).await;
    }
    for name in ["low-1", "low-2"] {
        wait_run(&runs, name, "Running", &op, phase_is(Phase::Running)).await;
    }
    submit("high".to_string(), queued("sleep 2", Some(&high))).await;
    let high_done = wait_run(&runs, "high", "the high run to end", &op, final_phase).await;
    assert_eq!(
        phase(&high_done),
        Some(Phase::Succeeded),
        "{:?}",
        high_done.status
    );
    let mut preempted = Vec::new();
    for name in ["low-1", "low-2"] {
        let run = runs.get(name).await.expect("run");
        if run.status.as_ref().is_some_and(|s| !s.attempts.is_empty()) {
            preempted.push(name);
        }
    }
    assert_eq!(
        preempted.len(),
        1,
        "one low run was preempted: {preempted:?}"
    );
    let victim = preempted[0];
    let done = wait_run(&runs, victim, "the preempted run to end", &op, final_phase).await;
    let status = done.status.clone().expect("status");
    assert_eq!(status.phase, Some(Phase::Succeeded), "{status:?}");
    let first = &status.attempts[0];
    assert_eq!(
        (first.reason.as_str(), first.counted),
        ("Preempted", false),
        "{first:?}"
    );
    assert_eq!(
        first.read_back[0].phase,
        ReadBackPhase::Drained,
        "{first:?}"
    );
    let dir = files_get_attempt(&ns.name, victim, &store_url, 1);
    assert_eq!(
        std::fs::read_to_string(dir.join("attempt.txt")).expect("attempt.txt"),
        "attempt 1\n",
        "the preempted attempt's files were drained"
    );
    // The other low run still holds its place: stop it, then clean Kueue's cluster objects.
    for name in ["low-1", "low-2"] {
        let _ = runs
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": {"stop": true}})),
            )
            .await;
    }
    drop(op);
    delete_kueue_cluster_objects(&client, made).await;
}

/// Issue #51 item 2 on real containers (docs/contract.md "A run's object stays bounded"): a
/// running sandbox whose author asks 200 checkpoints, one after another, under
/// `--max-checkpoints 2`: every token is answered, 2 checkpoints hold files, only the latest 4
/// refusals stay listed, all 198 are counted, and the object stays small. On the old code every
/// refusal was appended: 200 entries.
#[tokio::test]
async fn a_run_asked_two_hundred_checkpoints_keeps_a_bounded_object() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = restricted_namespace(&client, "bounded-run").await;
    let (_dir, store_url) = file_store("bounded-run");
    let op = start_operator_with(&ns.name, &store_url, &["--max-checkpoints", "2"]);
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let script = r#"echo hi > "$ITERION_ARTIFACT_FILES_DIR/notes.txt"; exec sleep 3600"#;
    create(&runs, "patched", real_spec(Some(script), &["/work/out"])).await;
    wait_run(&runs, "patched", "Running", &op, phase_is(Phase::Running)).await;
    for i in 0..200 {
        let token = format!("t{i}");
        runs.patch(
            "patched",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"checkpoint": token}})),
        )
        .await
        .expect("ask a checkpoint");
        wait_run(
            &runs,
            "patched",
            &format!("checkpoint {token} answered"),
            &op,
            |r| {
                r.status
                    .as_ref()
                    .and_then(|s| s.checkpoints.last())
                    .is_some_and(|c| c.token == token)
            },
        )
        .await;
    }
    let run = runs.get("patched").await.expect("run");
    let status = run.status.clone().expect("status");
    let held = status
        .checkpoints
        .iter()
        .filter(|c| !c.is_refused())
        .count();
    assert_eq!(held, 2, "{:?}", status.checkpoints);
    assert!(
        status.checkpoints.len() <= 2 + sandboxrun_operator::api::REFUSED_CHECKPOINTS_KEPT,
        "{} entries",
        status.checkpoints.len()
    );
    assert_eq!(status.checkpoints_refused, Some(198));
    let size = serde_json::to_vec(&run).expect("json").len();
    assert!(size < 32 * 1024, "the run is {size} bytes");
    let _ = runs
        .patch(
            "patched",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"stop": true}})),
        )
        .await;
    wait_run(&runs, "patched", "a final phase", &op, final_phase).await;
}

/// Issue #51 item 5 on the real node with the real Kueue (docs/contract.md "Quota cannot be edited
/// away"): a run waiting for quota it will not get (900m of cpu, the queue has 700m) records its
/// queue in `status.queue`; its `kueue.x-k8s.io/queue-name` label removed (no webhook here: the
/// operator must hold it on its own), it still gets no pod, and says why
/// (`Queued=True QueueLabelChanged`). On the old code its pod was created at once.
#[tokio::test]
async fn a_queued_run_whose_queue_label_is_removed_gets_no_pod() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = restricted_namespace(&client, "kueue-label").await;
    let tag = format!("sbr-{:08x}", rand_u32());
    let made = kueue_queue(&client, &ns.name, &tag).await;
    let (_dir, store_url) = file_store("kueue-label");
    let op = start_operator_with(&ns.name, &store_url, &["--kueue"]);
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let mut spec = real_spec(Some("sleep 2"), &["/work/out"]);
    spec.resources = Some(k8s_openapi::api::core::v1::ResourceRequirements {
        requests: Some(BTreeMap::from([(
            "cpu".to_string(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("900m".into()),
        )])),
        ..Default::default()
    });
    let mut run = SandboxRun::new("over-quota", spec);
    run.metadata.labels = Some(BTreeMap::from([(
        "kueue.x-k8s.io/queue-name".to_string(),
        "lq".to_string(),
    )]));
    runs.create(&Default::default(), &run)
        .await
        .expect("create the run");
    let reason_of = |r: &SandboxRun| {
        r.status.as_ref().and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == "Queued" && c.status == "True")
                .map(|c| c.reason.clone())
        })
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let live = runs.get("over-quota").await.expect("run");
        let recorded = live.status.as_ref().and_then(|s| s.queue.clone());
        if recorded.as_deref() == Some("lq") && reason_of(&live).as_deref() == Some("Pending") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the run was not seen waiting for quota: {:?}\n{}",
            live.status,
            op.log_text()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    runs.patch(
        "over-quota",
        &PatchParams::default(),
        &Patch::Merge(&json!({"metadata": {"labels": {"kueue.x-k8s.io/queue-name": null}}})),
    )
    .await
    .expect("remove the label");
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut told = false;
    while Instant::now() < deadline {
        let listed = pods
            .list(&ListParams::default())
            .await
            .expect("list pods")
            .items;
        assert!(
            listed.is_empty(),
            "a pod was created for a run whose queue label was removed: {:?}",
            listed.iter().map(|p| p.name_any()).collect::<Vec<_>>()
        );
        let live = runs.get("over-quota").await.expect("run");
        told |= reason_of(&live).as_deref() == Some("QueueLabelChanged");
        if told {
            // Still no pod a few seconds after it said so.
            tokio::time::sleep(Duration::from_secs(5)).await;
            let listed = pods.list(&ListParams::default()).await.expect("list pods");
            assert!(listed.items.is_empty(), "no pod, ever");
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        told,
        "the run says its label was changed\n{}",
        op.log_text()
    );
    let _ = runs
        .patch(
            "over-quota",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"stop": true}})),
        )
        .await;
    drop(op);
    delete_kueue_cluster_objects(&client, made).await;
}

/// Issue #53 item 1 on the real node with the real Kueue (docs/contract.md "A queued run keeps the
/// queue and priority it was queued with"): a queued run admitted at WorkloadPriorityClass
/// `<tag>-low`, its pod running, has its `kueue.x-k8s.io/priority-class` label changed to
/// `<tag>-high` (no webhook here: the operator must say it on its own). Its Workload keeps the
/// priority it was queued with, and the run says the edit is not followed —
/// `LabelEditIgnored=True PriorityLabelChanged` and a Warning Event `QueueLabelEditIgnored`; put
/// back, the condition turns False. On the old code nothing was said.
#[tokio::test]
async fn a_running_queued_runs_priority_label_edit_is_said_and_its_workload_keeps_its_priority() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = restricted_namespace(&client, "kueue-prio").await;
    let tag = format!("sbr-{:08x}", rand_u32());
    let made = kueue_queue(&client, &ns.name, &tag).await;
    let (_dir, store_url) = file_store("kueue-prio");
    let op = start_operator_with(&ns.name, &store_url, &["--kueue"]);
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let mut spec = real_spec(Some("sleep 120"), &["/work/out"]);
    spec.resources = Some(k8s_openapi::api::core::v1::ResourceRequirements {
        requests: Some(BTreeMap::from([(
            "cpu".to_string(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("300m".into()),
        )])),
        ..Default::default()
    });
    let mut run = SandboxRun::new("prio", spec);
    let (low, high) = (format!("{tag}-low"), format!("{tag}-high"));
    run.metadata.labels = Some(BTreeMap::from([
        ("kueue.x-k8s.io/queue-name".to_string(), "lq".to_string()),
        ("kueue.x-k8s.io/priority-class".to_string(), low.clone()),
    ]));
    runs.create(&Default::default(), &run)
        .await
        .expect("create the run");
    let condition = |r: &SandboxRun, t: &str| {
        r.status.as_ref().and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == t)
                .map(|c| (c.status.clone(), c.reason.clone()))
        })
    };
    wait_run(&runs, "prio", "admitted and running", &op, |r| {
        phase(r) == Some(Phase::Running)
            && condition(r, "Queued") == Some(("False".into(), "Admitted".into()))
    })
    .await;
    let label =
        |class: &str| json!({"metadata": {"labels": {"kueue.x-k8s.io/priority-class": class}}});
    runs.patch(
        "prio",
        &PatchParams::default(),
        &Patch::Merge(&label(&high)),
    )
    .await
    .expect("change the priority label");
    let said = wait_run(&runs, "prio", "LabelEditIgnored=True", &op, |r| {
        condition(r, "LabelEditIgnored") == Some(("True".into(), "PriorityLabelChanged".into()))
    })
    .await;
    assert_eq!(
        phase(&said),
        Some(Phase::Running),
        "it runs on: {:?}",
        said.status
    );
    let workloads: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns.name,
        &sandboxrun_operator::kueue::workload_resource(),
    );
    let w = workloads.get("prio-sbr").await.expect("the run's Workload");
    assert_eq!(
        w.data["spec"]["priority"],
        json!(10),
        "{:?}",
        w.data["spec"]
    );
    assert_eq!(w.data["spec"]["priorityClassRef"]["name"], json!(low));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let events = run_events(&client, &ns.name, "prio").await;
        if events
            .iter()
            .any(|e| e.starts_with("QueueLabelEditIgnored: ") && e.contains(&high))
        {
            break;
        }
        assert!(Instant::now() < deadline, "no Warning Event: {events:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    runs.patch("prio", &PatchParams::default(), &Patch::Merge(&label(&low)))
        .await
        .expect("put the priority label back");
    wait_run(&runs, "prio", "LabelEditIgnored=False", &op, |r| {
        condition(r, "LabelEditIgnored") == Some(("False".into(), "LabelsAsQueued".into()))
    })
    .await;
    let _ = runs
        .patch(
            "prio",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"stop": true}})),
        )
        .await;
    wait_run(&runs, "prio", "a final phase", &op, final_phase).await;
    drop(op);
    delete_kueue_cluster_objects(&client, made).await;
}

/// The pods of pool `pool` in `ns`: (name, template hash, claimed).
async fn pool_pods(client: &Client, ns: &str, pool: &str) -> Vec<(String, String, bool)> {
    Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&format!("sandbox.iterion.io/pool={pool}")))
        .await
        .expect("list the pool's pods")
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| {
            let labels = p.labels().clone();
            (
                p.name_any(),
                labels
                    .get("sandbox.iterion.io/pool-template-hash")
                    .cloned()
                    .unwrap_or_default(),
                labels.contains_key("sandbox.iterion.io/claimed-by"),
            )
        })
        .collect()
}

/// Issue #39 on the real node (docs/user-guide.md "Sandboxes for agents: warm pools"), the
/// operator with `--warm-pools`:
/// - a SandboxRunPool of two replicas of a template gets two ready pods, their workload parked in
///   the operator's launcher;
/// - a run made from the template that sets only command and env takes one of them
///   (`status.warmStart.pod`): the launcher starts the run's command with the run's env as the
///   template's user, its file is drained, it Succeeds; the pod was claimed (owned by the run)
///   and the pool makes another;
/// - a run that sets a field that changes the pod (`resources`) starts cold and says why;
/// - the template changed the pod (its resources): the pool replaces its unclaimed pods with the
///   new version's.
#[tokio::test]
async fn a_warm_pool_serves_a_run_from_a_ready_pod_and_rolls_out_a_template_change() {
    use sandboxrun_operator::api::{
        EnvVar, OpenField, SandboxRunPool, SandboxRunPoolSpec, SandboxRunTemplate,
        SandboxRunTemplateSpec, TemplateRef,
    };
    let client = client().await;
    ensure_crd(&client).await;
    let ns = restricted_namespace(&client, "pool").await;
    let (_dir, store_url) = file_store("pool");
    let op = start_operator_with(&ns.name, &store_url, &["--warm-pools"]);
    let templates: Api<SandboxRunTemplate> = Api::namespaced(client.clone(), &ns.name);
    let mut locked = real_spec(Some("exit 9"), &["/work/out"]);
    locked.env = vec![EnvVar {
        name: "VERSION".into(),
        value: "1".into(),
        value_from: None,
    }];
    let template = SandboxRunTemplate::new(
        "agent",
        SandboxRunTemplateSpec {
            template: locked,
            open_fields: vec![OpenField::Command, OpenField::Env, OpenField::Resources],
        },
    );
    templates
        .create(&Default::default(), &template)
        .await
        .expect("create the template");
    let pools: Api<SandboxRunPool> = Api::namespaced(client.clone(), &ns.name);
    let pool = SandboxRunPool::new(
        "agents",
        SandboxRunPoolSpec {
            template_ref: TemplateRef::namespaced("agent"),
            replicas: 2,
        },
    );
    pools
        .create(&Default::default(), &pool)
        .await
        .expect("create the pool");
    let ready = |n: i32| {
        let pools = pools.clone();
        async move {
            eventually(
                "the pool's pods to be ready",
                Duration::from_secs(180),
                || {
                    let pools = pools.clone();
                    async move {
                        let p = pools.get("agents").await.ok()?;
                        let s = p.status?;
                        (s.ready_replicas == n && s.replicas == n).then_some(s)
                    }
                },
            )
            .await
        }
    };
    let first = ready(2).await;
    let before = pool_pods(&client, &ns.name, "agents").await;
    assert_eq!(before.len(), 2, "{before:?}");

    // A run that sets only command and env: warm.
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let warm_spec = SandboxRunSpec {
        template_ref: Some(TemplateRef::namespaced("agent")),
        command: Some(vec![
            "sh".into(),
            "-c".into(),
            r#"echo "task=$TASK version=$VERSION uid=$(id -u)" > "$ITERION_ARTIFACT_FILES_DIR/out.txt""#.into(),
        ]),
        env: vec![EnvVar {
            name: "TASK".into(),
            value: "42".into(),
            value_from: None,
        }],
        ..Default::default()
    };
    create(&runs, "warm", warm_spec.clone()).await;
    let done = wait_run(&runs, "warm", "the warm run to end", &op, final_phase).await;
    let status = done.status.clone().expect("status");
    assert_eq!(status.phase, Some(Phase::Succeeded), "{status:?}");
    let warm = status.warm_start.clone().expect("warmStart");
    let took = warm
        .pod
        .clone()
        .unwrap_or_else(|| panic!("a pool pod was taken: {warm:?}"));
    assert!(
        before.iter().any(|(name, _, _)| *name == took),
        "{took} is one of the pool's ready pods {before:?}"
    );
    assert_eq!(
        status.read_back[0].phase,
        ReadBackPhase::Drained,
        "{status:?}"
    );
    let dest = files_get(&ns.name, "warm", &store_url, &[], &[])
        .unwrap_or_else(|e| panic!("files get failed: {e}"));
    let out = std::fs::read_to_string(extracted(&dest, 0).join("out.txt")).expect("out.txt");
    assert_eq!(
        out, "task=42 version=1 uid=1000\n",
        "the run's command and env, the template's user"
    );
    // The pool makes another: two unclaimed ready pods again, the taken one not among them.
    ready(2).await;
    let after = pool_pods(&client, &ns.name, "agents").await;
    assert!(
        after
            .iter()
            .filter(|(_, _, claimed)| !claimed)
            .all(|(name, _, _)| *name != took),
        "{after:?}"
    );

    // A run that sets a field that changes the pod starts cold and says why.
    let mut cold_spec = warm_spec.clone();
    cold_spec.resources = Some(k8s_openapi::api::core::v1::ResourceRequirements {
        requests: Some(BTreeMap::from([(
            "cpu".to_string(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("20m".into()),
        )])),
        ..Default::default()
    });
    create(&runs, "cold", cold_spec).await;
    let done = wait_run(&runs, "cold", "the cold run to end", &op, final_phase).await;
    let status = done.status.clone().expect("status");
    assert_eq!(status.phase, Some(Phase::Succeeded), "{status:?}");
    let cold = status.warm_start.clone().expect("warmStart");
    assert!(cold.pod.is_none(), "{cold:?}");
    assert!(
        cold.cold_reason
            .as_deref()
            .unwrap_or_default()
            .contains("resources"),
        "{cold:?}"
    );
    assert_eq!(status.pod_name.as_deref(), Some("cold-sbr"), "{status:?}");
    // The pool counts it: `status.misses` (the claims write it; the pool's own updates keep it).
    eventually(
        "the pool to count the miss",
        Duration::from_secs(60),
        || {
            let pools = pools.clone();
            async move { (pools.get("agents").await.ok()?.status?.misses == Some(1)).then_some(()) }
        },
    )
    .await;

    // The template changes the pod (its resources): the unclaimed pods are replaced by the new
    // version's. (An env value is not the pod's shape: the launcher delivers it at claim time.)
    let bump = json!({"spec": {"template": {"resources": {"requests": {"cpu": "15m"}}}}});
    templates
        .patch("agent", &PatchParams::default(), &Patch::Merge(&bump))
        .await
        .expect("change the template");
    let old_hash = first.template_hash.clone().expect("hash");
    eventually("the pool to roll out", Duration::from_secs(180), || {
        let (client, ns, old_hash) = (client.clone(), ns.name.clone(), old_hash.clone());
        async move {
            let pods = pool_pods(&client, &ns, "agents").await;
            let unclaimed: Vec<_> = pods.iter().filter(|(_, _, c)| !c).collect();
            (unclaimed.len() == 2 && unclaimed.iter().all(|(_, h, _)| *h != old_hash)).then_some(())
        }
    })
    .await;
    // The pool's status says so once its next reconcile has written it (it may still show the
    // old version's two ready pods a moment after they were replaced).
    eventually(
        "the pool's status to show the new version ready",
        Duration::from_secs(180),
        || {
            let (pools, old_hash) = (pools.clone(), old_hash.clone());
            async move {
                let s = pools.get("agents").await.ok()?.status?;
                let new = s.template_hash.as_ref().is_some_and(|h| *h != old_hash);
                (new && s.ready_replicas == 2 && s.replicas == 2).then_some(())
            }
        },
    )
    .await;
}

/// Issue #39 (templates whose runs restrict egress are pooled) on the real node, the operator
/// with `--warm-pools`, the egress gate probing the node's kubelet port, and
/// `--egress-denylist-wide` (a denylist allows every address it does not deny, the node's among
/// them, unless its policy denies the node):
/// - a pool of an allowlist template (`192.0.2.0/24`) and one of a denylist template of the same
///   range get ready pods; each pool pod has its own NetworkPolicy (`<pod>-egress`, selecting it,
///   owned by it) and its gate exited 0 before its workload was parked;
/// - a run made from each takes its pool's pod and its FIRST instruction, a connection to a
///   listener on the node's address, fails: the listener never sees them. For the denylist run
///   this needs the run's own policy to deny the node too: the pool pod's policy keeps selecting
///   the pod and policies add up (a run policy without the node denied would open the node);
/// - control: a run with open egress reaches the listener at once.
#[tokio::test]
async fn a_warm_pool_of_a_filtered_template_keeps_its_pods_and_their_runs_filtered() {
    use sandboxrun_operator::api::NetworkMode::{Allowlist, Denylist};
    use sandboxrun_operator::api::{
        OpenField, SandboxRunPool, SandboxRunPoolSpec, SandboxRunTemplate, SandboxRunTemplateSpec,
        TemplateRef,
    };
    let client = client().await;
    ensure_crd(&client).await;
    let ns = restricted_namespace(&client, "pool-gate").await;
    let (_dir, store_url) = file_store("pool-gate");
    let probe = format!("node:{}", real_kubelet_port(&client).await);
    let op = start_operator_with(
        &ns.name,
        &store_url,
        &[
            "--warm-pools",
            "--egress-gate-probe",
            &probe,
            "--egress-denylist-wide",
        ],
    );
    let node_ip = bed_setting("SANDBOXRUN_TEST_NODE_IP");
    let (denied, denied_peers) = echo_listener(&node_ip, "denied").await;
    let templates: Api<SandboxRunTemplate> = Api::namespaced(client.clone(), &ns.name);
    let pools: Api<SandboxRunPool> = Api::namespaced(client.clone(), &ns.name);
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let kinds = [("allow", Allowlist), ("deny", Denylist)];
    for (name, mode) in kinds {
        let mut spec = real_spec(Some("exit 9"), &[]);
        spec.env = vec![env_var("DENIED", &denied)];
        spec.network = Some(sandboxrun_operator::api::NetworkPolicy {
            mode,
            rules: vec!["192.0.2.0/24".to_string()],
        });
        let template = SandboxRunTemplate::new(
            name,
            SandboxRunTemplateSpec {
                template: spec,
                open_fields: vec![OpenField::Command],
            },
        );
        templates
            .create(&Default::default(), &template)
            .await
            .expect("create the template");
        let pool = SandboxRunPool::new(
            name,
            SandboxRunPoolSpec {
                template_ref: TemplateRef::namespaced(name),
                replicas: 1,
            },
        );
        pools
            .create(&Default::default(), &pool)
            .await
            .expect("create the pool");
    }
    let policies: Api<k8s_openapi::api::networking::v1::NetworkPolicy> =
        Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    for (name, _) in kinds {
        eventually(
            "the filtered pool's pod to be ready",
            Duration::from_secs(180),
            || {
                let pools = pools.clone();
                async move {
                    let s = pools.get(name).await.ok()?.status?;
                    (s.ready_replicas == 1).then_some(())
                }
            },
        )
        .await;
        let listed = pool_pods(&client, &ns.name, name).await;
        let pod_name = listed.first().map(|p| p.0.clone()).expect("a pool pod");
        let policy = policies
            .get(&format!("{pod_name}-egress"))
            .await
            .unwrap_or_else(|e| panic!("{name}: the pool pod's NetworkPolicy: {e}"));
        let owner = policy.owner_references().first().cloned().expect("owner");
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str()),
            ("Pod", pod_name.as_str())
        );
        let gate = pods
            .get(&pod_name)
            .await
            .expect("the pool pod")
            .status
            .and_then(|s| s.init_container_statuses)
            .and_then(|cs| cs.into_iter().find(|c| c.name == "egress-gate"))
            .and_then(|c| c.state?.terminated)
            .unwrap_or_else(|| panic!("{name}: the pool pod's gate ended"));
        assert_eq!(gate.exit_code, 0, "{name}: {gate:?}");
    }

    // Control: open egress reaches the listener in its first instruction.
    let mut open = real_spec(Some(FIRST_INSTRUCTION_PROBE), &[]);
    open.env = vec![env_var("DENIED", &denied)];
    create(&runs, "open", open).await;
    let first_line = |run: &SandboxRun| probe_lines(run).get("first").cloned().unwrap_or_default();
    let done = wait_run(&runs, "open", "the open run to end", &op, final_phase).await;
    assert!(
        first_line(&done).starts_with("ok denied from"),
        "{:?}",
        done.status
    );
    for (name, _) in kinds {
        let spec = SandboxRunSpec {
            template_ref: Some(TemplateRef::namespaced(name)),
            command: Some(vec![
                "sh".into(),
                "-c".into(),
                FIRST_INSTRUCTION_PROBE.into(),
            ]),
            ..Default::default()
        };
        let run = format!("{name}-run");
        create(&runs, &run, spec).await;
        let done = wait_run(
            &runs,
            &run,
            "the warm filtered run to end",
            &op,
            final_phase,
        )
        .await;
        let status = done.status.clone().expect("status");
        let warm = status.warm_start.clone().expect("warmStart");
        assert!(warm.pod.is_some(), "{name}: a pool pod was taken: {warm:?}");
        let line = first_line(&done);
        assert!(
            line.starts_with("fail"),
            "{name}: the warm run's first instruction was filtered: {line:?} {status:?}"
        );
        let seen = denied_peers.lock().expect("peers").clone();
        assert_eq!(
            seen.len(),
            1,
            "{name}: only the open run reached the node's listener: {seen:?}"
        );
    }
}

/// Issue #39 with Kueue on the real node (the operator's `--warm-pools --kueue`): a run made from
/// a pooled template and labelled with a LocalQueue gets its Workload and no pod until Kueue
/// admits it, then takes the pool's ready pod — its cold pod with the admitted flavor's node
/// labels has the pool's shape (the template already places its pods on that node) — and ends
/// Succeeded with its file, its Workload Finished.
#[tokio::test]
async fn a_queued_run_takes_a_warm_pool_pod_once_kueue_admits_it() {
    use sandboxrun_operator::api::{
        OpenField, SandboxRunPool, SandboxRunPoolSpec, SandboxRunTemplate, SandboxRunTemplateSpec,
        TemplateRef,
    };
    let client = client().await;
    ensure_crd(&client).await;
    let ns = restricted_namespace(&client, "pool-kueue").await;
    let tag = format!("sbr-{:08x}", rand_u32());
    let made = kueue_queue(&client, &ns.name, &tag).await;
    let (_dir, store_url) = file_store("pool-kueue");
    let op = start_operator_with(&ns.name, &store_url, &["--warm-pools", "--kueue"]);
    let mut spec = real_spec(Some("exit 9"), &["/work/out"]);
    // The flavor's node label (kueue_queue's): Kueue's placement changes nothing of this pod.
    spec.node_selector
        .get_or_insert_with(BTreeMap::new)
        .insert("kubernetes.io/hostname".into(), "real-node-0".into());
    let template = SandboxRunTemplate::new(
        "queued-agent",
        SandboxRunTemplateSpec {
            template: spec,
            open_fields: vec![OpenField::Command],
        },
    );
    Api::<SandboxRunTemplate>::namespaced(client.clone(), &ns.name)
        .create(&Default::default(), &template)
        .await
        .expect("create the template");
    let pools: Api<SandboxRunPool> = Api::namespaced(client.clone(), &ns.name);
    let pool = SandboxRunPool::new(
        "queued-agents",
        SandboxRunPoolSpec {
            template_ref: TemplateRef::namespaced("queued-agent"),
            replicas: 1,
        },
    );
    pools
        .create(&Default::default(), &pool)
        .await
        .expect("create the pool");
    eventually(
        "the pool's pod to be ready",
        Duration::from_secs(180),
        || {
            let pools = pools.clone();
            async move {
                let s = pools.get("queued-agents").await.ok()?.status?;
                (s.ready_replicas == 1).then_some(())
            }
        },
    )
    .await;
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let mut run = SandboxRun::new(
        "queued",
        SandboxRunSpec {
            template_ref: Some(TemplateRef::namespaced("queued-agent")),
            command: Some(vec![
                "sh".into(),
                "-c".into(),
                r#"echo queued-warm > "$ITERION_ARTIFACT_FILES_DIR/out.txt""#.into(),
            ]),
            ..Default::default()
        },
    );
    run.metadata.labels = Some(BTreeMap::from([(
        "kueue.x-k8s.io/queue-name".to_string(),
        "lq".to_string(),
    )]));
    runs.create(&Default::default(), &run)
        .await
        .expect("create the queued run");
    let done = wait_run(&runs, "queued", "the queued run to end", &op, final_phase).await;
    let status = done.status.clone().expect("status");
    assert_eq!(status.phase, Some(Phase::Succeeded), "{status:?}");
    assert!(
        status
            .conditions
            .iter()
            .any(|c| c.type_ == "Queued" && c.status == "False" && c.reason == "Admitted"),
        "admitted by Kueue: {status:?}"
    );
    let warm = status.warm_start.clone().expect("warmStart");
    assert!(warm.pod.is_some(), "a pool pod was taken: {warm:?}");
    let dest = files_get(&ns.name, "queued", &store_url, &[], &[])
        .unwrap_or_else(|e| panic!("files get failed: {e}"));
    let out = std::fs::read_to_string(extracted(&dest, 0).join("out.txt")).expect("out.txt");
    assert_eq!(out, "queued-warm\n");
    let workloads: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns.name,
        &sandboxrun_operator::kueue::workload_resource(),
    );
    eventually(
        "its Workload to be Finished",
        Duration::from_secs(60),
        || {
            let workloads = workloads.clone();
            async move {
                let w = workloads.get("queued-sbr").await.ok()?;
                let conditions = w.data["status"]["conditions"].as_array()?.clone();
                conditions
                    .iter()
                    .any(|c| c["type"] == "Finished" && c["status"] == "True")
                    .then_some(())
            }
        },
    )
    .await;
    drop(op);
    delete_kueue_cluster_objects(&client, made).await;
}

/// Issue #39 with `spec.retryPolicy` on the real node (`--warm-pools`): each attempt of a run made
/// from a pooled template asks the pool. The template's workload fails its first attempt (exit
/// 3) and succeeds its second; with a pool of two ready pods, both attempts take a pool pod — two
/// different ones (a pool pod serves one start) — the first attempt's pod is recorded in
/// `status.attempts[0]`, `status.warmStart` names the second's, and the second attempt's file is
/// drained. Before, a retry always started cold.
#[tokio::test]
async fn each_attempt_of_a_retried_run_takes_a_warm_pool_pod() {
    use sandboxrun_operator::api::{
        OpenField, RetryBackoff, RetryPolicy, SandboxRunPool, SandboxRunPoolSpec,
        SandboxRunTemplate, SandboxRunTemplateSpec, TemplateRef,
    };
    let client = client().await;
    ensure_crd(&client).await;
    let ns = restricted_namespace(&client, "pool-retry").await;
    let (_dir, store_url) = file_store("pool-retry");
    let op = start_operator_with(&ns.name, &store_url, &["--warm-pools"]);
    let mut spec = real_spec(Some("exit 9"), &["/work/out"]);
    spec.retry_policy = Some(RetryPolicy {
        limit: 2,
        backoff: Some(RetryBackoff {
            base_seconds: Some(1),
            factor: Some(1),
            cap_seconds: Some(1),
        }),
        rules: Vec::new(),
    });
    let template = SandboxRunTemplate::new(
        "retried",
        SandboxRunTemplateSpec {
            template: spec,
            open_fields: vec![OpenField::Command],
        },
    );
    Api::<SandboxRunTemplate>::namespaced(client.clone(), &ns.name)
        .create(&Default::default(), &template)
        .await
        .expect("create the template");
    let pools: Api<SandboxRunPool> = Api::namespaced(client.clone(), &ns.name);
    let pool = SandboxRunPool::new(
        "retried",
        SandboxRunPoolSpec {
            template_ref: TemplateRef::namespaced("retried"),
            replicas: 2,
        },
    );
    pools
        .create(&Default::default(), &pool)
        .await
        .expect("create the pool");
    eventually(
        "the pool's pods to be ready",
        Duration::from_secs(180),
        || {
            let pools = pools.clone();
            async move {
                let s = pools.get("retried").await.ok()?.status?;
                (s.ready_replicas == 2).then_some(())
            }
        },
    )
    .await;
    let pool_pod_names: Vec<String> = pool_pods(&client, &ns.name, "retried")
        .await
        .into_iter()
        .map(|p| p.0)
        .collect();
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let script = r#"echo "attempt $SANDBOXRUN_ATTEMPT" > "$ITERION_ARTIFACT_FILES_DIR/out.txt"; [ "$SANDBOXRUN_ATTEMPT" -ge 2 ] || exit 3"#;
    let spec = SandboxRunSpec {
        template_ref: Some(TemplateRef::namespaced("retried")),
        command: Some(vec!["sh".into(), "-c".into(), script.into()]),
        ..Default::default()
    };
    create(&runs, "flaky", spec).await;
    let done = wait_run(&runs, "flaky", "the retried run to end", &op, final_phase).await;
    let status = done.status.clone().expect("status");
    assert_eq!(status.phase, Some(Phase::Succeeded), "{status:?}");
    assert_eq!(status.attempts.len(), 1, "{status:?}");
    let first = status.attempts[0].pod_name.clone();
    let warm = status.warm_start.clone().expect("warmStart");
    assert_eq!(warm.attempt, Some(2), "{warm:?}");
    let second = warm.pod.clone().unwrap_or_default();
    // Pool pods of this template version are `<pool>-<hash>-<suffix>`: the first attempt took one
    // of the pods listed above; the pool makes another when a pod is claimed, and the second
    // attempt may take that one (a cold pod would be `flaky-sbr-2`).
    let version = pool_pod_names
        .first()
        .and_then(|n| n.rsplit_once('-'))
        .map(|(head, _)| format!("{head}-"))
        .expect("a pool pod name");
    assert!(
        pool_pod_names.contains(&first) && second.starts_with(&version) && first != second,
        "both attempts took a pool pod ({pool_pod_names:?} listed before the run): {first} then {second}"
    );
    let dest = files_get(&ns.name, "flaky", &store_url, &[], &[])
        .unwrap_or_else(|e| panic!("files get failed: {e}"));
    let out = std::fs::read_to_string(extracted(&dest, 0).join("out.txt")).expect("out.txt");
    assert_eq!(out, "attempt 2\n");
}

/// Issue #53 item 1 on the real node with the real Kueue running `waitForPodsReady` (hack/kueue.sh:
/// a short timeout, `KUEUE_PODS_READY_TIMEOUT`, 60s): a queued run whose pod becomes ready gets
/// `PodsReady=True` on its Workload and outlives the timeout (on the old code nothing wrote
/// PodsReady and Kueue evicted it after the timeout); a queued run whose pod is never ready (its
/// nodeSelector matches no node) is evicted by Kueue for `PodsReadyTimeout`, its attempt recorded
/// `Preempted` (never counted), and queued again.
#[tokio::test]
async fn a_ready_queued_run_outlives_kueues_pods_ready_timeout_and_a_never_ready_one_is_requeued() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = restricted_namespace(&client, "kueue-ready").await;
    let tag = format!("sbr-{:08x}", rand_u32());
    let made = kueue_queue(&client, &ns.name, &tag).await;
    let (_dir, store_url) = file_store("kueue-ready");
    let op = start_operator_with(&ns.name, &store_url, &["--kueue"]);
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let queued = |name: &str, script: &str, nowhere: bool| {
        let mut spec = real_spec(Some(script), &["/work/out"]);
        spec.resources = Some(k8s_openapi::api::core::v1::ResourceRequirements {
            requests: Some(BTreeMap::from([(
                "cpu".to_string(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity("300m".into()),
            )])),
            ..Default::default()
        });
        if nowhere {
            spec.node_selector = Some(BTreeMap::from([(
                "sandbox.iterion.io/nowhere".to_string(),
                "true".to_string(),
            )]));
        }
        let mut run = SandboxRun::new(name, spec);
        run.metadata.labels = Some(BTreeMap::from([(
            "kueue.x-k8s.io/queue-name".to_string(),
            "lq".to_string(),
        )]));
        run
    };
    // Longer than the bed's 60s timeout.
    let script = r#"echo ready > "$ITERION_ARTIFACT_FILES_DIR/ready.txt"; sleep 80"#;
    for run in [
        queued("ready", script, false),
        queued("never-ready", "sleep 5", true),
    ] {
        runs.create(&Default::default(), &run)
            .await
            .expect("create the run");
    }
    let workloads: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns.name,
        &sandboxrun_operator::kueue::workload_resource(),
    );
    let pods_ready = |w: &DynamicObject| {
        w.data["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "PodsReady")
            .map(|c| (c["status"].to_string(), c["reason"].to_string()))
    };
    // An attempt ended by Kueue's eviction, never counted; Kueue counts its PodsReadyTimeout
    // evictions in the Workload's requeueState (only that eviction increments it).
    let evicted_for_timeout = |r: &SandboxRun, w: Option<&DynamicObject>| {
        let attempt = r.status.as_ref().is_some_and(|s| {
            s.attempts
                .iter()
                .any(|a| a.reason == "Preempted" && !a.counted)
        });
        let timed_out = w.is_some_and(|w| {
            w.data["status"]["requeueState"]["count"]
                .as_i64()
                .is_some_and(|n| n >= 1)
        });
        attempt && timed_out
    };
    let (mut saw_ready, mut requeued) = (false, false);
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        if let Ok(w) = workloads.get("ready-sbr").await {
            saw_ready |= pods_ready(&w) == Some(("\"True\"".into(), "\"Started\"".into()));
        }
        let ready = runs.get("ready").await.expect("run");
        let never = runs.get("never-ready").await.expect("run");
        assert!(
            !final_phase(&never),
            "the never-ready run is requeued, not ended: {:?}",
            never.status
        );
        let never_workload = workloads.get("never-ready-sbr").await.ok();
        requeued |= evicted_for_timeout(&never, never_workload.as_ref());
        if final_phase(&ready) && requeued {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "ready: {:?}\nnever-ready: {:?}\n{}",
            ready.status,
            never.status,
            {
                let log = op.log_text();
                log[log.len().saturating_sub(4000)..].to_string()
            }
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        saw_ready,
        "the ready run's Workload said PodsReady=True Started"
    );
    let ready = runs.get("ready").await.expect("run");
    assert_eq!(phase(&ready), Some(Phase::Succeeded), "{:?}", ready.status);
    let attempts = ready
        .status
        .as_ref()
        .map(|s| s.attempts.clone())
        .unwrap_or_default();
    assert!(
        attempts.iter().all(|a| a.reason != "Preempted"),
        "the ready run was never evicted: {attempts:?}"
    );
    let dir = files_get_attempt(&ns.name, "ready", &store_url, 1);
    let kept = std::fs::read_to_string(dir.join("ready.txt")).expect("ready.txt");
    assert_eq!(kept.trim(), "ready");
    let _ = runs
        .patch(
            "never-ready",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"stop": true}})),
        )
        .await;
    drop(op);
    delete_kueue_cluster_objects(&client, made).await;
}
