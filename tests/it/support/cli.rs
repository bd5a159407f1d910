//! The operator binary's command-line verbs as the tests run them (`doctor`), each a process of
//! this build.

use std::process::{Command, Output};

use super::run;

/// `sandboxrun-operator doctor args…` of this build, the environment as it is.
pub fn doctor_command(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sandboxrun-operator"));
    cmd.arg("doctor").args(args);
    cmd
}

/// How a process ended: (exit code, -1 when killed by a signal; stdout; stderr).
pub fn outcome(out: Output) -> (i32, String, String) {
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// [`doctor_command`] run to its end with `stdin` (none: nothing to read); its [`outcome`].
pub fn doctor(args: &[&str], stdin: Option<&str>) -> (i32, String, String) {
    outcome(run(doctor_command(args), stdin.map(str::as_bytes)))
}
