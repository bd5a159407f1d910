//! The holder container's modes. The holder exists because exec into a terminated container is
//! impossible: it idles beside the workload with every read-back emptyDir mounted, so the drain can
//! exec `pack` into it after the workload exited, and no user image needs `tar`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// File whose presence says "the operator has drained this pod".
pub(crate) const DRAINED_MARKER: &str = "drained";
/// Where the holder keeps its drain marker (an emptyDir of its own: its root may be read-only).
pub const HOLDER_STATE_DIR: &str = "/var/run/sandboxrun";
/// Where the operator's image keeps its binary: the holder's program and the packer, always
/// exec'd by this absolute path (`run --holder-binary`), never found through PATH
/// (docs/contract.md "The holder runs only the operator's code").
pub const HOLDER_BINARY: &str = "/usr/local/bin/sandboxrun-operator";
/// Where the holder mounts the read-back paths: each declared path `P` at this root followed by
/// `P`, read-only. Never on the holder's PATH nor over its binary, whatever the run declares: a
/// file the workload writes can never stand where the holder looks for a program.
pub(crate) const HOLDER_READBACK_ROOT: &str = "/sandboxrun-readback";
/// The subcommand that runs the holder's modes (`crate::cmd::holder`).
pub(crate) const SUBCOMMAND: &str = "holder";

/// One of the holder's modes as the operator starts or execs it: the pod builder's container
/// command and preStop hook, and the controller's mark-drained exec. The argv is built here only;
/// `sandboxrun-operator holder` parses it back (tested below).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HolderCommand {
    /// The container's main process: idle until SIGTERM.
    Idle,
    /// The preStop hook: wait until the pod is marked drained, at most `seconds`.
    WaitDrained {
        /// The longest wait.
        seconds: i64,
    },
    /// The exec after the drain: write the drained marker.
    MarkDrained,
}

impl HolderCommand {
    /// `<binary> holder`: a container's `command`, `binary` an absolute path.
    pub(crate) fn program(binary: &str) -> Vec<String> {
        vec![binary.to_string(), SUBCOMMAND.to_string()]
    }

    /// The arguments after [`HolderCommand::program`]: a container's `args`.
    pub(crate) fn args(&self) -> Vec<String> {
        let mut args = vec!["--state-dir".to_string(), HOLDER_STATE_DIR.to_string()];
        match self {
            HolderCommand::Idle => {}
            HolderCommand::WaitDrained { seconds } => {
                args.extend(["--wait-drained".to_string(), format!("{seconds}s")]);
            }
            HolderCommand::MarkDrained => args.push("--mark-drained".to_string()),
        }
        args
    }

    /// The whole argv: an exec's or a hook's command.
    pub(crate) fn argv(&self, binary: &str) -> Vec<String> {
        let mut argv = Self::program(binary);
        argv.extend(self.args());
        argv
    }
}

/// Where the holder sees declared read-back path `declared` (absolute, normalized: admission's
/// rule): below [`HOLDER_READBACK_ROOT`]. The packer is exec'd on this path.
pub(crate) fn holder_path(declared: &str) -> String {
    format!("{HOLDER_READBACK_ROOT}{declared}")
}

/// Writes the drained marker (the operator execs this after the drain).
pub(crate) fn mark_drained(state_dir: &Path) -> std::io::Result<PathBuf> {
    let marker = state_dir.join(DRAINED_MARKER);
    std::fs::write(&marker, b"drained\n")?;
    Ok(marker)
}

/// The preStop hook: waits until the marker exists or `timeout` passes. Returns whether the
/// marker appeared. Either way the hook then returns and the kubelet stops the container: a hook
/// that never returned would only be killed at the end of the grace period anyway.
pub(crate) async fn wait_drained(state_dir: &Path, timeout: Duration) -> bool {
    let marker = state_dir.join(DRAINED_MARKER);
    let start = Instant::now();
    loop {
        if marker.exists() {
            return true;
        }
        if start.elapsed() >= timeout {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Idles until SIGTERM/SIGINT. The holder does nothing else: the drain comes to it by exec.
pub(crate) async fn idle() -> std::io::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {}
        r = tokio::signal::ctrl_c() => r?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::{Cli, Command};
    use clap::Parser;

    #[test]
    fn every_holder_command_parses_back_as_the_mode_it_names() {
        for (command, wait, mark) in [
            (HolderCommand::Idle, None, false),
            (
                HolderCommand::WaitDrained { seconds: 330 },
                Some("330s".to_string()),
                false,
            ),
            (HolderCommand::MarkDrained, None, true),
        ] {
            let argv = command.argv(HOLDER_BINARY);
            assert_eq!(argv[0], HOLDER_BINARY);
            match Cli::try_parse_from(&argv).map(|c| c.command) {
                Ok(Command::Holder(h)) => {
                    assert_eq!(h.wait_drained, wait, "{argv:?}");
                    assert_eq!(h.mark_drained, mark, "{argv:?}");
                    assert_eq!(h.state_dir, Path::new(HOLDER_STATE_DIR));
                }
                other => panic!("{argv:?} parsed as {other:?}"),
            }
            if let HolderCommand::WaitDrained { .. } = command {
                let wait = wait.unwrap_or_default();
                assert!(crate::units::parse_duration(&wait).is_ok(), "{wait}");
            }
        }
    }

    #[test]
    fn a_read_back_path_is_seen_by_the_holder_below_its_own_root_never_on_its_path() {
        for declared in ["/usr/local/sbin", "/usr/local/bin", "/bin", "/work/out"] {
            let seen = holder_path(declared);
            assert_eq!(seen, format!("/sandboxrun-readback{declared}"));
            assert!(
                !seen.starts_with("/usr/") && !seen.starts_with("/bin"),
                "{seen}"
            );
        }
        assert!(!Path::new(HOLDER_BINARY).starts_with(HOLDER_READBACK_ROOT));
        assert!(Path::new(HOLDER_BINARY).is_absolute());
    }

    #[tokio::test]
    async fn prestop_returns_once_the_operator_marks_the_pod_drained() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!wait_drained(dir.path(), Duration::from_millis(300)).await);
        let path = dir.path().to_path_buf();
        let waiter =
            tokio::spawn(async move { wait_drained(&path, Duration::from_secs(10)).await });
        tokio::time::sleep(Duration::from_millis(300)).await;
        mark_drained(dir.path()).unwrap();
        assert!(waiter.await.unwrap());
    }
}
