//! `egress-proxy`: the allowlisting proxy filtered runs' workloads go through (src/egress/proxy.rs).

use std::process::ExitCode;

use tracing::error;

use crate::egress::proxy::ProxyArgs;

/// Runs the egress proxy until SIGTERM.
pub(crate) async fn main(args: ProxyArgs) -> ExitCode {
    args.log.init_tracing();
    match crate::egress::proxy::run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!(error = %e, "egress proxy stopped");
            ExitCode::from(1)
        }
    }
}
