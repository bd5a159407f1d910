//! Waiting on a run on the real node: until it satisfies a condition (with the node's own report
//! when it times out), its phase, its Events, its pod's name.

use super::*;

/// Waits until the run satisfies `done` (real pulls and container starts take seconds).
pub(super) async fn wait_run(
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
pub(super) fn node_report() -> String {
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

pub(super) fn phase_is(want: Phase) -> impl Fn(&SandboxRun) -> bool {
    move |r| phase(r) == Some(want)
}

pub(super) fn final_phase(r: &SandboxRun) -> bool {
    phase(r).is_some_and(Phase::is_final)
}

/// The Events about a run, oldest first, as "reason: note" lines.
pub(super) async fn run_events(client: &Client, ns: &str, run: &str) -> Vec<String> {
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

/// The run, once its status names its pod.
pub(super) async fn wait_for_pod_name(runs: &Api<SandboxRun>, run: SandboxRun) -> SandboxRun {
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
