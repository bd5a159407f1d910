//! Why the store could not be configured or used (one error type for every store module).

use super::credentials;

/// Why the store could not be configured or used.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The URL does not parse or lacks a bucket/directory.
    #[error("store URL {url} is invalid: {reason}")]
    InvalidUrl {
        /// The URL, credentials redacted.
        url: String,
        /// What is wrong.
        reason: String,
    },
    /// The scheme is not one we serve.
    #[error("store URL scheme {scheme:?} is not supported (use file, memory, s3, gs or az)")]
    UnsupportedScheme {
        /// The scheme.
        scheme: String,
    },
    /// An option key is not in the scheme's allow-list.
    #[error("store option {key:?} is not accepted for {scheme}:// stores (accepted: {allowed})")]
    UnknownOption {
        /// The scheme.
        scheme: String,
        /// The offending key (never its value).
        key: String,
        /// The accepted keys.
        allowed: String,
    },
    /// The local directory could not be created.
    #[error("creating the store directory {path}: {source}")]
    CreateDir {
        /// The directory.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// object_store refused the configuration.
    #[error(
        "configuring the {scheme}:// store: {source} (its settings: {})",
        credentials::credential_settings(scheme)
    )]
    Build {
        /// The scheme.
        scheme: String,
        /// The error.
        source: object_store::Error,
    },
    /// An operation on an object failed.
    #[error("{op} {key}: {source}")]
    Object {
        /// What was attempted.
        op: &'static str,
        /// The object key.
        key: String,
        /// The error.
        source: object_store::Error,
    },
    /// No object at that key.
    #[error("no manifest at {key}")]
    NotFound {
        /// The key.
        key: String,
    },
    /// An object at a manifest key larger than any manifest a drain writes (a tenant's own store
    /// holds what the tenant put there): not read.
    #[error("the object at the manifest key {key} is {size} bytes, more than the {max} bytes any manifest takes: not read (it was not written by a drain; delete it)")]
    ManifestTooLarge {
        /// The key.
        key: String,
        /// Its size as announced, or as far as it was read.
        size: u64,
        /// The bound.
        max: u64,
    },
    /// A manifest whose read stopped before it parsed: a JSON string longer than any the
    /// operator writes ([`super::manifest_read`]), the read cut off.
    #[error("manifest {key}: {why}")]
    ManifestRead {
        /// The key.
        key: String,
        /// Why.
        why: String,
    },
    /// A manifest that does not parse.
    #[error("manifest {key} is not valid: {source}")]
    ManifestJson {
        /// The key.
        key: String,
        /// The parse error.
        source: serde_json::Error,
    },
}

impl StoreError {
    /// Whether the store refused the credentials ([`credentials::is_refused`]) in this
    /// operation.
    pub(crate) fn is_refused(&self) -> bool {
        match self {
            StoreError::Object { source, .. } | StoreError::Build { source, .. } => {
                credentials::is_refused(source)
            }
            _ => false,
        }
    }

    /// Whether retrying cannot help: refused credentials, or an object at a manifest key that
    /// no drain wrote ([`StoreError::ManifestTooLarge`]).
    pub(crate) fn is_permanent(&self) -> bool {
        self.is_refused() || matches!(self, StoreError::ManifestTooLarge { .. })
    }
}
