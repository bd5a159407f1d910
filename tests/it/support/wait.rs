//! Waiting for the control plane: polls until a condition holds, and panics with what was awaited
//! (and the operator's log tail) when it does not in time. A test never skips or passes silently.

use std::time::Duration;

use kube::Api;
use sandboxrun_operator::api::{Phase, SandboxRun};

use super::operator::Operator;

/// How long a run may take to reach a phase before a test gives up on it.
pub const PHASE_TIMEOUT: Duration = Duration::from_secs(90);

/// Polls `f` every 200 ms until it returns Some, or panics with `what` and `context()` once
/// `timeout` has passed.
async fn poll<T, F, Fut>(what: &str, timeout: Duration, mut f: F, context: impl Fn() -> String) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = std::time::Instant::now();
    loop {
        if let Some(v) = f().await {
            return v;
        }
        if start.elapsed() > timeout {
            panic!(
                "timed out after {timeout:?} waiting for {what}{}",
                context()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Polls `f` every 200 ms until it returns Some or `timeout` passes (then panics with `what`).
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    poll(what, timeout, f, String::new).await
}

/// [`eventually`], with the last lines of the operator's log in the failure message.
pub async fn eventually_or_log<T, F, Fut>(what: &str, timeout: Duration, op: &Operator, f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    poll(what, timeout, f, || log_tail(op)).await
}

/// Waits (up to `timeout`) until the run `name` satisfies `pred`; `what` says what was awaited.
pub async fn wait_for<F>(
    runs: &Api<SandboxRun>,
    name: &str,
    op: &Operator,
    timeout: Duration,
    what: &str,
    pred: F,
) -> SandboxRun
where
    F: Fn(&SandboxRun) -> bool,
{
    wait_for_reporting(runs, name, op, timeout, what, pred, String::new).await
}

/// [`wait_for`], adding `report()` (e.g. the node's pressure conditions) to the failure message
/// after the operator's log.
pub async fn wait_for_reporting<F>(
    runs: &Api<SandboxRun>,
    name: &str,
    op: &Operator,
    timeout: Duration,
    what: &str,
    pred: F,
    report: impl Fn() -> String,
) -> SandboxRun
where
    F: Fn(&SandboxRun) -> bool,
{
    let what = format!("{name} {what}");
    let ok = &pred;
    poll(
        &what,
        timeout,
        || {
            let runs = runs.clone();
            let name = name.to_string();
            async move {
                let r = runs.get(&name).await.ok()?;
                ok(&r).then_some(r)
            }
        },
        || format!("{}{}", log_tail(op), report()),
    )
    .await
}

/// The last lines of the operator's log, for a failure message.
fn log_tail(op: &Operator) -> String {
    let log = op.log_text();
    let tail: Vec<&str> = log.lines().rev().take(60).collect();
    format!(
        "; operator log (last lines):\n{}",
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    )
}

/// Waits (up to [`PHASE_TIMEOUT`]) until the run `name` is in phase `want`.
pub async fn wait_phase(
    runs: &Api<SandboxRun>,
    name: &str,
    want: Phase,
    op: &Operator,
) -> SandboxRun {
    wait_phase_within(runs, name, want, op, PHASE_TIMEOUT).await
}

/// [`wait_phase`] with its own timeout.
pub async fn wait_phase_within(
    runs: &Api<SandboxRun>,
    name: &str,
    want: Phase,
    op: &Operator,
    timeout: Duration,
) -> SandboxRun {
    let what = format!("to reach {want:?}");
    wait_for(runs, name, op, timeout, &what, |r| phase(r) == Some(want)).await
}

/// Waits (up to `timeout`) until the run `name` is in a final phase.
pub async fn wait_final(
    runs: &Api<SandboxRun>,
    name: &str,
    op: &Operator,
    timeout: Duration,
) -> SandboxRun {
    wait_for(runs, name, op, timeout, "to reach a final phase", |r| {
        phase(r).is_some_and(|p| p.is_final())
    })
    .await
}

/// The run's phase, if its status has one.
pub fn phase(run: &SandboxRun) -> Option<Phase> {
    run.status.as_ref().and_then(|s| s.phase)
}

/// Waits (up to `timeout`) until the object `name` of `api` no longer exists.
pub async fn wait_gone<K>(api: &Api<K>, name: &str, op: &Operator, timeout: Duration)
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    eventually_or_log(&format!("{name} to be gone"), timeout, op, || async {
        api.get_opt(name).await.ok()?.is_none().then_some(())
    })
    .await
}
