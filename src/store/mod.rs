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
//! - [`error`]: [`StoreError`], why the store could not be configured or used.
//! - [`credentials`]: which store errors mean "refused who we are", and what to fix.
//! - [`open_uploads`]: the clean-up of open S3 multipart uploads before an attempt.
//! - [`purge`]: deleting what one run stored.
//! - [`tenant`]: a store per namespace, the pure part (precedence, the tenant store a ConfigMap
//!   and its Secret describe, the endpoints tenant credentials may go to).
//! - [`tenant_gcs`]: a tenant's gs:// store, its service-account key judged (the endpoints it
//!   names, the fields it may carry).
//! - [`tenant_read`]: a store per namespace, the reads (the store one run uses).

pub(crate) mod config;
pub mod credentials;
pub(crate) mod error;
pub(crate) mod keys;
pub(crate) mod manifest;
pub(crate) mod manifest_read;
#[cfg(test)]
mod manifest_read_tests;
pub mod object_url;
pub mod open_uploads;
pub(crate) mod purge;
pub mod tenant;
pub(crate) mod tenant_gcs;
pub mod tenant_read;
pub(crate) mod upload;
pub(crate) mod upload_guard;

pub use config::{
    parse_options, store_from_url, OptionError, StoreArgs, StoreConfig, StoreOptions,
};
pub use error::StoreError;
pub use keys::{
    attempt_object_keys, checkpoint_object_keys, object_keys, path_slug, run_dir, run_prefix,
    ObjectKeys, MANIFEST_SUFFIX, MAX_SLUG_BYTES,
};
pub use manifest::{
    list_manifests, read_manifest, try_read_manifest, write_manifest, DrainOutcome, DroppedRecord,
    Manifest, ManifestContext, ManifestWrite, MemberRecord, RejectedRecord, Stored, Totals,
    MANIFEST_SCHEMA_VERSION,
};
pub use object_url::{ObjectUrl, RunObject};
pub use upload::{
    archive_writer, part_size, ArchiveWriter, MAX_PARTS, MIN_PART_BYTES, UPLOAD_CONCURRENCY,
};
