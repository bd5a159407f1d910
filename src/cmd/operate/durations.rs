//! The duration flags of `run`, parsed and checked against each other.

use std::time::Duration;

use super::error::OperatorError;
use crate::cmd::run::RunArgs;

/// The duration flags of `run`, parsed and checked against each other.
pub(super) struct Durations {
    pub(super) drain_idle: Duration,
    pub(super) drain_timeout: Duration,
    pub(super) max_drain_timeout: Duration,
    pub(super) image_pull_timeout: Duration,
    pub(super) quiet_window: Duration,
}

impl Durations {
    pub(super) fn parse(args: &RunArgs) -> Result<Durations, OperatorError> {
        let parse = |flag: &str, text: &str| {
            crate::units::parse_duration(text)
                .map_err(|e| OperatorError::Config(format!("{flag}: {e}")))
        };
        let drain_idle = parse("--drain-idle-timeout", &args.drain_idle_timeout)?;
        let drain_timeout = parse("--drain-timeout", &args.drain_timeout)?;
        let max_drain_timeout = parse("--max-drain-timeout", &args.max_drain_timeout)?;
        if drain_timeout > max_drain_timeout {
            return Err(OperatorError::Config(format!(
                "--drain-timeout {} exceeds --max-drain-timeout {}",
                args.drain_timeout, args.max_drain_timeout
            )));
        }
        let image_pull_timeout = parse("--image-pull-timeout", &args.image_pull_timeout)?;
        // 0s is a quiet window too: none (every state reported as it is seen).
        let quiet_window = match args.quiet_window.trim() {
            "0" | "0s" => Duration::ZERO,
            window => parse("--quiet-window", window)?,
        };
        Ok(Durations {
            drain_idle,
            drain_timeout,
            max_drain_timeout,
            image_pull_timeout,
            quiet_window,
        })
    }
}
