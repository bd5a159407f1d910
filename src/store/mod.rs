//! Object storage for drained read-back paths: the store from a URL, the key layout, the
//! constant-memory archive upload and the manifest that commits it (ADR-143 §3, §5).
//!
//! Supported URLs: `file:///abs/dir` (created if missing), `memory://` (tests), `s3://bucket/prefix`,
//! `gs://bucket/prefix`, `az://container/prefix`. Options are validated against a per-scheme
//! allow-list (object_store's own parser silently ignores unknown keys, which turns a typo in
//! `secret_acess_key` into an anonymous client). Cloud credentials also come from the environment
//! (`AWS_*`, `GOOGLE_*`, `AZURE_*`) through the builders' `from_env`.
//!
//! - [`config`]: the store a URL and its options name (and the S3 settings the clean-up shares).
//! - [`keys`]: where a run's archives and manifests live.
//! - [`upload`]: the constant-memory archive upload; [`upload_guard`] aborts it when cancelled.
//! - [`manifest`]: the record of a drained path and its create-only commit.
//! - [`credentials`]: which store errors mean "refused who we are", and what to fix.
//! - [`open_uploads`]: the clean-up of open S3 multipart uploads before an attempt.
//! - [`purge`]: deleting what one run stored.

pub mod config;
pub mod credentials;
pub mod keys;
pub mod manifest;
pub mod open_uploads;
pub mod purge;
pub mod upload;
pub mod upload_guard;

pub use config::{parse_options, store_from_url, StoreArgs, StoreConfig};
pub use keys::{
    object_keys, path_slug, run_dir, run_prefix, ObjectKeys, RunRef, MANIFEST_SUFFIX,
    MAX_SLUG_BYTES,
};
pub use manifest::{
    list_manifests, read_manifest, try_read_manifest, write_manifest, DrainOutcome, DroppedRecord,
    Manifest, ManifestContext, ManifestWrite, MemberRecord, RejectedRecord, Stored, Totals,
    MANIFEST_SCHEMA_VERSION,
};
pub use upload::{
    archive_writer, part_size, ArchiveWriter, MAX_PARTS, MIN_PART_BYTES, UPLOAD_CONCURRENCY,
};

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
    /// A manifest that does not parse.
    #[error("manifest {key} is not valid: {source}")]
    ManifestJson {
        /// The key.
        key: String,
        /// The parse error.
        source: serde_json::Error,
    },
}

/// Every key under `dir` (the store's listing, read whole), or the listing's error naming `dir`.
pub(crate) async fn list_keys(
    store: &dyn object_store::ObjectStore,
    dir: &object_store::path::Path,
) -> Result<Vec<object_store::path::Path>, StoreError> {
    use futures::TryStreamExt;
    let metas: Vec<_> = store
        .list(Some(dir))
        .try_collect()
        .await
        .map_err(|source| StoreError::Object {
            op: "listing",
            key: dir.to_string(),
            source,
        })?;
    Ok(metas.into_iter().map(|m| m.location).collect())
}
