//! Why the operator stopped.

use thiserror::Error;

/// Why the operator stopped.
#[derive(Debug, Error)]
pub(crate) enum OperatorError {
    /// A flag or environment value is wrong.
    #[error("configuration: {0}")]
    Config(String),
    /// A `run` flag that cannot serve.
    #[error("configuration: {0}")]
    Flag(#[from] crate::cmd::run::FlagError),
    /// A `--store-option` that is not `key=value`.
    #[error("configuration: {0}")]
    StoreOption(#[from] crate::store::OptionError),
    /// `--holder-binary` or `--pack-command` is not an absolute program.
    #[error("configuration: {0}")]
    HolderProgram(#[from] HolderProgramError),
    /// A `--holder-*` resource value the pod could not carry.
    #[error("configuration: {0}")]
    HolderResources(#[from] crate::pod::HolderResourcesError),
    /// The cluster cannot be reached or configured.
    #[error("kubernetes client: {0}")]
    Kube(#[from] kube::Error),
    /// The object store cannot be configured.
    #[error("object store: {0}")]
    Store(#[from] crate::store::StoreError),
    /// Metrics cannot be registered.
    #[error(transparent)]
    Metrics(#[from] crate::metrics::MetricsError),
    /// A listener cannot be bound.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The webhook cannot start.
    #[error("webhook: {0}")]
    Webhook(#[from] crate::admission::serve::ServeError),
    /// Leader election failed, or leadership was lost (the process exits so a fresh start, or
    /// the other replica, takes over cleanly).
    #[error("leader election: {0}")]
    Leader(String),
    /// A shard's Lease was lost (the process exits; the other replicas take its shards).
    #[error("sharding: {0}")]
    Shard(#[from] crate::shard::owner::ShardError),
}

/// Why `run --holder-binary` or `--pack-command` is refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HolderProgramError {
    /// The holder binary is not an absolute path.
    #[error("--holder-binary `{0}` must be an absolute path (it is never looked up through PATH)")]
    Binary(String),
    /// The pack command names no program.
    #[error("--pack-command is empty")]
    EmptyPack,
    /// The pack command's program is not an absolute path.
    #[error(
        "--pack-command's program `{0}` must be an absolute path (it is never looked up through PATH)"
    )]
    Pack(String),
}
