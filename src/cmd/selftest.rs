//! `sandboxrun-operator selftest` (`crate::selftest`): exit 0 when the run drained and was
//! deleted, 1 when it did not (the reason on stderr), 2 when the manifest is not a SandboxRun.

use std::process::ExitCode;

use crate::selftest::{run, SelftestArgs, SelftestError};

/// Runs `selftest`.
pub(crate) async fn main(args: SelftestArgs) -> ExitCode {
    match run(args).await {
        Ok(summary) => {
            println!("selftest: PASS: {summary}");
            ExitCode::SUCCESS
        }
        Err(e @ SelftestError::Manifest(_)) => {
            eprintln!("selftest: {e}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("selftest: FAIL: {e}");
            ExitCode::from(1)
        }
    }
}
