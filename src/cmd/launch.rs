//! `sandboxrun-operator launch` and `launch-status`: a warm pool pod's workload starts parked in
//! `launch`, which reads one start message from its stdin (the operator attaches to it at claim
//! time) and `exec`s the run's command (`crate::inpod::launch`); `launch-status` prints what the
//! launcher did with the pod's one start.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::inpod::launch;

/// Arguments of `launch` and `launch-status`.
#[derive(Args, Debug)]
pub(crate) struct LaunchArgs {
    /// The operator-owned directory that holds the started marker.
    #[arg(long, default_value = launch::CONTROL_DIR)]
    pub(crate) control_dir: PathBuf,
}

/// The exit code of a parked launcher told to stop (128 + SIGTERM, as a shell reports it).
const TERMINATED: i32 = 143;

/// Runs `launch`: returns only when the start is refused or the exec fails (exit 127, the
/// reason on stderr, which the kubelet keeps as the termination message). A parked launcher
/// told to stop (SIGTERM: its pod is being deleted) exits at once ([`exit_when_told_to_stop`]).
pub(crate) fn main(args: LaunchArgs) -> ExitCode {
    exit_when_told_to_stop();
    let err = match launch::wait_for_start(&args.control_dir, std::io::stdin().lock()) {
        Ok(msg) => launch::exec(&msg),
        Err(e) => e,
    };
    eprintln!("launcher: {err}");
    ExitCode::from(127)
}

/// Exits the parked launcher on SIGTERM. It is its container's PID 1, whose signals without a
/// handler the kernel ignores, so a pool pod deleted with a grace period (its pool's garbage
/// collection, its namespace's deletion, an eviction) kept its kubelet waiting out the whole
/// period (docs/contract.md "A warm pool's launcher is the operator's code"). The handler is
/// the runtime's; `execve` resets it, so the run's command keeps a PID 1's usual signals. Best
/// effort: without it the kubelet's SIGKILL at the end of the grace period still ends it.
fn exit_when_told_to_stop() {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut term) = signal(SignalKind::terminate()) else {
        eprintln!("launcher: cannot listen for SIGTERM");
        return;
    };
    tokio::spawn(async move {
        if term.recv().await.is_some() {
            eprintln!("launcher: told to stop before a start was handed over");
            std::process::exit(TERMINATED);
        }
    });
}

/// Runs `launch-status`: prints what the launcher did with the pod's one start (a
/// [`launch::LaunchStatus`] line), 0; 1 when the marker cannot be read.
pub(crate) fn status(args: LaunchArgs) -> ExitCode {
    match launch::status(&args.control_dir) {
        Ok(status) => {
            println!("{}", status.line());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("launch-status: {e}");
            ExitCode::from(1)
        }
    }
}

/// Arguments of `launch-install`.
#[derive(Args, Debug)]
pub(crate) struct InstallArgs {
    /// Where to copy the operator's binary (in the launcher's emptyDir).
    #[arg(long)]
    pub(crate) to: PathBuf,
}

/// Runs `launch-install`: 0 once the binary is in place, 1 otherwise.
pub(crate) fn install(args: InstallArgs) -> ExitCode {
    match launch::install(&args.to) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("launch-install: {e}");
            ExitCode::from(1)
        }
    }
}

/// Arguments of `restore-unpack`.
#[derive(Args, Debug)]
pub(crate) struct UnpackArgs {
    /// The read-back path (as the holder mounts it) to restore into.
    pub(crate) dir: PathBuf,
    /// The most bytes of file content to write (the path's cap).
    #[arg(long)]
    pub(crate) budget: u64,
}

/// Runs `restore-unpack` (`crate::inpod::unpack`): prints `<files> <bytes>` and exits 0 once
/// every member is in place; 1 with the reason on stderr otherwise.
pub(crate) fn unpack(args: UnpackArgs) -> ExitCode {
    match crate::inpod::unpack::unpack(&args.dir, std::io::stdin().lock(), args.budget) {
        Ok(done) => {
            println!("{} {}", done.files, done.bytes);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("restore-unpack: {e}");
            ExitCode::from(1)
        }
    }
}
