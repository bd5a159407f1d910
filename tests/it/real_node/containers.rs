//! The real node's container runtime, asked directly: crictl against its containerd, runsc on its
//! gVisor sandboxes, the packer's process on this host, a script exec'd into a workload.

use super::*;

/// Runs crictl against the real node's containerd; fails the test on an error.
pub(super) fn crictl(args: &[&str]) -> Output {
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
pub(super) fn running_containers(ns: &str, pod: &str) -> Vec<String> {
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
pub(super) async fn containers_gone_within(ns: &str, pod: &str, limit: Duration) -> Duration {
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
pub(super) fn container_id(ns: &str, pod: &str, container: &str) -> Option<String> {
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
pub(super) fn runsc(args: &[&str]) -> Output {
    Command::new(bed_setting("SANDBOXRUN_TEST_RUNSC"))
        .arg("--root")
        .arg(state_dir().join("node/containerd/runsc-state/k8s.io"))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("runsc {args:?}: {e}"))
}

/// The pid of the packer draining `holder_path` on this host (the real node shares the host's
/// process table), once it runs.
pub(super) fn packer_pid(holder_path: &str) -> Option<u32> {
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
pub(super) fn packer_running(ns: &str, pod: &str, holder_path: &str) -> bool {
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
pub(super) fn exec_in_workload(ns: &str, pod: &str, script: &str) -> Output {
    Command::new(kubectl_path())
        .args([
            "exec", "-n", ns, pod, "-c", "workload", "--", "sh", "-c", script,
        ])
        .output()
        .expect("kubectl exec")
}
