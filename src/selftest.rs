//! `sandboxrun-operator selftest`: the chart's `helm test` (templates/tests/): applies one tiny
//! SandboxRun, waits until it ends `Succeeded` with every read-back path `Drained` and stored
//! (`status.readBack[].object` set), deletes it and waits until it is gone (the finalizer's
//! teardown, docs/contract.md §3), then says in one line what passed or why not. Only the
//! Kubernetes API is needed: the test pod runs the operator image, no kubectl.

use std::time::{Duration, Instant};

use clap::Args;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, ResourceExt};
use thiserror::Error;

use crate::api::{Phase, ReadBackPhase, SandboxRun};
use crate::plugin::cluster::{connect, ClusterArgs, ClusterError};
use crate::text::printable;

/// `selftest` arguments.
#[derive(Args, Debug)]
pub(crate) struct SelftestArgs {
    /// The SandboxRun to create, as YAML or JSON text (`metadata.generateName` keeps reruns apart).
    #[arg(long, env = "SANDBOXRUN_SELFTEST_RUN")]
    pub(crate) run: String,
    /// How long the run may take to end with its paths drained.
    #[arg(long, default_value = "3m", value_parser = duration)]
    pub(crate) timeout: Duration,
    /// How long its deletion (teardown, finalizer) may take once it ended.
    #[arg(long, default_value = "1m", value_parser = duration)]
    pub(crate) delete_timeout: Duration,
    /// Which cluster and namespace (in a pod: its own ServiceAccount and namespace).
    #[command(flatten)]
    pub(crate) cluster: ClusterArgs,
}

fn duration(text: &str) -> Result<Duration, crate::units::DurationError> {
    crate::units::parse_duration(text)
}

/// Why the selftest failed.
#[derive(Debug, Error)]
pub(crate) enum SelftestError {
    /// The manifest is not a SandboxRun.
    #[error("the run to create is not a SandboxRun manifest: {0}")]
    Manifest(String),
    /// No cluster.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    /// The apiserver refused or failed a request.
    #[error("{what}: {source}")]
    Api {
        /// What was being done.
        what: String,
        /// The error.
        #[source]
        source: kube::Error,
    },
    /// The run did not end as it should.
    #[error("{0}")]
    Verdict(String),
}

/// Why the run did not pass, or its deletion did not finish (the selftest's verdict says it).
#[derive(Debug, Error)]
pub(crate) enum NotPassed {
    /// It ended, not as it should ([`judge`]'s words).
    #[error("{0}")]
    Failed(String),
    /// Someone else deleted it first.
    #[error("the run was deleted by someone else before it ended")]
    DeletedByOthers,
    /// It did not end in time.
    #[error("it did not end within {secs}s (last seen: {last})")]
    TimedOut {
        /// The bound, in seconds.
        secs: u64,
        /// The last phase printed (`nothing` when none was).
        last: String,
    },
    /// The apiserver refused its deletion.
    #[error("deleting it failed: {0}")]
    DeleteFailed(#[source] kube::Error),
    /// It was still there past the bound.
    #[error(
        "it was still there {secs}s after its deletion (is the operator running and its finalizer done?)"
    )]
    StillThere {
        /// The bound, in seconds.
        secs: u64,
    },
}

/// What the run's status says so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Judgement {
    /// Not over yet: the phase so far.
    Pending(String),
    /// Succeeded and drained: the summary.
    Passed(String),
    /// Over, and not as it should: why.
    Failed(String),
}

/// Judges `run`: it must end `Succeeded` with at least one read-back path, each `Drained`, with
/// members stored and its object named in status.
pub(crate) fn judge(run: &SandboxRun) -> Judgement {
    let status = run.status.clone().unwrap_or_default();
    let Some(phase) = status.phase.filter(|p| p.is_final()) else {
        let so_far = status.phase.map(|p| p.as_str()).unwrap_or("no phase yet");
        let message = status.message.as_deref().map(printable).unwrap_or_default();
        return Judgement::Pending(format!("{so_far} {message}").trim().to_string());
    };
    let declared = run.spec.read_back_paths().len();
    let mut problems = Vec::new();
    if phase != Phase::Succeeded {
        problems.push(format!(
            "it ended {} ({})",
            phase.as_str(),
            printable(status.message.as_deref().unwrap_or("no message"))
        ));
        if let Some(w) = &status.workload {
            let said = w
                .message
                .as_deref()
                .map(|m| format!(": {}", printable(m.trim())))
                .unwrap_or_default();
            problems.push(format!("the workload exited {}{said}", w.exit_code));
        }
    }
    if declared == 0 {
        problems.push("it declares no read-back path, so nothing was drained".into());
    }
    if status.read_back.len() < declared {
        problems.push(format!(
            "status.readBack lists {} of {declared} declared path(s)",
            status.read_back.len()
        ));
    }
    let mut drained = Vec::new();
    for e in &status.read_back {
        let path = printable(&e.path);
        match (&e.phase, &e.object) {
            (ReadBackPhase::Drained, Some(object)) if e.members > 0 => drained.push(format!(
                "{path} Drained ({} member(s), {} byte(s)) at {}",
                e.members,
                e.bytes,
                printable(object)
            )),
            (ReadBackPhase::Drained, None) => problems.push(format!(
                "{path} is Drained but status names no stored object"
            )),
            (phase, _) => problems.push(format!(
                "path {path} ended {}, not Drained{}",
                phase.as_str(),
                e.message
                    .as_deref()
                    .map(|m| format!(": {}", printable(m)))
                    .unwrap_or_default()
            )),
        }
    }
    if problems.is_empty() {
        Judgement::Passed(drained.join("; "))
    } else {
        Judgement::Failed(problems.join("; "))
    }
}

/// Runs the selftest; `Ok` is the one-line summary of a pass.
pub(crate) async fn run(args: SelftestArgs) -> Result<String, SelftestError> {
    let mut manifest: SandboxRun =
        serde_yaml::from_str(&args.run).map_err(|e| SelftestError::Manifest(e.to_string()))?;
    if manifest.metadata.name.is_none() && manifest.metadata.generate_name.is_none() {
        manifest.metadata.generate_name = Some("sandboxrun-selftest-".into());
    }
    let (client, context_namespace) = connect(&args.cluster).await?;
    let namespace = args
        .cluster
        .namespace
        .clone()
        .or_else(|| manifest.metadata.namespace.clone())
        .unwrap_or(context_namespace);
    manifest.metadata.namespace = Some(namespace.clone());
    let runs: Api<SandboxRun> = Api::namespaced(client, &namespace);
    let created = runs
        .create(&PostParams::default(), &manifest)
        .await
        .map_err(|source| SelftestError::Api {
            what: format!("create a SandboxRun in {namespace}"),
            source,
        })?;
    let name = created.name_any();
    println!("selftest: created SandboxRun {namespace}/{name}");
    let outcome = wait_judged(&runs, &name, args.timeout).await;
    let deleted = delete_and_wait(&runs, &name, args.delete_timeout).await;
    let label = format!("{namespace}/{name}");
    match (outcome, deleted) {
        (Ok(summary), Ok(())) => Ok(format!("{label} Succeeded; {summary}; deleted")),
        (Ok(_), Err(e)) => Err(SelftestError::Verdict(format!("{label} passed, but {e}"))),
        (Err(e), Ok(())) => Err(SelftestError::Verdict(format!("{label}: {e} (deleted)"))),
        (Err(e), Err(d)) => Err(SelftestError::Verdict(format!("{label}: {e}; and {d}"))),
    }
}

/// Polls the run until [`judge`] has a verdict or `timeout` passes; prints each new phase.
async fn wait_judged(
    runs: &Api<SandboxRun>,
    name: &str,
    timeout: Duration,
) -> Result<String, NotPassed> {
    let start = Instant::now();
    let mut last = String::new();
    loop {
        match runs.get_opt(name).await {
            Ok(Some(run)) => match judge(&run) {
                Judgement::Passed(summary) => return Ok(summary),
                Judgement::Failed(why) => return Err(NotPassed::Failed(why)),
                Judgement::Pending(now) => {
                    if now != last {
                        println!("selftest: {name}: {now}");
                        last = now;
                    }
                }
            },
            Ok(None) => return Err(NotPassed::DeletedByOthers),
            Err(e) => tracing::warn!(error = %e, "reading the run failed; retrying"),
        }
        if start.elapsed() > timeout {
            let last = if last.is_empty() { "nothing" } else { &last };
            return Err(NotPassed::TimedOut {
                secs: timeout.as_secs(),
                last: last.to_string(),
            });
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Deletes the run and waits until the operator's finalizer let it go.
async fn delete_and_wait(
    runs: &Api<SandboxRun>,
    name: &str,
    timeout: Duration,
) -> Result<(), NotPassed> {
    if let Err(e) = runs.delete(name, &DeleteParams::default()).await {
        return Err(NotPassed::DeleteFailed(e));
    }
    let start = Instant::now();
    loop {
        match runs.get_opt(name).await {
            Ok(None) => return Ok(()),
            Ok(Some(_)) | Err(_) if start.elapsed() > timeout => {
                return Err(NotPassed::StillThere {
                    secs: timeout.as_secs(),
                })
            }
            _ => tokio::time::sleep(Duration::from_secs(1)).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ReadBackStatus, SandboxRunStatus, WorkloadTermination};

    fn run(phase: Option<Phase>, entries: Vec<ReadBackStatus>) -> SandboxRun {
        crate::testkit::sandbox_run("t")
            .read_back(&["/work/out"])
            .status(SandboxRunStatus {
                phase,
                read_back: entries,
                ..Default::default()
            })
            .build()
    }

    fn entry(phase: ReadBackPhase, object: Option<&str>, members: u64) -> ReadBackStatus {
        ReadBackStatus {
            path: "/work/out".into(),
            phase,
            object: object.map(str::to_string),
            members,
            message: (phase == ReadBackPhase::Failed).then(|| "no permission".to_string()),
            ..Default::default()
        }
    }

    #[test]
    fn only_a_succeeded_run_with_every_path_drained_and_stored_passes() {
        let ok = run(
            Some(Phase::Succeeded),
            vec![entry(
                ReadBackPhase::Drained,
                Some("s3://b/ns/t/u/00-work-out.tar"),
                1,
            )],
        );
        assert!(
            matches!(judge(&ok), Judgement::Passed(s) if s.contains("/work/out Drained (1 member(s)") && s.contains("s3://b/")),
        );
        assert!(
            matches!(judge(&run(Some(Phase::Running), vec![])), Judgement::Pending(p) if p.starts_with("Running"))
        );
        assert!(matches!(judge(&run(None, vec![])), Judgement::Pending(_)));
        let empty = run(
            Some(Phase::Succeeded),
            vec![entry(ReadBackPhase::Empty, None, 0)],
        );
        assert!(
            matches!(judge(&empty), Judgement::Failed(w) if w.contains("path /work/out ended Empty, not Drained"))
        );
        let no_object = run(
            Some(Phase::Succeeded),
            vec![entry(ReadBackPhase::Drained, None, 1)],
        );
        assert!(
            matches!(judge(&no_object), Judgement::Failed(w) if w.contains("names no stored object"))
        );
        let missing = run(Some(Phase::Succeeded), vec![]);
        assert!(matches!(judge(&missing), Judgement::Failed(w) if w.contains("lists 0 of 1")));
    }

    #[test]
    fn the_run_the_chart_renders_parses_as_a_sandboxrun() {
        // templates/tests/selftest.yaml passes it through `toJson`, which escapes `>` as \u003e.
        let text = r#"{"apiVersion":"sandbox.iterion.io/v1alpha1","kind":"SandboxRun","metadata":{"generateName":"r-selftest-"},"spec":{"command":["sh","-c","echo ok \u003e \"$ITERION_ARTIFACT_FILES_DIR/x\""],"image":"busybox","user":"1000:1000","readBack":{"paths":[{"path":"/work/out","required":true}]}}}"#;
        let run: SandboxRun = serde_yaml::from_str(text).expect("parses");
        assert_eq!(
            run.spec
                .command
                .as_deref()
                .and_then(|c| c.get(2))
                .map(String::as_str),
            Some("echo ok > \"$ITERION_ARTIFACT_FILES_DIR/x\"")
        );
        assert_eq!(run.spec.read_back_paths().len(), 1);
        assert!(serde_yaml::from_str::<SandboxRun>("kind: Pod\nspec: 3").is_err());
    }

    #[test]
    fn a_failed_run_says_how_the_workload_and_the_drain_ended() {
        let mut failed = run(
            Some(Phase::Failed),
            vec![entry(ReadBackPhase::Failed, None, 0)],
        );
        if let Some(s) = failed.status.as_mut() {
            s.message = Some("a required path failed".into());
            s.workload = Some(WorkloadTermination {
                exit_code: 0,
                ..Default::default()
            });
        }
        let Judgement::Failed(why) = judge(&failed) else {
            panic!("{:?}", judge(&failed))
        };
        assert!(
            why.contains("it ended Failed (a required path failed)"),
            "{why}"
        );
        assert!(why.contains("the workload exited 0"), "{why}");
        assert!(
            why.contains("path /work/out ended Failed, not Drained: no permission"),
            "{why}"
        );
    }
}
