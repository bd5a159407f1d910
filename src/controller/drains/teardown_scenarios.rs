//! Scenarios for a teardown (`teardown::claimed_teardown`, as the drain pool runs it) against
//! a routing mock apiserver, with pods no drain can exec into: a workload that never started
//! (its paths `Empty`) and a holder that is not running (its paths `Failed`, with the contract's
//! Warning). Asserted: the statuses written, the Events, the pod deleted at once and the
//! finalizer released when the run is being deleted.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateTerminated, ContainerStatus, Pod, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use object_store::memory::InMemory;
use serde_json::{json, Value};

use super::teardown::claimed_teardown;
use crate::api::{Phase, SandboxRun, SandboxRunStatus};
use crate::controller::context::Context;
use crate::controller::run::decide::Trigger;
use crate::controller::run::pipeline_scenarios::{run, written};
use crate::controller::run::plan::testing::deleting;
use crate::controller::run::plan::{IN_FLIGHT_REQUEUE, SETTLE};
use crate::controller::testkit::fixtures::now;
use crate::controller::testkit::mock_apiserver::{apiserver, context, Log, Route};
use crate::identity::RunId;
use crate::pod::{HOLDER_CONTAINER, WORKLOAD_CONTAINER};

/// Starts the teardown of `run`, whose identity it has (as a reconcile's observation gives it).
fn start(ctx: &Arc<Context>, run: &Arc<SandboxRun>, trigger: Trigger) {
    let id = RunId::of(run).expect("a run read from the apiserver has its identity");
    super::teardown::start(ctx, (run, &id), trigger);
}

const RUN: &str = "/apis/sandbox.iterion.io/v1alpha1/namespaces/ns/sandboxruns/demo";
const STATUS: &str = "/apis/sandbox.iterion.io/v1alpha1/namespaces/ns/sandboxruns/demo/status";
const POD: &str = "/api/v1/namespaces/ns/pods/demo-sbr";
const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/ns/events";

/// The run's pod (owned by it), its containers in `statuses` (also the checkpoint scenarios').
pub(crate) fn pod(statuses: Vec<ContainerStatus>) -> Pod {
    let mut pod = Pod::default();
    pod.metadata.name = Some("demo-sbr".into());
    pod.metadata.namespace = Some("ns".into());
    pod.metadata.uid = Some("p1".into());
    pod.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "sandbox.iterion.io/v1alpha1".into(),
        kind: "SandboxRun".into(),
        name: "demo".into(),
        uid: "u1".into(),
        controller: Some(true),
        ..Default::default()
    }]);
    pod.status = Some(PodStatus {
        container_statuses: Some(statuses),
        ..Default::default()
    });
    pod
}

fn exited(name: &str, exit_code: i32) -> ContainerStatus {
    ContainerStatus {
        name: name.into(),
        state: Some(ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code,
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Runs the teardown of `run` with `trigger` against a mock apiserver that has `pod`, with the
/// quiet window `settle`; returns what the apiserver was sent.
async fn teardown(run: SandboxRun, pod: &Pod, trigger: Trigger, settle: Duration) -> Log {
    let routes = vec![
        Route::fixed("GET", POD, 200, serde_json::to_value(pod).unwrap()),
        Route::fixed("DELETE", POD, 200, serde_json::to_value(pod).unwrap()),
        Route::fixed("PATCH", RUN, 200, written(&run)),
        Route::echo("POST", EVENTS, 201),
    ];
    let (client, log) = apiserver(routes);
    let ctx = context(client, Arc::new(InMemory::new())).with_quiet_window(settle);
    claimed_teardown(&ctx, &run, &trigger, None)
        .await
        .expect("the teardown succeeds");
    log
}

/// The `status` of each status write, in order.
fn statuses(log: &Log) -> Vec<Value> {
    log.matching("PATCH", STATUS)
        .into_iter()
        .map(|s| s.body["status"].clone())
        .collect()
}

/// (type, reason) of each Event published, in order.
fn events(log: &Log) -> Vec<(String, String)> {
    log.matching("POST", EVENTS)
        .into_iter()
        .map(|s| {
            let field = |k: &str| s.body[k].as_str().unwrap_or_default().to_string();
            (field("type"), field("reason"))
        })
        .collect()
}

/// The pod was deleted at once, after the final status, then the finalizer released last.
fn assert_deleted_then_released(log: &Log) {
    let lines = log.lines();
    let at = |line: String| {
        lines
            .iter()
            .rposition(|l| *l == line)
            .unwrap_or_else(|| panic!("no {line}: {lines:?}"))
    };
    let (status, delete, release) = (
        at(format!("PATCH {STATUS}")),
        at(format!("DELETE {POD}")),
        at(format!("PATCH {RUN}")),
    );
    assert!(status < delete && delete < release, "{lines:?}");
    assert_eq!(release, lines.len() - 1, "{lines:?}");
    assert_eq!(log.matching("DELETE", POD)[0].body["gracePeriodSeconds"], 0);
    assert_eq!(
        log.exactly("PATCH", RUN)[0].body,
        json!({"metadata": {"finalizers": [], "resourceVersion": "7"}})
    );
}

#[tokio::test]
async fn a_deleted_run_whose_workload_never_started_ends_empty_within_the_quiet_window() {
    let mut r = deleting(run());
    r.status = Some(SandboxRunStatus {
        phase: Some(Phase::Pending),
        pod_name: Some("demo-sbr".into()),
        ..Default::default()
    });
    // No container has started: nothing was written, nothing to exec into.
    let log = teardown(r, &pod(Vec::new()), Trigger::Deleting, SETTLE).await;
    // Every path's outcome is known at once: the opening waits out the quiet window, so only
    // the end is written.
    let written = statuses(&log);
    assert_eq!(written.len(), 1, "{:?}", log.lines());
    let end = &written[0];
    assert_eq!(end["readBack"][0]["path"], "/out");
    assert_eq!(end["readBack"][0]["phase"], "Empty");
    assert!(
        events(&log).iter().all(|(kind, _)| kind == "Normal"),
        "{:?}",
        events(&log)
    );
    assert!(!events(&log).is_empty());
    assert_eq!(log.lines()[0], format!("GET {POD}"));
    assert!(
        !log.lines().iter().any(|l| l.ends_with("/exec")),
        "no exec: {:?}",
        log.lines()
    );
    assert_deleted_then_released(&log);
}

/// A run that ran (its workload exited), its holder stopped too.
fn ran() -> (SandboxRun, Pod) {
    let mut r = run();
    r.status = Some(SandboxRunStatus {
        phase: Some(Phase::Running),
        pod_name: Some("demo-sbr".into()),
        start_time: Some(Time(now())),
        ..Default::default()
    });
    let pod = pod(vec![
        exited(HOLDER_CONTAINER, 137),
        exited(WORKLOAD_CONTAINER, 0),
    ]);
    (r, pod)
}

#[tokio::test]
async fn a_deleted_run_whose_holder_is_not_running_fails_its_paths_with_the_contract_warning() {
    let (r, pod) = ran();
    let log = teardown(deleting(r), &pod, Trigger::Deleting, Duration::ZERO).await;
    // No quiet window: the opening (Draining) is written at once, then the end.
    let written = statuses(&log);
    assert_eq!(written.len(), 2, "{:?}", log.lines());
    assert_eq!(written[0]["phase"], "Draining");
    assert_eq!(written[0]["readBack"][0]["phase"], "Pending");
    let end = &written[1];
    assert_eq!(end["readBack"][0]["phase"], "Failed");
    let message = end["readBack"][0]["message"].as_str().unwrap_or_default();
    assert!(message.contains("holder container is not running"), "{end}");
    let published = events(&log);
    assert_eq!(published[0], ("Normal".into(), "TearingDown".into()));
    assert!(
        published.contains(&("Warning".into(), "sandbox_runfiles_drain_failed".into())),
        "{published:?}"
    );
    assert_deleted_then_released(&log);
}

#[tokio::test]
async fn a_stopped_run_whose_holder_is_not_running_keeps_its_finalizer() {
    let (mut r, pod) = ran();
    r.spec.stop = true;
    let log = teardown(r, &pod, Trigger::Stop, Duration::ZERO).await;
    let written = statuses(&log);
    let end = written.last().expect("the end is written");
    assert_eq!(end["readBack"][0]["phase"], "Failed");
    assert!(
        events(&log).contains(&("Warning".into(), "sandbox_runfiles_drain_failed".into())),
        "{:?}",
        events(&log)
    );
    assert_eq!(log.matching("DELETE", POD).len(), 1, "{:?}", log.lines());
    assert!(
        log.exactly("PATCH", RUN).is_empty(),
        "the finalizer of a run not being deleted stays: {:?}",
        log.lines()
    );
}

/// A context over a mock apiserver that has `pod` (every write a teardown of `run` makes
/// routed; a status write answers the run at resourceVersion 8), for a teardown started in the
/// drain pool as a reconcile starts it.
fn pooled(run: &SandboxRun, pod: &Pod) -> (Arc<Context>, Log) {
    let routes = vec![
        Route::fixed("GET", POD, 200, serde_json::to_value(pod).unwrap()),
        Route::fixed("DELETE", POD, 200, serde_json::to_value(pod).unwrap()),
        Route::fixed("PATCH", RUN, 200, written(run)),
        Route::echo("POST", EVENTS, 201),
    ];
    let (client, log) = apiserver(routes);
    let ctx = context(client, Arc::new(InMemory::new())).with_quiet_window(Duration::ZERO);
    (Arc::new(ctx), log)
}

/// A stopped run whose teardown is started in the pool, then reconciled (as the controller
/// would, woken by a watch event) on the run at `seen`, while the teardown is in flight: that
/// reconcile only looks again after the in-flight requeue. Returns the context, what the
/// apiserver was sent, and the pool's drain ends as seen from before the start.
async fn found_draining(
    seen: &str,
) -> (
    Arc<Context>,
    Log,
    tokio::sync::broadcast::Receiver<ObjectRef<SandboxRun>>,
) {
    let (mut r, pod) = ran();
    r.spec.stop = true;
    let (ctx, log) = pooled(&r, &pod);
    let ends = ctx.in_flight.drains.ends();
    let run = Arc::new(r);
    start(&ctx, &run, Trigger::Stop);
    let mut cached = SandboxRun::clone(&run);
    cached.metadata.resource_version = Some(seen.into());
    // The pool's task has not run yet (one thread): the reconcile finds the run draining.
    let action = crate::controller::reconcile_run(Arc::new(cached), Arc::clone(&ctx))
        .await
        .expect("the reconcile succeeds");
    assert_eq!(action, Action::requeue(IN_FLIGHT_REQUEUE));
    (ctx, log, ends)
}

/// docs/contract.md "A run's next step follows its drain": a reconcile that found the run
/// draining on the version its drain's last status write made (the watch event of that write,
/// come before the drain was freed) is made again as the drain ends — the run free, its end
/// written — not left to the 30 s in-flight requeue (issue #55 item 4: a retry's 5 s backoff
/// became 30 s, a Kueue Workload was marked Finished up to 30 s late). Fails on the old code:
/// nothing woke the run.
#[tokio::test]
async fn a_run_found_draining_on_its_drains_last_write_is_reconciled_again_as_the_drain_ends() {
    let (ctx, log, mut ends) = found_draining("8").await;
    let woken = tokio::time::timeout(Duration::from_secs(5), ends.recv())
        .await
        .expect("the drain's end wakes the run, not the 30 s requeue")
        .expect("a wake");
    assert_eq!(woken, ObjectRef::new("demo").within("ns"));
    assert!(
        !ctx.in_flight.drains.is_in_flight("u1"),
        "the run is free before it is woken: the reconcile the wake makes goes on"
    );
    let written = statuses(&log);
    let end = written.last().expect("the end is written before the wake");
    assert_eq!(end["readBack"][0]["phase"], "Failed", "{written:?}");
    assert_eq!(log.matching("DELETE", POD).len(), 1, "{:?}", log.lines());
}

/// The other half of "A run's next step follows its drain": a reconcile that found the run
/// draining on a version older than its drain's last write is not replayed — it would decide
/// on a run that does not show the drain's end, and start its teardown again; that write's
/// own watch event, still to come, reconciles the run.
#[tokio::test]
async fn a_run_found_draining_before_its_drains_last_write_is_left_to_that_writes_event() {
    let (ctx, log, mut ends) = found_draining("7").await;
    assert!(ctx.in_flight.drains.wait(Duration::from_secs(10)).await);
    assert!(!statuses(&log).is_empty(), "{:?}", log.lines());
    assert!(
        matches!(
            ends.try_recv(),
            Err(tokio::sync::broadcast::error::TryRecvError::Empty)
        ),
        "no wake on a cache older than the drain's last write"
    );
}

/// The run `other` (uid u2), ran like [`ran`]'s, and its pod `other-sbr`.
fn other_ran() -> (SandboxRun, Pod) {
    let (mut r, mut pod) = ran();
    r.metadata.name = Some("other".into());
    r.metadata.uid = Some("u2".into());
    if let Some(status) = r.status.as_mut() {
        status.pod_name = Some("other-sbr".into());
    }
    pod.metadata.name = Some("other-sbr".into());
    pod.metadata.uid = Some("p2".into());
    for owner in pod.metadata.owner_references.iter_mut().flatten() {
        owner.name = "other".into();
        owner.uid = "u2".into();
    }
    (r, pod)
}

/// docs/contract.md "Fair drain slots": a teardown gives its drain slot back once its drains
/// are done, so the next teardown starts while the first one's end (its final status, its
/// Event, its pod's delete) is still being written — at N = 1,000 a slot was held ~1 s a
/// teardown, of which the drain ~0.3 s (docs/performance.md "Full lifecycles"). One slot, two
/// stopped runs; the first one's final status write is held by the apiserver. Fails on the old
/// code: the second teardown waited for the first one's end.
#[tokio::test]
async fn a_teardown_gives_its_slot_back_before_its_end_is_written() {
    const OTHER_RUN: &str = "/apis/sandbox.iterion.io/v1alpha1/namespaces/ns/sandboxruns/other";
    const OTHER_POD: &str = "/api/v1/namespaces/ns/pods/other-sbr";
    let ((mut first, first_pod), (mut second, second_pod)) = (ran(), other_ran());
    first.spec.stop = true;
    second.spec.stop = true;
    let (gate, held) = tokio::sync::watch::channel(false);
    let routes = vec![
        Route::fixed("GET", POD, 200, serde_json::to_value(&first_pod).unwrap()),
        Route::fixed(
            "GET",
            OTHER_POD,
            200,
            serde_json::to_value(&second_pod).unwrap(),
        ),
        Route::fixed(
            "DELETE",
            POD,
            200,
            serde_json::to_value(&first_pod).unwrap(),
        ),
        Route::fixed(
            "DELETE",
            OTHER_POD,
            200,
            serde_json::to_value(&second_pod).unwrap(),
        ),
        Route::fixed("PATCH", STATUS, 200, written(&first)).held(held),
        Route::fixed("PATCH", OTHER_RUN, 200, written(&second)),
        Route::echo("POST", EVENTS, 201),
    ];
    let (client, log) = apiserver(routes);
    let ctx = Arc::new(context(client, Arc::new(InMemory::new())).with_quiet_window(SETTLE));
    start(&ctx, &Arc::new(first), Trigger::Stop);
    start(&ctx, &Arc::new(second), Trigger::Stop);
    let second_ended = async {
        while log.matching("DELETE", OTHER_POD).is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    let ended = tokio::time::timeout(Duration::from_secs(5), second_ended).await;
    assert!(
        ended.is_ok(),
        "the second teardown waited for the first one's end: {:?}",
        log.lines()
    );
    assert_eq!(log.matching("PATCH", STATUS).len(), 1, "{:?}", log.lines());
    assert!(
        ctx.in_flight.drains.is_in_flight("u1"),
        "in flight until its end is written"
    );
    let _ = gate.send(true);
    assert!(ctx.in_flight.drains.wait(Duration::from_secs(10)).await);
    assert_eq!(log.matching("DELETE", POD).len(), 1, "{:?}", log.lines());
    assert!(!ctx.in_flight.drains.is_in_flight("u1"));
}
