//! Process-wide setup: the rustls crypto provider (every subcommand, and the live doctor probe),
//! small pages (every subcommand but `launch`), and what the long-running subcommands (`run`,
//! `egress-proxy`) share: the log format and subscriber, and the shutdown signal.

use clap::ValueEnum;
use tracing::info;

/// Log output format.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Installs the process-wide rustls crypto provider once (kube and object_store would otherwise
/// disagree on one and panic at the first TLS connection).
pub(crate) fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Keeps this process on small pages (`PR_SET_THP_DISABLE`): transparent huge pages on the
/// regions the allocator (mimalloc, src/main.rs) reserves doubled the operator's peak RSS under a
/// flood of lifecycles for a few percent of CPU (docs/performance.md "The allocator"). The
/// allocator is built not to ask for them (`no_thp`); this keeps them off on a node that gives
/// them unasked (`transparent_hugepage/enabled` = `always`). Every subcommand but `launch`: the
/// flag is inherited across `execve`, and the launcher becomes the workload, whose pages are not
/// the operator's to choose. Best effort: a kernel without the call leaves the process as it was.
pub(crate) fn keep_small_pages() {
    if let Err(error) = rustix::thread::disable_transparent_huge_pages(true) {
        tracing::debug!(%error, "transparent huge pages stay as the node sets them");
    }
}

/// The log flags of the long-running subcommands.
#[derive(clap::Args, Debug, Clone)]
pub struct LogArgs {
    /// Log format.
    #[arg(
        long,
        env = "SANDBOXRUN_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    pub log_format: LogFormat,
    /// Log filter (tracing EnvFilter syntax), e.g. info or sandboxrun_operator=debug.
    #[arg(long, env = "SANDBOXRUN_LOG_LEVEL", default_value = "info")]
    pub log_level: String,
}

impl LogArgs {
    /// Installs the process's log subscriber (stderr) these flags describe.
    pub(crate) fn init_tracing(&self) {
        init_tracing(self.log_format, &self.log_level);
    }
}

/// Installs the process's log subscriber (stderr), from `--log-format` and `--log-level`.
fn init_tracing(format: LogFormat, level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

/// Resolves after SIGTERM or Ctrl-C.
pub(crate) async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => futures::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = term => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    info!("shutdown requested");
}
