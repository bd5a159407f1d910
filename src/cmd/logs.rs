//! `sandboxrun-operator logs RUN` (`crate::plugin::logs`): exit 0 with the report once the run is
//! read (also when it says there is no evidence or the drain failed), 1 when the run cannot be read.

use std::process::ExitCode;

use kube::Api;

use crate::api::SandboxRun;
use crate::plugin::cluster::connect;
use crate::plugin::logs::{render, LogsArgs};

/// Runs `logs`.
pub(crate) async fn main(args: LogsArgs) -> ExitCode {
    let (client, namespace) = match connect(&args.cluster).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("logs: {e}");
            return ExitCode::from(1);
        }
    };
    let runs: Api<SandboxRun> = Api::namespaced(client, &namespace);
    let run = match runs.get_opt(&args.run).await {
        Ok(Some(run)) => run,
        Ok(None) => {
            eprintln!("logs: no SandboxRun {namespace}/{}", args.run);
            return ExitCode::from(1);
        }
        Err(e) => {
            eprintln!("logs: cannot read SandboxRun {namespace}/{}: {e}", args.run);
            return ExitCode::from(1);
        }
    };
    match render(&run, &mut std::io::stdout()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("logs: write: {e}");
            ExitCode::from(1)
        }
    }
}
