//! The one error a reconcile (or a teardown) ends with; retried with a pause, never a hot loop.

use thiserror::Error;

/// A reconcile that could not finish; retried with a pause (never a hot loop).
#[derive(Debug, Error)]
pub(crate) enum ControllerError {
    /// A call to the apiserver failed.
    #[error("{action} failed: {source}")]
    Kube {
        /// What was being done.
        action: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// The run has no namespace or name (cannot happen for a namespaced CR read from the API).
    #[error("the run has no {0}")]
    Metadata(&'static str),
    /// An object without the identity every object read from the apiserver has: nothing is
    /// written about it (docs/contract.md "A write always names its object").
    #[error(transparent)]
    Identity(#[from] crate::identity::MissingIdentity),
}

impl ControllerError {
    /// The `kind` label of `sandboxrun_reconcile_errors_total` (docs/operations.md "Metrics").
    /// Written out, never the `Debug` text, so renaming a variant cannot rename a label.
    pub(crate) fn metric_label(&self) -> &'static str {
        match self {
            ControllerError::Kube { .. } => "kube",
            ControllerError::Metadata(_) | ControllerError::Identity(_) => "metadata",
        }
    }
}

/// Why the run's store cannot be used: the tenant store's own error, never a transient read
/// (docs/contract.md "A store per namespace"). Its words go into the status and the Events.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub(crate) struct StoreUnusable(pub(crate) crate::store::tenant::TenantStoreError);

/// What a tenant store that cannot be had means to a reconcile: a read that may pass (the
/// apiserver unreachable or failing) is an error, retried; anything else is a verdict, in words.
pub(crate) fn store_verdict(
    error: crate::store::tenant::TenantStoreError,
) -> Result<StoreUnusable, ControllerError> {
    match error {
        crate::store::tenant::TenantStoreError::Transient {
            kind,
            namespace,
            name,
            source,
        } => Err(ControllerError::Kube {
            action: format!("read the store {kind} {namespace}/{name}"),
            source: *source,
        }),
        verdict => Ok(StoreUnusable(verdict)),
    }
}

/// Wraps a client error with what was being done.
pub(crate) fn kube_err(action: impl Into<String>) -> impl FnOnce(kube::Error) -> ControllerError {
    let action = action.into();
    move |source| ControllerError::Kube { action, source }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_labels_are_the_documented_kinds() {
        let kube = kube_err("get pod")(kube::Error::LinesCodecMaxLineLengthExceeded);
        assert_eq!(kube.metric_label(), "kube");
        assert_eq!(ControllerError::Metadata("name").metric_label(), "metadata");
        let ops = include_str!("../../docs/operations.md");
        assert!(
            ops.contains("`kind` (kube, metadata)"),
            "docs/operations.md lists the kinds"
        );
    }
}
