//! `sandboxrun-operator launch` and `launch-deliver`: a warm pool pod's workload starts parked in
//! `launch`, which waits for one start message and `exec`s the run's command
//! (`crate::inpod::launch`); the operator execs `launch-deliver` in that container at claim time
//! with the message on stdin.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::inpod::launch;

/// Arguments of `launch` and `launch-deliver`.
#[derive(Args, Debug)]
pub(crate) struct LaunchArgs {
    /// The operator-owned directory that holds the start socket and the started marker.
    #[arg(long, default_value = launch::CONTROL_DIR)]
    pub(crate) control_dir: PathBuf,
}

/// Runs `launch`: returns only when the start is refused or the exec fails (exit 127, the
/// reason on stderr, which the kubelet keeps as the termination message).
pub(crate) fn main(args: LaunchArgs) -> ExitCode {
    let err = match launch::wait_for_start(&args.control_dir) {
        Ok(msg) => launch::exec(&msg),
        Err(e) => e,
    };
    eprintln!("launcher: {err}");
    ExitCode::from(127)
}

/// Runs `launch-deliver`: 0 once the waiting launcher has the message, 1 otherwise.
pub(crate) fn deliver(args: LaunchArgs) -> ExitCode {
    match launch::deliver(&args.control_dir, std::io::stdin().lock()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("launch-deliver: {e}");
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
