//! Scenarios for the warm claim (`super::warm`, `super::plan::claim`; docs/user-guide.md
//! "Sandboxes for agents: warm pools") against the routing mock apiserver: the claim's plans
//! carried out by act through [`drive::carry_out`], each answer's follow-up planned by
//! `plan::after` — the requests sent, in order, with their bodies. The mock cannot serve
//! `pods/attach` nor `pods/exec` (upgraded connections): a hand-over to a launcher always fails
//! here, so the delivered start is covered by the unit tests of `plan::claim` and the bed's
//! warm-pool tests (`tests/it/real_node/warm.rs`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use object_store::memory::InMemory;
use serde_json::{json, Value};

use super::drive;
use super::plan::claim::{self, Claim, Cold, CLAIM_REQUEUE};
use super::plan::{Plan, Requeue};
use crate::api::SandboxRun;
use crate::controller::testkit::fixtures::{now, run_with};
use crate::controller::testkit::mock_apiserver::{self, apiserver, status_failure, Log, Route};
use crate::inpod::launch::StartMessage;

const POD: &str = "/api/v1/namespaces/ns/pods/agents-h-x1";
const POOL: &str = "/apis/sandbox.iterion.io/v1alpha1/namespaces/ns/sandboxrunpools/agents";
const RUN_STATUS: &str = "/apis/sandbox.iterion.io/v1alpha1/namespaces/ns/sandboxruns/demo/status";
const CREDS: &str = "/api/v1/namespaces/ns/secrets/creds";

/// The pool `agents` at resourceVersion `rv` with `misses` counted.
fn pool(rv: &str, misses: i64) -> Value {
    json!({
        "apiVersion": "sandbox.iterion.io/v1alpha1", "kind": "SandboxRunPool",
        "metadata": {"name": "agents", "namespace": "ns", "resourceVersion": rv},
        "spec": {"templateRef": {"name": "agent-tools"}, "replicas": 1},
        "status": {"misses": misses},
    })
}

/// The run `demo` (uid u1, in ns) as the apiserver answers a write.
fn written() -> Value {
    super::pipeline_scenarios::written(&run_with(&[("/out", false)]))
}

/// The claim of `agents-h-x1` for the run `demo` (`hand_over`: its start handed at the claim).
fn claim_of_demo(hand_over: bool) -> Claim {
    Claim {
        pool: "agents".into(),
        pod: "agents-h-x1".into(),
        message: StartMessage {
            run: "u1".into(),
            argv: vec!["true".into()],
            env: Vec::new(),
            refuse: None,
        },
        hand_over,
    }
}

/// The fresh claim's plan (no egress to restrict).
fn taking(hand_over: bool) -> Plan {
    let patch = json!({"metadata": {"resourceVersion": "5"}});
    claim::take(claim_of_demo(hand_over), patch, (None, Vec::new()))
}

/// `plan` carried out for `run` against `routes` in `ctx` (made with the mock): the requests
/// sent but its reads (the attach and exec to a launcher included), the log and the requeue.
async fn carried_in(
    ctx: &crate::controller::context::Context,
    log: &Log,
    run: &SandboxRun,
    plan: Plan,
) -> (Vec<String>, Requeue) {
    let requeue = drive::carry_out(ctx, run, "demo-sbr", None, plan, now())
        .await
        .expect("the claim is carried out");
    let writes = log
        .lines()
        .into_iter()
        .filter(|l| !l.starts_with("GET ") || l.ends_with("/attach") || l.ends_with("/exec"))
        .collect();
    (writes, requeue)
}

/// `plan` carried out for the run `demo` against `routes`.
async fn carried(routes: Vec<Route>, plan: Plan) -> (Vec<String>, Log, Requeue) {
    let (client, log) = apiserver(routes);
    let ctx = mock_apiserver::context(client, Arc::new(InMemory::new()));
    let run = run_with(&[("/out", false)]);
    let (writes, requeue) = carried_in(&ctx, &log, &run, plan).await;
    (writes, log, requeue)
}

/// Two runs race for one pod: the claim's patch carries the pod's resourceVersion, and the
/// loser's is refused (409). It writes nothing else (no attach, no status: it picks again
/// soon), and gives back its reservation so the burst's other runs may pick the pod.
#[tokio::test]
async fn a_pool_pod_another_run_took_first_is_left_its_reservation_given_back() {
    let taken = status_failure(409, "Conflict", "the object has been modified");
    let (client, log) = apiserver(vec![Route::fixed("PATCH", POD, 409, taken)]);
    let ctx = mock_apiserver::context(client, Arc::new(InMemory::new()));
    assert!(ctx.memory.claims.reserve("ns/agents-h-x1", "u1", now()));
    let run = run_with(&[("/out", false)]);
    let (writes, requeue) = carried_in(&ctx, &log, &run, taking(true)).await;
    assert_eq!(writes, [format!("PATCH {POD}")], "{:?}", log.lines());
    let patch = &log.exactly("PATCH", POD)[0];
    assert_eq!(patch.content_type, "application/merge-patch+json");
    assert_eq!(patch.body["metadata"]["resourceVersion"], "5");
    assert_eq!(requeue, Requeue::After(CLAIM_REQUEUE), "picks again soon");
    let held = ctx.memory.claims.held_by_others("other-run", now());
    assert!(held.is_empty(), "the reservation is given back: {held:?}");
}

/// A claimed pod whose parked launcher cannot be reached (the attach fails) is deleted, the
/// miss counted on the pool (guarded by the resourceVersion it was read at), and the run's
/// status says why it starts cold.
#[tokio::test]
async fn a_claimed_pod_whose_launcher_cannot_be_reached_is_deleted_and_the_run_starts_cold() {
    let routes = vec![
        Route::echo("PATCH", POD, 200),
        Route::echo("DELETE", POD, 200),
        Route::fixed("GET", &format!("{POOL}/status"), 200, pool("3", 4)),
        Route::echo("PATCH", &format!("{POOL}/status"), 200),
        Route::fixed("PATCH", RUN_STATUS, 200, written()),
    ];
    let (writes, log, requeue) = carried(routes, taking(true)).await;
    let expected = [
        format!("PATCH {POD}"),
        format!("GET {POD}/attach"),
        format!("DELETE {POD}"),
        format!("PATCH {POOL}/status"),
        format!("PATCH {RUN_STATUS}"),
    ];
    assert_eq!(writes, expected, "{:?}", log.lines());
    let miss = &log.exactly("PATCH", &format!("{POOL}/status"))[0];
    assert_eq!(
        miss.body,
        json!({"metadata": {"resourceVersion": "3"}, "status": {"misses": 5}})
    );
    let recorded = &log.exactly("PATCH", RUN_STATUS)[0].body["status"]["warmStart"];
    assert_eq!(recorded["pool"], "agents");
    assert!(recorded.get("pod").is_none_or(Value::is_null), "{recorded}");
    let why = recorded["coldReason"].as_str().unwrap_or_default();
    assert!(
        why.starts_with("the pool pod's launcher did not start the run"),
        "{why}"
    );
    assert_eq!(requeue, Requeue::After(CLAIM_REQUEUE));
}

/// A claim resumed after a restart whose launcher cannot be asked (`launch-status` fails) keeps
/// its pod: the pod is the run's, its tracking says what became of it; nothing is deleted and no
/// miss is counted.
#[tokio::test]
async fn a_resumed_claim_whose_launcher_cannot_be_asked_keeps_its_pod_and_records_it() {
    let routes = vec![Route::fixed("PATCH", RUN_STATUS, 200, written())];
    let run = run_with(&[("/out", false)]);
    let plan = claim::resume(&run, claim_of_demo(true), now());
    let (writes, log, _) = carried(routes, plan).await;
    let expected = [format!("GET {POD}/exec"), format!("PATCH {RUN_STATUS}")];
    assert_eq!(writes, expected, "{:?}", log.lines());
    let recorded = &log.exactly("PATCH", RUN_STATUS)[0].body["status"]["warmStart"];
    assert_eq!(recorded["pod"], "agents-h-x1");
}

/// A miss is counted on what the pool says when it is counted: a pool that changed between the
/// read and the patch (409) is read again and counted on that read.
#[tokio::test]
async fn a_miss_on_a_pool_that_changed_under_the_count_is_counted_again_on_a_fresh_read() {
    let reads = Arc::new(AtomicUsize::new(0));
    let patches = Arc::new(AtomicUsize::new(0));
    let routes = vec![
        Route::with("GET", &format!("{POOL}/status"), move |_| {
            let n = reads.fetch_add(1, Ordering::SeqCst);
            (200, pool(&(3 + n).to_string(), 4 + n as i64))
        }),
        Route::with(
            "PATCH",
            &format!("{POOL}/status"),
            move |seen| match patches.fetch_add(1, Ordering::SeqCst) {
                0 => (409, status_failure(409, "Conflict", "modified")),
                _ => (200, seen.body.clone()),
            },
        ),
        Route::fixed("PATCH", RUN_STATUS, 200, written()),
    ];
    let (writes, log, _) = carried(routes, claim::cold("agents", &Cold::NoReadyPod)).await;
    let count = format!("PATCH {POOL}/status");
    let expected = [count.clone(), count, format!("PATCH {RUN_STATUS}")];
    assert_eq!(writes, expected, "{:?}", log.lines());
    let second = &log.exactly("PATCH", &format!("{POOL}/status"))[1];
    assert_eq!(
        second.body,
        json!({"metadata": {"resourceVersion": "4"}, "status": {"misses": 6}}),
        "counted on what the pool says now"
    );
    let recorded = &log.exactly("PATCH", RUN_STATUS)[0].body["status"]["warmStart"];
    assert_eq!(recorded["coldReason"], "the pool had no ready pod");
}

/// Issue #54: an attempt that restores its paths takes a pool pod without its start: the pod is
/// made the run's and recorded (`status.warmStart.pod`), and nothing is attached to — the
/// restore stage restores into the pod, then hands the start over (docs/contract.md "Pause,
/// resume and fork").
#[tokio::test]
async fn a_restoring_run_served_warm_takes_the_pod_and_hands_no_start_at_the_claim() {
    let routes = vec![
        Route::echo("PATCH", POD, 200),
        Route::fixed("PATCH", RUN_STATUS, 200, written()),
    ];
    let (writes, log, requeue) = carried(routes, taking(false)).await;
    let expected = [format!("PATCH {POD}"), format!("PATCH {RUN_STATUS}")];
    assert_eq!(writes, expected, "{:?}", log.lines());
    let status = &log.exactly("PATCH", RUN_STATUS)[0].body["status"];
    assert_eq!(status["warmStart"]["pod"], "agents-h-x1");
    assert_eq!(status["warmStart"]["attempt"], 1);
    assert!(status["startTime"].is_string(), "{status}");
    assert_eq!(requeue, Requeue::After(CLAIM_REQUEUE));
}

/// The cold pod of a run whose env takes `TOKEN` from the Secret `creds`.
fn cold_with_secret_env() -> Pod {
    serde_json::from_value(json!({
        "spec": {"containers": [{
            "name": crate::pod::WORKLOAD_CONTAINER,
            "command": ["sh", "-c", "true"],
            "env": [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}}],
        }]},
    }))
    .unwrap()
}

/// Issue #54: a Secret the run's env names that the operator may not read (403) means a cold
/// start: no pod is claimed, the miss is counted, and the run's status names the Secret and the
/// variable (never a value).
#[tokio::test]
async fn a_run_whose_env_source_is_unreadable_starts_cold_naming_it_and_claims_nothing() {
    let forbidden = status_failure(403, "Forbidden", "secrets \"creds\" is forbidden");
    let routes = vec![
        Route::fixed("GET", CREDS, 403, forbidden),
        Route::fixed("GET", &format!("{POOL}/status"), 200, pool("3", 0)),
        Route::echo("PATCH", &format!("{POOL}/status"), 200),
        Route::fixed("PATCH", RUN_STATUS, 200, written()),
    ];
    let (client, log) = apiserver(routes);
    let ctx = mock_apiserver::context(client, Arc::new(InMemory::new()));
    let run = run_with(&[("/out", false)]);
    let why = super::warm::message_for(&ctx, &run, &cold_with_secret_env())
        .await
        .expect("a 403 is an answer, not an error")
        .expect_err("the value cannot be delivered");
    assert!(matches!(why, Cold::Env(_)), "{why}");
    let (writes, requeue) = carried_in(&ctx, &log, &run, claim::cold("agents", &why)).await;
    let expected = [
        format!("PATCH {POOL}/status"),
        format!("PATCH {RUN_STATUS}"),
    ];
    assert_eq!(writes, expected, "{:?}", log.lines());
    assert!(log.matching("PATCH", POD).is_empty(), "no pod is claimed");
    let recorded = &log.exactly("PATCH", RUN_STATUS)[0].body["status"]["warmStart"];
    let reason = recorded["coldReason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("TOKEN") && reason.contains("creds"),
        "{reason}"
    );
    assert_eq!(requeue, Requeue::After(CLAIM_REQUEUE));
}
