//! `sandboxrun-operator holder`: the holder container's modes (`crate::inpod::holder`); the
//! operator builds the argv with [`crate::inpod::holder::HolderCommand`].

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use tracing::info;

/// Arguments of `holder`.
#[derive(Args, Debug)]
pub(crate) struct HolderArgs {
    /// The holder's own directory (drain marker).
    #[arg(long, default_value = crate::inpod::holder::HOLDER_STATE_DIR)]
    pub(crate) state_dir: PathBuf,
    /// preStop mode: wait until the operator marks the pod drained, at most this long (e.g. 5m).
    #[arg(long, value_name = "DURATION", conflicts_with = "mark_drained")]
    pub(crate) wait_drained: Option<String>,
    /// Mark the pod drained (exec'd by the operator after the drain).
    #[arg(long)]
    pub(crate) mark_drained: bool,
}

/// Runs `holder`.
pub(crate) async fn main(args: HolderArgs) -> ExitCode {
    if args.mark_drained {
        return match crate::inpod::holder::mark_drained(&args.state_dir) {
            Ok(_) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("cannot mark drained in {}: {e}", args.state_dir.display());
                ExitCode::from(1)
            }
        };
    }
    if let Some(text) = args.wait_drained {
        let timeout = match crate::units::parse_duration(&text) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("--wait-drained: {e}");
                return ExitCode::from(2);
            }
        };
        let drained = crate::inpod::holder::wait_drained(&args.state_dir, timeout).await;
        if !drained {
            eprintln!("not marked drained within {text}; letting the pod stop");
        }
        return ExitCode::SUCCESS;
    }
    info!("holder idling until SIGTERM");
    match crate::inpod::holder::idle().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("holder: {e}");
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::{Cli, Command};
    use clap::Parser;
    use std::time::Duration;

    #[tokio::test]
    async fn mark_drained_writes_the_marker_and_exits_zero() {
        let dir = tempfile::tempdir().unwrap();
        let state_dir = dir.path().to_path_buf();
        let cli = Cli::try_parse_from([
            std::ffi::OsStr::new("sandboxrun-operator"),
            std::ffi::OsStr::new("holder"),
            std::ffi::OsStr::new("--state-dir"),
            state_dir.as_os_str(),
            std::ffi::OsStr::new("--mark-drained"),
        ])
        .unwrap();
        let Command::Holder(args) = cli.command else {
            panic!("not the holder");
        };
        assert_eq!(main(args).await, ExitCode::SUCCESS);
        assert!(state_dir
            .join(crate::inpod::holder::DRAINED_MARKER)
            .is_file());
        // The preStop hook sees it at once.
        assert!(crate::inpod::holder::wait_drained(&state_dir, Duration::from_millis(10)).await);

        // A state dir that cannot be written is a failure, not a silent success.
        let missing = HolderArgs {
            state_dir: state_dir.join("missing"),
            wait_drained: None,
            mark_drained: true,
        };
        assert_eq!(main(missing).await, ExitCode::from(1));
    }
}
