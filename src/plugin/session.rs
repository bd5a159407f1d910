//! A live sandbox as a session (issue #40; docs/user-guide.md "Sandboxes for agents"): `kubectl
//! sandboxrun exec RUN -- CMD…`, `shell RUN` and `cp` into and out of its read-back paths. Every
//! call is made with the caller's own kubeconfig ([`super::cluster`]): the apiserver checks the
//! caller's `pods/exec`, never the operator's. This file is the pure part: which pod and
//! container a run's session goes to, what a `cp` operand names, and that a copied path lies
//! inside a declared read-back path; `crate::cmd::session` does the I/O.

use clap::Args;
use thiserror::Error;

use super::cluster::ClusterArgs;
use crate::api::{Phase, SandboxRun};

/// Arguments of `exec`.
#[derive(Args, Debug)]
pub struct ExecArgs {
    /// The SandboxRun.
    pub run: String,
    /// The container: `workload` (the run's own) or `holder`.
    #[arg(short = 'c', long, default_value = crate::pod::WORKLOAD_CONTAINER)]
    pub container: String,
    /// Pass this process's stdin to the command.
    #[arg(short = 'i', long)]
    pub stdin: bool,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// Arguments of `shell`.
#[derive(Args, Debug)]
pub struct ShellArgs {
    /// The SandboxRun.
    pub run: String,
    /// The shell to start in the workload (it must be in the image).
    #[arg(long, default_value = "sh")]
    pub shell: String,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// Arguments of `cp`.
#[derive(Args, Debug)]
pub struct CpArgs {
    /// `RUN:PATH` to copy a file out of the sandbox, or a local file to copy in.
    pub source: String,
    /// A local file, or `RUN:PATH` (a file inside one of the run's read-back paths).
    pub destination: String,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// Arguments of `checkpoint`.
#[derive(Args, Debug)]
pub struct CheckpointArgs {
    /// The SandboxRun.
    pub run: String,
    /// The token to set in `spec.checkpoint` (default: `kubectl-<unix time>`); a token the run
    /// has already answered asks nothing new.
    #[arg(long)]
    pub token: Option<String>,
    /// How long to wait for the checkpoint to be recorded (0: do not wait).
    #[arg(long, default_value = "5m")]
    pub timeout: String,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// What a recorded checkpoint says, as the verb prints it, and whether every path was kept
/// (none `Failed`, not refused).
pub fn checkpoint_report(cp: &crate::api::CheckpointStatus) -> (String, bool) {
    use std::fmt::Write;
    let mut out = format!("checkpoint {} (token {})", cp.index, cp.token);
    if let Some(refused) = &cp.message {
        let _ = write!(out, ": refused: {refused}");
        return (out, false);
    }
    let mut kept = true;
    for path in &cp.read_back {
        let failed = path.phase == crate::api::ReadBackPhase::Failed;
        kept &= !failed;
        let _ = write!(out, "\n  {}: {:?}", path.path, path.phase);
        if let Some(message) = path.message.as_deref().filter(|_| failed) {
            let _ = write!(out, " ({message})");
        }
    }
    let _ = write!(
        out,
        "\n  read back with: files get {{run}} --checkpoint {}",
        cp.index
    );
    (out, kept)
}

#[cfg(test)]
mod checkpoint_tests {
    use super::*;
    use crate::api::{CheckpointStatus, ReadBackPhase, ReadBackStatus};

    #[test]
    fn a_checkpoint_report_names_each_path_and_fails_on_a_failed_or_refused_one() {
        let path = |p: &str, phase, message: Option<&str>| ReadBackStatus {
            path: p.into(),
            phase,
            message: message.map(str::to_string),
            ..Default::default()
        };
        let mut cp = CheckpointStatus {
            index: 2,
            token: "t".into(),
            read_back: vec![
                path("/out", ReadBackPhase::Drained, None),
                path("/empty", ReadBackPhase::Empty, None),
            ],
            ..Default::default()
        };
        let (text, kept) = checkpoint_report(&cp);
        assert!(kept, "{text}");
        assert!(
            text.contains("/out: Drained") && text.contains("--checkpoint 2"),
            "{text}"
        );
        cp.read_back[1] = path("/locked", ReadBackPhase::Failed, Some("permission denied"));
        let (text, kept) = checkpoint_report(&cp);
        assert!(
            !kept && text.contains("/locked: Failed (permission denied)"),
            "{text}"
        );
        cp.message = Some("the run's checkpoint limit (1) is reached".into());
        let (text, kept) = checkpoint_report(&cp);
        assert!(
            !kept && text.contains("refused: the run's checkpoint limit"),
            "{text}"
        );
    }
}

/// Why a session cannot be had.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum SessionError {
    /// The run has no live pod.
    #[error("SandboxRun {0} is {1}: there is no live sandbox to reach")]
    NotRunning(String, String),
    /// Neither or both operands name a run.
    #[error("cp copies between a local file and RUN:PATH: exactly one operand names a run ({0:?}, {1:?})")]
    Operands(String, String),
    /// The path is not a clean absolute path inside a declared read-back path.
    #[error("{path:?} is not a file inside one of {run}'s read-back paths ({declared}): cp reaches only those")]
    OutsideReadBack {
        /// The run.
        run: String,
        /// The path asked for.
        path: String,
        /// The declared paths.
        declared: String,
    },
}

/// The run's live pod: its name, when the run is Running.
pub fn live_pod(run: &SandboxRun) -> Result<String, SessionError> {
    let name = run.metadata.name.clone().unwrap_or_default();
    let status = run.status.as_ref();
    let phase = status.and_then(|s| s.phase);
    match (phase, status.and_then(|s| s.pod_name.clone())) {
        (Some(Phase::Running), Some(pod)) => Ok(pod),
        (phase, _) => Err(SessionError::NotRunning(
            name,
            phase.map_or("not started", |p| p.as_str()).to_string(),
        )),
    }
}

/// The two ends of a `cp`: which one is in the sandbox.
#[derive(Debug, PartialEq, Eq)]
pub enum Copy {
    /// From `path` in run `run` to the local file `local`.
    Out {
        /// The run.
        run: String,
        /// The path in the sandbox.
        path: String,
        /// The local file.
        local: String,
    },
    /// From the local file `local` to `path` in run `run`.
    In {
        /// The local file.
        local: String,
        /// The run.
        run: String,
        /// The path in the sandbox.
        path: String,
    },
}

/// `RUN:PATH` split, when `operand` names a run (`:` before the first `/`, as `kubectl cp`).
fn remote(operand: &str) -> Option<(&str, &str)> {
    let (run, path) = operand.split_once(':')?;
    (!run.is_empty() && !run.contains('/')).then_some((run, path))
}

/// What `cp SOURCE DESTINATION` copies.
pub fn copy_of(source: &str, destination: &str) -> Result<Copy, SessionError> {
    match (remote(source), remote(destination)) {
        (Some((run, path)), None) => Ok(Copy::Out {
            run: run.into(),
            path: path.into(),
            local: destination.into(),
        }),
        (None, Some((run, path))) => Ok(Copy::In {
            local: source.into(),
            run: run.into(),
            path: path.into(),
        }),
        _ => Err(SessionError::Operands(source.into(), destination.into())),
    }
}

/// `path` when it is a clean absolute path strictly inside one of the run's declared read-back
/// paths (what the drain recovers: a file copied in there is drained with the rest).
pub fn inside_read_back<'a>(run: &SandboxRun, path: &'a str) -> Result<&'a str, SessionError> {
    let declared: Vec<&str> = run
        .spec
        .read_back_paths()
        .iter()
        .map(|p| p.path.as_str())
        .collect();
    let inside = crate::names::unclean_path(path).is_none()
        && declared.iter().any(|d| {
            path.strip_prefix(d)
                .is_some_and(|rest| rest.starts_with('/') && rest.len() > 1)
        });
    if inside {
        Ok(path)
    } else {
        Err(SessionError::OutsideReadBack {
            run: run.metadata.name.clone().unwrap_or_default(),
            path: path.into(),
            declared: declared.join(", "),
        })
    }
}

/// The argv that writes the first `bytes` bytes of its stdin to `path` in the workload (`sh`,
/// `head` and `wc` from the image; the path and the count are arguments, never spliced into the
/// script).
/// - The count, not the end of stdin, ends the copy: on this apiserver the close of an exec's
///   stdin can overtake the data still in flight and cut the file short (seen: 1,024 of 70,000
///   bytes arrived, exit 0), so stdin stays open until the command has exited.
/// - The shell stays the exec's process, holding its stdout, until the copy is checked: with
///   `head` alone (the shell execs a lone last command) the exec's stdout was the file, the
///   runtime saw the exec's output end at once and closed its stdin, and `head` wrote what had
///   arrived and exited 0 (containerd on a real node: 152,576 of 200,000 bytes; issue #52).
/// - A file that is not `bytes` long is an error (exit 1), never a copy said done.
pub fn write_argv(path: &str, bytes: u64) -> Vec<String> {
    vec![
        "sh".into(),
        "-c".into(),
        WRITE_SCRIPT.into(),
        "sh".into(),
        path.into(),
        bytes.to_string(),
    ]
}

/// [`write_argv`]'s script: `$1` the path, `$2` the count.
const WRITE_SCRIPT: &str =
    "head -c \"$2\" > \"$1\" || exit; [ \"$(wc -c < \"$1\")\" -eq \"$2\" ] || { echo \"sandboxrun cp: $1 is short\" >&2; exit 1; }";

/// The argv that writes `path` to stdout in the workload.
pub fn read_argv(path: &str) -> Vec<String> {
    ["cat", "--", path].map(String::from).to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(phase: Option<Phase>) -> SandboxRun {
        crate::testkit::sandbox_run("agent")
            .read_back(&["/work/out"])
            .phase(phase)
            .pod_name("agent-sbr")
            .build()
    }

    #[test]
    fn a_session_reaches_only_a_running_runs_pod() {
        assert_eq!(live_pod(&run(Some(Phase::Running))), Ok("agent-sbr".into()));
        for phase in [
            None,
            Some(Phase::Pending),
            Some(Phase::Draining),
            Some(Phase::Succeeded),
        ] {
            assert!(
                matches!(live_pod(&run(phase)), Err(SessionError::NotRunning(..))),
                "{phase:?}"
            );
        }
    }

    #[test]
    fn cp_names_exactly_one_run_end() {
        assert_eq!(
            copy_of("agent:/work/out/a.txt", "./a.txt"),
            Ok(Copy::Out {
                run: "agent".into(),
                path: "/work/out/a.txt".into(),
                local: "./a.txt".into()
            })
        );
        assert_eq!(
            copy_of("notes.md", "agent:/work/out/notes.md"),
            Ok(Copy::In {
                local: "notes.md".into(),
                run: "agent".into(),
                path: "/work/out/notes.md".into()
            })
        );
        // A local path with a colon after a slash is local, as in kubectl cp.
        assert!(matches!(
            copy_of("./a:b", "x"),
            Err(SessionError::Operands(..))
        ));
        assert!(matches!(
            copy_of("a:/x", "b:/y"),
            Err(SessionError::Operands(..))
        ));
    }

    /// cp reaches only the run's read-back paths, and never climbs out of them.
    #[test]
    fn cp_reaches_only_files_inside_the_declared_read_back_paths() {
        let r = run(Some(Phase::Running));
        assert_eq!(
            inside_read_back(&r, "/work/out/a/b.txt"),
            Ok("/work/out/a/b.txt")
        );
        for bad in [
            "/work/out",
            "/work/outside/x",
            "/etc/passwd",
            "/work/out/../../etc/passwd",
            "work/out/x",
            "/work/out//x",
            "/work/out/",
        ] {
            assert!(inside_read_back(&r, bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_path_is_an_argument_never_part_of_the_script() {
        let argv = write_argv("/work/out/$(reboot)", 42);
        assert!(
            argv[2].starts_with("head -c \"$2\" > \"$1\" || exit;"),
            "{argv:?}"
        );
        assert!(!argv[2].contains("reboot"), "{argv:?}");
        assert_eq!(argv[4..], ["/work/out/$(reboot)", "42"]);
        assert_eq!(read_argv("/work/out/-n"), ["cat", "--", "/work/out/-n"]);
    }
}
