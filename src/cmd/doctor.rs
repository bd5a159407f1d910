//! `sandboxrun-operator doctor`: the admission rules, offline (`crate::admission::doctor`).

use std::process::ExitCode;

use crate::admission::doctor::DoctorArgs;

/// Runs `doctor` with the default rule settings, the report on stdout.
pub(crate) async fn main(args: DoctorArgs) -> ExitCode {
    let mut out = std::io::stdout();
    let code =
        crate::admission::doctor::run(args, crate::admission::RuleSettings::default(), &mut out)
            .await;
    ExitCode::from(code)
}
