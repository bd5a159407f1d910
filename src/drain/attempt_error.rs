//! Why one attempt at a path's drain failed ([`AttemptError`]), pure: whether another attempt
//! may succeed, whether the store (not the pod) failed, the failures metric's label, and the
//! words a Failed entry gives (with what to do when the cause is the operator's own RBAC or a
//! store refusing its credentials).

use thiserror::Error;

use super::archive::{DrainError, DrainErrorKind};
use super::exec::ExecError;
use crate::store::credentials;
use crate::store::StoreError;

/// Why one attempt failed.
#[derive(Debug, Error)]
pub(crate) enum AttemptError {
    /// The exec transport.
    #[error(transparent)]
    Exec(#[from] ExecError),
    /// The stream or its upload.
    #[error(transparent)]
    Drain(#[from] DrainError),
    /// The store (manifest).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The exec gave no stdout.
    #[error("the exec of the packer has no stdout")]
    NoStdout,
    /// The packer could read nothing at the path (see [`nothing_readable`]).
    #[error("{0}")]
    NothingReadable(String),
    /// The packer kept the drain waiting past the idle bound (src/drain/idle.rs).
    #[error("{0}")]
    Idle(String),
    /// The fence said no before the commit: another replica drains the run (src/drain/fence.rs).
    #[error("another replica holds the run's drain claim; not committing")]
    Fenced,
}

impl AttemptError {
    /// Whether a drain that failed with `self` tries again, `idle_retried` saying whether it
    /// already retried an idle cut-off. An idle cut-off is retried once: a stalled stream can be
    /// the node's doing (a kubelet restarted mid-stream leaves the exec hanging; docs/contract.md
    /// "Under gVisor, and when the node fails"); a packer that stalls again is cut off for good,
    /// so a trickling pod holds its drain slot at most twice the idle bound. Anything else is
    /// retried when it is transient.
    pub(crate) fn retried(&self, idle_retried: bool) -> bool {
        match self {
            AttemptError::Idle(_) => !idle_retried,
            _ => self.is_transient(),
        }
    }

    /// Whether another attempt may succeed.
    pub(crate) fn is_transient(&self) -> bool {
        // A store that refuses the credentials refuses them again.
        if self.store_refused_credentials() {
            return false;
        }
        match self {
            AttemptError::Exec(ExecError::Start { source, .. }) => {
                // Gone, forbidden or refused will not change by retrying.
                !matches!(start_status(source), Some(400 | 403 | 404))
            }
            AttemptError::Exec(e) => e.is_transient(),
            // A zstd stream the decoder refuses is the packer's doing, not the transport's
            // (src/drain/wire.rs): sent again, it is refused again.
            AttemptError::Drain(DrainError {
                kind: DrainErrorKind::Read(e),
                ..
            }) if e.kind() == std::io::ErrorKind::InvalidData => false,
            AttemptError::Drain(e) => matches!(
                e.kind,
                DrainErrorKind::Read(_)
                    | DrainErrorKind::Write(_)
                    | DrainErrorKind::Store(_)
                    | DrainErrorKind::Truncated(_)
            ),
            // An oversized object at the manifest key is there again next time.
            AttemptError::Store(e) => !e.is_permanent(),
            AttemptError::NoStdout => true,
            // Permissions do not change by retrying.
            AttemptError::NothingReadable(_) => false,
            // The same pod would trickle again, holding the slot once more.
            AttemptError::Idle(_) => false,
            // Handled before: the drain ends recording nothing.
            AttemptError::Fenced => false,
        }
    }

    /// Whether the store failed (not the pod, the exec or the stream): its failure names the
    /// store, a tenant's among them (docs/contract.md "A store per namespace").
    pub(crate) fn is_store_side(&self) -> bool {
        match self {
            AttemptError::Store(_) => true,
            AttemptError::Drain(e) => {
                matches!(e.kind, DrainErrorKind::Store(_) | DrainErrorKind::Write(_))
            }
            _ => false,
        }
    }

    /// Whether the object store refused the credentials (HTTP 401/403), on the archive upload or
    /// the manifest.
    pub(crate) fn store_refused_credentials(&self) -> bool {
        match self {
            AttemptError::Store(e) => e.is_refused(),
            AttemptError::Drain(e) => match &e.kind {
                DrainErrorKind::Store(e) => e.is_refused(),
                DrainErrorKind::Write(e) => credentials::io_is_refused(e),
                _ => false,
            },
            _ => false,
        }
    }

    /// Stable label for the failures metric.
    pub(crate) fn metric_label(&self) -> &'static str {
        if self.store_refused_credentials() {
            return "store_credentials";
        }
        match self {
            AttemptError::Exec(ExecError::Start { .. }) => "exec_start",
            AttemptError::Exec(ExecError::Failed { .. }) => "pack_failed",
            AttemptError::Exec(ExecError::NoStatus { .. }) => "exec_lost",
            AttemptError::Drain(e) => e.metric_label(),
            AttemptError::Store(_) => "store",
            AttemptError::NoStdout => "exec_no_stdout",
            AttemptError::NothingReadable(_) => "unreadable",
            AttemptError::Idle(_) => "idle",
            AttemptError::Fenced => "fenced",
        }
    }
}

/// The HTTP status with which the apiserver refused to start an exec, if it did.
pub(crate) fn start_status(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(ae) => Some(ae.code),
        kube::Error::UpgradeConnection(kube::client::UpgradeConnectionError::ProtocolSwitch(
            code,
        )) => Some(code.as_u16()),
        _ => None,
    }
}

/// Words for a failure, with what to do when the cause is the operator's own RBAC.
pub(crate) fn describe_failure(e: &AttemptError, store_url: &str, tenant: Option<&str>) -> String {
    match e {
        e if e.store_refused_credentials() => {
            credentials::refused_message(store_url, tenant, &e.to_string())
        }
        AttemptError::Exec(ExecError::Start { source, .. }) if start_status(source) == Some(403) => format!(
            "{e} (Forbidden: the operator's ServiceAccount needs create/get on pods/exec in this namespace)"
        ),
        e if e.is_store_side() => format!("the store {store_url}: {e}"),
        _ => e.to_string(),
    }
}
