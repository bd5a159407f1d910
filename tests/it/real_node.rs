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
//!
//! This file is the real node's kit (the bed, the images, the operator, and the helpers the
//! feature modules share); the tests live by feature in `real_node/`: `basics`, `drains`,
//! `egress`, `attempts` (retries, suspend, checkpoints), `warm`, `kueue`, `helm`, `samples`,
//! `session`, `two_nodes`, `chaos` and `upgrade`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, Namespace, Pod, Toleration};
use kube::api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use sandboxrun_operator::api::{
    OpenField, Phase, ReadBack, ReadBackPath, ReadBackPhase, SandboxRun, SandboxRunPool,
    SandboxRunSpec,
};
use serde_json::json;

use crate::support::*;

mod attempts;
mod basics;
mod chaos;
mod drains;
mod egress;
mod helm;
mod kueue;
mod pause;
mod samples;
mod session;
mod two_nodes;
mod upgrade;
mod warm;

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
        RealBed::with_flags(tag, &[]).await
    }

    /// [`RealBed::new`] with the operator started with more flags.
    async fn with_flags(tag: &str, flags: &[&str]) -> RealBed {
        let client = client().await;
        ensure_crd(&client).await;
        let ns = restricted_namespace(&client, tag).await;
        let (_dir, store_url) = file_store(tag);
        let op = start_operator_with(&ns.name, &store_url, flags);
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
        Command::new(kubectl_path())
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
    Command::new(kubectl_path())
        .args(["describe", "pods", "-n", ns])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
        .unwrap_or_default()
}

/// The toleration of the real node's taint, as a chart value.
fn real_node_toleration() -> serde_json::Value {
    json!({"key": REAL_NODE_LABEL, "operator": "Equal", "value": "true", "effect": "NoSchedule"})
}

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

/// `kubectl exec` of `sh -c script` in the workload container of `pod`.
fn exec_in_workload(ns: &str, pod: &str, script: &str) -> Output {
    Command::new(kubectl_path())
        .args([
            "exec", "-n", ns, pod, "-c", "workload", "--", "sh", "-c", script,
        ])
        .output()
        .expect("kubectl exec")
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

/// Waits (up to 60 s) until the Kueue Workload `name` in `ns` is Finished.
async fn workload_finished(client: &Client, ns: &str, name: &str) {
    let workloads: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        ns,
        &sandboxrun_operator::kueue::workload_resource(),
    );
    eventually(
        "its Workload to be Finished",
        Duration::from_secs(60),
        || {
            let workloads = workloads.clone();
            async move {
                let w = workloads.get(name).await.ok()?;
                let conditions = w.data["status"]["conditions"].as_array()?.clone();
                conditions
                    .iter()
                    .any(|c| c["type"] == "Finished" && c["status"] == "True")
                    .then_some(())
            }
        },
    )
    .await
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

/// How long a real-node pool's pods may take to be ready (images pulled, containers started).
const POOL_READY: Duration = Duration::from_secs(240);

/// A warm pool on the real node, the one way these tests make one: the template `template` of
/// `spec` (its runs may set `open`), and the pool `pool` of `replicas` of it, once all its pods
/// are ready; the pools of `ns`.
async fn real_pool(
    client: &Client,
    ns: &str,
    (template, pool): (&str, &str),
    (spec, open): (SandboxRunSpec, &[OpenField]),
    replicas: i32,
) -> Api<SandboxRunPool> {
    let pools = make_template_and_pool(
        client,
        ns,
        (template, pool),
        template_of(spec, open),
        replicas,
    )
    .await;
    wait_pool_ready(&pools, pool, replicas, POOL_READY).await;
    pools
}

/// [`real_pool`] of the template `agent` of `spec`, whose runs set their command, as the pool
/// `agents`.
async fn ready_pool(
    client: &Client,
    ns: &str,
    spec: SandboxRunSpec,
    replicas: i32,
) -> Api<SandboxRunPool> {
    real_pool(
        client,
        ns,
        ("agent", "agents"),
        (spec, &[OpenField::Command]),
        replicas,
    )
    .await
}
