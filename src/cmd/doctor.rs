//! `sandboxrun-operator doctor`: the admission rules, offline (`crate::doctor`).

use std::process::ExitCode;

use crate::doctor::DoctorArgs;

/// Runs `doctor` with the default rule settings, the report on stdout.
pub(crate) async fn main(args: DoctorArgs) -> ExitCode {
    let mut out = std::io::stdout();
    let code = crate::doctor::run(args, crate::policy::RuleSettings::default(), &mut out).await;
    ExitCode::from(code)
}
