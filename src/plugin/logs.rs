//! `logs RUN` (`kubectl sandboxrun logs RUN`): the evidence of how a run ended, from its status,
//! so it outlives the pod (docs/contract.md §4: a failed drain is told, never an empty set). It
//! prints the phase and message, how the workload container terminated and its termination
//! message (`status.workload`, the kubelet's terminated state the operator copies before teardown),
//! and each read-back path's outcome; it says so in words when there is no evidence and when a
//! drain failed.

use std::io::Write;

use clap::Args;
use kube::ResourceExt;

use crate::api::{AttemptStatus, Phase, ReadBackPhase, SandboxRun, WorkloadTermination};
use crate::text::printable;

use super::cluster::ClusterArgs;

/// `logs` arguments.
#[derive(Args, Debug)]
pub(crate) struct LogsArgs {
    /// The SandboxRun name.
    pub(crate) run: String,
    /// Which cluster and namespace.
    #[command(flatten)]
    pub(crate) cluster: ClusterArgs,
}

/// Writes the report of `run` to `out`.
pub(crate) fn render(run: &SandboxRun, out: &mut impl Write) -> std::io::Result<()> {
    let namespace = run.namespace().unwrap_or_default();
    let name = run.name_any();
    let status = run.status.clone().unwrap_or_default();
    let phase = status.phase.map(|p| p.as_str()).unwrap_or("no phase yet");
    match status.message.as_deref() {
        Some(m) => writeln!(
            out,
            "SandboxRun {namespace}/{name}: {phase} ({})",
            printable(m)
        )?,
        None => writeln!(out, "SandboxRun {namespace}/{name}: {phase}")?,
    }
    match &status.workload {
        Some(w) => write_workload(out, w)?,
        None => writeln!(
            out,
            "{}",
            no_workload_words(status.phase, &namespace, status.pod_name.as_deref())
        )?,
    }
    write_attempts(out, &status.attempts)?;
    write_read_back(out, run)
}

/// The attempts that ended before the current one (`spec.retryPolicy`, `spec.suspend`): one line
/// each, with its exit code, reason, whether it counted, and its paths' drains.
fn write_attempts(out: &mut impl Write, attempts: &[AttemptStatus]) -> std::io::Result<()> {
    if attempts.is_empty() {
        return Ok(());
    }
    writeln!(out, "Earlier attempts:")?;
    for a in attempts {
        let exit = a
            .exit_code
            .map(|c| format!("exited {c}"))
            .unwrap_or_else(|| "did not exit".to_string());
        let counted = if a.counted { "counted" } else { "not counted" };
        let drains: Vec<String> = a
            .read_back
            .iter()
            .map(|e| format!("{} {}", printable(&e.path), e.phase.as_str()))
            .collect();
        writeln!(
            out,
            "  #{} {}: {exit}, {} ({counted}); files (--attempt {}): {}",
            a.index,
            printable(&a.pod_name),
            printable(&a.reason),
            a.index,
            if drains.is_empty() {
                "no paths".to_string()
            } else {
                drains.join(", ")
            }
        )?;
        if let Some(message) = &a.message {
            writeln!(out, "     {}", printable(message))?;
        }
    }
    Ok(())
}

/// How the workload ended, and its termination message as indented lines.
fn write_workload(out: &mut impl Write, w: &WorkloadTermination) -> std::io::Result<()> {
    let mut line = format!("Workload: exited {}", w.exit_code);
    if let Some(reason) = &w.reason {
        line.push_str(&format!(", reason {}", printable(reason)));
    }
    if let Some(signal) = w.signal {
        line.push_str(&format!(", signal {signal}"));
    }
    if let (Some(start), Some(end)) = (&w.started_at, &w.finished_at) {
        line.push_str(&format!(", ran {} to {}", start.0, end.0));
    }
    writeln!(out, "{line}")?;
    match w.message.as_deref().filter(|m| !m.trim().is_empty()) {
        Some(message) => {
            writeln!(out, "Termination message:")?;
            for l in message.lines() {
                writeln!(out, "  {}", printable(l))?;
            }
            Ok(())
        }
        None => writeln!(
            out,
            "Termination message: none (the workload wrote nothing to /dev/termination-log; the tail of its log is kept instead only when it fails)"
        ),
    }
}

/// Why there is no `status.workload`, by phase.
fn no_workload_words(phase: Option<Phase>, namespace: &str, pod: Option<&str>) -> String {
    match phase {
        Some(p) if p.is_final() => format!(
            "No termination evidence: the workload never terminated on its own (phase {}: a long-lived sandbox that was stopped, a deadline, or a pod lost or deleted before it ended); the conditions and Events say which (kubectl describe sbr -n {namespace} …)",
            p.as_str()
        ),
        _ => {
            let live = pod
                .map(|pod| format!("; while it runs: kubectl logs -n {namespace} {pod} -c workload"))
                .unwrap_or_default();
            format!("No termination evidence yet: the workload has not terminated{live}")
        }
    }
}

/// One line per read-back path, then whether the drain failed.
fn write_read_back(out: &mut impl Write, run: &SandboxRun) -> std::io::Result<()> {
    let declared = run.spec.read_back_paths().len();
    let entries = run
        .status
        .as_ref()
        .map(|s| s.read_back.as_slice())
        .unwrap_or_default();
    if declared == 0 && entries.is_empty() {
        return writeln!(out, "Read-back: no paths declared");
    }
    writeln!(out, "Read-back:")?;
    for e in entries {
        let mut line = format!("  {}  {}", printable(&e.path), e.phase.as_str());
        if matches!(e.phase, ReadBackPhase::Drained | ReadBackPhase::Capped) {
            line.push_str(&format!("  {} member(s), {} byte(s)", e.members, e.bytes));
        }
        if let Some(object) = &e.object {
            line.push_str(&format!("  {}", printable(object)));
        }
        if let Some(message) = &e.message {
            line.push_str(&format!("  ({})", printable(message)));
        }
        writeln!(out, "{line}")?;
    }
    let failed = entries
        .iter()
        .filter(|e| e.phase == ReadBackPhase::Failed)
        .count();
    let pending = declared.saturating_sub(entries.len())
        + entries
            .iter()
            .filter(|e| e.phase == ReadBackPhase::Pending)
            .count();
    let total = declared.max(entries.len());
    let namespace = run.namespace().unwrap_or_default();
    if failed > 0 {
        writeln!(
            out,
            "Drain: FAILED for {failed} of {total} path(s); the reason is in each path's message and the sandbox_runfiles_drain_failed Event (kubectl get events -n {namespace} --field-selector involvedObject.name={},reason=sandbox_runfiles_drain_failed)",
            run.name_any()
        )
    } else if pending > 0 {
        writeln!(
            out,
            "Drain: not done yet ({pending} of {total} path(s) pending)"
        )
    } else {
        writeln!(
            out,
            "Drain: every path has an outcome, none failed ({total} path(s))"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ReadBackStatus, SandboxRunStatus};

    fn run(status: SandboxRunStatus, paths: &[&str]) -> SandboxRun {
        crate::testkit::sandbox_run("job")
            .namespace("ns")
            .read_back(paths)
            .status(status)
            .build()
    }

    fn text(run: &SandboxRun) -> String {
        let mut out = Vec::new();
        render(run, &mut out).expect("render");
        String::from_utf8(out).expect("utf8")
    }

    #[test]
    fn a_failed_run_shows_its_exit_its_message_and_the_failed_drain() {
        let status = SandboxRunStatus {
            phase: Some(Phase::Failed),
            message: Some("workload failed with exit code 3".into()),
            workload: Some(WorkloadTermination {
                exit_code: 3,
                reason: Some("Error".into()),
                message: Some("disk full\n\x1b[31mred\n".into()),
                ..Default::default()
            }),
            read_back: vec![
                ReadBackStatus {
                    path: "/out".into(),
                    phase: ReadBackPhase::Drained,
                    members: 2,
                    bytes: 10,
                    object: Some("s3://b/ns/job/u/00-out.tar".into()),
                    ..Default::default()
                },
                ReadBackStatus {
                    path: "/log".into(),
                    phase: ReadBackPhase::Failed,
                    message: Some("exec refused".into()),
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let t = text(&run(status, &["/out", "/log"]));
        assert!(
            t.contains("ns/job: Failed (workload failed with exit code 3)"),
            "{t}"
        );
        assert!(t.contains("Workload: exited 3, reason Error"), "{t}");
        assert!(
            t.contains("  disk full\n  \\x1b[31mred\n"),
            "escaped, line by line: {t}"
        );
        assert!(
            t.contains("/out  Drained  2 member(s), 10 byte(s)  s3://b/"),
            "{t}"
        );
        assert!(t.contains("/log  Failed  (exec refused)"), "{t}");
        assert!(t.contains("Drain: FAILED for 1 of 2 path(s)"), "{t}");
        assert!(!t.contains('\x1b'), "{t:?}");
    }

    #[test]
    fn earlier_attempts_are_listed_with_their_exit_reason_and_drains() {
        use crate::api::AttemptStatus;
        let status = SandboxRunStatus {
            phase: Some(Phase::Succeeded),
            attempts: vec![AttemptStatus {
                index: 1,
                pod_name: "job-sbr".into(),
                exit_code: Some(3),
                reason: "WorkloadFailed".into(),
                message: Some("the workload exited with code 3; retried".into()),
                counted: true,
                read_back: vec![ReadBackStatus {
                    path: "/out".into(),
                    phase: ReadBackPhase::Failed,
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        let text = text(&run(status, &["/out"]));
        assert!(
            text.contains("Earlier attempts:")
                && text.contains("#1 job-sbr: exited 3, WorkloadFailed (counted); files (--attempt 1): /out Failed"),
            "{text}"
        );
        // A run that never retried says nothing of attempts.
        let plain = super::tests::text(&run(SandboxRunStatus::default(), &["/out"]));
        assert!(!plain.contains("attempts"), "{plain}");
    }

    #[test]
    fn no_evidence_is_said_in_words_by_phase() {
        let running = SandboxRunStatus {
            phase: Some(Phase::Running),
            pod_name: Some("job-sbr".into()),
            ..Default::default()
        };
        let t = text(&run(running, &["/out"]));
        assert!(t.contains("No termination evidence yet"), "{t}");
        assert!(t.contains("kubectl logs -n ns job-sbr -c workload"), "{t}");
        assert!(
            t.contains("Drain: not done yet (1 of 1 path(s) pending)"),
            "{t}"
        );
        let stopped = SandboxRunStatus {
            phase: Some(Phase::Stopped),
            ..Default::default()
        };
        let t = text(&run(stopped, &[]));
        assert!(
            t.contains("No termination evidence: the workload never terminated"),
            "{t}"
        );
        assert!(t.contains("Read-back: no paths declared"), "{t}");
        let silent = SandboxRunStatus {
            phase: Some(Phase::Succeeded),
            workload: Some(WorkloadTermination::default()),
            read_back: vec![ReadBackStatus {
                path: "/out".into(),
                phase: ReadBackPhase::Empty,
                ..Default::default()
            }],
            ..Default::default()
        };
        let t = text(&run(silent, &["/out"]));
        assert!(
            t.contains("Workload: exited 0\nTermination message: none"),
            "{t}"
        );
        assert!(
            t.contains("Drain: every path has an outcome, none failed (1 path(s))"),
            "{t}"
        );
    }
}
